/*
 * Waiting your turn: fd locks (flock(2), whole-file fcntl locks) and the
 * FIFO queue of each name.  See include/lockfs/core.h.
 *
 * The queue lives next to the cache, under the same stripe mutex, so one
 * hold of it decides everything about a name: who holds it, who waits,
 * and who is granted when it is let go.  Granting never sleeps and never
 * needs a thread: a parked request is a struct lockfs_wait, answered by
 * whichever thread releases, under the stripe mutex, the moment the store
 * shows it as the holder.
 *
 * The rules:
 *  - A newcomer is granted at once only when nobody waits ahead of it; a
 *    shared request behind a queued exclusive one waits its turn.
 *  - On release the head is granted at once, by rewriting the record in
 *    place (handoff_locked): the store never shows the lock free in
 *    between, so no mkdir, no LOCK_NB and no seed script can barge.
 *  - An interrupted waiter leaves the queue, but its place is kept for
 *    KEEP_MS for the same lock owner: the kernel restarts an interrupted
 *    flock (SA_RESTART, Ctrl-Z + fg) as a new request.  Grants skip kept
 *    places.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/name.h"
#include "base/clock.h"
#include "audit.h"
#include "caller.h"
#include "fdlock.h"
#include "grant.h"
#include "queue.h"
#include "store.h"
#include "table.h"

/* How long an interrupted waiter's place is kept. */
#define KEEP_MS 1000

struct lockq *lockfs_queue_find(struct stripe *s, const char *name)
{
	for (struct lockq *q = s->queues; q; q = q->next)
		if (strcmp(q->name, name) == 0)
			return q;
	return NULL;
}

bool lockfs_queue_has_waiters(struct stripe *s, const char *name)
{
	struct lockq *q = lockfs_queue_find(s, name);

	return q && q->nactive;
}

static struct lockq *queue_get(struct stripe *s, const char *name)
{
	struct lockq *q = lockfs_queue_find(s, name);

	if (q)
		return q;
	q = calloc(1, sizeof(*q));
	if (!q || !(q->name = strdup(name))) {
		free(q);
		return NULL;
	}
	q->next = s->queues;
	s->queues = q;
	return q;
}

/* Does the store keep a line of its own that the engine's queue is part
 * of (places: acquire OR_QUEUE/QUEUE, claim, leave)?  dir does not: the
 * engine's queue is the whole line there. */
static bool store_has_line(const struct lockfs_table *t)
{
	return (t->be->caps & LOCKFS_BE_SESSIONS) != 0;
}

/* E's place in the store's line is given up (E leaves, or was granted
 * another way).  A granted place is never deleted by leave. */
static void leave_place(const char *name, struct qentry *e)
{
	if (e->place.rank && e->be)
		(void)lockfs_store_leave(e->be, name, &e->place);
	e->place = (struct lockfs_place){ 0 };
}

static void queue_unlink(struct lockq *q, struct qentry *e)
{
	leave_place(q->name, e);
	if (e->prev)
		e->prev->next = e->next;
	else
		q->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		q->tail = e->prev;
	if (e->w)
		q->nactive--;
	lockfs_argv_free(e->cmdline);
	free(e->slug);
	free(e);
}

/*
 * E takes its place in Q: behind every entry whose request the kernel made
 * before E's (qentry.ticket).  That is the tail, unless E is a request the
 * kernel resent after a restart (resume.h), which comes back in no
 * particular order: then it goes back ahead of the waiters that came after
 * it.  An entry without a ticket (0) is never passed, nor passes.
 */
static void queue_insert(struct lockq *q, struct qentry *e)
{
	struct qentry *after = q->tail;

	while (after && e->ticket && after->ticket > e->ticket)
		after = after->prev;
	e->prev = after;
	e->next = after ? after->next : q->head;
	if (e->next)
		e->next->prev = e;
	else
		q->tail = e;
	if (after)
		after->next = e;
	else
		q->head = e;
}

/* Drop Q when nothing is left in it. */
static void queue_maybe_free(struct stripe *s, struct lockq *q)
{
	if (q->head)
		return;
	for (struct lockq **pp = &s->queues; *pp; pp = &(*pp)->next) {
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	}
	free(q->name);
	free(q);
}

void lockfs_queue_free_all(struct stripe *s)
{
	lockfs_fdlock_free_all(s);
	lockfs_fdlock_free_retries(s);
	while (s->queues) {
		struct lockq *q = s->queues;

		/* The store may be closed already: places stay with the
		 * session, whose end (or the next daemon) removes them. */
		for (struct qentry *x = q->head; x; x = x->next)
			x->place = (struct lockfs_place){ 0 };
		while (q->head)
			queue_unlink(q, q->head);
		queue_maybe_free(s, q);
	}
}

