/*
 * The handles of the mount: every open file and directory listing, on one
 * list (fs->handles, under handles_mu) so that the ones the kernel never
 * releases (the connection is gone) are freed at exit, and each counted
 * against its opener's uid by the core (-o max_open_per_uid).  A handle of
 * a lock file or .flock file keeps its node (inode.c) while it is open:
 * requests on an open file come by node id alone.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "connstate.h"
#include "fs.h"
#include "handle.h"

/* Into the list and the fh table.  Called with handles_mu held. */
static void link_handle(struct lockfs_fs *fs, struct handle *h)
{
	struct handle **bucket = &fs->by_fh[h->fh % LOCKFS_FH_BUCKETS];

	h->prev = NULL;
	h->next = fs->handles;
	if (h->next)
		h->next->prev = h;
	fs->handles = h;
	h->fh_next = *bucket;
	*bucket = h;
}

static bool is_listing(const struct handle *h)
{
	return h->free == lockfs_dir_snapshot_free;
}

uint64_t lockfs_handle_add(struct lockfs_fs *fs, struct handle *h, fuse_ino_t ino, int flags)
{
	struct lockfs_saved_handle *saved = lockfs_connstate_handle_get();

	pthread_mutex_lock(&fs->handles_mu);
	/* Ids, not addresses: the same fh means the same open file in a
	 * successor, and an fh is never another file's later. */
	if (fs->next_fh == 0)
		fs->next_fh = lockfs_connstate_next_fh();
	h->fh = fs->next_fh++;
	lockfs_connstate_set_next_fh(fs->next_fh);
	link_handle(fs, h);
	h->saved = saved;
	if (saved) {
		saved->ino = ino;
		saved->kind = is_listing(h) ? LOCKFS_HK_DIR : LOCKFS_HK_FILE;
		saved->flags = (uint32_t)flags;
		saved->uid = h->uid;
		saved->keeps_fd = h->keeps_fd;
		__atomic_store_n(&saved->fh, h->fh, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&fs->handles_mu);
	return h->fh;
}

struct handle *lockfs_handle_find(struct lockfs_fs *fs, uint64_t fh)
{
	struct handle *h;

	pthread_mutex_lock(&fs->handles_mu);
	for (h = fs->by_fh[fh % LOCKFS_FH_BUCKETS]; h && h->fh != fh; h = h->fh_next)
		;
	pthread_mutex_unlock(&fs->handles_mu);
	return h;
}

void lockfs_handle_del(struct lockfs_fs *fs, struct handle *h)
{
	struct handle **pp;

	pthread_mutex_lock(&fs->handles_mu);
	if (h->prev)
		h->prev->next = h->next;
	else
		fs->handles = h->next;
	if (h->next)
		h->next->prev = h->prev;
	for (pp = &fs->by_fh[h->fh % LOCKFS_FH_BUCKETS]; *pp && *pp != h; pp = &(*pp)->fh_next)
		;
	if (*pp)
		*pp = h->fh_next;
	pthread_mutex_unlock(&fs->handles_mu);
	lockfs_connstate_handle_put(h->saved);
	h->saved = NULL;
	lockfs_handle_uncount(fs, h);
}

/* What INO names, for a `refused` line: the lock or .flock name, `.log`,
 * or "" (M itself, M/.flock). */
static void handle_name(struct lockfs_fs *fs, fuse_ino_t ino, char name[NAME_MAX + 1])
{
	uint64_t generation;

	name[0] = '\0';
	if (ino == INO_LOG)
		strcpy(name, ".log");
	else if ((ino_is_lock(ino) || ino_is_flock(ino)) &&
		 lockfs_inodes_name(fs->inodes, ino_id(ino), name, &generation) < 0)
		name[0] = '\0';
}

int lockfs_handle_count(struct lockfs_fs *fs, fuse_req_t req, fuse_ino_t ino, struct handle *h)
{
	struct lockfs_caller caller;
	char name[NAME_MAX + 1];
	int rc;

	lockfs_fs_caller(req, &caller);
	h->node = 0;
	if (ino_is_lock(ino) || ino_is_flock(ino)) {
		rc = lockfs_inodes_open(fs->inodes, ino_id(ino));
		if (rc < 0)
			return rc;
		h->node = ino_id(ino);
	}
	handle_name(fs, ino, name);
	h->keeps_fd = ino == INO_LOG;
	rc = lockfs_core_handle_open(fs->core, &caller, h->keeps_fd, name);
	if (rc < 0) {
		if (h->node)
			lockfs_inodes_close(fs->inodes, h->node);
		h->node = 0;
		return rc;
	}
	h->uid = caller.uid;
	return 0;
}

void lockfs_handle_uncount(struct lockfs_fs *fs, struct handle *h)
{
	lockfs_core_handle_close(fs->core, h->uid, h->keeps_fd);
	if (h->node)
		lockfs_inodes_close(fs->inodes, h->node);
	h->node = 0;
}

void lockfs_handles_free_all(struct lockfs_fs *fs)
{
	pthread_mutex_lock(&fs->handles_mu);
	while (fs->handles) {
		struct handle *h = fs->handles;

		fs->handles = h->next;
		/* The state keeps it for a successor only while we serve. */
		lockfs_connstate_handle_put(h->saved);
		h->free(h);
	}
	memset(fs->by_fh, 0, sizeof(fs->by_fh));
	pthread_mutex_unlock(&fs->handles_mu);
}

void lockfs_open_file_free(struct open_file *of)
{
	if (!of)
		return;
	if (of->fd >= 0)
		close(of->fd);
	free(of->data);
	free(of->before);
	free(of->watch);
	free(of);
}

static void open_file_free_handle(struct handle *h)
{
	lockfs_open_file_free((struct open_file *)h);
}

void lockfs_dir_snapshot_free(struct handle *h)
{
	struct dir_snapshot *d = (struct dir_snapshot *)h;

	lockfs_names_free(d->names);
	free(d);
}


struct open_file *lockfs_open_file_new(void)
{
	struct open_file *of = calloc(1, sizeof(*of));

	if (of) {
		of->fd = -1;
		of->h.free = open_file_free_handle;
	}
	return of;
}

struct dir_snapshot *lockfs_dir_snapshot_new(void)
{
	struct dir_snapshot *d = calloc(1, sizeof(*d));

	if (d)
		d->h.free = lockfs_dir_snapshot_free;
	return d;
}

/* One saved handle made again (lockfs_handles_restore). */
static int restore_one(struct lockfs_saved_handle *saved, void *arg)
{
	struct lockfs_fs *fs = arg;
	struct lockfs_caller caller = { .uid = saved->uid };
	fuse_ino_t ino = (fuse_ino_t)saved->ino;
	struct handle *h;
	char name[NAME_MAX + 1];

	if (saved->kind == LOCKFS_HK_DIR) {
		struct dir_snapshot *d = lockfs_dir_snapshot_new();

		if (!d)
			return 0;
		d->self = ino;
		/* The listing is taken again: offsets still count entries. */
		if (ino == FUSE_ROOT_ID)
			(void)lockfs_core_list(fs->core, &d->names, &d->count);
		else if (ino == INO_FLOCK_DIR)
			(void)lockfs_core_list_flock(fs->core, &d->names, &d->count);
		h = &d->h;
	} else {
		struct open_file *of = lockfs_open_file_new();

		if (!of)
			return 0;
		of->restored = true;
		if (ino == INO_LOG) {
			int fd = lockfs_core_log_open_ro(fs->core);

			of->fd = fd >= 0 ? fd : -1;
		}
		h = &of->h;
	}
	h->uid = saved->uid;
	h->keeps_fd = saved->keeps_fd;
	h->node = 0;
	if ((ino_is_lock(ino) || ino_is_flock(ino)) &&
	    lockfs_inodes_open(fs->inodes, ino_id(ino)) == 0)
		h->node = ino_id(ino);
	handle_name(fs, ino, name);
	/* Counted again against its uid; over a cap it stays open anyway:
	 * it was granted. */
	(void)lockfs_core_handle_open(fs->core, &caller, h->keeps_fd, name);
	h->fh = saved->fh;
	h->saved = saved;
	pthread_mutex_lock(&fs->handles_mu);
	link_handle(fs, h);
	pthread_mutex_unlock(&fs->handles_mu);
	return 0;
}

void lockfs_handles_restore(struct lockfs_fs *fs)
{
	pthread_mutex_lock(&fs->handles_mu);
	fs->next_fh = lockfs_connstate_next_fh();
	pthread_mutex_unlock(&fs->handles_mu);
	lockfs_connstate_each_handle(restore_one, fs);
}
