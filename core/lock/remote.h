/*
 * Other hosts' locks as events (remote.c): while someone reads M/.events,
 * a name the store reported changed by someone else (etcd: another host's
 * daemon) is compared before and after the engine took the change in, and
 * a lock now held by a holder on another host is an `acquired` event, one
 * no longer held a `released` event, both with `host` and `remote: 1`.
 * Nothing is done while nobody reads.
 */
#ifndef LOCKFS_LOCK_REMOTE_H
#define LOCKFS_LOCK_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

#include "table.h"

/* NAME's holder on another host before a change, as the cache had it. */
struct remote_seen {
	bool watched;      /* someone reads M/.events: look at all */
	bool had;          /* a holder on another host was cached */
	uint64_t fence;
	char who[WHO_MAX], host[256], uid[16], pid[16];
};

/* Note what the cache shows of NAME now.  With S's mutex held. */
void lockfs_remote_before(struct lockfs_table *t, struct stripe *s, const char *name,
			  struct remote_seen *seen);
/* The change is taken in: its events, if any.  With S's mutex held. */
void lockfs_remote_after(struct lockfs_table *t, struct stripe *s, const char *name,
			 const struct remote_seen *seen);

#endif
