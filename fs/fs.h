/* The FUSE adapter's shared state: one struct lockfs_fs per mount. */
#ifndef LOCKFS_FS_H
#define LOCKFS_FS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <limits.h>
#include <sys/stat.h>
#include <time.h>
#include <fuse_lowlevel.h>

#include "lockfs/core.h"
#include "loop.h"

/*
 * Inode numbers.  The root is FUSE_ROOT_ID (1), the audit log view is 2.
 * Lock NAME gets a node id K >= 1 for as long as the kernel remembers it;
 * its directory is K << 4 and the files inside it are (K << 4) | FILE.
 * Node ids are never reused within a mount, so an inode number never
 * names two different things.
 */
#define INO_LOG 2
#define INO_FLOCK_DIR 3 /* M/.flock */
#define INO_SLOTS_DIR 6 /* M/.slots (slots.c) */
#define INO_FLOCK_SLOTS_DIR 7 /* M/.flock/.slots */
enum lock_file {
	LF_DIR = 0,
	LF_OWNER = 1,
	LF_OPERATION = 2,
	LF_FENCE = 3,
	LF_LEASE = 4,
	LF_BREAK = 5,
	LF_WAITERS = 6,
	LF_BIND = 7,
	LF_COUNT,
	/* Not in a lock directory: M/.flock/NAME, node (NAME, FLOCK_GEN). */
	LF_FLOCK = LF_COUNT
};
/* The generation of .flock/NAME nodes: they stand for the name, whatever
 * acquisition holds it (fences never reach this). */
#define FLOCK_GEN UINT64_MAX
#define INO_SHIFT 4

static inline fuse_ino_t ino_make(uint64_t id, enum lock_file f)
{
	return (fuse_ino_t)((id << INO_SHIFT) | f);
}
static inline uint64_t ino_id(fuse_ino_t ino)
{
	return ino >> INO_SHIFT;
}
static inline enum lock_file ino_file(fuse_ino_t ino)
{
	return (enum lock_file)(ino & ((1u << INO_SHIFT) - 1));
}
static inline int ino_is_lock(fuse_ino_t ino)
{
	return ino >= (1u << INO_SHIFT) && ino_file(ino) < LF_COUNT;
}
static inline int ino_is_flock(fuse_ino_t ino)
{
	return ino >= (1u << INO_SHIFT) && ino_file(ino) == LF_FLOCK;
}

/* The kernel's view: which lock names it holds inode numbers for (inode.c). */
struct inodes;

/* Idle nodes (no open file or listing) the daemon keeps per uid; past it,
 * that uid's oldest are dropped (docs/quota.md). */
#define LOCKFS_IDLE_NODES_PER_UID 1024

/* A table keeping at most IDLE_PER_UID idle nodes per uid (at least 1), or
 * NULL when out of memory. */
struct inodes *lockfs_inodes_new(size_t idle_per_uid);
void lockfs_inodes_free(struct inodes *t);
/* The node id for acquisition GENERATION of NAME, made if needed, with its
 * lookup count raised by one; UID (who looked it up) keeps it if idle.
 * Returns 0 when out of memory. */
uint64_t lockfs_inodes_ref(struct inodes *t, const char *name, uint64_t generation, uid_t uid);
/* The same, only for a node that exists and is open: else 0, and nothing
 * is made. */
uint64_t lockfs_inodes_ref_open(struct inodes *t, const char *name, uint64_t generation,
				uid_t uid);
/* Copy the name of node ID into BUF (NAME_MAX + 1 bytes) and its
 * generation into *GENERATION.
 * Returns 0, or -ESTALE when the daemon no longer knows ID (forgotten by
 * the kernel, or dropped while idle: the kernel walks the path again). */
int lockfs_inodes_name(struct inodes *t, uint64_t id, char *buf, uint64_t *generation);
/* A file or listing of node ID is opened: the node stays while it is.
 * 0, or -ESTALE as above.  Each 0 is matched by one lockfs_inodes_close. */
int lockfs_inodes_open(struct inodes *t, uint64_t id);
void lockfs_inodes_close(struct inodes *t, uint64_t id);
/* The kernel forgets N lookups of node ID. */
void lockfs_inodes_forget(struct inodes *t, uint64_t id, uint64_t n);

struct lockfs_fs;

/* Parked flock/fcntl requests (flock.c). */
struct parked;

/* Every open file and directory (handle.c): the kernel sends no release for
 * them once the connection is gone, so they are freed at exit. */
struct handle {
	struct handle *next, *prev;
	struct handle *fh_next;  /* in its lockfs_fs::by_fh bucket */
	uint64_t fh;             /* fi->fh: an id, never reused within a mount */
	struct lockfs_saved_handle *saved; /* its slot in the state, or NULL */
	void (*free)(struct handle *h);
	uid_t uid;      /* who opened it: counted against -o max_open_per_uid */
	uint64_t node;  /* the node (inode.c) it keeps, or 0 */
	bool keeps_fd;  /* a descriptor in the daemon while open (M/.log) */
};
/* Free every handle still open (the loop has stopped: no request uses them). */
void lockfs_handles_free_all(struct lockfs_fs *fs);
/* A successor's start: every handle its predecessors left open, made
 * again from the state under the same fh (handle.c). */
void lockfs_handles_restore(struct lockfs_fs *fs);
/* A successor's start: the nodes its predecessors gave out, with the same
 * ids and lookup counts (inode.c). */
void lockfs_inodes_restore(struct inodes *t);

#define LOCKFS_FH_BUCKETS 256

