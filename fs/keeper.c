/*
 * The keeper: the FUSE connection outlives the process that serves it.
 *
 * The kernel keeps a FUSE connection alive as long as any process holds
 * /dev/fuse open; requests sent while nothing reads wait, and requests a
 * dead server had read but not answered come back after
 * FUSE_NOTIFY_RESEND (docs/operations.md, "Restarts and upgrades").  So
 * the detached daemon starts this minimal process once it has mounted: it
 * holds the connection's descriptor and the state memfd (connstate.c),
 * watches the serving process through a pidfd, and when that process
 * ends other than by a clean stop, starts the next one from the binary
 * path the daemon was started with (a binary replaced there is what the
 * next process runs: that is an upgrade) with the original arguments and
 * the two descriptors (resume.c takes them).  It does nothing else: no
 * thread, no store, no mount point, no request.
 *
 * It leaves when the serving process stopped cleanly (the state says
 * LOCKFS_PHASE_STOPPED: unmount, SIGTERM, `lockfs --stop`), and gives up
 * after LOCKFS_KEEPER_MAX_DEATHS deaths within LOCKFS_KEEPER_WINDOW_S (a
 * crash loop): then it closes the descriptor and clients get ENOTCONN as
 * without it.  A process that died before its loop read the kernel's first
 * request (FUSE_INIT) is replaced too: the next one answers that request
 * itself (resume.c).
 * It speaks through syslog (its stdio is /dev/null).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "connstate.h"
#include "keeper.h"

/* In a forked child before exec: only async-signal-safe calls.  The
 * descriptors the next program must have lose their close-on-exec. */
static void child_fds(int fuse_fd, int state_fd, int server_pidfd)
{
	int null = open("/dev/null", O_RDWR);

	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		dup2(null, STDERR_FILENO);
		if (null > STDERR_FILENO)
			close(null);
	}
	fcntl(fuse_fd, F_SETFD, 0);
	fcntl(state_fd, F_SETFD, 0);
	if (server_pidfd >= 0)
		fcntl(server_pidfd, F_SETFD, 0);
}

pid_t lockfs_keeper_start(const char *binary, int fuse_fd, int state_fd, char *const argv[])
{
	char server[16], spfd[16], ffd[16], sfd[16];
	const char **kargv;
	size_t n = 0;
	pid_t child, keeper = -1;
	int sv[2], status, rc = 0, self_pidfd;

	while (argv[n])
		n++;
	kargv = calloc(n + 8, sizeof(*kargv));
	if (!kargv)
		return -ENOMEM;
	/* Our own pidfd, opened here and inherited by the keeper: it names
	 * this process even if we die before the keeper has run a line.  A
	 * pidfd_open(pid) in the keeper would come too late when we were
	 * killed and reaped (by the `lockfs` that started us) first: ESRCH,
	 * and the keeper gave up on a connection nobody served (or watched
	 * a stranger that had the pid again). */
	self_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
	if (self_pidfd < 0) {
		free(kargv);
		return -errno;
	}
	snprintf(server, sizeof(server), "%d", (int)getpid());
	snprintf(spfd, sizeof(spfd), "%d", self_pidfd);
	snprintf(ffd, sizeof(ffd), "%d", fuse_fd);
	snprintf(sfd, sizeof(sfd), "%d", state_fd);
	kargv[0] = argv[0];
	kargv[1] = "--keeper";
	kargv[2] = server;
	kargv[3] = spfd;
	kargv[4] = ffd;
	kargv[5] = sfd;
	kargv[6] = "--";
	for (size_t i = 0; i < n; i++)
		kargv[7 + i] = argv[i];
	/* The keeper is a grandchild, so that it is nobody's zombie here and
	 * outlives us without a parent that waits for it. */
	if (pipe2(sv, O_CLOEXEC) < 0) {
		rc = -errno;
		close(self_pidfd);
		free(kargv);
		return rc;
	}
	child = fork();
	if (child < 0) {
		rc = -errno;
	} else if (child == 0) {
		pid_t k;

		close(sv[0]);
		setsid();
		k = fork();
		if (k == 0) {
			if (chdir("/") < 0) {
				/* stays where it is: it opens nothing by path */
			}
			child_fds(fuse_fd, state_fd, self_pidfd);
			execv(binary, (char *const *)kargv);
			_exit(127);
		}
		if (write(sv[1], &k, sizeof(k)) < 0) {
			/* the parent then reads nothing: it reports the failure */
		}
		_exit(k < 0 ? 1 : 0);
	} else {
		close(sv[1]);
		sv[1] = -1;
		if (read(sv[0], &keeper, sizeof(keeper)) != sizeof(keeper) || keeper <= 0)
			rc = -EAGAIN;
		while (waitpid(child, &status, 0) < 0 && errno == EINTR)
			;
	}
	close(sv[0]);
	if (sv[1] >= 0)
		close(sv[1]);
	close(self_pidfd);
	free(kargv);
	return rc < 0 ? rc : keeper;
}

