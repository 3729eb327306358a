/*
 * The engine without a mount (issue 10 §3, plan task D2): lockfs_core_*
 * on the fake store, the fake process table and a fake clock
 * (engine_harness.h), with ticks, exits and the store's change reports
 * driven one step at a time.  Each test is one behaviour, named after it.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine_harness.h"
#include "fake_backend.h"
#include "fake_procs.h"
#include "lock/store.h"

static struct engine_harness H;

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

/* Is NAME held (as the mount would show it)? */
static bool held(const char *name)
{
	struct lockfs_lock_stat st;

	return lockfs_core_stat(H.core, name, &st) == 0;
}

/* The pid of NAME's holder in its record, 0 when not held. */
static pid_t holder_pid(const char *name)
{
	char *json = engine_owner(&H, name);
	const char *p = json ? strstr(json, "\"pid\":") : NULL;
	pid_t pid = p ? (pid_t)atol(p + 6) : 0;

	free(json);
	return pid;
}

#define acquire(pid, name) engine_acquire(&H, (pid), (name))
#define release(pid, name) engine_release(&H, (pid), (name))

/* ---- fd-lock waiters ---- */

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

/* Process PID asks for NAME in MODE as owner "flock:N", waiting. */
static int fd_lock(struct waiter *x, pid_t pid, const char *name, enum lockfs_mode mode, int n)
{
	struct lockfs_caller c = engine_caller(pid);

	memset(x, 0, sizeof(*x));
	x->w.done = waiter_done;
	snprintf(x->owner, sizeof(x->owner), "flock:%x", n);
	return lockfs_core_fd_lock(H.core, &c, &(struct lockfs_fd_request){
		.name = name, .owner = x->owner, .mode = mode, .wait = true }, &x->w);
}

static void fd_unlock(struct waiter *x, const char *name)
{
	assert_int_equal(lockfs_core_fd_unlock(H.core, name, x->owner), 0);
}

/* ---- acquire ---- */

static void test_acquire_takes_a_free_name_and_logs_acquired(void **state)
{
	pid_t p = engine_proc(&H, NULL);
	struct lockfs_caller c = engine_caller(p);
	struct lockfs_lock_stat st;
	char fence[32];

	(void)state;
	assert_int_equal(lockfs_core_acquire(H.core, "build", &c, &st), 0);
	assert_true(st.fence > 0);
	assert_false(st.foreign);
	assert_int_equal(holder_pid("build"), p);
	snprintf(fence, sizeof(fence), "fence=%llu", (unsigned long long)st.fence);
	assert_int_equal(engine_logged(&H, "build", "acquired",
				       (const char *const[]){ fence, NULL }), 1);
}

static void test_acquire_of_a_held_name_is_eexist(void **state)
{
	pid_t p = engine_proc(&H, NULL), q = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "build"), 0);
	assert_int_equal(acquire(q, "build"), -EEXIST);
	assert_int_equal(holder_pid("build"), p);
	assert_int_equal(engine_logged(&H, "build", "acquired", NULL), 1);
}

/* ---- who the log names for a mkdir ---- */

/* The holder by comm[pid]; a slug instead, when the caller carries one. */
static void test_acquire_logs_the_holder_or_its_slug(void **state)
{
	pid_t p = engine_proc(&H, NULL), q = engine_proc(&H, "deploy");
	char who[32];

	(void)state;
	assert_int_equal(acquire(p, "build"), 0);
	snprintf(who, sizeof(who), "worker[%d]", (int)p);
	assert_int_equal(engine_logged(&H, "build", "acquired",
				       (const char *const[]){ who, NULL }), 1);
	assert_int_equal(acquire(q, "test"), 0);
	assert_int_equal(engine_logged(&H, "test", "acquired",
				       (const char *const[]){ "deploy", NULL }), 1);
}

