/*
 * Unit tests for core/proc/descendants.c: the tracking of a holder's
 * descendants on a fake process table fed with fake events, and the
 * kernel's connector (core/proc/procevents.c) on real processes.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../core/base/clock.h"
#include "lockfs/descendants.h"
#include "lockfs/procevents.h"
#include "../../core/proc/requesters.h"
#include "lockfs/holder.h"

/* ---- a fake process table ---------------------------------------------- */

#define MAXP 64
static struct lockfs_desc_proc table[MAXP];
static size_t ntable;
static int stat_calls;

static struct lockfs_desc_proc *find(pid_t pid)
{
	for (size_t i = 0; i < ntable; i++)
		if (table[i].pid == pid)
			return &table[i];
	return NULL;
}

/* Process PID, child of PPID, in session SID, started at START. */
static void spawn(pid_t pid, pid_t ppid, pid_t sid, unsigned long long start)
{
	struct lockfs_desc_proc *p = &table[ntable++];

	memset(p, 0, sizeof(*p));
	p->pid = pid;
	p->ppid = ppid;
	p->sid = sid;
	p->start = start;
	p->threads = 1;
	snprintf(p->comm, sizeof(p->comm), "p%d", (int)pid);
}

/* PID is reaped; its children go to init, as the kernel does. */
static void reap(pid_t pid)
{
	for (size_t i = 0; i < ntable; i++) {
		if (table[i].ppid == pid)
			table[i].ppid = 1;
		if (table[i].pid == pid) {
			table[i] = table[--ntable];
			i--;
		}
	}
}

static int fake_stat(void *ctx, pid_t pid, struct lockfs_desc_proc *out)
{
	struct lockfs_desc_proc *p = find(pid);

	(void)ctx;
	stat_calls++;
	if (!p)
		return -ENOENT;
	*out = *p;
	return 0;
}

static bool each_fails;

static int fake_each(void *ctx, int (*fn)(void *, const struct lockfs_desc_proc *), void *arg)
{
	(void)ctx;
	if (each_fails)
		return -EACCES;
	for (size_t i = 0; i < ntable; i++)
		if (fn(arg, &table[i]))
			break;
	return 0;
}

static const struct lockfs_desc_procs fake_procs = { fake_stat, fake_each, NULL };

/* ---- a fake event stream ------------------------------------------------ */

static struct lockfs_proc_event queue[256];
static size_t qhead, qtail;
static bool lose_next; /* the next read reports lost events */

static int fake_read(void *ctx, struct lockfs_proc_event *evs, int max)
{
	int n = 0;

	(void)ctx;
	if (lose_next) {
		lose_next = false;
		return -ENOBUFS;
	}
	while (n < max && qhead < qtail)
		evs[n++] = queue[qhead++];
	return n;
}

static const struct lockfs_event_source fake_events = { fake_read, NULL };

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* PARENT forks CHILD (a process) now: the table and the stream. */
static void ev_fork(pid_t parent, pid_t child, pid_t sid, unsigned long long start)
{
	spawn(child, parent, sid, start);
	queue[qtail++] = (struct lockfs_proc_event){ LOCKFS_PROC_FORK, child, child, parent,
						     now_ns() };
}

/* PID starts a session of its own (setsid). */
static void ev_sid(pid_t pid)
{
	find(pid)->sid = pid;
	queue[qtail++] = (struct lockfs_proc_event){ LOCKFS_PROC_SID, pid, pid, 0, now_ns() };
}

/* PID exits (and is reaped at once). */
static void ev_exit(pid_t pid)
{
	queue[qtail++] = (struct lockfs_proc_event){ LOCKFS_PROC_EXIT, pid, pid, 0, now_ns() };
	reap(pid);
}

static struct lockfs_descendants *d;

static int setup(void **state)
{
	ntable = qhead = qtail = 0;
	lose_next = each_fails = false;
	stat_calls = 0;
	spawn(1, 0, 1, 1);
	spawn(100, 1, 100, 1000); /* the holder, leading its session */
	return lockfs_descendants_new(&d, &fake_events, &fake_procs);
}

