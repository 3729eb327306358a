/* Taking over a live FUSE connection from a predecessor (resume.c). */
#ifndef LOCKFS_FS_RESUME_H
#define LOCKFS_FS_RESUME_H

#include <stdbool.h>
#include <sys/types.h>
#include <fuse_lowlevel.h>

/* Why this process was started, when it takes a connection over. */
struct lockfs_resume {
	int fuse_fd;        /* the connection's /dev/fuse descriptor */
	int state_fd;       /* its state memfd (connstate.c), adopted */
	pid_t prev;         /* the predecessor, 0 when unknown */
	char cause[64];     /* "upgrade", "signal=9", "exit=1", "died", "restart" */
	bool from_systemd;  /* the descriptors came from systemd's store */
};

/*
 * Is this process to take over a connection?  Reads (and unsets) the
 * keeper's environment, or systemd's LISTEN_FDS/LISTEN_FDNAMES, and
 * adopts the state.  1 and *R filled; 0 when it starts afresh; -1 after
 * one line on stderr (descriptors named but unusable).
 */
int lockfs_resume_take(struct lockfs_resume *r);

/*
 * Attach SE to the live connection R->fuse_fd and set it up as the
 * predecessor negotiated it (its INIT, fed to libfuse again; the reply
 * goes nowhere).  Returns 0, or -1 after one line on stderr.
 */
int lockfs_resume_attach(struct fuse_session *se, const struct lockfs_resume *r);

/*
 * Ask the kernel to send again every request of the connection FD that
 * was read but not answered (FUSE_NOTIFY_RESEND, Linux 6.9).  Returns 0,
 * or -errno: -EINVAL or -ENOSYS on a kernel without it.
 */
int lockfs_resume_resend(int fd);

#endif