/* A slug the name rule refuses: EINVAL, logged as the caller's thread. */
static void test_acquire_with_a_bad_slug_is_einval_and_logs_the_thread(void **state)
{
	pid_t p = engine_proc(&H, "bad\x01slug");
	char who[32];

	(void)state;
	assert_int_equal(acquire(p, "build"), -EINVAL);
	assert_false(held("build"));
	snprintf(who, sizeof(who), "?[%d]", (int)p);
	assert_int_equal(engine_logged(&H, "build", "denied",
				       (const char *const[]){ who, "reason=bad-slug", NULL }), 1);
}

/* Over the uid's cap: EDQUOT, and the burst's `refused` line names the
 * holder-to-be as `acquired` would have. */
static void test_acquire_over_the_cap_logs_the_holder_to_be(void **state)
{
	pid_t p;
	char who[32];

	(void)state;
	engine_close(&H);
	engine_open(&H, &(struct engine_options){ .max_locks_per_uid = 1 });
	p = engine_proc(&H, NULL);
	assert_int_equal(acquire(p, "build"), 0);
	assert_int_equal(acquire(p, "test"), -EDQUOT);
	assert_false(held("test"));
	lockfs_core_stop(H.core); /* every burst ends: its line is written */
	snprintf(who, sizeof(who), "worker[%d]", (int)p);
	assert_int_equal(engine_logged(&H, "test", "refused",
				       (const char *const[]){ who, NULL }), 1);
}

/* ---- refused releases ---- */

static void test_release_by_another_process_is_eperm(void **state)
{
	pid_t p = engine_proc(&H, NULL), q = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "build"), 0);
	assert_int_equal(release(q, "build"), -EPERM);
	assert_int_equal(holder_pid("build"), p);
	assert_int_equal(engine_logged(&H, "build", "denied",
				       (const char *const[]){ "reason=not-holder", NULL }), 1);
	assert_int_equal(engine_logged(&H, "build", "released", NULL), 0);
	assert_int_equal(release(p, "build"), 0);
	assert_false(held("build"));
	assert_int_equal(engine_logged(&H, "build", "released", NULL), 1);
}

/* The record's encoder for a rewrite behind the engine's back. */
static int encode_copy(void *arg, uint64_t fence, char **json, size_t *len)
{
	(void)fence;
	*json = strdup(arg);
	if (!*json)
		return -ENOMEM;
	*len = strlen(*json);
	return 0;
}

static void test_release_of_a_record_rewritten_with_another_token_is_eperm(void **state)
{
	pid_t p = engine_proc(&H, NULL);
	struct lockfs_entry_stat st, st2;
	char *json, *tok;
	size_t len;

	(void)state;
	assert_int_equal(acquire(p, "build"), 0);
	/* Someone rewrites the stored record with a token of their own. */
	assert_int_equal(H.be->ops->read(H.be, "build", &json, &len, &st), 0);
	tok = strstr(json, "\"token\":\"");
	assert_non_null(tok);
	memset(tok + 9, 'f', 32);
	assert_int_equal(H.be->ops->update(H.be, "build", st.identity, LOCKFS_UPD_EDIT,
					   &(struct lockfs_record_src){ encode_copy, json }, &st2), 0);
	free(json);

	assert_int_equal(release(p, "build"), -EPERM);
	assert_int_equal(H.be->ops->stat(H.be, "build", NULL, false), 0); /* kept */
	assert_int_equal(engine_logged(&H, "build", "denied",
				       (const char *const[]){ "reason=token-mismatch", NULL }), 1);
	assert_int_equal(engine_logged(&H, "build", "released", NULL), 0);
}

static void test_release_of_another_hosts_lock_is_eperm(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	/* The same pid, the same boot: but a pid of another machine. */
	engine_plant(&H, "build", p, "other-host", NULL);
	assert_true(held("build"));
	assert_int_equal(release(p, "build"), -EPERM);
	assert_true(held("build"));
	assert_int_equal(engine_logged(&H, "build", "denied",
				       (const char *const[]){ "reason=other-host", NULL }), 1);
}

/* ---- hand-off ---- */

