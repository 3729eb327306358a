/*
 * An engine without a mount, for unit tests: lockfs_core_open on the fake
 * store (fake_backend.h), the fake process table (fake_procs.h) and a
 * fake clock, with the audit log in a temporary directory.  The liveness
 * thread is never started: a test drives what it would do -- ticks, a
 * holder's exit, a change the store reports -- through the engine's own
 * entry points (lock/recovery.h, lock/changes.h), one step at a time, so
 * every outcome is decided before the call returns.
 *
 * One harness at a time per process (the clock and the process table
 * are global).  Every function fails the running cmocka test on a setup
 * error.
 */
#ifndef LOCKFS_TEST_ENGINE_HARNESS_H
#define LOCKFS_TEST_ENGINE_HARNESS_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/backend.h"
#include "lockfs/core.h"

struct lockfs_table;

/* What to open the engine with (zero: the defaults). */
struct engine_options {
	uint32_t lease_s;  /* of slug-bound locks; 0: the engine's 600 */
	uint32_t stale_s;  /* be->stale_s: foreign locks may go stale (the fake
			      calls them stale once 1 s old) */
	unsigned caps;     /* be->caps (LOCKFS_BE_SESSIONS...: a store like etcd) */
	uint32_t max_locks_per_uid; /* -o max_locks_per_uid; 0: the default */
};

struct engine_harness {
	struct fake_store *store;
	struct lockfs_backend *be;   /* the core's once open; valid until close */
	struct lockfs_core *core;
	struct lockfs_table *t;      /* lockfs_core_table(core) */
	char dir[PATH_MAX];          /* temporary: lock.log */
	int64_t wall0_ms, boot0_ms;  /* the fake clock's start */
	int64_t offset_ms;           /* how far it has been moved */
	pid_t next_pid;              /* engine_proc's next pid */
};

/* Open H (O may be NULL).  The fake clock starts at the real time. */
void engine_open(struct engine_harness *h, const struct engine_options *o);
/* Close the core, free the store, remove the directory, reset the process
 * table and the clock. */
void engine_close(struct engine_harness *h);

/* A new live process of uid 1000 (its own session, parent init) carrying
 * LOCKFS_SLUG=SLUG (NULL: none).  Its pid: above any real pid, so that a
 * scan of the real /proc (descendants) never finds it. */
pid_t engine_proc(struct engine_harness *h, const char *slug);
/* The request of process PID, as FUSE would report it. */
struct lockfs_caller engine_caller(pid_t pid);

/* mkdir and rmdir of NAME by process PID: lockfs_core_acquire/release's
 * answer (0 or -errno). */
int engine_acquire(struct engine_harness *h, pid_t pid, const char *name);
int engine_release(struct engine_harness *h, pid_t pid, const char *name);
/* NAME's `owner` text (malloc'd), or NULL when it is not held. */
char *engine_owner(struct engine_harness *h, const char *name);

/* Move the fake clock (wall and boot) on by MS. */
void engine_advance(struct engine_harness *h, int64_t ms);
/* One tick of the liveness thread, then its queued work to the end. */
void engine_tick(struct engine_harness *h);
/* The liveness thread's queued work to the end (changes first). */
void engine_work(struct engine_harness *h);
/* PID exits (its pidfds fire) and the liveness thread reports it, as its
 * epoll would; then the work is done. */
void engine_exit(struct engine_harness *h, pid_t pid);
/* The store reports NAME changed (as its watch would); then the work. */
void engine_changed(struct engine_harness *h, const char *name);

/* Plant a lock of NAME in the store, made from the record of a lock the
 * engine grants PID (then released), with its holder's host and boot id
 * replaced (NULL: kept).  HOST other than the fake's makes it another
 * daemon's lock (fake_backend_other_host). */
void engine_plant(struct engine_harness *h, const char *name, pid_t pid,
		  const char *host, const char *boot_id);

/* The audit log so far (malloc'd, NUL-terminated). */
char *engine_log(struct engine_harness *h);
/* How many lines of the log are EVENT about NAME and carry every
 * "key=value" of the NULL-terminated KV (may be NULL). */
int engine_logged(struct engine_harness *h, const char *name, const char *event,
		  const char *const *kv);

#endif
