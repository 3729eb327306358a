/*
 * M/.flock/NAME: a file for every lock name, on which flock(2) and
 * whole-file fcntl locks take lock NAME -- the way to wait for a lock
 * without holding the parent directory's i_rwsem (mkdir must answer at
 * once).  The file itself is nothing: opening it creates nothing, writes
 * vanish, its size is 0.
 *
 * A blocking request that cannot be granted is parked: its fuse_req_t is
 * kept in a struct parked and answered by whichever thread grants it (the
 * engine calls parked_done) or by the interrupt callback when the caller
 * gives up.  Who answers is decided under the name's stripe mutex
 * (lockfs_core_fd_cancel), so a grant racing an interrupt is answered
 * exactly once: either the caller has the lock or the next in line gets it.
 *
 * Lifetime of a struct parked: two references, the handler's and the
 * answer's.  PARKED_MU guards the list the interrupt callback searches;
 * a parked request leaves it before it is answered, and the callback does
 * all its work under PARKED_MU, so it never sees a freed one.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>

#include "attr.h"
#include "fs.h"
#include "handle.h"
#include "lockfs/limits.h"
#include "lockfs/name.h"
#include "lockfs/record.h"

struct parked {
	struct lockfs_wait w;        /* first: the engine's handle */
	struct parked *next, *prev;  /* in fs->parked; protected by parked_mu */
	fuse_req_t req;
	struct lockfs_fs *fs;
	bool listed;                 /* in fs->parked (protected by parked_mu) */
	bool interrupted;            /* before it was parked (protected by parked_mu) */
	int refs;                    /* protected by parked_mu */
	char name[NAME_MAX + 1];
};

/* A slot file's node ("/NAME=N", slots.c)? */
static bool is_slot(const char *name)
{
	return name[0] == '/';
}

/* The name rule of .flock files: a lock name, or "/NAME=N". */
static int check_name(const char *name)
{
	char base[LOCKFS_NAME_MAX + 1];
	unsigned cap;

	if (!is_slot(name))
		return lockfs_name_check(name);
	return lockfs_slot_request_parse(name + 1, base, sizeof(base), &cap);
}

int lockfs_flock_name_of(struct lockfs_fs *fs, fuse_ino_t ino, char name[NAME_MAX + 1])
{
	uint64_t generation;

	if (!ino_is_flock(ino))
		return -ENOENT;
	return lockfs_inodes_name(fs->inodes, ino_id(ino), name, &generation);
}

/* The entry of .flock node ID for REQ.  Its entry timeout is 0: the kernel
 * asks again before every path walk through it, so a name that became free
 * looks absent at once, and a node dropped while idle (inode.c) is never
 * used by a walk.  Its attributes never change. */
static void flock_entry(struct lockfs_fs *fs, uint64_t id, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = ino_make(id, LF_FLOCK);
	lockfs_attr_flock_file(fs, e->ino, &e->attr);
	e->attr_timeout = 1;
	e->entry_timeout = 0;
}

/*
 * A free NAME (not held, not open here) looks absent: a lookup of it leaves
 * nothing, in the daemon or in the kernel, so that a user who stats a
 * million names costs neither (issue 19).  It exists once opened with
 * O_CREAT (lockfs_flock_create), as flock(1), lockctl and lock libraries
 * open it; a name held or open anywhere is a file for everyone.  A name
 * with waiters is open (they wait through an open file).
 */
void lockfs_flock_lookup(fuse_req_t req, struct lockfs_fs *fs, const char *name)
{
	uid_t uid = fuse_req_ctx(req)->uid;
	struct lockfs_lock_stat ls;
	struct fuse_entry_param e;
	uint64_t id;
	int rc = check_name(name);

	if (rc < 0)
		return (void)fuse_reply_err(req, -rc);
	id = lockfs_inodes_ref_open(fs->inodes, name, FLOCK_GEN, uid);
	if (!id) {
		rc = is_slot(name) ? lockfs_core_slot_stat(fs->core, name + 1, &ls)
				   : lockfs_core_stat(fs->core, name, &ls);
		if (rc < 0)
			return (void)fuse_reply_err(req, -rc);
		id = lockfs_inodes_ref(fs->inodes, name, FLOCK_GEN, uid);
	}
	if (!id)
		return (void)fuse_reply_err(req, ENOMEM);
	flock_entry(fs, id, &e);
	if (fuse_reply_entry(req, &e) == -ENOENT)
		lockfs_inodes_forget(fs->inodes, id, 1);
}

