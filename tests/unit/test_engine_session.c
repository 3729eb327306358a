/*
 * The engine (include/lockfs/core.h) on the fake store with sessions, as
 * etcd's (engine_harness.h: fake processes, a fake clock, the liveness
 * thread's steps driven one at a time): a lost session's locks are lost
 * (a `lost` line, a tombstone, ESTALE for the holder, ENOENT or EPERM for
 * others), and so is a lock removed from the store behind a live holder;
 * no grant while the session is uncertain; the unconfirmed and lock-delay
 * views; waiters re-queued in order on a new session; a refused release
 * completed once -- and a dir-like store (no caps) keeps today's answers.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/clock.h"
#include "engine_harness.h"
#include "fake_backend.h"
#include "lock/changes.h"

static struct engine_harness H;

static int setup_sessions(void **state)
{
	(void)state;
	engine_open(&H, &(struct engine_options){
		.caps = LOCKFS_BE_SESSIONS | LOCKFS_BE_RETRY_RELEASES });
	engine_tick(&H); /* the engine's start: it takes in the live session */
	return 0;
}

static int setup_dirlike(void **state)
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

#define acquire(pid, name) engine_acquire(&H, (pid), (name))
#define release(pid, name) engine_release(&H, (pid), (name))
#define owner_of(name) engine_owner(&H, (name))

/* Does NAME's `owner` contain TEXT? */
static bool owner_says(const char *name, const char *text)
{
	char *o = owner_of(name);
	bool yes = o && strstr(o, text);

	free(o);
	return yes;
}

static int logged(const char *name, const char *event, const char *kv1)
{
	const char *kv[] = { kv1, NULL };

	return engine_logged(&H, name, event, kv1 ? kv : NULL);
}

/* ---- lost with the session ---- */

static void test_lost_session_logs_lost_and_only_the_holder_gets_estale(void **state)
{
	pid_t holder = engine_proc(&H, NULL), other = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	fake_backend_session(H.be, LOCKFS_SESSION_LOST);
	/* The release looks at the session first: lost, so the lock is. */
	assert_int_equal(release(other, "x"), -ENOENT);
	assert_true(lockfs_core_lost(H.core, "x"));
	assert_int_equal(lockfs_core_stat(H.core, "x", NULL), -ENOENT);
	assert_null(owner_of("x"));
	assert_int_equal(release(holder, "x"), -ESTALE);
	assert_int_equal(logged("x", "lost", "evidence=session-expired"), 1);
	assert_int_equal(logged("x", "released", NULL), 0);
}

static void test_holder_is_told_once_then_the_name_is_free(void **state)
{
	pid_t holder = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	fake_backend_session(H.be, LOCKFS_SESSION_LOST);
	engine_tick(&H);
	assert_int_equal(logged("x", "lost", NULL), 1);
	/* The lookup and the kernel's immediate retry of it both hear it ... */
	assert_int_equal(release(holder, "x"), -ESTALE);
	assert_int_equal(release(holder, "x"), -ESTALE);
	/* ... and once that is over, the tombstone is gone. */
	engine_advance(&H, 1000);
	assert_int_equal(release(holder, "x"), -ENOENT);
	assert_false(lockfs_core_lost(H.core, "x"));
}

static void test_tombstone_goes_when_its_holder_exits(void **state)
{
	pid_t holder = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	fake_backend_session(H.be, LOCKFS_SESSION_LOST);
	engine_tick(&H);
	assert_true(lockfs_core_lost(H.core, "x"));
	engine_exit(&H, holder);
	engine_tick(&H);
	assert_false(lockfs_core_lost(H.core, "x"));
}

static void test_lost_holders_rmdir_is_estale_while_another_host_holds_the_name(void **state)
{
	pid_t holder = engine_proc(&H, NULL), bystander = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	fake_backend_session(H.be, LOCKFS_SESSION_LOST);
	engine_tick(&H);
	assert_int_equal(logged("x", "lost", NULL), 1);
	fake_backend_new_session(H.be);
	engine_plant(&H, "x", engine_proc(&H, NULL), "h2", NULL);
	engine_changed(&H, "x");
	assert_true(owner_says("x", "\"h2\""));
	/* "Not yours" for anybody else, "yours was lost" for the holder. */
	assert_int_equal(release(bystander, "x"), -EPERM);
	assert_int_equal(release(holder, "x"), -ESTALE);
	assert_true(owner_says("x", "\"h2\"")); /* and h2 keeps it */
}

