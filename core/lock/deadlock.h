/*
 * Deadlock detection for fd-lock waits (deadlock.c): the wait-for graph
 * of this daemon's parked flock/fcntl requests, and the check a new wait
 * runs once it is parked.  A wait that would close a cycle -- P holds A
 * and waits for B while Q, holding B, waits for A -- is taken back and
 * answered EDEADLK; the others keep waiting.  Who holds and who waits is
 * judged by the rmdir rule: a waiter that is a descendant of a holder of
 * A counts as holding A.
 *
 * Concurrency: struct lockfs_deadlock has two mutexes of its own.
 * check_mu lets one check run at a time (so that of two waits closing
 * one cycle at once, exactly one fails); it is taken with no stripe mutex
 * held, and a check takes stripe mutexes under it, one at a time.  mu
 * guards the graph and is a leaf: taken under a stripe mutex (a parked
 * request answered), never held while another mutex is taken.
 */
#ifndef LOCKFS_LOCK_DEADLOCK_H
#define LOCKFS_LOCK_DEADLOCK_H

#include <sys/types.h>

#include "table.h"

struct lockfs_deadlock;

/* 0 or -ENOMEM. */
int lockfs_deadlock_new(struct lockfs_deadlock **out) __attribute__((warn_unused_result));
/* At close, with no request left: frees what the graph still holds. */
void lockfs_deadlock_free(struct lockfs_deadlock *dl);

/* The process a wait is for (its holder-to-be), as the audit line names it. */
struct lockfs_deadlock_waiter {
	pid_t pid;
	unsigned long long start_time;
	uid_t uid;              /* of the caller */
	const char *who;        /* lockfs_audit_who's text */
};

/*
 * W was just parked in NAME's queue for OWNER (lockfs_queue_enter gave
 * -EINPROGRESS) by WAITER; call with no mutex held.  Joins W to the graph,
 * unless it closes a cycle: then W is taken out of the queue (its place
 * not kept), a `deadlock` line names the cycle, and -EDEADLK comes back
 * for the caller to answer.  Otherwise -EINPROGRESS: W waits, its DONE
 * answers (the graph interposes on W->done to see the wait end).
 */
int lockfs_deadlock_check(struct lockfs_table *t, struct lockfs_deadlock *dl, const char *name,
			  const char *owner, const struct lockfs_deadlock_waiter *waiter,
			  struct lockfs_wait *w);

/* W was taken back (lockfs_queue_cancel gave 0): it leaves the graph. */
void lockfs_deadlock_cancelled(struct lockfs_deadlock *dl, struct lockfs_wait *w);

#endif
