/*
 * A daemon that takes over the live FUSE connection of one that died
 * (lockfs_core_config.resuming, core/lock/resume.h), on the fake store and
 * process table: the open files of the mount are still open, and the
 * requests the dead daemon had read but not answered come back, resent
 * (lockfs_caller.resent), in the kernel's hash order -- not the order they
 * were made (lockfs_caller.ticket).  Each test restarts the engine with
 * engine_restart(.., true) and feeds it what the kernel would.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine_harness.h"
#include "lock/table.h"

static struct engine_harness H;
/* The child a test started (child()), ended by teardown whatever the test
 * did: a failed assertion leaves the test at once. */
static pid_t the_child;

static int setup(void **state)
{
	(void)state;
	engine_open(&H, NULL);
	return 0;
}

/* Holders that are real processes (this test and its child): a restart
 * watches a process-bound holder again through the real pidfd_open. */
static int setup_real(void **state)
{
	(void)state;
	engine_open(&H, &(struct engine_options){ .real_procs = true });
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (the_child > 0) {
		kill(the_child, SIGKILL);
		waitpid(the_child, NULL, 0);
		the_child = 0;
	}
	engine_close(&H);
	return 0;
}

struct waiter {
	struct lockfs_wait w;    /* first: done() gets it */
	char owner[24];
	bool answered;
	int result;
	int order;               /* 1, 2, ...: when it was answered */
};

static int answers;

static void waiter_done(struct lockfs_wait *w, int result)
{
	struct waiter *x = (struct waiter *)w;

	x->answered = true;
	x->result = result;
	x->order = ++answers;
}

/* Process PID's request number TICKET (RESENT or not) for NAME as owner
 * "flock:N" (exclusive, waiting; VIA the open file an fcntl lock comes
 * through, 0 for flock). */
static int fd_lock_via(struct waiter *x, pid_t pid, const char *name, int n, uint64_t ticket,
		       bool resent, uint64_t via)
{
	struct lockfs_caller c = engine_caller(pid);

	c.ticket = ticket;
	c.resent = resent;
	memset(x, 0, sizeof(*x));
	x->w.done = waiter_done;
	snprintf(x->owner, sizeof(x->owner), via ? "posix:%x" : "flock:%x", n);
	return lockfs_core_fd_lock(H.core, &c, &(struct lockfs_fd_request){
		.name = name, .owner = x->owner, .via_file = via, .mode = LOCKFS_EXCLUSIVE,
		.wait = true }, &x->w);
}

static int fd_lock(struct waiter *x, pid_t pid, const char *name, int n, uint64_t ticket,
		   bool resent)
{
	return fd_lock_via(x, pid, name, n, ticket, resent, 0);
}

static void fd_unlock(struct waiter *x, const char *name)
{
	assert_int_equal(lockfs_core_fd_unlock(H.core, name, x->owner), 0);
}

static char *binding(const char *name)
{
	char *text = NULL;
	size_t len;

	if (lockfs_core_binding(H.core, name, &text, &len) < 0)
		return NULL;
	return text;
}

static uint64_t fence_of(const char *name)
{
	struct lockfs_lock_stat st;

	assert_int_equal(lockfs_core_stat(H.core, name, &st), 0);
	return st.fence;
}

/* ---- fd locks stay fd locks ---- */

static void test_resumed_flock_lock_stays_bound_to_its_open_file(void **state)
{
	pid_t p = engine_proc(&H, NULL);
	struct waiter a;
	char *b;

	(void)state;
	assert_int_equal(fd_lock(&a, p, "x", 0xa1, 5, false), 0);
	engine_restart(&H, true);
	b = binding("x");
	assert_non_null(b);
	assert_string_equal(b, "fd\n");
	free(b);
	assert_int_equal(engine_logged(&H, "x", "rebound", NULL), 0);
	assert_int_equal(engine_logged(&H, "x", "recovered", NULL), 0);
	/* Its open file lets go through the same connection: released. */
	fd_unlock(&a, "x");
	assert_int_equal(lockfs_core_stat(H.core, "x", NULL), -ENOENT);
	assert_int_equal(engine_logged(&H, "x", "released", NULL), 1);
}