/* Answer E's parked request for NAME with RESULT now, under the stripe
 * mutex: the waiter runs as soon as possible (a hand-off's latency is
 * this).  A grant's `acquired` line is written before (no grant without
 * its line), and the open file it came through remembered.  E->w is
 * cleared (DONE may free W); active_end still counts E out of its queue.
 * DONE must not call back into the engine. */
static void complete(struct stripe *s, const char *name, struct qentry *e, int result)
{
	struct lockfs_wait *w = e->w;

	if (result == 0 && e->via_file)
		lockfs_fdlock_granted_via(s, name, e->owner, e->via_file);
	e->w = NULL;
	w->parked = false;
	w->entry = NULL;
	w->done(w, result);
}

/* E's parked request was answered or taken back: it waits no more. */
static void active_end(struct lockfs_table *t, struct lockq *q, struct qentry *e)
{
	e->w = NULL;
	q->nactive--;
	lockfs_quota_waiter_sub(t->quota, e->uid);
}

/* The lock E would be granted counts against E's holder-to-be: room for
 * it, or -EDQUOT / -ENOSPC (logged as a refusal).  GROWS as for
 * lockfs_quota_lock_reserve; undone by lockfs_quota_lock_unreserve(.., e->who.uid, ..). */
static int grant_reserve(struct lockfs_table *t, const char *name, struct qentry *e, bool grows)
{
	enum quota_reason why;
	int rc = lockfs_quota_lock_reserve(t->quota, e->who.uid, grows, &why);

	if (rc < 0) {
		char who[WHO_MAX];

		lockfs_audit_who(who, sizeof(who), e->slug, e->who.comm, e->who.pid);
		lockfs_caller_refuse(t, e->who.uid, why, name, who, e->who.pid);
	}
	return rc;
}

static struct qentry *first_active(struct lockq *q)
{
	struct qentry *e = q ? q->head : NULL;

	while (e && !e->w)
		e = e->next;
	return e;
}

/* The waiter to grant next: the first active one -- or, where the store
 * keeps the line (etcd), the active one whose place comes first in it.
 * A waiter whose place request failed (etcd silent) asks again later and
 * then stands behind one that came after it; the store's order is the
 * one every host follows, and a host that granted by its own would wait
 * for a waiter that waits behind the store's head. */
static struct qentry *next_active(const struct lockfs_table *t, struct lockq *q)
{
	struct qentry *first = first_active(q), *best = NULL;

	if (!first || !store_has_line(t))
		return first;
	for (struct qentry *e = first; e; e = e->next)
		if (e->w && e->place.rank && (!best || e->place.rank < best->place.rank))
			best = e;
	return best ? best : first;
}

static void purge_kept(struct lockq *q, int64_t now)
{
	for (struct qentry *e = q ? q->head : NULL, *next; e; e = next) {
		next = e->next;
		if (!e->w && now >= e->keep_until_ms)
			queue_unlink(q, e);
	}
}

/*
 * The store just granted NAME to E from G (its record, cleared here; ST
 * the store's answer): E's place is the lock now.  Its `acquired` line
 * before its answer -- nobody holds a lock the log does not show --, then
 * E's request answered and the grant cached.  0, or the log's -errno
 * (the grant taken back: lockfs_grant_undo_locked).  With s->mu held.
 */
static int grant_made(struct lockfs_table *t, struct stripe *s, const char *name,
		      struct qentry *e, struct lockfs_grant_src *g,
		      const struct lockfs_entry_stat *st)
{
	struct lockfs_record *rec = g->rec;
	int rc;

	e->place = (struct lockfs_place){ 0 };
	lockfs_table_grant_fence(g, st);
	lockfs_table_drop_elsewhere(t, s, name); /* its `released` before this grant */
	rc = lockfs_grant_log(t, name, &rec->holder, rec->slug, rec->fence, rec->mode, e);
	if (rc < 0) {
		lockfs_grant_undo_locked(t, s, name, st->identity, rec, e->owner, rec->fence);
		return rc;
	}
	if (e->w)
		complete(s, name, e, 0);
	lockfs_table_put_new(t, s, name, st->identity, rec, -1);
	lockfs_record_clear(rec);
	return 0;
}

/* E joins C's shared lock as one more holder.  0, -ENOLCK (full),
 * -EAGAIN (not now), or the log's -errno (E is refused). */
static int join_shared(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
		       struct lockfs_entry_stat *st, struct qentry *e)
{
	struct lockfs_record fresh;
	struct lockfs_share *v;
	int rc;