void lockfs_flock_create(fuse_req_t req, struct lockfs_fs *fs, const char *name,
			 struct fuse_file_info *fi)
{
	struct fuse_entry_param e;
	struct open_file *of;
	uint64_t id;
	int rc = check_name(name);

	if (rc < 0)
		return (void)fuse_reply_err(req, -rc);
	/* Every valid name can be opened, so O_EXCL never creates one. */
	if (fi->flags & O_EXCL)
		return (void)fuse_reply_err(req, EEXIST);
	id = lockfs_inodes_ref(fs->inodes, name, FLOCK_GEN, fuse_req_ctx(req)->uid);
	if (!id)
		return (void)fuse_reply_err(req, ENOMEM);
	flock_entry(fs, id, &e);
	of = lockfs_open_file_new();
	rc = of ? lockfs_handle_count(fs, req, e.ino, &of->h) : -ENOMEM;
	if (rc < 0) {
		lockfs_open_file_free(of);
		lockfs_inodes_forget(fs->inodes, id, 1);
		return (void)fuse_reply_err(req, -rc);
	}
	/* As lfs_open: opening takes nothing, flock/fcntl on it does. */
	fi->fh = lockfs_handle_add(fs, &of->h, e.ino, fi->flags);
	fi->direct_io = 1;
	fi->keep_cache = 0;
	fi->nonseekable = 0;
	if (fuse_reply_create(req, &e, fi) == -ENOENT) {
		/* Interrupted: the kernel took neither the entry nor the file. */
		lockfs_handle_del(fs, &of->h);
		lockfs_open_file_free(of);
		lockfs_inodes_forget(fs->inodes, id, 1);
	}
}

/* OWNER lets go of NAME's lock (a slot file's: of its slot). */
static int unlock(struct lockfs_fs *fs, const char *name, const char *owner)
{
	if (is_slot(name))
		return lockfs_core_slot_fd_unlock(fs->core, name + 1, owner);
	return lockfs_core_fd_unlock(fs->core, name, owner);
}

static void owner_key(char out[LOCKFS_FD_OWNER_MAX], const char *kind, uint64_t owner)
{
	snprintf(out, LOCKFS_FD_OWNER_MAX, "%s:%016" PRIx64, kind, owner);
}

void lockfs_flock_closed(struct lockfs_fs *fs, fuse_ino_t ino, const char *kind, uint64_t owner)
{
	char name[NAME_MAX + 1], key[LOCKFS_FD_OWNER_MAX];

	if (lockfs_flock_name_of(fs, ino, name) < 0)
		return;
	owner_key(key, kind, owner);
	unlock(fs, name, key);
}

/* Drop one reference; the last frees P.  Called with parked_mu held. */
static void parked_put(struct parked *p)
{
	if (--p->refs == 0)
		free(p);
}

static void parked_unlist(struct lockfs_fs *fs, struct parked *p)
{
	if (!p->listed)
		return;
	if (p->prev)
		p->prev->next = p->next;
	else
		fs->parked = p->next;
	if (p->next)
		p->next->prev = p->prev;
	p->listed = false;
}

/* The engine granted or failed P (lockfs_wait.done), holding NAME's
 * stripe mutex: answer under parked_mu and take no other mutex.  The
 * order is a stripe mutex, then parked_mu, never the other way round:
 * nothing in this file calls into the engine with parked_mu held.  (The
 * fs's other mutex, handles_mu, is handle.c's and is never taken here.) */
static void parked_done(struct lockfs_wait *w, int result)
{
	struct parked *p = (struct parked *)w;
	struct lockfs_fs *fs = p->fs;

	pthread_mutex_lock(&fs->parked_mu);
	parked_unlist(fs, p);
	fuse_reply_err(p->req, -result);
	parked_put(p);
	pthread_mutex_unlock(&fs->parked_mu);
}

/* Answer P with EINTR if it is still parked (then it leaves the queue).
 * The caller holds a reference to P and not parked_mu: cancelling may
 * grant others, whose answers take parked_mu. */