struct lockfs_fs {
	struct lockfs_core *core;
	/* Lock order: an engine stripe mutex, then parked_mu (flock.c).
	 * handles_mu guards only the handle list (handle.c): it is taken
	 * with no other mutex held, and none is taken under it. */
	pthread_mutex_t parked_mu;
	struct parked *parked;     /* protected by parked_mu */
	struct events_files *events; /* events_file.c: M/.events' readers */
	pthread_mutex_t handles_mu;
	struct handle *handles;    /* protected by handles_mu */
	struct handle *by_fh[LOCKFS_FH_BUCKETS]; /* protected by handles_mu */
	uint64_t next_fh;          /* protected by handles_mu; 0: not yet set */
	struct inodes *inodes;
	struct fuse_session *se;
	bool proc_foreign; /* /proc is another pid namespace's: see no caller */
	uid_t mount_uid;   /* who mounted: owns the root, may break locks */
	gid_t mount_gid;
	struct timespec mounted_at;
};

/* The audit log at start-up (log_setup.c). */
/* -o log_max=, log_keep=, log_denied_interval= (NULL: not given) into
 * *LIM, the defaults for the others.  0, or -1 after one line on stderr. */
int lockfs_log_limits_parse(const char *max, const char *keep, const char *interval,
			    struct lockfs_log_limits *lim);
/* Open DIR/lock.log (DIRFD) into *OUT.  0, or -errno after one line on
 * stderr (a symlink, other hard links, not a regular file, ...). */
int lockfs_log_open_audit(int dirfd, const char *dir, const struct lockfs_log_limits *lim,
			  struct lockfs_log **out);
/* SIGHUP reopens CORE's log, and no longer stops the daemon; SIGXFSZ is
 * ignored.  Call before fuse_set_signal_handlers (which then leaves SIGHUP
 * alone), and with NULL before the core is closed (SIGHUP ignored). */
void lockfs_log_signals_set(struct lockfs_core *core);

/* ops.c: the request handlers. */
extern const struct fuse_lowlevel_ops lockfs_ops;

/* The kernel's mark of a resent request in its unique (FUSE_UNIQUE_RESEND,
 * Linux >= 6.9; not in libfuse 3.14's headers). */
#define LOCKFS_UNIQUE_RESEND (1ULL << 63)

/* Who sent REQ into *C (tid 0 when /proc is another pid namespace's, so
 * the daemon cannot tell), and which request it is: REQ is the one this
 * thread's loop read (loop.c), so its unique is the kernel's number --
 * ticket 0 when the loop did not read it. */
static inline void lockfs_fs_caller(fuse_req_t req, struct lockfs_caller *c)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	const struct lockfs_fs *fs = fuse_req_userdata(req);
	uint64_t unique = lockfs_loop_request_unique();

	c->tid = fs->proc_foreign ? 0 : ctx->pid;
	c->uid = ctx->uid;
	c->gid = ctx->gid;
	c->ticket = unique & ~LOCKFS_UNIQUE_RESEND;
	c->resent = (unique & LOCKFS_UNIQUE_RESEND) != 0;
}

/* slots.c: M/.slots and M/.flock/.slots (docs/slots.md).  A node whose
 * name begins with '/' is a slotted name's: "/NAME" (its view) or
 * "/NAME=N" (a mkdir's answer, a .flock/.slots file). */
/* Answer REQ's lookup of NAME in PARENT if it is a slots' entry (true). */
bool lockfs_slots_lookup(fuse_req_t req, struct lockfs_fs *fs, fuse_ino_t parent,
			 const char *name);
void lockfs_slots_mkdir(fuse_req_t req, struct lockfs_fs *fs, const char *name);
void lockfs_slots_rmdir(fuse_req_t req, struct lockfs_fs *fs, const char *name);
/* Attributes of M/.slots or M/.flock/.slots (INO). */
void lockfs_slots_dir_attr(struct lockfs_fs *fs, fuse_ino_t ino, struct stat *st);

/* flock.c: M/.flock/NAME and the locks taken through it. */
/* The lock name of .flock node INO into NAME.  0, or -ENOENT. */
int lockfs_flock_name_of(struct lockfs_fs *fs, fuse_ino_t ino, char name[NAME_MAX + 1]);
/* Answer REQ's lookup of .flock/NAME: a file while NAME is held or open
 * there, else ENOENT (a valid name), EINVAL or ENAMETOOLONG. */
void lockfs_flock_lookup(fuse_req_t req, struct lockfs_fs *fs, const char *name);
/* Answer REQ's create (open with O_CREAT of an absent entry) of
 * .flock/NAME: open it as lfs_open would. */
void lockfs_flock_create(fuse_req_t req, struct lockfs_fs *fs, const char *name,
			 struct fuse_file_info *fi);
/* A close of an open .flock/NAME file (flush: POSIX owner; release). */
void lockfs_flock_closed(struct lockfs_fs *fs, fuse_ino_t ino, const char *kind, uint64_t owner);
/* The loop and the engine's thread have stopped: answer every parked
 * request with ENOTCONN and free it. */
void lockfs_flock_shutdown(struct lockfs_fs *fs);
/* A read of .flock file INO through FI: a slot file answers the slot its
 * lock holds ("K\n"), any other file nothing. */
void lockfs_flock_read(fuse_req_t req, struct lockfs_fs *fs, fuse_ino_t ino,
		       struct fuse_file_info *fi, size_t size, off_t off);
/* The flock, getlk and setlk handlers of lockfs_ops. */
void lockfs_flock_op(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int op);
void lockfs_flock_getlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
			struct flock *lock);
void lockfs_flock_setlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
			struct flock *lock, int sleep);

#endif
