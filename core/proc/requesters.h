/*
 * Repeat requesters: what a lock request reads of its process in /proc
 * and what stays the same until the process runs another program -- the
 * executable, LOCKFS_SLUG (from the environment it was exec'd with) and
 * the command line -- kept per process (pid, start time), so that a
 * process taking lock after lock is read in full once per exec.  With
 * them its identity as /proc/PID/stat showed it (start time, parent,
 * session, comm), which the events below also cover, so that a repeat
 * requester's lock request reads nothing of /proc at all.
 *
 * Exact only together with the process-event connector: an entry is
 * dropped when its process execs (the EXEC event is queued during
 * execve(2) itself, so it is read before the new program can make a
 * request), exits, renames itself (COMM), starts a session (SID) or
 * loses its parent (the parent's EXIT: it is re-parented), and
 * everything is dropped when events are lost.  A process's exit is
 * queued before its pid can be freed, so a pid that changed hands is
 * never taken for its old owner once pending events are taken in.
 * The caller takes in pending events (lockfs_descendants_sync, which
 * feeds lockfs_requesters_event) before it trusts an entry, and without
 * working events it must not use this at all.
 *
 * An entry is learned in two steps, so that an exec between the /proc
 * reads and the store can never leave the old program's facts behind:
 * lockfs_requesters_claim before the first read, lockfs_requesters_put
 * after the last; an event for the process in between voids the claim.
 *
 * Thread-safe: one mutex, a leaf (taken under the descendants tracker's
 * mutex by the event callback).
 */
#ifndef LOCKFS_CORE_REQUESTERS_H
#define LOCKFS_CORE_REQUESTERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/limits.h"
#include "lockfs/descendants.h"

struct lockfs_requesters;

/* What is kept of one process until it execs. */
struct lockfs_requester {
	char exe[256];               /* as lockfs_proc.exe: not a helper's */
	char slug[LOCKFS_SLUG_MAX];  /* LOCKFS_SLUG, "" when unset (never a bad one) */
	char **cmdline;              /* NULL-terminated argv (malloc'd) */
	/* As lockfs_proc's, read after the claim (0/"" when not known:
	 * then lockfs_requesters_current does not answer). */
	unsigned long long start;
	pid_t ppid, sid;
	char comm[64];
};

/* A new, empty cache.  0 or -ENOMEM. */
int lockfs_requesters_new(struct lockfs_requesters **out)
	__attribute__((warn_unused_result));
void lockfs_requesters_free(struct lockfs_requesters *r);

/* The observer for lockfs_descendants_observe (CTX is the cache): drops
 * the entry of a process that execs or exits, everything on NULL. */
void lockfs_requesters_event(void *ctx, const struct lockfs_proc_event *ev);

/*
 * The facts of process (PID, START) into *OUT, its cmdline a malloc'd
 * copy (free with lockfs_argv_free).  Returns 0, -ENOENT when not known,
 * -ENOMEM.
 */
int lockfs_requesters_get(struct lockfs_requesters *r, pid_t pid, unsigned long long start,
			  struct lockfs_requester *out);

/*
 * The facts of process PID, whatever its start time, with its identity
 * (OUT->start, ppid, sid, comm): for a request from thread PID, known to
 * be the process's leader when an entry answers.  Only exact after the
 * caller took in pending events, and with a pidfd of PID opened before
 * that when one is wanted.  Returns 0, -ENOENT (not known, or known
 * without its identity), -ENOMEM.
 */
int lockfs_requesters_current(struct lockfs_requesters *r, pid_t pid,
			      struct lockfs_requester *out);

/* Is there an entry for PID (a hint: lockfs_requesters_current decides)? */
bool lockfs_requesters_known(struct lockfs_requesters *r, pid_t pid);

/* Begin to learn (PID, START): returns the ticket for lockfs_requesters_put
 * (never 0). */
uint64_t lockfs_requesters_claim(struct lockfs_requesters *r, pid_t pid,
				 unsigned long long start);

/* Keep FACTS (copied) for process PID under TICKET, unless an event for
 * it, or a later claim of its slot, came in since the claim.  Returns
 * true when kept. */
bool lockfs_requesters_put(struct lockfs_requesters *r, pid_t pid, uint64_t ticket,
			   const struct lockfs_requester *facts);

#endif