static void test_tombstone_goes_when_its_holder_takes_the_name_again(void **state)
{
	pid_t holder = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	fake_backend_session(H.be, LOCKFS_SESSION_LOST);
	engine_tick(&H);
	fake_backend_new_session(H.be);
	engine_tick(&H);
	assert_int_equal(acquire(holder, "x"), 0);
	assert_int_equal(release(holder, "x"), 0);
	/* Its rmdir said 0 for its new grant: nothing lost is left to tell. */
	assert_false(lockfs_core_lost(H.core, "x"));
	assert_int_equal(release(holder, "x"), -ENOENT);
}

/* ---- another host's locks, as events ---- */

/* How many events from *CURSOR on are EVENT of NAME by a holder on
 * another host (`"remote":1`); *CURSOR moves past them all. */
static int remote_events(uint64_t *cursor, const char *name, const char *event)
{
	char buf[16384], ev[64], nm[300];
	ssize_t n;
	int count = 0;

	snprintf(ev, sizeof(ev), "\"event\":\"%s\"", event);
	snprintf(nm, sizeof(nm), "\"name\":\"%s\"", name);
	while ((n = lockfs_core_events_take(H.core, cursor, buf, sizeof(buf) - 1, NULL, NULL)) > 0) {
		buf[n] = '\0';
		for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
			if (strstr(line, ev) && strstr(line, nm) && strstr(line, "\"remote\":1"))
				count++;
	}
	assert_true(n == 0);
	return count;
}

/* Another host's acquisition and release are each one event, however this
 * daemon meets them: here a lookup and a mkdir look before the store's
 * report of the change is taken in. */
static void test_another_hosts_lock_is_one_event_each_way_however_it_is_met(void **state)
{
	uint64_t cursor = lockfs_core_events_attach(H.core);
	pid_t here = engine_proc(&H, NULL);

	(void)state;
	engine_plant(&H, "x", engine_proc(&H, NULL), "h2", NULL);
	assert_int_equal(lockfs_core_stat(H.core, "x", NULL), 0); /* met by a lookup */
	engine_changed(&H, "x");
	assert_int_equal(remote_events(&cursor, "x", "acquired"), 1);
	assert_int_equal(fake_backend_remove(H.be, "x"), 0); /* released on h2 */
	assert_int_equal(lockfs_core_stat(H.core, "x", NULL), -ENOENT);
	engine_changed(&H, "x");
	assert_int_equal(remote_events(&cursor, "x", "released"), 1);

	engine_plant(&H, "y", engine_proc(&H, NULL), "h2", NULL);
	engine_changed(&H, "y");
	assert_int_equal(remote_events(&cursor, "y", "acquired"), 1);
	assert_int_equal(fake_backend_remove(H.be, "y"), 0);
	assert_int_equal(acquire(here, "y"), 0); /* a mkdir here meets it first */
	engine_changed(&H, "y");
	assert_int_equal(remote_events(&cursor, "y", "released"), 1);
	assert_int_equal(release(here, "y"), 0);
	assert_int_equal(remote_events(&cursor, "y", "released"), 0); /* here's is not remote */
	lockfs_core_events_detach(H.core);
}

/* ---- removed in the store behind a live holder ---- */

static void test_lock_removed_in_store_is_lost_with_that_evidence(void **state)
{
	pid_t holder = engine_proc(&H, NULL), other = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	assert_int_equal(fake_backend_remove(H.be, "x"), 0); /* `etcdctl del` */
	engine_changed(&H, "x");
	assert_int_equal(logged("x", "lost", "evidence=removed-in-store"), 1);
	assert_int_equal(logged("x", "released", NULL), 0);
	assert_int_equal(release(other, "x"), -ENOENT);
	assert_int_equal(release(holder, "x"), -ESTALE);
	/* The session lives on: the name is free to take. */
	assert_int_equal(acquire(other, "x"), 0);
	assert_int_equal(release(other, "x"), 0);
	assert_int_equal(logged("x", "lost", NULL), 1);
}

