/*
 * Descendants: the processes a lock holder started while it held a lock,
 * wherever they were re-parented.  A process-bound lock whose holder
 * exits is kept while any of them lives (docs/holder.md).
 *
 * For each watched holder (a "root") the module keeps the set of
 * processes forked from it, or from a process already in the set, since
 * it was watched.  The facts come from an event source: the kernel's
 * process-event connector (procevents.c), one FORK and one EXIT event per
 * process, and a SID event when a process starts a session of its own.
 * A descendant that does so (setsid(1), most daemons) leaves the set, and
 * so do the processes it starts from then on: the way to start a daemon
 * that does not keep its starter's lock.  Where events are missing -- no connector, events lost to a
 * full socket, a daemon restart -- a scan of /proc stands in: it counts
 * every live process of the holder's session, and every process under one
 * already counted, that started no earlier than the holder and is still
 * in the holder's session (its session at acquisition).  Counting too
 * many keeps a lock longer; counting too few is what must never happen.
 *
 * No thread of its own: pending events are taken in (drained) before each
 * answer that depends on them and on every tick.  Safe to call from
 * several threads; one mutex, taken after a stripe mutex, never before.
 */
#ifndef LOCKFS_DESCENDANTS_H
#define LOCKFS_DESCENDANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/record.h"

struct lockfs_descendants;

/* One process as /proc shows it: what the tracking needs. */
struct lockfs_desc_proc {
	pid_t pid, ppid, sid;
	unsigned long long start; /* field 22 of /proc/PID/stat */
	int threads;              /* field 20 */
	bool zombie;              /* state Z or X */
	char comm[16];
};

/* Where process facts come from: /proc in the daemon, a table in tests. */
struct lockfs_desc_procs {
	/* Describe process PID.  0, -ENOENT when there is none, -errno. */
	int (*stat)(void *ctx, pid_t pid, struct lockfs_desc_proc *out);
	/* Call FN for every process (FN returns nonzero to stop).  0, or
	 * -errno when the list cannot be had: then nothing is known. */
	int (*each)(void *ctx, int (*fn)(void *arg, const struct lockfs_desc_proc *p),
		    void *arg);
	void *ctx;
};

/* /proc of the daemon's pid namespace. */
extern const struct lockfs_desc_procs lockfs_desc_procs_real;

enum lockfs_proc_event_kind {
	LOCKFS_PROC_FORK = 1, /* a new task: a process when pid == tgid */
	LOCKFS_PROC_EXIT,     /* a task exits: a thread-group leader when pid == tgid */
	LOCKFS_PROC_SID,      /* a process starts a session of its own (setsid(2)):
			       * the new session's id is its tgid */
	LOCKFS_PROC_EXEC,     /* process TGID runs a new program (execve(2));
			       * not used here, passed to the observer */
	LOCKFS_PROC_COMM,     /* task PID of process TGID was renamed (prctl(2)
			       * PR_SET_NAME, a write to /proc/PID/comm); not
			       * used here, passed to the observer */
};

struct lockfs_proc_event {
	enum lockfs_proc_event_kind kind;
	pid_t pid, tgid;      /* the new (FORK) or exiting (EXIT) task */
	pid_t parent_tgid;    /* FORK: the process that forked it */
	uint64_t mono_ns;     /* when (CLOCK_MONOTONIC) */
};

/* A stream of process events, in the order they happened. */
struct lockfs_event_source {
	/* Up to MAX pending events into EVS without blocking.  Returns how
	 * many (0: none pending), -ENOBUFS once after events were lost, or
	 * -errno. */
	int (*read)(void *ctx, struct lockfs_proc_event *evs, int max);
	void *ctx;
};

/*
 * Make a tracker.  EVENTS NULL: no event source, every answer comes from
 * a scan.  PROCS NULL: /proc.  Returns 0 and *OUT, or -errno.
 */
int lockfs_descendants_new(struct lockfs_descendants **out,
			   const struct lockfs_event_source *events,
			   const struct lockfs_desc_procs *procs)
	__attribute__((warn_unused_result));
void lockfs_descendants_free(struct lockfs_descendants *d);

/* "connector" or "scan": what its answers come from. */
const char *lockfs_descendants_mechanism(const struct lockfs_descendants *d);

/*
 * Holder (PID, START), of session SID (0: read it from /proc), takes one
 * more lock: from now on its forks are counted (watches are counted per
 * process, like liveness watches).  SCAN: also count what a scan finds
 * now -- for a holder found alive at daemon start, whose earlier forks no
 * event told.  Returns 0 or -errno.
 */
