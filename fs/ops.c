/*
 * The FUSE request handlers and the ops table: each request -> core
 * call(s) -> exactly one reply.  Attributes and file contents are attr.c's,
 * open handles handle.c's, M/.flock and its locks flock.c's.
 *
 * Every handler ends in a single fuse_reply_*; errors travel up as
 * negative errno and leave through `return (void)fuse_reply_err(req, -rc)`.
 * Entry and attribute timeouts are 0: the backing store can change behind
 * our back (the seed's script, another lockfs instance later), so the
 * kernel asks every time and never caches a negative lookup.
 *
 * No notifications: the daemon never writes a fuse_lowlevel_notify_* to
 * the kernel.  With zero timeouts the next lookup, stat, ls or mkdir asks
 * us and gets the truth, so a lock the engine removed on its own
 * (recovered, broken, an fd lock's last close) is ENOENT and free at once
 * without one.  All a notification would add is DELETE_SELF for an
 * inotify watcher of the lock directory, and the stale dentry dropped
 * before the next lookup or memory pressure drops it.  Its price is a
 * wedge: notify_delete and notify_inval_entry (fuse_reverse_inval_entry)
 * take the parent directory's inode lock uninterruptibly, and every
 * mkdir, rmdir, readdir and uncached lookup in that directory holds that
 * lock while its request waits for our answer -- from the moment the
 * kernel queues it, before any thread of ours has read it.  If the daemon
 * dies (SIGKILL, the OOM killer, a crash) while a thread waits there, the
 * request is never answered, so that thread never leaves the kernel, so
 * the process never finishes exiting, so /dev/fuse is never closed, so
 * the connection is never aborted and the request never ends: every
 * client of the mount hangs in D state until someone writes
 * /sys/fs/fuse/connections/N/abort.  No code of ours runs on SIGKILL, so
 * only never sending such a notification rules that out.  The ones that
 * take no directory lock are no help: inval_inode of attributes is
 * redundant with zero attribute timeouts, and inval_inode of data waits
 * for page locks that a read in flight holds (the same wedge).  So a
 * thread of this process is never inside the kernel waiting for a
 * request of this mount, and SIGKILL always ends it at once, closing
 * /dev/fuse, which aborts the connection and ends every waiting request
 * with ENOTCONN or ECONNABORTED.  See docs/recovery.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attr.h"
#include "events_file.h"
#include "fs.h"
#include "handle.h"
#include "lockfs/limits.h"
#include "lockfs/name.h"
#include "lockfs/record.h"
#include "lockfs/utf8.h"

static struct lockfs_fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* Root and the user who mounted may break any lock. */
static bool may_break(struct lockfs_fs *fs, fuse_req_t req)
{
	uid_t uid = fuse_req_ctx(req)->uid;

	return uid == 0 || uid == fs->mount_uid;
}

static void lfs_init(void *userdata, struct fuse_conn_info *conn)
{
	/* O_TRUNC arrives with open() instead of as a separate setattr, so
	 * `echo x > M/NAME/operation` is one holder-checked request. */
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
	/* Locks belong to the daemon's rules, not to the kernel's page cache. */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
}