static void test_removal_met_by_a_lookup_first_is_lost_all_the_same(void **state)
{
	pid_t holder = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	assert_int_equal(fake_backend_remove(H.be, "x"), 0);
	/* A lookup before the store's report is taken in. */
	assert_int_equal(lockfs_core_stat(H.core, "x", NULL), -ENOENT);
	assert_int_equal(logged("x", "lost", "evidence=removed-in-store"), 1);
	engine_changed(&H, "x");
	assert_int_equal(logged("x", "lost", NULL), 1);
	assert_int_equal(release(holder, "x"), -ESTALE);
}

static void test_removal_during_a_resync_is_lost_at_once(void **state)
{
	pid_t holder = engine_proc(&H, NULL), other = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	assert_int_equal(acquire(other, "y"), 0);
	assert_int_equal(fake_backend_remove(H.be, "x"), 0);
	/* The store lost track (a compacted watch): it says "anything". */
	lockfs_changes_report(H.t, LOCKFS_CHANGE_ALL, NULL);
	engine_work(&H);
	assert_int_equal(logged("x", "lost", "evidence=removed-in-store"), 1);
	assert_int_equal(logged("y", "lost", NULL), 0);
	assert_int_equal(release(holder, "x"), -ESTALE);
	assert_int_equal(release(other, "y"), 0);
}

static void test_lock_replaced_in_store_by_another_host_is_lost(void **state)
{
	pid_t holder = engine_proc(&H, NULL), bystander = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	assert_int_equal(fake_backend_remove(H.be, "x"), 0); /* root's break on h2 */
	engine_plant(&H, "x", engine_proc(&H, NULL), "h2", NULL);
	engine_changed(&H, "x");
	assert_int_equal(logged("x", "lost", "evidence=removed-in-store"), 1);
	assert_true(owner_says("x", "\"h2\""));
	assert_int_equal(release(bystander, "x"), -EPERM);
	assert_int_equal(release(holder, "x"), -ESTALE);
}

static void test_own_release_and_rewrite_are_not_lost(void **state)
{
	pid_t holder = engine_proc(&H, NULL);
	struct lockfs_caller c = engine_caller(holder);

	(void)state;
	assert_int_equal(acquire(holder, "x"), 0);
	assert_int_equal(lockfs_core_set_operation(H.core, "x", &c, "deploy", 6), 0);
	engine_changed(&H, "x");
	assert_int_equal(release(holder, "x"), 0);
	engine_changed(&H, "x");
	assert_int_equal(logged("x", "lost", NULL), 0);
	assert_int_equal(logged("x", "released", NULL), 1);
}

static void test_record_this_daemon_never_granted_is_not_lost_when_it_goes(void **state)
{
	pid_t waiter = engine_proc(&H, NULL);

	(void)state;
	/* What etcd shows of a waiter's place of this host that reached the
	 * head before its claim (or before an older key's event came in):
	 * this host's record, never granted by this daemon. */
	engine_plant(&H, "x", waiter, NULL, NULL);
	engine_changed(&H, "x");
	assert_int_equal(lockfs_core_stat(H.core, "x", NULL), 0);
	assert_int_equal(fake_backend_remove(H.be, "x"), 0);
	engine_changed(&H, "x");
	assert_int_equal(logged("x", "lost", NULL), 0);
	assert_int_equal(release(waiter, "x"), -ENOENT);
}

/* ---- uncertain, unconfirmed, lock-delay ---- */

static void test_uncertain_session_refuses_grants_and_owner_says_so(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "y"), 0);
	assert_true(owner_says("y", "\"session\": \"live\""));
	fake_backend_session(H.be, LOCKFS_SESSION_UNCERTAIN);
	assert_int_equal(acquire(p, "z"), -EIO);
	assert_int_equal(lockfs_core_stat(H.core, "z", NULL), -ENOENT);
	assert_true(owner_says("y", "\"session\": \"uncertain\""));
	/* Not lost: it is still the holder's. */
	assert_int_equal(logged("y", "lost", NULL), 0);
	fake_backend_session(H.be, LOCKFS_SESSION_LIVE);
	assert_true(owner_says("y", "\"session\": \"live\""));
	assert_int_equal(release(p, "y"), 0);
}