static int setup_scan_only(void **state)
{
	int rc = setup(state);

	lockfs_descendants_free(d);
	return rc ? rc : lockfs_descendants_new(&d, NULL, &fake_procs);
}

static int teardown(void **state)
{
	lockfs_descendants_free(d);
	d = NULL;
	return 0;
}

static int exited(pid_t pid, unsigned long long start)
{
	reap(pid);
	return lockfs_descendants_holder_exited(d, &(struct lockfs_exited_holder){
			.pid = pid, .start = start, .sid = 0,
			.known = NULL, .nknown = 0, .scan = false, .take_ref = true });
}

/* ---- tracking through events --------------------------------------------- */

static void test_child_forked_while_held_keeps_count_until_it_exits(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	assert_int_equal(exited(100, 1000), 1);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 1);
	ev_exit(101);
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 0);
	lockfs_descendants_unwatch(d, 100, 1000); /* the lock's watch */
	lockfs_descendants_unwatch(d, 100, 1000); /* the one holder_exited took */
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), -ENOENT);
}

static void test_holder_without_children_has_none(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	assert_int_equal(exited(100, 1000), 0);
	lockfs_descendants_unwatch(d, 100, 1000);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), -ENOENT);
}

static void test_fork_before_the_watch_does_not_count(void **state)
{
	spawn(101, 100, 100, 900);
	queue[qtail++] = (struct lockfs_proc_event){ LOCKFS_PROC_FORK, 101, 101, 100, now_ns() };
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	/* The event is read after the watch began; it happened before. */
	assert_int_equal(exited(100, 1000), 0);
}

static void test_grandchild_counts_after_its_parent_exits(void **state)
{
	struct lockfs_descendant *v;
	size_t n;

	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	ev_fork(101, 102, 100, 1200);
	ev_exit(101); /* 102 goes to init */
	assert_int_equal(exited(100, 1000), 1);
	assert_int_equal(lockfs_descendants_list(d, 100, 1000, &v, &n, NULL), 0);
	assert_int_equal(n, 1);
	assert_int_equal(v[0].pid, 102);
	assert_int_equal(v[0].start_time, 1200);
	assert_string_equal(v[0].comm, "p102");
	free(v);
	/* It forks on: its children count too, then all leave. */
	ev_fork(102, 103, 100, 1300);
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 2);
	ev_exit(102);
	ev_exit(103);
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 0);
}

static void test_a_descendant_that_starts_its_own_session_leaves_the_set(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	ev_fork(101, 102, 100, 1150); /* before the setsid: stays in the session */
	ev_sid(101);
	ev_fork(101, 103, 101, 1200); /* after it: not the holder's any more */
	assert_int_equal(exited(100, 1000), 1);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 1);
	ev_exit(102);
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 0);
}

static void test_a_setsid_after_the_holder_exited_lets_go(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	assert_int_equal(exited(100, 1000), 1);
	ev_sid(101);
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 0);
}

static void test_a_lost_setsid_is_found_by_the_check(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	assert_int_equal(exited(100, 1000), 1);
	find(101)->sid = 101; /* no event: the once-a-second check sees it */
	lose_next = true;
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 0);
}

static void test_threads_are_not_descendants(void **state)
{
	uint64_t t = now_ns();

	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	/* A thread of the holder, and a thread of a child. */
	queue[qtail++] = (struct lockfs_proc_event){ LOCKFS_PROC_FORK, 150, 100, 100, t };
	ev_fork(100, 101, 100, 1100);
	queue[qtail++] = (struct lockfs_proc_event){ LOCKFS_PROC_FORK, 151, 101, 101, t };
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 1);
	/* The child's thread exits: the child is still there. */
	queue[qtail++] = (struct lockfs_proc_event){ LOCKFS_PROC_EXIT, 151, 101, 0, now_ns() };
	assert_int_equal(exited(100, 1000), 1);
}

