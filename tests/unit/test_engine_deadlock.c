/*
 * Deadlock detection (core/lock/deadlock.c) without a mount: fd-lock waits
 * on the fake store and the fake process table (engine_harness.h).  The
 * real-mount tests are tests/integration/flock/test_deadlock.py; these
 * pin the graph's bookkeeping: waits leave it when granted or taken back,
 * the process-tree rule, and a lone waiter reading no /proc.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine_harness.h"
#include "fake_procs.h"

static struct engine_harness H;

#define acquire(pid, name) engine_acquire(&H, (pid), (name))

static int setup(void **state)
{
	(void)state;
	engine_open(&H, NULL);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	engine_close(&H);
	return 0;
}

struct waiter {
	struct lockfs_wait w;    /* first: done() gets it */
	char owner[24];
	bool answered;
	int result;
};

static void waiter_done(struct lockfs_wait *w, int result)
{
	struct waiter *x = (struct waiter *)w;

	x->answered = true;
	x->result = result;
}

static int owners;

/* Process PID asks for NAME exclusively through a new owner, waiting. */
static int fd_lock(struct waiter *x, pid_t pid, const char *name)
{
	struct lockfs_caller c = engine_caller(pid);

	memset(x, 0, sizeof(*x));
	x->w.done = waiter_done;
	snprintf(x->owner, sizeof(x->owner), "flock:%x", ++owners);
	return lockfs_core_fd_lock(H.core, &c, &(struct lockfs_fd_request){
		.name = name, .owner = x->owner, .mode = LOCKFS_EXCLUSIVE, .wait = true }, &x->w);
}

static void fd_unlock(struct waiter *x, const char *name)
{
	assert_int_equal(lockfs_core_fd_unlock(H.core, name, x->owner), 0);
}

static void test_the_wait_that_closes_a_cycle_is_edeadlk_the_other_waits(void **state)
{
	pid_t p = engine_proc(&H, NULL), q = engine_proc(&H, NULL);
	struct waiter pa, qb, pb, qa;
	char pid[32];

	(void)state;
	assert_int_equal(fd_lock(&pa, p, "A"), 0);
	assert_int_equal(fd_lock(&qb, q, "B"), 0);
	assert_int_equal(fd_lock(&pb, p, "B"), -EINPROGRESS);
	assert_int_equal(fd_lock(&qa, q, "A"), -EDEADLK);
	assert_false(qa.answered); /* the caller answers EDEADLK: DONE is not called */
	assert_false(pb.answered);
	snprintf(pid, sizeof(pid), "pid1=%d", (int)q);
	assert_int_equal(engine_logged(&H, "A", "deadlock",
				       (const char *const[]){ "cycle=2", pid, "wait1=A", NULL }), 1);
	fd_unlock(&qb, "B");
	assert_true(pb.answered);
	assert_int_equal(pb.result, 0);
}

static void test_a_granted_wait_leaves_the_graph(void **state)
{
	pid_t p = engine_proc(&H, NULL), q = engine_proc(&H, NULL);
	struct waiter pa, qb, pb, qa;

	(void)state;
	assert_int_equal(fd_lock(&pa, p, "A"), 0);
	assert_int_equal(fd_lock(&qb, q, "B"), 0);
	assert_int_equal(fd_lock(&pb, p, "B"), -EINPROGRESS);
	fd_unlock(&qb, "B");
	assert_true(pb.answered);
	/* P holds A and B and waits for nothing: Q's wait for A is no cycle. */
	assert_int_equal(fd_lock(&qa, q, "A"), -EINPROGRESS);
	assert_int_equal(engine_logged(&H, "A", "deadlock", NULL), 0);
	fd_unlock(&pa, "A");
	assert_true(qa.answered);
}

static void test_a_wait_taken_back_leaves_the_graph(void **state)
{
	pid_t p = engine_proc(&H, NULL), q = engine_proc(&H, NULL);
	struct waiter pa, qb, pb, qa;

	(void)state;
	assert_int_equal(fd_lock(&pa, p, "A"), 0);
	assert_int_equal(fd_lock(&qb, q, "B"), 0);
	assert_int_equal(fd_lock(&pb, p, "B"), -EINPROGRESS);
	assert_int_equal(lockfs_core_fd_cancel(H.core, "B", &pb.w), 0); /* Ctrl-C */
	assert_int_equal(fd_lock(&qa, q, "A"), -EINPROGRESS);
	assert_int_equal(engine_logged(&H, "A", "deadlock", NULL), 0);
	fd_unlock(&pa, "A");
	assert_true(qa.answered);
}

static void test_a_child_of_a_holder_counts_as_the_holder(void **state)
{
	pid_t p = engine_proc(&H, NULL), q = engine_proc(&H, NULL), child = H.next_pid++;
	struct waiter cb, qb, qa;

	(void)state;
	assert_int_equal(fake_procs_add(&(struct fake_proc){
		.pid = child, .ppid = p, .sid = p, .start = 100000 + (unsigned long long)child,
		.exe = "worker" }), 0);
	assert_int_equal(acquire(p, "A"), 0);            /* mkdir by P */
	assert_int_equal(fd_lock(&qb, q, "B"), 0);
	assert_int_equal(fd_lock(&cb, child, "B"), -EINPROGRESS);
	assert_int_equal(fd_lock(&qa, q, "A"), -EDEADLK);
	assert_false(cb.answered);
	fd_unlock(&qb, "B");
	assert_true(cb.answered);
}

static void test_a_lone_waiter_reads_no_proc(void **state)
{
	pid_t p = engine_proc(&H, NULL), q = engine_proc(&H, NULL);
	struct waiter pa, qa;
	int reads;

	(void)state;
	assert_int_equal(fd_lock(&pa, p, "A"), 0);
	fake_procs_reads = 0;
	assert_int_equal(fd_lock(&qa, q, "A"), -EINPROGRESS);
	reads = fake_procs_reads;
	/* The same wait with another waiter parked elsewhere reads the tree. */
	fd_unlock(&pa, "A");
	assert_true(qa.answered);
	{
		struct waiter x, y, z;
		pid_t r = engine_proc(&H, NULL), s = engine_proc(&H, NULL);

		assert_int_equal(fd_lock(&x, r, "C"), 0);
		assert_int_equal(fd_lock(&y, s, "C"), -EINPROGRESS);
		fake_procs_reads = 0;
		assert_int_equal(fd_lock(&z, p, "A"), -EINPROGRESS); /* held by Q */
		assert_true(fake_procs_reads > reads);
		fd_unlock(&x, "C");
		fd_unlock(&qa, "A");
	}
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_the_wait_that_closes_a_cycle_is_edeadlk_the_other_waits),
		T(test_a_granted_wait_leaves_the_graph),
		T(test_a_wait_taken_back_leaves_the_graph),
		T(test_a_child_of_a_holder_counts_as_the_holder),
		T(test_a_lone_waiter_reads_no_proc),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
