/*
 * The daemon's messages file, DIR/daemon.log: where a detached daemon's
 * warnings and errors go when nothing listens on /dev/log (a container or
 * a minimal host without a syslog daemon), so that they, and every start
 * and stop, leave a trace.  errlog.c hands it complete lines.
 *
 * The file is bounded: before a line would take it past MSG_MAX_BYTES it
 * becomes daemon.log.1 (replacing the previous one) and a fresh daemon.log
 * is begun, so DIR holds at most twice that.  Like lock.log it is written
 * only when it is a regular file with no other link, never through a
 * symbolic link, and made fresh with O_EXCL.  A line that cannot be
 * written is dropped: there is nowhere else to say so.
 *
 * Locking: called only from errlog.c's stream, under its FILE lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "service.h"

#define MSG_MAX_BYTES (1024 * 1024)

static struct {
	int dirfd;      /* DIR (our own dup), -1 until opened */
	int fd;         /* DIR/daemon.log, -1 while it cannot be opened */
	off_t size;
} msg = { -1, -1, 0 };

/* Open DIR/daemon.log for appending; -1 when it cannot be, or is not a
 * file of its own. */
static int open_file(void)
{
	struct stat st;
	int fd = openat(msg.dirfd, LOCKFS_MSGFILE, O_WRONLY | O_APPEND | O_CREAT | O_EXCL |
			O_NOFOLLOW | O_CLOEXEC, 0600);

	/* O_NONBLOCK: a FIFO planted here must not hang the open. */
	if (fd < 0 && errno == EEXIST)
		fd = openat(msg.dirfd, LOCKFS_MSGFILE, O_WRONLY | O_APPEND | O_NOFOLLOW |
			    O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
		close(fd);
		return -1;
	}
	msg.size = st.st_size;
	return fd;
}

int lockfs_msgfile_open(int dirfd)
{
	msg.dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
	if (msg.dirfd < 0)
		return -errno;
	msg.fd = open_file();
	if (msg.fd < 0) {
		int err = errno ? errno : EINVAL;

		close(msg.dirfd);
		msg.dirfd = -1;
		return -err;
	}
	return 0;
}

/* Make room for N bytes: past the bound, daemon.log becomes daemon.log.1. */
static void make_room(size_t n)
{
	struct stat st;

	if (fstat(msg.fd, &st) == 0)
		msg.size = st.st_size;
	if (msg.size == 0 || msg.size + (off_t)n <= MSG_MAX_BYTES)
		return;
	if (renameat(msg.dirfd, LOCKFS_MSGFILE, msg.dirfd, LOCKFS_MSGFILE ".1") < 0)
		return; /* it grows on; tried again at the next line */
	close(msg.fd);
	msg.fd = open_file();
}

void lockfs_msgfile_line(int prio, const char *line, void *arg)
{
	char head[64];
	struct timespec ts;
	struct tm tm;
	size_t len;

	(void)prio;
	(void)arg;
	if (msg.fd < 0 && (msg.dirfd < 0 || (msg.fd = open_file()) < 0))
		return;
	/* The name is in the head already. */
	if (strncmp(line, "lockfs: ", 8) == 0)
		line += 8;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	len = strftime(head, sizeof(head), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(head + len, sizeof(head) - len, ".%03ldZ lockfs[%d]: ", ts.tv_nsec / 1000000,
		 (int)getpid());
	{
		struct iovec iov[] = {
			{ .iov_base = head, .iov_len = strlen(head) },
			{ .iov_base = (void *)line, .iov_len = strlen(line) },
			{ .iov_base = (void *)"\n", .iov_len = 1 },
		};
		ssize_t w;

		make_room(iov[0].iov_len + iov[1].iov_len + 1);
		if (msg.fd < 0)
			return;
		/* One write per line: whole lines, in order. */
		w = writev(msg.fd, iov, 3);
		if (w > 0)
			msg.size += w;
	}
}
