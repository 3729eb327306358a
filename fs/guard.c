/*
 * The mount-point guard: never a silent non-lock.
 *
 * While no lockfs serves MOUNTPOINT (stopped, crashed under auto_unmount,
 * not started yet at boot), MOUNTPOINT is a plain directory, and root's
 * `mkdir MOUNTPOINT/deploy` would succeed: a script believes it holds a
 * lock that does not exist.  The directory underneath is therefore made
 * immutable (FS_IMMUTABLE_FL, what `chattr +i` sets): then mkdir in it
 * fails with EPERM for everyone, root and container root included, and
 * lockfs still mounts over it.  The daemon sets the flag on its mount
 * point before every mount and never clears it; `lockfs --guard
 * MOUNTPOINT` sets it before any daemon ran (setup, the unit, fstab).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "guard.h"
#include "mounts.h"

#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif

/* Split canonical PATH into its parent (opened O_PATH) and last name. */
static int open_parent(const char *path, const char **base)
{
	char parent[PATH_MAX];
	const char *slash = strrchr(path, '/');
	size_t len;

	if (!slash || slash[1] == '\0')
		return -EINVAL; /* "/" or not absolute: nothing to guard */
	len = slash == path ? 1 : (size_t)(slash - path);
	if (len >= sizeof(parent))
		return -ENAMETOOLONG;
	memcpy(parent, path, len);
	parent[len] = '\0';
	*base = slash + 1;
	return open(parent, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

/*
 * Open the directory MOUNTPOINT shows when no lockfs is mounted on it:
 * MOUNTPOINT itself when nothing is mounted there (checked by the kernel:
 * RESOLVE_NO_XDEV), the top mount's root when that is not FUSE, and the
 * directory under a single lockfs mount through a detached copy of the
 * parent's mount (open_tree: root only).  Never opens a FUSE mount, which
 * may hang.  Returns an fd or -errno, with *WHY saying why for a user.
 */
static int open_unmounted_view(const char *mountpoint, const char **why)
{
	struct open_how how = {
		.flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
		.resolve = RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS,
	};
	struct lockfs_mount top;
	const char *base;
	char *buf = NULL;
	int n = lockfs_mount_top(mountpoint, &top, &buf);
	int pfd, fd, tree, err;
	bool fuse = n > 0 && lockfs_mount_is_fuse(&top);
	bool lockfs = n == 1 && strcmp(top.fstype, "fuse.lockfs") == 0;

	free(buf);
	*why = NULL;
	if (n < 0)
		return n;
	if (n > 0 && !fuse) {
		fd = open(mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	if (fuse && !lockfs) {
		*why = "another FUSE file system is mounted on it";
		return -EBUSY;
	}
	pfd = open_parent(mountpoint, &base);
	if (pfd < 0)
		return pfd;
	if (n == 0) {
		fd = (int)syscall(SYS_openat2, pfd, base, &how, sizeof(how));
		if (fd < 0 && errno == ENOSYS)
			fd = openat(pfd, base, how.flags);
		err = errno;
		close(pfd);
		if (fd < 0 && err == EXDEV)
			*why = "something was mounted on it meanwhile";
		return fd < 0 ? -err : fd;
	}
	/* lockfs is mounted there: reach the directory underneath. */
	tree = (int)syscall(SYS_open_tree, pfd, "", OPEN_TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH);
	err = errno;
	close(pfd);
	if (tree < 0) {
		*why = err == EPERM ? "lockfs is mounted on it, and only root can reach the "
				      "directory underneath" : NULL;
		return -err;
	}
	fd = openat(tree, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	err = errno;
	close(tree);
	return fd < 0 ? -err : fd;
}

int lockfs_guard(const char *mountpoint, const char **why)
{
	int flags, rc = 0, fd = open_unmounted_view(mountpoint, why);

	if (fd < 0)
		return fd;
	if (ioctl(fd, FS_IOC_GETFLAGS, &flags) < 0) {
		rc = -errno;
		if (rc == -ENOTTY || rc == -EOPNOTSUPP || rc == -EINVAL)
			*why = "its file system cannot make a directory immutable";
	} else if (!(flags & FS_IMMUTABLE_FL)) {
		flags |= FS_IMMUTABLE_FL;
		if (ioctl(fd, FS_IOC_SETFLAGS, &flags) < 0) {
			rc = -errno;
			if (rc == -EPERM)
				*why = "only root (CAP_LINUX_IMMUTABLE) can make it immutable";
			else if (rc == -ENOTTY || rc == -EOPNOTSUPP || rc == -EINVAL)
				*why = "its file system cannot make a directory immutable";
		}
	}
	close(fd);
	return rc;
}

void lockfs_guard_before_mount(const char *mountpoint)
{
	const char *why;
	int rc = lockfs_guard(mountpoint, &why);

	if (rc < 0)
		fprintf(stderr, "lockfs: warning: mount point %s is not guarded (%s): whenever "
			"lockfs is not mounted there, `mkdir %s/NAME` makes a plain directory, "
			"which is no lock; guard it as root with `lockfs --guard %s`\n",
			mountpoint, why ? why : strerror(-rc), mountpoint, mountpoint);
}

int lockfs_guard_main(int argc, char *argv[])
{
	char path[PATH_MAX];
	const char *why;
	int rc;

	if (argc != 3 || argv[2][0] == '\0') {
		fprintf(stderr, "usage: %s --guard MOUNTPOINT\n", argv[0]);
		return 2;
	}
	if (!realpath(argv[2], path)) {
		fprintf(stderr, "lockfs: cannot guard %s: %s\n", argv[2], strerror(errno));
		return 1;
	}
	rc = lockfs_guard(path, &why);
	if (rc < 0) {
		fprintf(stderr, "lockfs: cannot guard %s: %s\n", path, why ? why : strerror(-rc));
		return 1;
	}
	return 0;
}