static void test_unconfirmed_view_when_the_store_cannot_be_reached(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "u"), 0);
	assert_false(owner_says("u", "\"state\""));
	fake_backend_unconfirmed(H.be, true);
	assert_true(owner_says("u", "\"state\": \"unconfirmed\""));
	assert_int_equal(lockfs_core_stat(H.core, "u", NULL), 0); /* still answers */
	fake_backend_unconfirmed(H.be, false);
	assert_false(owner_says("u", "\"state\""));
	assert_int_equal(release(p, "u"), 0);
}

/* A store's own fields reach `owner` in its order, under its names, which
 * the engine does not know: the seam carries them, not etcd's. */
static void test_owner_shows_the_fields_the_store_names(void **state)
{
	pid_t p = engine_proc(&H, NULL);
	char *o;

	(void)state;
	assert_int_equal(acquire(p, "f"), 0);
	assert_false(owner_says("f", "\"spot\""));
	fake_backend_fields(H.be, true);
	o = owner_of("f");
	assert_non_null(o);
	assert_non_null(strstr(o, "\"shelf\": \"fake/"));
	/* The record's "lease" is null (no lease of its own): the store's
	 * takes its place. */
	assert_non_null(strstr(o, "\"lease\": \"000000000000002a\""));
	assert_null(strstr(o, "fake_lease"));
	assert_non_null(strstr(o, "\"spot\": 7\n"));
	assert_true(strstr(o, "\"shelf\"") < strstr(o, "\"spot\""));
	free(o);
	fake_backend_fields(H.be, false);
	assert_int_equal(release(p, "f"), 0);
}

static void test_lock_delay_view_holds_the_name_for_nobody(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(fake_backend_delay(H.be, "d", lockfs_wall_ms() + 5000), 0);
	engine_changed(&H, "d");
	assert_true(owner_says("d", "\"holder\": null"));
	assert_true(owner_says("d", "\"lock_delay_until\""));
	assert_int_equal(lockfs_core_stat(H.core, "d", NULL), 0);
	assert_int_equal(acquire(p, "d"), -EEXIST);
	assert_int_equal(release(p, "d"), -EPERM);
}

/* ---- waiters across a new session ---- */

struct waiter {
	struct lockfs_wait w;    /* first: done() gets it */
	char owner[24];
	bool answered;
	int result;
	int order;
};

static int answers;

static void waiter_done(struct lockfs_wait *w, int result)
{
	struct waiter *x = (struct waiter *)w;

	x->answered = true;
	x->result = result;
	x->order = ++answers;
}

static int fd_lock(struct waiter *x, pid_t pid, const char *name, int n)
{
	struct lockfs_caller c = engine_caller(pid);

	memset(x, 0, sizeof(*x));
	x->w.done = waiter_done;
	snprintf(x->owner, sizeof(x->owner), "flock:%x", n);
	return lockfs_core_fd_lock(H.core, &c, &(struct lockfs_fd_request){
		.name = name, .owner = x->owner, .mode = LOCKFS_EXCLUSIVE, .wait = true }, &x->w);
}

/* The pids of NAME's `requeued` lines, in log order, into PIDS (up to N). */
static int requeued_pids(const char *name, pid_t *pids, int n)
{
	char *log = engine_log(&H), *save = NULL, want[64];
	int k = 0;

	snprintf(want, sizeof(want), " %s ", name);
	for (char *l = strtok_r(log, "\n", &save); l && k < n; l = strtok_r(NULL, "\n", &save)) {
		const char *p = strstr(l, " pid=");

		if (strstr(l, want) && strstr(l, " requeued") && p)
			pids[k++] = (pid_t)atol(p + 5);
	}
	free(log);
	return k;
}

