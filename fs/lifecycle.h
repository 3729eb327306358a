/* The daemon's start, stop and predecessor lines in the audit log
 * (lifecycle.c). */
#ifndef LOCKFS_FS_LIFECYCLE_H
#define LOCKFS_FS_LIFECYCLE_H

struct lockfs_backend;

#include <sys/types.h>

#include "lockfs/log.h"

/* Right after the log opens, before the engine recovers anything: a
 * predecessor that left its pid in DIR/.lockfs is logged `daemon-crashed`
 * (or `daemon-taken-over` when it was wedged and aborted), with a notice on
 * stderr, and forgotten. */
void lockfs_lifecycle_predecessor(struct lockfs_log *log, struct lockfs_backend *be);

/* Instead of lockfs_lifecycle_predecessor, in a process that takes a live
 * connection over: `daemon-resumed` naming the predecessor PREV and CAUSE
 * (upgrade, signal=N, exit=N, died), and the predecessor forgotten. */
void lockfs_lifecycle_resumed(struct lockfs_log *log, struct lockfs_backend *be, pid_t prev,
			      const char *cause);

/* Right before the mount: `daemon-started` for MOUNTPOINT, naming the
 * stopping predecessor waited for, if any. */
void lockfs_lifecycle_started(struct lockfs_log *log, const struct lockfs_backend *be,
			      const char *mountpoint);

/* After the loop ended and the engine stopped: `daemon-stopped`, with the
 * stop signal SIG (0: the mount was unmounted), and a notice on stderr. */
void lockfs_lifecycle_stopped(struct lockfs_log *log, const char *mountpoint, int sig);

/* A start that did not get to serve (CAUSE: mount-failed, start-failed):
 * `daemon-stopped cause=CAUSE`, so that every started line has its end. */
void lockfs_lifecycle_failed(struct lockfs_log *log, const char *mountpoint, const char *cause);

#endif