static void test_fd_waiters_are_granted_in_fifo_order(void **state)
{
	struct waiter a, w[3];
	pid_t pa = engine_proc(&H, NULL);

	(void)state;
	answers = 0;
	assert_int_equal(fd_lock(&a, pa, "q", LOCKFS_EXCLUSIVE, 1), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(fd_lock(&w[i], engine_proc(&H, NULL), "q", LOCKFS_EXCLUSIVE,
					 10 + i), -EINPROGRESS);
	for (int i = 0; i < 3; i++)
		assert_false(w[i].answered);

	fd_unlock(&a, "q");
	for (int i = 0; i < 3; i++) {
		/* Only the head is granted, and the lock is never free between. */
		assert_true(w[i].answered);
		assert_int_equal(w[i].result, 0);
		assert_int_equal(w[i].order, i + 1);
		for (int j = i + 1; j < 3; j++)
			assert_false(w[j].answered);
		assert_true(held("q"));
		fd_unlock(&w[i], "q");
	}
	assert_false(held("q"));
	assert_int_equal(engine_logged(&H, "q", "acquired", NULL), 4);
	assert_int_equal(engine_logged(&H, "q", "released", NULL), 4);
}

static void test_shared_waiters_at_the_head_are_granted_together(void **state)
{
	struct waiter x, s1, s2, e, s3;

	(void)state;
	answers = 0;
	assert_int_equal(fd_lock(&x, engine_proc(&H, NULL), "db", LOCKFS_EXCLUSIVE, 1), 0);
	assert_int_equal(fd_lock(&s1, engine_proc(&H, NULL), "db", LOCKFS_SHARED, 2), -EINPROGRESS);
	assert_int_equal(fd_lock(&s2, engine_proc(&H, NULL), "db", LOCKFS_SHARED, 3), -EINPROGRESS);
	assert_int_equal(fd_lock(&e, engine_proc(&H, NULL), "db", LOCKFS_EXCLUSIVE, 4), -EINPROGRESS);
	assert_int_equal(fd_lock(&s3, engine_proc(&H, NULL), "db", LOCKFS_SHARED, 5), -EINPROGRESS);

	fd_unlock(&x, "db");
	/* The two readers at the head, not the one behind the writer. */
	assert_true(s1.answered && s2.answered);
	assert_int_equal(s1.result, 0);
	assert_int_equal(s2.result, 0);
	assert_false(e.answered);
	assert_false(s3.answered);

	fd_unlock(&s1, "db");
	assert_false(e.answered); /* s2 still reads */
	fd_unlock(&s2, "db");
	assert_true(e.answered);
	assert_int_equal(e.result, 0);
	assert_false(s3.answered);

	fd_unlock(&e, "db");
	assert_true(s3.answered);
	assert_int_equal(s3.result, 0);
	fd_unlock(&s3, "db");
	assert_false(held("db"));
}

static void test_interrupted_waiter_asking_again_keeps_its_place(void **state)
{
	struct waiter a, b, c;
	pid_t pb = engine_proc(&H, NULL);

	(void)state;
	answers = 0;
	assert_int_equal(fd_lock(&a, engine_proc(&H, NULL), "q", LOCKFS_EXCLUSIVE, 1), 0);
	assert_int_equal(fd_lock(&b, pb, "q", LOCKFS_EXCLUSIVE, 2), -EINPROGRESS);
	assert_int_equal(fd_lock(&c, engine_proc(&H, NULL), "q", LOCKFS_EXCLUSIVE, 3), -EINPROGRESS);
	/* B is interrupted (a signal) and its flock restarted at once. */
	assert_int_equal(lockfs_core_fd_cancel(H.core, "q", &b.w), 0);
	assert_false(b.answered);
	engine_advance(&H, 500);
	assert_int_equal(fd_lock(&b, pb, "q", LOCKFS_EXCLUSIVE, 2), -EINPROGRESS);

	fd_unlock(&a, "q");
	assert_true(b.answered); /* ahead of C, as before */
	assert_int_equal(b.result, 0);
	assert_false(c.answered);
	fd_unlock(&b, "q");
	assert_true(c.answered);
	fd_unlock(&c, "q");
}

/* ---- recovery decisions ---- */

static void test_exited_holder_is_recovered_with_evidence_exited(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "build"), 0);
	engine_tick(&H);
	assert_true(held("build"));

	engine_exit(&H, p);
	assert_false(held("build"));
	assert_int_equal(H.be->ops->stat(H.be, "build", NULL, false), -ENOENT);
	assert_int_equal(engine_logged(&H, "build", "recovered",
				       (const char *const[]){ "evidence=exited", NULL }), 1);
}

