/*
 * The lock table (table.h): stripes, the cache of parsed records with
 * the liveness watch of their holders, the holder index, and loading and
 * storing records through the backend.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lockfs/name.h"
#include "base/clock.h"
#include "store.h"
#include "table.h"

struct stripe *lockfs_table_stripe(struct lockfs_table *t, const char *name)
{
	uint32_t h = 2166136261u; /* FNV-1a */

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 16777619u;
	return &t->stripes[h % STRIPES];
}

struct held_lock *lockfs_table_find(struct stripe *s, const char *name)
{
	for (struct held_lock *c = s->head; c; c = c->next)
		if (strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

void lockfs_table_unlock(struct stripe *s)
{
	pthread_mutex_unlock(&s->mu);
}

static bool same_holder(const struct lockfs_record *a, const struct lockfs_record *b)
{
	return a->bound == b->bound && a->has_holder == b->has_holder &&
	       (!a->has_holder || (a->holder.pid == b->holder.pid &&
				   a->holder.start_time == b->holder.start_time));
}

bool lockfs_table_desc_keep(const struct lockfs_record *rec)
{
	return rec->bound == LOCKFS_BOUND_PROCESS && rec->mode == LOCKFS_EXCLUSIVE &&
	       rec->nshares == 0 && rec->has_holder;
}

void lockfs_table_account(struct lockfs_table *t, const struct held_lock *c, int sign)
{
	const struct lockfs_record *r = &c->rec;

	if (!r->has_holder || !t->quota)
		return;
	/* This host's holders only: another host's uids are not ours. */
	if (!lockfs_table_elsewhere(t, &r->holder))
		lockfs_quota_locks_add(t->quota, r->holder.uid, sign);
	for (size_t i = 0; i < r->nshares; i++)
		if (!lockfs_table_elsewhere(t, &r->shares[i].holder))
			lockfs_quota_locks_add(t->quota, r->shares[i].holder.uid, sign);
}

static size_t holder_bucket(pid_t pid)
{
	return (size_t)(unsigned)pid % HOLDER_BUCKETS;
}

/* C's holder is watched: C joins the index.  With its stripe mutex held. */
static void holder_index_add(struct lockfs_table *t, struct held_lock *c)
{
	struct held_lock **head = &t->holders.buckets[holder_bucket(c->rec.holder.pid)];

	pthread_mutex_lock(&t->holders.mu);
	c->hpid = c->rec.holder.pid;
	c->hstart = c->rec.holder.start_time;
	c->huid = c->rec.holder.uid;
	c->hprev = NULL;
	c->hnext = *head;
	if (*head)
		(*head)->hprev = c;
	*head = c;
	c->indexed = true;
	pthread_mutex_unlock(&t->holders.mu);
}

/* Called with t->holders.mu held. */
static void holder_unlink(struct lockfs_table *t, struct held_lock *c)
{
	if (!c->indexed)
		return;
	if (c->hprev)
		c->hprev->hnext = c->hnext;
	else
		t->holders.buckets[holder_bucket(c->hpid)] = c->hnext;
	if (c->hnext)
		c->hnext->hprev = c->hprev;
	c->hnext = c->hprev = NULL;
	c->indexed = false;
}

static void holder_index_del(struct lockfs_table *t, struct held_lock *c)
{
	pthread_mutex_lock(&t->holders.mu);
	holder_unlink(t, c);
	pthread_mutex_unlock(&t->holders.mu);
}

bool lockfs_table_holder_uid(struct lockfs_table *t, pid_t pid, unsigned long long start,
			     uid_t *uid)
{
	bool found = false;

	pthread_mutex_lock(&t->holders.mu);
	for (struct held_lock *c = t->holders.buckets[holder_bucket(pid)]; c && !found;
	     c = c->hnext) {
		if (c->hpid == pid && c->hstart == start) {
			*uid = c->huid;
			found = true;
		}
	}
	pthread_mutex_unlock(&t->holders.mu);
	return found;
}

int lockfs_table_take_dead(struct lockfs_table *t, pid_t pid, unsigned long long start, size_t max,
			   char ***names, size_t *count)
{
	char **v = malloc(max * sizeof(*v));
	size_t n = 0;
	int rc = v ? 0 : -ENOMEM;

	pthread_mutex_lock(&t->holders.mu);
	for (struct held_lock *c = t->holders.buckets[holder_bucket(pid)], *next;
	     c && v && n < max; c = next) {
		next = c->hnext;
		if (c->hpid != pid || c->hstart != start)
			continue;
		/* The name never changes while C lives, and C cannot be
		 * freed while it is in the index, which needs this mutex. */
		v[n] = strdup(c->name);
		if (!v[n]) {
			rc = -ENOMEM;
			break;
		}
		n++;
		holder_unlink(t, c);
	}
	pthread_mutex_unlock(&t->holders.mu);
	*names = v;
	*count = n;
	return rc;
}

/* When collect() must look at C next (boot ms): now (0) for a dead
 * holder's lock not queued yet, a process-bound lock not watched, or a
 * lock kept for its dead holder's descendants (each tick counts them);
 * else the earlier of its lease's deadline and, for an fd lock rebound at
 * startup, its next look for the old descriptor; INT64_MAX for never. */
static int64_t entry_due(const struct held_lock *c)
{
	const struct lockfs_lease *l = &c->rec.lease;
	int64_t due = INT64_MAX;

	/* Another host's lock: its session is its liveness, collect() skips
	 * it -- a due time would walk its stripe every tick for nothing. */
	if (c->queued || c->elsewhere)
		return INT64_MAX; /* recovery.c has it, or nobody here */
	if (c->holder_gone ||
	    (c->rec.bound == LOCKFS_BOUND_PROCESS && c->rec.has_holder && !c->watched) ||
	    (c->rec.holder_exited && lockfs_table_desc_keep(&c->rec)))
		return 0;
	if (l->ttl_s && c->rec.bound == LOCKFS_BOUND_PROCESS && !c->expired_logged)
		due = l->deadline_boot_ms;
	else if (l->ttl_s && c->rec.bound == LOCKFS_BOUND_SLUG)
		due = l->deadline_boot_ms > c->next_check_boot_ms ? l->deadline_boot_ms
								  : c->next_check_boot_ms;
	if (c->rebound && c->next_rebound_boot_ms < due)
		due = c->next_rebound_boot_ms;
	return due;
}

void lockfs_table_note_due(struct lockfs_table *t, struct stripe *s, const struct held_lock *c)
{
	int64_t due = entry_due(c);

	if (due < s->due_boot_ms) {
		s->due_boot_ms = due;
		lockfs_table_wake(t);
	}
}

void lockfs_table_wake(struct lockfs_table *t)
{
	lockfs_liveness_wake(t->liveness);
}

void lockfs_table_set_due(struct stripe *s)
{
	int64_t due = INT64_MAX;

	for (struct held_lock *c = s->head; c; c = c->next) {
		int64_t d = entry_due(c);

		if (d < due)
			due = d;
	}
	s->due_boot_ms = due;
}

bool lockfs_table_elsewhere(const struct lockfs_table *t, const struct lockfs_holder *h)
{
	return h->host && *h->host && strcmp(h->host, t->host) != 0;
}

/* Stop watching C's holder, if we were.  Called with the stripe mutex held. */
void lockfs_table_unwatch(struct lockfs_table *t, struct held_lock *c)
{
	if (c->watched) {
		holder_index_del(t, c);
		lockfs_liveness_unwatch(t->liveness, c->rec.holder.pid, c->rec.holder.start_time);
	}
	if (c->desc_watched)
		lockfs_descendants_unwatch(t->descendants, c->rec.holder.pid,
					   c->rec.holder.start_time);
	c->watched = false;
	c->desc_watched = false;
}

/*
 * Watch C's holder if the lock is process-bound.  A holder of another boot,
 * or one that is gone already, marks the entry for recovery instead: only
 * a live holder keeps a lock.  Called with the stripe mutex held.
 */
void lockfs_table_watch(struct lockfs_table *t, struct held_lock *c, int pidfd)
{
	int rc;

	if (c->rec.has_holder && lockfs_table_elsewhere(t, &c->rec.holder)) {
		/* Another host's: its store session is its liveness. */
		if (pidfd >= 0)
			close(pidfd);
		return;
	}
	if (c->rec.bound == LOCKFS_BOUND_SLUG && c->rec.has_holder &&
	    strcmp(c->rec.holder.boot_id, t->boot_id) != 0 && c->rec.lease.ttl_s) {
		/* A boot-clock deadline of another boot means nothing here:
		 * carry the lease over by its wall-clock expiry instead. */
		int64_t left = c->rec.lease.expires_at_ms - lockfs_wall_ms();

		c->rec.lease.deadline_boot_ms = lockfs_boot_ms() + (left > 0 ? left : 0);
	}
	if (c->rec.bound != LOCKFS_BOUND_PROCESS || !c->rec.has_holder || c->watched ||
	    strcmp(c->rec.holder.boot_id, t->boot_id) != 0) {
		if (pidfd >= 0)
			close(pidfd);
		if (c->rec.bound == LOCKFS_BOUND_PROCESS && !c->watched &&
		    strcmp(c->rec.holder.boot_id, t->boot_id) != 0)
			c->holder_gone = true;
		lockfs_table_note_due(t, lockfs_table_stripe(t, c->name), c);
		return;
	}
	rc = pidfd >= 0 ? lockfs_liveness_watch_fd(t->liveness, c->rec.holder.pid,
						   c->rec.holder.start_time, pidfd)
			: lockfs_liveness_watch(t->liveness, c->rec.holder.pid,
						c->rec.holder.start_time);
	if (rc == 0) {
		c->watched = true;
		holder_index_add(t, c);
		/* From now on what it starts keeps its lock after it exits.  At
		 * daemon start, what it started before is found by a scan; so
		 * it is when an earlier watch failed (the tick's re-watch), as
		 * its forks since then were not told.  No memory: a scan looks
		 * when it exits. */
		if (lockfs_table_desc_keep(&c->rec))
			c->desc_watched = lockfs_descendants_watch(t->descendants,
								   c->rec.holder.pid,
								   c->rec.holder.start_time,
								   c->rec.holder_session,
								   t->starting ||
								   c->watch_failed) == 0;
		c->watch_failed = false;
	} else if (rc == -ESRCH) {
		c->holder_gone = true;
	} else {
		c->watch_failed = true;
	}
	/* Any other failure (no memory: a holder without a pidfd is polled,
	 * see liveness.h) leaves the lock held and unwatched, and the tick
	 * tries again: fail closed, never release on a guess. */
	lockfs_table_note_due(t, lockfs_table_stripe(t, c->name), c);
}

void lockfs_table_drop(struct lockfs_table *t, struct stripe *s, const char *name)
{
	for (struct held_lock **pp = &s->head; *pp; pp = &(*pp)->next) {
		struct held_lock *c = *pp;

		if (strcmp(c->name, name) == 0) {
			*pp = c->next;
			if (c->elsewhere && t->elsewhere)
				t->elsewhere(t, c, "released");
			if (!c->elsewhere)
				s->own--;
			lockfs_table_unwatch(t, c);
			lockfs_table_account(t, c, -1);
			lockfs_record_clear(&c->rec);
			free(c->name);
			free(c);
			return;
		}
	}
}

void lockfs_table_drop_elsewhere(struct lockfs_table *t, struct stripe *s, const char *name)
{
	struct held_lock *c = lockfs_table_find(s, name);

	if (c && c->elsewhere)
		lockfs_table_drop(t, s, name);
}

/* lockfs_table_put_new (OURS) and lockfs_table_put_read. */
static void put(struct lockfs_table *t, struct stripe *s, const char *name, uint64_t identity,
		struct lockfs_record *rec, int pidfd, bool ours)
{
	struct held_lock *c = lockfs_table_find(s, name);
	const bool now_elsewhere = rec->has_holder && lockfs_table_elsewhere(t, &rec->holder);
	bool was_elsewhere = false;
	uint64_t was_fence = 0;

	if (!c || ours) {
		if (c)
			lockfs_table_drop(t, s, name);
		c = calloc(1, sizeof(*c));
		if (!c || !(c->name = strdup(name))) {
			free(c);
			lockfs_record_clear(rec);
			if (pidfd >= 0)
				close(pidfd);
			return;
		}
		c->next = s->head;
		s->head = c;
		s->own++; /* not elsewhere, until its record says */
		memcpy(c->issued, rec->token, sizeof(c->issued));
		c->granted = ours || t->starting;
	} else if (!same_holder(&c->rec, rec) || strcmp(c->rec.token, rec->token) != 0) {
		/* Another acquisition under the same name: start afresh. */
		c->granted = t->starting;
		lockfs_table_unwatch(t, c);
		c->holder_gone = false;
		c->expired_logged = false;
		c->queued = false; /* a todo for the old one finds its token gone */
		c->rebound = false;
		c->next_rebound_boot_ms = 0;
		c->unlogged = false;
		c->next_check_boot_ms = 0;
		c->watch_failed = false;
		c->desc_version = 0;
		c->next_persist_boot_ms = 0;
	}
	/* (A new entry, or ours after the drop: elsewhere is false.) */
	was_elsewhere = c->elsewhere;
	was_fence = c->rec.fence;
	if (was_elsewhere && (!now_elsewhere || rec->fence != was_fence) && t->elsewhere)
		t->elsewhere(t, c, "released");
	lockfs_table_account(t, c, -1);
	lockfs_record_clear(&c->rec);
	c->identity = identity;
	c->rec = *rec;
	memset(rec, 0, sizeof(*rec));
	if (!c->elsewhere)
		s->own--;
	c->elsewhere = now_elsewhere;
	if (!c->elsewhere)
		s->own++;
	if (c->elsewhere && (!was_elsewhere || c->rec.fence != was_fence) && t->elsewhere)
		t->elsewhere(t, c, "acquired");
	lockfs_table_account(t, c, 1);
	for (size_t i = 0; i < c->rec.nshares; i++)
		if (c->rec.shares[i].bound == LOCKFS_BOUND_PROCESS)
			s->process_shares = true;
	/* A lock of this host (the tick checks the store and the session
	 * for it), process-bound shares (polled), and on a store whose
	 * foreign locks go stale any lock (recovery.c): tick again. */
	if (!c->elsewhere || s->process_shares || lockfs_store_stales_foreign(t->be))
		lockfs_table_wake(t);
	lockfs_table_watch(t, c, pidfd); /* and notes when the tick must look at it */
}

void lockfs_table_put_new(struct lockfs_table *t, struct stripe *s, const char *name,
			  uint64_t identity, struct lockfs_record *rec, int pidfd)
{
	put(t, s, name, identity, rec, pidfd, true);
}

void lockfs_table_put_read(struct lockfs_table *t, struct stripe *s, const char *name,
			   uint64_t identity, struct lockfs_record *rec)
{
	put(t, s, name, identity, rec, -1, false);
}

bool lockfs_table_issued_here(const struct held_lock *c)
{
	return strcmp(c->issued, c->rec.token) == 0;
}

bool lockfs_table_place_only(const struct lockfs_table *t, const struct held_lock *c)
{
	return (t->be->caps & LOCKFS_BE_SESSIONS) && !c->granted && c->rec.bound == LOCKFS_BOUND_FD;
}

/* The store no longer shows WAS (TOKEN: what it shows instead): tell the
 * floor above (t->vanished), which decides whether that is a loss. */
static void vanished(struct lockfs_table *t, struct stripe *s, struct held_lock *was,
		     const char *token)
{
	if (was && t->vanished)
		t->vanished(t, s, was, token);
}

/* lockfs_table_load, or (FRESH) lockfs_table_reload.  A cached lock of
 * this host that the store no longer shows, where this daemon did not
 * write that, is lost on a store with sessions (t->vanished: session.c). */
static int load(struct lockfs_table *t, struct stripe *s, const char *name,
		struct lockfs_entry_stat *st, bool *foreign, bool fresh, struct held_lock **c)
{
	struct held_lock *was = lockfs_table_find(s, name);
	struct lockfs_record rec;
	char *buf = NULL;
	size_t len = 0;
	int rc;

	*c = NULL;
	*foreign = false;
	if (!fresh) {
		*c = was;
		rc = lockfs_store_stat(t->be, name, st, *c != NULL);
		if (rc < 0) {
			if (rc == -ENOENT) {
				vanished(t, s, was, NULL);
				lockfs_table_drop(t, s, name);
			}
			*c = NULL;
			return rc;
		}
		if (*c && (*c)->identity == st->identity)
			return 0;
		*c = NULL;
	}
	rc = lockfs_store_read(t->be, name, &buf, &len, st);
	if (rc < 0) {
		if (rc == -ENOENT) {
			vanished(t, s, was, NULL);
			lockfs_table_drop(t, s, name);
		}
		return rc;
	}
	memset(&rec, 0, sizeof(rec));
	if (!buf || lockfs_record_parse(buf, len, &rec) < 0 ||
	    strcmp(rec.resource, name) != 0) {
		/* Held, but not by a record we can read: a foreign lock. */
		lockfs_record_clear(&rec);
		free(buf);
		vanished(t, s, was, NULL);
		lockfs_table_drop(t, s, name);
		*foreign = true;
		return 0;
	}
	free(buf);
	/* The store's word on the fence (a no-op for dir; a store that
	 * issues fences by its writes supplies them here).  A record with no
	 * fence at all cannot be told from a forgery: foreign (fail closed). */
	if (st->fence)
		rec.fence = st->fence;
	if (!rec.fence) {
		lockfs_record_clear(&rec);
		vanished(t, s, was, NULL);
		lockfs_table_drop(t, s, name);
		*foreign = true;
		return 0;
	}
	vanished(t, s, was, rec.token);
	lockfs_table_put_read(t, s, name, st->identity, &rec);
	*c = lockfs_table_find(s, name);
	return *c ? 0 : -ENOMEM;
}

int lockfs_table_load(struct lockfs_table *t, struct stripe *s, const char *name,
		      struct lockfs_entry_stat *st, bool *foreign, struct held_lock **c)
{
	return load(t, s, name, st, foreign, false, c);
}

int lockfs_table_reload(struct lockfs_table *t, struct stripe *s, const char *name,
			struct lockfs_entry_stat *st, bool *foreign, struct held_lock **c)
{
	return load(t, s, name, st, foreign, true, c);
}

/*
 * The store refused C's edited record (RC): it still holds the record as
 * it was before the edit.  Read that back into the cache -- keeping the
 * token this daemon issued, and watching its holders again -- so that a
 * lock whose change failed stays held and watched as it was, never
 * unwatched until someone happens to look.  What the engine knows about
 * the acquisition beyond its record (a queued todo, a logged expiry, a
 * rebinding, the descendants list last written) stays too, and the
 * holder's descendants stay counted across the reload (an extra watch,
 * so that forks seen so far are not forgotten).  A lock gone from the
 * store is just dropped.  With s->mu held; C is freed.
 */
static void restore_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c, int rc)
{
	struct held_lock kept = *c; /* its flags, ids and token: no pointer of it is used */
	char *name = strdup(c->name);
	struct lockfs_entry_stat st;
	bool foreign, desc_held;

	desc_held = c->desc_watched &&
		    lockfs_descendants_watch(t->descendants, c->rec.holder.pid,
					     c->rec.holder.start_time, c->rec.holder_session,
					     false) == 0;
	lockfs_table_drop(t, s, c->name);
	if (name && rc != -ENOENT &&
	    lockfs_table_reload(t, s, name, &st, &foreign, &c) == 0 && c) {
		memcpy(c->issued, kept.issued, sizeof(c->issued));
		if (strcmp(c->rec.token, kept.rec.token) == 0) {
			c->expired_logged = kept.expired_logged;
			c->rebound = kept.rebound;
			c->queued = kept.queued;
			c->desc_version = kept.desc_version;
			c->next_persist_boot_ms = kept.next_persist_boot_ms;
			c->next_check_boot_ms = kept.next_check_boot_ms;
			c->next_rebound_boot_ms = kept.next_rebound_boot_ms;
			c->unlogged = kept.unlogged;
			c->granted = kept.granted;
		}
	}
	if (desc_held)
		lockfs_descendants_unwatch(t->descendants, kept.rec.holder.pid,
					   kept.rec.holder.start_time);
	free(name);
}

/* Write C's record back to the store and follow its new identity.  Called
 * with the stripe mutex held.  0 or -errno (then C is gone: the entry is
 * read back from the store as it was, see restore_locked). */
static int encode_grant(void *arg, uint64_t fence, char **json, size_t *len)
{
	struct lockfs_grant_src *g = arg;

	if (fence) {
		if (g->which == 0)
			g->rec->fence = fence;
		else if (g->which <= g->rec->nshares)
			g->rec->shares[g->which - 1].fence = fence;
	}
	*json = lockfs_record_encode(g->rec, LOCKFS_RECORD_WITH_TOKEN, len);
	return *json ? 0 : -ENOMEM;
}

const struct lockfs_record_src *lockfs_table_grant_src(struct lockfs_grant_src *g,
						       struct lockfs_record *rec, size_t which)
{
	g->rec = rec;
	g->which = which;
	g->src.encode = encode_grant;
	g->src.arg = g;
	return &g->src;
}

void lockfs_table_grant_fence(struct lockfs_grant_src *g, const struct lockfs_entry_stat *st)
{
	if (!st->fence)
		return;
	if (g->which == 0 && !g->rec->fence)
		g->rec->fence = st->fence;
	else if (g->which >= 1 && g->which <= g->rec->nshares &&
		 !g->rec->shares[g->which - 1].fence)
		g->rec->shares[g->which - 1].fence = st->fence;
}

/* Where holder WHICH's fence lives (0 = the lock's own, i >= 1 = share i-1). */
static uint64_t *grant_fence(struct lockfs_record *rec, size_t which)
{
	return which == 0 ? &rec->fence : &rec->shares[which - 1].fence;
}

/*
 * A store that issues a grant's fence only in the write itself (etcd: the
 * revision of the txn) wrote the record with null for it.  Take the fence
 * into the cache and write the record once more, so that `owner` and the
 * stored record (what another host or `etcdctl get` reads) both carry it.
 * If that second write fails, the grant stands (the store has it) and the
 * cache keeps the fence: the record's next write carries it.
 */
static void persist_issued_fence(struct lockfs_table *t, struct held_lock *c,
				 struct lockfs_entry_stat *st, size_t which)
{
	struct lockfs_entry_stat again;
	struct lockfs_grant_src g;

