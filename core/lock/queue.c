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
 *    place (queue_handoff_locked): the store never shows the lock free in
 *    between, so no mkdir, no LOCK_NB and no seed script can barge.
 *  - An interrupted waiter leaves the queue, but its place is kept for
 *    KEEP_MS for the same lock owner: the kernel restarts an interrupted
 *    flock (SA_RESTART, Ctrl-Z + fg) as a new request.  Grants skip kept
 *    places.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/name.h"
#include "base/clock.h"
#include "table.h"

/* How long an interrupted waiter's place is kept. */
#define KEEP_MS 1000

struct lockq *queue_find(struct stripe *s, const char *name)
{
	for (struct lockq *q = s->queues; q; q = q->next)
		if (strcmp(q->name, name) == 0)
			return q;
	return NULL;
}

static struct lockq *queue_get(struct stripe *s, const char *name)
{
	struct lockq *q = queue_find(s, name);

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

static void queue_unlink(struct lockq *q, struct qentry *e)
{
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

void queue_free_all(struct stripe *s)
{
	lockfs_fdlock_free_all(s);
	/* Retries not done by now are lost: the lock stays in DIR and the
	 * next start rebinds it to its holder process (fail closed). */
	while (s->retries) {
		struct unlock_retry *r = s->retries;

		s->retries = r->next;
		free(r->name);
		free(r);
	}
	while (s->queues) {
		struct lockq *q = s->queues;

		while (q->head)
			queue_unlink(q, q->head);
		queue_maybe_free(s, q);
	}
}

/* Answer E's parked request for NAME with RESULT now, under the stripe
 * mutex: the waiter runs as soon as possible (a hand-off's latency is
 * this).  A grant's `acquired` line is written before (no grant without
 * its line), and the open file it came through remembered.  DONE must
 * not call back into the engine. */
static void complete(struct stripe *s, const char *name, struct qentry *e, int result)
{
	struct lockfs_wait *w = e->w;

	if (result == 0 && e->via_file)
		lockfs_fdlock_granted_via(s, name, e->owner, e->via_file);
	w->parked = false;
	w->entry = NULL;
	w->done(w, result);
}

/* E's parked request was answered or taken back: it waits no more. */
static void active_end(struct lockfs_core *core, struct lockq *q, struct qentry *e)
{
	e->w = NULL;
	q->nactive--;
	quota_waiter_sub(core->quota, e->uid);
}

/* The lock E would be granted counts against E's holder-to-be: room for
 * it, or -EDQUOT / -ENOSPC (logged as a refusal).  GROWS as for
 * quota_lock_reserve; undone by quota_lock_unreserve(.., e->who.uid, ..). */
static int grant_reserve(struct lockfs_core *core, const char *name, struct qentry *e,
			 bool grows)
{
	enum quota_reason why;
	int rc = quota_lock_reserve(core->quota, e->who.uid, grows, &why);

	if (rc < 0) {
		char who[WHO_MAX];

		who_of(who, sizeof(who), e->slug, e->who.comm, e->who.pid);
		quota_refuse(core, e->who.uid, why, name, who, e->who.pid);
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

static void purge_kept(struct lockq *q, int64_t now)
{
	for (struct qentry *e = q ? q->head : NULL, *next; e; e = next) {
		next = e->next;
		if (!e->w && now >= e->keep_until_ms)
			queue_unlink(q, e);
	}
}

/* Is holder I of REC (see drop_holder_locked) OWNER's grant?  FENCE 0:
 * any of OWNER's grants. */
static bool holder_is(const struct lockfs_record *rec, size_t i, const char *owner,
		      uint64_t fence)
{
	const char *o = i == 0 ? rec->fd_owner : rec->shares[i - 1].fd_owner;
	enum lockfs_bound b = i == 0 ? rec->bound : rec->shares[i - 1].bound;
	uint64_t f = i == 0 ? lockfs_holder_fence(rec) : rec->shares[i - 1].fence;

	return b == LOCKFS_BOUND_FD && strcmp(o, owner) == 0 && (fence == 0 || f == fence);
}

static struct unlock_retry *retry_find(struct stripe *s, const char *name, const char *owner,
				       uint64_t fence)
{
	for (struct unlock_retry *r = s->retries; r; r = r->next)
		if (strcmp(r->name, name) == 0 && strcmp(r->owner, owner) == 0 &&
		    r->fence == fence)
			return r;
	return NULL;
}

/*
 * Which holder of NAME's record REC is OWNER's?  Its index or -1.  A grant
 * that OWNER let go but the store still holds (struct unlock_retry) is not
 * OWNER's any more: the key may already name a new open file or process.
 */
static long holder_of_owner(struct stripe *s, const char *name,
			    const struct lockfs_record *rec, const char *owner)
{
	for (size_t i = 0; rec->has_holder && i <= rec->nshares; i++) {
		if (!holder_is(rec, i, owner, 0))
			continue;
		if (!s->retries || !retry_find(s, name, owner, i == 0 ? lockfs_holder_fence(rec)
								  : rec->shares[i - 1].fence))
			return (long)i;
	}
	return -1;
}

/*
 * OWNER let go of its grant FENCE of NAME but the store could not be
 * written (ERR): the lock stays in DIR, held by nobody (fail closed).
 * Remember it, so that the tick ends it once the store takes writes
 * again; its `released` line is written then if LOGGED (its `acquired`
 * is in the log; not for a grant the log refused).  What is wrong with
 * the store was said by the backend, once: nothing is said per release.
 */
static void retry_add(struct stripe *s, const char *name, const char *owner, uint64_t fence,
		      int err, bool logged)
{
	struct unlock_retry *r = calloc(1, sizeof(*r));

	if (!r || !(r->name = strdup(name))) {
		free(r);
		fprintf(stderr, "lockfs: %s: releasing %s failed (%s); kept until the daemon "
			"restarts (out of memory)\n", name, owner, strerror(-err));
		return;
	}
	snprintf(r->owner, sizeof(r->owner), "%s", owner);
	r->fence = fence;
	r->logged = logged;
	r->next = s->retries;
	s->retries = r;
}

bool retry_pending_locked(struct stripe *s, const char *name, const struct lockfs_record *rec,
			  size_t i)
{
	if (!s->retries || !rec->has_holder || i > rec->nshares)
		return false;
	if ((i == 0 ? rec->bound : rec->shares[i - 1].bound) != LOCKFS_BOUND_FD)
		return false;
	return retry_find(s, name, i == 0 ? rec->fd_owner : rec->shares[i - 1].fd_owner,
			  i == 0 ? lockfs_holder_fence(rec) : rec->shares[i - 1].fence) != NULL;
}

const char *release_event_locked(struct stripe *s, const char *name,
				 const struct lockfs_record *rec, size_t i)
{
	struct unlock_retry *r;

	if (!retry_pending_locked(s, name, rec, i))
		return "released";
	r = retry_find(s, name, i == 0 ? rec->fd_owner : rec->shares[i - 1].fd_owner,
		       i == 0 ? lockfs_holder_fence(rec) : rec->shares[i - 1].fence);
	return r && !r->logged ? NULL : "released";
}

/* The record of a new fd holder E of NAME (E's cmdline goes into it). */
static int build_fd_record(struct lockfs_core *core, const char *name, struct qentry *e,
			   struct lockfs_record *rec)
{
	int rc = build_record(core, name, &e->who, NULL, rec, &e->cmdline);

	if (rc < 0)
		return rc;
	/* A slug names the holder in the log (issue 2's WHO) and in owner;
	 * the lock stays bound to the descriptor, with no lease. */
	if (e->slug && !(rec->slug = strdup(e->slug))) {
		lockfs_record_clear(rec);
		return -ENOMEM;
	}
	rec->bound = LOCKFS_BOUND_FD;
	rec->mode = e->mode;
	snprintf(rec->fd_owner, sizeof(rec->fd_owner), "%s", e->owner);
	return 0;
}

/* The `acquired` line of NAME's grant to H, now or not at all: 0, or the
 * -errno of the failed write (the caller takes the grant back). */
static int log_granted(struct lockfs_core *core, const char *name,
		       const struct lockfs_holder *h, const char *slug, uint64_t fence,
		       enum lockfs_mode mode)
{
	char who[WHO_MAX], f[24], uid[16], pid[16];
	const char *kv[] = { "fence", f, "uid", uid, "pid", pid, "bound", "fd",
			     "mode", mode == LOCKFS_SHARED ? "shared" : "exclusive", NULL };

	who_of(who, sizeof(who), slug, h->comm, h->pid);
	snprintf(f, sizeof(f), "%" PRIu64, fence);
	ids_of(uid, pid, h->uid, h->pid);
	return log_acquired(core, who, name, kv);
}

/*
 * Take back NAME's grant FENCE to OWNER, just stored (identity IDENTITY,
 * record REC) but refused by the log: the store lets it go, or, if it
 * cannot, the grant is cached and retried like a release the store
 * refused (struct unlock_retry) -- held by nobody meanwhile, never by the
 * owner, who is told it failed.  With s->mu held; clears REC.
 */
static void undo_grant_locked(struct lockfs_core *core, struct stripe *s, const char *name,
			      uint64_t identity, struct lockfs_record *rec,
			      const char *owner, uint64_t fence)
{
	int rc = core->be->ops->release(core->be, name, identity);

	if (rc < 0 && rc != -ENOENT) {
		cache_put(core, s, name, identity, rec, -1, true);
		retry_add(s, name, owner, fence, rc, false);
	}
	lockfs_record_clear(rec);
}

/* E joins C's shared lock as one more holder.  0, -ENOLCK (full),
 * -EAGAIN (not now), or the log's -errno (E is refused). */
static int join_shared(struct lockfs_core *core, struct stripe *s, struct cached *c,
		       struct lockfs_entry_stat *st, struct qentry *e)
{
	struct lockfs_record fresh;
	struct lockfs_share *v;
	int rc;

	/* Every holder must fit in a record the store can give back. */
	if (holder_count(&c->rec) >= LOCKFS_SHARED_MAX)
		return -ENOLCK;
	if (build_fd_record(core, c->name, e, &fresh) < 0)
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
	v->fence = fresh.fence;
	v->acquired_at_ms = fresh.acquired_at_ms;
	v->slug = fresh.slug;
	fresh.slug = NULL;
	lockfs_record_clear(&fresh);
	quota_locks_add(core->quota, v->holder.uid, 1); /* as cache_account would */
	if (persist_locked(core, s, c, st) < 0)
		return -EAGAIN; /* the store cannot tell: keep waiting */
	v = &c->rec.shares[c->rec.nshares - 1];
	rc = log_granted(core, c->name, &v->holder, v->slug, v->fence, LOCKFS_SHARED);
	if (rc < 0) {
		/* The log refused: this share goes again, the others stay. */
		uint64_t fence = v->fence;
		char *name = strdup(c->name);
		struct lockfs_entry_stat now = { .identity = c->identity };
		int urc;

		quota_locks_add(core->quota, v->holder.uid, -1); /* before it leaves */
		lockfs_holder_clear(&v->holder);
		free(v->slug);
		if (--c->rec.nshares == 0) {
			free(c->rec.shares);
			c->rec.shares = NULL;
		}
		urc = persist_locked(core, s, c, &now);
		if (urc < 0 && name)
			retry_add(s, name, e->owner, fence, urc, false);
		free(name);
		return rc;
	}
	if (e->w) {
		complete(s, c->name, e, 0);
		e->w = NULL;
	}
	return 0;
}

/*
 * Grant E now if NAME's state allows: take the free lock, or join a shared
 * one.  0: granted (E's parked request, if any, answered, and E->w
 * cleared); -EAGAIN: not now; -errno: E cannot be granted at all.
 */
static int try_grant(struct lockfs_core *core, struct stripe *s, const char *name,
		     struct qentry *e)
{
	struct lockfs_entry_stat st;
	struct lockfs_record rec;
	struct cached *c;
	bool foreign;
	size_t len;
	char *json;
	int rc = load_locked(core, s, name, &st, &foreign, false, &c);

	if (rc == 0) {
		/* Two threads blocked in flock on one descriptor: the second
		 * finds the lock already its own, as flock(2) would. */
		if (c && c->rec.mode == e->mode && holder_of_owner(s, name, &c->rec, e->owner) >= 0)
			return 0;
		if (c && c->rec.mode == LOCKFS_SHARED && e->mode == LOCKFS_SHARED &&
		    strcmp(c->issued, c->rec.token) == 0 && holder_count(&c->rec) > 0) {
			if (holder_count(&c->rec) >= LOCKFS_SHARED_MAX)
				return -ENOLCK;
			rc = grant_reserve(core, name, e, true);
			if (rc < 0)
				return rc;
			rc = join_shared(core, s, c, &st, e);
			quota_lock_unreserve(core->quota, e->who.uid, true);
			return rc;
		}
		return -EAGAIN;
	}
	if (rc == -EIO)
		return rc; /* the store is broken (the backend said how): fail loudly */
	if (rc != -ENOENT)
		return -EAGAIN; /* the store cannot tell: keep waiting */
	rc = grant_reserve(core, name, e, true);
	if (rc < 0)
		return rc;
	rc = build_fd_record(core, name, e, &rec);
	if (rc < 0)
		goto out;
	json = lockfs_record_encode(&rec, LOCKFS_RECORD_WITH_TOKEN, &len);
	if (!json) {
		lockfs_record_clear(&rec);
		rc = -ENOMEM;
		goto out;
	}
	rc = core->be->ops->acquire(core->be, name, json, len, &st);
	free(json);
	if (rc < 0) {
		lockfs_record_clear(&rec);
		rc = rc == -EEXIST ? -EAGAIN : rc;
		goto out;
	}
	/* Its line before its answer: nobody holds a lock the log does not
	 * show. */
	rc = log_granted(core, name, &rec.holder, rec.slug, rec.fence, rec.mode);
	if (rc < 0) {
		undo_grant_locked(core, s, name, st.identity, &rec, e->owner, rec.fence);
		goto out;
	}
	if (e->w) {
		complete(s, name, e, 0);
		e->w = NULL;
	}
	cache_put(core, s, name, st.identity, &rec, -1, true);
	lockfs_record_clear(&rec);
out:
	quota_lock_unreserve(core->quota, e->who.uid, true);
	return rc;
}

/* OWNER has just been granted MODE: its other requests for MODE, wherever
 * they wait, are answered too.  Two threads blocked in flock(2) on one
 * open file (or in F_SETLKW in one process) both return once it holds the
 * lock, as the kernel's locks do, even with another waiter between them. */
static void grant_same_owner(struct lockfs_core *core, struct stripe *s, struct lockq *q,
			     const char *owner, enum lockfs_mode mode)
{
	for (struct qentry *x = q ? q->head : NULL, *next; x; x = next) {
		next = x->next;
		if (x->w && x->mode == mode && strcmp(x->owner, owner) == 0) {
			complete(s, q->name, x, 0);
			active_end(core, q, x);
			queue_unlink(q, x);
		}
	}
}

void queue_grant_locked(struct lockfs_core *core, struct stripe *s, const char *name)
{
	struct lockq *q = queue_find(s, name);
	struct qentry *e;

	if (!q)
		return;
	purge_kept(q, lockfs_boot_ms());
	while ((e = first_active(q))) {
		int rc = try_grant(core, s, q->name, e);

		if (rc == -EAGAIN)
			break;
		if (e->w)
			complete(s, q->name, e, rc); /* failed, or OWNER's already */
		active_end(core, q, e);
		if (rc == 0)
			grant_same_owner(core, s, q, e->owner, e->mode);
		queue_unlink(q, e);
	}
	queue_maybe_free(s, q);
}

bool queue_handoff_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
			  uint64_t identity, const char *who, const char *const *kv,
			  const char *event)
{
	struct lockq *q = queue_find(s, c->name);
	struct qentry *e;
	struct lockfs_entry_stat st;
	struct lockfs_record rec;
	char *name, *json;
	size_t len;
	uid_t uid;
	int rc;

	/* The head's lock counts against its uid (the one it replaces goes):
	 * a waiter at its cap is answered EDQUOT, and the next one tried. */
	while ((e = first_active(q)) && (rc = grant_reserve(core, c->name, e, false)) < 0) {
		complete(s, c->name, e, rc);
		active_end(core, q, e);
		queue_unlink(q, e);
	}
	if (!e)
		return false;
	uid = e->who.uid;
	name = strdup(c->name);
	if (!name)
		goto unreserve;
	if (build_fd_record(core, name, e, &rec) < 0)
		goto unreserve;
	json = lockfs_record_encode(&rec, LOCKFS_RECORD_WITH_TOKEN, &len);
	if (!json) {
		lockfs_record_clear(&rec);
		goto unreserve;
	}
	rc = core->be->ops->update(core->be, name, identity, json, len, &st);
	free(json);
	if (rc < 0) {
		lockfs_record_clear(&rec);
		goto unreserve;
	}
	/* In place, so nobody can take it in between.  The old holder's end
	 * is written first, whatever happens next; then the new holder's
	 * `acquired`, before the waiter is answered. */
	if (event)
		log_event(core, who, name, kv, event);
	rc = log_granted(core, name, &rec.holder, rec.slug, rec.fence, rec.mode);
	cache_drop(core, s, name); /* C: the old holder's, released */
	if (rc < 0) {
		/* The log refused the grant: the old holder's release stands,
		 * the waiter is told the error, the lock is let go (or retried
		 * like a refused release), and the queue is tried again. */
		undo_grant_locked(core, s, name, st.identity, &rec, e->owner, rec.fence);
		complete(s, name, e, rc);
		active_end(core, q, e);
		queue_unlink(q, e);
		quota_lock_unreserve(core->quota, uid, false);
		queue_grant_locked(core, s, name);
		free(name);
		return true;
	}
	complete(s, name, e, 0);
	active_end(core, q, e);
	grant_same_owner(core, s, q, e->owner, e->mode);
	queue_unlink(q, e);
	cache_put(core, s, name, st.identity, &rec, -1, true);
	lockfs_record_clear(&rec);
	quota_lock_unreserve(core->quota, uid, false);
	/* Shared requests right behind a shared head come along. */
	queue_grant_locked(core, s, name);
	free(name);
	return true;
unreserve:
	quota_lock_unreserve(core->quota, uid, false);
	free(name);
	return false;
}

int lockfs_core_fd_lock(struct lockfs_core *core, const struct lockfs_caller *caller,
			const struct lockfs_fd_request *rq, struct lockfs_wait *w)
{
	const char *name = rq->name, *owner = rq->owner;
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct qentry *e = NULL, *kept = NULL;
	struct lockq *q;
	struct cached *c;
	size_t ahead = 0;
	bool foreign;
	long held;
	int rc;

	rc = lockfs_name_check(name);
	if (rc < 0)
		return rc;
	if (strlen(owner) >= LOCKFS_FD_OWNER_MAX)
		return -EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	rc = lockfs_holder_resolve(core->procs, caller->tid, caller->uid, &core->helpers,
				   LOCKFS_PROC_NS, &e->who);
	if (rc < 0) {
		free(e);
		return rc == -ESRCH ? -EACCES : rc;
	}
	if (!e->who.have_ids) {
		e->who.uid = caller->uid;
		e->who.gid = caller->gid;
	}
	snprintf(e->owner, sizeof(e->owner), "%s", owner);
	e->via_file = rq->via_file;
	e->mode = rq->mode;
	e->uid = caller->uid;
	e->gid = caller->gid;
	e->since_ms = lockfs_wall_ms();
	/* Read now, not at the grant: a hand-off should do no /proc read. */
	if (lockfs_procs_cmdline(core->procs, e->who.pid, 4096, &e->cmdline) < 0)
		e->cmdline = NULL;
	{
		/* The caller's LOCKFS_SLUG names the holder (lockctl --slug);
		 * a bad one reads as none here rather than failing flock. */
		char slug[LOCKFS_SLUG_MAX];

		if (caller_slug(core->procs, caller->tid, slug, sizeof(slug)) == 0 && *slug)
			e->slug = strdup(slug);
	}

	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	held = rc == 0 && c ? holder_of_owner(s, name, &c->rec, owner) : -1;
	if (held >= 0) {
		if (c->rec.mode == e->mode) {
			rc = 0; /* flock(2) again in the same mode: nothing to do */
			goto out;
		}
		/* Conversion, as flock(2) documents it: let go, then ask anew
		 * (the lock may go to a waiter in between). */
		if (strcmp(c->issued, c->rec.token) != 0) {
			rc = -EPERM;
			goto out;
		}
		{
			uint64_t fence = held == 0 ? lockfs_holder_fence(&c->rec)
						   : c->rec.shares[held - 1].fence;

			rc = drop_holder_locked(core, s, c, st.identity, (size_t)held,
						"released", NULL);
			/* As for an unlock the store refuses: the old grant
			 * ends once it can; this request waits behind it. */
			if (rc < 0 && rc != -ENOENT)
				retry_add(s, name, owner, fence, rc, true);
		}
	}
	q = queue_find(s, name);
	purge_kept(q, lockfs_boot_ms());
	for (struct qentry *x = q ? q->head : NULL; x; x = x->next) {
		if (!x->w && strcmp(x->owner, owner) == 0) {
			kept = x; /* an interrupted request of ours, restarted */
			break;
		}
		if (x->w)
			ahead++;
	}
	if (ahead == 0) {
		rc = try_grant(core, s, name, e);
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
	if (quota_waiter_add(core->quota, e->uid) < 0) {
		char who[WHO_MAX];

		who_of(who, sizeof(who), e->slug, e->who.comm, e->who.pid);
		quota_refuse(core, e->uid, QUOTA_WAITERS_PER_UID, name, who, e->who.pid);
		rc = -EDQUOT;
		if (q)
			queue_maybe_free(s, q);
		goto out;
	}
	if (kept) {
		/* Back in its old place, with its old `since`. */
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
			quota_waiter_sub(core->quota, e->uid);
			rc = -ENOMEM;
			goto out;
		}
		e->w = w;
		e->prev = q->tail;
		if (q->tail)
			q->tail->next = e;
		else
			q->head = e;
		q->tail = e;
		q->nactive++;
		w->entry = e;
		e = NULL;
	}
	w->parked = true;
	rc = -EINPROGRESS;
out:
	/* Granted now, or held already: through this open file from now on. */
	if (rc == 0 && rq->via_file)
		lockfs_fdlock_granted_via(s, name, owner, rq->via_file);
	if (e) {
		lockfs_argv_free(e->cmdline);
		free(e->slug);
	}
	free(e);
	stripe_unlock(s);
	return rc;
}

int lockfs_core_fd_cancel(struct lockfs_core *core, const char *name, struct lockfs_wait *w)
{
	struct stripe *s = stripe_of(core, name);
	struct qentry *e;
	struct lockq *q;

	pthread_mutex_lock(&s->mu);
	if (!w->parked) {
		stripe_unlock(s);
		return -EALREADY;
	}
	e = w->entry;
	q = queue_find(s, name);
	w->parked = false;
	w->entry = NULL;
	active_end(core, q, e);
	e->keep_until_ms = lockfs_boot_ms() + KEEP_MS;
	/* A shared request that waited behind this one may go now. */
	queue_grant_locked(core, s, name);
	stripe_unlock(s);
	return 0;
}

/* Try S's retries once each; a retry ends when its grant is gone. */
static void retry_tick_locked(struct lockfs_core *core, struct stripe *s)
{
	for (struct unlock_retry **pp = &s->retries, *r; (r = *pp);) {
		struct lockfs_entry_stat st;
		struct cached *c;
		bool foreign, done = true;
		int rc = load_locked(core, s, r->name, &st, &foreign, false, &c);

		if (rc == 0 && c && strcmp(c->issued, c->rec.token) == 0) {
			for (size_t i = 0; c->rec.has_holder && i <= c->rec.nshares; i++) {
				if (!holder_is(&c->rec, i, r->owner, r->fence))
					continue;
				/* Nothing was logged at the first try; nothing
				 * at all for a grant the log refused. */
				rc = drop_holder_locked(core, s, c, st.identity, i,
							r->logged ? "released" : NULL, NULL);
				done = rc == 0 || rc == -ENOENT;
				break;
			}
		} else if (rc < 0 && rc != -ENOENT) {
			done = false; /* the store cannot tell yet */
		}
		if (!done) {
			pp = &r->next;
			continue;
		}
		*pp = r->next;
		free(r->name);
		free(r);
	}
}

void queue_retry_all(struct lockfs_core *core)
{
	for (int i = 0; i < STRIPES; i++) {
		struct stripe *s = &core->stripes[i];

		pthread_mutex_lock(&s->mu);
		if (s->retries)
			retry_tick_locked(core, s);
		stripe_unlock(s);
	}
}

int lockfs_core_fd_unlock(struct lockfs_core *core, const char *name, const char *owner)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	struct lockq *q;
	bool foreign;
	long held;
	int rc;

	if (lockfs_name_check(name) < 0)
		return 0;
	pthread_mutex_lock(&s->mu);
	/* The owner lets go: a place kept for it is no longer wanted. */
	q = queue_find(s, name);
	for (struct qentry *x = q ? q->head : NULL, *next; x; x = next) {
		next = x->next;
		if (!x->w && strcmp(x->owner, owner) == 0)
			queue_unlink(q, x);
	}
	if (q)
		queue_maybe_free(s, q);
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	held = rc == 0 && c ? holder_of_owner(s, name, &c->rec, owner) : -1;
	rc = 0;
	if (held >= 0) {
		if (strcmp(c->issued, c->rec.token) != 0) {
			/* Rewritten behind our back: keep it, say so (whose it
			 * is, the record cannot be trusted to tell). */
			const char *kv[] = { "uid", "", "pid", "", "reason", "token-mismatch", NULL };

			log_event(core, "?", name, kv, "denied");
			rc = -EPERM;
		} else {
			uint64_t fence = held == 0 ? lockfs_holder_fence(&c->rec)
						   : c->rec.shares[held - 1].fence;

			rc = drop_holder_locked(core, s, c, st.identity, (size_t)held,
						"released", NULL);
			if (rc < 0 && rc != -ENOENT)
				retry_add(s, name, owner, fence, rc, true);
		}
	}
	stripe_unlock(s);
	return rc;
}

void lockfs_core_fd_file_closed(struct lockfs_core *core, const char *name, uint64_t file)
{
	struct stripe *s = stripe_of(core, name);
	struct fdlock_via *taken;

	if (!file)
		return;
	pthread_mutex_lock(&s->mu);
	taken = lockfs_fdlock_take_file(s, name, file);
	stripe_unlock(s);
	/* Each unlock takes the stripe mutex again: it may hand NAME on. */
	for (struct fdlock_via *v = taken; v; v = v->next)
		lockfs_core_fd_unlock(core, name, v->owner);
	lockfs_fdlock_free(taken);
}

int lockfs_core_fd_test(struct lockfs_core *core, const struct lockfs_fd_request *rq,
			struct lockfs_fd_conflict *out)
{
	const char *name = rq->name, *owner = rq->owner;
	bool shared = rq->mode == LOCKFS_SHARED;
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -EINVAL;
	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	if (rc == -ENOENT) {
		rc = 0;
	} else if (rc == 0 && !c) {
		out->shared = false; /* a foreign lock: exclusive, holder unknown */
		out->pid = 0;
		rc = 1;
	} else if (rc == 0) {
		long mine = holder_of_owner(s, name, &c->rec, owner);
		bool others = holder_count(&c->rec) > (mine >= 0 ? 1u : 0u);
		struct lockq *q = queue_find(s, name);

		/* POSIX: a process's own lock never conflicts with itself.  A
		 * shared request may join readers only with nobody queued
		 * ahead (as F_SETLK would find). */
		if (others && (!(shared && c->rec.mode == LOCKFS_SHARED) || (q && q->nactive))) {
			out->shared = c->rec.mode == LOCKFS_SHARED;
			out->pid = mine == 0 && c->rec.nshares ? c->rec.shares[0].holder.pid
							       : c->rec.holder.pid;
			rc = 1;
		}
	}
	stripe_unlock(s);
	return rc;
}

/* Where a view of the queue puts its text. */
struct queue_text {
	char **text;
	size_t *len;
	struct stripe *s;
};

static int view_waiters(struct stripe *s, const char *name, char **text, size_t *len)
{
	struct lockq *q = queue_find(s, name);
	size_t used = 0, cap = 64;
	char *buf = malloc(cap);

	if (!buf)
		return -ENOMEM;
	buf[0] = '\0';
	for (struct qentry *e = q ? q->head : NULL; e; e = e->next) {
		char when[32], *line;
		json_t *o;
		size_t n;

		if (!e->w)
			continue;
		/* comm is any bytes (prctl): "o" takes the lossy string. */
		o = json_pack("{s:i, s:o, s:o, s:o, s:i, s:s, s:s, s:s}",
			      "pid", (int)e->who.pid,
			      "ns_pid", e->who.ns_pid > 0 ? json_integer(e->who.ns_pid) : json_null(),
			      "container", e->who.container[0]
					   ? lockfs_json_string_lossy(e->who.container) : json_null(),
			      "comm", lockfs_json_string_lossy(e->who.comm),
			      "uid", (int)e->uid,
			      "mode", e->mode == LOCKFS_SHARED ? "shared" : "exclusive",
			      "kind", strncmp(e->owner, "posix:", 6) == 0 ? "posix" : "flock",
			      "since", lockfs_format_time(e->since_ms, when));
		line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
		json_decref(o);
		if (!line) {
			free(buf);
			return -ENOMEM;
		}
		n = strlen(line);
		if (used + n + 2 > cap) {
			char *b;

			while (used + n + 2 > cap)
				cap *= 2;
			b = realloc(buf, cap);
			if (!b) {
				free(line);
				free(buf);
				return -ENOMEM;
			}
			buf = b;
		}
		memcpy(buf + used, line, n);
		used += n;
		buf[used++] = '\n';
		buf[used] = '\0';
		free(line);
	}
	*text = buf;
	*len = used;
	return 0;
}

static int view_waiters_of(const char *name, struct cached *c,
			   const struct lockfs_entry_stat *st, void *arg)
{
	struct queue_text *o = arg;

	return view_waiters(o->s, name, o->text, o->len);
}

int lockfs_core_waiters(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct queue_text o = { text, len, stripe_of(core, name) };

	return with_record(core, name, view_waiters_of, &o);
}

static int view_binding(const char *name, struct cached *c, const struct lockfs_entry_stat *st,
			void *arg)
{
	struct queue_text *o = arg;
	const char *b = c ? lockfs_bound_name(c->rec.bound) : "foreign";

	*o->len = strlen(b) + 1;
	*o->text = malloc(*o->len + 1);
	if (!*o->text)
		return -ENOMEM;
	snprintf(*o->text, *o->len + 1, "%s\n", b);
	return 0;
}

int lockfs_core_binding(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct queue_text o = { text, len, NULL };

	return with_record(core, name, view_binding, &o);
}

int lockfs_core_bind(struct lockfs_core *core, const char *name,
		     const struct lockfs_caller *caller, const char *text, size_t len)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	char slug[LOCKFS_SLUG_MAX], who[WHO_MAX], fence[24], uid[16], pid[16];
	struct lockfs_proc writer;
	struct cached *c;
	bool foreign, to_slug;
	int rc;

	if (len > 0 && text[len - 1] == '\n')
		len--;
	to_slug = len == 4 && memcmp(text, "slug", 4) == 0;
	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	slug[0] = '\0';
	if (to_slug && caller_slug(core->procs, caller->tid, slug, sizeof(slug)) < 0)
		slug[0] = '\0';
	/* The writer as a holder (genuine helpers of its own uid skipped),
	 * resolved outside the mutex: `lockctl acquire` writes for the shell
	 * that ran it. */
	if (lockfs_holder_resolve(core->procs, caller->tid, caller->uid, &core->helpers, 0,
				  &writer) < 0)
		writer.pid = 0;

	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	if (rc < 0)
		goto out;
	if (!c || strcmp(c->issued, c->rec.token) != 0) {
		rc = -EPERM;
		goto out;
	}
	/* "The resolved holder ... may write": the writer that resolves to
	 * the holder itself (it asked for the fd lock through a genuine
	 * helper such as lockctl, which never leads across a uid boundary
	 * but through sudo); any other descendant by the rmdir rule.  Anyone
	 * else: EPERM, whatever they wrote. */
	if (!(writer.pid > 0 && writer.pid == c->rec.holder.pid &&
	      writer.start_time == c->rec.holder.start_time &&
	      strcmp(c->rec.holder.boot_id, core->boot_id) == 0))
		rc = holder_check_entry(core, c, caller);
	/* A grant its descriptor let go (the store is yet to take it) is
	 * nobody's to keep. */
	if (rc == 0 && retry_pending_locked(s, name, &c->rec, 0))
		rc = -EPERM;
	if (rc < 0)
		goto out;
	if ((!to_slug && !(len == 7 && memcmp(text, "process", 7) == 0)) ||
	    (to_slug && !*slug) || c->rec.bound != LOCKFS_BOUND_FD ||
	    c->rec.mode != LOCKFS_EXCLUSIVE || c->rec.nshares) {
		rc = -EINVAL;
		goto out;
	}
	/* A writer named like a helper that binds the lock to itself is a
	 * lockctl that was not skipped: one past a uid boundary (`setpriv
	 * --reuid=U lockctl acquire`, run by root) or a copy that is not the
	 * genuine one (holder.md).  It exits at once, and with it a
	 * process-bound lock: EACCES, as mkdir gets, rather than no lock.
	 * A slug lock is the writer's uid's to keep. */
	if (!to_slug && writer.pid == c->rec.holder.pid &&
	    lockfs_helpers_contains(&core->helpers, writer.exe)) {
		rc = -EACCES;
		goto out;
	}
	c->rec.fd_owner[0] = '\0';
	if (to_slug) {
		char *dup = strdup(slug);

		if (!dup) {
			rc = -ENOMEM;
			goto out;
		}
		free(c->rec.slug);
		c->rec.slug = dup;
		c->rec.bound = LOCKFS_BOUND_SLUG;
		/* A slug lock belongs to the uid that asked for it, and counts
		 * against it from now on. */
		cache_account(core, c, -1);
		c->rec.holder.uid = caller->uid;
		c->rec.holder.gid = caller->gid;
		cache_account(core, c, 1);
		lease_start(&c->rec.lease, core->default_lease_s);
	} else {
		c->rec.bound = LOCKFS_BOUND_PROCESS;
	}
	who_of(who, sizeof(who), c->rec.slug, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, c->rec.fence);
	ids_of(uid, pid, c->rec.holder.uid, c->rec.holder.pid);
	rc = persist_locked(core, s, c, &st);
	if (rc == 0) {
		const char *kv[] = { "fence", fence, "uid", uid, "pid", pid,
				     "bound", to_slug ? "slug" : "process", NULL };

		log_event(core, who, name, kv, "bound");
		cache_watch(core, c, -1);
	}
out:
	stripe_unlock(s);
	return rc;
}

/* Is a process-bound share's holder gone?  (Shares are few: only shared
 * locks rebound at a restart have them.)  Unknown counts as alive. */
static bool share_gone(const struct lockfs_proc_source *src, const struct lockfs_share *sh,
		       const char *boot_id)
{
	unsigned long long start;
	int rc;

	if (sh->bound != LOCKFS_BOUND_PROCESS)
		return false;
	if (strcmp(sh->holder.boot_id, boot_id) != 0)
		return true;
	rc = lockfs_procs_start_time(src, sh->holder.pid, &start);
	return rc == -ESRCH || rc == -ENOENT || (rc == 0 && start != sh->holder.start_time);
}

void queue_tick(struct lockfs_core *core)
{
	for (int i = 0; i < STRIPES; i++) {
		struct stripe *s = &core->stripes[i];
		bool again;

		pthread_mutex_lock(&s->mu);
		if (s->retries)
			retry_tick_locked(core, s);
		for (struct lockq *q = s->queues, *next; q; q = next) {
			next = q->next;
			/* Behind a lock we cannot watch (the seed's), the queue
			 * learns of its release here. */
			queue_grant_locked(core, s, q->name);
		}
		/* Dropping a holder rewrites (or, failing, drops) the cache
		 * entry and may grant others: after each attempt start over
		 * from the head, a bounded number of times.  Only where some
		 * share may be process-bound: a tick must not walk every lock. */
		again = s->process_shares;
		s->process_shares = false;
		for (int tries = 0; again && tries < 64; tries++) {
			again = false;
			for (struct cached *c = s->head; c && !again; c = c->next) {
				for (size_t k = 0; k < c->rec.nshares; k++) {
					const struct lockfs_holder *h = &c->rec.shares[k].holder;
					char holder[WHO_MAX], start[24];
					const char *kv[] = { "holder", holder, "start", start,
							     "evidence", "exited", NULL };
					struct lockfs_entry_stat st;
					struct cached *fresh;
					bool foreign;
					char *name;

					if (c->rec.shares[k].bound == LOCKFS_BOUND_PROCESS)
						s->process_shares = true; /* look again next tick */
					if (!share_gone(core->procs, &c->rec.shares[k], core->boot_id))
						continue;
					/* As recover_gone() logs a holder (docs/log.md). */
					who_of(holder, sizeof(holder), NULL, h->comm, h->pid);
					snprintf(start, sizeof(start), "%llu", h->start_time);
					if (strcmp(h->boot_id, core->boot_id) != 0)
						kv[5] = "boot-changed";
					/* Only what the store still holds. */
					name = strdup(c->name);
					if (name && load_locked(core, s, name, &st, &foreign, false,
								&fresh) == 0 && fresh &&
					    k < fresh->rec.nshares &&
					    strcmp(fresh->issued, fresh->rec.token) == 0)
						drop_holder_locked(core, s, fresh, st.identity, k + 1,
								   "recovered", kv);
					free(name);
					again = true;
					break;
				}
			}
		}
		if (again)
			s->process_shares = true; /* not done: next tick */
		stripe_unlock(s);
	}
}
