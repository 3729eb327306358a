/* The keeper: a minimal process that holds the FUSE connection across
 * restarts of the serving process (keeper.c). */
#ifndef LOCKFS_FS_KEEPER_H
#define LOCKFS_FS_KEEPER_H

#include <sys/types.h>

/* The exit status of a serving process that handed its connection over
 * (`lockfs --upgrade`): the keeper, or systemd's RestartForceExitStatus=,
 * starts the next one. */
#define LOCKFS_EXIT_HANDOVER 75
/* The exit status of a successor that found its connection superseded
 * (another daemon took the backing dir, or the mount is gone from its
 * mount point): the keeper then leaves instead of trying again. */
#define LOCKFS_EXIT_SUPERSEDED 76

/* The environment variable that tells a successor which descriptors are
 * the connection and its state ("FUSE_FD,STATE_FD"), and the ones that
 * say why it was started (cause) and whom it replaces (pid). */
#define LOCKFS_RESUME_FDS_ENV "LOCKFS_RESUME_FDS"
#define LOCKFS_RESUME_CAUSE_ENV "LOCKFS_RESUME_CAUSE"
#define LOCKFS_RESUME_PREV_ENV "LOCKFS_RESUME_PREV"

/* A crash loop: this many deaths within CRASH_WINDOW_S and the keeper
 * gives up (the connection closes; clients get ENOTCONN). */
#define LOCKFS_KEEPER_MAX_DEATHS 5
#define LOCKFS_KEEPER_WINDOW_S 10

/*
 * In the serving process, once mounted: start the keeper (BINARY
 * --keeper ...), detached (a session of its own, stdio on /dev/null, not
 * our child), holding FUSE_FD and STATE_FD, watching this process
 * through a pidfd opened here (so that our death before the keeper runs
 * is still seen as ours).  ARGV (NULL-terminated) is what every
 * successor is started with.  Returns the keeper's pid, or -errno.
 */
pid_t lockfs_keeper_start(const char *binary, int fuse_fd, int state_fd, char *const argv[]);

/* `lockfs --keeper SERVER_PID SERVER_PIDFD FUSE_FD STATE_FD -- ARGV...`:
 * the keeper's own main.  Returns its exit status. */
int lockfs_keeper_main(int argc, char *argv[]);

#endif