	*grant_fence(&c->rec, which) = st->fence;
	if (lockfs_store_update(t->be, c->name, st->identity, LOCKFS_UPD_EDIT,
				lockfs_table_grant_src(&g, &c->rec, which), &again) == 0) {
		c->identity = again.identity;
		st->identity = again.identity;
	}
}

/* lockfs_table_persist (EDIT) or lockfs_table_persist_grant (GRANT of
 * holder WHICH). */
static int persist(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
		   struct lockfs_entry_stat *st, enum lockfs_update_how how, size_t which)
{
	struct lockfs_grant_src g;
	bool fenceless;
	int rc;

	fenceless = how == LOCKFS_UPD_GRANT && !*grant_fence(&c->rec, which);
	rc = lockfs_store_update(t->be, c->name, st->identity, how,
				 lockfs_table_grant_src(&g, &c->rec, which), st);
	if (rc < 0) {
		restore_locked(t, s, c, rc);
		return rc;
	}
	c->identity = st->identity;
	lockfs_table_note_due(t, s, c); /* a lease may have been set or renewed */
	if (fenceless && !*grant_fence(&c->rec, which) && st->fence)
		persist_issued_fence(t, c, st, which);
	return 0;
}

int lockfs_table_persist(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			 struct lockfs_entry_stat *st)
{
	return persist(t, s, c, st, LOCKFS_UPD_EDIT, 0);
}

int lockfs_table_persist_grant(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			       struct lockfs_entry_stat *st, size_t share)
{
	return persist(t, s, c, st, LOCKFS_UPD_GRANT, share);
}

/*
 * Run VIEW on NAME's record (C is NULL for a foreign lock) with the stripe
 * mutex held: the shape of every read-only request.  Returns VIEW's
 * result, -ENOENT when not held, -errno.
 */
int lockfs_table_view(struct lockfs_table *t, const char *name,
		int (*view)(const char *name, struct held_lock *c,
			    const struct lockfs_entry_stat *st, void *arg),
		void *arg)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	int rc;

