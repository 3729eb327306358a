/*
 * The mount's slots (docs/slots.md): M/.slots, where `mkdir
 * M/.slots/NAME=N` takes one of N slots of NAME and `rmdir M/.slots/NAME`
 * lets the caller's go, and where M/.slots/NAME, while any slot is held,
 * is a directory whose `owner` lists every holder with its slot; and
 * M/.flock/.slots, whose files NAME=N wait for a slot (flock.c, with the
 * node name "/NAME=N").
 *
 * A slot's directory node is named "/NAME" (or "/NAME=N" for the entry a
 * mkdir answers with): '/' is in no lock name, so attr.c and flock.c tell
 * slotted nodes from locks by their first byte.  "NAME=N" is never found
 * by a lookup: every taker's mkdir reaches the daemon (the kernel would
 * answer EEXIST itself for an entry it found), and the entry a mkdir
 * answers with vanishes at the next lookup (entry timeout 0).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "attr.h"
#include "fs.h"
#include "lockfs/limits.h"
#include "lockfs/name.h"

void lockfs_slots_dir_attr(struct lockfs_fs *fs, fuse_ino_t ino, struct stat *st)
{
	lockfs_attr_flock_dir(fs, st);
	st->st_ino = ino;
}

static void reply_dir(fuse_req_t req, struct lockfs_fs *fs, fuse_ino_t ino)
{
	struct fuse_entry_param e = { .ino = ino };

	lockfs_slots_dir_attr(fs, ino, &e.attr);
	fuse_reply_entry(req, &e);
}

/* "/" NAME into NODE; -ENAMETOOLONG. */
static int node_name(char node[NAME_MAX + 1], const char *name)
{
	if (strlen(name) > LOCKFS_NAME_MAX)
		return -ENAMETOOLONG;
	snprintf(node, NAME_MAX + 1, "/%s", name);
	return 0;
}

bool lockfs_slots_lookup(fuse_req_t req, struct lockfs_fs *fs, fuse_ino_t parent,
			 const char *name)
{
	char node[NAME_MAX + 1], base[LOCKFS_NAME_MAX + 1];
	struct lockfs_lock_stat ls;
	unsigned cap;
	int rc;

	if ((parent == FUSE_ROOT_ID || parent == INO_FLOCK_DIR) && strcmp(name, ".slots") == 0) {
		reply_dir(req, fs, parent == FUSE_ROOT_ID ? INO_SLOTS_DIR : INO_FLOCK_SLOTS_DIR);
		return true;
	}
	if (parent == INO_FLOCK_SLOTS_DIR) {
		rc = node_name(node, name);
		if (rc < 0)
			fuse_reply_err(req, -rc);
		else
			lockfs_flock_lookup(req, fs, node);
		return true;
	}
	if (parent != INO_SLOTS_DIR)
		return false;
	/* NAME=N never exists: see the top of this file. */
	rc = lockfs_slot_request_parse(name, base, sizeof(base), &cap);
	if (rc == 0)
		rc = -ENOENT;
	else
		rc = node_name(node, name);
	if (rc == 0)
		rc = lockfs_core_slot_stat(fs->core, name, &ls);
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else
		lockfs_attr_reply_entry(req, fs, node, LF_DIR, &ls);
	return true;
}

void lockfs_slots_mkdir(fuse_req_t req, struct lockfs_fs *fs, const char *name)
{
	struct lockfs_caller caller;
	struct lockfs_lock_stat ls;
	char node[NAME_MAX + 1];
	int rc = node_name(node, name);

	lockfs_fs_caller(req, &caller);
	if (rc == 0)
		rc = lockfs_core_slot_acquire(fs->core, name, &caller, &ls);
	if (rc < 0)
		return (void)fuse_reply_err(req, -rc);
	lockfs_attr_reply_entry(req, fs, node, LF_DIR, &ls);
}

void lockfs_slots_rmdir(fuse_req_t req, struct lockfs_fs *fs, const char *name)
{
	struct lockfs_caller caller;

	lockfs_fs_caller(req, &caller);
	fuse_reply_err(req, -lockfs_core_slot_release(fs->core, name, &caller));
}
