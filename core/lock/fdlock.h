/*
 * fd-lock bookkeeping (fdlock.c): which open file of the mount each POSIX
 * lock owner's grant came through, so that the last close of that file
 * ends it (an open file description lock has no unlock of its own).
 * Also: which holder of a record is an owner's grant, and the releases
 * the store refused, retried by the tick (recovery.c).
 * All of it lives in each stripe, next to the cache and the queues, and
 * every function here is called with that stripe's mutex held.
 */
#ifndef LOCKFS_LOCK_FDLOCK_H
#define LOCKFS_LOCK_FDLOCK_H

#include <stdint.h>

#include <stdbool.h>

#include "lockfs/record.h" /* LOCKFS_FD_OWNER_MAX */
#include "table.h"

/* One grant remembered with its open file (owned by the stripe). */
struct fdlock_via {
	struct fdlock_via *next;
	char *name;
	char owner[LOCKFS_FD_OWNER_MAX];
	uint64_t file;
};

/* OWNER's grant of NAME came through open file FILE (not 0): remember it
 * there, and no longer with any other open file of NAME.  Out of memory,
 * it is not remembered: the lock then ends only by its owner's unlock or
 * close. */
void lockfs_fdlock_granted_via(struct stripe *s, const char *name, const char *owner,
			       uint64_t file);

/* Take every grant of NAME remembered with FILE out of S: a chain (NULL
 * when none) that the caller ends and frees with lockfs_fdlock_free. */
struct fdlock_via *lockfs_fdlock_take_file(struct stripe *s, const char *name, uint64_t file);

/* Free a chain (from lockfs_fdlock_take_file, or all of S's at close). */
void lockfs_fdlock_free(struct fdlock_via *v);
void lockfs_fdlock_free_all(struct stripe *s);

/* An fd lock whose owner let go (last close, LOCK_UN) while the store
 * could not be written, or a grant the log refused that the store would
 * not take back: still held in DIR, by nobody.  The tick retries, and the
 * `released` line is written when the store takes it (none for a grant
 * whose `acquired` the log never had). */
struct unlock_retry {
	struct unlock_retry *next;
	char *name;
	/* "": an rmdir of a process- or slug-bound holder that the store
	 * refused (-EIO) with LOCKFS_BE_RETRY_RELEASES: the engine completes
	 * it, logged `released` with retried=1. */
	char owner[LOCKFS_FD_OWNER_MAX];
	uint64_t fence;          /* of that holder: only that grant is ended */
	bool logged;             /* its `acquired` is in the log */
	/* owner "": the holder, for its `released` line when the store
	 * completed the refused release itself (a write of unknown outcome
	 * that etcd applied late): the lock is then gone when retried. */
	char who[WHO_MAX];
	uid_t uid;
	pid_t pid;
	/* owner "": when the refused rmdir came (the log's time format), for
	 * the `released` line's asked=: the holder's critical section ended
	 * then, whenever the store applied the delete. */
	char asked[32];
};

/* Is holder I of REC OWNER's fd grant on HOST (this daemon's)?  FENCE 0:
 * any of OWNER's grants.  An owner is an open file of this mount ("flock:"
 * and a file handle number), which another host's daemon may give out too. */
bool lockfs_fdlock_holder_is(const struct lockfs_record *rec, size_t i, const char *owner,
			     uint64_t fence, const char *host);
/* Which holder of NAME's record REC is OWNER's?  Its index or -1.  A grant
 * that OWNER let go but the store still holds (struct unlock_retry) is not
 * OWNER's any more: the key may already name a new open file or process. */
long lockfs_fdlock_holder_of(struct stripe *s, const char *name, const struct lockfs_record *rec,
			     const char *owner, const char *host);
/* OWNER let go of its grant FENCE of NAME but the store could not be
 * written (ERR): remember it for the tick; its `released` line is written
 * then if LOGGED (not for a grant the log refused) -- also when the store
 * turns out to have applied the release itself (the holder is noted from
 * NAME's cached record, as the failed release left it).  ASKED_MS is when
 * OWNER let go (wall ms; 0: now), the `released` line's asked=: the failed
 * write took up to the store's time bound, and the critical section ended
 * when the holder asked, not when the store gave up.  Returns the retry
 * (the one already kept for that grant, if any), or NULL: no memory, or
 * a retry ended that grant already (nothing is left to do). */
struct unlock_retry *lockfs_fdlock_retry_add(struct lockfs_table *t, struct stripe *s,
					     const char *name, const char *owner,
					     uint64_t fence, int err, bool logged, int64_t asked_ms);
/* The retry at *PP is done (its grant ended, logged or not): unlinked,
 * freed, and its grant remembered as ended, so that a late view of it is
 * nobody's (lockfs_fdlock_holder_of) and gets no second retry. */
void lockfs_fdlock_retry_done(struct stripe *s, struct unlock_retry **pp);
/* Grant FENCE of NAME ended otherwise (lost with its session): no retry of
 * its release is left, and no `released` line will follow. */
void lockfs_fdlock_retry_forget(struct stripe *s, const char *name, uint64_t fence);
/* Is holder I of NAME's record REC a grant whose descriptor let go while
 * the store refused the release (struct unlock_retry)? */
bool lockfs_fdlock_retry_pending(struct stripe *s, const char *name,
				 const struct lockfs_record *rec, size_t i);
/* The event that ends holder I of NAME's record REC: "released", or NULL
 * for a grant the log refused and the store would not take back, whose
 * `acquired` the log never had. */
const char *lockfs_fdlock_release_event(struct stripe *s, const char *name,
					const struct lockfs_record *rec, size_t i);
/* Free S's retries (at close: the locks stay in the store, and the next
 * start rebinds them). */
void lockfs_fdlock_free_retries(struct stripe *s);

#endif
