/* The FUSE adapter's shared state: one struct lockfs_fs per mount. */
#ifndef LOCKFS_FS_H
#define LOCKFS_FS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <fuse_lowlevel.h>

#include "lockfs/core.h"

/*
 * Inode numbers.  The root is FUSE_ROOT_ID (1), the audit log view is 2.
 * Lock NAME gets a node id K >= 1 for as long as the kernel remembers it;
 * its directory is K << 4 and the files inside it are (K << 4) | FILE.
 * Node ids are never reused within a mount, so an inode number never
 * names two different things.
 */
#define INO_LOG 2
enum lock_file {
	LF_DIR = 0,
	LF_OWNER = 1,
	LF_OPERATION = 2,
	LF_FENCE = 3,
	LF_LEASE = 4,
	LF_BREAK = 5,
	LF_COUNT
};
#define INO_SHIFT 4

static inline fuse_ino_t ino_make(uint64_t id, enum lock_file f)
{
	return (fuse_ino_t)((id << INO_SHIFT) | f);
}
static inline uint64_t ino_id(fuse_ino_t ino)
{
	return ino >> INO_SHIFT;
}
static inline enum lock_file ino_file(fuse_ino_t ino)
{
	return (enum lock_file)(ino & ((1u << INO_SHIFT) - 1));
}
static inline int ino_is_lock(fuse_ino_t ino)
{
	return ino >= (1u << INO_SHIFT) && ino_file(ino) < LF_COUNT;
}

/* The kernel's view: which lock names it holds inode numbers for. */
struct inodes;

struct inodes *inodes_new(void);
void inodes_free(struct inodes *t);
/* The node id for acquisition GENERATION of NAME, made if needed, with its
 * lookup count raised by one.  Returns 0 when out of memory. */
uint64_t inodes_ref(struct inodes *t, const char *name, uint64_t generation);
/* Copy the name of node ID into BUF (NAME_MAX + 1 bytes) and its
 * generation into *GENERATION.
 * Returns 0, or -ENOENT when the kernel has forgotten it. */
int inodes_name(struct inodes *t, uint64_t id, char *buf, uint64_t *generation);
/* The kernel forgets N lookups of node ID. */
void inodes_forget(struct inodes *t, uint64_t id, uint64_t n);
/* Count files opened (DELTA +1) and released (-1) inside lock node ID:
 * the kernel refuses to drop a directory entry while one is open. */
void inodes_opened(struct inodes *t, uint64_t id, int delta);
uint64_t inodes_open_count(struct inodes *t, uint64_t id);
/* Up to MAX node ids the kernel holds for NAME (any generation), into IDS.
 * Returns how many. */
size_t inodes_find(struct inodes *t, const char *name, uint64_t *ids, size_t max);

/* The thread that sends the kernel removals the engine made (notify.c). */
struct notifier;
struct lockfs_fs;
struct notifier *notifier_new(struct lockfs_fs *fs);
int notifier_run(struct notifier *nt);
void notifier_removed(void *arg, const char *name);
void notifier_free(struct notifier *nt);

struct lockfs_fs {
	struct lockfs_core *core;
	struct inodes *inodes;
	struct fuse_session *se;
	struct notifier *notifier;
	uid_t mount_uid;   /* who mounted: owns the root, may break locks */
	gid_t mount_gid;
	struct timespec mounted_at;
};

extern const struct fuse_lowlevel_ops lockfs_ops;

#endif
