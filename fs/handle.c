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

#include "fs.h"
#include "handle.h"

void lockfs_handle_add(struct lockfs_fs *fs, struct handle *h)
{
	pthread_mutex_lock(&fs->handles_mu);
	h->prev = NULL;
	h->next = fs->handles;
	if (h->next)
		h->next->prev = h;
	fs->handles = h;
	pthread_mutex_unlock(&fs->handles_mu);
}

void lockfs_handle_del(struct lockfs_fs *fs, struct handle *h)
{
	pthread_mutex_lock(&fs->handles_mu);
	if (h->prev)
		h->prev->next = h->next;
	else
		fs->handles = h->next;
	if (h->next)
		h->next->prev = h->prev;
	pthread_mutex_unlock(&fs->handles_mu);
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
		h->free(h);
	}
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
