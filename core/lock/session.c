/*
 * This daemon's session with the store: losing it, and what follows.
 * See session.h.
 *
 * Fail closed: once the store says this daemon's session is lost (its
 * TTL passed with no renewal confirmed), another host may already hold
 * what this host's processes think they hold.  Each of those locks is
 * logged `lost`, its holder is signalled (-o break_signal) and its rmdir
 * answers ESTALE, never 0: the holder must learn that its critical
 * section may not have been exclusive.  Nothing is re-held when the store
 * answers again.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "audit.h"
#include "caller.h"
#include "fdlock.h"
#include "queue.h"
#include "session.h"
#include "store.h"
#include "table.h"

/* How long a holder's look at a lost NAME keeps answering ESTALE once it
 * was told: the kernel looks a name up again at once (LOOKUP_REVAL) when
 * a lookup says ESTALE, and that retry must say it too. */
#define TOLD_MS 200
/* How many ESTALE answers tell the holder, once.  The syscall that meets
 * the lost NAME asks up to three times: a revalidation of its cached entry
 * (failing, it drops the entry), the lookup that follows, and the kernel's
 * single retry of the whole syscall with LOOKUP_REVAL; each must say
 * ESTALE.  Without a cached entry it asks twice, and a third answer goes
 * to the next syscall's first lookup, which the kernel then retries
 * itself and finds NAME free.  Either way the holder's next syscall on
 * NAME finds it free: a mkdir right after is a fresh acquire. */
#define TOLD_ANSWERS 3

/* A holder to signal once the stripe mutex is let go. */
struct to_signal {
	pid_t pid;
	unsigned long long start;
};

struct signals {
	struct to_signal *v;
	size_t n, cap;
};

static void signals_add(struct signals *sg, pid_t pid, unsigned long long start)
{
	if (sg->n == sg->cap) {
		size_t cap = sg->cap ? sg->cap * 2 : 16;
		struct to_signal *v = realloc(sg->v, cap * sizeof(*v));

		if (!v)
			return; /* no memory: the lost line and ESTALE still tell it */
		sg->v = v;
		sg->cap = cap;
	}
	sg->v[sg->n++] = (struct to_signal){ pid, start };
}

/* Keep holder I of C's record as a tombstone of S (no memory: its rmdir
 * answers ENOENT, as for a lock it never held). */
static void tombstone_add(struct stripe *s, const struct held_lock *c, size_t i)
{
	struct tombstone *ts = calloc(1, sizeof(*ts));

	if (!ts || !(ts->name = strdup(c->name))) {
		free(ts);
		return;
	}
	ts->fence = lockfs_record_fence_at(&c->rec, i);
	lockfs_caller_ref_at(&ts->holder, &c->rec, i);
	ts->next = s->tombstones;
	s->tombstones = ts;
}

/* Log holder I of C `lost` (EVIDENCE; session= LEASE, in hex). */
static void log_lost(struct lockfs_table *t, const struct held_lock *c, size_t i, int64_t lease,
		     const char *evidence)
{
	const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);
	char who[WHO_MAX], fence[24], uid[16], pid[16], session[24];
	const char *kv[] = { "fence", fence, "uid", uid, "pid", pid,
			     "evidence", evidence, "session", session, NULL };

	lockfs_audit_who(who, sizeof(who), i == 0 ? c->rec.slug : NULL, h->comm, h->pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, lockfs_record_fence_at(&c->rec, i));
	lockfs_audit_ids(uid, pid, h->uid, h->pid);
	snprintf(session, sizeof(session), "%016" PRIx64, (uint64_t)lease);
	lockfs_audit_event(t, who, c->name, kv, "lost");
}

/* Is C a lock this host's daemon granted to a holder on this host?  Only
 * such a lock can be lost: another host's ends by its own session, a
 * record rewritten behind our back (another token) is not ours to judge,
 * and a waiter's place that the store shows at the head is not held
 * until claimed (with s->mu held). */
static bool ours_here(struct lockfs_table *t, const struct held_lock *c)
{
	return c->granted && c->rec.has_holder &&
	       !lockfs_table_elsewhere(t, &c->rec.holder) && lockfs_table_issued_here(c);
}

/* C lost (EVIDENCE, session LEASE): every holder of it logged `lost`,
 * tombstoned for its rmdir and, with -o break_signal, put into SG; then
 * C is dropped from the cache.  With s->mu held. */
static void lose_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			int64_t lease, const char *evidence, struct signals *sg)
{
	size_t n = lockfs_record_holders(&c->rec);

	for (size_t i = 0; i < n; i++) {
		const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);

		log_lost(t, c, i, lease, evidence);
		/* A refused release of it waiting for etcd ends here too: the
		 * grant ended `lost`, never also `released`. */
		lockfs_fdlock_retry_forget(s, c->name, lockfs_record_fence_at(&c->rec, i));
		tombstone_add(s, c, i);
		lockfs_table_wake(t); /* the tick drops it when its holder exits */
		if (t->break_signal && h->pid > 0)
			signals_add(sg, h->pid, h->start_time);
	}
	lockfs_table_drop(t, s, c->name);
}

