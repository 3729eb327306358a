/*
 * Unit tests for core/proc/liveness.c: a holder that cannot be watched through
 * a pidfd right now (the daemon may keep no more descriptors, or the
 * process has none left at all) is polled by pid and start time until it
 * can be, and its death is reported all the same.  Real child processes,
 * a real liveness thread.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lockfs/holder.h"
#include "../../core/base/clock.h"
#include "../../core/proc/fds.h"
#include "../../core/proc/liveness.h"

#define TICK_MS 20

/* What the liveness thread reported. */
struct seen {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	pid_t pid;
	unsigned long long start;
	int exits;
};

static void on_exit_cb(void *arg, pid_t pid, unsigned long long start)
{
	struct seen *s = arg;

	pthread_mutex_lock(&s->mu);
	s->pid = pid;
	s->start = start;
	s->exits++;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->mu);
}

/* Wait up to MS for the EXITS-th report.  true if it came. */
static bool wait_exits(struct seen *s, int exits, int ms)
{
	struct timespec until;
	bool ok;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ms / 1000;
	until.tv_nsec += (long)(ms % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&s->mu);
	while (s->exits < exits &&
	       pthread_cond_timedwait(&s->cond, &s->mu, &until) == 0)
		;
	ok = s->exits >= exits;
	pthread_mutex_unlock(&s->mu);
	return ok;
}

static int pidfds_open(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char path[300], link[64];
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d))) {
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len > 0) {
			link[len] = '\0';
			n += strcmp(link, "anon_inode:[pidfd]") == 0;
		}
	}
	closedir(d);
	return n;
}

static pid_t child(unsigned long long *start)
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		pause();
		_exit(0);
	}
	assert_int_equal(lockfs_procfs_start_time(pid, start), 0);
	return pid;
}

