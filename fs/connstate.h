/*
 * What a successor needs to take over the live FUSE connection (connstate.c):
 * a memfd that the keeper (or systemd's descriptor store) holds next to
 * /dev/fuse, mapped by the serving process and written as it serves.
 */
#ifndef LOCKFS_FS_CONNSTATE_H
#define LOCKFS_FS_CONNSTATE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Where the serving process is (struct connstate's phase). */
enum lockfs_conn_phase {
	LOCKFS_PHASE_STARTING = 0, /* before the loop: a death here is not resumed */
	LOCKFS_PHASE_SERVING = 1,  /* a death now is a crash: resume */
	LOCKFS_PHASE_STOPPED = 2,  /* a clean stop (unmount, SIGTERM): the keeper leaves */
	LOCKFS_PHASE_HANDOVER = 3, /* `lockfs --upgrade`: resume with the binary */
};

/* One node of inode.c, as the successor rebuilds it (id 0: a free slot). */
struct lockfs_saved_node {
	uint64_t id;
	uint64_t generation;
	uint64_t nlookup;
	uint32_t uid;
	uint32_t pad;
	char name[NAME_MAX + 1];
};

/* What an open handle (fi->fh) is (struct lockfs_saved_handle's kind). */
enum lockfs_handle_kind {
	LOCKFS_HK_FILE = 1,     /* a lock's file, M/.log or M/.flock/NAME */
	LOCKFS_HK_DIR = 2,      /* a directory listing */
};

/* One open handle of handle.c (fh 0: a free slot). */
struct lockfs_saved_handle {
	uint64_t fh;
	uint64_t ino;
	uint32_t kind;          /* enum lockfs_handle_kind */
	uint32_t flags;         /* the open flags */
	uint32_t uid;           /* counted against this uid */
	uint32_t keeps_fd;      /* M/.log: a descriptor in the daemon */
};

/* Make a new state memfd for this process's connection (first start).
 * Returns its descriptor (close-on-exec: the keeper's start passes it on),
 * or -errno. */
int lockfs_connstate_create(void);
/* Map the state memfd FD a predecessor left (a successor's start).
 * Returns 0, or -EINVAL when it is not one (wrong magic or size), or
 * -errno. */
int lockfs_connstate_adopt(int fd);
/* Unmap an adopted state that is not to be used (a stale one). */
void lockfs_connstate_forget(void);
/* Is there a state (created or adopted)? */
bool lockfs_connstate_active(void);
/* The state memfd, or -1. */
int lockfs_connstate_fd(void);

/* The raw FUSE_INIT request (header and fuse_init_in) of the connection:
 * keep it (from the request loop), or get it (NULL when none was kept). */
void lockfs_connstate_keep_init(const void *req, size_t len);
const void *lockfs_connstate_init(size_t *len);

void lockfs_connstate_set_phase(enum lockfs_conn_phase phase);
enum lockfs_conn_phase lockfs_connstate_phase(void);
/* The pid serving now, written by it at start. */
void lockfs_connstate_set_server(pid_t pid);
pid_t lockfs_connstate_server(void);
/* The mount point (absolute), the device of the mount, the binary to
 * start next and the directory the arguments are relative to: written at
 * the first start, read by every successor (which must not look at the
 * mount point: nothing serves it yet). */
void lockfs_connstate_set_mount(const char *mountpoint, uint64_t dev, const char *binary,
				const char *cwd);
const char *lockfs_connstate_cwd(void);
const char *lockfs_connstate_mountpoint(void);
uint64_t lockfs_connstate_mount_dev(void);
const char *lockfs_connstate_binary(void);

/* The counters that must never go back within a mount: the next node id
 * (inode.c) and the next fh (handle.c).  The setters take the larger. */
void lockfs_connstate_set_next_node(uint64_t next);
uint64_t lockfs_connstate_next_node(void);
void lockfs_connstate_set_next_fh(uint64_t next);
uint64_t lockfs_connstate_next_fh(void);

/* A free node or handle slot in the state, or NULL (no state, or full:
 * that one is then unknown to a successor).  Free it with _put. */
struct lockfs_saved_node *lockfs_connstate_node_get(void);
void lockfs_connstate_node_put(struct lockfs_saved_node *n);
struct lockfs_saved_handle *lockfs_connstate_handle_get(void);
void lockfs_connstate_handle_put(struct lockfs_saved_handle *h);
/* Every used slot, for a successor's rebuild: call FN for each; stops at
 * the first nonzero return and returns it. */
int lockfs_connstate_each_node(int (*fn)(struct lockfs_saved_node *n, void *arg), void *arg);
int lockfs_connstate_each_handle(int (*fn)(struct lockfs_saved_handle *h, void *arg),
				 void *arg);

#endif
