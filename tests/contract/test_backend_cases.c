/*
 * The backend contract's cases (docs/design/seam.md), the same assertions
 * for every kind of store: indivisible acquire, identity guards, fences,
 * the line, list/read/stat, changes, errors, foreign locks and sessions.
 * main() and the per-kind fixtures are in test_backend.c.
 */
#include "backend_contract.h"

/* ---- 1. Indivisible acquire ---- */

#define RACERS 8
#define ROUNDS 1000

struct race {
	struct store *s;
	int inside;       /* winners holding it now (__atomic) */
	int overlaps;     /* a second winner while one held (__atomic) */
	int bad_answers;  /* neither 0 nor -EEXIST, or a failed release */
	int wins;
};

static void *racer(void *arg)
{
	struct race *r = arg;

	for (int i = 0; i < ROUNDS; i++) {
		struct lockfs_entry_stat st;
		int rc = acquire(r->s, "contended", "racer", &st);

		if (rc == -EEXIST)
			continue;
		if (rc != 0) {
			__atomic_add_fetch(&r->bad_answers, 1, __ATOMIC_RELAXED);
			continue;
		}
		if (__atomic_add_fetch(&r->inside, 1, __ATOMIC_ACQ_REL) != 1)
			__atomic_add_fetch(&r->overlaps, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&r->wins, 1, __ATOMIC_RELAXED);
		__atomic_sub_fetch(&r->inside, 1, __ATOMIC_ACQ_REL);
		if (r->s->be->ops->release(r->s->be, "contended", st.identity) != 0)
			__atomic_add_fetch(&r->bad_answers, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

void test_acquire_is_indivisible_among_8_threads(void **state)
{
	struct store *s = store_of(state);
	struct race r = { .s = s };
	pthread_t t[RACERS];

	NEED_STORE(s);
	for (int i = 0; i < RACERS; i++)
		assert_int_equal(pthread_create(&t[i], NULL, racer, &r), 0);
	for (int i = 0; i < RACERS; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(r.overlaps, 0);
	assert_int_equal(r.bad_answers, 0);
	assert_true(r.wins > 0);
	assert_int_equal(held_count(s), 0);
}

/* ---- 2. Identity guards ---- */

void test_stale_identity_never_removes_or_rewrites_a_newer_lock(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st1, st2, st3, rst;
	struct rec edit = { .tag = "edited" };
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "x", "first", &st1), 0);
	assert_int_not_equal(st1.identity, 0);
	assert_int_equal(s->be->ops->release(s->be, "x", st1.identity), 0);
	assert_int_equal(acquire(s, "x", "second", &st2), 0);
	assert_int_not_equal(st2.identity, st1.identity);
	assert_int_equal(s->be->ops->release(s->be, "x", st1.identity), -ENOENT);
	assert_int_equal(s->be->ops->update(s->be, "x", st1.identity, LOCKFS_UPD_EDIT,
					    SRC(&edit), &st3), -ENOENT);
	assert_int_equal(edit.calls, 0);
	assert_int_equal(read_tag(s, "x", tag, &rst), 0);
	assert_string_equal(tag, "second");
	assert_int_equal(rst.identity, st2.identity);

	/* An update changes the identity: the old one no longer releases. */
	edit.keep = st2.fence;
	assert_int_equal(s->be->ops->update(s->be, "x", st2.identity, LOCKFS_UPD_EDIT,
					    SRC(&edit), &st3), 0);
	assert_int_not_equal(st3.identity, st2.identity);
	assert_int_equal(s->be->ops->release(s->be, "x", st2.identity), -ENOENT);
	assert_int_equal(read_tag(s, "x", tag, &rst), 0);
	assert_string_equal(tag, "edited");
	assert_int_equal(rst.identity, st3.identity);
	assert_int_equal(rst.fence, st2.fence);
	assert_int_equal(s->be->ops->release(s->be, "x", st3.identity), 0);
	assert_int_equal(s->be->ops->stat(s->be, "x", NULL, true), -ENOENT);
}

/* ---- 3. Fences ---- */

void test_fences_increase_per_name_and_across_reopen(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st, rst;
	struct lockfs_place place;
	struct rec r = { .tag = "t" };
	uint64_t last;
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "f", "a", &st), 0);
	assert_true(st.fence > 0);
	last = st.fence;
	assert_int_equal(read_tag(s, "f", tag, &rst), 0);
	assert_int_equal(rst.fence, st.fence);

	r.tag = "grant";
	assert_int_equal(s->be->ops->update(s->be, "f", st.identity, LOCKFS_UPD_GRANT,
					    SRC(&r), &st), 0);
	assert_true(st.fence > last);
	last = st.fence;
	assert_int_equal(read_tag(s, "f", tag, &rst), 0);
	assert_int_equal(rst.fence, st.fence);

	r.tag = "next";
	assert_int_equal(s->be->ops->acquire(s->be, "f", LOCKFS_ACQ_QUEUE, SRC(&r), &place,
					     NULL), -EINPROGRESS);
	assert_int_equal(s->be->ops->handoff(s->be, "f", st.identity, &place, SRC(&r), &st), 0);
	assert_true(st.fence > last);
	last = st.fence;
	assert_int_equal(read_tag(s, "f", tag, &rst), 0);
	assert_string_equal(tag, "next");
	assert_int_equal(rst.fence, st.fence);
	assert_int_equal(s->be->ops->release(s->be, "f", st.identity), 0);

	assert_int_equal(s->be->ops->acquire(s->be, "f", LOCKFS_ACQ_QUEUE, SRC(&r), &place,
					     NULL), -EINPROGRESS);
	assert_int_equal(s->be->ops->claim(s->be, "f", &place, SRC(&r), &st), 0);
	assert_true(st.fence > last);
	last = st.fence;
	assert_int_equal(s->be->ops->release(s->be, "f", st.identity), 0);

	/* Another name's grant does not go back either: one counter or per
	 * name, never below what this name saw. */
	s->be->ops->close(s->be);
	s->be = NULL;
	assert_int_equal(kind->open(s, &s->be), 0);
	assert_int_equal(acquire(s, "f", "after-reopen", &st), 0);
	assert_true(st.fence > last);
	assert_int_equal(read_tag(s, "f", tag, &rst), 0);
	assert_int_equal(rst.fence, st.fence);
}