	if (lockfs_name_check_stored(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc == 0)
		rc = view(name, c, &st, arg);
	lockfs_table_unlock(s);
	return rc;
}

struct name_vec {
	char **v;
	size_t n, cap;
};

static int add_name(void *arg, const char *name)
{
	struct name_vec *nv = arg;

	if (lockfs_name_check_stored(name) < 0)
		return 0;
	if (nv->n == nv->cap) {
		size_t cap = nv->cap ? nv->cap * 2 : 16;
		char **v = realloc(nv->v, cap * sizeof(*v));

		if (!v)
			return 1;
		nv->v = v;
		nv->cap = cap;
	}
	nv->v[nv->n] = strdup(name);
	if (nv->v[nv->n])
		nv->n++;
	return 0;
}

int lockfs_table_names(struct lockfs_table *t, char ***names, size_t *count)
{
	return lockfs_table_names_fresh(t, NULL, names, count);
}

int lockfs_table_names_fresh(struct lockfs_table *t, const char *prefix, char ***names,
			     size_t *count)
{
	struct name_vec nv = { 0 };
	int rc = prefix ? lockfs_store_list_prefix(t->be, prefix, add_name, &nv)
			: lockfs_store_list(t->be, add_name, &nv);

	if (rc < 0) {
		lockfs_table_names_free(nv.v, nv.n);
		return rc;
	}
	*names = nv.v;
	*count = nv.n;
	return 0;
}

void lockfs_table_names_free(char **names, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(names[i]);
	free(names);
}
