/*
 * Taking over a backing dir whose daemon died but cannot finish dying.
 *
 * One daemon serves a DIR: it holds flock(2) on DIR/.lockfs, whose open
 * file lives exactly as long as the process.  A daemon killed while one
 * of its threads waits in the kernel for an answer on its own FUSE
 * connection (the wedge of issue 8; lockfs itself no longer sends the
 * notification that did it, see ops.c, but an older binary may have) is a
 * zombie whose last thread never returns: its files stay open, so the
 * flock stays held, /dev/fuse stays open, the connection is never
 * aborted, and the request that thread waits for is never answered.
 * Every client of the mount hangs, and a restart used to refuse.
 *
 * Evidence before acting: the pid recorded in DIR/.lockfs is a zombie
 * (its main thread has exited: a healthy or merely stopped daemon is never
 * touched) and a live thread of it still has DIR/.lockfs open (so it, and
 * not a new daemon that has not written its pid yet, holds the flock).
 * Since one daemon serves a DIR, every FUSE mount of DIR then belongs to
 * that zombie or to an earlier dead daemon, and aborting its connection
 * (/sys/fs/fuse/connections/N/abort) hurts no one: it ends every request
 * of that mount with ECONNABORTED, which lets the stuck thread finish.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lockfs/proc.h"
#include "mounts.h"
#include "takeover.h"

#define FUSECTL "/sys/fs/fuse/connections"
/* A zombie that still holds DIR may just be finishing a clean exit: give
 * it this long before calling it wedged. */
#define GRACE_MS 300
/* After the abort, the stuck thread returns at once; allow for load. */
#define AFTER_ABORT_MS 5000
#define MAX_CONNS 16

pid_t lockfs_recorded_pid(int lockfd)
{
	char buf[32];
	ssize_t n = pread(lockfd, buf, sizeof(buf) - 1, 0);
	long pid;

	if (n <= 0)
		return 0;
	buf[n] = '\0';
	pid = strtol(buf, NULL, 10);
	return pid > 0 && pid <= INT32_MAX ? (pid_t)pid : 0;
}

/* The state letter ('R', 'S', 'D', 'Z', ...) of process PID, or of its
 * thread TID when TID > 0; 0 when it cannot be read. */
static char state_of(pid_t pid, pid_t tid)
{
	struct lockfs_proc_stat st;

	return lockfs_procfs_stat(pid, tid, &st) == 0 ? st.state : 0;
}

/* Does the fd folder DIR (/proc/PID/fd, /proc/PID/task/TID/fd) hold the
 * file LOCK (DIR/.lockfs) open?  Only links that name a .lockfs are
 * stat()ed: nothing here touches a FUSE mount. */
bool lockfs_fd_dir_holds(const char *dir, const struct stat *lock)
{
	char link[64 + 256 + 2], target[PATH_MAX];
	struct dirent *d;
	DIR *fds;
	bool found = false;

	fds = opendir(dir);
	if (!fds)
		return false;
	while (!found && (d = readdir(fds))) {
		struct stat st;
		ssize_t n;

		if (d->d_name[0] == '.')
			continue;
		snprintf(link, sizeof(link), "%s/%s", dir, d->d_name);
		n = readlink(link, target, sizeof(target) - 1);
		if (n < 8)
			continue;
		target[n] = '\0';
		if (strcmp(target + n - 8, "/.lockfs") != 0)
			continue;
		found = stat(link, &st) == 0 && st.st_dev == lock->st_dev &&
			st.st_ino == lock->st_ino;
	}
	closedir(fds);
	return found;
}

/* Does task TID of PID have the file of LOCKFD open? */
static bool task_has_file(pid_t pid, const char *tid, const struct stat *lock)
{
	char dir[64];

	snprintf(dir, sizeof(dir), "/proc/%d/task/%s/fd", (int)pid, tid);
	return lockfs_fd_dir_holds(dir, lock);
}

/* Is PID a zombie of which a live thread has the file of LOCKFD open?
 * Then copy that thread's id into TID (for its mount table). */