/* ---- 4. The line ---- */

struct poller {
	struct store *s;
	bool stop;        /* __atomic */
	int free_seen;    /* TRY succeeded in between */
	int polls;
};

static void *poll_try(void *arg)
{
	struct poller *p = arg;

	while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
		struct lockfs_entry_stat st;

		if (acquire(p->s, "line", "thief", &st) == 0) {
			p->free_seen++;
			p->s->be->ops->release(p->s->be, "line", st.identity);
		}
		p->polls++;
	}
	return NULL;
}

void test_handoff_gives_the_place_the_lock_with_no_gap(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st, st2;
	struct lockfs_place place, later;
	struct rec waiter = { .tag = "waiter" }, other = { .tag = "other" };
	struct poller p = { .s = s };
	pthread_t t;
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "line", "holder", &st), 0);
	assert_int_equal(pthread_create(&t, NULL, poll_try, &p), 0);
	assert_int_equal(s->be->ops->acquire(s->be, "line", LOCKFS_ACQ_OR_QUEUE, SRC(&waiter),
					     &place, &st2), -EINPROGRESS);
	assert_int_equal(s->be->ops->acquire(s->be, "line", LOCKFS_ACQ_QUEUE, SRC(&other),
					     &later, NULL), -EINPROGRESS);
	assert_true(later.rank > place.rank);
	assert_int_equal(s->be->ops->claim(s->be, "line", &place, SRC(&waiter), &st2), -EEXIST);
	assert_int_equal(s->be->ops->handoff(s->be, "line", st.identity, &place, SRC(&waiter),
					     &st2), 0);
	assert_int_not_equal(st2.identity, st.identity);
	/* Let the poller see the new grant for a while, too. */
	while (__atomic_load_n(&p.polls, __ATOMIC_RELAXED) < 200)
		sched_yield();
	__atomic_store_n(&p.stop, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	assert_int_equal(p.free_seen, 0);
	assert_int_equal(read_tag(s, "line", tag, NULL), 0);
	assert_string_equal(tag, "waiter");
	/* The old grant is over: its identity hands off nothing more. */
	assert_int_equal(s->be->ops->handoff(s->be, "line", st.identity, &later, SRC(&other),
					     &st), -ENOENT);
	assert_int_equal(s->be->ops->leave(s->be, "line", &place), 0);
	assert_int_equal(s->be->ops->leave(s->be, "line", &later), 0);
	assert_int_equal(s->be->ops->leave(s->be, "line", &later), 0);
	assert_int_equal(s->be->ops->release(s->be, "line", st2.identity), 0);
	assert_int_equal(held_count(s), 0);
}

