/*
 * What stat(2) and lookup show: the attributes of the root, M/.log, a lock
 * directory and its files, M/.flock and its files, and the text a lock's
 * file reads as (whose length is its size).  Each asks the core for the
 * lock's state; none answers a request but lockfs_attr_reply_entry.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attr.h"
#include "fs.h"

const char *const lockfs_lock_file_names[LF_COUNT] = {
	[LF_OWNER] = "owner",
	[LF_OPERATION] = "operation",
	[LF_FENCE] = "fence",
	[LF_LEASE] = "lease",
	[LF_BREAK] = "break",
	[LF_WAITERS] = "waiters",
	[LF_BIND] = "bind",
};

static void ms_to_timespec(int64_t ms, struct timespec *ts)
{
	ts->tv_sec = ms / 1000;
	ts->tv_nsec = (ms % 1000) * 1000000;
}

/* Attributes of the root: the mount point, as the mounting user made it. */
void lockfs_attr_root(struct lockfs_fs *fs, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = FUSE_ROOT_ID;
	/* Sticky and open to all, like /tmp: anyone may take a lock, only
	 * its holder may release it (the daemon decides, not mode bits). */
	st->st_mode = S_IFDIR | 01777;
	st->st_nlink = 2;
	st->st_uid = fs->mount_uid;
	st->st_gid = fs->mount_gid;
	st->st_atim = st->st_mtim = st->st_ctim = fs->mounted_at;
}

/* Attributes of M/.log: the audit log file's size and times.  Returns 0. */
int lockfs_attr_log(struct lockfs_fs *fs, struct stat *st)
{
	struct stat lst;
	int fd = lockfs_core_log_open_ro(fs->core);

	memset(st, 0, sizeof(*st));
	if (fd >= 0) {
		if (fstat(fd, &lst) == 0) {
			st->st_size = lst.st_size;
			st->st_atim = lst.st_atim;
			st->st_mtim = lst.st_mtim;
			st->st_ctim = lst.st_ctim;
		}
		close(fd);
	}
	st->st_ino = INO_LOG;
	st->st_mode = S_IFREG | 0444;
	st->st_nlink = 1;
	st->st_uid = fs->mount_uid;
	st->st_gid = fs->mount_gid;
	return 0;
}

/* Attributes of lock directory node ID, or of FILE inside it. */
void lockfs_attr_lock(struct lockfs_fs *fs, uint64_t id, enum lock_file file,
		      const struct lockfs_lock_stat *ls, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino_make(id, file);
	st->st_uid = ls->uid;
	st->st_gid = ls->gid;
	st->st_nlink = 1;
	ms_to_timespec(ls->mtime_ms, &st->st_mtim);
	st->st_atim = st->st_ctim = st->st_mtim;
	switch (file) {
	case LF_DIR:
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		break;
	case LF_OWNER:
	case LF_FENCE:
	case LF_WAITERS:
		st->st_mode = S_IFREG | 0444;
		break;
	case LF_BIND:
		/* The holder decides by the rmdir rule, not by mode bits. */
		st->st_mode = S_IFREG | 0666;
		break;
	case LF_BREAK:
		/* Breaking is for root and the user who mounted. */
		st->st_mode = S_IFREG | 0200;
		st->st_uid = fs->mount_uid;
		st->st_gid = fs->mount_gid;
		break;
	default:
		st->st_mode = S_IFREG | 0644;
		break;
	}
}

/*
 * The lock name of inode INO into NAME, and NAME's state now into *LS (may
 * be NULL); with SAME_GENERATION only while INO still shows the
 * acquisition that holds NAME now (attr.h: lockfs_attr_lock_name, and
 * lockfs_attr_walk_lock_name without it).  0, -ENOENT, or -ESTALE for a
 * node the daemon dropped (inode.c: the kernel looks the name up again).
 */
static int lock_name_of(struct lockfs_fs *fs, fuse_ino_t ino, char name[NAME_MAX + 1],
			struct lockfs_lock_stat *ls, bool same_generation)
{
	struct lockfs_lock_stat cur;
	uint64_t generation;
	int rc;

	if (!ino_is_lock(ino))
		return -ENOENT;
	rc = lockfs_inodes_name(fs->inodes, ino_id(ino), name, &generation);
	if (rc == 0)
		rc = name[0] == '/' ? lockfs_core_slot_stat(fs->core, name + 1, &cur) /* slots.c */
				    : lockfs_core_stat(fs->core, name, &cur);
	if (rc == 0 && same_generation && cur.generation != generation)
		rc = -ENOENT;
	if (rc == 0 && ls)
		*ls = cur;
	return rc;
}

