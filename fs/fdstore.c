/*
 * systemd's file descriptor store as the keeper of the FUSE connection.
 *
 * Under systemd there is no keeper process (keeper.c): the unit's
 * FileDescriptorStoreMax= lets the service manager keep the connection's
 * /dev/fuse descriptor and the state memfd (connstate.c) across a restart
 * (Restart=: a crash, or the hand-over exit status of `lockfs --upgrade`)
 * and pass them to the next process as $LISTEN_FDS, named by
 * $LISTEN_FDNAMES.  The message is the sd_pid_notify_with_fds() one,
 * written here (a datagram with SCM_RIGHTS to $NOTIFY_SOCKET) so that no
 * library is needed: "FDSTORE=1\nFDNAME=NAME", one per descriptor, so
 * that each comes back under its own name.  FDPOLL=0 for the memfd, which
 * never reports an error; /dev/fuse is polled, so the store drops it once
 * the connection is gone (unmounted or aborted).
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fdstore.h"

/* The first descriptor systemd passes (SD_LISTEN_FDS_START). */
#define LISTEN_FDS_START 3

bool lockfs_fdstore_available(void)
{
	const char *s = getenv("NOTIFY_SOCKET");

	return s && (s[0] == '/' || s[0] == '@');
}

/* Send TEXT with descriptor FD to $NOTIFY_SOCKET.  0 or -errno. */
static int notify_fd(const char *text, int fd)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} control;
	struct iovec iov = { .iov_base = (void *)text, .iov_len = strlen(text) };
	struct msghdr msg = { .msg_name = &sa, .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *c;
	size_t len;
	int sock, rc = 0;

	if (!path || (len = strlen(path)) >= sizeof(sa.sun_path) || len < 2)
		return -EINVAL;
	memcpy(sa.sun_path, path, len);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = '\0'; /* abstract */
	msg.msg_namelen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	if (fd >= 0) {
		memset(&control, 0, sizeof(control));
		msg.msg_control = control.buf;
		msg.msg_controllen = sizeof(control.buf);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (sock < 0)
		return -errno;
	if (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0)
		rc = -errno;
	close(sock);
	return rc;
}

int lockfs_fdstore_send(int fuse_fd, int state_fd, int dirfd, unsigned major, unsigned minor)
{
	char dev[32];
	int rc, fd;

	/* What an earlier run left (a memfd outlives a dead connection in
	 * the store) would make the store overflow. */
	(void)notify_fd("FDSTOREREMOVE=1\nFDNAME=" LOCKFS_FDNAME_FUSE, -1);
	(void)notify_fd("FDSTOREREMOVE=1\nFDNAME=" LOCKFS_FDNAME_STATE, -1);
	/* The note first: once the descriptors are stored, a restart may
	 * come at any moment. */
	snprintf(dev, sizeof(dev), "%u:%u\n", major, minor);
	fd = openat(dirfd, LOCKFS_KEPT_FILE, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
		    0644);
	if (fd >= 0) {
		if (write(fd, dev, strlen(dev)) < 0) {
			/* lockfs-mountpoint then probes the mount, as before */
		}
		close(fd);
	}
	rc = notify_fd("FDSTORE=1\nFDNAME=" LOCKFS_FDNAME_STATE "\nFDPOLL=0", state_fd);
	if (rc == 0)
		rc = notify_fd("FDSTORE=1\nFDNAME=" LOCKFS_FDNAME_FUSE, fuse_fd);
	if (rc < 0)
		(void)unlinkat(dirfd, LOCKFS_KEPT_FILE, 0);
	return rc;
}

void lockfs_fdstore_forget(int dirfd)
{
	(void)notify_fd("FDSTOREREMOVE=1\nFDNAME=" LOCKFS_FDNAME_FUSE, -1);
	(void)notify_fd("FDSTOREREMOVE=1\nFDNAME=" LOCKFS_FDNAME_STATE, -1);
	(void)unlinkat(dirfd, LOCKFS_KEPT_FILE, 0);
}

int lockfs_fdstore_take(struct lockfs_resume *r)
{
	const char *pid = getenv("LISTEN_PID"), *nfds = getenv("LISTEN_FDS");
	const char *names = getenv("LISTEN_FDNAMES");
	char *copy, *save = NULL, *name;
	int n, i = 0;

	if (!pid || !nfds || atol(pid) != (long)getpid())
		return 0;
	n = atoi(nfds);
	copy = strdup(names ? names : "");
	if (!copy)
		return -1;
	r->fuse_fd = r->state_fd = -1;
	for (name = strtok_r(copy, ":", &save); name && i < n;
	     name = strtok_r(NULL, ":", &save), i++) {
		if (strcmp(name, LOCKFS_FDNAME_FUSE) == 0)
			r->fuse_fd = LISTEN_FDS_START + i;
		else if (strcmp(name, LOCKFS_FDNAME_STATE) == 0)
			r->state_fd = LISTEN_FDS_START + i;
		else
			(void)fcntl(LISTEN_FDS_START + i, F_SETFD, FD_CLOEXEC);
	}
	free(copy);
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	if (r->fuse_fd < 0 || r->state_fd < 0) {
		if (r->fuse_fd >= 0 || r->state_fd >= 0)
			fprintf(stderr, "lockfs: warning: the service manager passed only one of "
				LOCKFS_FDNAME_FUSE " and " LOCKFS_FDNAME_STATE ": starting afresh\n");
		if (r->fuse_fd >= 0)
			close(r->fuse_fd);
		if (r->state_fd >= 0)
			close(r->state_fd);
		r->fuse_fd = r->state_fd = -1;
		return 0;
	}
	r->from_systemd = true;
	return 1;
}