	/* Every holder must fit in a record the store can give back. */
	if (lockfs_record_holders(&c->rec) >= LOCKFS_SHARED_MAX)
		return -ENOLCK;
	if (lockfs_grant_fd_record(t, c->name, e, &fresh) < 0)
		return -EAGAIN; /* no memory now: keep waiting */
	v = realloc(c->rec.shares, (c->rec.nshares + 1) * sizeof(*v));
	if (!v) {
		lockfs_record_clear(&fresh);
		return -EAGAIN;
	}
	c->rec.shares = v;
	v = &v[c->rec.nshares++];
	memset(v, 0, sizeof(*v));
	v->holder = fresh.holder;
	memset(&fresh.holder, 0, sizeof(fresh.holder));
	v->bound = LOCKFS_BOUND_FD;
	memcpy(v->fd_owner, fresh.fd_owner, sizeof(v->fd_owner));
	v->via_file = fresh.via_file;
	v->fence = 0; /* the store's to issue, in the write below */
	v->acquired_at_ms = fresh.acquired_at_ms;
	v->slug = fresh.slug;
	fresh.slug = NULL;
	lockfs_record_clear(&fresh);
	lockfs_quota_locks_add(t->quota, v->holder.uid, 1); /* as lockfs_table_account would */
	if (lockfs_table_persist_grant(t, s, c, st, c->rec.nshares) < 0)
		return -EAGAIN; /* the store cannot tell, or someone waits in it */
	v = &c->rec.shares[c->rec.nshares - 1];
	rc = lockfs_grant_log(t, c->name, &v->holder, v->slug, v->fence, LOCKFS_SHARED, e);
	if (rc < 0) {
		/* The log refused: this share goes again, the others stay. */
		uint64_t fence = v->fence;
		char *name = strdup(c->name);
		struct lockfs_entry_stat now = { .identity = c->identity };
		int urc;

		lockfs_quota_locks_add(t->quota, v->holder.uid, -1); /* before it leaves */
		lockfs_holder_clear(&v->holder);
		free(v->slug);
		if (--c->rec.nshares == 0) {
			free(c->rec.shares);
			c->rec.shares = NULL;
		}
		urc = lockfs_table_persist(t, s, c, &now);
		if (urc < 0 && name)
			lockfs_fdlock_retry_add(t, s, name, e->owner, fence, urc, false, 0);
		free(name);
		return rc;
	}
	if (e->w)
		complete(s, c->name, e, 0);
	return 0;
}

/* E takes a place in the store's line (HOW) unless it has one or never
 * waits.  -EAGAIN always: E waits; a place the store cannot give now
 * (EIO) is asked for on the next try. */
static int take_place(struct lockfs_table *t, const char *name, struct qentry *e,
		      enum lockfs_acquire_how how)
{
	struct lockfs_record rec;
	struct lockfs_grant_src g;
	struct lockfs_entry_stat st;
	int rc;

	if (e->place.rank || e->nowait)
		return -EAGAIN;
	if (lockfs_grant_fd_record(t, name, e, &rec) < 0)
		return -EAGAIN;
	rc = lockfs_store_acquire(t->be, name, how, lockfs_table_grant_src(&g, &rec, 0),
				  &e->place, &st);
	lockfs_record_clear(&rec);
	if (rc == -EINPROGRESS)
		e->be = t->be;
	else
		e->place = (struct lockfs_place){ 0 };
	return -EAGAIN;
}

/* E, which has a place in the store's line, claims NAME: 0 (granted,
 * logged, E's request answered), -EAGAIN (not yet: ahead of it is
 * somebody, or the store cannot answer now), -errno. */
static int claim_place(struct lockfs_table *t, struct stripe *s, const char *name,
		       struct qentry *e)
{
	struct lockfs_entry_stat st;
	struct lockfs_record rec;
	struct lockfs_grant_src g;
	int rc = grant_reserve(t, name, e, true);

	if (rc < 0)
		return rc;
	rc = lockfs_grant_fd_record(t, name, e, &rec);
	if (rc < 0)
		goto out;
	rc = lockfs_store_claim(t->be, name, &e->place, lockfs_table_grant_src(&g, &rec, 0), &st);
	if (rc < 0) {
		lockfs_record_clear(&rec);
		if (rc == -ENOENT) {
			/* The place is gone (expired, broken): a new one at
			 * the tail, asked for now or on the next try. */
			e->place = (struct lockfs_place){ 0 };
			take_place(t, name, e, LOCKFS_ACQ_QUEUE);
		}
		/* -ESTALE: it went with a lost session; the new session's
		 * lockfs_queue_rejoin_locked gives it a new one. */
		rc = -EAGAIN;
		goto out;
	}
	rc = grant_made(t, s, name, e, &g, &st);
out:
	lockfs_quota_lock_unreserve(t->quota, e->who.uid, true);
	return rc;
}

/*
 * Grant E now if NAME's state allows: take the free lock, or join a shared
 * one.  0: granted (E's parked request, if any, answered, and E->w
 * cleared); -EAGAIN: not now; -errno: E cannot be granted at all.
 * HANDED_BY: the request that just let NAME go for E (record.handed_by).
 */
