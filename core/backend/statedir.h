/*
 * A store's local state directory: the directory the daemon checks before
 * it trusts it, holds for its whole life (one daemon per directory, by
 * flock(2) on DIR/.lockfs) and writes its pid into.  The dir backend's
 * store is this directory itself; a distributed backend keeps only its
 * audit log and pid here.
 */
#ifndef LOCKFS_BACKEND_STATEDIR_H
#define LOCKFS_BACKEND_STATEDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "lockfs/backend.h" /* lockfs_takeover_fn */

/* The file whose flock(2) says "a daemon serves this directory". */
#define LOCKFS_STATEDIR_LOCK ".lockfs"

/* How long a new daemon waits for a predecessor that is stopping (it got
 * SIGTERM or SIGINT, or its mount was unmounted) to let go of DIR. */
#define LOCKFS_STATEDIR_WAIT_MS 10000

struct lockfs_statedir {
	int dirfd;   /* the directory, open (owned) */
	int lockfd;  /* DIR/.lockfs, flock'ed exclusively (owned) */
	char *path;  /* as given, for messages (owned) */
	bool pid_recorded;  /* lockfs_statedir_record_pid wrote ours */
	struct lockfs_predecessor prev;
};

/*
 * Check PATH and take it: it exists (IS_DEFAULT: created 0700 when
 * missing), is a directory, is neither group- nor world-writable, belongs
 * to the daemon's user or root, and is writable; then flock DIR/.lockfs,
 * which must be a plain file of the daemon's own with one link.  When
 * another process holds that lock, TAKEOVER (may be NULL: refuse) decides
 * whether it was a wedged predecessor.  Returns 0 and fills *SD, or -errno
 * with one line in WHY (no "lockfs: " prefix), and nothing held.
 */
int lockfs_statedir_open(struct lockfs_statedir *sd, const char *path, bool is_default,
			 lockfs_takeover_fn takeover, void *takeover_arg,
			 char *why, size_t why_size)
	__attribute__((warn_unused_result));

/* Write the daemon's pid into DIR/.lockfs (after fuse_daemonize's fork:
 * the flock belongs to the open file, so it survives).  0, or -errno after
 * a warning on stderr. */
int lockfs_statedir_record_pid(struct lockfs_statedir *sd);

/* The predecessor's pid has been reported (its `daemon-crashed` or
 * `daemon-taken-over` line is in the log): empty DIR/.lockfs so that a
 * start that fails before recording its own pid does not report it again. */
void lockfs_statedir_forget_predecessor(struct lockfs_statedir *sd);

/*
 * This daemon is stopping: say so to a successor that finds DIR taken, so
 * that it waits for us instead of refusing (an OFD lock on the first byte
 * of DIR/.lockfs, which goes with the daemon).  Async-signal-safe: called
 * from the SIGTERM handler.
 */
void lockfs_statedir_mark_stopping(const struct lockfs_statedir *sd);

/*
 * Another process holds LOCKFD's flock.  If it is a daemon that is
 * stopping (lockfs_statedir_mark_stopping, or SIGTERM/SIGINT pending for
 * the pid in the file), wait up to LOCKFS_STATEDIR_WAIT_MS for it to let
 * go, and take the flock.  Returns 0 (held now; *WAITED_PID and
 * *WAITED_MS say whom and how long), -EBUSY (a daemon that is not
 * stopping: looked at twice, 50 ms apart), or -ETIMEDOUT (still stopping
 * at the bound).  In core/backend/predecessor.c.
 */
int lockfs_statedir_wait_predecessor(int lockfd, pid_t *waited_pid, unsigned *waited_ms);

/* The pid in DIR/.lockfs (LOCKFD), or 0 when it is empty or holds no pid.
 * In core/backend/predecessor.c. */
pid_t lockfs_statedir_pid_in(int lockfd);

/* Let go of DIR/.lockfs and close everything (the lock file stays; it is
 * emptied if it holds our pid: the mark of a clean stop). */
void lockfs_statedir_close(struct lockfs_statedir *sd);

#endif