static void test_resumed_fcntl_lock_ends_at_its_open_files_last_close(void **state)
{
	pid_t p = engine_proc(&H, NULL);
	struct waiter a;

	(void)state;
	assert_int_equal(fd_lock_via(&a, p, "x", 0xb2, 5, false, 77), 0);
	engine_restart(&H, true);
	/* Another open file's close is not this lock's. */
	lockfs_core_fd_file_closed(H.core, "x", 78);
	assert_int_equal(lockfs_core_stat(H.core, "x", NULL), 0);
	lockfs_core_fd_file_closed(H.core, "x", 77);
	assert_int_equal(lockfs_core_stat(H.core, "x", NULL), -ENOENT);
	assert_int_equal(engine_logged(&H, "x", "released", NULL), 1);
}

static void test_ordinary_restart_still_rebinds_fd_locks_to_processes(void **state)
{
	pid_t p = engine_proc(&H, NULL);
	struct waiter a;
	char *b;

	(void)state;
	assert_int_equal(fd_lock(&a, p, "x", 0xa1, 5, false), 0);
	engine_restart(&H, false);
	/* Bound to a process now, as every restart did before (and then
	 * recovered: the real pidfd_open cannot find the fake holder). */
	b = binding("x");
	assert_true(!b || strcmp(b, "fd\n") != 0);
	free(b);
	assert_int_equal(engine_logged(&H, "x", "rebound", NULL), 1);
}

/* ---- resent mkdir and rmdir ---- */

/* A request of real process PID. */
static struct lockfs_caller real_caller(pid_t pid)
{
	return (struct lockfs_caller){ .tid = pid, .uid = getuid(), .gid = getgid() };
}

/* A child that waits to be killed: another holder. */
static pid_t child(void)
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		for (;;)
			pause();
	}
	the_child = pid;
	return pid;
}

static void test_resent_mkdir_of_its_own_grant_answers_0_with_the_same_lock(void **state)
{
	pid_t q = child();
	struct lockfs_caller c = real_caller(getpid()), other = real_caller(q);
	struct lockfs_lock_stat st;
	uint64_t fence;

	(void)state;
	c.ticket = 42;
	assert_int_equal(lockfs_core_acquire(H.core, "x", &c, &st), 0);
	fence = st.fence;
	engine_restart(&H, true);
	/* The dead daemon granted it, its answer was lost: resent. */
	c.resent = true;
	memset(&st, 0, sizeof(st));
	assert_int_equal(lockfs_core_acquire(H.core, "x", &c, &st), 0);
	assert_int_equal(st.fence, fence);
	assert_int_equal(engine_logged(&H, "x", "acquired", NULL), 1);
	/* Another request of the same holder, or anyone else's: held. */
	c.ticket = 43;
	assert_int_equal(lockfs_core_acquire(H.core, "x", &c, NULL), -EEXIST);
	c.ticket = 42;
	c.resent = false;
	assert_int_equal(lockfs_core_acquire(H.core, "x", &c, NULL), -EEXIST);
	other.ticket = 42;
	other.resent = true;
	assert_int_equal(lockfs_core_acquire(H.core, "x", &other, NULL), -EEXIST);
	assert_int_equal(fence_of("x"), fence);
}