static void test_leader_exit_with_threads_left_is_not_the_end(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	/* 101's main thread exits while another thread runs on. */
	find(101)->threads = 2;
	queue[qtail++] = (struct lockfs_proc_event){ LOCKFS_PROC_EXIT, 101, 101, 0, now_ns() };
	find(101)->zombie = true;
	assert_int_equal(exited(100, 1000), 1);
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 1);
	/* The last thread goes. */
	find(101)->threads = 1;
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 0);
}

static void test_holder_that_let_go_stops_counting(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	lockfs_descendants_tick(d);
	lockfs_descendants_unwatch(d, 100, 1000); /* rmdir while alive */
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), -ENOENT);
	/* A new lock of the same process: what it started before does not
	 * count for it. */
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(101, 102, 100, 1200);
	assert_int_equal(exited(100, 1000), 0);
}

static void test_nested_holders_each_count_their_own(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	lockfs_descendants_tick(d);
	/* 101 takes a lock of its own, then starts 102. */
	assert_int_equal(lockfs_descendants_watch(d, 101, 1100, 100, false), 0);
	ev_fork(101, 102, 100, 1200);
	assert_int_equal(exited(100, 1000), 2);  /* 101 and 102 */
	assert_int_equal(exited(101, 1100), 1);  /* 102 */
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 1);
}

static void test_acts_for(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	spawn(200, 1, 200, 1150); /* a stranger */
	assert_int_equal(exited(100, 1000), 1);
	assert_true(lockfs_descendants_acts_for(d, 100, 1000, 101, 1100));
	/* A child whose fork was told (drained on the way)... */
	ev_fork(101, 102, 100, 1200);
	assert_true(lockfs_descendants_acts_for(d, 100, 1000, 102, 1200));
	/* ... and one no event told of: its parent vouches. */
	spawn(103, 101, 100, 1300);
	assert_true(lockfs_descendants_acts_for(d, 100, 1000, 103, 1300));
	assert_false(lockfs_descendants_acts_for(d, 100, 1000, 200, 1150));
	assert_false(lockfs_descendants_acts_for(d, 100, 1000, 101, 9999)); /* not that 101 */
	assert_false(lockfs_descendants_acts_for(d, 100, 999, 101, 1100));  /* another holder */
}

/* ---- when events are missing ---------------------------------------------- */

static void test_lost_events_are_made_up_by_a_scan(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	ev_fork(100, 101, 100, 1100);
	lockfs_descendants_tick(d);
	/* Lost: 101 exits, 100 forks 102 which forks 103, 104 is started
	 * in the session by someone else later. */
	qtail = qhead;
	reap(101);
	spawn(102, 100, 100, 1200);
	spawn(103, 102, 100, 1300);
	spawn(104, 1, 100, 1400);
	spawn(105, 1, 105, 1500); /* unrelated */
	lose_next = true;
	lockfs_descendants_tick(d); /* learns of the loss, and scans */
	assert_int_equal(exited(100, 1000), 3); /* 102 103 104; 101 forgotten */
	assert_false(lockfs_descendants_acts_for(d, 100, 1000, 105, 1500));
	/* Seen below the holder: proven.  Only seen in its session: kept
	 * for, but no proof of descent. */
	assert_true(lockfs_descendants_acts_for(d, 100, 1000, 103, 1300));
	assert_false(lockfs_descendants_acts_for(d, 100, 1000, 104, 1400));
}

