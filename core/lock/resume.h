/*
 * A daemon that takes over a live FUSE connection (resume.c): the open
 * files of the mount are still open, and the requests its predecessor had
 * read but not answered come back, resent by the kernel, in no particular
 * order (lockfs_core_config.resuming, lockfs_caller.resent).
 *
 * What it keeps: an fd lock found in the store stays an fd lock of the same
 * open file (lockfs_resume_keep_locked, instead of rebound.h); and for a
 * short while after the takeover (the hold) no waiter is granted, so that a
 * waiter whose resent request has not come back yet keeps its place ahead
 * of those that came back first (the queue is ordered by lockfs_caller.
 * ticket: queue.c).  The hold ends at lockfs_resume_end (the request loop
 * says every resent request has come in) or by the tick, and then every
 * queue is served.
 */
#ifndef LOCKFS_LOCK_RESUME_H
#define LOCKFS_LOCK_RESUME_H

#include <stdbool.h>
#include <stdint.h>

#include "table.h"

/* At lockfs_core_open, before the startup scan: RESUMING or not.  A
 * resuming table holds waiters until LOCKFS_RESUME_HOLD_MS from now. */
void lockfs_resume_init(struct lockfs_table *t, bool resuming);
/* The startup scan of a resuming daemon found C (with s->mu held): its fd
 * holders stay bound to their open files, and a holder's fcntl grant is
 * ended again by the last close of the open file it came through
 * (fdlock.h).  Nothing is logged: nothing changed. */
void lockfs_resume_keep_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c);
/* A resent request reached the engine: the hold lasts at least
 * LOCKFS_RESUME_QUIET_MS more.  No mutex needed. */
void lockfs_resume_note_resent(struct lockfs_table *t);
/* End the hold now (every resent request has come in) and serve every
 * queue.  Takes each stripe mutex in turn: call with none held. */
void lockfs_resume_end(struct lockfs_table *t);
/* The liveness thread's tick: end the hold once its time is up. */
void lockfs_resume_tick(struct lockfs_table *t);

#endif
