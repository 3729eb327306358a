/* Taking over a backing dir from a dead or wedged daemon (takeover.c). */
#ifndef LOCKFS_TAKEOVER_H
#define LOCKFS_TAKEOVER_H

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

/*
 * flock(LOCKFD) found DIR/.lockfs held.  If its holder is our wedged
 * predecessor (a zombie whose stuck thread keeps DIR/.lockfs and its FUSE
 * connection open), abort that connection, wait for it to go and take the
 * lock.  Returns 1 when it did so and LOCKFD now holds the lock, 0 when
 * the zombie finished exiting by itself within a short grace (LOCKFD holds
 * the lock: nothing was aborted); -EBUSY when a live daemon holds it (nothing printed: the caller refuses as for any live
 * daemon); another -errno after a line on stderr.
 */
int lockfs_takeover(int lockfd, int dirfd, const char *dir);

/*
 * Called with DIR's lock held, before mounting on MOUNTPOINT: a lockfs
 * mount of DIR still on MOUNTPOINT belongs to a daemon that is gone (it
 * answers ENOTCONN): detach it, after its auto_unmount helper if it has
 * one.  Never touches another mount.  Returns 0 or -errno after a line
 * on stderr.
 */
int lockfs_clear_dead_mount(int dirfd, const char *dir, const char *mountpoint);

/* The pid a daemon wrote in its state directory's .lockfs (open as
 * LOCKFD), or 0.  Used by stopcmd.c too. */
pid_t lockfs_recorded_pid(int lockfd);

/* Does the fd folder DIR (/proc/PID/fd, /proc/PID/task/TID/fd) hold the
 * file LOCK (a state directory's .lockfs) open?  Used by stopcmd.c too. */
bool lockfs_fd_dir_holds(const char *dir, const struct stat *lock);

#endif