static void test_session_mates_started_by_older_ones_are_not_counted(void **state)
{
	struct lockfs_descendant *v;
	size_t n;

	spawn(50, 1, 100, 500);     /* the login shell, older than the holder */
	spawn(101, 50, 100, 1100);  /* what it ran later: not the holder's */
	spawn(102, 1, 100, 1200);   /* adopted by init: may be the holder's */
	spawn(103, 60, 100, 1300);  /* adopted by a reaper of another session */
	spawn(60, 1, 60, 10);
	reap(100);
	assert_int_equal(lockfs_descendants_holder_exited(d, &(struct lockfs_exited_holder){
			.pid = 100, .start = 1000, .sid = 100,
			.known = NULL, .nknown = 0, .scan = true, .take_ref = true }), 2);
	assert_int_equal(lockfs_descendants_list(d, 100, 1000, &v, &n, NULL), 0);
	assert_int_equal(n, 2);
	assert_int_equal(v[0].pid, 102);
	assert_true(v[0].candidate);
	assert_int_equal(v[1].pid, 103);
	assert_true(v[1].candidate);
	free(v);
}

static void test_no_event_source_scans_the_session(void **state)
{
	spawn(101, 100, 100, 1100);   /* a child in the session */
	spawn(102, 101, 102, 1200);   /* its child, in a session of its own: not counted */
	spawn(103, 1, 100, 900);      /* in the session, but older than the holder */
	spawn(104, 1, 104, 1300);     /* unrelated */
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	assert_string_equal(lockfs_descendants_mechanism(d), "scan");
	assert_int_equal(exited(100, 1000), 1);
	/* Nothing tells of new ones: the tick looks again (once a second). */
	reap(101);
	reap(102);
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 0);
}

static int64_t fake_boot; /* ms */

static int64_t fake_boot_ms(void *arg)
{
	(void)arg;
	return fake_boot;
}

static int64_t real_wall_ms(void *arg)
{
	(void)arg;
	return (int64_t)time(NULL) * 1000;
}

/* The check of an exited holder's descendants (once a second) follows the
 * engine's clock (core/base/clock.c), which a test can move. */
static void test_the_check_of_dead_holders_follows_the_engine_clock(void **state)
{
	static const struct lockfs_clock clock = { real_wall_ms, fake_boot_ms, NULL };
	(void)state;

	fake_boot = 5000000;
	lockfs_clock_override(&clock);
	spawn(101, 100, 100, 1100);   /* a child in the session */
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	assert_int_equal(exited(100, 1000), 1);
	lockfs_descendants_tick(d);   /* the first check: 101 lives */
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 1);
	reap(101);
	fake_boot += 999;             /* not a second yet: no check */
	lockfs_descendants_tick(d);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 1);
	fake_boot += 1;               /* a second: the check finds 101 gone */
	lockfs_descendants_tick(d);
	lockfs_clock_override(NULL);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 0);
}

static void test_restart_counts_the_records_list_and_the_session(void **state)
{
	struct lockfs_descendant known[2] = { { .pid = 101, .start_time = 1100 },
					      { .pid = 102, .start_time = 1111 } };

	reap(100);
	spawn(101, 1, 101, 1100);   /* listed, but left the session since: does not */
	spawn(102, 1, 102, 1200);   /* listed, but pid reused: does not */
	spawn(103, 1, 100, 1300);   /* not listed, in the session */
	assert_int_equal(lockfs_descendants_holder_exited(d, &(struct lockfs_exited_holder){
			.pid = 100, .start = 1000, .sid = 100,
			.known = known, .nknown = 2, .scan = true, .take_ref = true }), 1);
}

static void test_scan_that_cannot_look_proves_nothing(void **state)
{
	each_fails = true;
	reap(100);
	/* Never watched: a look is needed and fails.  Unknown, not 0. */
	assert_true(lockfs_descendants_holder_exited(d, &(struct lockfs_exited_holder){
			.pid = 100, .start = 1000, .sid = 100,
			.known = NULL, .nknown = 0, .scan = false, .take_ref = true }) < 0);
}

static void test_unwatched_holder_is_looked_for(void **state)
{
	spawn(101, 1, 100, 1100);
	reap(100);
	assert_int_equal(lockfs_descendants_holder_exited(d, &(struct lockfs_exited_holder){
			.pid = 100, .start = 1000, .sid = 100,
			.known = NULL, .nknown = 0, .scan = false, .take_ref = true }), 1);
}

