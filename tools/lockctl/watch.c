/*
 * lockctl watch [NAME...] and lockctl metrics: M/.events and M/.metrics
 * copied to standard output.  watch writes the names it watches to its
 * open M/.events first (the daemon then keeps only their events for it)
 * and prints each line as it comes, until SIGINT, SIGTERM or the daemon's
 * stop (end of file).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <unistd.h>

#include "lockctl.h"

static volatile sig_atomic_t stop_asked;

/* A stop signal that comes between the test of STOP_ASKED and the read it
 * was meant to interrupt would leave that read waiting for the next event:
 * SIGALRM interrupts it a second later (and again, until it ends). */
static void on_stop(int sig)
{
	(void)sig;
	stop_asked = 1;
	alarm(1);
}

int lockfs_ctl_events_open(const char *mnt, char *const *names, int nnames)
{
	char *path = xasprintf("%s/.events", mnt);
	int fd = open(path, (nnames ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	int e = errno;

	free(path);
	if (fd < 0)
		return -e;
	if (nnames) {
		size_t len = 0;
		char *text;

		for (int i = 0; i < nnames; i++)
			len += strlen(names[i]) + 1;
		text = malloc(len + 1);
		if (!text)
			oom();
		len = 0;
		for (int i = 0; i < nnames; i++)
			len += (size_t)sprintf(text + len, "%s\n", names[i]);
		if (write(fd, text, len) != (ssize_t)len) {
			e = errno ? errno : EIO;
			free(text);
			close(fd);
			return -e;
		}
		free(text);
	}
	return fd;
}

/* Copy FD to standard output until end of file or a stop signal.
 * Returns 0 or an errno. */
static int copy_until_stopped(int fd)
{
	char buf[65536];

	for (;;) {
		ssize_t n;

		if (stop_asked)
			return 0;
		n = read(fd, buf, sizeof(buf));

		if (n < 0 && errno == EINTR) {
			if (stop_asked)
				return 0;
			continue;
		}
		if (n < 0)
			return errno;
		if (n == 0)
			return 0; /* the daemon stopped */
		if (fwrite(buf, 1, (size_t)n, stdout) != (size_t)n || fflush(stdout) != 0)
			return errno ? errno : EIO;
	}
}

int lockfs_ctl_watch(const char *mnt, char *const *names, int nnames)
{
	struct sigaction sa = { .sa_handler = on_stop }; /* no SA_RESTART: read ends */
	int fd, e;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGALRM, &sa, NULL);
	sigaction(SIGPIPE, &(struct sigaction){ .sa_handler = SIG_IGN }, NULL);
	fd = lockfs_ctl_events_open(mnt, names, nnames);
	if (fd == -EINVAL)
		return fail(EX_USAGE, "watch: a NAME is not a valid lock name");
	if (fd == -ENOENT)
		return fail(EX_UNAVAILABLE, "%s/.events is missing: this lockfs daemon is too old"
			    " for lockctl watch", mnt);
	if (fd < 0)
		return fail(errno_status(-fd), "%s/.events: %s", mnt, strerror(-fd));
	e = copy_until_stopped(fd);
	close(fd);
	if (e == EPIPE)
		return 0; /* `lockctl watch | head` */
	/* A read that reached the daemon after it stopped serving (or a
	 * daemon that died) ends with the connection, not end of file. */
	if (lockfs_ctl_is_conn_error(e))
		return fail(EX_UNAVAILABLE, "watch: the lockfs daemon of %s went away (%s)", mnt,
			    strerror(e));
	if (e)
		return fail(errno_status(e), "%s/.events: %s", mnt, strerror(e));
	return 0;
}

int lockfs_ctl_metrics(const char *mnt)
{
	char *path = xasprintf("%s/.metrics", mnt);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int e = errno;

	free(path);
	if (fd < 0 && e == ENOENT)
		return fail(EX_UNAVAILABLE, "%s/.metrics is missing: this lockfs daemon is too old"
			    " for lockctl metrics", mnt);
	if (fd < 0)
		return fail(errno_status(e), "%s/.metrics: %s", mnt, strerror(e));
	e = copy_until_stopped(fd);
	close(fd);
	if (e)
		return fail(errno_status(e), "%s/.metrics: %s", mnt, strerror(e));
	return 0;
}