static void lfs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct lockfs_fs *fs = fs_of(req);
	struct lockfs_lock_stat ls;
	char lock[NAME_MAX + 1];
	int rc;

	if (lockfs_slots_lookup(req, fs, parent, name))
		return;
	if (parent == FUSE_ROOT_ID) {
		if (strcmp(name, ".log") == 0) {
			struct fuse_entry_param e = { .ino = INO_LOG };

			lockfs_attr_log(fs, &e.attr);
			return (void)fuse_reply_entry(req, &e);
		}
		if (strcmp(name, ".flock") == 0) {
			struct fuse_entry_param e = { .ino = INO_FLOCK_DIR };

			lockfs_attr_flock_dir(fs, &e.attr);
			return (void)fuse_reply_entry(req, &e);
		}
		if (strcmp(name, ".events") == 0 || strcmp(name, ".metrics") == 0) {
			struct fuse_entry_param e = { .ino = name[1] == 'e' ? INO_EVENTS : INO_METRICS };

			lockfs_events_file_attr(fs, e.ino, &e.attr);
			return (void)fuse_reply_entry(req, &e);
		}
		/* Dot names are the daemon's (the engine stores slots under
		 * them): none is a lock of M. */
		if (name[0] == '.')
			return (void)fuse_reply_err(req, ENOENT);
		rc = lockfs_core_stat(fs->core, name, &ls);
		if (rc == -ENOENT && lockfs_core_lost(fs->core, name)) {
			/* A lock lost with the session: its holder's rmdir
			 * (looked up first) answers ESTALE, once. */
			struct lockfs_caller caller;

			lockfs_fs_caller(req, &caller);
			/* A lookup, not the rmdir: a resent one is asked as new. */
			caller.resent = false;
			rc = lockfs_core_release(fs->core, name, &caller);
		}
		if (rc < 0)
			return (void)fuse_reply_err(req, -rc);
		return lockfs_attr_reply_entry(req, fs, name, LF_DIR, &ls);
	}
	if (parent == INO_FLOCK_DIR)
		return lockfs_flock_lookup(req, fs, name);
	if (!ino_is_lock(parent) || ino_file(parent) != LF_DIR)
		return (void)fuse_reply_err(req, ENOTDIR);
	rc = lockfs_attr_walk_lock_name(fs, parent, lock, &ls);
	if (rc < 0)
		return (void)fuse_reply_err(req, -rc);
	for (int f = LF_DIR + 1; f < LF_COUNT; f++)
		if (strcmp(name, lockfs_lock_file_names[f]) == 0 && (lock[0] != '/' || f == LF_OWNER || f == LF_WAITERS))
			return lockfs_attr_reply_entry(req, fs, lock, (enum lock_file)f, &ls);
	fuse_reply_err(req, ENOENT);
}

static void lfs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	if (ino_is_lock(ino) || ino_is_flock(ino))
		lockfs_inodes_forget(fs_of(req)->inodes, ino_id(ino), nlookup);
	fuse_reply_none(req);
}

static void lfs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	for (size_t i = 0; i < count; i++)
		if (ino_is_lock(forgets[i].ino) || ino_is_flock(forgets[i].ino))
			lockfs_inodes_forget(fs_of(req)->inodes, ino_id(forgets[i].ino), forgets[i].nlookup);
	fuse_reply_none(req);
}

/* Attributes of any inode.  0 or -errno. */
static int attr_of(fuse_req_t req, fuse_ino_t ino, struct stat *st)
{
	struct lockfs_fs *fs = fs_of(req);
	struct lockfs_lock_stat ls;
	char lock[NAME_MAX + 1];
	int rc;

	if (ino == FUSE_ROOT_ID) {
		lockfs_attr_root(fs, st);
		return 0;
	}
	if (ino == INO_LOG)
		return lockfs_attr_log(fs, st);
	if (ino == INO_EVENTS || ino == INO_METRICS) {
		lockfs_events_file_attr(fs, ino, st);
		return 0;
	}
	if (ino == INO_FLOCK_DIR) {
		lockfs_attr_flock_dir(fs, st);
		return 0;
	}
	if (ino == INO_SLOTS_DIR || ino == INO_FLOCK_SLOTS_DIR) {
		lockfs_slots_dir_attr(fs, ino, st);
		return 0;
	}
	if (ino_is_flock(ino)) {
		rc = lockfs_flock_name_of(fs, ino, lock);
		if (rc == 0)
			lockfs_attr_flock_file(fs, ino, st);
		return rc;
	}
	rc = lockfs_attr_walk_lock_name(fs, ino, lock, &ls);
	if (rc == 0) {
		lockfs_attr_lock(fs, ino_id(ino), ino_file(ino), &ls, st);
		lockfs_attr_content_size(fs, req, lock, ino_file(ino), &ls, st);
	}
	return rc;
}

static void lfs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;
	int rc = attr_of(req, ino, &st);

	if (rc < 0)
		return (void)fuse_reply_err(req, -rc);
	fuse_reply_attr(req, &st, 0);
}

/* A setattr that only sets times: what `touch` sends. */
#define TIME_BITS (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW | \
		   FUSE_SET_ATTR_MTIME_NOW | FUSE_SET_ATTR_CTIME)

