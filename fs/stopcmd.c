/*
 * `lockfs --stop MOUNTPOINT`: stop the daemon that serves MOUNTPOINT and
 * wait until it has exited and its mount is gone, for scripts and package
 * maintainer scripts on hosts without systemd.
 *
 * The daemon is found without touching the mount (a dead or hung FUSE
 * mount would hang a stat): the mount table names the backing dir DIR (the
 * mount's source), DIR/.lockfs holds the daemon's pid, and that process
 * must have DIR/.lockfs open: a pid that was reused is never signalled.
 * The signal goes through a pidfd, so it cannot reach a process that took
 * the pid after the check either.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mounts.h"
#include "stopcmd.h"
#include "takeover.h"

/* How long the daemon may take to exit after SIGTERM (its own stop takes
 * milliseconds: docs/performance.md), and then to be gone from the mount
 * table. */
#define EXIT_BOUND_MS 10000
#define UNMOUNT_BOUND_MS 2000

/* MOUNTPOINT made absolute and canonical without looking at the mount
 * itself: its parent is resolved, its own name is kept.  0 or -errno. */
static int canonical(const char *arg, char out[PATH_MAX])
{
	char copy[PATH_MAX], parent[PATH_MAX], *slash, *name;
	size_t len = strlen(arg);

	if (len == 0 || len >= sizeof(copy))
		return -EINVAL;
	strcpy(copy, arg);
	while (len > 1 && copy[len - 1] == '/')
		copy[--len] = '\0';
	slash = strrchr(copy, '/');
	name = slash ? slash + 1 : copy;
	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || *name == '\0')
		return realpath(copy, out) ? 0 : -errno;
	if (slash)
		*slash = '\0';
	if (!realpath(slash ? (*copy ? copy : "/") : ".", parent))
		return -errno;
	if ((size_t)snprintf(out, PATH_MAX, "%s/%s", strcmp(parent, "/") ? parent : "", name)
	    >= PATH_MAX)
		return -ENAMETOOLONG;
	return 0;
}

/* Has PID the file LOCK (DIR/.lockfs) open? */
static bool holds(pid_t pid, const struct stat *lock)
{
	char dir[64];

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	return lockfs_fd_dir_holds(dir, lock);
}

/* Is the topmost mount at PATH still the one of device MAJOR:MINOR? */
static bool still_mounted(const char *path, unsigned major, unsigned minor)
{
	struct lockfs_mount top;
	char *buf = NULL;
	int n = lockfs_mount_top(path, &top, &buf);
	bool same = n > 0 && top.major == major && top.minor == minor;

	free(buf);
	return same;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Signal the daemon PID (which holds LOCK) and wait for it to exit.
 * Returns the exit status of `lockfs --stop`. */
static int stop_pid(pid_t pid, const struct stat *lock, const char *path)
{
	struct pollfd pfd = { .events = POLLIN };
	int n;

	pfd.fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd.fd < 0 && errno == ESRCH)
		return LOCKFS_STOP_DONE; /* gone by itself meanwhile */
	if (pfd.fd < 0) {
		fprintf(stderr, "lockfs: cannot watch the daemon of %s (pid %d): %s\n", path,
			(int)pid, strerror(errno));
		return LOCKFS_STOP_FAILED;
	}
	/* The pidfd pins PID: checked once more, it cannot be another's. */
	if (!holds(pid, lock)) {
		close(pfd.fd);
		return LOCKFS_STOP_DONE;
	}
	if (syscall(SYS_pidfd_send_signal, pfd.fd, SIGTERM, NULL, 0) < 0 && errno != ESRCH) {
		fprintf(stderr, "lockfs: cannot signal the daemon of %s (pid %d): %s\n", path,
			(int)pid, strerror(errno));
		close(pfd.fd);
		return LOCKFS_STOP_FAILED;
	}
	do {
		n = poll(&pfd, 1, EXIT_BOUND_MS);
	} while (n < 0 && errno == EINTR);
	close(pfd.fd);
	if (n <= 0) {
		fprintf(stderr, "lockfs: the daemon of %s (pid %d) has not exited %d s after "
			"SIGTERM\n", path, (int)pid, EXIT_BOUND_MS / 1000);
		return LOCKFS_STOP_FAILED;
	}
	return LOCKFS_STOP_DONE;
}