/* ---- 5. list / read / stat ---- */

struct seen {
	char names[8][64];
	int n;
};

static int add_seen(void *arg, const char *name)
{
	struct seen *sn = arg;

	if (sn->n < 8)
		snprintf(sn->names[sn->n++], 64, "%s", name);
	return 0;
}

static bool has(const struct seen *sn, const char *name)
{
	for (int i = 0; i < sn->n; i++)
		if (strcmp(sn->names[i], name) == 0)
			return true;
	return false;
}

void test_list_read_and_stat_agree(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat a, b, rst, sst;
	struct seen sn = { 0 };
	struct rec r = { .tag = "nobody" };
	char *rec = (char *)"untouched";
	size_t len = 1;
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "alpha", "A", &a), 0);
	assert_int_equal(acquire(s, "beta", "B", &b), 0);
	assert_int_equal(s->be->ops->list(s->be, add_seen, &sn), 0);
	assert_int_equal(sn.n, 2);
	assert_true(has(&sn, "alpha") && has(&sn, "beta"));
	assert_int_equal(read_tag(s, "alpha", tag, &rst), 0);
	assert_string_equal(tag, "A");
	assert_int_equal(s->be->ops->stat(s->be, "alpha", &sst, true), 0);
	assert_int_equal(rst.identity, a.identity);
	assert_int_equal(sst.identity, a.identity);
	assert_int_equal(s->be->ops->stat(s->be, "beta", &sst, false), 0);
	assert_int_equal(sst.identity, b.identity);

	assert_int_equal(s->be->ops->read(s->be, "gamma", &rec, &len, &rst), -ENOENT);
	assert_null(rec);
	assert_int_equal(s->be->ops->stat(s->be, "gamma", &sst, false), -ENOENT);
	assert_int_equal(s->be->ops->stat(s->be, "gamma", &sst, true), -ENOENT);
	assert_int_equal(s->be->ops->release(s->be, "gamma", a.identity), -ENOENT);
	assert_int_equal(s->be->ops->update(s->be, "gamma", a.identity, LOCKFS_UPD_EDIT,
					    SRC(&r), &rst), -ENOENT);
	assert_int_equal(s->be->ops->release(s->be, "alpha", a.identity), 0);
	memset(&sn, 0, sizeof(sn));
	assert_int_equal(s->be->ops->list(s->be, add_seen, &sn), 0);
	assert_int_equal(sn.n, 1);
	assert_string_equal(sn.names[0], "beta");
}

/* list_prefix, where a store has it (else the engine filters list()):
 * the held names that begin with the prefix, none other, as they are now. */
void test_list_prefix_lists_only_those_names(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat a, b, c;
	struct seen sn = { 0 };

	NEED_STORE(s);
	if (!s->be->ops->list_prefix)
		skip();
	assert_int_equal(acquire(s, ".slot0of2:gpu", "A", &a), 0);
	assert_int_equal(acquire(s, "gpu", "B", &b), 0);
	assert_int_equal(acquire(s, ".slot1of2:gpu", "C", &c), 0);
	assert_int_equal(s->be->ops->list_prefix(s->be, ".slot", add_seen, &sn), 0);
	assert_int_equal(sn.n, 2);
	assert_true(has(&sn, ".slot0of2:gpu") && has(&sn, ".slot1of2:gpu"));
	assert_int_equal(s->be->ops->release(s->be, ".slot0of2:gpu", a.identity), 0);
	memset(&sn, 0, sizeof(sn));
	assert_int_equal(s->be->ops->list_prefix(s->be, ".slot", add_seen, &sn), 0);
	assert_int_equal(sn.n, 1);
	assert_string_equal(sn.names[0], ".slot1of2:gpu");
	memset(&sn, 0, sizeof(sn));
	assert_int_equal(s->be->ops->list_prefix(s->be, "gp", add_seen, &sn), 0);
	assert_int_equal(sn.n, 1);
	assert_string_equal(sn.names[0], "gpu");
}