static void lfs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			struct fuse_file_info *fi)
{
	struct lockfs_fs *fs = fs_of(req);
	struct lockfs_caller caller;
	char lock[NAME_MAX + 1];
	enum lock_file file = ino_file(ino);
	struct stat st;
	int rc;

	/* Modes, owners and times of locks are the daemon's to say.  What is
	 * allowed: `touch M/NAME` renews the lease (whoever may release), and
	 * truncating a writable file to 0 (truncate(1), or O_TRUNC without
	 * atomic_o_trunc) as the start of a write. */
	if (ino_is_flock(ino)) {
		/* chmod, utimens, O_TRUNC on a .flock file: accepted, and
		 * nothing changes (lock libraries do all three). */
		rc = attr_of(req, ino, &st);
		if (rc < 0)
			return (void)fuse_reply_err(req, -rc);
		return (void)fuse_reply_attr(req, &st, 0);
	}
	if (!ino_is_lock(ino))
		return (void)fuse_reply_err(req, EPERM);
	lockfs_fs_caller(req, &caller);
	rc = lockfs_attr_lock_name(fs, ino, lock, NULL);
	if (rc < 0)
		return (void)fuse_reply_err(req, -rc);
	if (file == LF_DIR && to_set && !(to_set & ~TIME_BITS) &&
	    (!(to_set & FUSE_SET_ATTR_ATIME) || (to_set & FUSE_SET_ATTR_ATIME_NOW)) &&
	    (!(to_set & FUSE_SET_ATTR_MTIME) || (to_set & FUSE_SET_ATTR_MTIME_NOW))) {
		/* `touch` (times set to now): renew.  Explicit times are
		 * refused below: a lock's times are the daemon's to say. */
		rc = lockfs_core_renew(fs->core, lock, &caller);
	} else if (to_set == FUSE_SET_ATTR_SIZE && attr->st_size != 0) {
		rc = -EINVAL;
	} else if (to_set == FUSE_SET_ATTR_SIZE && file == LF_OPERATION) {
		rc = lockfs_core_set_operation(fs->core, lock, &caller, "", 0);
	} else if (to_set == FUSE_SET_ATTR_SIZE && file == LF_LEASE) {
		rc = lockfs_core_check_holder(fs->core, lock, &caller);
	} else if (to_set == FUSE_SET_ATTR_SIZE && file == LF_BREAK) {
		rc = may_break(fs, req) ? 0 : -EACCES;
	} else if (to_set == FUSE_SET_ATTR_SIZE && file == LF_BIND) {
		rc = lockfs_core_check_holder(fs->core, lock, &caller);
	} else {
		rc = -EPERM;
	}
	if (rc == 0)
		rc = attr_of(req, ino, &st);
	if (rc < 0)
		return (void)fuse_reply_err(req, -rc);
	fuse_reply_attr(req, &st, 0);
}

static void lfs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct lockfs_fs *fs = fs_of(req);
	struct lockfs_caller caller;
	struct lockfs_lock_stat ls;
	int rc;

	if (parent == INO_SLOTS_DIR)
		return lockfs_slots_mkdir(req, fs, name);
	if (parent != FUSE_ROOT_ID)
		return (void)fuse_reply_err(req, EPERM);
	if (name[0] == '.') { /* the daemon's (see lfs_lookup): the name rule's errno */
		rc = lockfs_name_check(name);
		return (void)fuse_reply_err(req, rc == -ENAMETOOLONG ? ENAMETOOLONG : EINVAL);
	}
	lockfs_fs_caller(req, &caller);
	rc = lockfs_core_acquire(fs->core, name, &caller, &ls);
	if (rc < 0)
		return (void)fuse_reply_err(req, -rc);
	lockfs_attr_reply_entry(req, fs, name, LF_DIR, &ls);
}

static void lfs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct lockfs_fs *fs = fs_of(req);
	struct lockfs_caller caller;

	if (parent == INO_SLOTS_DIR)
		return lockfs_slots_rmdir(req, fs, name);
	if (parent != FUSE_ROOT_ID)
		return (void)fuse_reply_err(req, EPERM);
	if (strcmp(name, ".log") == 0 || strcmp(name, ".flock") == 0 ||
	    strcmp(name, ".events") == 0 || strcmp(name, ".metrics") == 0 ||
	    strcmp(name, ".slots") == 0)
		return (void)fuse_reply_err(req, EPERM);
	if (name[0] == '.')
		return (void)fuse_reply_err(req, ENOENT);
	lockfs_fs_caller(req, &caller);
	fuse_reply_err(req, -lockfs_core_release(fs->core, name, &caller));
}

