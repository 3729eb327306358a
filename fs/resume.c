/*
 * Taking over a live FUSE connection: the successor's start.
 *
 * libfuse 3.14 has no call to resume a session on a connection that is
 * already set up, so this does what is missing with the calls it has:
 * fuse_session_mount(se, "/dev/fd/N") makes the session use descriptor N
 * as it is (no mount), and the FUSE_INIT request the first process read
 * (kept in the state, connstate.c) is processed once more with a unique
 * the kernel does not know, so libfuse sets up exactly the connection
 * that was negotiated (its reply is refused with ENOENT, which libfuse
 * does not print).  Then, once the tables are rebuilt and the engine
 * runs, FUSE_NOTIFY_RESEND makes the kernel send again every request the
 * predecessor had read but not answered: they arrive with bit 63 of their
 * unique set (FUSE_UNIQUE_RESEND), which libfuse echoes in the reply.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "connstate.h"
#include "fdstore.h"
#include "keeper.h"
#include "resume.h"

/* linux/fuse.h of protocol 7.40 (Linux 6.9); older headers lack it. */
#ifndef FUSE_NOTIFY_RESEND
#define FUSE_NOTIFY_RESEND 7
#endif
/* A unique the kernel never hands out (it counts up from 1 in steps of 2
 * and marks resent requests with bit 63). */
#define REPLAY_UNIQUE (UINT64_C(1) << 62)

/* "N,M" into two descriptors; 0 or -1. */
static int parse_fds(const char *text, int *a, int *b)
{
	char *end;
	long x = strtol(text, &end, 10), y;

	if (end == text || *end != ',' || x < 0 || x > 1 << 20)
		return -1;
	text = end + 1;
	y = strtol(text, &end, 10);
	if (end == text || *end || y < 0 || y > 1 << 20)
		return -1;
	*a = (int)x;
	*b = (int)y;
	return 0;
}

/* The descriptors from systemd's store, when it passed them (fdstore.c):
 * as lockfs_resume_take.  A connection that is gone, or a state that says
 * its daemon stopped cleanly, is no connection to take over: start
 * afresh. */
static int take_from_systemd(struct lockfs_resume *r)
{
	struct pollfd pfd = { .events = POLLIN };
	int rc = lockfs_fdstore_take(r);

	if (rc <= 0)
		return rc;
	pfd.fd = r->fuse_fd;
	rc = lockfs_connstate_adopt(r->state_fd);
	if (rc < 0 || lockfs_connstate_phase() == LOCKFS_PHASE_STOPPED ||
	    poll(&pfd, 1, 0) < 0 || (pfd.revents & (POLLERR | POLLHUP | POLLNVAL))) {
		fprintf(stderr, "lockfs: notice: the connection the service manager kept is %s: "
			"starting afresh\n", rc < 0 ? "without a usable state" : "gone");
		lockfs_connstate_forget();
		close(r->fuse_fd);
		close(r->state_fd);
		r->fuse_fd = r->state_fd = -1;
		return 0;
	}
	(void)fcntl(r->fuse_fd, F_SETFD, FD_CLOEXEC);
	r->prev = lockfs_connstate_server();
	snprintf(r->cause, sizeof(r->cause), "%s",
		 lockfs_connstate_phase() == LOCKFS_PHASE_HANDOVER ? "upgrade" : "restart");
	return 1;
}

int lockfs_resume_take(struct lockfs_resume *r)
{
	const char *fds = getenv(LOCKFS_RESUME_FDS_ENV);
	const char *cause = getenv(LOCKFS_RESUME_CAUSE_ENV);
	const char *prev = getenv(LOCKFS_RESUME_PREV_ENV);
	int rc;

	memset(r, 0, sizeof(*r));
	r->fuse_fd = r->state_fd = -1;
	if (!fds)
		return take_from_systemd(r);
	if (parse_fds(fds, &r->fuse_fd, &r->state_fd) < 0 ||
	    fcntl(r->fuse_fd, F_GETFD) < 0) {
		fprintf(stderr, "lockfs: %s=%s does not name two open descriptors\n",
			LOCKFS_RESUME_FDS_ENV, fds);
		return -1;
	}
	snprintf(r->cause, sizeof(r->cause), "%s", cause ? cause : "died");
	r->prev = prev ? (pid_t)atoi(prev) : 0;
	unsetenv(LOCKFS_RESUME_FDS_ENV);
	unsetenv(LOCKFS_RESUME_CAUSE_ENV);
	unsetenv(LOCKFS_RESUME_PREV_ENV);
	rc = lockfs_connstate_adopt(r->state_fd);
	if (rc < 0) {
		fprintf(stderr, "lockfs: the connection's state (descriptor %d) is unusable: %s\n",
			r->state_fd, strerror(-rc));
		return -1;
	}
	(void)fcntl(r->fuse_fd, F_SETFD, FD_CLOEXEC);
	return 1;
}

int lockfs_resume_attach(struct fuse_session *se, const struct lockfs_resume *r)
{
	char path[32];
	const void *init;
	size_t len;
	struct fuse_buf buf = { 0 };

	init = lockfs_connstate_init(&len);
	snprintf(path, sizeof(path), "/dev/fd/%d", r->fuse_fd);
	if (fuse_session_mount(se, path) != 0) {
		fprintf(stderr, "lockfs: cannot use the connection's descriptor %d\n", r->fuse_fd);
		return -1;
	}
	/* No FUSE_INIT kept: the predecessor died right after mounting, before
	 * its loop read the kernel's first request.  That request is still
	 * the kernel's (pending, or resent by FUSE_NOTIFY_RESEND if it was
	 * read), and this session, which has seen no INIT yet, answers it
	 * as any new daemon does. */
	if (!init || len < sizeof(struct fuse_in_header) + 16)
		return 0;
	buf.mem = malloc(len);
	if (!buf.mem) {
		fprintf(stderr, "lockfs: out of memory\n");
		return -1;
	}
	memcpy(buf.mem, init, len);
	((struct fuse_in_header *)buf.mem)->unique = REPLAY_UNIQUE;
	buf.size = len;
	fuse_session_process_buf(se, &buf);
	free(buf.mem);
	return 0;
}

int lockfs_resume_resend(int fd)
{
	struct fuse_out_header out = {
		.len = sizeof(out), .error = FUSE_NOTIFY_RESEND, .unique = 0,
	};
	ssize_t n = write(fd, &out, sizeof(out));

	if (n < 0)
		return -errno;
	return n == (ssize_t)sizeof(out) ? 0 : -EIO;
}
