/*
 * The files a helper's name stands for in a root: the system directories'
 * trust rules (docs/holder.md, "Genuine helpers"), and the lookup in a
 * caller's own root, which runs off the request path within a bound.
 * Internal to core/proc (helpers.c, procfs.c).
 */
#ifndef LOCKFS_PROC_HELPER_FILES_H
#define LOCKFS_PROC_HELPER_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/* A file, as its device and inode. */
struct lockfs_file_id {
	dev_t dev;
	ino_t ino;
};

/* Add (DEV, INO) to the N ids at SET (room for MAX) unless it is there.
 * Returns the new count. */
size_t lockfs_file_ids_add(struct lockfs_file_id *set, size_t n, size_t max, dev_t dev,
			   ino_t ino);

/* Is the file FD (of directory DIRFD) a safely owned executable in a
 * directory trusted up to the root ROOT (owned by OWNER)?  Fills *ST. */
bool lockfs_helper_file_trusted(int fd, int dirfd, const struct stat *root, uid_t owner,
				struct stat *st);

/*
 * The files NAME stands for in the system directories under ROOTFD (a root
 * directory whose stat is ROOT), into OUT (room for MAX); stops early once
 * WANT (when not NULL) is found.  Returns the count.  This walks paths:
 * call it on the daemon's own root only (see the bounded one below).
 */
size_t lockfs_helper_files_find(int rootfd, const struct stat *root, const char *name,
				struct lockfs_file_id *out, size_t max, const struct stat *want);

/* How long a request waits for a lookup in a caller's root. */
#define LOCKFS_FOREIGN_LOOKUP_MS 250
/* Lookups in callers' roots that may run at once: per caller uid, and in
 * all (a lookup that never ends keeps its place until it does). */
#define LOCKFS_FOREIGN_LOOKUPS_PER_UID 2
#define LOCKFS_FOREIGN_LOOKUPS_MAX 16

/*
 * Is WANT one of the files NAME stands for in the root ROOTFD (whose stat
 * is ROOT) of a process of UID: a container's, or a user's own chroot?
 * That root is the caller's to shape (bind mounts of this very mount,
 * a FUSE file system of its own that never answers), so the walk runs on
 * a thread of its own while the request waits at most
 * LOCKFS_FOREIGN_LOOKUP_MS.  ROOTFD stays the caller's.
 * Returns 1 (it is), 0 (it is not), -ETIMEDOUT (no answer in time: the
 * walk goes on, alone), -EBUSY (UID, or everyone, has as many walks under
 * way as allowed) or -errno.
 */
int lockfs_helper_files_find_foreign(int rootfd, const struct stat *root, const char *name,
				     const struct stat *want, uid_t uid)
	__attribute__((warn_unused_result));

/* fstat(2) that never asks a file system for fresh attributes (statx with
 * AT_STATX_DONT_SYNC): device, inode, mode and owner as the kernel has them.
 * FD, or PATH relative to FD when PATH is not "".  0 or -errno. */
int lockfs_stat_cached(int fd, const char *path, struct stat *st);

#endif