/* Nothing but mkdir and rmdir of locks changes the tree. */
static void lfs_eperm_name(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	fuse_reply_err(req, EPERM);
}

static void lfs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	fuse_reply_err(req, EPERM);
}

static void lfs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	fuse_reply_err(req, EPERM);
}

static void lfs_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		       fuse_ino_t newparent, const char *newname, unsigned int flags)
{
	fuse_reply_err(req, EPERM);
}

static void lfs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	fuse_reply_err(req, EPERM);
}

/* open(O_CREAT) of an entry the kernel does not have: only .flock/NAME
 * of a free NAME, which looks absent until it is opened. */
static void lfs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		       struct fuse_file_info *fi)
{
	if (parent == INO_FLOCK_DIR)
		return lockfs_flock_create(req, fs_of(req), name, fi);
	if (parent == INO_FLOCK_SLOTS_DIR) {
		char node[NAME_MAX + 1];

		if (strlen(name) > LOCKFS_NAME_MAX)
			return (void)fuse_reply_err(req, ENAMETOOLONG);
		snprintf(node, sizeof(node), "/%s", name);
		return lockfs_flock_create(req, fs_of(req), node, fi);
	}
	fuse_reply_err(req, EPERM);
}

static void lfs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct lockfs_fs *fs = fs_of(req);
	struct lockfs_caller caller;
	struct lockfs_lock_stat ls;
	char lock[NAME_MAX + 1];
	struct open_file *of;
	int writing = (fi->flags & O_ACCMODE) != O_RDONLY;
	int rc = 0;

	if (ino == FUSE_ROOT_ID || ino == INO_FLOCK_DIR || ino == INO_SLOTS_DIR ||
	    ino == INO_FLOCK_SLOTS_DIR)
		return (void)fuse_reply_err(req, EISDIR);
	of = lockfs_open_file_new();
	if (!of)
		return (void)fuse_reply_err(req, ENOMEM);
	rc = lockfs_handle_count(fs, req, ino, &of->h);
	if (rc < 0) {
		lockfs_open_file_free(of);
		return (void)fuse_reply_err(req, -rc);
	}
	if (ino_is_flock(ino)) {
		/* Opening takes nothing: flock/fcntl on it does. */
		rc = lockfs_flock_name_of(fs, ino, lock);
		goto out;
	}
	if (ino == INO_EVENTS) {
		rc = lockfs_events_file_open(fs, req, of);
		goto out;
	}
	if (ino == INO_METRICS) {
		rc = writing ? -EACCES : lockfs_core_metrics(fs->core, &of->data, &of->len);
		goto out;
	}
	if (ino == INO_LOG) {
		rc = writing ? -EACCES : lockfs_core_log_open_ro(fs->core);
		if (rc >= 0) {
			of->fd = rc;
			rc = 0;
		}
		goto out;
	}
	/* A writer changes the acquisition it opened, or nothing. */
	rc = writing ? lockfs_attr_lock_name(fs, ino, lock, &ls)
		     : lockfs_attr_walk_lock_name(fs, ino, lock, &ls);
	if (rc < 0)
		goto out;
	switch (ino_file(ino)) {
	case LF_FENCE:
	case LF_WAITERS:
	case LF_OWNER:
		/* Rendered once per open, for this reader: reads of one open
		 * file see one consistent text. */
		rc = writing ? -EACCES : lockfs_attr_render(fs, req, lock, ino_file(ino), &ls, &of->data, &of->len);
		break;
	case LF_LEASE:
		lockfs_fs_caller(req, &caller);
		rc = writing ? lockfs_core_check_holder(fs->core, lock, &caller)
			     : lockfs_attr_render(fs, req, lock, LF_LEASE, &ls, &of->data, &of->len);
		break;
	case LF_BREAK:
		rc = !writing || !may_break(fs, req) ? -EACCES : 0;
		break;
	case LF_BIND:
		/* Who may bind is decided at the write; reading shows it. */
		rc = writing ? 0 : lockfs_attr_render(fs, req, lock, LF_BIND, &ls, &of->data, &of->len);
		break;
	case LF_OPERATION:
		lockfs_fs_caller(req, &caller);
		if (writing) {
			/* O_TRUNC clears at once (`: > operation`), keeping
			 * the old text to put back should the first write be
			 * refused. */
			rc = lockfs_core_check_holder(fs->core, lock, &caller);
			if (rc == 0 && (fi->flags & O_TRUNC)) {
				rc = lockfs_core_operation(fs->core, lock, &of->before,
							   &of->before_len);
				if (rc == 0)
					rc = lockfs_core_set_operation(fs->core, lock, &caller, "", 0);
			}
			if (rc == 0 && !(fi->flags & O_TRUNC))
				rc = lockfs_core_operation(fs->core, lock, &of->data, &of->len);
		} else {
			rc = lockfs_attr_render(fs, req, lock, LF_OPERATION, &ls, &of->data, &of->len);
		}
		break;
	default:
		rc = -EISDIR;
	}