static int try_grant(struct lockfs_table *t, struct stripe *s, const char *name, struct qentry *e,
		     uint64_t handed_by)
{
	struct lockfs_entry_stat st;
	struct lockfs_record rec;
	struct lockfs_grant_src g;
	struct held_lock *c;
	bool foreign;
	int rc;

	/* A place in the store's line carries E's record: once it is the
	 * head, the store shows it as held (by E's owner) before the claim
	 * that issues its fence.  claim decides, never the look of it. */
	if (store_has_line(t) && e->place.rank)
		return claim_place(t, s, name, e);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc == 0) {
		/* Two threads blocked in flock on one descriptor: the second
		 * finds the lock already its own, as flock(2) would -- a grant
		 * of this daemon's, not a record that only names E's owner (a
		 * write of E's whose outcome was unknown, applied late, which
		 * the store's undo removes). */
		if (c && c->granted && c->rec.mode == e->mode &&
		    lockfs_fdlock_holder_of(s, name, &c->rec, e->owner, t->host) >= 0)
			return 0;
		if (c && c->rec.mode == LOCKFS_SHARED && e->mode == LOCKFS_SHARED &&
		    lockfs_table_issued_here(c) && lockfs_record_holders(&c->rec) > 0) {
			if (lockfs_record_holders(&c->rec) >= LOCKFS_SHARED_MAX)
				return -ENOLCK;
			rc = grant_reserve(t, name, e, true);
			if (rc < 0)
				return rc;
			rc = join_shared(t, s, c, &st, e);
			lockfs_quota_lock_unreserve(t->quota, e->who.uid, true);
			return rc;
		}
		return store_has_line(t) ? take_place(t, name, e, LOCKFS_ACQ_QUEUE) : -EAGAIN;
	}
	if (rc == -EIO)
		return rc; /* the store is broken (the backend said how): fail loudly */
	if (rc != -ENOENT)
		return -EAGAIN; /* the store cannot tell: keep waiting */
	rc = grant_reserve(t, name, e, true);
	if (rc < 0)
		return rc;
	rc = lockfs_grant_fd_record(t, name, e, &rec);
	if (rc < 0)
		goto out;
	rec.handed_by = handed_by;
	if (store_has_line(t) && !e->nowait) {
		/* Granted now, or a place at the tail of the store's line. */
		rc = lockfs_store_acquire(t->be, name, LOCKFS_ACQ_OR_QUEUE,
					  lockfs_table_grant_src(&g, &rec, 0), &e->place, &st);
		if (rc == -EINPROGRESS)
			e->be = t->be;
		else if (rc < 0)
			e->place = (struct lockfs_place){ 0 };
	} else {
		rc = lockfs_store_acquire(t->be, name, LOCKFS_ACQ_TRY,
					  lockfs_table_grant_src(&g, &rec, 0), NULL, &st);
	}
	if (rc < 0) {
		lockfs_record_clear(&rec);
		rc = rc == -EEXIST || rc == -EINPROGRESS ? -EAGAIN : rc;
		/* A store with sessions that cannot grant now (uncertain,
		 * unreachable, a lost session): a waiter stays parked and is
		 * tried again (each second, and on the next report). */
		if (store_has_line(t) && !e->nowait && (rc == -EIO || rc == -ESTALE))
			rc = -EAGAIN;
		goto out;
	}
	rc = grant_made(t, s, name, e, &g, &st);
out:
	lockfs_quota_lock_unreserve(t->quota, e->who.uid, true);
	return rc;
}

/* OWNER has just been granted MODE: its other requests for MODE, wherever
 * they wait, are answered too.  Two threads blocked in flock(2) on one
 * open file (or in F_SETLKW in one process) both return once it holds the
 * lock, as the kernel's locks do, even with another waiter between them. */
static void grant_same_owner(struct lockfs_table *t, struct stripe *s, struct lockq *q,
			     const char *owner, enum lockfs_mode mode)
{
	for (struct qentry *x = q ? q->head : NULL, *next; x; x = next) {
		next = x->next;
		if (x->w && x->mode == mode && strcmp(x->owner, owner) == 0) {
			complete(s, q->name, x, 0);
			active_end(t, q, x);
			queue_unlink(q, x);
		}
	}
}

/* lockfs_queue_grant_locked, right after request HANDED_BY let NAME go (0:
 * none): the first grant's record names it (record.handed_by). */