int lockfs_attr_lock_name(struct lockfs_fs *fs, fuse_ino_t ino, char name[NAME_MAX + 1],
			struct lockfs_lock_stat *ls)
{
	return lock_name_of(fs, ino, name, ls, true);
}

int lockfs_attr_walk_lock_name(struct lockfs_fs *fs, fuse_ino_t ino, char name[NAME_MAX + 1],
			       struct lockfs_lock_stat *ls)
{
	return lock_name_of(fs, ino, name, ls, false);
}

/*
 * What REQ's caller reads in FILE of LOCK now: the text an open for reading
 * takes, and so the size stat shows.  sendfile(2), splice(2) and
 * copy_file_range(2) stop at the size (busybox cat uses sendfile): a size
 * of 0 would read as empty.  *DATA is malloc'd (NULL for nothing).
 */
int lockfs_attr_render(struct lockfs_fs *fs, fuse_req_t req, const char *lock, enum lock_file file,
		  const struct lockfs_lock_stat *ls, char **data, size_t *len)
{
	*data = NULL;
	*len = 0;
	switch (file) {
	case LF_FENCE:
		*data = malloc(24);
		if (!*data)
			return -ENOMEM;
		*len = ls->fence ? (size_t)snprintf(*data, 24, "%" PRIu64 "\n", ls->fence)
				 : (size_t)snprintf(*data, 24, "null\n");
		return 0;
	case LF_LEASE:
		return lockfs_core_lease(fs->core, lock, data, len);
	case LF_WAITERS:
		if (lock[0] == '/') /* a slotted name's line (slots.c) */
			return lockfs_core_slot_waiters(fs->core, lock + 1, data, len);
		return lockfs_core_waiters(fs->core, lock, data, len);
	case LF_BIND:
		return lockfs_core_binding(fs->core, lock, data, len);
	case LF_OWNER: {
		/* For this reader: the token only for the holder's uid and
		 * root (root in a container: over its own container's). */
		struct lockfs_caller reader;

		lockfs_fs_caller(req, &reader);
		if (lock[0] == '/') /* a slotted name's: every slot's holders */
			return lockfs_core_slot_owner(fs->core, lock + 1, &reader, data, len);
		return lockfs_core_owner(fs->core, lock, &reader, data, len);
	}
	case LF_OPERATION:
		return lockfs_core_operation(fs->core, lock, data, len);
	default:
		return 0; /* the lock directory, break: nothing to read */
	}
}

/* ST's size: what REQ's caller would read now (see lockfs_attr_render). */
void lockfs_attr_content_size(struct lockfs_fs *fs, fuse_req_t req, const char *lock,
			 enum lock_file file, const struct lockfs_lock_stat *ls, struct stat *st)
{
	char *data = NULL;
	size_t len;

	if (file != LF_DIR && lockfs_attr_render(fs, req, lock, file, ls, &data, &len) == 0)
		st->st_size = (off_t)len;
	free(data);
}

/* Reply to a lookup of FILE in lock NAME, taking a kernel reference. */
void lockfs_attr_reply_entry(fuse_req_t req, struct lockfs_fs *fs, const char *name,
			     enum lock_file file, const struct lockfs_lock_stat *ls)
{
	struct fuse_entry_param e;
	uint64_t id = lockfs_inodes_ref(fs->inodes, name, ls->generation, fuse_req_ctx(req)->uid);

	if (!id)
		return (void)fuse_reply_err(req, ENOMEM);
	memset(&e, 0, sizeof(e));
	e.ino = ino_make(id, file);
	lockfs_attr_lock(fs, id, file, ls, &e.attr);
	lockfs_attr_content_size(fs, req, name, file, ls, &e.attr);
	e.attr_timeout = 0;
	e.entry_timeout = 0;
	if (fuse_reply_entry(req, &e) == -ENOENT)
		lockfs_inodes_forget(fs->inodes, id, 1); /* interrupted: the kernel took no reference */
}

/* Attributes of M/.flock: read-only to all, made at mount time. */
void lockfs_attr_flock_dir(struct lockfs_fs *fs, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = INO_FLOCK_DIR;
	st->st_mode = S_IFDIR | 0555;
	st->st_nlink = 2;
	st->st_uid = fs->mount_uid;
	st->st_gid = fs->mount_gid;
	st->st_atim = st->st_mtim = st->st_ctim = fs->mounted_at;
}

void lockfs_attr_flock_file(struct lockfs_fs *fs, fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	/* Anyone may open it to wait; it holds nothing to protect. */
	st->st_mode = S_IFREG | 0666;
	st->st_nlink = 1;
	st->st_uid = fs->mount_uid;
	st->st_gid = fs->mount_gid;
	st->st_atim = st->st_mtim = st->st_ctim = fs->mounted_at;
}
