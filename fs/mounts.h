/* Mount tables, read without touching a mount (mounts.c). */
#ifndef LOCKFS_MOUNTS_H
#define LOCKFS_MOUNTS_H

#include <stdbool.h>

/* One line of a mountinfo file; the strings point into the line being
 * read and are valid only during the callback. */
struct lockfs_mount {
	unsigned major, minor; /* st_dev of the mounted file system */
	char *target;          /* mount point, unescaped */
	char *fstype;          /* "fuse.lockfs", "tmpfs", ... */
	char *source;          /* for lockfs: the backing dir as it was given */
};

/* Returns nonzero to stop the walk; that value is then returned. */
typedef int (*lockfs_mount_fn)(const struct lockfs_mount *e, void *arg);

/* Call FN for each mount in the mountinfo file PATH (/proc/self/mountinfo,
 * /proc/PID/task/TID/mountinfo), in mount order.  Returns 0, what FN
 * returned, or -errno when PATH cannot be read. */
int lockfs_mounts_each(const char *path, lockfs_mount_fn fn, void *arg);

/* fuse, fuse.SUBTYPE, fuseblk: a mount whose every access may wait for a
 * daemon. */
bool lockfs_mount_is_fuse(const struct lockfs_mount *e);

/* The topmost mount at TARGET (an absolute, canonical path) in our own
 * mount table, into *OUT, whose strings live in *BUF (free it).  Returns
 * how many mounts are stacked at TARGET (0: none, *BUF NULL), or -errno. */
int lockfs_mount_top(const char *target, struct lockfs_mount *out, char **buf);

#endif
