/* Attributes and contents of the mount's nodes (attr.c). */
#ifndef LOCKFS_FS_ATTR_H
#define LOCKFS_FS_ATTR_H

#include <limits.h>
#include <stddef.h>
#include <sys/stat.h>

#include "fs.h"

/* The names of the files in a lock directory, by enum lock_file (LF_DIR
 * has none). */
extern const char *const lockfs_lock_file_names[LF_COUNT];

/* Attributes of the root. */
void lockfs_attr_root(struct lockfs_fs *fs, struct stat *st);
/* Attributes of M/.log.  Returns 0. */
int lockfs_attr_log(struct lockfs_fs *fs, struct stat *st);
/* Attributes of lock directory node ID, or of FILE inside it, for state LS. */
void lockfs_attr_lock(struct lockfs_fs *fs, uint64_t id, enum lock_file file,
		      const struct lockfs_lock_stat *ls, struct stat *st);
/*
 * The lock name of inode INO into NAME, and the lock's current state into
 * *LS (may be NULL), provided INO still shows the acquisition that holds
 * NAME now.  An inode of a released lock answers ENOENT for good, even
 * after someone takes the name again: the check for what changes a lock,
 * and for files already open.  0, -ENOENT.
 */
int lockfs_attr_lock_name(struct lockfs_fs *fs, fuse_ino_t ino, char name[NAME_MAX + 1],
			  struct lockfs_lock_stat *ls);
/*
 * lockfs_attr_lock_name for a request that only looks, made on the way
 * along a path -- a lookup in INO, or the getattr, opendir or read-only
 * open of the node a walk just found: it answers for NAME as it is now,
 * *LS the acquisition that holds it now, even when INO is of an earlier
 * one; -ENOENT only when NAME is not held.  A reader whose walk met a
 * hand-off between looking up NAME and NAME/owner would otherwise see a
 * held lock as free (the kernel walks again only on ESTALE, once, and a
 * churning name can change twice within one walk).  What changes a lock
 * (a write, setattr) keeps lockfs_attr_lock_name's check.
 */
int lockfs_attr_walk_lock_name(struct lockfs_fs *fs, fuse_ino_t ino, char name[NAME_MAX + 1],
			       struct lockfs_lock_stat *ls);
/*
 * What REQ's caller reads in FILE of LOCK now: the text an open for reading
 * takes, and so the size stat shows.  *DATA is malloc'd (NULL for nothing).
 * 0 or -errno.
 */
int lockfs_attr_render(struct lockfs_fs *fs, fuse_req_t req, const char *lock,
		       enum lock_file file, const struct lockfs_lock_stat *ls, char **data,
		       size_t *len);
/* ST's size: what REQ's caller would read now (see lockfs_attr_render). */
void lockfs_attr_content_size(struct lockfs_fs *fs, fuse_req_t req, const char *lock,
			      enum lock_file file, const struct lockfs_lock_stat *ls,
			      struct stat *st);
/* Reply to a lookup of FILE in lock NAME, taking a kernel reference: the
 * request's one reply. */
void lockfs_attr_reply_entry(fuse_req_t req, struct lockfs_fs *fs, const char *name,
			     enum lock_file file, const struct lockfs_lock_stat *ls);
/* Attributes of M/.flock, and of the .flock file node INO. */
void lockfs_attr_flock_dir(struct lockfs_fs *fs, struct stat *st);
void lockfs_attr_flock_file(struct lockfs_fs *fs, fuse_ino_t ino, struct stat *st);

#endif