struct fixture {
	struct seen seen;
	struct lockfs_fds fds;
	struct lockfs_liveness *lv;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	pthread_mutex_init(&f->seen.mu, NULL);
	pthread_cond_init(&f->seen.cond, NULL);
	lockfs_fds_init(&f->fds);
	if (lockfs_liveness_new(&f->lv, on_exit_cb, NULL, &f->seen, TICK_MS) < 0)
		return -1;
	lockfs_liveness_set_fds(f->lv, &f->fds);
	if (lockfs_liveness_run(f->lv) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	lockfs_liveness_free(f->lv);
	pthread_cond_destroy(&f->seen.cond);
	pthread_mutex_destroy(&f->seen.mu);
	free(f);
	return 0;
}

/* The daemon may keep no more descriptors: as if its budget were spent. */
static void spend_budget(struct lockfs_fds *fds)
{
	fds->limit = 1000;
	fds->base = 0;
	fds->reserve = 64;
	atomic_store(&fds->held, 1000);
}

static void test_a_watched_holder_has_a_pidfd(void **state)
{
	struct fixture *f = *state;
	unsigned long long start;
	int before = pidfds_open();
	pid_t pid = child(&start);

	assert_int_equal(lockfs_liveness_watch(f->lv, pid, start), 0);
	assert_int_equal(pidfds_open(), before + 1);
	assert_true(lockfs_liveness_alive(f->lv, pid, start));
	kill(pid, SIGKILL);
	assert_true(wait_exits(&f->seen, 1, 2000));
	assert_int_equal(f->seen.pid, pid);
	lockfs_liveness_unwatch(f->lv, pid, start);
	waitpid(pid, NULL, 0);
}

static void test_no_descriptor_to_spare_polls_and_reports_the_death(void **state)
{
	struct fixture *f = *state;
	unsigned long long start;
	int before = pidfds_open();
	pid_t pid;

	spend_budget(&f->fds);
	pid = child(&start);
	assert_int_equal(lockfs_liveness_watch(f->lv, pid, start), 0);
	assert_int_equal(pidfds_open(), before);        /* no pidfd ... */
	assert_true(lockfs_liveness_watches_pid(f->lv, pid)); /* ... yet watched */
	assert_false(lockfs_liveness_alive(f->lv, pid, start)); /* unknown, not "alive" */
	assert_false(wait_exits(&f->seen, 1, 5 * TICK_MS)); /* it lives: nothing */
	kill(pid, SIGKILL); /* a zombie until reaped: dead all the same */
	assert_true(wait_exits(&f->seen, 1, 2000));
	assert_int_equal(f->seen.pid, pid);
	assert_true(f->seen.start == start);
	lockfs_liveness_unwatch(f->lv, pid, start);
	waitpid(pid, NULL, 0);
	assert_int_equal(atomic_load(&f->fds.held), 1000);
}

static void test_a_pidfd_given_over_past_the_budget_is_closed_and_polled(void **state)
{
	struct fixture *f = *state;
	unsigned long long start;
	int before = pidfds_open();
	pid_t pid = child(&start);
	int fd = (int)syscall(SYS_pidfd_open, pid, 0);

	assert_true(fd >= 0);
	spend_budget(&f->fds);
	assert_int_equal(lockfs_liveness_watch_fd(f->lv, pid, start, fd), 0);
	assert_int_equal(pidfds_open(), before);
	kill(pid, SIGKILL);
	assert_true(wait_exits(&f->seen, 1, 2000));
	lockfs_liveness_unwatch(f->lv, pid, start);
	waitpid(pid, NULL, 0);
}

static void test_a_polled_holder_gets_a_pidfd_once_descriptors_are_back(void **state)
{
	struct fixture *f = *state;
	unsigned long long start;
	int before = pidfds_open();
	pid_t pid;

	spend_budget(&f->fds);
	pid = child(&start);
	assert_int_equal(lockfs_liveness_watch(f->lv, pid, start), 0);
	assert_int_equal(pidfds_open(), before);
	atomic_store(&f->fds.held, 0);
	for (int i = 0; i < 100 && pidfds_open() == before; i++)
		usleep(TICK_MS * 1000);
	assert_int_equal(pidfds_open(), before + 1);
	assert_int_equal(atomic_load(&f->fds.held), 1);
	assert_true(lockfs_liveness_alive(f->lv, pid, start));
	kill(pid, SIGKILL);
	assert_true(wait_exits(&f->seen, 1, 2000));
	lockfs_liveness_unwatch(f->lv, pid, start);
	assert_int_equal(atomic_load(&f->fds.held), 0);
	waitpid(pid, NULL, 0);
}

static void test_a_polled_holder_already_dead_is_esrch(void **state)
{
	struct fixture *f = *state;
	unsigned long long start;
	pid_t pid = child(&start);

	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	spend_budget(&f->fds);
	assert_int_equal(lockfs_liveness_watch(f->lv, pid, start), -ESRCH);
	assert_int_equal(lockfs_liveness_watch(f->lv, getpid(), start), -ESRCH); /* another start */
}

/* The process itself is out of descriptors (EMFILE from pidfd_open and
 * from /proc): the holder is polled, unknown until descriptors are back,
 * and never forgotten. */
static void test_emfile_from_pidfd_open_polls_until_it_can_tell(void **state)
{
	struct fixture *f = *state;
	unsigned long long start;
	struct rlimit old, tight;
	pid_t pid = child(&start);
	int spare[64], nspare = 0, rc;

	assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
	/* Use up every descriptor below a low limit. */
	tight = old;
	tight.rlim_cur = 64;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &tight), 0);
	while (nspare < 64) {
		int fd = open("/dev/null", O_RDONLY);

		if (fd < 0)
			break;
		spare[nspare++] = fd;
	}
	rc = lockfs_liveness_watch(f->lv, pid, start);
	kill(pid, SIGKILL);
	assert_false(wait_exits(&f->seen, 1, 5 * TICK_MS)); /* cannot tell yet */
	for (int i = 0; i < nspare; i++)
		close(spare[i]);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
	assert_int_equal(rc, 0);
	assert_true(wait_exits(&f->seen, 1, 2000)); /* told once it can */
	assert_int_equal(f->seen.pid, pid);
	lockfs_liveness_unwatch(f->lv, pid, start);
	waitpid(pid, NULL, 0);
}

/* ---- the tick follows the engine's clock (core/base/clock.c) ------------- */