static void test_resent_rmdir_of_a_free_name_answers_0_and_of_anothers_is_eperm(void **state)
{
	pid_t q = child();
	struct lockfs_caller c = real_caller(getpid()), other = real_caller(q);

	(void)state;
	assert_int_equal(lockfs_core_acquire(H.core, "x", &c, NULL), 0);
	assert_int_equal(lockfs_core_acquire(H.core, "y", &other, NULL), 0);
	/* The dead daemon released x for this rmdir; its answer was lost. */
	assert_int_equal(lockfs_core_release(H.core, "x", &c), 0);
	engine_restart(&H, true);
	c.ticket = 9;
	c.resent = true;
	assert_int_equal(lockfs_core_release(H.core, "x", &c), 0);
	assert_int_equal(engine_logged(&H, "x", "released", NULL), 1);
	/* Held by someone else: EPERM, as for any rmdir. */
	assert_int_equal(lockfs_core_release(H.core, "y", &c), -EPERM);
	assert_int_equal(lockfs_core_stat(H.core, "y", NULL), 0);
	/* Not resent: the usual ENOENT. */
	c.resent = false;
	assert_int_equal(lockfs_core_release(H.core, "x", &c), -ENOENT);
}

static void test_resent_rmdir_that_handed_the_lock_to_a_waiter_answers_0(void **state)
{
	struct lockfs_caller c = real_caller(getpid()), other = real_caller(child());
	struct waiter w;
	char *b;

	(void)state;
	c.ticket = 70;
	assert_int_equal(lockfs_core_acquire(H.core, "x", &c, NULL), 0);
	memset(&w, 0, sizeof(w));
	w.w.done = waiter_done;
	snprintf(w.owner, sizeof(w.owner), "flock:%x", 0xcc);
	other.ticket = 71;
	assert_int_equal(lockfs_core_fd_lock(H.core, &other, &(struct lockfs_fd_request){
		.name = "x", .owner = w.owner, .mode = LOCKFS_EXCLUSIVE, .wait = true }, &w.w),
			 -EINPROGRESS);
	/* The rmdir hands x to the waiter; its answer is lost. */
	c.ticket = 72;
	assert_int_equal(lockfs_core_release(H.core, "x", &c), 0);
	assert_true(w.answered);
	engine_restart(&H, true);
	c.resent = true;
	assert_int_equal(lockfs_core_release(H.core, "x", &c), 0);
	/* Still the waiter's, as an fd lock. */
	b = binding("x");
	assert_non_null(b);
	assert_string_equal(b, "fd\n");
	free(b);
	/* Another request is asked as usual: not the holder's. */
	c.ticket = 73;
	c.resent = false;
	assert_int_equal(lockfs_core_release(H.core, "x", &c), -EPERM);
	fd_unlock(&w, "x");
}

/* ---- waiters keep their place ---- */

static void test_resent_waiters_are_queued_in_the_order_they_asked(void **state)
{
	pid_t h = engine_proc(&H, NULL), a = engine_proc(&H, NULL), b = engine_proc(&H, NULL),
	      c = engine_proc(&H, NULL);
	struct waiter wh, wa, wb, wc;

	(void)state;
	answers = 0;
	assert_int_equal(fd_lock(&wh, h, "x", 1, 5, false), 0);
	engine_restart(&H, true);
	/* Parked before the crash as 10, 20, 30; back as 20, 30, 10. */
	assert_int_equal(fd_lock(&wb, b, "x", 3, 20, true), -EINPROGRESS);
	assert_int_equal(fd_lock(&wc, c, "x", 4, 30, true), -EINPROGRESS);
	assert_int_equal(fd_lock(&wa, a, "x", 2, 10, true), -EINPROGRESS);
	lockfs_core_resume_done(H.core);
	fd_unlock(&wh, "x");
	assert_true(wa.answered);
	assert_false(wb.answered);
	fd_unlock(&wa, "x");
	assert_true(wb.answered);
	assert_false(wc.answered);
	fd_unlock(&wb, "x");
	assert_true(wc.answered);
	assert_int_equal(wa.order, 1);
	assert_int_equal(wb.order, 2);
	assert_int_equal(wc.order, 3);
	fd_unlock(&wc, "x");
}

