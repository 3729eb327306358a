/*
 * The state directory's wait for a stopping predecessor
 * (core/backend/predecessor.c) goes by the boot clock of clock.h, so a
 * test can move it instead of waiting LOCKFS_STATEDIR_WAIT_MS.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/clock.h"
#include "backend/statedir.h"

static int64_t real_ms(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A boot clock that runs a whole wait's bound ahead at every reading. */
static int64_t boot_reads;

static int64_t racing_boot_ms(void *arg)
{
	return real_ms(CLOCK_BOOTTIME) + boot_reads++ * (LOCKFS_STATEDIR_WAIT_MS + 1000);
}

static int64_t real_wall_ms(void *arg)
{
	return real_ms(CLOCK_REALTIME);
}

/* A daemon holds DIR and says it is stopping, but never goes: the wait
 * gives up at LOCKFS_STATEDIR_WAIT_MS by the daemon's clock, which here
 * gets there at once. */
static void test_wait_for_a_stopping_predecessor_ends_by_the_boot_clock(void **state)
{
	struct lockfs_clock racing = { real_wall_ms, racing_boot_ms, NULL };
	struct lockfs_statedir held;
	char dir[] = "/tmp/lockfs-statedir-XXXXXX", why[256] = "", path[64];
	unsigned waited_ms = 0;
	pid_t waited_pid = 0;
	int64_t t0;
	int fd, rc;

	assert_non_null(mkdtemp(dir));
	chmod(dir, 0755);
	assert_int_equal(lockfs_statedir_open(&held, dir, false, NULL, NULL, why, sizeof(why)),
			 0);
	lockfs_statedir_mark_stopping(&held);
	snprintf(path, sizeof(path), "%s/" LOCKFS_STATEDIR_LOCK, dir);
	fd = open(path, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);

	boot_reads = 0;
	lockfs_clock_override(&racing);
	t0 = real_ms(CLOCK_BOOTTIME);
	rc = lockfs_statedir_wait_predecessor(fd, &waited_pid, &waited_ms);
	t0 = real_ms(CLOCK_BOOTTIME) - t0;
	lockfs_clock_override(NULL);

	close(fd);
	lockfs_statedir_close(&held);
	unlink(path);
	rmdir(dir);
	assert_int_equal(rc, -ETIMEDOUT);
	assert_true(boot_reads > 0);
	assert_true(t0 < LOCKFS_STATEDIR_WAIT_MS / 2); /* did not wait by the real clock */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wait_for_a_stopping_predecessor_ends_by_the_boot_clock),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
