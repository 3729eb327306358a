/* Open files and directory listings: the handles of the mount (handle.c). */
#ifndef LOCKFS_FS_HANDLE_H
#define LOCKFS_FS_HANDLE_H

#include <stdbool.h>
#include <stddef.h>

#include "fs.h"

/* An open file: a snapshot to read, or the holder's text being written. */
struct open_file {
	struct handle h; /* first */
	char *data;
	size_t len;
	int fd; /* the audit log, for INO_LOG; else -1 */
	/* `operation` opened for writing: DATA not yet applied (a write that
	 * ended inside a UTF-8 character); applied at the next write or at
	 * close (flush). */
	bool pending;
	/* Made again by a successor (lockfs_handles_restore): its text is
	 * rendered at the first read. */
	bool restored;
	/* `operation` opened with O_TRUNC: the text before, put back if the
	 * first write is refused (a refused write changes nothing). */
	char *before;
	size_t before_len;
	/* M/.events (events_file.c): the reader's cursor, the names it
	 * watches (each NUL-terminated, an empty one last; NULL: all), under
	 * the events' mutex. */
	bool events;
	uint64_t cursor;
	char *watch;
	/* The engine was told this reader follows WATCH (from its first read
	 * or write until close); under the events' follow_mu. */
	bool following;
};

/* A directory listing, taken at opendir so offsets stay meaningful. */
struct dir_snapshot {
	struct handle h; /* first */
	char **names; /* NULL-terminated; entries 0.. are after "." and ".." */
	size_t count;
	fuse_ino_t self;
	bool slotted;  /* a slotted name's view (slots.c): owner and waiters only */
};

/* A new open file (no data, no fd), or NULL when out of memory. */
struct open_file *lockfs_open_file_new(void);
void lockfs_open_file_free(struct open_file *of);
/* A new, empty directory listing, or NULL when out of memory. */
struct dir_snapshot *lockfs_dir_snapshot_new(void);
void lockfs_dir_snapshot_free(struct handle *h);

/* Count a handle of INO for REQ's caller (see lockfs_core_handle_open)
 * into H, keeping INO's node while it is open.  0, -EMFILE, or -ESTALE
 * (the daemon dropped the node: the kernel walks the path again).  Each 0
 * is matched by one lockfs_handle_uncount (lockfs_handle_del does it). */
int lockfs_handle_count(struct lockfs_fs *fs, fuse_req_t req, fuse_ino_t ino, struct handle *h);
/* Undo lockfs_handle_count for H. */
void lockfs_handle_uncount(struct lockfs_fs *fs, struct handle *h);
/* H, of INO opened with FLAGS, is open: into the list that
 * lockfs_handles_free_all empties, under a new fh (also in the state, for
 * a successor).  Returns the fh for fi->fh. */
uint64_t lockfs_handle_add(struct lockfs_fs *fs, struct handle *h, fuse_ino_t ino, int flags);
/* The open handle FH, or NULL (a predecessor's that could not be made
 * again, or a bad fh). */
struct handle *lockfs_handle_find(struct lockfs_fs *fs, uint64_t fh);
/* H is closed: out of the list, and no longer counted against its uid. */
void lockfs_handle_del(struct lockfs_fs *fs, struct handle *h);

#endif