/* The daemon that serves ARG (a mount point), found as the head comment
 * says: its canonical PATH, its mount's device, DIR/.lockfs's LOCKPATH
 * and file LOCK, and its PID.  Returns LOCKFS_STOP_DONE when found, else
 * the status to exit with after one line on stderr. */
static int find_daemon(const char *arg, char path[PATH_MAX], char lockpath[PATH_MAX + 16],
		       unsigned *major, unsigned *minor, struct stat *lock, pid_t *pid)
{
	struct lockfs_mount top;
	char *buf = NULL;
	int n, fd, rc;

	rc = canonical(arg, path);
	if (rc < 0) {
		fprintf(stderr, "lockfs: %s: %s\n", arg, strerror(-rc));
		return LOCKFS_STOP_FAILED;
	}
	n = lockfs_mount_top(path, &top, &buf);
	if (n <= 0 || strcmp(top.fstype, "fuse.lockfs") != 0) {
		fprintf(stderr, "lockfs: no lockfs is mounted on %s: nothing to stop\n", path);
		free(buf);
		return LOCKFS_STOP_NONE;
	}
	*major = top.major;
	*minor = top.minor;
	if (top.source[0] != '/' ||
	    (size_t)snprintf(lockpath, PATH_MAX + 16, "%s/.lockfs", top.source) >=
	    PATH_MAX + 16) {
		fprintf(stderr, "lockfs: the backing dir of %s, \"%s\", is not an absolute path: "
			"stop its daemon with kill -TERM\n", path, top.source);
		free(buf);
		return LOCKFS_STOP_FAILED;
	}
	free(buf);
	fd = open(lockpath, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	*pid = fd >= 0 && fstat(fd, lock) == 0 ? lockfs_recorded_pid(fd) : 0;
	if (fd >= 0)
		close(fd);
	if (*pid <= 0 || !holds(*pid, lock)) {
		fprintf(stderr, "lockfs: no live daemon serves %s (its mount is dead: "
			"lockfs-mountpoint clean %s, or fusermount3 -uz %s, detaches it)\n",
			path, path, path);
		return LOCKFS_STOP_NONE;
	}
	return LOCKFS_STOP_DONE;
}

int lockfs_stop_main(int argc, char *argv[])
{
	char path[PATH_MAX], lockpath[PATH_MAX + 16];
	unsigned major, minor;
	struct stat lock;
	int64_t deadline;
	pid_t pid;
	int rc;

	if (argc != 3 || argv[2][0] == '\0' || argv[2][0] == '-') {
		fprintf(stderr, "usage: %s --stop MOUNTPOINT\n", argv[0]);
		return LOCKFS_STOP_USAGE;
	}
	rc = find_daemon(argv[2], path, lockpath, &major, &minor, &lock, &pid);
	if (rc != LOCKFS_STOP_DONE)
		return rc;
	rc = stop_pid(pid, &lock, path);
	if (rc != LOCKFS_STOP_DONE)
		return rc;
	/* The daemon unmounts before it exits; allow for a mount that
	 * another namespace's propagation removes a moment later. */
	deadline = now_ms() + UNMOUNT_BOUND_MS;
	while (still_mounted(path, major, minor)) {
		struct timespec tick = { 0, 10 * 1000000L };

		if (now_ms() > deadline) {
			fprintf(stderr, "lockfs: the daemon of %s (pid %d) has exited, but its "
				"mount is still there: fusermount3 -uz %s\n", path, (int)pid, path);
			return LOCKFS_STOP_FAILED;
		}
		nanosleep(&tick, NULL);
	}
	return LOCKFS_STOP_DONE;
}

/* Does PID hold the connection's state (keepconn.c): is its connection
 * kept by a keeper or systemd, so that it can hand over? */
static bool has_keeper(pid_t pid)
{
	char dir[64], link[64 + 256 + 2], target[PATH_MAX];
	struct dirent *d;
	bool found = false;
	DIR *fds;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	fds = opendir(dir);
	if (!fds)
		return false;
	while (!found && (d = readdir(fds))) {
		ssize_t n;

		snprintf(link, sizeof(link), "%s/%s", dir, d->d_name);
		n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		found = strncmp(target, "/memfd:lockfs-state", 19) == 0;
	}
	closedir(fds);
	return found;
}

int lockfs_upgrade_main(int argc, char *argv[])
{
	char path[PATH_MAX], lockpath[PATH_MAX + 16];
	unsigned major, minor;
	struct stat lock;
	struct pollfd pfd = { .events = POLLIN };
	int64_t deadline;
	pid_t pid, next = 0;
	int rc, n;

	if (argc != 3 || argv[2][0] == '\0' || argv[2][0] == '-') {
		fprintf(stderr, "usage: %s --upgrade MOUNTPOINT\n", argv[0]);
		return LOCKFS_STOP_USAGE;
	}
	rc = find_daemon(argv[2], path, lockpath, &major, &minor, &lock, &pid);
	if (rc != LOCKFS_STOP_DONE)
		return rc;
	pfd.fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd.fd < 0) {
		fprintf(stderr, "lockfs: cannot watch the daemon of %s (pid %d): %s\n", path,
			(int)pid, strerror(errno));
		return LOCKFS_STOP_FAILED;
	}
	if (!holds(pid, &lock) || !has_keeper(pid)) {
		fprintf(stderr, "lockfs: the daemon of %s (pid %d) runs without a keeper "
			"(-f, -o keeper=off, or a kernel without FUSE_NOTIFY_RESEND): restart it "
			"with lockfs --stop and a new start instead\n", path, (int)pid);
		close(pfd.fd);
		return LOCKFS_STOP_FAILED;
	}
	if (syscall(SYS_pidfd_send_signal, pfd.fd, SIGUSR2, NULL, 0) < 0) {
		fprintf(stderr, "lockfs: cannot signal the daemon of %s (pid %d): %s\n", path,
			(int)pid, strerror(errno));
		close(pfd.fd);
		return LOCKFS_STOP_FAILED;
	}
	do {
		n = poll(&pfd, 1, EXIT_BOUND_MS);
	} while (n < 0 && errno == EINTR);
	close(pfd.fd);
	if (n <= 0) {
		fprintf(stderr, "lockfs: the daemon of %s (pid %d) has not handed over %d s "
			"after SIGUSR2\n", path, (int)pid, EXIT_BOUND_MS / 1000);
		return LOCKFS_STOP_FAILED;
	}
	/* Its successor records its pid once it serves. */
	deadline = now_ms() + EXIT_BOUND_MS;
	for (;;) {
		struct timespec tick = { 0, 10 * 1000000L };
		int fd = open(lockpath, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

		next = fd >= 0 ? lockfs_recorded_pid(fd) : 0;
		if (fd >= 0)
			close(fd);
		if (next > 0 && next != pid && holds(next, &lock) &&
		    still_mounted(path, major, minor))
			return LOCKFS_STOP_DONE;
		if (now_ms() > deadline)
			break;
		nanosleep(&tick, NULL);
	}
	fprintf(stderr, "lockfs: the daemon of %s (pid %d) handed over, but no successor "
		"serves %d s later (see the system log, lockfs-keeper)\n", path, (int)pid,
		EXIT_BOUND_MS / 1000);
	return LOCKFS_STOP_FAILED;
}
