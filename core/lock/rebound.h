/*
 * fd locks across a restart (rebound.c).  At startup, with s->mu held and
 * C fresh, lockfs_rebound_bind_locked binds C's fd holders to the
 * processes that still hold their old descriptors, ends those whose
 * descriptor is closed, and logs it; C may be gone afterwards.  A rebound
 * lock is due for the tick every REBOUND_CHECK_MS, which queues it in its
 * uid's turn; lockfs_rebound_check then ends the holders of NAME's
 * acquisition TOKEN whose old descriptor nobody holds any more (liveness
 * thread, no mutex held: it reads /proc).
 */
#ifndef LOCKFS_LOCK_REBOUND_H
#define LOCKFS_LOCK_REBOUND_H

#include "table.h"

#define REBOUND_CHECK_MS 1000
void lockfs_rebound_bind_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
				struct lockfs_entry_stat *st);
void lockfs_rebound_check(struct lockfs_table *t, const char *name, const char *token);

#endif