static void test_holder_of_another_boot_of_this_host_is_recovered_boot_changed(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	/* Its pid is alive here, but that is another boot's process. */
	engine_plant(&H, "build", p, NULL, "00000000-0000-4000-8000-000000000000");
	assert_true(held("build")); /* met: cached and judged */
	engine_tick(&H);
	assert_false(held("build"));
	assert_int_equal(engine_logged(&H, "build", "recovered",
				       (const char *const[]){ "evidence=boot-changed", NULL }), 1);
}

static void test_holder_on_another_host_is_never_recovered(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	/* Another boot, and a pid that is dead here: neither is evidence
	 * about another machine's process. */
	engine_plant(&H, "build", p, "other-host", "00000000-0000-4000-8000-000000000000");
	assert_int_equal(fake_procs_exit(p), 0);
	assert_true(held("build"));
	for (int i = 0; i < 5; i++) {
		engine_advance(&H, 3600 * 1000);
		engine_tick(&H);
	}
	assert_true(held("build"));
	assert_int_equal(engine_logged(&H, "build", "recovered", NULL), 0);
	assert_int_equal(engine_logged(&H, "build", "expired", NULL), 0);
}

/* ---- leases ---- */

static void test_lease_of_a_live_holder_running_out_is_logged_and_kept(void **state)
{
	pid_t p = engine_proc(&H, NULL);
	struct lockfs_caller c = engine_caller(p);

	(void)state;
	assert_int_equal(acquire(p, "build"), 0);
	assert_int_equal(lockfs_core_set_lease(H.core, "build", &c, "5", 1), 0);
	engine_advance(&H, 4000);
	engine_tick(&H);
	assert_int_equal(engine_logged(&H, "build", "expired", NULL), 0);

	engine_advance(&H, 2000);
	engine_tick(&H);
	engine_tick(&H);
	assert_true(held("build"));
	assert_int_equal(engine_logged(&H, "build", "expired",
				       (const char *const[]){ "ttl_s=5", "evidence=holder-alive",
							      NULL }), 1);
}

static void test_slug_lease_running_out_is_recovered_once_no_process_has_the_slug(void **state)
{
	pid_t p;

	(void)state;
	engine_close(&H);
	engine_open(&H, &(struct engine_options){ .lease_s = 10 });
	p = engine_proc(&H, "nightly");
	assert_int_equal(acquire(p, "build"), 0);

	/* Past the lease, the slug still carried by a live process: kept. */
	engine_advance(&H, 11 * 1000);
	engine_tick(&H);
	assert_true(held("build"));
	assert_int_equal(engine_logged(&H, "build", "expired",
				       (const char *const[]){ "evidence=process-with-slug", NULL }),
			 1);

	/* Nobody carries it any more: recovered, and said why. */
	assert_int_equal(fake_procs_exit(p), 0);
	engine_advance(&H, 1100); /* /proc is looked at once a second per lock */
	engine_tick(&H);
	assert_false(held("build"));
	assert_int_equal(engine_logged(&H, "build", "recovered",
				       (const char *const[]){ "slug=nightly",
					       "evidence=lease-expired,no-process-with-slug", NULL }),
			 1);
}

/* ---- the store ---- */