out:
	if (rc < 0) {
		lockfs_handle_uncount(fs, &of->h);
		lockfs_open_file_free(of);
		return (void)fuse_reply_err(req, -rc);
	}
	fi->fh = lockfs_handle_add(fs, &of->h, ino, fi->flags);
	fi->direct_io = 1; /* content depends on the reader and the moment */
	fi->keep_cache = 0;
	fi->nonseekable = 0;
	if (fuse_reply_open(req, fi) == -ENOENT) {
		lockfs_events_file_close(fs, of); /* the open was interrupted */
		lockfs_handle_del(fs, &of->h);
		lockfs_open_file_free(of);
	}
}

/* An open file a successor made again (lockfs_handles_restore) has no
 * text yet: render it now, for this reader, as lfs_open would have. */
static int render_restored(struct lockfs_fs *fs, fuse_req_t req, fuse_ino_t ino,
			   struct open_file *of)
{
	struct lockfs_lock_stat ls;
	char lock[NAME_MAX + 1];
	int rc;

	of->restored = false;
	if (ino == INO_METRICS && !of->data)
		return lockfs_core_metrics(fs->core, &of->data, &of->len);
	if (!ino_is_lock(ino) || of->data)
		return 0;
	rc = lockfs_attr_lock_name(fs, ino, lock, &ls);
	if (rc < 0)
		return rc;
	if (ino_file(ino) == LF_OPERATION)
		return lockfs_core_operation(fs->core, lock, &of->data, &of->len);
	if (ino_file(ino) == LF_BREAK)
		return 0;
	return lockfs_attr_render(fs, req, lock, ino_file(ino), &ls, &of->data, &of->len);
}

/* The open file of FI, or NULL: a predecessor's open that could not be
 * made again (the state was full). */
static struct open_file *open_file_of(struct lockfs_fs *fs, struct fuse_file_info *fi)
{
	return (struct open_file *)lockfs_handle_find(fs, fi->fh);
}

static void lfs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct open_file *of = open_file_of(fs_of(req), fi);
	int rc;

	if (!of)
		return (void)fuse_reply_err(req, EBADF);
	if (ino == INO_EVENTS)
		return lockfs_events_file_read(req, fs_of(req), of, size);
	if (ino_is_flock(ino))
		return lockfs_flock_read(req, fs_of(req), ino, fi, size, off);
	if (of->restored && of->fd < 0 && (rc = render_restored(fs_of(req), req, ino, of)) < 0)
		return (void)fuse_reply_err(req, -rc);
	if (of->fd >= 0) {
		char *buf = malloc(size ? size : 1);
		ssize_t n;

		if (!buf)
			return (void)fuse_reply_err(req, ENOMEM);
		n = pread(of->fd, buf, size, off);
		if (n < 0)
			fuse_reply_err(req, errno);
		else
			fuse_reply_buf(req, buf, (size_t)n);
		free(buf);
		return;
	}
	if (off < 0 || (size_t)off >= of->len)
		return (void)fuse_reply_buf(req, NULL, 0);
	if (of->len - (size_t)off < size)
		size = of->len - (size_t)off;
	/* Reply from a private copy: once the reply is written, the reader
	 * may close the file and another thread free OF before
	 * fuse_reply_buf() has returned. */
	{
		char *copy = malloc(size);

		if (!copy)
			return (void)fuse_reply_err(req, ENOMEM);
		memcpy(copy, of->data + off, size);
		fuse_reply_buf(req, copy, size);
		free(copy);
	}
}