static void test_release_before_every_resent_waiter_is_back_keeps_the_first_ones_place(void **state)
{
	pid_t h = engine_proc(&H, NULL), a = engine_proc(&H, NULL), b = engine_proc(&H, NULL);
	struct waiter wh, wa, wb;

	(void)state;
	answers = 0;
	assert_int_equal(fd_lock(&wh, h, "x", 1, 5, false), 0);
	engine_restart(&H, true);
	/* 20 is back, the holder lets go (resent too), then 10 is back. */
	assert_int_equal(fd_lock(&wb, b, "x", 3, 20, true), -EINPROGRESS);
	fd_unlock(&wh, "x");
	assert_false(wb.answered);
	/* Meanwhile the name is the waiters': nobody barges. */
	assert_int_equal(engine_acquire(&H, h, "x"), -EEXIST);
	assert_int_equal(fd_lock(&wa, a, "x", 2, 10, true), -EINPROGRESS);
	lockfs_core_resume_done(H.core);
	assert_true(wa.answered);
	assert_int_equal(wa.result, 0);
	assert_false(wb.answered);
	fd_unlock(&wa, "x");
	assert_true(wb.answered);
	fd_unlock(&wb, "x");
}

static void test_hold_ends_by_itself_when_no_resent_request_comes(void **state)
{
	pid_t h = engine_proc(&H, NULL), b = engine_proc(&H, NULL);
	struct waiter wh, wb;

	(void)state;
	assert_int_equal(fd_lock(&wh, h, "x", 1, 5, false), 0);
	engine_restart(&H, true);
	assert_int_equal(fd_lock(&wb, b, "x", 3, 20, true), -EINPROGRESS);
	fd_unlock(&wh, "x");
	engine_tick(&H);
	assert_false(wb.answered);
	engine_advance(&H, LOCKFS_RESUME_HOLD_MS);
	engine_tick(&H);
	assert_true(wb.answered);
	assert_int_equal(wb.result, 0);
	fd_unlock(&wb, "x");
}

static void test_resent_waiter_the_dead_daemon_granted_gets_it_at_once(void **state)
{
	pid_t h = engine_proc(&H, NULL), a = engine_proc(&H, NULL);
	struct waiter wh, wa, again;
	uint64_t fence;

	(void)state;
	assert_int_equal(fd_lock(&wh, h, "x", 1, 5, false), 0);
	assert_int_equal(fd_lock(&wa, a, "x", 2, 10, false), -EINPROGRESS);
	fd_unlock(&wh, "x"); /* handed to 10; its answer is lost with the daemon */
	assert_true(wa.answered);
	fence = fence_of("x");
	engine_restart(&H, true);
	assert_int_equal(fd_lock(&again, a, "x", 2, 10, true), 0);
	assert_int_equal(fence_of("x"), fence);
	assert_int_equal(engine_logged(&H, "x", "acquired", NULL), 2);
	assert_int_equal(engine_logged(&H, "x", "recovered", NULL), 0);
	fd_unlock(&again, "x");
	assert_int_equal(lockfs_core_stat(H.core, "x", NULL), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_resumed_flock_lock_stays_bound_to_its_open_file,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_resumed_fcntl_lock_ends_at_its_open_files_last_close, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_ordinary_restart_still_rebinds_fd_locks_to_processes, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_resent_mkdir_of_its_own_grant_answers_0_with_the_same_lock, setup_real,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_resent_rmdir_of_a_free_name_answers_0_and_of_anothers_is_eperm,
			setup_real, teardown),
		cmocka_unit_test_setup_teardown(
			test_resent_rmdir_that_handed_the_lock_to_a_waiter_answers_0, setup_real,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_resent_waiters_are_queued_in_the_order_they_asked, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_release_before_every_resent_waiter_is_back_keeps_the_first_ones_place,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_hold_ends_by_itself_when_no_resent_request_comes,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_resent_waiter_the_dead_daemon_granted_gets_it_at_once, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