int lockfs_descendants_watch(struct lockfs_descendants *d, pid_t pid,
			     unsigned long long start, pid_t sid, bool scan)
	__attribute__((warn_unused_result));

/* Drop one watch of (PID, START).  A holder that lets go of its last lock
 * while alive stops counting; one that exited is forgotten once none of
 * its descendants lives. */
void lockfs_descendants_unwatch(struct lockfs_descendants *d, pid_t pid,
				unsigned long long start);

/* A holder that exited, as lockfs_descendants_holder_exited is told. */
struct lockfs_exited_holder {
	pid_t pid;                 /* the holder (PID, START), of session SID */
	unsigned long long start;
	pid_t sid;
	const struct lockfs_descendant *known; /* a record's list; may be NULL */
	size_t nknown;
	bool scan;                 /* look now (daemon start) */
	bool take_ref;             /* count one more watch for the caller */
};

/*
 * Holder H->pid has exited.  Drains pending events first, so every fork
 * it made before it exited is counted.  When the holder was not watched,
 * when H->scan is set (daemon start) or when there is no event source,
 * the processes in H->known that still live are counted and a scan adds
 * what it finds.  H->take_ref: when the result is > 0, count one more
 * watch of the holder for the caller (drop it with
 * lockfs_descendants_unwatch).
 * Returns the number of live descendants, or -errno when it cannot be
 * told (the caller keeps the lock).
 */
int lockfs_descendants_holder_exited(struct lockfs_descendants *d,
				     const struct lockfs_exited_holder *h);

/*
 * How many live descendants (PID, START) has, from what is known now (no
 * drain: cheap enough for every tick).  *VERSION (may be NULL) changes
 * whenever the set does.  Returns the count, or -ENOENT when (PID, START)
 * is not tracked.
 */
int lockfs_descendants_count(struct lockfs_descendants *d, pid_t pid,
			     unsigned long long start, uint64_t *version);

/*
 * The live descendants of (PID, START), after a drain: a malloc'd array
 * of at most LOCKFS_DESCENDANTS_MAX, sorted by pid, in *OUT (NULL when
 * none), *N, and *VERSION (may be NULL) as lockfs_descendants_count gives
 * it.  Returns 0, -ENOENT when not tracked, or -errno.
 */
int lockfs_descendants_list(struct lockfs_descendants *d, pid_t pid, unsigned long long start,
			    struct lockfs_descendant **out, size_t *n, uint64_t *version);

/*
 * Is process (CALLER, CALLER_START), or one of its ancestors, a live
 * descendant of holder (PID, START)?  Drains first, so a process forked
 * an instant ago counts.  Unknown counts as no.
 */
bool lockfs_descendants_acts_for(struct lockfs_descendants *d, pid_t pid,
				 unsigned long long start, pid_t caller,
				 unsigned long long caller_start);

/*
 * Housekeeping, about every 50 ms (the liveness thread): drain events,
 * settle processes whose exit was in doubt, and once a second check the
 * descendants of holders that exited against /proc (without an event
 * source: scan for them again).
 */
void lockfs_descendants_tick(struct lockfs_descendants *d);
/* Nothing for lockfs_descendants_tick to do until a watch begins: no
 * process tracked, none in doubt, no scan pending.  D may be NULL. */
bool lockfs_descendants_idle(struct lockfs_descendants *d);

/*
 * Another user of the same events (requesters.c): FN(CTX, EV) is called,
 * under the tracker's mutex, for every event taken in, and FN(CTX, NULL)
 * when events were lost or the source broke (whatever FN learned from
 * them may be out of date).  FN must not call back into D.  Set once,
 * before other threads use D.
 */
void lockfs_descendants_observe(struct lockfs_descendants *d,
				void (*fn)(void *ctx, const struct lockfs_proc_event *ev),
				void *ctx);

/*
 * Take in every pending event now.  Returns true when the events are
 * complete up to this call (an event source, still working): then every
 * exec, exit and setsid that happened before the call has reached the
 * observer (after a loss, its FN(CTX, NULL) came first).  False: there
 * are no events to go by.
 */
bool lockfs_descendants_sync(struct lockfs_descendants *d);

/* Take in one event by hand (unit tests; the drain uses the same path). */
void lockfs_descendants_event(struct lockfs_descendants *d, const struct lockfs_proc_event *ev);

#endif