static void test_untracked_processes_cost_no_proc_read(void **state)
{
	assert_int_equal(lockfs_descendants_watch(d, 100, 1000, 100, false), 0);
	for (pid_t p = 300; p < 340; p++) {
		ev_fork(1, p, 1, 2000);
		ev_exit(p);
	}
	stat_calls = 0;
	lockfs_descendants_tick(d);
	assert_int_equal(stat_calls, 0);
	assert_int_equal(lockfs_descendants_count(d, 100, 1000, NULL), 0);
}

/* ---- repeat requesters (requesters.c), fed through the tracker ------------ */

static struct lockfs_requester facts_of(const char *exe, const char *slug, char **argv)
{
	struct lockfs_requester f;

	memset(&f, 0, sizeof(f));
	snprintf(f.exe, sizeof(f.exe), "%s", exe);
	snprintf(f.slug, sizeof(f.slug), "%s", slug);
	f.cmdline = argv;
	return f;
}

/* An event for process PID, taken in as a request would (a sync). */
static void feed(enum lockfs_proc_event_kind kind, pid_t pid, pid_t tgid)
{
	queue[qtail++] = (struct lockfs_proc_event){ kind, pid, tgid, 0, now_ns() };
	assert_true(lockfs_descendants_sync(d));
}

/* A cache fed by the tracker D (made by setup). */
static struct lockfs_requesters *observed(void)
{
	struct lockfs_requesters *r;

	assert_int_equal(lockfs_requesters_new(&r), 0);
	lockfs_descendants_observe(d, lockfs_requesters_event, r);
	return r;
}

static void test_requesters_keep_a_process_until_it_execs(void **state)
{
	struct lockfs_requesters *r = observed();
	char a0[] = "agent", a1[] = "--task", *argv[] = { a0, a1, NULL };
	struct lockfs_requester f = facts_of("python3", "s1", argv), got;

	(void)state;
	assert_true(lockfs_requesters_put(r, 100, lockfs_requesters_claim(r, 100, 5), &f));
	assert_int_equal(lockfs_requesters_get(r, 100, 5, &got), 0);
	assert_string_equal(got.exe, "python3");
	assert_string_equal(got.slug, "s1");
	assert_string_equal(got.cmdline[1], "--task");
	assert_null(got.cmdline[2]);
	lockfs_argv_free(got.cmdline);
	/* Another start time is another process on the same pid. */
	assert_int_equal(lockfs_requesters_get(r, 100, 6, &got), -ENOENT);
	/* Someone else's exec or fork changes nothing. */
	feed(LOCKFS_PROC_EXEC, 356, 356);
	feed(LOCKFS_PROC_FORK, 101, 100);
	assert_int_equal(lockfs_requesters_get(r, 100, 5, &got), 0);
	lockfs_argv_free(got.cmdline);
	feed(LOCKFS_PROC_EXEC, 100, 100);
	assert_int_equal(lockfs_requesters_get(r, 100, 5, &got), -ENOENT);
	lockfs_descendants_observe(d, NULL, NULL);
	lockfs_requesters_free(r);
}

static void test_requesters_forget_an_exited_process_and_all_after_a_loss(void **state)
{
	struct lockfs_requesters *r = observed();
	char a0[] = "x", *argv[] = { a0, NULL };
	struct lockfs_requester f = facts_of("x", "", argv), got;

	(void)state;
	assert_true(lockfs_requesters_put(r, 100, lockfs_requesters_claim(r, 100, 5), &f));
	assert_true(lockfs_requesters_put(r, 200, lockfs_requesters_claim(r, 200, 7), &f));
	/* A thread's exit is not its process's. */
	feed(LOCKFS_PROC_EXIT, 101, 100);
	assert_int_equal(lockfs_requesters_get(r, 100, 5, &got), 0);
	lockfs_argv_free(got.cmdline);
	feed(LOCKFS_PROC_EXIT, 100, 100);
	assert_int_equal(lockfs_requesters_get(r, 100, 5, &got), -ENOENT);
	assert_int_equal(lockfs_requesters_get(r, 200, 7, &got), 0);
	lockfs_argv_free(got.cmdline);
	lose_next = true; /* the socket overflowed */
	assert_true(lockfs_descendants_sync(d));
	assert_int_equal(lockfs_requesters_get(r, 200, 7, &got), -ENOENT);
	lockfs_descendants_observe(d, NULL, NULL);
	lockfs_requesters_free(r);
}

