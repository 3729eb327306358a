/* `lockfs --stop MOUNTPOINT` (stopcmd.c). */
#ifndef LOCKFS_FS_STOPCMD_H
#define LOCKFS_FS_STOPCMD_H

/* Its exit statuses (lockfs(8), EXIT STATUS). */
enum {
	LOCKFS_STOP_DONE = 0,   /* the daemon exited and its mount is gone */
	LOCKFS_STOP_FAILED = 1, /* one line on stderr says why */
	LOCKFS_STOP_USAGE = 2,
	LOCKFS_STOP_NONE = 3,   /* no live daemon serves MOUNTPOINT: nothing done */
};

/*
 * Stop the daemon serving MOUNTPOINT (argv[2]): SIGTERM, then wait up to
 * 10 s for it to exit and 2 s more for its mount to leave our mount table.
 * Returns one of the statuses above.
 */
int lockfs_stop_main(int argc, char *argv[]);

/*
 * `lockfs --upgrade MOUNTPOINT` (argv[2]): have the daemon serving it hand
 * its connection over (SIGUSR2) to a new process started from the path
 * it was started from, and wait up to 10 s for it to exit and 10 s more
 * for its successor to serve.  Clients see nothing.  Returns one of the
 * statuses above (FAILED also when the daemon has no keeper).
 */
int lockfs_upgrade_main(int argc, char *argv[]);

#endif