/* ---- 6. Changes (the recorder: backend_contract.h) ---- */

void test_changes_are_reported_within_a_second(void **state)
{
	struct store *s = store_of(state);
	struct changes c = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	struct lockfs_entry_stat st;
	struct rec r = { .tag = "edited" };

	NEED_STORE(s);
	assert_int_equal(s->be->ops->start(s->be, on_change, &c), 0);
	settle(&c);
	assert_int_equal(acquire(s, "w", "first", &st), 0);
	assert_true(await_change(&c, "w"));
	settle(&c);
	r.keep = st.fence;
	assert_int_equal(s->be->ops->update(s->be, "w", st.identity, LOCKFS_UPD_EDIT, SRC(&r),
					    &st), 0);
	assert_true(await_change(&c, "w"));
	settle(&c);
	assert_int_equal(s->be->ops->release(s->be, "w", st.identity), 0);
	assert_true(await_change(&c, "w"));
	settle(&c);
	/* A store may report only the names it was asked about (etcd
	 * watches what its callers look at): ask first, as the engine does
	 * (a lookup) before it waits on a name. */
	(void)s->be->ops->stat(s->be, "script", NULL, false);
	kind->foreign(s, "script", 0);
	assert_true(await_change_as(&c, "script", true));
	settle(&c);
	kind->remove_outside(s, "script");
	assert_true(await_change_as(&c, "script", true));
	/* Nothing is reported after close (teardown closes: the callback's
	 * state must outlive it, and it does here). */
}

/* ---- 7. Errors ---- */

static void check_broken_store(void **state, enum breakage how)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat held, st;
	struct lockfs_place place;
	struct rec r = { .tag = "edited" };
	struct seen sn = { 0 };
	const char *why;
	int release_rc, update_rc, queue_rc;
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "held", "before", &held), 0);
	why = kind->break_store(s, how);
	if (why) {
		fprintf(stderr, "skipped: %s\n", why);
		skip();
	}
	/* A new lock: never a false success, never "held". */
	assert_int_equal(acquire(s, "new", "during", &st), -EIO);
	queue_rc = s->be->ops->acquire(s->be, "new", LOCKFS_ACQ_OR_QUEUE, SRC(&r), &place, &st);
	assert_true(queue_rc == -EIO || queue_rc == -EINPROGRESS);
	if (queue_rc == -EINPROGRESS)
		assert_int_equal(s->be->ops->leave(s->be, "new", &place), 0);
	/* Changes of a held lock: -EIO, or really done (checked below);
	 * never -ENOENT ("not held") or -EPERM from the medium. */
	r.keep = held.fence;
	update_rc = s->be->ops->update(s->be, "held", held.identity, LOCKFS_UPD_EDIT, SRC(&r),
				       &st);
	assert_true(update_rc == 0 || update_rc == -EIO);
	if (update_rc == 0)
		held = st;
	release_rc = s->be->ops->release(s->be, "held", held.identity);
	assert_true(release_rc == 0 || release_rc == -EIO);
	kind->mend(s, how);

	/* Nothing half-made: the failed acquisition left no lock, the held
	 * one is there exactly when its release failed, with the record its
	 * update's answer says. */
	assert_int_equal(s->be->ops->list(s->be, add_seen, &sn), 0);
	assert_false(has(&sn, "new"));
	assert_int_equal(has(&sn, "held"), release_rc != 0);
	if (release_rc != 0) {
		assert_int_equal(read_tag(s, "held", tag, NULL), 0);
		assert_string_equal(tag, update_rc == 0 ? "edited" : "before");
		assert_int_equal(s->be->ops->release(s->be, "held", held.identity), 0);
	}
	/* And the store works again. */
	assert_int_equal(acquire(s, "new", "after", &st), 0);
	assert_int_equal(s->be->ops->release(s->be, "new", st.identity), 0);
}

