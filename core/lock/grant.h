/*
 * A grant to a waiter of the queue (grant.c): what is the same whichever
 * way it is granted -- a free lock, a shared one joined, a hand-off, a
 * place in the store's line claimed.  With the name's stripe mutex held.
 */
#ifndef LOCKFS_LOCK_GRANT_H
#define LOCKFS_LOCK_GRANT_H

#include <stdint.h>

#include "queue.h"
#include "table.h"

/* The record of a new fd holder E of NAME (E's cmdline goes into it): bound
 * to E's owner and open file, with the number of E's request.  0 or -errno
 * (REC cleared). */
int lockfs_grant_fd_record(struct lockfs_table *t, const char *name, struct qentry *e,
			   struct lockfs_record *rec);
/* The `acquired` line of NAME's grant to H, now or not at all: 0, or the
 * -errno of the failed write (the caller takes the grant back).  E (NULL:
 * none) is the queue entry granted: if its request waited, the grant is
 * also the `granted` event (for watchers, not in the log) and the metrics'
 * wait time. */
int lockfs_grant_log(struct lockfs_table *t, const char *name, const struct lockfs_holder *h,
		     const char *slug, uint64_t fence, enum lockfs_mode mode,
		     const struct qentry *e);
/* E's request for NAME was parked: the `waiting` event (for watchers, not
 * in the log) and the metrics' contention count. */
void lockfs_grant_waiting(struct lockfs_table *t, const char *name, const struct qentry *e);
/*
 * Take back NAME's grant FENCE to OWNER, just stored (identity IDENTITY,
 * record REC) but refused by the log: the store lets it go, or, if it
 * cannot, the grant is cached and retried like a release the store
 * refused (struct unlock_retry) -- held by nobody meanwhile, never by the
 * owner, who is told it failed.  Clears REC.
 */
void lockfs_grant_undo_locked(struct lockfs_table *t, struct stripe *s, const char *name,
			      uint64_t identity, struct lockfs_record *rec, const char *owner,
			      uint64_t fence);

#endif