static void parked_cancel(struct lockfs_fs *fs, struct parked *p)
{
	if ((is_slot(p->name) ? lockfs_core_slot_fd_cancel(fs->core, p->name + 1, &p->w)
			      : lockfs_core_fd_cancel(fs->core, p->name, &p->w)) < 0)
		return; /* not parked yet, or being granted: that answers */
	pthread_mutex_lock(&fs->parked_mu);
	parked_unlist(fs, p);
	fuse_reply_err(p->req, EINTR);
	parked_put(p); /* the answer's */
	pthread_mutex_unlock(&fs->parked_mu);
}

/* The caller gave up (signal, flock -w, timeout): the kernel sent an
 * INTERRUPT.  The request stays alive while this runs. */
static void parked_interrupt(fuse_req_t req, void *data)
{
	struct lockfs_fs *fs = data;
	struct parked *p;

	pthread_mutex_lock(&fs->parked_mu);
	for (p = fs->parked; p && p->req != req; p = p->next)
		;
	if (p) {
		p->refs++;
		/* Seen by the handler if the request is not parked yet. */
		p->interrupted = true;
	}
	pthread_mutex_unlock(&fs->parked_mu);
	if (!p)
		return;
	parked_cancel(fs, p);
	pthread_mutex_lock(&fs->parked_mu);
	parked_put(p);
	pthread_mutex_unlock(&fs->parked_mu);
}

/* Take lock RQ->name for RQ->owner (a key from owner_key) and answer REQ,
 * now or when granted; RQ->wait parks the request until then.  An fcntl
 * lock names the open file it was taken through (RQ->via_file): the engine
 * ends it at that file's last close. */
static void fd_lock(fuse_req_t req, struct lockfs_fs *fs, const struct lockfs_fd_request *rq)
{
	struct lockfs_caller caller;
	struct parked *p = calloc(1, sizeof(*p));
	bool interrupted;
	int rc;

	if (!p)
		return (void)fuse_reply_err(req, ENOMEM);
	lockfs_fs_caller(req, &caller);
	p->w.done = parked_done;
	p->req = req;
	p->fs = fs;
	p->refs = 2; /* the handler's, the answer's */
	snprintf(p->name, sizeof(p->name), "%s", rq->name);
	if (rq->wait) {
		pthread_mutex_lock(&fs->parked_mu);
		p->next = fs->parked;
		if (p->next)
			p->next->prev = p;
		fs->parked = p;
		p->listed = true;
		pthread_mutex_unlock(&fs->parked_mu);
		/* Before parking: once parked it may be answered (and REQ
		 * freed) by another thread at any moment. */
		fuse_req_interrupt_func(req, parked_interrupt, fs);
	}
	if (is_slot(rq->name)) {
		struct lockfs_fd_request slot = *rq;

		slot.name = rq->name + 1;
		rc = lockfs_core_slot_fd_lock(fs->core, &caller, &slot, &p->w);
	} else {
		rc = lockfs_core_fd_lock(fs->core, &caller, rq, &p->w);
	}
	pthread_mutex_lock(&fs->parked_mu);
	if (rc != -EINPROGRESS) {
		parked_unlist(fs, p);
		fuse_reply_err(req, -rc);
		parked_put(p); /* the answer's */
	}
	interrupted = rc == -EINPROGRESS && p->interrupted;
	pthread_mutex_unlock(&fs->parked_mu);
	if (interrupted)
		parked_cancel(fs, p); /* interrupted before it was parked */
	pthread_mutex_lock(&fs->parked_mu);
	parked_put(p); /* the handler's */
	pthread_mutex_unlock(&fs->parked_mu);
}

void lockfs_flock_op(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int op)
{
	struct lockfs_fs *fs = fuse_req_userdata(req);
	char name[NAME_MAX + 1], key[LOCKFS_FD_OWNER_MAX];

	/* ENOLCK, not ENOSYS: ENOSYS would make the kernel lock every
	 * file of the mount locally from then on. */
	if (lockfs_flock_name_of(fs, ino, name) < 0)
		return (void)fuse_reply_err(req, ENOLCK);
	/* A flock lock belongs to the open file description, named by our
	 * own handle (see lfs_release for why not by fi->lock_owner). */
	owner_key(key, "flock", fi->fh);
	if (op & LOCK_UN)
		return (void)fuse_reply_err(req, -unlock(fs, name, key));
	fd_lock(req, fs, &(struct lockfs_fd_request){
		.name = name,
		.owner = key,
		.mode = (op & LOCK_SH) ? LOCKFS_SHARED : LOCKFS_EXCLUSIVE,
		.wait = !(op & LOCK_NB),
	});
}