static void test_waiters_requeue_in_queue_order_on_a_new_session(void **state)
{
	struct waiter a, w[3];
	pid_t pw[3], got[4];

	(void)state;
	answers = 0;
	assert_int_equal(fd_lock(&a, engine_proc(&H, NULL), "q", 1), 0);
	for (int i = 0; i < 3; i++) {
		pw[i] = engine_proc(&H, NULL);
		assert_int_equal(fd_lock(&w[i], pw[i], "q", 10 + i), -EINPROGRESS);
	}
	fake_backend_session(H.be, LOCKFS_SESSION_LOST);
	engine_tick(&H);
	assert_int_equal(logged("q", "lost", NULL), 1);
	for (int i = 0; i < 3; i++)
		assert_false(w[i].answered); /* parked through it */
	fake_backend_new_session(H.be);
	engine_tick(&H);
	/* New places in the old order: each logged once, the head granted. */
	assert_int_equal(requeued_pids("q", got, 4), 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(got[i], pw[i]);
	for (int i = 0; i < 3; i++) {
		assert_true(w[i].answered);
		assert_int_equal(w[i].result, 0);
		assert_int_equal(w[i].order, i + 1);
		for (int j = i + 1; j < 3; j++)
			assert_false(w[j].answered);
		assert_int_equal(lockfs_core_fd_unlock(H.core, "q", w[i].owner), 0);
	}
	assert_int_equal(lockfs_core_stat(H.core, "q", NULL), -ENOENT);
}

/* ---- refused releases ---- */

static void test_refused_release_is_eio_then_completed_once(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "r"), 0);
	fake_backend_fail(H.be, FAKE_OP_RELEASE, EIO, 1);
	assert_int_equal(release(p, "r"), -EIO);
	assert_int_equal(logged("r", "released", NULL), 0);
	for (int i = 0; i < 5; i++) {
		engine_advance(&H, 1000);
		engine_tick(&H);
	}
	assert_int_equal(lockfs_core_stat(H.core, "r", NULL), -ENOENT);
	assert_int_equal(logged("r", "released", "retried=1"), 1);
	assert_int_equal(logged("r", "released", NULL), 1);
	assert_int_equal(release(p, "r"), -ENOENT);
}

static void test_refused_release_of_a_holder_that_died_is_completed_once(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "r"), 0);
	fake_backend_fail(H.be, FAKE_OP_RELEASE, EIO, 1);
	assert_int_equal(release(p, "r"), -EIO);
	engine_exit(&H, p);
	for (int i = 0; i < 5; i++) {
		engine_advance(&H, 1000);
		engine_tick(&H);
	}
	assert_int_equal(lockfs_core_stat(H.core, "r", NULL), -ENOENT);
	assert_int_equal(logged("r", "released", "retried=1"), 1);
	assert_int_equal(logged("r", "recovered", NULL), 0);
}

static void test_refused_release_applied_late_is_released_not_lost(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "r"), 0);
	fake_backend_fail(H.be, FAKE_OP_RELEASE, EIO, 1);
	assert_int_equal(release(p, "r"), -EIO);
	/* The store applied the refused write after all (etcd: a txn whose
	 * answer was lost): the key goes, by this daemon's own write. */
	assert_int_equal(fake_backend_remove(H.be, "r"), 0);
	engine_changed(&H, "r");
	engine_tick(&H);
	assert_int_equal(logged("r", "lost", NULL), 0);
	assert_int_equal(logged("r", "released", "retried=1"), 1);
	assert_int_equal(release(p, "r"), -ENOENT);
}

static void test_close_after_a_retried_unlock_ended_the_grant_ends_nothing_more(void **state)
{
	struct waiter a;

	(void)state;
	assert_int_equal(fd_lock(&a, engine_proc(&H, NULL), "q", 1), 0);
	/* LOCK_UN refused (etcd unreachable): kept, completed by the tick ... */
	fake_backend_fail(H.be, FAKE_OP_RELEASE, EIO, 1);
	assert_int_equal(lockfs_core_fd_unlock(H.core, "q", a.owner), -EIO);
	fake_backend_lag(H.be, true);
	engine_advance(&H, 1000);
	engine_tick(&H);
	assert_int_equal(logged("q", "released", "retried=1"), 1);
	/* ... while the store's view still shows the grant, its descriptor is
	 * closed, and that release is refused too: it is no second end. */
	fake_backend_fail(H.be, FAKE_OP_RELEASE, EIO, 1);
	assert_int_equal(lockfs_core_fd_unlock(H.core, "q", a.owner), 0);
	for (int i = 0; i < 3; i++) {
		engine_advance(&H, 1000);
		engine_tick(&H);
	}
	fake_backend_lag(H.be, false);
	engine_tick(&H);
	assert_int_equal(logged("q", "released", NULL), 1);
	assert_int_equal(lockfs_core_stat(H.core, "q", NULL), -ENOENT);
}

