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

struct lockfs_liveness;

/* Called from the liveness thread, with no liveness mutex held. */
typedef void (*lockfs_exited_fn)(void *arg, pid_t pid, unsigned long long start_time);
typedef void (*lockfs_tick_fn)(void *arg);

/*
 * Make a watcher.  EXITED is called once for each watched process that
 * exits; TICK about every TICK_MS milliseconds.  Nothing is called before
 * lockfs_liveness_run().  Returns 0 and *OUT, or -errno.
 */
int lockfs_liveness_new(struct lockfs_liveness **out, lockfs_exited_fn exited,
			lockfs_tick_fn tick, void *arg, int tick_ms)
	__attribute__((warn_unused_result));

/* Start the thread (after any fork(): threads do not survive it).
 * Returns 0 or -errno. */
int lockfs_liveness_run(struct lockfs_liveness *lv) __attribute__((warn_unused_result));

/*
 * Watch process (PID, START) for one more lock (watches are counted: one
 * pidfd per process, however many locks it holds).  Returns 0 while the
 * process lives, -ESRCH when it is gone or PID now names another process
 * (then nothing is watched), or -errno.
 */
int lockfs_liveness_watch(struct lockfs_liveness *lv, pid_t pid, unsigned long long start)
	__attribute__((warn_unused_result));

/* Is (PID, START) watched and alive right now (its pidfd not readable)?
 * Then PID names it and nobody else.  false when unknown or dead. */
bool lockfs_liveness_alive(struct lockfs_liveness *lv, pid_t pid, unsigned long long start);

/*
 * The same, with PIDFD already open on PID from before START was read (so
 * it cannot name a stranger, see holder.h).  Takes PIDFD over in every
 * case.  Returns 0, or -errno.
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

/* Stop the thread and free everything (pidfds included). */
void lockfs_liveness_free(struct lockfs_liveness *lv);

#endif
