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

#include "lockfs/backend.h" /* lockfs_takeover_fn */

/* The file whose flock(2) says "a daemon serves this directory". */
#define LOCKFS_STATEDIR_LOCK ".lockfs"

struct lockfs_statedir {
	int dirfd;   /* the directory, open (owned) */
	int lockfd;  /* DIR/.lockfs, flock'ed exclusively (owned) */
	char *path;  /* as given, for messages (owned) */
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
int lockfs_statedir_record_pid(const struct lockfs_statedir *sd);

/* Let go of DIR/.lockfs and close everything (the lock file stays). */
void lockfs_statedir_close(struct lockfs_statedir *sd);

#endif
