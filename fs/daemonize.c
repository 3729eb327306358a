/*
 * The daemon's own detaching; see daemonize.h.
 *
 * The parent and the child share one end each of a socket pair.  The child
 * sends one int once it serves (0) or could not (an errno), and the parent
 * exits accordingly: so when `lockfs DIR M` returns 0, M is mounted and
 * DIR/.lockfs holds the pid of the process serving it.  A child that dies
 * before it says anything closes its end: the parent reads end of file and
 * exits 1.  A socket rather than a pipe: send(MSG_NOSIGNAL) cannot kill the
 * daemon with SIGPIPE when the parent is already gone.
 *
 * State: the child's end, written once by lockfs_daemonize before any
 * thread exists, and read and cleared by lockfs_daemonize_done on the
 * main thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemonize.h"

static int child_end = -1;

/* The parent's part: wait for the child's word and exit with it. */
static void __attribute__((noreturn)) parent_wait(int fd, pid_t child)
{
	int err = 0, status;
	size_t got = 0;

	while (got < sizeof(err)) {
		ssize_t n = recv(fd, (char *)&err + got, sizeof(err) - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (got < sizeof(err)) {
		/* It ended without a word.  A start that failed said why on
		 * the stderr we share, in its one line, and exited with its
		 * status: pass that on without a second line. */
		if (waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		    WEXITSTATUS(status) != 0)
			_exit(WEXITSTATUS(status));
		if (WIFSIGNALED(status))
			fprintf(stderr, "lockfs: the daemon was killed by signal %d while "
				"starting\n", WTERMSIG(status));
		else
			fprintf(stderr, "lockfs: the daemon exited while starting\n");
		_exit(1);
	}
	if (err != 0) {
		fprintf(stderr, "lockfs: the daemon could not start serving: %s (details in "
			"syslog, or without one in the backing dir's daemon.log)\n", strerror(err));
		_exit(1);
	}
	/* Not exit(): the atexit handlers and the mount belong to the child. */
	_exit(0);
}

int lockfs_daemonize(void)
{
	int sv[2];
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	/* What is buffered would otherwise be written twice. */
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		int err = errno;

		close(sv[0]);
		close(sv[1]);
		return -err;
	}
	if (pid > 0) {
		close(sv[1]);
		parent_wait(sv[0], pid);
	}
	close(sv[0]);
	child_end = sv[1];
	/* Out of the caller's session: no hangup when its terminal closes,
	 * and no signal meant for its process group.  A fresh child is no
	 * group leader, so this cannot fail. */
	(void)setsid();
	return 0;
}

void lockfs_daemonize_leave_cwd(void)
{
	if (child_end < 0)
		return;
	/* Keep no directory busy (the caller's cwd could not be unmounted). */
	if (chdir("/") < 0)
		fprintf(stderr, "lockfs: warning: cannot leave the working directory: %s\n",
			strerror(errno));
}

void lockfs_daemonize_done(int err)
{
	int null;

	if (child_end < 0)
		return;
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		fflush(stdout);
		(void)dup2(null, STDIN_FILENO);
		(void)dup2(null, STDOUT_FILENO);
		(void)dup2(null, STDERR_FILENO);
		if (null > STDERR_FILENO)
			close(null);
	}
	(void)send(child_end, &err, sizeof(err), MSG_NOSIGNAL);
	close(child_end);
	child_end = -1;
}
