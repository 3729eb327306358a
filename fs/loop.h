/* The multi-threaded request loop with one hot reader (loop.c). */
#ifndef LOCKFS_FS_LOOP_H
#define LOCKFS_FS_LOOP_H

#include <fuse_lowlevel.h>

/*
 * Serve SE until it exits (unmount, fuse_session_exit from a signal), with
 * at most MAX_THREADS threads taking requests (0: the default, 10).  Call
 * it from the thread that lockfs_stop_start() kicks: that thread only
 * waits, and wakes on the kick.  Returns 0, or -errno when reading
 * /dev/fuse failed.
 */
int lockfs_loop_run(struct fuse_session *se, unsigned max_threads);

/* The kernel's unique of the request this thread is processing (its
 * fuse_in_header's, bit 63 -- the kernel's mark of a resent request --
 * included), or 0 outside a request the loop read. */
uint64_t lockfs_loop_request_unique(void);

#endif