static int64_t real_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_stale_foreign_lock_is_taken_by_the_same_acquire(void **state)
{
	pid_t p;

	(void)state;
	engine_close(&H);
	engine_open(&H, &(struct engine_options){ .stale_s = 1 });
	p = engine_proc(&H, NULL);
	/* A fresh one is no one's to take ... */
	assert_int_equal(fake_backend_foreign(H.be, "fresh", real_wall_ms()), 0);
	assert_int_equal(acquire(p, "fresh"), -EEXIST);
	/* ... a stale one is recovered and taken in one request. */
	assert_int_equal(fake_backend_foreign(H.be, "old", real_wall_ms() - 5000), 0);
	assert_int_equal(acquire(p, "old"), 0);
	assert_int_equal(holder_pid("old"), p);
	assert_int_equal(engine_logged(&H, "old", "recovered",
				       (const char *const[]){ "evidence=foreign-stale", NULL }), 1);
	assert_int_equal(engine_logged(&H, "old", "acquired", NULL), 1);
	assert_int_equal(engine_logged(&H, "fresh", "recovered", NULL), 0);
}

static void test_change_reported_by_the_store_grants_a_parked_waiter(void **state)
{
	struct waiter w;

	(void)state;
	answers = 0;
	/* A lock the engine cannot watch: only the store can say it went. */
	assert_int_equal(fake_backend_foreign(H.be, "seed", real_wall_ms()), 0);
	assert_int_equal(fd_lock(&w, engine_proc(&H, NULL), "seed", LOCKFS_EXCLUSIVE, 1),
			 -EINPROGRESS);
	assert_int_equal(fake_backend_remove(H.be, "seed"), 0);
	engine_work(&H);
	assert_false(w.answered); /* not reported yet */

	engine_changed(&H, "seed");
	assert_true(w.answered);
	assert_int_equal(w.result, 0);
	assert_true(held("seed"));
	fd_unlock(&w, "seed");
}

static void test_release_the_store_refuses_keeps_the_lock_held(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "build"), 0);
	fake_backend_fail(H.be, FAKE_OP_RELEASE, EIO, 1);
	assert_int_equal(release(p, "build"), -EIO);
	assert_true(held("build"));
	assert_int_equal(holder_pid("build"), p);
	assert_int_equal(engine_logged(&H, "build", "released", NULL), 0);
	/* Still watched as before: the holder can let go once the store can. */
	assert_int_equal(release(p, "build"), 0);
	assert_false(held("build"));
	assert_int_equal(engine_logged(&H, "build", "released", NULL), 1);
}

static void test_acquisition_the_log_cannot_record_is_not_granted(void **state)
{
	pid_t p = engine_proc(&H, NULL);
	char path[PATH_MAX + 16];
	struct rlimit old, low;
	struct stat sb;
	int rc;

	(void)state;
	snprintf(path, sizeof(path), "%s/lock.log", H.dir);
	assert_int_equal(stat(path, &sb), 0);
	/* The log file may not grow (EFBIG); the store is in memory. */
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	low = old;
	low.rlim_cur = (rlim_t)sb.st_size;
	signal(SIGXFSZ, SIG_IGN);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &low), 0);
	rc = acquire(p, "build");
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, SIG_DFL);

	assert_int_equal(rc, -EFBIG);
	assert_false(held("build"));
	assert_int_equal(H.be->ops->stat(H.be, "build", NULL, false), -ENOENT);
	assert_int_equal(engine_logged(&H, "build", "acquired", NULL), 0);
	/* Nothing left behind: the next try succeeds. */
	assert_int_equal(acquire(p, "build"), 0);
	assert_int_equal(engine_logged(&H, "build", "acquired", NULL), 1);
}

/* ---- the store, through lock/store.h ---- */

/* A fault of store.c's: counts each op; fails FAIL_OP on FAIL_NAME with
 * -EIO while FAIL_NAME is set. */
struct store_watch {
	int calls[LOCKFS_STORE_CHECK + 1];
	enum lockfs_store_op fail_op;
	const char *fail_name;
};

static int watch_store(void *arg, enum lockfs_store_op op, const char *name)
{
	struct store_watch *sw = arg;

	sw->calls[op]++;
	if (sw->fail_name && op == sw->fail_op && name && strcmp(name, sw->fail_name) == 0)
		return -EIO;
	return 0;
}