static void grant_queue(struct lockfs_table *t, struct stripe *s, const char *name,
			uint64_t handed_by)
{
	struct lockq *q = lockfs_queue_find(s, name);
	struct qentry *e;

	/* A resumed daemon grants nobody until every resent request is in:
	 * the one that waited longest may not have come back yet (resume.h). */
	if (!q || lockfs_table_resume_holding(t))
		return;
	purge_kept(q, lockfs_boot_ms());
	while ((e = next_active(t, q))) {
		int rc = try_grant(t, s, q->name, e, handed_by);

		if (rc == -EAGAIN) {
			/* The first waiter has no place in the store's line
			 * (etcd did not answer it): it asks now, and is in
			 * line (or granted) like the rest. */
			struct qentry *f = first_active(q);

			if (!f || f == e || !store_has_line(t) || f->place.rank || f->nowait)
				break;
			e = f;
			rc = try_grant(t, s, q->name, e, handed_by);
			if (rc == -EAGAIN)
				break;
		}
		if (rc == 0)
			handed_by = 0; /* the next one joins a shared lock */
		if (e->w)
			complete(s, q->name, e, rc); /* failed, or OWNER's already */
		active_end(t, q, e);
		if (rc == 0)
			grant_same_owner(t, s, q, e->owner, e->mode);
		queue_unlink(q, e);
	}
	queue_maybe_free(s, q);
}

void lockfs_queue_grant_locked(struct lockfs_table *t, struct stripe *s, const char *name)
{
	grant_queue(t, s, name, 0);
}

/* Give C's lock (being released, store identity IDENTITY) straight to the
 * queue's head by rewriting the record in place: nobody can take it in
 * between.  EVENT (unless NULL) is logged for the old holder with L.
 * true if handed off (C is then replaced in the cache); else *UNREACHABLE
 * is -EIO when the store could not be asked (nothing changed that we
 * know of: a plain release would only wait for it a second time). */
static bool handoff_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			   const struct lockfs_let_go *how, const struct end_line *l,
			   const char *event, int *unreachable)
{
	uint64_t identity = how->identity;
	struct lockq *q = lockfs_queue_find(s, c->name);
	struct qentry *e;
	struct lockfs_entry_stat st;
	struct lockfs_record rec;
	struct lockfs_grant_src g;
	struct lockfs_place place = { 0 };
	char *name;
	bool from_place;
	uid_t uid;
	int rc;

	*unreachable = 0;
	/* Held back (resume.h): the lock is let go, and the queue is served
	 * in order once every resent waiter is back in it.  Meanwhile a free
	 * name with waiters is theirs (mkdir says EEXIST, a newcomer waits). */
	if (lockfs_table_resume_holding(t))
		return false;
	/* The head's lock counts against its uid (the one it replaces goes):
	 * a waiter at its cap is answered EDQUOT, and the next one tried. */
	while ((e = next_active(t, q)) && (rc = grant_reserve(t, c->name, e, false)) < 0) {
		complete(s, c->name, e, rc);
		active_end(t, q, e);
		queue_unlink(q, e);
	}
	if (!e)
		return false;
	uid = e->who.uid;
	name = strdup(c->name);
	if (!name)
		goto unreserve;
	if (lockfs_grant_fd_record(t, name, e, &rec) < 0)
		goto unreserve;
	/* Which request let the old holder go: its resent copy is answered
	 * as it was (lockfs_core_release). */
	rec.handed_by = how->ticket;
	/* dir has no line of its own: the engine's queue is the whole line,
	 * and its head is the place handed to.  etcd: the head's place. */
	from_place = store_has_line(t) && e->place.rank;
	if (from_place)
		place = e->place;
	rc = lockfs_store_handoff(t->be, name, identity, &place,
				  lockfs_table_grant_src(&g, &rec, 0), &st);
	if (rc == 0 && from_place) {
		e->place = (struct lockfs_place){ 0 }; /* the lock now */
		lockfs_table_grant_fence(&g, &st);
	}
	if (rc == 1) {
		/* The old grant ended, but a contender ahead of ours in the
		 * store's line (another host's) is next: the head stays
		 * parked, and the store's change report brings it back. */
		lockfs_record_clear(&rec);
		if (event)
			lockfs_audit_end(t, l->who, name, l->kv, event, l->since_ms);
		lockfs_table_drop(t, s, name);
		lockfs_quota_lock_unreserve(t->quota, uid, false);
		free(name);
		return true;
	}
	if (rc < 0) {
		lockfs_record_clear(&rec);
		if (rc == -EIO)
			*unreachable = rc;
		goto unreserve;
	}
	/* In place, so nobody can take it in between.  The old holder's end
	 * is written first, whatever happens next; then the new holder's
	 * `acquired`, before the waiter is answered. */
	if (event)
		lockfs_audit_end(t, l->who, name, l->kv, event, l->since_ms);
	rc = lockfs_grant_log(t, name, &rec.holder, rec.slug, rec.fence, rec.mode, e);
	lockfs_table_drop(t, s, name); /* C: the old holder's, released */
	if (rc < 0) {
		/* The log refused the grant: the old holder's release stands,
		 * the waiter is told the error, the lock is let go (or retried
		 * like a refused release), and the queue is tried again. */
		lockfs_grant_undo_locked(t, s, name, st.identity, &rec, e->owner, rec.fence);
		complete(s, name, e, rc);
		active_end(t, q, e);
		queue_unlink(q, e);
		lockfs_quota_lock_unreserve(t->quota, uid, false);
		lockfs_queue_grant_locked(t, s, name);
		free(name);
		return true;
	}
	complete(s, name, e, 0);
	active_end(t, q, e);
	grant_same_owner(t, s, q, e->owner, e->mode);
	queue_unlink(q, e);
	lockfs_table_put_new(t, s, name, st.identity, &rec, -1);
	lockfs_record_clear(&rec);
	lockfs_quota_lock_unreserve(t->quota, uid, false);
	/* Shared requests right behind a shared head come along. */
	lockfs_queue_grant_locked(t, s, name);
	free(name);
	return true;
unreserve:
	lockfs_quota_lock_unreserve(t->quota, uid, false);
	free(name);
	return false;
}