/* Is C a lock of this host that the store no longer keeps on a live
 * session of this daemon (LEASE lost)?  ALL: the session is LOST right
 * now, so every lock of this host is (backend.h).  With s->mu held. */
static bool lost_with(struct lockfs_table *t, const struct held_lock *c, int64_t lease, bool all)
{
	struct lockfs_entry_stat st;
	int rc;

	if (!ours_here(t, c))
		return false;
	if (all)
		return true;
	rc = lockfs_store_stat(t->be, c->name, &st, true);
	if (rc == -ENOENT || rc == -ESTALE)
		return true;
	return rc == 0 && (st.identity != c->identity || (lease && st.lease == lease));
}

/* Every lock of this host lost with session LEASE: logged, tombstoned,
 * dropped from the cache; its holders go into SG, to be signalled once
 * no engine mutex is held. */
static void lose_all(struct lockfs_table *t, int64_t lease, bool all, struct signals *sg)
{
	for (int k = 0; k < STRIPES; k++) {
		struct stripe *s = &t->stripes[k];

		pthread_mutex_lock(&s->mu);
		for (struct held_lock *c = s->head, *next; c; c = next) {
			next = c->next;
			if (lost_with(t, c, lease, all))
				lose_locked(t, s, c, lease, "session-expired", sg);
		}
		lockfs_table_unlock(s);
	}
}

void lockfs_session_lose_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
				int64_t lease)
{
	size_t n = lockfs_record_holders(&c->rec);

	for (size_t i = 0; i < n; i++) {
		const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);

		log_lost(t, c, i, lease, "session-expired");
		tombstone_add(s, c, i);
		lockfs_table_wake(t); /* the tick drops it when its holder exits */
		/* The liveness mutex is a leaf: taken inside a stripe's. */
		if (t->break_signal && h->pid > 0)
			(void)lockfs_liveness_signal(t->liveness, h->pid, h->start_time,
						     t->break_signal);
	}
	lockfs_table_drop(t, s, c->name);
}

/* Drop tombstones whose holder is gone: nobody is left to tell. */
static void prune_tombstones(struct lockfs_table *t)
{
	for (int k = 0; k < STRIPES; k++) {
		struct stripe *s = &t->stripes[k];

		pthread_mutex_lock(&s->mu);
		for (struct tombstone **pp = &s->tombstones; *pp;) {
			struct tombstone *ts = *pp;
			unsigned long long start;

			if (lockfs_proc_source_start_time(t->procs, ts->holder.pid, &start) == 0 &&
			    start == ts->holder.start) {
				pp = &ts->next;
				continue;
			}
			*pp = ts->next;
			free(ts->name);
			free(ts);
		}
		lockfs_table_unlock(s);
	}
}

void lockfs_session_check(struct lockfs_table *t)
{
	struct lockfs_session cur;
	struct signals sg = { 0 };
	int64_t lost = 0;
	bool rejoin = false, tombs = false;

	if (!(t->be->caps & LOCKFS_BE_SESSIONS) || lockfs_store_session(t->be, NULL, &cur) < 0)
		return;
	pthread_mutex_lock(&t->session_mu);
	if (cur.state == LOCKFS_SESSION_LOST) {
		lost = cur.id;
	} else if (t->session_id && cur.id != t->session_id) {
		lost = t->session_id; /* lost and replaced before we looked */
	}
	if (lost && lost == t->session_lost_id)
		lost = 0; /* acted on already */
	if (lost) {
		t->session_lost_id = lost;
		lose_all(t, lost, cur.state == LOCKFS_SESSION_LOST, &sg);
	}
	if (cur.state == LOCKFS_SESSION_LIVE && cur.id && cur.id != t->session_id) {
		rejoin = t->session_id != 0;
		/* (read without session_mu by lockfs_session_vanished_locked) */
		__atomic_store_n(&t->session_id, cur.id, __ATOMIC_RELAXED);
	}
	for (int k = 0; k < STRIPES && !tombs; k++)
		tombs = t->stripes[k].tombstones != NULL; /* racy read: a hint */
	pthread_mutex_unlock(&t->session_mu);
	for (size_t i = 0; i < sg.n; i++)
		lockfs_liveness_signal(t->liveness, sg.v[i].pid, sg.v[i].start, t->break_signal);
	free(sg.v);
	if (rejoin) {
		for (int k = 0; k < STRIPES; k++) {
			struct stripe *s = &t->stripes[k];

			pthread_mutex_lock(&s->mu);
			lockfs_queue_rejoin_locked(t, s, cur.id);
			lockfs_table_unlock(s);
		}
	}
	if (tombs)
		prune_tombstones(t);
}