static int64_t fake_boot;  /* ms; read by the liveness thread */

static int64_t fake_boot_ms(void *arg)
{
	(void)arg;
	return __atomic_load_n(&fake_boot, __ATOMIC_SEQ_CST);
}

static int64_t real_wall_ms(void *arg)
{
	(void)arg;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The tick callback counts as an exit report, so that wait_exits awaits it. */
static bool on_tick(void *arg)
{
	on_exit_cb(arg, 0, 0);
	return true;
}

/* A tick that finds nothing to tick for. */
static bool on_idle_tick(void *arg)
{
	on_exit_cb(arg, 0, 0);
	return false;
}

static void test_an_idle_tick_sleeps_until_woken(void **state)
{
	struct seen seen = { .exits = 0 };
	struct lockfs_liveness *lv;

	(void)state;
	assert_int_equal(lockfs_liveness_new(&lv, on_exit_cb, on_idle_tick, &seen, TICK_MS), 0);
	assert_int_equal(lockfs_liveness_run(lv), 0);
	/* The ticks come, each saying nothing is left: after
	 * LOCKFS_LIVENESS_IDLE_TICKS of them, none in ten ticks' time. */
	assert_true(wait_exits(&seen, LOCKFS_LIVENESS_IDLE_TICKS, 10000));
	assert_false(wait_exits(&seen, LOCKFS_LIVENESS_IDLE_TICKS + 1, 10 * TICK_MS));
	/* A wake brings them back at once, as many again, then sleep. */
	lockfs_liveness_wake(lv);
	assert_true(wait_exits(&seen, LOCKFS_LIVENESS_IDLE_TICKS + 1, 5000));
	assert_true(wait_exits(&seen, 2 * LOCKFS_LIVENESS_IDLE_TICKS, 10000));
	assert_false(wait_exits(&seen, 2 * LOCKFS_LIVENESS_IDLE_TICKS + 1, 10 * TICK_MS));
	lockfs_liveness_free(lv);
}

static void test_ticks_follow_the_engine_clock(void **state)
{
	static const struct lockfs_clock clock = { real_wall_ms, fake_boot_ms, NULL };
	struct seen seen = { .exits = 0 };
	struct lockfs_liveness *lv;
	int ticks;
	(void)state;

	pthread_mutex_init(&seen.mu, NULL);
	pthread_cond_init(&seen.cond, NULL);
	__atomic_store_n(&fake_boot, 1000000, __ATOMIC_SEQ_CST);
	lockfs_clock_override(&clock);
	assert_int_equal(lockfs_liveness_new(&lv, on_exit_cb, on_tick, &seen, TICK_MS), 0);
	assert_int_equal(lockfs_liveness_run(lv), 0);
	/* The engine's clock stands still: ten ticks of real time bring none
	 * (with CLOCK_MONOTONIC they brought about ten). */
	assert_false(wait_exits(&seen, 1, 10 * TICK_MS));
	/* It moves on by one tick: the thread ticks. */
	__atomic_store_n(&fake_boot, 1000000 + TICK_MS, __ATOMIC_SEQ_CST);
	assert_true(wait_exits(&seen, 1, 5000));
	lockfs_liveness_free(lv);
	lockfs_clock_override(NULL);
	pthread_mutex_lock(&seen.mu);
	ticks = seen.exits;
	pthread_mutex_unlock(&seen.mu);
	assert_int_equal(ticks, 1); /* the clock moved by one tick only */
	pthread_cond_destroy(&seen.cond);
	pthread_mutex_destroy(&seen.mu);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_a_watched_holder_has_a_pidfd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_descriptor_to_spare_polls_and_reports_the_death,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_pidfd_given_over_past_the_budget_is_closed_and_polled, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_polled_holder_gets_a_pidfd_once_descriptors_are_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_polled_holder_already_dead_is_esrch, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_emfile_from_pidfd_open_polls_until_it_can_tell,
						setup, teardown),
		cmocka_unit_test(test_ticks_follow_the_engine_clock),
		cmocka_unit_test(test_an_idle_tick_sleeps_until_woken),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