void test_read_only_store_fails_with_eio_and_makes_nothing(void **state)
{
	check_broken_store(state, BREAK_READ_ONLY);
}

void test_full_store_fails_with_eio_and_makes_nothing(void **state)
{
	check_broken_store(state, BREAK_FULL);
}

/* ---- 8. Foreign locks ---- */

void test_foreign_lock_reads_without_record_and_blocks_try(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st, rst;
	char *rec = (char *)"untouched";
	size_t len = 1;

	NEED_STORE(s);
	kind->foreign(s, "seed", 0);
	assert_int_equal(s->be->ops->read(s->be, "seed", &rec, &len, &rst), 0);
	assert_null(rec);
	assert_int_not_equal(rst.identity, 0);
	assert_int_equal(rst.fence, 0);
	assert_int_equal(acquire(s, "seed", "mine", &st), -EEXIST);
	assert_int_equal(s->be->ops->stat(s->be, "seed", &st, false), 0);
	assert_int_equal(st.identity, rst.identity);
	/* Young: not stale under stale=1 s. */
	if (s->be->ops->foreign_stale)
		assert_int_equal(s->be->ops->foreign_stale(s->be, "seed", &st), 0);
}

void test_old_foreign_lock_is_stale_and_recoverable(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st, mine;

	NEED_STORE(s);
	if (!s->be->ops->foreign_stale)
		skip(); /* this kind has no staleness policy */
	kind->foreign(s, "old", 5000);
	assert_int_equal(acquire(s, "mine", "m", &mine), 0);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "old", &st), 1);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "mine", &st), 0);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "absent", &st), 0);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "old", &st), 1);
	assert_int_equal(s->be->ops->release(s->be, "old", st.identity), 0);
	assert_int_equal(acquire(s, "old", "recovered", &st), 0);
}

/* The daemon's wall clock moved by clock_shift_ms (lockfs_clock_override). */
static int64_t clock_shift_ms;

static int64_t real_ms(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t shifted_wall_ms(void *arg)
{
	return real_ms(CLOCK_REALTIME) + clock_shift_ms;
}

static int64_t real_boot_ms(void *arg)
{
	return real_ms(CLOCK_BOOTTIME);
}

/* -o stale judges a foreign lock's age by the daemon's clock (clock.h),
 * so a test can move it: 10 s on, a lock made just now is stale under
 * stale=1 s; 10 s back, one made 5 s ago is not. */
void test_foreign_lock_ages_by_the_daemons_clock(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_clock shifted = { shifted_wall_ms, real_boot_ms, NULL };
	struct lockfs_entry_stat st;
	int young_later, old_earlier;

	NEED_STORE(s);
	if (!s->be->ops->foreign_stale)
		skip(); /* this kind has no staleness policy */
	kind->foreign(s, "young", 0);
	kind->foreign(s, "old", 5000);
	lockfs_clock_override(&shifted);
	clock_shift_ms = 10000;
	young_later = s->be->ops->foreign_stale(s->be, "young", &st);
	clock_shift_ms = -10000;
	old_earlier = s->be->ops->foreign_stale(s->be, "old", &st);
	lockfs_clock_override(NULL); /* before any assertion can jump out */
	assert_int_equal(young_later, 1);
	assert_int_equal(old_earlier, 0);
	/* And by the real clock again: as they are. */
	assert_int_equal(s->be->ops->foreign_stale(s->be, "young", &st), 0);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "old", &st), 1);
}

/* ---- Session ---- */

void test_own_session_is_live_and_other_hosts_unknown(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_session ses;

	NEED_STORE(s);
	assert_int_equal(s->be->ops->session(s->be, NULL, &ses), 0);
	assert_int_equal(ses.state, LOCKFS_SESSION_LIVE);
	assert_int_equal(s->be->ops->session(s->be, s->be->host, &ses), 0);
	assert_int_equal(ses.state, LOCKFS_SESSION_LIVE);
	assert_true(s->be->host[0] != '\0');
	assert_int_equal(s->be->ops->session(s->be, "no-such-host.invalid", &ses), -ENOENT);
	if (s->be->ops->check)
		assert_int_equal(s->be->ops->check(s->be), 0);
}