static bool zombie_holding(pid_t pid, int lockfd, char tid[16])
{
	char path[64];
	struct stat lock;
	struct dirent *d;
	DIR *tasks;
	bool found = false;

	if (state_of(pid, 0) != 'Z' || fstat(lockfd, &lock) < 0)
		return false;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	tasks = opendir(path);
	if (!tasks)
		return false;
	while (!found && (d = readdir(tasks))) {
		char *end;
		long task = strtol(d->d_name, &end, 10);

		if (d->d_name[0] == '.' || strlen(d->d_name) >= 16 || *end || task <= 0 ||
		    task > INT32_MAX)
			continue;
		if (state_of(pid, (pid_t)task) == 'Z')
			continue;
		if (task_has_file(pid, d->d_name, &lock)) {
			strcpy(tid, d->d_name);
			found = true;
		}
	}
	closedir(tasks);
	return found;
}

/* Wait up to MS for PID's last thread to exit (not for its reaping).
 * Returns true when it is gone. */
static bool wait_gone(pid_t pid, int ms)
{
	struct pollfd pfd = { .events = POLLIN };
	int n;

	pfd.fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd.fd < 0)
		return errno == ESRCH;
	do {
		n = poll(&pfd, 1, ms);
	} while (n < 0 && errno == EINTR);
	close(pfd.fd);
	return n > 0;
}

