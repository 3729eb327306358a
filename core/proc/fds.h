/*
 * The daemon's file descriptors: how many it may keep open on its callers'
 * behalf, so that no caller can take the ones its own work needs.
 *
 * Kept descriptors are those that live past a request: a pidfd per
 * watched holder process and an open `M/.log`.  Everything else the
 * daemon opens is either fixed (DIR, the log, /dev/fuse, epoll ...: the
 * base, counted once at start) or transient (a /proc file or a record,
 * closed before the request is answered: at most a few per worker
 * thread).  The reserve is what the transient work needs:
 *
 *   limit - base - reserve    for callers' descriptors (.log of other uids)
 *   limit - base - reserve/2  for root's opens and for pidfds
 *   the last reserve/2        never kept for anyone: transient work only
 *
 * Thread-safe: the counter is atomic and the limits are set before the
 * daemon serves.
 */
#ifndef LOCKFS_CORE_FDS_H
#define LOCKFS_CORE_FDS_H

#include <stdatomic.h>
#include <stdbool.h>

enum lockfs_fd_use {
	LOCKFS_FD_CALLER,  /* kept for an ordinary caller */
	LOCKFS_FD_PRIVILEGED, /* kept for root, or a pidfd (the daemon's own job) */
};

struct lockfs_fds {
	atomic_long held; /* descriptors kept now (taken and not given back) */
	long limit;       /* RLIMIT_NOFILE soft limit; 0 = not known yet: nothing refused */
	long base;        /* the daemon's fixed descriptors */
	long reserve;
};

/* Start counting, with no limit yet. */
void lockfs_fds_init(struct lockfs_fds *f);

/*
 * Learn the limit (RLIMIT_NOFILE's soft limit) and the base (descriptors
 * open now that are not counted as held).  The reserve is an eighth of the
 * limit, at least 64 and at most 256.
 */
void lockfs_fds_start(struct lockfs_fds *f);

/* Count one more kept descriptor for USE.  false (nothing counted) when
 * that would cut into what USE must leave free. */
bool lockfs_fds_take(struct lockfs_fds *f, enum lockfs_fd_use use);

/* A kept descriptor was closed. */
void lockfs_fds_give(struct lockfs_fds *f);

/* How many more descriptors ordinary callers may be given now (LONG_MAX
 * when the limit is not known). */
long lockfs_fds_left(struct lockfs_fds *f);

/* What ordinary callers may hold in all (limit - base - reserve; LONG_MAX
 * when not known). */
long lockfs_fds_callers_max(const struct lockfs_fds *f);

#endif
