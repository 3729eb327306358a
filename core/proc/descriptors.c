/*
 * Old descriptors of fd locks, found in /proc; see descriptors.h.
 *
 * A descriptor's path (/proc/PID/fd/N) ends in "/.flock/NAME" whichever
 * mount it was opened through: "/locks/.flock/NAME" on a mount still
 * attached, "/.flock/NAME" on one detached when its daemon went.  What
 * tells the current mount from an earlier one is the device, read without
 * asking any file system: the descriptor's mount id (/proc/PID/fdinfo/N)
 * looked up in the process's own mount table (/proc/PID/mountinfo).  A
 * mount missing from that table is a detached one, so an old one.  When
 * the device cannot be established, the descriptor counts as old: the
 * lock is kept rather than ended on a guess.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "lockfs/proc.h"
#include "descriptors.h"

/* How many processes of one tree are looked at, at most. */
#define TREE_MAX 4096

/* "/proc/PID/FILE" read whole into BUF (NUL-terminated).  Length or -errno. */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t got = 0;

	if (fd < 0)
		return -errno;
	while (got < size - 1) {
		ssize_t n = read(fd, buf + got, size - 1 - got);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			n = -errno;
			close(fd);
			return n;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	buf[got] = '\0';
	return (ssize_t)got;
}

/* Undo mountinfo's octal escapes (\040 for a space) in S, in place. */
static void unescape(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = '\0';
}

/*
 * Find in the mount table FILE (a mountinfo) the line of mount MNT_ID (>= 0)
 * or, with MNT_ID < 0, the last fuse.lockfs mount at MOUNTPOINT; its device
 * into *DEV.  Returns 0, -ENOENT when there is none, -errno.
 */
static int mountinfo_find(const char *file, long mnt_id, const char *mountpoint, dev_t *dev)
{
	FILE *f = fopen(file, "re");
	char *line = NULL;
	size_t cap = 0;
	int rc = -ENOENT;

	if (!f)
		return -errno;
	while (getline(&line, &cap, f) > 0) {
		long id;
		unsigned maj, min;
		char mp[PATH_MAX + 1], *sep;

		if (sscanf(line, "%ld %*d %u:%u %*s %4096s", &id, &maj, &min, mp) != 4)
			continue;
		if (mnt_id >= 0) {
			if (id != mnt_id)
				continue;
			*dev = makedev(maj, min);
			rc = 0;
			break;
		}
		sep = strstr(line, " - ");
		unescape(mp);
		if (sep && strncmp(sep + 3, "fuse.lockfs ", 12) == 0 &&
		    strcmp(mp, mountpoint) == 0) {
			*dev = makedev(maj, min);
			rc = 0; /* the last one is the one on top */
		}
	}
	free(line);
	fclose(f);
	return rc;
}

/* Is descriptor FD of PID positively on the device LIVE_DEV? */
static bool on_live_mount(pid_t pid, const char *fd, dev_t live_dev)
{
	char path[NAME_MAX + 64], buf[1024], *m;
	long mnt_id;
	dev_t dev;

	snprintf(path, sizeof(path), "/proc/%d/fdinfo/%s", (int)pid, fd);
	if (read_small(path, buf, sizeof(buf)) < 0 || !(m = strstr(buf, "mnt_id:")))
		return false;
	mnt_id = strtol(m + 7, NULL, 10);
	snprintf(path, sizeof(path), "/proc/%d/mountinfo", (int)pid);
	return mountinfo_find(path, mnt_id, NULL, &dev) == 0 && dev == live_dev;
}

/* Does PID hold an old descriptor of NAME's lock file?  1, 0, or -errno
 * when its descriptors cannot be listed (-ESRCH: no such process). */
static int holds_old(pid_t pid, const char *name, dev_t live_dev)
{
	char path[64], want[NAME_MAX + 16], link[PATH_MAX];
	size_t wl;
	struct dirent *de;
	DIR *d;
	int rc = 0;

	snprintf(want, sizeof(want), "/.flock/%s", name);
	wl = strlen(want);
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return errno == ENOENT ? -ESRCH : -errno;
	while (rc == 0 && (de = readdir(d))) {
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		n = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
		if (n < (ssize_t)wl || memcmp(link + n - wl, want, wl) != 0)
			continue;
		rc = live_dev && on_live_mount(pid, de->d_name, live_dev) ? 0 : 1;
	}
	closedir(d);
	return rc;
}

/* Append the children of every thread of PID to Q (up to TREE_MAX). */
static void add_children(pid_t pid, pid_t *q, size_t *n)
{
	char path[64], buf[8192];
	struct dirent *de;
	DIR *tasks;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	tasks = opendir(path);
	if (!tasks)
		return;
	while ((de = readdir(tasks)) && *n < TREE_MAX) {
		char *p, *end;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%.16s/children", (int)pid, de->d_name);
		if (read_small(path, buf, sizeof(buf)) <= 0)
			continue;
		for (p = buf; *n < TREE_MAX; p = end) {
			long child = strtol(p, &end, 10);

			if (end == p)
				break;
			if (child > 0)
				q[(*n)++] = (pid_t)child;
		}
	}
	closedir(tasks);
}

int lockfs_proc_tree_holds_old_flock(pid_t pid, unsigned long long start, const char *name,
				     dev_t live_dev, pid_t *found,
				     unsigned long long *found_start)
{
	unsigned long long st;
	size_t head = 0, n = 0;
	bool unknown = false;
	pid_t *q;
	int rc;

	rc = lockfs_procfs_start_time(pid, &st);
	if (rc < 0 || st != start)
		return rc == -ENOENT || rc == 0 ? -ESRCH : rc;
	q = malloc(TREE_MAX * sizeof(*q));
	if (!q)
		return -ENOMEM;
	q[n++] = pid;
	while (head < n) {
		pid_t p = q[head++];

		rc = holds_old(p, name, live_dev);
		if (rc == 1 && lockfs_procfs_start_time(p, &st) == 0 &&
		    (p != pid || st == start)) {
			*found = p;
			*found_start = st;
			free(q);
			return 1;
		}
		if (rc < 0 && p == pid) {
			free(q);
			return rc; /* the process itself cannot be looked at */
		}
		/* A descendant we may not look at could hold one. */
		if (rc < 0 && rc != -ESRCH)
			unknown = true;
		add_children(p, q, &n);
	}
	free(q);
	return unknown ? -EACCES : 0;
}

int lockfs_mount_dev(const char *mountpoint, dev_t *dev)
{
	return mountinfo_find("/proc/self/mountinfo", -1, mountpoint, dev);
}