/* ---- a store without sessions (dir) ---- */

static void test_dirlike_store_keeps_todays_answers(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "d"), 0);
	assert_false(owner_says("d", "\"session\""));
	assert_false(owner_says("d", "\"key\""));
	assert_false(lockfs_core_lost(H.core, "d"));
	fake_backend_fail(H.be, FAKE_OP_RELEASE, EIO, 1);
	assert_int_equal(release(p, "d"), -EIO);
	engine_advance(&H, 1000);
	engine_tick(&H);
	/* No RETRY_RELEASES: the lock stays held; its holder must rmdir again. */
	assert_int_equal(lockfs_core_stat(H.core, "d", NULL), 0);
	assert_int_equal(release(p, "d"), 0);
	assert_int_equal(release(p, "d"), -ENOENT);
}

static void test_dirlike_store_lock_removed_behind_its_holder_is_enoent(void **state)
{
	pid_t p = engine_proc(&H, NULL);

	(void)state;
	assert_int_equal(acquire(p, "d"), 0);
	assert_int_equal(fake_backend_remove(H.be, "d"), 0); /* `rmdir DIR/d.lock` */
	engine_changed(&H, "d");
	assert_int_equal(logged("d", "lost", NULL), 0);
	assert_int_equal(release(p, "d"), -ENOENT);
}

#define SESSION_TEST(f) cmocka_unit_test_setup_teardown(f, setup_sessions, teardown)
#define DIRLIKE_TEST(f) cmocka_unit_test_setup_teardown(f, setup_dirlike, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		SESSION_TEST(test_lost_session_logs_lost_and_only_the_holder_gets_estale),
		SESSION_TEST(test_holder_is_told_once_then_the_name_is_free),
		SESSION_TEST(test_tombstone_goes_when_its_holder_exits),
		SESSION_TEST(test_lost_holders_rmdir_is_estale_while_another_host_holds_the_name),
		SESSION_TEST(test_tombstone_goes_when_its_holder_takes_the_name_again),
		SESSION_TEST(test_another_hosts_lock_is_one_event_each_way_however_it_is_met),
		SESSION_TEST(test_lock_removed_in_store_is_lost_with_that_evidence),
		SESSION_TEST(test_removal_met_by_a_lookup_first_is_lost_all_the_same),
		SESSION_TEST(test_removal_during_a_resync_is_lost_at_once),
		SESSION_TEST(test_lock_replaced_in_store_by_another_host_is_lost),
		SESSION_TEST(test_own_release_and_rewrite_are_not_lost),
		SESSION_TEST(test_record_this_daemon_never_granted_is_not_lost_when_it_goes),
		SESSION_TEST(test_uncertain_session_refuses_grants_and_owner_says_so),
		SESSION_TEST(test_unconfirmed_view_when_the_store_cannot_be_reached),
		SESSION_TEST(test_owner_shows_the_fields_the_store_names),
		SESSION_TEST(test_lock_delay_view_holds_the_name_for_nobody),
		SESSION_TEST(test_waiters_requeue_in_queue_order_on_a_new_session),
		SESSION_TEST(test_refused_release_is_eio_then_completed_once),
		SESSION_TEST(test_refused_release_of_a_holder_that_died_is_completed_once),
		SESSION_TEST(test_refused_release_applied_late_is_released_not_lost),
		SESSION_TEST(test_close_after_a_retried_unlock_ended_the_grant_ends_nothing_more),
		DIRLIKE_TEST(test_dirlike_store_keeps_todays_answers),
		DIRLIKE_TEST(test_dirlike_store_lock_removed_behind_its_holder_is_enoent),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