/* An exec between the claim (before the /proc reads) and the put (after
 * them) voids the claim: the reads may have seen the old program. */
static void test_requesters_exec_during_the_reads_voids_the_claim(void **state)
{
	struct lockfs_requesters *r = observed();
	char a0[] = "old", *argv[] = { a0, NULL };
	struct lockfs_requester f = facts_of("old", "", argv), got;
	uint64_t ticket = lockfs_requesters_claim(r, 100, 5), later;

	(void)state;
	feed(LOCKFS_PROC_EXEC, 100, 100);
	assert_false(lockfs_requesters_put(r, 100, ticket, &f));
	assert_int_equal(lockfs_requesters_get(r, 100, 5, &got), -ENOENT);
	/* A newer claim of the slot wins over an older one. */
	ticket = lockfs_requesters_claim(r, 100, 5);
	later = lockfs_requesters_claim(r, 100, 5);
	assert_false(lockfs_requesters_put(r, 100, ticket, &f));
	assert_true(lockfs_requesters_put(r, 100, later, &f));
	lockfs_descendants_observe(d, NULL, NULL);
	lockfs_requesters_free(r);
}

/* A process known with its identity: asked by its id alone, it answers
 * for a request that reads nothing of /proc (lockfs_requesters_current). */
static struct lockfs_requester identified(char **argv, unsigned long long start, pid_t ppid,
					  pid_t sid, const char *comm)
{
	struct lockfs_requester f = facts_of("agent", "", argv);

	f.start = start;
	f.ppid = ppid;
	f.sid = sid;
	snprintf(f.comm, sizeof(f.comm), "%s", comm);
	return f;
}

static void test_requesters_answer_a_known_leader_with_its_identity(void **state)
{
	struct lockfs_requesters *r = observed();
	char a0[] = "agent", *argv[] = { a0, NULL };
	struct lockfs_requester f = identified(argv, 5, 50, 60, "agent"), got;
	struct lockfs_requester bare = facts_of("x", "", argv);

	(void)state;
	assert_true(lockfs_requesters_put(r, 100, lockfs_requesters_claim(r, 100, 5), &f));
	assert_true(lockfs_requesters_known(r, 100));
	assert_int_equal(lockfs_requesters_current(r, 100, &got), 0);
	assert_int_equal(got.start, 5);
	assert_int_equal(got.ppid, 50);
	assert_int_equal(got.sid, 60);
	assert_string_equal(got.comm, "agent");
	lockfs_argv_free(got.cmdline);
	assert_int_equal(lockfs_requesters_current(r, 101, &got), -ENOENT);
	/* Facts kept without the identity never answer by id alone. */
	assert_true(lockfs_requesters_put(r, 200, lockfs_requesters_claim(r, 200, 7), &bare));
	assert_int_equal(lockfs_requesters_current(r, 200, &got), -ENOENT);
	/* Nor facts read of another start than the claim's (a pid that
	 * changed hands between the reads). */
	f.start = 6;
	assert_false(lockfs_requesters_put(r, 300, lockfs_requesters_claim(r, 300, 5), &f));
	lockfs_descendants_observe(d, NULL, NULL);
	lockfs_requesters_free(r);
}

