/*
 * The FIFO queue of each name, grants and hand-off, and letting a holder
 * go (queue.c).  The queue lives next to the cache, under the same stripe
 * mutex; every function here is called with that mutex held unless it
 * says otherwise.
 */
#ifndef LOCKFS_LOCK_QUEUE_H
#define LOCKFS_LOCK_QUEUE_H

#include <stdbool.h>
#include <stdint.h>

#include "table.h"

/* One place in a name's FIFO queue (queue.c). */
struct qentry {
	struct qentry *next, *prev;
	struct lockfs_wait *w;   /* NULL: a place kept for an interrupted waiter */
	char owner[LOCKFS_FD_OWNER_MAX];
	uint64_t via_file;       /* the open file it asks through (0: none) */
	/* The kernel's number of the request (lockfs_caller.ticket; 0:
	 * unknown): the queue is kept in this order, so a waiter whose
	 * request the kernel resends after a restart keeps its place. */
	uint64_t ticket;
	enum lockfs_mode mode;
	struct lockfs_proc who;  /* the holder-to-be (helpers skipped) */
	char **cmdline;          /* its argv, read when it asked (may be NULL) */
	char *slug;              /* the caller's LOCKFS_SLUG, or NULL */
	uid_t uid;               /* of the caller */
	gid_t gid;
	int64_t since_ms;        /* wall clock, for `waiters` */
	int64_t keep_until_ms;   /* boot clock: a kept place's end */
	bool nowait;             /* LOCK_NB: never takes a place in the store */
	/* Its place in the store's own line (a backend that orders contenders
	 * across daemons, etcd): rank 0 while it has none.  BE is the store it
	 * was taken in, so whoever unlinks the entry can leave it. */
	struct lockfs_place place;
	struct lockfs_backend *be;
};

/* The waiters of one name; exists while it has any. */
struct lockq {
	struct lockq *next;
	char *name;
	struct qentry *head, *tail;
	size_t nactive;          /* entries with a parked request */
};

/* How a holder lets go (lockfs_queue_let_go_locked). */
struct lockfs_let_go {
	uint64_t identity;        /* the store identity C was read with */
	size_t index;             /* which holder: 0 = rec.holder, I = rec.shares[I - 1] */
	bool all;                 /* the whole lock, every holder (a break) */
	const char *event;        /* logged for that holder; NULL: nothing */
	uint64_t ticket;          /* the request that lets go (lockfs_caller.ticket;
				     0: none), kept in the record of a waiter it
				     hands the lock to (record.handed_by) */
	const char *const *extra; /* more key, value, ..., NULL after fence=, uid=,
				     pid= (may be NULL) */
};

/*
 * Holder HOW->index of C lets go (or, HOW->all, every holder): the last
 * holder releases the lock, which goes straight to the queue's head if
 * someone waits (the store never shows it free in between); any other
 * holder is removed from the record.  HOW->event is logged for that holder
 * once the store took the change, and before s->mu is let go: nobody is
 * granted NAME through this daemon in between, because every grant
 * happens, and every `acquired` line is written, only after taking s->mu
 * -- so the log never shows two holders at once, nor a release that did
 * not happen.  The line never waits for the log: a full disk delays the
 * line, never the release.  No line either for a grant whose `acquired`
 * the log refused (C unlogged).
 * C must be fresh (read from the store under this hold of s->mu).
 * 0 (C changed or dropped), -ENOENT (gone behind our back: C dropped,
 * nothing logged), or -errno of the store (-EIO): then the lock is still
 * held, C is read back as the store has it, and nothing is logged.
 */
int lockfs_queue_let_go_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			       const struct lockfs_let_go *how);

/* NAME's queue, or NULL. */
struct lockq *lockfs_queue_find(struct stripe *s, const char *name);
/* Does NAME have a waiter with a parked request? */
bool lockfs_queue_has_waiters(struct stripe *s, const char *name);
/* Grant NAME's head (and the shared requests right behind it) if the lock
 * allows now; drops the queue when it is empty. */
void lockfs_queue_grant_locked(struct lockfs_table *t, struct stripe *s, const char *name);
/* lockfs_queue_grant_locked for every queue of S: when the store says
 * anything may have changed (changes.c), and once a second for waiters
 * the store could not answer (recovery.c). */
void lockfs_queue_poll_locked(struct lockfs_table *t, struct stripe *s);
/* OWNER lets go of NAME: a place kept for it is no longer wanted. */
/*
 * A new session SESSION is live: every entry of S's queues whose place in
 * the store's line was taken in an earlier session (now gone with it)
 * takes a new place at the tail, in queue order, logged `requeued`; kept
 * places of the old session are dropped.
 */
void lockfs_queue_rejoin_locked(struct lockfs_table *t, struct stripe *s, int64_t session);

void lockfs_queue_forget_kept(struct stripe *s, const char *name, const char *owner);

/*
 * E (malloc'd by the caller and filled: who, owner, via_file, mode, uid,
 * gid, since_ms, cmdline, slug; taken over) asks for RQ's lock, parking W
 * if it must wait.  Takes s->mu itself.  0: granted now (or held already
 * in that mode); -EINPROGRESS: parked, W->done answers later;
 * -EWOULDBLOCK (RQ->wait false), -EDQUOT, -ENOLCK, -errno.
 */
int lockfs_queue_enter(struct lockfs_table *t, struct qentry *e, const struct lockfs_fd_request *rq,
		       struct lockfs_wait *w);
/* W's parked request for NAME is taken back; its place is kept a while
 * for the same owner.  Takes s->mu itself.  0 or -EALREADY (answered). */
int lockfs_queue_cancel(struct lockfs_table *t, const char *name, struct lockfs_wait *w);

/* Free every queue, retry and via-file entry of S (at close). */
void lockfs_queue_free_all(struct stripe *s);

#endif