/* The first write after an O_TRUNC open was refused: put the old text
 * back, so that the refused write changed nothing. */
static void restore_before(struct lockfs_fs *fs, fuse_req_t req, fuse_ino_t ino,
			   struct open_file *of)
{
	struct lockfs_caller caller;
	char lock[NAME_MAX + 1];

	of->pending = false;
	if (!of->before)
		return;
	lockfs_fs_caller(req, &caller);
	if (lockfs_attr_lock_name(fs, ino, lock, NULL) == 0)
		lockfs_core_set_operation(fs->core, lock, &caller, of->before, of->before_len);
	free(of->before);
	of->before = NULL;
}

static void lfs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
		      off_t off, struct fuse_file_info *fi)
{
	struct lockfs_fs *fs = fs_of(req);
	struct open_file *of = open_file_of(fs, fi);
	enum lock_file file = ino_file(ino);
	struct lockfs_caller caller;
	char lock[NAME_MAX + 1];
	size_t end;
	char *data;
	int rc;

	if (ino_is_flock(ino))
		return (void)fuse_reply_write(req, size); /* `echo $$ >&9`: discarded */
	if (!of)
		return (void)fuse_reply_err(req, EBADF);
	if (ino == INO_EVENTS) {
		rc = lockfs_events_file_write(fs, of, buf, size);
		return (void)(rc < 0 ? fuse_reply_err(req, -rc) : fuse_reply_write(req, size));
	}
	if (!ino_is_lock(ino) || (file != LF_OPERATION && file != LF_LEASE && file != LF_BREAK &&
				  file != LF_BIND))
		return (void)fuse_reply_err(req, EBADF);
	/* The kernel's O_APPEND offset is the size it last saw, which need
	 * not be this open file's text: append to what this open file holds. */
	if (fi->flags & O_APPEND)
		off = (off_t)of->len;
	/* Room for the limit plus the newline `echo` adds.  A refused write
	 * changes nothing, not even the open's O_TRUNC. */
	if (off < 0 || (size_t)off > LOCKFS_OPERATION_MAX + 1 ||
	    size > LOCKFS_OPERATION_MAX + 1 - (size_t)off) {
		restore_before(fs, req, ino, of);
		return (void)fuse_reply_err(req, EFBIG);
	}
	end = (size_t)off + size;
	data = malloc(end > of->len ? end : of->len ? of->len : 1);
	if (!data)
		return (void)fuse_reply_err(req, ENOMEM);
	if (of->len)
		memcpy(data, of->data, of->len);
	if ((size_t)off > of->len)
		memset(data + of->len, 0, (size_t)off - of->len);
	memcpy(data + off, buf, size);
	if (end < of->len)
		end = of->len;

	/* Each write carries the whole text so far: the engine applies it,
	 * so a refused write changes nothing. */
	lockfs_fs_caller(req, &caller);
	rc = lockfs_attr_lock_name(fs, ino, lock, NULL);
	if (rc == 0 && file == LF_OPERATION) {
		rc = lockfs_core_set_operation(fs->core, lock, &caller, data, end);
		/* A write may end inside a UTF-8 character that the next one
		 * completes: keep it, apply it with that write or at close. */
		if (rc == -EINVAL && !memchr(data, '\0', end) && lockfs_utf8_cut_short(data, end))
			rc = 1;
		/* Applied (0), kept for later (1), or refused: then nothing
		 * changes, not even the open's O_TRUNC. */
		of->pending = rc == 1;
		if (rc == 1)
			rc = 0;
		if (rc < 0)
			restore_before(fs, req, ino, of);
		else if (!of->pending) {
			free(of->before);
			of->before = NULL;
		}
	} else if (rc == 0 && file == LF_LEASE)
		rc = lockfs_core_set_lease(fs->core, lock, &caller, data, end);
	else if (rc == 0 && file == LF_BIND)
		rc = lockfs_core_bind(fs->core, lock, &caller, buf, size);
	else if (rc == 0)
		rc = lockfs_core_break(fs->core, lock, &caller, data, end);
	if (rc < 0) {
		free(data);
		return (void)fuse_reply_err(req, -rc);
	}
	free(of->data);
	of->data = data;
	of->len = end;
	fuse_reply_write(req, size);
}

