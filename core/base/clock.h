/*
 * The engine's two clocks, in milliseconds: the wall clock (what records
 * and logs show people) and the boot clock (CLOCK_BOOTTIME: deadlines,
 * which survive a daemon restart and never jump).  A unit test may put
 * clocks of its own in their place.
 */
#ifndef LOCKFS_BASE_CLOCK_H
#define LOCKFS_BASE_CLOCK_H

#include <stdint.h>

/* Unix time in ms (CLOCK_REALTIME). */
int64_t lockfs_wall_ms(void);
/* Time since boot in ms, suspend included (CLOCK_BOOTTIME). */
int64_t lockfs_boot_ms(void);

/* Clocks for unit tests: each function gives the time in ms. */
struct lockfs_clock {
	int64_t (*wall_ms)(void *arg);
	int64_t (*boot_ms)(void *arg);
	void *arg;
};

/* Use CLOCK's functions from now on (NULL: the real clocks again).  For
 * unit tests only: call it while no other thread reads a clock.  CLOCK
 * must stay valid until it is replaced. */
void lockfs_clock_override(const struct lockfs_clock *clock);

/*
 * Format MS (Unix milliseconds) as RFC 3339 UTC with milliseconds,
 * "2026-08-22T23:05:52.123Z", into BUF (at least 32 bytes).  Returns BUF.
 */
char *lockfs_format_time(int64_t ms, char buf[32]);

#endif