static void test_every_store_call_of_a_lock_goes_through_store_c(void **state)
{
	struct store_watch sw = { 0 };
	struct lockfs_store_fault f = { watch_store, &sw };
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	lockfs_store_fault_set(&f);
	assert_int_equal(acquire(p, "build"), 0);
	assert_int_equal(release(p, "build"), 0);
	engine_tick(&H);
	lockfs_store_fault_set(NULL);
	assert_int_equal(sw.calls[LOCKFS_STORE_ACQUIRE], 1);
	assert_int_equal(sw.calls[LOCKFS_STORE_RELEASE], 1);
	assert_true(sw.calls[LOCKFS_STORE_STAT] + sw.calls[LOCKFS_STORE_READ] >= 1);
	assert_int_equal(sw.calls[LOCKFS_STORE_CHECK], 1); /* the tick's */
}

static void test_a_fault_injected_in_store_c_is_the_stores_answer(void **state)
{
	struct store_watch sw = { .fail_op = LOCKFS_STORE_ACQUIRE, .fail_name = "build" };
	struct lockfs_store_fault f = { watch_store, &sw };
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	lockfs_store_fault_set(&f);
	assert_int_equal(acquire(p, "build"), -EIO);
	assert_int_equal(acquire(p, "other"), 0); /* only BUILD's acquire fails */
	lockfs_store_fault_set(NULL);
	assert_false(held("build"));
	assert_int_equal(engine_logged(&H, "build", "acquired", NULL), 0);
	assert_int_equal(acquire(p, "build"), 0);
	assert_int_equal(holder_pid("build"), p);
}

static void test_optional_store_ops_left_null_have_defaults(void **state)
{
	struct lockfs_backend_ops ops = *H.be->ops;
	struct lockfs_backend be = *H.be;
	struct lockfs_entry_stat st;

	(void)state;
	ops.check = NULL;         /* etcd's: the session thread watches */
	ops.foreign_stale = NULL; /* etcd's: a foreign holder ends by its lease */
	be.ops = &ops;
	be.stale_s = 60;
	assert_int_equal(lockfs_store_check(&be), 0);
	assert_int_equal(lockfs_store_foreign_stale(&be, "x", &st), 0);
	assert_false(lockfs_store_stales_foreign(&be));
	be.ops = H.be->ops;
	assert_true(lockfs_store_stales_foreign(&be)); /* the fake has a policy */
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_acquire_takes_a_free_name_and_logs_acquired),
		T(test_acquire_of_a_held_name_is_eexist),
		T(test_acquire_logs_the_holder_or_its_slug),
		T(test_acquire_with_a_bad_slug_is_einval_and_logs_the_thread),
		T(test_acquire_over_the_cap_logs_the_holder_to_be),
		T(test_every_store_call_of_a_lock_goes_through_store_c),
		T(test_a_fault_injected_in_store_c_is_the_stores_answer),
		T(test_optional_store_ops_left_null_have_defaults),
		T(test_release_by_another_process_is_eperm),
		T(test_release_of_a_record_rewritten_with_another_token_is_eperm),
		T(test_release_of_another_hosts_lock_is_eperm),
		T(test_fd_waiters_are_granted_in_fifo_order),
		T(test_shared_waiters_at_the_head_are_granted_together),
		T(test_interrupted_waiter_asking_again_keeps_its_place),
		T(test_exited_holder_is_recovered_with_evidence_exited),
		T(test_holder_of_another_boot_of_this_host_is_recovered_boot_changed),
		T(test_holder_on_another_host_is_never_recovered),
		T(test_lease_of_a_live_holder_running_out_is_logged_and_kept),
		T(test_slug_lease_running_out_is_recovered_once_no_process_has_the_slug),
		T(test_stale_foreign_lock_is_taken_by_the_same_acquire),
		T(test_change_reported_by_the_store_grants_a_parked_waiter),
		T(test_release_the_store_refuses_keeps_the_lock_held),
		T(test_acquisition_the_log_cannot_record_is_not_granted),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