/* close(2): apply what the writer left pending (see struct open_file);
 * its error is close's. */
static void lfs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct lockfs_fs *fs = fs_of(req);
	struct open_file *of = open_file_of(fs, fi);
	struct lockfs_caller caller;
	char lock[NAME_MAX + 1];
	int rc = 0;

	/* POSIX: any close by the owning process ends its locks. */
	if (ino_is_flock(ino))
		lockfs_flock_closed(fs, ino, "posix", fi->lock_owner);
	if (of && of->pending && ino_is_lock(ino) && ino_file(ino) == LF_OPERATION) {
		lockfs_fs_caller(req, &caller);
		rc = lockfs_attr_lock_name(fs, ino, lock, NULL);
		if (rc == 0)
			rc = lockfs_core_set_operation(fs->core, lock, &caller,
						       of->data ? of->data : "", of->len);
		of->pending = false;
		/* Refused at last (a character never completed): the text
		 * before an O_TRUNC open comes back, as for a refused write. */
		if (rc < 0)
			restore_before(fs, req, ino, of);
		free(of->before);
		of->before = NULL;
	}
	fuse_reply_err(req, -rc);
}

static void lfs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	/* The last descriptor of an open file description closed (also when
	 * its process died): its flock lock ends.  Keyed by our handle, not
	 * the kernel's lock owner: the kernel sends this release in the
	 * background, and a new open file may already have the old one's
	 * address -- and so its lock owner -- and be locking. */
	if (ino_is_flock(ino))
		lockfs_flock_closed(fs_of(req), ino, "flock", fi->fh);
	/* An open file description lock (F_OFD_SETLK) ends with its last
	 * close, and no flush tells of it: end the fcntl locks granted
	 * through this open file and not through another one since (the
	 * engine knows which: lockfs_fd_request.via_file).  A classic POSIX
	 * lock taken through it was already ended by its owner's close
	 * (flush). */
	if (ino_is_flock(ino) && fi->fh) {
		char name[NAME_MAX + 1];

		if (lockfs_flock_name_of(fs_of(req), ino, name) < 0)
			;
		else if (name[0] == '/') /* a slot file (slots.c) */
			lockfs_core_slot_fd_file_closed(fs_of(req)->core, name + 1, fi->fh);
		else
			lockfs_core_fd_file_closed(fs_of(req)->core, name, fi->fh);
	}
	{
		struct open_file *of = open_file_of(fs_of(req), fi);

		if (of) {
			lockfs_events_file_close(fs_of(req), of);
			lockfs_handle_del(fs_of(req), &of->h);
			lockfs_open_file_free(of);
		}
	}
	fuse_reply_err(req, 0);
}

static void lfs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct lockfs_fs *fs = fs_of(req);
	struct dir_snapshot *d = lockfs_dir_snapshot_new();
	char lock[NAME_MAX + 1];
	int rc = 0;

	if (!d)
		return (void)fuse_reply_err(req, ENOMEM);
	rc = lockfs_handle_count(fs, req, ino, &d->h);
	if (rc < 0) {
		free(d);
		return (void)fuse_reply_err(req, -rc);
	}
	d->self = ino;
	if (ino == FUSE_ROOT_ID) {
		rc = lockfs_core_list(fs->core, &d->names, &d->count);
	} else if (ino == INO_FLOCK_DIR) {
		rc = lockfs_core_list_flock(fs->core, &d->names, &d->count);
	} else if (ino == INO_SLOTS_DIR) {
		rc = lockfs_core_slot_list(fs->core, &d->names, &d->count);
	} else if (ino == INO_FLOCK_SLOTS_DIR) {
		d->count = 0; /* its files exist while open, and are not listed */
	} else if (ino_is_lock(ino) && ino_file(ino) == LF_DIR) {
		rc = lockfs_attr_walk_lock_name(fs, ino, lock, NULL);
		d->slotted = rc == 0 && lock[0] == '/';
	} else {
		rc = -ENOTDIR;
	}
	if (rc < 0) {
		lockfs_handle_uncount(fs, &d->h);
		lockfs_names_free(d->names);
		free(d);
		return (void)fuse_reply_err(req, -rc);
	}
	fi->fh = lockfs_handle_add(fs, &d->h, ino, fi->flags);
	if (fuse_reply_open(req, fi) == -ENOENT) {
		lockfs_handle_del(fs, &d->h);
		lockfs_dir_snapshot_free(&d->h);
	}
}