int lockfs_queue_enter(struct lockfs_table *t, struct qentry *e, const struct lockfs_fd_request *rq,
		       struct lockfs_wait *w)
{
	const char *name = rq->name, *owner = rq->owner;
	struct stripe *s = lockfs_table_stripe(t, name);
	const int64_t asked_ms = lockfs_wall_ms(); /* a conversion lets go now */
	struct lockfs_entry_stat st;
	struct qentry *kept = NULL;
	struct lockq *q;
	struct held_lock *c;
	size_t ahead = 0;
	bool foreign, jumped = false;
	long held;
	int rc;

	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	/* Only a grant counts (see try_grant). */
	held = rc == 0 && c && c->granted ? lockfs_fdlock_holder_of(s, name, &c->rec, owner, t->host) : -1;
	if (held >= 0) {
		if (c->rec.mode == e->mode) {
			rc = 0; /* flock(2) again in the same mode: nothing to do */
			goto out;
		}
		/* Conversion, as flock(2) documents it: let go, then ask anew
		 * (the lock may go to a waiter in between). */
		if (!lockfs_table_issued_here(c)) {
			rc = -EPERM;
			goto out;
		}
		{
			uint64_t fence = lockfs_record_fence_at(&c->rec, (size_t)held);

			rc = lockfs_queue_let_go_locked(t, s, c, &(struct lockfs_let_go){
				.identity = st.identity, .index = (size_t)held, .event = "released" });
			/* As for an unlock the store refuses: the old grant
			 * ends once it can; this request waits behind it. */
			if (rc < 0 && rc != -ENOENT)
				lockfs_fdlock_retry_add(t, s, name, owner, fence, rc, true, asked_ms);
		}
	}
	q = lockfs_queue_find(s, name);
	purge_kept(q, lockfs_boot_ms());
	for (struct qentry *x = q ? q->head : NULL; x; x = x->next) {
		if (!x->w && strcmp(x->owner, owner) == 0) {
			kept = x; /* an interrupted request of ours, restarted */
			break;
		}
		if (x->w)
			ahead++;
	}
	e->nowait = !rq->wait;
	if (kept && kept->place.rank) {
		/* Its old place in the store's line comes back with it. */
		e->place = kept->place;
		e->be = kept->be;
		kept->place = (struct lockfs_place){ 0 };
	}
	/* While a resumed daemon holds (resume.h), a request that may wait
	 * waits: a resent one that asked before it may not be back yet. */
	if (ahead == 0 && !(rq->wait && lockfs_table_resume_holding(t))) {
		rc = try_grant(t, s, name, e, 0);
		if (rc != -EAGAIN) {
			if (kept)
				queue_unlink(q, kept);
			if (q)
				queue_maybe_free(s, q);
			goto out;
		}
	}
	if (!rq->wait) {
		rc = -EWOULDBLOCK;
		if (q)
			queue_maybe_free(s, q);
		goto out;
	}
	/* A parked request costs the daemon memory until it is answered. */
	if (lockfs_quota_waiter_add(t->quota, e->uid) < 0) {
		char who[WHO_MAX];

		lockfs_audit_who(who, sizeof(who), e->slug, e->who.comm, e->who.pid);
		lockfs_caller_refuse(t, e->uid, QUOTA_WAITERS_PER_UID, name, who, e->who.pid);
		rc = -EDQUOT;
		if (q)
			queue_maybe_free(s, q);
		goto out;
	}
	if (store_has_line(t) && !e->place.rank)
		take_place(t, name, e, LOCKFS_ACQ_QUEUE); /* behind local waiters */
	if (kept) {
		/* Back in its old place, with its old `since`. */
		kept->place = e->place;
		kept->be = e->be;
		e->place = (struct lockfs_place){ 0 };
		kept->w = w;
		kept->uid = e->uid;
		kept->who = e->who;
		kept->via_file = e->via_file;
		kept->mode = e->mode;
		lockfs_argv_free(kept->cmdline);
		kept->cmdline = e->cmdline;
		e->cmdline = NULL;
		free(kept->slug);
		kept->slug = e->slug;
		e->slug = NULL;
		q->nactive++;
		w->entry = kept;
	} else {
		q = queue_get(s, name);
		if (!q) {
			lockfs_quota_waiter_sub(t->quota, e->uid);
			rc = -ENOMEM;
			goto out;
		}
		e->w = w;
		queue_insert(q, e);
		q->nactive++;
		w->entry = e;
		/* A resent request back at the head, ahead of waiters that
		 * came after it: the lock may be free for it (not tried above). */
		jumped = ahead > 0 && first_active(q) == e;
		e = NULL;
	}
	w->parked = true;
	lockfs_grant_waiting(t, name, w->entry);
	rc = -EINPROGRESS;
	if (jumped)
		lockfs_queue_grant_locked(t, s, name); /* may answer W at once */
out:
	/* Granted now, or held already: through this open file from now on. */
	if (rc == 0 && rq->via_file)
		lockfs_fdlock_granted_via(s, name, owner, rq->via_file);
	if (e) {
		leave_place(name, e);
		lockfs_argv_free(e->cmdline);
		free(e->slug);
	}
	free(e);
	lockfs_table_unlock(s);
	return rc;
}

