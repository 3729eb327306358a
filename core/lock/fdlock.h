/*
 * fd-lock bookkeeping (fdlock.c): which open file of the mount each POSIX
 * lock owner's grant came through, so that the last close of that file
 * ends it (an open file description lock has no unlock of its own).
 * The map lives in each stripe, next to the cache and the queues, and
 * every function here is called with that stripe's mutex held.
 */
#ifndef LOCKFS_LOCK_FDLOCK_H
#define LOCKFS_LOCK_FDLOCK_H

#include <stdint.h>

#include "lockfs/record.h" /* LOCKFS_FD_OWNER_MAX */

struct stripe;

/* One grant remembered with its open file (owned by the stripe). */
struct fdlock_via {
	struct fdlock_via *next;
	char *name;
	char owner[LOCKFS_FD_OWNER_MAX];
	uint64_t file;
};

/* OWNER's grant of NAME came through open file FILE (not 0): remember it
 * there, and no longer with any other open file of NAME.  Out of memory,
 * it is not remembered: the lock then ends only by its owner's unlock or
 * close. */
void lockfs_fdlock_granted_via(struct stripe *s, const char *name, const char *owner,
			       uint64_t file);

/* Take every grant of NAME remembered with FILE out of S: a chain (NULL
 * when none) that the caller ends and frees with lockfs_fdlock_free. */
struct fdlock_via *lockfs_fdlock_take_file(struct stripe *s, const char *name, uint64_t file);

/* Free a chain (from lockfs_fdlock_take_file, or all of S's at close). */
void lockfs_fdlock_free(struct fdlock_via *v);
void lockfs_fdlock_free_all(struct stripe *s);

#endif
