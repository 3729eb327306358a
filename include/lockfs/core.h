/*
 * The lock engine: names, holders, records, the backend and the audit log
 * put together.  It knows nothing of FUSE: fs/ turns each request into one
 * call here, and each result into one reply.
 *
 * Every function returns 0 or a negative errno, and is safe to call from
 * several threads at once.
 */
#ifndef LOCKFS_CORE_H
#define LOCKFS_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/backend.h"
#include "lockfs/holder.h"

struct lockfs_core;

struct lockfs_core_config {
	int dirfd;               /* the backing directory (borrowed) */
	struct lockfs_backend *backend; /* taken over by the core */
	const char *helpers;     /* ':'-separated; NULL = default */
	const char *fence_path;  /* persisted fence counter; NULL = DIR/.fence */
	const char *log_name;    /* audit log, relative to dirfd; NULL = lock.log */
	const struct lockfs_proc_source *procs; /* NULL = /proc */
};

/* Who sent a request, as FUSE reports it. */
struct lockfs_caller {
	pid_t tid; /* thread id in the daemon's pid ns; 0 = not visible */
	uid_t uid;
	gid_t gid;
};

/* What the mount shows of a held lock. */
struct lockfs_lock_stat {
	uid_t uid;          /* holder's uid (foreign: owner of DIR/NAME.lock) */
	gid_t gid;
	int64_t mtime_ms;   /* acquisition time */
	uint64_t identity;  /* changes whenever the stored lock changes */
	uint64_t generation; /* one acquisition of the name: its fence (foreign
				locks: the store's identity) */
	bool foreign;       /* held without a record lockfs can read */
};

int lockfs_core_open(struct lockfs_core **out, const struct lockfs_core_config *cfg)
	__attribute__((warn_unused_result));
void lockfs_core_close(struct lockfs_core *core);

/* mkdir: acquire NAME for the caller's resolved holder.
 * 0 (ST filled, may be NULL), -EINVAL/-ENAMETOOLONG (bad name),
 * -EEXIST (held), -EACCES (holder cannot be established), -errno. */
int lockfs_core_acquire(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller, struct lockfs_lock_stat *st);

/* rmdir: release NAME if the caller is its holder or a descendant.
 * 0, -ENOENT (not held), -EPERM (not the holder's), -EACCES, -errno. */
int lockfs_core_release(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller);

/* Is NAME held?  0 (ST filled), -ENOENT (not held or not a valid name). */
int lockfs_core_stat(struct lockfs_core *core, const char *name,
		     struct lockfs_lock_stat *st);

/* Render NAME's `owner` JSON for a reader with uid READER (the token only
 * for the holder's uid and root).  Malloc'd in *JSON.  0, -ENOENT. */
int lockfs_core_owner(struct lockfs_core *core, const char *name, uid_t reader,
		      char **json, size_t *len);

/* NAME's operation text ("" when none), malloc'd.  0, -ENOENT. */
int lockfs_core_operation(struct lockfs_core *core, const char *name,
			  char **text, size_t *len);

/* Could the caller release NAME (the rmdir rule)?  0, -EPERM, -ENOENT, -EACCES. */
int lockfs_core_check_holder(struct lockfs_core *core, const char *name,
			     const struct lockfs_caller *caller);

/* Set NAME's operation to TEXT (LEN bytes; one trailing newline dropped;
 * empty clears it), if the caller may release NAME.
 * 0, -EPERM, -EFBIG (> LOCKFS_OPERATION_MAX), -EINVAL (not UTF-8), -ENOENT. */
int lockfs_core_set_operation(struct lockfs_core *core, const char *name,
			      const struct lockfs_caller *caller,
			      const char *text, size_t len);

/* Names of all held locks with a valid name, sorted bytewise.
 * *NAMES is a malloc'd NULL-terminated array; free with lockfs_names_free. */
int lockfs_core_list(struct lockfs_core *core, char ***names, size_t *count);
void lockfs_names_free(char **names);

/* A fresh read-only descriptor on the audit log, for `M/.log`. */
int lockfs_core_log_open_ro(struct lockfs_core *core);

#endif
