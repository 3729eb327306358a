/*
 * This daemon's session with the store (session.c): what the engine does
 * when it is lost (a backend with LOCKFS_BE_SESSIONS, etcd): every lock of
 * this host is `lost`, its holder signalled and told ESTALE at its rmdir
 * (a tombstone), and nothing is silently held again; parked waiters take
 * new places once a new session is live.  The dir store is always LIVE:
 * none of this runs for it.
 */
#ifndef LOCKFS_LOCK_SESSION_H
#define LOCKFS_LOCK_SESSION_H

#include "caller.h"
#include "table.h"

/* A lock of this host that was lost with its session, kept for its
 * holder's rmdir (ESTALE, not ENOENT).  In its stripe, under s->mu. */
struct tombstone {
	struct tombstone *next;
	char *name;
	uint64_t fence;
	struct lockfs_holder_ref holder; /* the rmdir rule's view of it */
	int64_t told_until_ms; /* boot clock: 0 until the holder is told */
	int told;              /* ESTALE answers given (one syscall: two) */
	bool done;             /* told: kept only to mark the grant ended
				  (lockfs_session_tombstoned) until its
				  holder exits or holds NAME again */
};

/*
 * Ask the store for this daemon's session and act on a change: a session
 * LOST (or replaced by a new one) loses every lock of this host that the
 * store no longer shows on a live session (lockfs_session_lose_all, with
 * evidence=session-expired); a session LIVE again re-queues parked
 * waiters whose places were in the old one.  Cheap (session() never
 * waits); call it with no stripe mutex held.  No-op without
 * LOCKFS_BE_SESSIONS.
 */
void lockfs_session_check(struct lockfs_table *t);

/*
 * With S's mutex held, after NAME was found not held: was it a lock of
 * this host lost with its session, and may CALLER act as its holder?
 * -ESTALE, else -ENOENT.  The holder is told once: its first look and
 * the kernel's immediate retry of it (within TOLD_MS) say ESTALE, then
 * the tombstone is done (ENOENT from then on).
 */
int lockfs_session_tombstone_take(struct lockfs_table *t, struct stripe *s, const char *name,
				  const struct lockfs_caller *caller);

/*
 * With S's mutex held, as the store's answer for C's name is about to
 * replace the cached lock C (lockfs_table_load calls it through
 * t->vanished, which engine.c sets: table.c is below): the store no longer
 * shows C -- its name is free (TOKEN NULL) or held by another acquisition
 * (TOKEN, that record's token) -- and this daemon did not write that
 * (its own writes update or drop the cache under the same mutex first).
 * For a lock of this host on a store with LOCKFS_BE_SESSIONS, the lock
 * is lost: logged `lost` (evidence=removed-in-store, or session-expired
 * when the session is not the live one the engine knows), its holders
 * signalled (-o break_signal) and tombstoned, and C dropped.  Anything
 * else: nothing (the caller drops or replaces C as before).
 */
void lockfs_session_vanished_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
				    const char *token);

/* With S's mutex held, after the store said "anything may have changed"
 * (a resync: CHANGE_ALL): each cached lock of this host is looked up in
 * the store, so one removed meanwhile is lost now, not when someone next
 * looks.  No-op without LOCKFS_BE_SESSIONS. */
void lockfs_session_recheck_locked(struct lockfs_table *t, struct stripe *s);

/* With S's mutex held: C's lock was just granted on this host.  Its
 * holder's tombstones of that name go: it holds the name again, so
 * there is no loss left to tell it of. */
void lockfs_session_tombstone_forget(struct stripe *s, const struct held_lock *c);

/*
 * With S's mutex held: C, a lock of this host, was lost with session
 * LEASE outside a session change (a restarted daemon found the earlier
 * daemon's key gone before it could adopt it, startup.c).  As for a lost
 * session: each holder logged `lost`, signalled (-o break_signal) and
 * kept as a tombstone for its rmdir (ESTALE); C is dropped from the cache.
 */
void lockfs_session_lose_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
				int64_t lease);

/* With S's mutex held: was NAME's grant FENCE of this host logged `lost`
 * (a tombstone, told or not)?  Then it has ended: a release of it that
 * comes later ends nothing more, and its holder hears ESTALE, once. */
bool lockfs_session_tombstoned(const struct stripe *s, const char *name, uint64_t fence);

/* Free S's tombstones (the engine's close). */
void lockfs_session_free_tombstones(struct stripe *s);


#endif