/* libfuse gives whole-file locks as l_start 0, l_len 0. */
static bool whole_file(const struct flock *lock)
{
	return lock->l_start == 0 && lock->l_len == 0;
}

void lockfs_flock_getlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock)
{
	struct lockfs_fs *fs = fuse_req_userdata(req);
	char name[NAME_MAX + 1], key[LOCKFS_FD_OWNER_MAX];
	struct lockfs_fd_request rq = {
		.name = name,
		.owner = key,
		.mode = lock->l_type == F_RDLCK ? LOCKFS_SHARED : LOCKFS_EXCLUSIVE,
	};
	struct lockfs_fd_conflict conflict = { 0 };
	int rc;

	/* A slot file has no one holder to name: F_GETLK is not served. */
	if (lockfs_flock_name_of(fs, ino, name) < 0 || !whole_file(lock) || is_slot(name))
		return (void)fuse_reply_err(req, ENOLCK);
	owner_key(key, "posix", fi->lock_owner);
	rc = lockfs_core_fd_test(fs->core, &rq, &conflict);
	if (rc < 0)
		return (void)fuse_reply_err(req, -rc);
	if (rc == 0) {
		lock->l_type = F_UNLCK;
	} else {
		lock->l_type = conflict.shared ? F_RDLCK : F_WRLCK;
		lock->l_whence = SEEK_SET;
		lock->l_start = 0;
		lock->l_len = 0;
		lock->l_pid = conflict.pid;
	}
	fuse_reply_lock(req, lock);
}

void lockfs_flock_setlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock,
	       int sleep)
{
	struct lockfs_fs *fs = fuse_req_userdata(req);
	char name[NAME_MAX + 1], key[LOCKFS_FD_OWNER_MAX];

	/* Byte ranges are not locks of a name: refuse rather than keep a
	 * lock the other holders of NAME cannot see. */
	if (lockfs_flock_name_of(fs, ino, name) < 0 || !whole_file(lock))
		return (void)fuse_reply_err(req, ENOLCK);
	owner_key(key, "posix", fi->lock_owner);
	if (lock->l_type == F_UNLCK)
		return (void)fuse_reply_err(req, -unlock(fs, name, key));
	if (lock->l_type != F_RDLCK && lock->l_type != F_WRLCK)
		return (void)fuse_reply_err(req, EINVAL);
	fd_lock(req, fs, &(struct lockfs_fd_request){
		.name = name,
		.owner = key,
		.via_file = fi->fh,
		.mode = lock->l_type == F_RDLCK ? LOCKFS_SHARED : LOCKFS_EXCLUSIVE,
		.wait = sleep != 0,
	});
}

void lockfs_flock_read(fuse_req_t req, struct lockfs_fs *fs, fuse_ino_t ino,
		       struct fuse_file_info *fi, size_t size, off_t off)
{
	char name[NAME_MAX + 1], key[LOCKFS_FD_OWNER_MAX], text[16];
	int k = -ENOENT, n;

	if (lockfs_flock_name_of(fs, ino, name) == 0 && is_slot(name)) {
		/* flock(2)'s owner is this open file; fcntl's the process. */
		owner_key(key, "flock", fi->fh);
		k = lockfs_core_slot_index(fs->core, name + 1, key);
		if (k < 0) {
			owner_key(key, "posix", fi->lock_owner);
			k = lockfs_core_slot_index(fs->core, name + 1, key);
		}
	}
	n = k < 0 ? 0 : snprintf(text, sizeof(text), "%d\n", k);
	if (off < 0 || off >= n)
		return (void)fuse_reply_buf(req, NULL, 0);
	if ((size_t)(n - off) < size)
		size = (size_t)(n - off);
	fuse_reply_buf(req, text + off, size);
}

void lockfs_flock_shutdown(struct lockfs_fs *fs)
{
	pthread_mutex_lock(&fs->parked_mu);
	while (fs->parked) {
		struct parked *p = fs->parked;

		parked_unlist(fs, p);
		fuse_reply_err(p->req, ENOTCONN);
		parked_put(p); /* the answer's; the handler's went long ago */
	}
	pthread_mutex_unlock(&fs->parked_mu);
}