static int64_t now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec;
}

/* Wait until the process of PIDFD ends.  When it is our child (CHILD),
 * reap it into *STATUS (else *STATUS stays -1: its parent was another). */
static void wait_end(int pidfd, pid_t pid, int child, int *status)
{
	struct pollfd pfd = { .fd = pidfd, .events = POLLIN };

	*status = -1;
	while (poll(&pfd, 1, -1) < 0 && errno == EINTR)
		;
	if (child)
		while (waitpid(pid, status, 0) < 0 && errno == EINTR)
			;
}

/* Start the next serving process: BINARY with ARGV, the two descriptors
 * named in the environment, with CAUSE and the predecessor PREV.  Its pid,
 * or -errno. */
static pid_t start_next(const char *binary, char *const argv[], int fuse_fd, int state_fd,
			const char *cause, pid_t prev)
{
	char fds[48], prevs[16];
	const char *cwd = *lockfs_connstate_cwd() ? lockfs_connstate_cwd() : "/";
	pid_t pid;

	snprintf(fds, sizeof(fds), "%d,%d", fuse_fd, state_fd);
	snprintf(prevs, sizeof(prevs), "%d", (int)prev);
	if (setenv(LOCKFS_RESUME_FDS_ENV, fds, 1) < 0 ||
	    setenv(LOCKFS_RESUME_CAUSE_ENV, cause, 1) < 0 ||
	    setenv(LOCKFS_RESUME_PREV_ENV, prevs, 1) < 0)
		return -ENOMEM;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		child_fds(fuse_fd, state_fd, -1);
		/* Relative arguments (-o backing=DIR) mean what they meant. */
		if (chdir(cwd) < 0 && chdir("/") < 0)
			_exit(127);
		execv(binary, argv);
		_exit(127);
	}
	return pid;
}

