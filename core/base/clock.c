/* The engine's clocks (clock.h); a leaf. */
#include <stddef.h>
#include <time.h>

#include "clock.h"

/* Set only by unit tests, before any other thread reads it. */
static const struct lockfs_clock *override;

static int64_t ms_of(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t lockfs_wall_ms(void)
{
	if (override)
		return override->wall_ms(override->arg);
	return ms_of(CLOCK_REALTIME);
}

int64_t lockfs_boot_ms(void)
{
	if (override)
		return override->boot_ms(override->arg);
	return ms_of(CLOCK_BOOTTIME);
}

void lockfs_clock_override(const struct lockfs_clock *clock)
{
	override = clock;
}
