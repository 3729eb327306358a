/*
 * What the store reports changed (changes.c): the names whose stored lock
 * appeared, changed or vanished, as the backend's start() callback gives
 * them (lockfs/backend.h), taken in on the liveness thread.
 */
#ifndef LOCKFS_LOCK_CHANGES_H
#define LOCKFS_LOCK_CHANGES_H

#include <stdbool.h>

#include "table.h"

/* The set of reported names (T->changes).  0 or -ENOMEM. */
int lockfs_changes_init(struct lockfs_table *t);
void lockfs_changes_fini(struct lockfs_table *t);

/* lockfs_change_fn (ARG is the table): note WHAT (NAME) and wake the
 * liveness thread.  Takes only the set's own mutex, a leaf. */
void lockfs_changes_report(void *arg, enum lockfs_change what, const char *name);

/* On the liveness thread: take in a slice of the reported names -- each
 * one's cache entry is refreshed from the store and its queue tried, so
 * that a waiter behind a lock that vanished is granted now.  true while
 * some are left. */
bool lockfs_changes_drain(struct lockfs_table *t);

#endif