int lockfs_queue_cancel(struct lockfs_table *t, const char *name, struct lockfs_wait *w)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	struct qentry *e;
	struct lockq *q;

	pthread_mutex_lock(&s->mu);
	if (!w->parked) {
		lockfs_table_unlock(s);
		return -EALREADY;
	}
	e = w->entry;
	q = lockfs_queue_find(s, name);
	w->parked = false;
	w->entry = NULL;
	active_end(t, q, e);
	e->keep_until_ms = lockfs_boot_ms() + KEEP_MS;
	/* A shared request that waited behind this one may go now. */
	lockfs_queue_grant_locked(t, s, name);
	lockfs_table_unlock(s);
	return 0;
}

static void end_line_of(struct end_line *l, const struct lockfs_record *r, size_t i,
			const char *const *extra)
{
	const struct lockfs_holder *h = lockfs_record_holder(r, i);
	int n;

	lockfs_audit_who(l->who, sizeof(l->who), lockfs_record_slug_at(r, i), h->comm, h->pid);
	snprintf(l->fence, sizeof(l->fence), "%" PRIu64, lockfs_record_fence_at(r, i));
	lockfs_audit_ids(l->uid, l->pid, h->uid, h->pid);
	l->since_ms = i == 0 ? lockfs_holder_acquired_at(r) : r->shares[i - 1].acquired_at_ms;
	memcpy(l->kv, (const char *[]){ "fence", l->fence, "uid", l->uid, "pid", l->pid },
	       6 * sizeof(*l->kv));
	n = (int)lockfs_audit_put_container(l->kv, 6, h->container);
	for (; extra && *extra && n < (int)(sizeof(l->kv) / sizeof(l->kv[0])) - 2; extra++)
		l->kv[n++] = *extra;
	l->kv[n] = NULL;
}

/* The whole lock goes (see lockfs_queue_let_go_locked). */
static int release_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			  const struct lockfs_let_go *how)
{
	const char *event = c->unlogged ? NULL : how->event; /* no `acquired` logged either */
	struct end_line l;
	char *name = strdup(c->name);
	int rc, unreachable;

	if (!name)
		return -ENOMEM;
	end_line_of(&l, &c->rec, 0, how->extra);
	/* Someone waits: the lock goes straight to them, the store never
	 * shows it free in between.  EVENT is logged there, then the
	 * waiter's `acquired`, both before the waiter has its answer. */
	if (handoff_locked(t, s, c, how, &l, event, &unreachable)) {
		free(name);
		return 0;
	}
	/* The store did not answer the hand-off: one bounded wait per op
	 * (an rmdir holds the directory's lock), and the release is retried
	 * as any refused one is. */
	if (unreachable) {
		free(name);
		return unreachable;
	}
	rc = lockfs_store_release(t->be, name, how->identity);
	if (rc < 0 && rc != -ENOENT) {
		/* The store refused (EIO, said by the backend): the lock is
		 * still held, so it stays cached and its holder watched, and
		 * nothing is logged.  A recovery is tried again at the next
		 * tick (holder_gone stays set); an rmdir gets the error. */
		free(name);
		return rc;
	}
	/* The line is written only for a release that happened (-ENOENT:
	 * the lock was removed behind our back, a loss on a store with
	 * sessions), and before the stripe mutex is let go: NAME may be free
	 * in the store already, but nobody can be granted it through this
	 * daemon until then -- a hand-off or a grant to the queue runs under
	 * this mutex, and an acquisition logs its `acquired` only after it
	 * has taken this mutex (lockfs_core_acquire) -- so the log never
	 * shows two holders at once.  (A seed script's mkdir is not logged
	 * at all.) */
	if (rc == 0 && event)
		lockfs_audit_end(t, l.who, name, l.kv, event, l.since_ms);
	else if (rc == -ENOENT && t->vanished)
		t->vanished(t, s, c, NULL); /* session.c: logged `lost`, tombstoned */
	lockfs_table_drop(t, s, name);
	grant_queue(t, s, name, how->ticket);
	free(name);
	return rc;
}

