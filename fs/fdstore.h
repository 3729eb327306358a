/* systemd's file descriptor store as the connection's keeper (fdstore.c). */
#ifndef LOCKFS_FS_FDSTORE_H
#define LOCKFS_FS_FDSTORE_H

#include <stdbool.h>

#include "resume.h"

/* The names the two descriptors are stored under. */
#define LOCKFS_FDNAME_FUSE "lockfs-fuse"
#define LOCKFS_FDNAME_STATE "lockfs-state"
/* In the state directory while systemd keeps the connection: the mount's
 * device ("MAJOR:MINOR"), so that lockfs-mountpoint does not take the
 * waiting mount of a restart for a dead one. */
#define LOCKFS_KEPT_FILE ".lockfs-kept"

/* Does a service manager keep our descriptors ($NOTIFY_SOCKET set)? */
bool lockfs_fdstore_available(void);

/* Hand FUSE_FD and STATE_FD to the store (FDSTORE=1, named as above) and
 * note DEV in DIRFD's LOCKFS_KEPT_FILE.  0, or -errno. */
int lockfs_fdstore_send(int fuse_fd, int state_fd, int dirfd, unsigned major, unsigned minor);

/* A clean stop: the store lets go of them (FDSTOREREMOVE=1), and the note
 * goes. */
void lockfs_fdstore_forget(int dirfd);

/* The descriptors systemd passed back ($LISTEN_PID, $LISTEN_FDS,
 * $LISTEN_FDNAMES; unset here): 1 and R->fuse_fd, R->state_fd; 0 when
 * none were passed; -1 after one line on stderr. */
int lockfs_fdstore_take(struct lockfs_resume *r);

#endif
