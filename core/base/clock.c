/* The engine's clocks (clock.h); a leaf. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
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

char *lockfs_format_time(int64_t ms, char buf[32])
{
	/* Floor division, so times before 1970 still get a 0..999 fraction. */
	int64_t sec = ms / 1000;
	int frac = (int)(ms % 1000);
	time_t t;
	struct tm tm;

	if (frac < 0) {
		frac += 1000;
		sec--;
	}
	/* The same second is formatted again and again (two log lines and a
	 * record per acquisition): keep the last one per thread. */
	{
		static __thread int64_t last_sec = INT64_MIN;
		static __thread char last[24];

		if (sec == last_sec) {
			memcpy(buf, last, 20);
			buf[20] = (char)('0' + frac / 100);
			buf[21] = (char)('0' + frac / 10 % 10);
			buf[22] = (char)('0' + frac % 10);
			buf[23] = 'Z';
			buf[24] = '\0';
			return buf;
		}
		t = (time_t)sec;
		if (gmtime_r(&t, &tm) && tm.tm_year + 1900 >= 0 && tm.tm_year + 1900 <= 9999) {
			snprintf(last, sizeof(last), "%04u-%02u-%02uT%02u:%02u:%02u.",
				 (unsigned)(tm.tm_year + 1900) % 10000u, (unsigned)(tm.tm_mon + 1) % 100u,
				 (unsigned)tm.tm_mday % 100u, (unsigned)tm.tm_hour % 100u,
				 (unsigned)tm.tm_min % 100u, (unsigned)tm.tm_sec % 100u);
			last_sec = sec;
		}
	}
	t = (time_t)sec;
	if (!gmtime_r(&t, &tm) || tm.tm_year + 1900 < 0 || tm.tm_year + 1900 > 9999) {
		/* RFC 3339 has four-digit years only: print something that is
		 * obviously not a real time rather than garbage. */
		snprintf(buf, 32, "0000-00-00T00:00:00.000Z");
		return buf;
	}
	/* The modulos cannot change anything; they show the compiler that
	 * every field has a fixed width, so the result always fits. */
	snprintf(buf, 32, "%04u-%02u-%02uT%02u:%02u:%02u.%03uZ",
		 (unsigned)(tm.tm_year + 1900) % 10000u, (unsigned)(tm.tm_mon + 1) % 100u,
		 (unsigned)tm.tm_mday % 100u, (unsigned)tm.tm_hour % 100u,
		 (unsigned)tm.tm_min % 100u, (unsigned)tm.tm_sec % 100u,
		 (unsigned)frac % 1000u);
	return buf;
}