int lockfs_keeper_main(int argc, char *argv[])
{
	int64_t deaths[LOCKFS_KEEPER_MAX_DEATHS] = { 0 };
	unsigned ndeaths = 0;
	int fuse_fd, state_fd, pidfd, child = 0, rc;
	char **next_argv;
	pid_t server;

	if (argc < 8 || strcmp(argv[1], "--keeper") != 0 || strcmp(argv[6], "--") != 0) {
		fprintf(stderr, "lockfs: --keeper is started by the daemon itself\n");
		return 2;
	}
	server = (pid_t)atoi(argv[2]);
	pidfd = atoi(argv[3]);
	fuse_fd = atoi(argv[4]);
	state_fd = atoi(argv[5]);
	next_argv = argv + 7;
	/* A session of its own: no signal meant for the daemon's group or
	 * its terminal reaches it. */
	(void)setsid();
	openlog("lockfs-keeper", LOG_PID, LOG_DAEMON);
	/* A stop signal meant for the daemon's group is not ours to die of:
	 * the keeper leaves when the serving process stops cleanly. */
	signal(SIGHUP, SIG_IGN);
	signal(SIGINT, SIG_IGN);
	signal(SIGPIPE, SIG_IGN);
	rc = lockfs_connstate_adopt(state_fd);
	if (rc < 0) {
		syslog(LOG_ERR, "the connection's state is unreadable (%s): not keeping it",
		       strerror(-rc));
		return 1;
	}
	/* Held by us only for the successors we start (child_fds clears it
	 * in theirs). */
	(void)fcntl(fuse_fd, F_SETFD, FD_CLOEXEC);
	/* The first serving process's pidfd is the one it opened on itself
	 * before starting us (lockfs_keeper_start): it may be dead, and
	 * reaped, already; its pidfd then reads as ended at once. */
	if (fcntl(pidfd, F_SETFD, FD_CLOEXEC) < 0) {
		syslog(LOG_ERR, "cannot watch the serving process %d: descriptor %d: %s",
		       (int)server, pidfd, strerror(errno));
		return 1;
	}
	for (;;) {
		enum lockfs_conn_phase phase;
		char cause[64];
		int status;
		pid_t next;

		wait_end(pidfd, server, child, &status);
		close(pidfd);
		phase = lockfs_connstate_phase();
		if (phase == LOCKFS_PHASE_STOPPED)
			return 0;
		if (status != -1 && WIFEXITED(status) &&
		    WEXITSTATUS(status) == LOCKFS_EXIT_SUPERSEDED) {
			syslog(LOG_NOTICE, "serving process %d of %s found another daemon in its "
			       "place: letting the connection go", (int)server,
			       lockfs_connstate_mountpoint());
			return 0;
		}
		if (phase == LOCKFS_PHASE_HANDOVER)
			snprintf(cause, sizeof(cause), "upgrade");
		else if (status != -1 && WIFSIGNALED(status))
			snprintf(cause, sizeof(cause), "signal=%d", WTERMSIG(status));
		else if (status != -1 && WIFEXITED(status))
			snprintf(cause, sizeof(cause), "exit=%d", WEXITSTATUS(status));
		else
			snprintf(cause, sizeof(cause), "died");
		if (phase != LOCKFS_PHASE_HANDOVER) {
			int64_t now = now_s();

			deaths[ndeaths++ % LOCKFS_KEEPER_MAX_DEATHS] = now;
			if (ndeaths >= LOCKFS_KEEPER_MAX_DEATHS &&
			    now - deaths[ndeaths % LOCKFS_KEEPER_MAX_DEATHS] < LOCKFS_KEEPER_WINDOW_S) {
				syslog(LOG_ERR, "serving process of %s ended %d times within %d s "
				       "(last: %s): giving up; the mount's clients now get ENOTCONN",
				       lockfs_connstate_mountpoint(), LOCKFS_KEEPER_MAX_DEATHS,
				       LOCKFS_KEEPER_WINDOW_S, cause);
				return 1;
			}
		}
		/* Until the next one serves, its death is a crash, whatever
		 * this one's was. */
		lockfs_connstate_set_phase(LOCKFS_PHASE_STARTING);
		next = start_next(lockfs_connstate_binary(), next_argv, fuse_fd, state_fd, cause,
				  server);
		if (next < 0) {
			syslog(LOG_ERR, "cannot start the next serving process of %s (%s): %s",
			       lockfs_connstate_mountpoint(), lockfs_connstate_binary(),
			       strerror((int)-next));
			return 1;
		}
		syslog(LOG_NOTICE, "serving process %d of %s ended (%s): started %d", (int)server,
		       lockfs_connstate_mountpoint(), cause, (int)next);
		server = next;
		child = 1;
		pidfd = (int)syscall(SYS_pidfd_open, server, 0);
		if (pidfd < 0) {
			/* It ended already: reap it and go round. */
			syslog(LOG_ERR, "cannot watch serving process %d: %s", (int)server,
			       strerror(errno));
			return 1;
		}
	}
}