/* Does a release of C's that the store refused wait in S's retries (an
 * rmdir or fd unlock answered EIO)?  Then C's key may be gone by that very
 * write, applied late: this daemon's own, not a loss.  With s->mu held. */
static bool release_pending(const struct stripe *s, const struct held_lock *c)
{
	size_t n = lockfs_record_holders(&c->rec);

	for (const struct unlock_retry *r = s->retries; r; r = r->next) {
		if (strcmp(r->name, c->name) != 0)
			continue;
		for (size_t i = 0; i < n; i++)
			if (lockfs_record_fence_at(&c->rec, i) == r->fence)
				return true;
	}
	return false;
}

void lockfs_session_vanished_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
				    const char *token)
{
	struct lockfs_session cur;
	struct signals sg = { 0 };
	int64_t known = __atomic_load_n(&t->session_id, __ATOMIC_RELAXED), lease = known;
	const char *evidence = "removed-in-store";

	if (!c || !(t->be->caps & LOCKFS_BE_SESSIONS) || !ours_here(t, c) ||
	    (token && strcmp(token, c->issued) == 0) || release_pending(s, c))
		return;
	/* Gone because the session went (its keys read as absent before the
	 * session report is taken in) or behind a live session's back. */
	if (lockfs_store_session(t->be, NULL, &cur) == 0) {
		if (cur.state == LOCKFS_SESSION_LOST) {
			evidence = "session-expired";
			lease = cur.id;
		} else if (known && cur.id != known) {
			evidence = "session-expired"; /* LEASE: the one the engine knew */
		} else {
			lease = cur.id;
		}
	}
	lose_locked(t, s, c, lease, evidence, &sg);
	/* (the liveness mutex is a leaf: taken inside a stripe's) */
	for (size_t i = 0; i < sg.n; i++)
		lockfs_liveness_signal(t->liveness, sg.v[i].pid, sg.v[i].start, t->break_signal);
	free(sg.v);
}

void lockfs_session_recheck_locked(struct lockfs_table *t, struct stripe *s)
{
	if (!(t->be->caps & LOCKFS_BE_SESSIONS))
		return;
	for (struct held_lock *c = s->head, *next; c; c = next) {
		struct lockfs_entry_stat st;
		struct held_lock *now;
		bool foreign;
		char *name;

		next = c->next; /* a load of C's name changes only C's entry */
		if (!ours_here(t, c) || !(name = strdup(c->name)))
			continue;
		(void)lockfs_table_load(t, s, name, &st, &foreign, &now);
		free(name);
	}
}

void lockfs_session_tombstone_forget(struct stripe *s, const struct held_lock *c)
{
	const struct lockfs_holder *h;

	if (!s->tombstones || !c || !c->rec.has_holder)
		return;
	h = &c->rec.holder;
	for (struct tombstone **pp = &s->tombstones; *pp;) {
		struct tombstone *ts = *pp;
		bool same = strcmp(ts->name, c->name) == 0 && ts->holder.bound == c->rec.bound &&
			    (c->rec.bound == LOCKFS_BOUND_SLUG
			     ? ts->holder.uid == h->uid && strcmp(ts->holder.slug, c->rec.slug) == 0
			     : ts->holder.pid == h->pid && ts->holder.start == h->start_time);

		if (!same) {
			pp = &ts->next;
			continue;
		}
		*pp = ts->next;
		free(ts->name);
		free(ts);
	}
}

int lockfs_session_tombstone_take(struct lockfs_table *t, struct stripe *s, const char *name,
				  const struct lockfs_caller *caller)
{
	int64_t now = lockfs_boot_ms();

	for (struct tombstone **pp = &s->tombstones; *pp; pp = &(*pp)->next) {
		struct tombstone *ts = *pp;

		if (ts->done || strcmp(ts->name, name) != 0 ||
		    lockfs_caller_check(t, &ts->holder, caller) < 0)
			continue;
		if (!ts->told_until_ms)
			ts->told_until_ms = now + TOLD_MS;
		if (now < ts->told_until_ms && ts->told++ < TOLD_ANSWERS)
			return -ESTALE;
		/* Told: from now on NAME is simply free.  Kept (pruned when
		 * its holder exits) so that a late release of the grant does
		 * not end it a second time. */
		ts->done = true;
		return -ENOENT;
	}
	return -ENOENT;
}

bool lockfs_session_tombstoned(const struct stripe *s, const char *name, uint64_t fence)
{
	for (const struct tombstone *ts = s->tombstones; ts; ts = ts->next)
		if (ts->fence == fence && strcmp(ts->name, name) == 0)
			return true;
	return false;
}

void lockfs_session_free_tombstones(struct stripe *s)
{
	while (s->tombstones) {
		struct tombstone *ts = s->tombstones;

		s->tombstones = ts->next;
		free(ts->name);
		free(ts);
	}
}
