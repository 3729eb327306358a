/*
 * Detaching the daemon from the command that started it (fs/daemonize.c),
 * in place of fuse_daemonize(3), whose parent returns before the detached
 * child has done anything: a script that read DIR/.lockfs right after
 * `lockfs` returned could find no pid, or the previous daemon's.
 */
#ifndef LOCKFS_FS_DAEMONIZE_H
#define LOCKFS_FS_DAEMONIZE_H

/*
 * Fork.  The child returns 0: it leads a session of its own, and it keeps
 * the caller's working directory (relative paths still work; see
 * lockfs_daemonize_leave_cwd) and stdin, stdout and stderr until
 * lockfs_daemonize_done.  The parent never returns: it waits for the
 * child's lockfs_daemonize_done and exits 0 on success, else 1 after one
 * line on stderr; a child that exits non-zero without a word (it said why
 * on the shared stderr) makes the parent exit with the same status, with
 * nothing more said.  Returns -errno, still in the one process, when the
 * fork or its channel cannot be made (nothing was forked).
 *
 * Call it before anything starts a thread or opens the store: a thread
 * does not cross a fork (the etcd store's keepalive and watch threads
 * start when it opens), and the store's session must name the process
 * that serves.
 */
int lockfs_daemonize(void) __attribute__((warn_unused_result));

/* In the detached child, once every path given relative to the caller's
 * working directory is open: move to /.  Nothing when not detached. */
void lockfs_daemonize_leave_cwd(void);

/*
 * In the detached child: the start is over.  ERR 0: the mount serves and
 * the pid is recorded (the parent exits 0); else the positive errno of
 * what failed (the parent exits 1, naming it).  Points stdin, stdout and
 * stderr at /dev/null first, so that a caller that captures the output,
 * `$(lockfs ...)`, is not kept waiting by the daemon.  Nothing when not
 * detached, or after the first call.
 */
void lockfs_daemonize_done(int err);

#endif