/* What /proc/PID/stat would show differently without an exec: its name
 * (COMM, also from one of its threads), its session (SID), its parent
 * (re-parented when that exits, from whichever of its tasks). */
static void test_requesters_forget_a_rename_a_new_session_and_a_lost_parent(void **state)
{
	struct lockfs_requesters *r = observed();
	char a0[] = "agent", *argv[] = { a0, NULL };
	struct lockfs_requester f = identified(argv, 5, 50, 60, "agent"), got;

	(void)state;
	assert_true(lockfs_requesters_put(r, 100, lockfs_requesters_claim(r, 100, 5), &f));
	feed(LOCKFS_PROC_COMM, 102, 100);
	assert_int_equal(lockfs_requesters_current(r, 100, &got), -ENOENT);
	assert_true(lockfs_requesters_put(r, 100, lockfs_requesters_claim(r, 100, 5), &f));
	feed(LOCKFS_PROC_SID, 100, 100);
	assert_int_equal(lockfs_requesters_current(r, 100, &got), -ENOENT);
	assert_true(lockfs_requesters_put(r, 100, lockfs_requesters_claim(r, 100, 5), &f));
	feed(LOCKFS_PROC_EXIT, 77, 77); /* someone else's */
	feed(LOCKFS_PROC_COMM, 78, 78);
	assert_int_equal(lockfs_requesters_current(r, 100, &got), 0);
	lockfs_argv_free(got.cmdline);
	feed(LOCKFS_PROC_EXIT, 51, 50); /* a thread of its parent, maybe the last */
	assert_int_equal(lockfs_requesters_current(r, 100, &got), -ENOENT);
	lockfs_descendants_observe(d, NULL, NULL);
	lockfs_requesters_free(r);
}

/* Any exit between the claim and the put voids the claim: the reads may
 * have seen a parent that is gone by the put. */
static void test_requesters_an_exit_during_the_reads_voids_the_claim(void **state)
{
	struct lockfs_requesters *r = observed();
	char a0[] = "agent", *argv[] = { a0, NULL };
	struct lockfs_requester f = identified(argv, 5, 50, 60, "agent"), got;
	uint64_t ticket = lockfs_requesters_claim(r, 100, 5);

	(void)state;
	feed(LOCKFS_PROC_EXIT, 90, 90);
	assert_false(lockfs_requesters_put(r, 100, ticket, &f));
	assert_int_equal(lockfs_requesters_current(r, 100, &got), -ENOENT);
	lockfs_descendants_observe(d, NULL, NULL);
	lockfs_requesters_free(r);
}

/* ---- the kernel's connector ------------------------------------------------ */

static void test_connector_reports_our_fork_setsid_rename_exec_and_exit(void **state)
{
	struct lockfs_procevents *pe;
	struct lockfs_event_source src;
	struct lockfs_proc_event evs[64];
	bool forked = false, left = false, renamed = false, execd = false, gone = false;
	char why[160];
	pid_t child;

	if (lockfs_procevents_open(&pe, why, sizeof(why)) < 0) {
		print_message("connector unavailable (%s): skipped\n", why);
		skip();
	}
	src = lockfs_procevents_source(pe);
	child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		if (setsid() < 0 || prctl(PR_SET_NAME, "renamed", 0, 0, 0) < 0)
			_exit(1);
		execl("/bin/true", "true", (char *)NULL);
		_exit(1);
	}
	assert_int_equal(waitpid(child, NULL, 0), child);
	/* Both events were queued before waitpid returned; other processes'
	 * may come first. */
	for (int round = 0; round < 1000 && !(forked && left && renamed && execd && gone);
	     round++) {
		int n = src.read(src.ctx, evs, 64);

		assert_true(n >= 0 || n == -ENOBUFS);
		if (n == 0)
			break;
		for (int i = 0; i < n; i++) {
			forked |= evs[i].kind == LOCKFS_PROC_FORK && evs[i].pid == child &&
				  evs[i].tgid == child && evs[i].parent_tgid == getpid();
			left |= evs[i].kind == LOCKFS_PROC_SID && evs[i].tgid == child;
			renamed |= evs[i].kind == LOCKFS_PROC_COMM && evs[i].tgid == child;
			execd |= evs[i].kind == LOCKFS_PROC_EXEC && evs[i].tgid == child;
			gone |= evs[i].kind == LOCKFS_PROC_EXIT && evs[i].tgid == child;
		}
	}
	assert_true(forked);
	assert_true(left);
	assert_true(renamed);
	assert_true(execd);
	assert_true(gone);
	lockfs_procevents_close(pe);
}

