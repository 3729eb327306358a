/* The serving process's side of a connection that outlives it
 * (keepconn.c). */
#ifndef LOCKFS_FS_KEEPCONN_H
#define LOCKFS_FS_KEEPCONN_H

#include <stdbool.h>
#include <stdint.h>
#include <fuse_lowlevel.h>

#include "fs.h"
#include "resume.h"

/* Should the detached daemon start a keeper?  Not with -o keeper=off
 * (KEEPER), nor with options under which the connection's INIT is not
 * ours to keep (-s, clone_fd, max_idle_threads: libfuse's loops) or a
 * helper would unmount on our death (auto_unmount): then one notice. */
bool lockfs_keeper_wanted(const char *keeper, const struct fuse_cmdline_opts *opts, int argc,
			  char *argv[]);

/*
 * Once SE is mounted on MNT_ABS (device DEV): check that the kernel can
 * resend requests (FUSE_NOTIFY_RESEND), make the state and start the
 * keeper with ARGV, or under systemd hand both descriptors to its store
 * (noting it in the state dir DIRFD).  Returns 0, or -1 after one line on stderr (then the
 * daemon serves as without a keeper).
 */
int lockfs_keeper_setup(struct fuse_session *se, const char *mnt_abs, uint64_t dev,
			char *argv[], int dirfd);

/* As soon as the connection is kept (set up, or taken over): SIGUSR2 hands
 * over from now on (before the loop runs, the loop then ends at once). */
void lockfs_keeper_kept(void);

/* A clean stop (unmount, SIGTERM): the keeper leaves with us, and
 * systemd's store lets go of the connection (DIRFD: the state dir). */
void lockfs_keeper_stopped(int dirfd);

/* Right before the loop: this process serves.  A successor (R not NULL)
 * rebuilds FS's tables from the state and asks the kernel to resend what
 * its predecessor read but did not answer. */
void lockfs_keeper_serving(struct lockfs_fs *fs, const struct lockfs_resume *r);

/* The loop ended for a hand-over: leave at once, answering, releasing
 * and unmounting nothing (the keeper starts the next process). */
void lockfs_keeper_hand_over(void) __attribute__((noreturn));

/* Is the connection's mount still the top one on its mount point (from
 * the state)?  Else one line on stderr: another daemon replaced it. */
bool lockfs_resume_still_mounted(void);

/* A taken-over session's clean stop: unmount MNT_ABS if it is still the
 * connection's mount (libfuse does not know it). */
void lockfs_resume_unmount(const char *mnt_abs);

#endif
