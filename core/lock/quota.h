/*
 * What one user may hold: locks, parked waiters and open files per uid,
 * locks in all, and the `refused` log line of each burst of refusals.
 * Internal to core/; the engine counts, the mount asks.
 *
 * Root (uid 0) is counted like everyone but never refused: the room past
 * every cap is root's, so that system services keep working when users
 * have used up their share (as ext4 keeps blocks for root).
 *
 * Thread-safe: one mutex, a leaf (taken inside a stripe mutex, never the
 * other way round; nothing is called with it held).
 */
#ifndef LOCKFS_CORE_QUOTA_H
#define LOCKFS_CORE_QUOTA_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* A cap that is never reached. */
#define QUOTA_NONE UINT32_MAX

enum quota_reason {
	QUOTA_OPEN_PER_UID,    /* EMFILE: -o max_open_per_uid */
	QUOTA_FD_RESERVE,      /* EMFILE: the daemon's descriptors are the reserve's */
	QUOTA_LOCKS_PER_UID,   /* EDQUOT: -o max_locks_per_uid */
	QUOTA_WAITERS_PER_UID, /* EDQUOT: -o max_waiters_per_uid */
	QUOTA_LOCKS,           /* ENOSPC: -o max_locks */
};

struct quota_limits {
	uint32_t open_per_uid;
	uint32_t locks_per_uid;
	uint32_t waiters_per_uid;
	uint32_t locks;
};

/* A burst of refusals of one uid for one reason, as logged. */
struct quota_burst {
	struct quota_burst *next;
	uid_t uid;
	enum quota_reason reason;
	uint64_t count;
	uint32_t limit;       /* the cap refused at; QUOTA_NONE for the fd reserve */
	int64_t first_ms, last_ms; /* monotonic */
	char who[300];        /* the first refused caller */
	pid_t pid;            /* the process WHO stands for (0 = not known) */
	char name[256];       /* what it asked for first ("" = nothing named) */
};

struct quota;

/* A quota with caps LIM.  0 and -ENOMEM. */
int lockfs_quota_new(struct quota **out, const struct quota_limits *lim)
	__attribute__((warn_unused_result));
void lockfs_quota_free(struct quota *q);

/* Change the open-file cap (its default is known only once the daemon's
 * descriptor limit is). */
void lockfs_quota_set_open_limit(struct quota *q, uint32_t open_per_uid);

/* "open-per-uid", "fd-reserve", "locks-per-uid", "waiters-per-uid", "locks". */
const char *lockfs_quota_reason_name(enum quota_reason r);

/*
 * Room for one more lock of UID before it is made; GROWS: it adds to the
 * locks in all (not a hand-off, which replaces one).  Counts the
 * reservation until lockfs_quota_lock_unreserve(), which comes after the lock is
 * counted (lockfs_quota_locks_add) or failed: so concurrent acquisitions never
 * overshoot a cap.  0, -EDQUOT (*WHY = LOCKS_PER_UID) or -ENOSPC (LOCKS).
 */
int lockfs_quota_lock_reserve(struct quota *q, uid_t uid, bool grows, enum quota_reason *why)
	__attribute__((warn_unused_result));
void lockfs_quota_lock_unreserve(struct quota *q, uid_t uid, bool grows);
/* Locks of UID come (DELTA > 0) or go.  Never refuses. */
void lockfs_quota_locks_add(struct quota *q, uid_t uid, int delta);
/* Locks counted for UID now, and in all. */
uint64_t lockfs_quota_locks_of(struct quota *q, uid_t uid);
uint64_t lockfs_quota_locks_total(struct quota *q);

/* One more parked waiter of UID.  0 or -EDQUOT (WAITERS_PER_UID). */
int lockfs_quota_waiter_add(struct quota *q, uid_t uid) __attribute__((warn_unused_result));
void lockfs_quota_waiter_sub(struct quota *q, uid_t uid);

/* One more open file or directory of UID.  0 or -EMFILE (OPEN_PER_UID). */
int lockfs_quota_open_add(struct quota *q, uid_t uid) __attribute__((warn_unused_result));
void lockfs_quota_open_sub(struct quota *q, uid_t uid);

/*
 * Count a refusal of UID for REASON (NAME: what was asked for, may be
 * NULL).  Returns true when it starts a burst: the caller then says who
 * asked, with lockfs_quota_burst_who() (outside any mutex: it may read /proc):
 * WHO as the log names it, PID the process it stands for (0 = not known).
 */
bool lockfs_quota_refused(struct quota *q, uid_t uid, enum quota_reason reason, const char *name);
void lockfs_quota_burst_who(struct quota *q, uid_t uid, enum quota_reason reason, const char *who,
			    pid_t pid);

/*
 * Hand every burst that has ended to EMIT and forget it: ended means 1 s
 * without a refusal, or 10 s since it began (ALL: every burst, at exit).
 * EMIT is called with no mutex held.
 */
/* No burst of refusals waits to be logged (the tick has nothing to flush). */
bool lockfs_quota_idle(struct quota *q);
void lockfs_quota_flush(struct quota *q, bool all,
		 void (*emit)(void *arg, const struct quota_burst *b), void *arg);

#endif