/* Outside the initial pid namespace the kernel ignores the subscription
 * (its events carry pids of the initial one): open must say so, so that
 * the daemon falls back to scans instead of trusting foreign pids. */
static void test_connector_refused_in_a_child_pid_namespace(void **state)
{
	int status;
	pid_t outer = fork();

	assert_true(outer >= 0);
	if (outer == 0) {
		pid_t inner;

		if (unshare(CLONE_NEWPID) < 0)
			_exit(77); /* not allowed here */
		inner = fork(); /* the first child enters the new namespace */
		if (inner == 0) {
			struct lockfs_procevents *pe;
			char why[160];
			int rc = lockfs_procevents_open(&pe, why, sizeof(why));

			_exit(rc == -ENOMSG && strstr(why, "pid namespace") ? 0 : 1);
		}
		if (inner < 0 || waitpid(inner, &status, 0) != inner)
			_exit(2);
		_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 3);
	}
	assert_int_equal(waitpid(outer, &status, 0), outer);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == 77) {
		print_message("cannot make a pid namespace here: skipped\n");
		skip();
	}
	assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
		T(test_child_forked_while_held_keeps_count_until_it_exits),
		T(test_holder_without_children_has_none),
		T(test_fork_before_the_watch_does_not_count),
		T(test_grandchild_counts_after_its_parent_exits),
		T(test_a_descendant_that_starts_its_own_session_leaves_the_set),
		T(test_a_setsid_after_the_holder_exited_lets_go),
		T(test_a_lost_setsid_is_found_by_the_check),
		T(test_threads_are_not_descendants),
		T(test_leader_exit_with_threads_left_is_not_the_end),
		T(test_holder_that_let_go_stops_counting),
		T(test_nested_holders_each_count_their_own),
		T(test_acts_for),
		T(test_lost_events_are_made_up_by_a_scan),
		T(test_session_mates_started_by_older_ones_are_not_counted),
		cmocka_unit_test_setup_teardown(test_no_event_source_scans_the_session,
						setup_scan_only, teardown),
		cmocka_unit_test_setup_teardown(test_the_check_of_dead_holders_follows_the_engine_clock,
						setup_scan_only, teardown),
		T(test_restart_counts_the_records_list_and_the_session),
		T(test_scan_that_cannot_look_proves_nothing),
		T(test_unwatched_holder_is_looked_for),
		T(test_untracked_processes_cost_no_proc_read),
		cmocka_unit_test_setup_teardown(test_requesters_keep_a_process_until_it_execs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_requesters_forget_an_exited_process_and_all_after_a_loss, setup, teardown),
		cmocka_unit_test_setup_teardown(test_requesters_exec_during_the_reads_voids_the_claim, setup, teardown),
		cmocka_unit_test_setup_teardown(test_requesters_answer_a_known_leader_with_its_identity, setup, teardown),
		cmocka_unit_test_setup_teardown(test_requesters_forget_a_rename_a_new_session_and_a_lost_parent, setup, teardown),
		cmocka_unit_test_setup_teardown(test_requesters_an_exit_during_the_reads_voids_the_claim, setup, teardown),
		cmocka_unit_test(test_connector_reports_our_fork_setsid_rename_exec_and_exit),
		cmocka_unit_test(test_connector_refused_in_a_child_pid_namespace),
#undef T
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