/* One holder of several leaves the record; the others keep the lock. */
static int drop_share_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			     const struct lockfs_let_go *how)
{
	struct lockfs_record *r = &c->rec;
	struct lockfs_entry_stat st = { .identity = how->identity };
	size_t i = how->index;
	struct end_line l;
	int rc;

	end_line_of(&l, r, i, how->extra);
	/* Before it leaves the record. */
	lockfs_quota_locks_add(t->quota, lockfs_record_holder(r, i)->uid, -1);
	if (i == 0) {
		/* The next holder moves up; the lock (its fence, its time)
		 * stays what it was. */
		lockfs_table_unwatch(t, c);
		lockfs_holder_clear(&r->holder);
		r->holder = r->shares[0].holder;
		r->holder_fence = r->shares[0].fence;
		r->holder_acquired_at_ms = r->shares[0].acquired_at_ms;
		r->bound = r->shares[0].bound;
		memcpy(r->fd_owner, r->shares[0].fd_owner, sizeof(r->fd_owner));
		r->via_file = r->shares[0].via_file;
		r->ticket = 0; /* the request that asked was another holder's */
		free(r->slug);
		r->slug = r->shares[0].slug;
		c->holder_gone = false;
		i = 1;
	} else {
		lockfs_holder_clear(&r->shares[i - 1].holder);
		free(r->shares[i - 1].slug);
	}
	memmove(&r->shares[i - 1], &r->shares[i], (r->nshares - i) * sizeof(*r->shares));
	if (--r->nshares == 0) {
		free(r->shares);
		r->shares = NULL;
	}
	rc = lockfs_table_persist(t, s, c, &st);
	if (rc == 0) {
		/* Logged once the store no longer lists this holder, under
		 * the stripe mutex (see release_locked). */
		if (how->event)
			lockfs_audit_end(t, l.who, c->name, l.kv, how->event, l.since_ms);
		lockfs_table_watch(t, c, -1);
		lockfs_queue_grant_locked(t, s, c->name);
	}
	return rc;
}

int lockfs_queue_let_go_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			       const struct lockfs_let_go *how)
{
	if (how->all || lockfs_record_holders(&c->rec) <= 1)
		return release_locked(t, s, c, how);
	return drop_share_locked(t, s, c, how);
}

void lockfs_queue_poll_locked(struct lockfs_table *t, struct stripe *s)
{
	for (struct lockq *q = s->queues, *next; q; q = next) {
		next = q->next;
		lockfs_queue_grant_locked(t, s, q->name);
	}
}

void lockfs_queue_forget_kept(struct stripe *s, const char *name, const char *owner)
{
	struct lockq *q = lockfs_queue_find(s, name);

	for (struct qentry *x = q ? q->head : NULL, *next; x; x = next) {
		next = x->next;
		if (!x->w && strcmp(x->owner, owner) == 0)
			queue_unlink(q, x);
	}
	if (q)
		queue_maybe_free(s, q);
}

void lockfs_queue_rejoin_locked(struct lockfs_table *t, struct stripe *s, int64_t session)
{
	for (struct lockq *q = s->queues, *qnext; q; q = qnext) {
		qnext = q->next;
		for (struct qentry *e = q->head, *next; e; e = next) {
			char who[WHO_MAX], uid[16], pid[16], old[24];
			const char *kv[] = { "uid", uid, "pid", pid, "session", old, NULL };

			next = e->next;
			if (!e->place.rank || e->place.session == session)
				continue;
			snprintf(old, sizeof(old), "%016" PRIx64, (uint64_t)e->place.session);
			/* The old place went with its session: nothing to leave. */
			e->place = (struct lockfs_place){ 0 };
			if (!e->w) {
				queue_unlink(q, e); /* a kept place of the old session */
				continue;
			}
			take_place(t, q->name, e, LOCKFS_ACQ_QUEUE);
			lockfs_audit_who(who, sizeof(who), e->slug, e->who.comm, e->who.pid);
			lockfs_audit_ids(uid, pid, e->who.uid, e->who.pid);
			lockfs_audit_event(t, who, q->name, kv, "requeued");
		}
		if (first_active(q))
			lockfs_queue_grant_locked(t, s, q->name);
		else
			queue_maybe_free(s, q);
	}
}