/* Is the lockfs SOURCE of a mount our DIR (same inode)? */
static bool is_our_dir(const char *source, int dirfd)
{
	struct stat a, b;

	return source[0] == '/' && stat(source, &a) == 0 && fstat(dirfd, &b) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

struct conns {
	int dirfd;
	unsigned minor[MAX_CONNS];
	int n;
};

static int note_conn(const struct lockfs_mount *e, void *arg)
{
	struct conns *c = arg;

	if (strcmp(e->fstype, "fuse.lockfs") != 0 || e->major != 0 || !is_our_dir(e->source, c->dirfd))
		return 0;
	for (int i = 0; i < c->n; i++)
		if (c->minor[i] == e->minor)
			return 0;
	if (c->n < MAX_CONNS)
		c->minor[c->n++] = e->minor;
	return 0;
}

static int note_fusectl(const struct lockfs_mount *e, void *arg)
{
	return strcmp(e->fstype, "fusectl") == 0 && strcmp(e->target, FUSECTL) == 0;
}

/* Write 1 to FUSECTL/MINOR/abort, mounting fusectl first if need be.
 * Returns 0 (also when that connection is gone already) or -errno after a
 * line on stderr. */
static int abort_conn(unsigned minor)
{
	char path[64];
	int fd;

	if (lockfs_mounts_each("/proc/self/mountinfo", note_fusectl, NULL) != 1 &&
	    mount("fusectl", FUSECTL, "fusectl", 0, NULL) < 0 && errno != EBUSY) {
		int err = errno;

		fprintf(stderr, "lockfs: cannot mount the FUSE control filesystem on " FUSECTL
			": %s\n", strerror(err));
		return -err;
	}
	snprintf(path, sizeof(path), FUSECTL "/%u/abort", minor);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return 0;
	if (fd < 0 || write(fd, "1", 1) != 1) {
		int err = errno;

		fprintf(stderr, "lockfs: cannot abort FUSE connection %u (%s): %s\n", minor, path,
			strerror(err));
		if (fd >= 0)
			close(fd);
		return -err;
	}
	close(fd);
	return 0;
}

int lockfs_takeover(int lockfd, int dirfd, const char *dir)
{
	struct conns c = { .dirfd = dirfd };
	pid_t pid = lockfs_recorded_pid(lockfd);
	char tid[16], path[64];

	if (pid <= 0 || !zombie_holding(pid, lockfd, tid))
		return -EBUSY;
	/* A daemon on its way out of a clean exit is a zombie for a moment. */
	if (wait_gone(pid, GRACE_MS) && flock(lockfd, LOCK_EX | LOCK_NB) == 0)
		return 0;
	if (!zombie_holding(pid, lockfd, tid))
		return -EBUSY;
	/* Its mounts: in our mount table, and in its own (another namespace). */
	lockfs_mounts_each("/proc/self/mountinfo", note_conn, &c);
	snprintf(path, sizeof(path), "/proc/%d/task/%s/mountinfo", (int)pid, tid);
	lockfs_mounts_each(path, note_conn, &c);
	if (c.n == 0) {
		fprintf(stderr, "lockfs: backing dir %s: its daemon (pid %d) has died but a thread "
			"of it is stuck in the kernel, and no FUSE mount of %s was found to abort; "
			"not taking over\n", dir, (int)pid, dir);
		return -ENOENT;
	}
	for (int i = 0; i < c.n; i++) {
		int rc;

		fprintf(stderr, "lockfs: backing dir %s: its daemon (pid %d) has died but cannot "
			"finish exiting, which keeps its mount hanging; aborting FUSE connection %u ("
			FUSECTL "/%u/abort)\n", dir, (int)pid, c.minor[i], c.minor[i]);
		rc = abort_conn(c.minor[i]);
		if (rc < 0)
			return rc;
	}
	if (!wait_gone(pid, AFTER_ABORT_MS)) {
		fprintf(stderr, "lockfs: backing dir %s: daemon pid %d still has not exited %d s "
			"after its connection was aborted; not taking over\n", dir, (int)pid,
			AFTER_ABORT_MS / 1000);
		return -ETIMEDOUT;
	}
	if (flock(lockfd, LOCK_EX | LOCK_NB) < 0)
		return -EBUSY; /* someone else was quicker: refuse as for any live daemon */
	fprintf(stderr, "lockfs: took over backing dir %s from its wedged daemon (pid %d)\n",
		dir, (int)pid);
	return 1;
}

/* The pid of a fusermount3 left by `-o auto_unmount` for MOUNTPOINT, which
 * unmounts it once the daemon is gone; 0 when there is none. */
static pid_t auto_unmount_helper(const char *mountpoint)
{
	DIR *proc = opendir("/proc");
	struct dirent *d;
	pid_t found = 0;

	if (!proc)
		return 0;
	while (!found && (d = readdir(proc))) {
		char path[300], comm[32] = "", args[4096], *last = NULL;
		bool auto_unmount = false;
		ssize_t n;
		int fd;

		if (d->d_name[0] < '1' || d->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/comm", d->d_name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, comm, sizeof(comm) - 1);
		close(fd);
		if (n <= 0 || strncmp(comm, "fusermount", 10) != 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", d->d_name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, args, sizeof(args) - 1);
		close(fd);
		if (n <= 0)
			continue;
		args[n] = '\0';
		/* "fusermount3 -o OPTS -- MOUNTPOINT", arguments NUL-separated */
		for (char *a = args; a < args + n; a += strlen(a) + 1) {
			last = a;
			auto_unmount |= strstr(a, "auto_unmount") != NULL;
		}
		if (auto_unmount && last && strcmp(last, mountpoint) == 0)
			found = (pid_t)strtol(d->d_name, NULL, 10);
	}
	closedir(proc);
	return found;
}

int lockfs_clear_dead_mount(int dirfd, const char *dir, const char *mountpoint)
{
	/* Mounts may be stacked; each round removes at most one. */
	for (int round = 0; round < 8; round++) {
		struct lockfs_mount top;
		char *buf = NULL;
		pid_t helper;
		int n = lockfs_mount_top(mountpoint, &top, &buf);
		bool ours = n > 0 && strcmp(top.fstype, "fuse.lockfs") == 0 &&
			    is_our_dir(top.source, dirfd);

		free(buf);
		if (!ours)
			return 0;
		/* We hold DIR: whoever served that mount is gone.  If its
		 * auto_unmount helper is about to unmount it, let it, rather
		 * than race it (it could unmount our new mount instead). */
		helper = auto_unmount_helper(mountpoint);
		if (helper > 0 && wait_gone(helper, 2000))
			continue;
		if (umount2(mountpoint, MNT_DETACH) < 0) {
			int err = errno;

			if (err == EINVAL)
				continue; /* unmounted meanwhile */
			fprintf(stderr, "lockfs: %s still has the dead mount of an earlier lockfs "
				"daemon of %s, and it cannot be detached (%s): run fusermount3 -u %s\n",
				mountpoint, dir, strerror(err), mountpoint);
			return -err;
		}
		fprintf(stderr, "lockfs: detached the dead mount of an earlier lockfs daemon of %s "
			"from %s\n", dir, mountpoint);
	}
	return 0;
}
