/*
 * M/.events and M/.metrics (events_file.c): the engine's events as they
 * happen, one JSON line each, and its counters in Prometheus' text format.
 */
#ifndef LOCKFS_FS_EVENTS_FILE_H
#define LOCKFS_FS_EVENTS_FILE_H

#include <sys/stat.h>

#include "fs.h"
#include "handle.h"

#define INO_EVENTS 4  /* M/.events */
#define INO_METRICS 5 /* M/.metrics */

/* Open M/.events files one uid may have at once (root too): each is a
 * cursor the engine's events are kept for. */
#define LOCKFS_EVENTS_OPEN_PER_UID 16

/* The thread that answers parked reads of M/.events.  0 or -errno. */
int lockfs_events_file_start(struct lockfs_fs *fs);
/* The daemon stops: every parked read ends (end of file), later reads
 * too, and the thread is gone.  Before the session is unmounted. */
void lockfs_events_file_shutdown(struct lockfs_fs *fs);

/* Attributes of INO_EVENTS or INO_METRICS. */
void lockfs_events_file_attr(struct lockfs_fs *fs, fuse_ino_t ino, struct stat *st);
/* REQ opens M/.events into OF: a cursor at the next event.  0, or
 * -EMFILE (LOCKFS_EVENTS_OPEN_PER_UID), -ENOMEM. */
int lockfs_events_file_open(struct lockfs_fs *fs, fuse_req_t req, struct open_file *of);
/* A read of SIZE bytes of OF: answered with whole lines at once, or
 * parked until an event comes (interruptible), or the daemon stops. */
void lockfs_events_file_read(fuse_req_t req, struct lockfs_fs *fs, struct open_file *of,
			     size_t size);
/* A write to OF: lock names, one a line, the only ones its reads show
 * from now on.  SIZE, or -EINVAL (not a lock name), -ENOMEM. */
int lockfs_events_file_write(struct lockfs_fs *fs, struct open_file *of, const char *buf,
			     size_t size);
/* OF (an M/.events open) is closed: no more events kept for it. */
void lockfs_events_file_close(struct lockfs_fs *fs, struct open_file *of);

#endif