/* Entry number I of directory D: its name and inode (0 = unknown yet). */
static const char *dir_entry(struct dir_snapshot *d, size_t i, fuse_ino_t *ino, mode_t *mode)
{
	*ino = 0;
	*mode = S_IFDIR;
	if (i == 0) {
		*ino = d->self;
		return ".";
	}
	if (i == 1) {
		*ino = FUSE_ROOT_ID;
		return "..";
	}
	i -= 2;
	if (d->self == FUSE_ROOT_ID) {
		if (i == 0) {
			*ino = INO_LOG;
			*mode = S_IFREG;
			return ".log";
		}
		if (i == 1) {
			*ino = INO_FLOCK_DIR;
			return ".flock";
		}
		/* .events and .metrics are not listed: a listing of M is its
		 * locks, .log and .flock, as scripts have always seen it. */
		i -= 2;
		return i < d->count ? d->names[i] : NULL;
	}
	if (d->self == INO_FLOCK_DIR) {
		*mode = S_IFREG;
		return i < d->count ? d->names[i] : NULL;
	}
	if (d->self == INO_SLOTS_DIR || d->self == INO_FLOCK_SLOTS_DIR)
		return i < d->count ? d->names[i] : NULL;
	if (d->slotted) { /* a slotted name's view: its owner and waiters */
		static const enum lock_file shown[] = { LF_OWNER, LF_WAITERS };

		if (i >= sizeof(shown) / sizeof(shown[0]))
			return NULL;
		*ino = d->self + shown[i];
		*mode = S_IFREG;
		return lockfs_lock_file_names[shown[i]];
	}
	if (i + 1 < LF_COUNT) {
		*ino = d->self + 1 + i;
		*mode = S_IFREG;
		return lockfs_lock_file_names[i + 1];
	}
	return NULL;
}

static void lfs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			struct fuse_file_info *fi)
{
	struct dir_snapshot *d = (struct dir_snapshot *)lockfs_handle_find(fs_of(req), fi->fh);
	char *buf;
	size_t used = 0;
	const char *name;
	fuse_ino_t eino;
	mode_t mode;

	if (!d)
		return (void)fuse_reply_err(req, EBADF);
	buf = malloc(size);
	if (!buf)
		return (void)fuse_reply_err(req, ENOMEM);
	for (size_t i = (size_t)off; (name = dir_entry(d, i, &eino, &mode)); i++) {
		struct stat st = { .st_ino = eino ? eino : (fuse_ino_t)-1, .st_mode = mode };
		size_t n = fuse_add_direntry(req, buf + used, size - used, name, &st, (off_t)(i + 1));

		if (n > size - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void lfs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dir_snapshot *d = (struct dir_snapshot *)lockfs_handle_find(fs_of(req), fi->fh);

	if (d) {
		lockfs_handle_del(fs_of(req), &d->h);
		lockfs_dir_snapshot_free(&d->h);
	}
	fuse_reply_err(req, 0);
}

static void lfs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv = { .f_bsize = 4096, .f_frsize = 4096, .f_namemax = LOCKFS_NAME_MAX };

	fuse_reply_statfs(req, &sv);
}

const struct fuse_lowlevel_ops lockfs_ops = {
	.init = lfs_init,
	.lookup = lfs_lookup,
	.forget = lfs_forget,
	.forget_multi = lfs_forget_multi,
	.getattr = lfs_getattr,
	.setattr = lfs_setattr,
	.mkdir = lfs_mkdir,
	.rmdir = lfs_rmdir,
	.unlink = lfs_eperm_name,
	.mknod = lfs_mknod,
	.symlink = lfs_symlink,
	.rename = lfs_rename,
	.link = lfs_link,
	.create = lfs_create,
	.open = lfs_open,
	.read = lfs_read,
	.write = lfs_write,
	.flush = lfs_flush,
	.release = lfs_release,
	.opendir = lfs_opendir,
	.readdir = lfs_readdir,
	.releasedir = lfs_releasedir,
	.statfs = lfs_statfs,
	.flock = lockfs_flock_op,
	.getlk = lockfs_flock_getlk,
	.setlk = lockfs_flock_setlk,
};
