/*
 * Liveness: a thread that watches holder processes through pidfds and
 * ticks timers, and drives the engine from outside, as the kernel does.
 * It serves no FUSE request, so what it calls may take the engine's
 * mutexes and block on the backing store without stalling the mount.
 */
#ifndef LOCKFS_CORE_LIVENESS_H
#define LOCKFS_CORE_LIVENESS_H

#include <stdbool.h>
#include <sys/types.h>

#include "fds.h"

struct lockfs_liveness;

/* Ticks that found nothing before the thread sleeps: a daemon at work (a
 * lock taken now and then) keeps ticking as it always did, and pays no
 * wake per request; an idle one sleeps after about a second. */
#define LOCKFS_LIVENESS_IDLE_TICKS 20

/* Called from the liveness thread, with no liveness mutex held. */
typedef void (*lockfs_exited_fn)(void *arg, pid_t pid, unsigned long long start_time);
/* Returns whether anything is left to tick for (a lease, a retry, a
 * waiter...): false lets the thread sleep until lockfs_liveness_wake(). */
typedef bool (*lockfs_tick_fn)(void *arg);
/* Do a bounded slice of queued work; true when some is left (the thread
 * then comes back to it as soon as it has looked for events). */
typedef bool (*lockfs_work_fn)(void *arg);

/*
 * Make a watcher.  EXITED is called once for each watched process that
 * exits; TICK about every TICK_MS milliseconds while it says something is
 * left to tick for, and LOCKFS_LIVENESS_IDLE_TICKS more; then not until
 * lockfs_liveness_wake() or a kick (an idle daemon wakes for nothing).  Nothing is called before
 * lockfs_liveness_run().  Returns 0 and *OUT, or -errno.
 */
int lockfs_liveness_new(struct lockfs_liveness **out, lockfs_exited_fn exited,
			lockfs_tick_fn tick, void *arg, int tick_ms)
	__attribute__((warn_unused_result));

/* Count pidfds as descriptors kept in FDS (NULL: no limit).  Before
 * anything is watched. */
void lockfs_liveness_set_fds(struct lockfs_liveness *lv, struct lockfs_fds *fds);

/* Call WORK after every round of events and ticks (see lockfs_work_fn).
 * Before lockfs_liveness_run(). */
void lockfs_liveness_set_work(struct lockfs_liveness *lv, lockfs_work_fn work);

/* Start the thread (after any fork(): threads do not survive it).
 * Returns 0 or -errno. */
int lockfs_liveness_run(struct lockfs_liveness *lv) __attribute__((warn_unused_result));

/*
 * Watch process (PID, START) for one more lock (watches are counted: one
 * pidfd per process, however many locks it holds).  When no pidfd can be
 * had right now (the daemon may keep no more descriptors, or pidfd_open
 * fails with EMFILE, ENFILE or ENOMEM), the process is watched by polling
 * /proc/PID/stat (pid, start time, not a zombie) every tick, and given a
 * pidfd as soon as one can be had: a holder is never left unwatched for
 * want of a descriptor.  Returns 0 while the process lives (or cannot be
 * told dead), -ESRCH when it is gone or PID now names another process
 * (then nothing is watched), or -ENOMEM.
 */
int lockfs_liveness_watch(struct lockfs_liveness *lv, pid_t pid, unsigned long long start)
	__attribute__((warn_unused_result));

/* Is (PID, START) watched and alive right now (its pidfd not readable)?
 * Then PID names it and nobody else.  false when unknown (polled) or dead. */
bool lockfs_liveness_alive(struct lockfs_liveness *lv, pid_t pid, unsigned long long start);

/*
 * The same, with PIDFD already open on PID from before START was read (so
 * it cannot name a stranger, see holder.h).  Takes PIDFD over in every
 * case (past what the daemon may keep, it is closed and the process
 * polled).  Returns 0, -ESRCH, or -ENOMEM.
 */
int lockfs_liveness_watch_fd(struct lockfs_liveness *lv, pid_t pid, unsigned long long start,
			     int pidfd) __attribute__((warn_unused_result));

/* Is some process with PID watched (any start time)?  A hint only. */
bool lockfs_liveness_watches_pid(struct lockfs_liveness *lv, pid_t pid);

/* Drop one watch of (PID, START). */
void lockfs_liveness_unwatch(struct lockfs_liveness *lv, pid_t pid, unsigned long long start);

/*
 * Send SIG to (PID, START) through its pidfd, so a recycled pid is never
 * hit.  Returns 0, -ESRCH when it is gone, or -errno.
 */
int lockfs_liveness_signal(struct lockfs_liveness *lv, pid_t pid, unsigned long long start, int sig);

/* Stop the thread (if running) and wait for it; idempotent. */
void lockfs_liveness_stop(struct lockfs_liveness *lv);
/* Wake the thread now, so that its work callback (lockfs_liveness_set_work)
 * runs without waiting for the next tick.  Any thread; never blocks. */
void lockfs_liveness_kick(struct lockfs_liveness *lv);
/* Something may now need the tick (a lease, a retry, a waiter, a burst of
 * refusals to log): if the thread sleeps because its last tick found
 * nothing, tick at once (and then as long as the tick says so).  Costs an
 * atomic load otherwise.  Any thread, also a signal handler (an atomic
 * exchange and an eventfd write); never blocks.  LV may be NULL. */
void lockfs_liveness_wake(struct lockfs_liveness *lv);

/* Stop the thread and free everything (pidfds included). */
void lockfs_liveness_free(struct lockfs_liveness *lv);

#endif
