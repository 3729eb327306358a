/* Stopping on SIGTERM/SIGINT in bounded time (stop.c). */
#ifndef LOCKFS_STOP_H
#define LOCKFS_STOP_H

struct lockfs_backend;

#include <stdbool.h>
#include <fuse_lowlevel.h>


/* After fuse_set_signal_handlers(SE): replace its SIGTERM and SIGINT
 * handlers by ours (SIGHUP and SIGPIPE are left as they are).  A stop
 * signal marks BE's daemon as stopping (lockfs_backend_mark_stopping).
 * Returns 0 or -errno. */
int lockfs_stop_install(struct fuse_session *se, const struct lockfs_backend *be);

/* Once a keeper (or systemd) holds the connection: SIGUSR2 ends the loop
 * for a hand-over (lockfs_stop_handover).  Returns 0 or -errno. */
int lockfs_stop_install_handover(void);

/* Did the loop end for a hand-over (SIGUSR2, and no stop signal)? */
bool lockfs_stop_handover(void);

/* In the thread that will run the session loop, after any fork: start the
 * thread that wakes the loop once a stop signal came.  Returns 0 or
 * -errno. */
int lockfs_stop_start(void);

/* The loop has returned (or never ran): stop and join that thread.
 * From now on SIGTERM and SIGINT are ignored (the shutdown is under way).
 * Safe to call when lockfs_stop_start() was not. */
void lockfs_stop_loop_ended(void);

/* The signal that stopped the daemon (SIGTERM, SIGINT), or 0 (unmounted,
 * or still running). */
int lockfs_stop_signal(void);

#endif
