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

/*
 * A loop on a connection taken over from a dead server, just after it asked
 * the kernel to resend what that one had read but not answered
 * (FUSE_NOTIFY_RESEND): DONE(ARG) is called once, from a loop thread with
 * no lock held, when every resent request (bit 63 of its unique) has been
 * processed -- known when a request that is not resent has been read, as
 * the kernel queues every resent request ahead of the others (FORGET and
 * INTERRUPT, which the kernel may send first, do not count).  Call before
 * the loop reads its first request; lockfs_core_resume_done is the DONE a
 * resuming engine wants.
 */
void lockfs_loop_on_resent_done(void (*done)(void *arg), void *arg);

/* The kernel's unique of the request this thread is processing (its
 * fuse_in_header's, bit 63 -- the kernel's mark of a resent request --
 * included), or 0 outside a request the loop read. */
uint64_t lockfs_loop_request_unique(void);

#endif
