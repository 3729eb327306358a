/* The multi-threaded request loop with one hot reader (loop.c). */
#ifndef LOCKFS_FS_LOOP_H
#define LOCKFS_FS_LOOP_H

#include <stdint.h>
#include <fuse_lowlevel.h>

/*
 * Serve SE until it exits (unmount, fuse_session_exit from a signal), with
 * at most MAX_THREADS threads taking requests (0: the default, 10).  Call
 * it from the thread that lockfs_stop_start() kicks: that thread only
 * waits, and wakes on the kick.  Returns 0, or -errno when reading
 * /dev/fuse failed.
 */
int lockfs_loop_run(struct fuse_session *se, unsigned max_threads);

/* The `unique` of the request the calling thread is processing (from its
 * fuse_in_header; bit 63 set when the kernel resent it after a restart),
 * or 0 outside a request of this loop. */
uint64_t lockfs_loop_request_unique(void);

#endif
