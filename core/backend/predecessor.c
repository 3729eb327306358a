/*
 * Waiting for a predecessor that is stopping (statedir.h).
 *
 * `kill -TERM $(cat DIR/.lockfs); lockfs ...` must start the new daemon,
 * not fail because the old one still holds DIR/.lockfs for the few tens of
 * milliseconds its shutdown takes.  A daemon on its way out says so: its
 * SIGTERM handler (and the end of its loop, for an unmount) takes an OFD
 * lock on the first byte of DIR/.lockfs (lockfs_statedir_mark_stopping).
 * Between kill(2) and that handler the signal is pending, which
 * /proc/PID/status shows.  A holder that shows neither is looked at once
 * more after LOOK_AGAIN_MS (the handler may have been between the two),
 * then refused as a live daemon: a refusal costs that much, no more.
 *
 * Only the flock on DIR/.lockfs says who serves DIR; nothing here takes
 * it by any other path than flock(LOCK_NB) once the holder let go.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "statedir.h"

#define LOOK_AGAIN_MS 50
/* While the holder's pid is unknown (it emptied DIR/.lockfs on its way
 * out), the flock is tried this often. */
#define RETRY_MS 5

pid_t lockfs_statedir_pid_in(int lockfd)
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

/* Does another open file of DIR/.lockfs hold the stopping mark? */
static bool marked_stopping(int lockfd)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1 };

	return fcntl(lockfd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

/* Is SIGTERM or SIGINT pending for PID (sent, its handler not run yet)? */
static bool stop_signal_pending(pid_t pid)
{
	const uint64_t stop = (1ull << (SIGTERM - 1)) | (1ull << (SIGINT - 1));
	char path[64], buf[4096];
	bool pending = false;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	/* ShdPnd: signals to the process; SigPnd: to its main thread. */
	for (const char *key = "ShdPnd:"; key; key = strcmp(key, "ShdPnd:") ? NULL : "SigPnd:") {
		const char *p = strstr(buf, key);

		if (p && (strtoull(p + strlen(key), NULL, 16) & stop))
			pending = true;
	}
	return pending;
}

static bool stopping(int lockfd, pid_t pid)
{
	return marked_stopping(lockfd) || (pid > 0 && stop_signal_pending(pid));
}

/* Sleep until PID has exited or MS have passed (RETRY_MS when PID is
 * unknown or cannot be watched). */
static void wait_exit(pid_t pid, int ms)
{
	struct pollfd pfd = { .fd = -1, .events = POLLIN };
	struct timespec tick = { 0, RETRY_MS * 1000000L };

	if (pid > 0)
		pfd.fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd.fd < 0) {
		nanosleep(&tick, NULL);
		return;
	}
	/* The flock goes a moment before the process is gone: try it often. */
	while (poll(&pfd, 1, ms < 100 ? ms : 100) < 0 && errno == EINTR)
		;
	close(pfd.fd);
}

int lockfs_statedir_wait_predecessor(int lockfd, pid_t *waited_pid, unsigned *waited_ms)
{
	int64_t start = lockfs_boot_ms(), deadline = start + LOCKFS_STATEDIR_WAIT_MS;
	pid_t pid = lockfs_statedir_pid_in(lockfd);
	bool seen_stopping = false;

	*waited_pid = 0;
	*waited_ms = 0;
	if (!stopping(lockfd, pid)) {
		struct timespec pause = { 0, LOOK_AGAIN_MS * 1000000L };

		nanosleep(&pause, NULL);
		if (flock(lockfd, LOCK_EX | LOCK_NB) == 0)
			goto got_it; /* it stopped meanwhile, e.g. was unmounted */
		pid = lockfs_statedir_pid_in(lockfd);
		if (!stopping(lockfd, pid))
			return -EBUSY;
	}
	seen_stopping = true;
	*waited_pid = pid;
	for (;;) {
		int64_t left = deadline - lockfs_boot_ms();

		if (flock(lockfd, LOCK_EX | LOCK_NB) == 0)
			break;
		if (left <= 0)
			return -ETIMEDOUT;
		/* The file is emptied at the very end of a clean stop. */
		if (lockfs_statedir_pid_in(lockfd) > 0)
			pid = lockfs_statedir_pid_in(lockfd);
		wait_exit(pid, (int)left);
	}
got_it:
	*waited_ms = (unsigned)(lockfs_boot_ms() - start);
	if (!seen_stopping)
		*waited_pid = pid;
	return 0;
}
