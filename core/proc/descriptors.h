/*
 * Who still holds a descriptor of an fd lock's file opened through an
 * earlier mount.  After a daemon restart nothing can come through such a
 * descriptor any more (even its close gets ENOTCONN), yet the process
 * that holds it believes it holds the lock: /proc is the only place where
 * the new daemon can see it.  A descriptor is "old" when its path ends in
 * "/.flock/NAME" and it is not on the current mount's device.
 */
#ifndef LOCKFS_CORE_DESCRIPTORS_H
#define LOCKFS_CORE_DESCRIPTORS_H

#include <sys/types.h>

/*
 * Does the process (PID, START) hold an old descriptor of NAME's lock file,
 * or does one of its descendants (breadth first, so the process nearest
 * PID wins; at most a few thousand processes looked at)?  LIVE_DEV is the
 * device of the current mount, 0 when there is none yet (then every such
 * descriptor is old).  Returns 1 and the holding process in *FOUND and
 * *FOUND_START, 0 when none does, -ESRCH when PID is not that process any
 * more, or -errno when PID's descriptors cannot be read (unknown: the
 * caller must not take it for "none").
 */
int lockfs_proc_tree_holds_old_flock(pid_t pid, unsigned long long start, const char *name,
				     dev_t live_dev, pid_t *found,
				     unsigned long long *found_start)
	__attribute__((warn_unused_result));

/* The device of the lockfs mount at MOUNTPOINT, from /proc/self/mountinfo.
 * Part of the engine's API (lockfs/core.h says what it returns), declared
 * here too so that this floor needs nothing from the floors above it. */
int lockfs_mount_dev(const char *mountpoint, dev_t *dev) __attribute__((warn_unused_result));

#endif
