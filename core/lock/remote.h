/*
 * Other hosts' locks as events (remote.c): while someone reads M/.events,
 * a lock the cache now shows held on another host (etcd: by another
 * host's daemon) is an `acquired` event, one it no longer shows a
 * `released` event, both with `host` and `remote: 1`.  Nothing is done
 * while nobody reads.
 */
#ifndef LOCKFS_LOCK_REMOTE_H
#define LOCKFS_LOCK_REMOTE_H

#include "table.h"

/* The cache's hook (lockfs_table.elsewhere): C, held on another host,
 * came in ("acquired") or is going ("released"); an event with `host` and
 * `remote: 1` if anybody reads M/.events.  With C's stripe mutex held. */
void lockfs_remote_note(struct lockfs_table *t, const struct held_lock *c, const char *event);

#endif
