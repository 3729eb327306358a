/*
 * What the readers of M/.events follow (follow.c), as the store is told
 * it (the backend op `follow`): a store that hears only of the names this
 * daemon needs (etcd) hears, while someone watches, of the names watched
 * too -- or of every name, while a reader watches all of them.  A watcher
 * is interest.  Nothing here runs while nobody reads M/.events.
 *
 * Lock order: the registry's mutex is held across the store's call, so
 * that the store hears the changes in the order they were made; no engine
 * lock is held with it, and nothing under it calls back here.
 */
#ifndef LOCKFS_LOCK_FOLLOW_H
#define LOCKFS_LOCK_FOLLOW_H

#include "lockfs/backend.h"

struct lockfs_follow;

/* A new registry that tells BE: 0, or -ENOMEM. */
int lockfs_follow_new(struct lockfs_backend *be, struct lockfs_follow **out);
/* Free F (NULL: nothing); the store is not told. */
void lockfs_follow_free(struct lockfs_follow *f);

/*
 * One reader's following changes from OLD to NEW.  Each is a watch list
 * (names, each NUL-terminated, an empty one last), LOCKFS_FOLLOW_ALL
 * (every name) or LOCKFS_FOLLOW_NONE (not following).  The store is told
 * when the union of all readers' lists changed.  Returns the store's
 * answer (0 when it was not asked).
 */
#ifndef LOCKFS_FOLLOW_NONE  /* also in lockfs/core.h, for fs/ */
#define LOCKFS_FOLLOW_NONE ((const char *)0)
extern const char lockfs_follow_all[];
#define LOCKFS_FOLLOW_ALL lockfs_follow_all
#endif
int lockfs_follow_change(struct lockfs_follow *f, const char *old, const char *new_);

#endif
