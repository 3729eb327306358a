/*
 * What happens to locks without a request (recovery.c): a holder dies, a
 * lease runs out, a dead share, a release the store refused.  Runs on the
 * liveness thread, whose callbacks engine.c wires to the functions below
 * (ARG is the table), and in lockfs_core_open before that thread runs.
 */
#ifndef LOCKFS_LOCK_RECOVERY_H
#define LOCKFS_LOCK_RECOVERY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "table.h"

/* The liveness thread's work list.  0 or -ENOMEM. */
int lockfs_recovery_init(struct lockfs_table *t);
void lockfs_recovery_fini(struct lockfs_table *t);
/* lockfs_exited_fn: queue the death of holder (PID, START) in its uid's turn. */
void lockfs_recovery_holder_exited(void *arg, pid_t pid, unsigned long long start);
/* lockfs_tick_fn: queue what is due, retry refused releases, retry the
 * queues once a second, end dead shares, flush refusal bursts, recover stale foreign
 * locks.  true while anything is left to tick for (see tick_needed() in
 * recovery.c); false lets the thread sleep until lockfs_table_wake(). */
bool lockfs_recovery_tick(void *arg);
/* lockfs_work_fn: the changes the store reported (changes.c), then a
 * slice of the queued todos, one uid after another.  true while some are
 * left. */
bool lockfs_recovery_work(void *arg);
/* At startup, nothing served yet: queue every lock's due work and do it
 * all now (the evidence is `exited-while-down`). */
void lockfs_recovery_startup(struct lockfs_table *t);
/* -o stale: recover NAME if the store's policy gives its foreign lock up
 * (logged `recovered evidence=foreign-stale`); takes NAME's stripe mutex.
 * 1: recovered (NAME is free now, unless someone took it since); 0: not;
 * -errno: the store refused the removal. */
int lockfs_recovery_stale_foreign(struct lockfs_table *t, const char *name);
/* Try the pending release retries of every stripe once (takes the mutexes). */
void lockfs_recovery_retry_all(struct lockfs_table *t);
/* Replace C's list of descendants by the live ones (in memory; the tick
 * writes a changed list to the store), and set *VERSION (may be NULL) to
 * the list's version.  With the stripe mutex held.  0 or -errno. */
int lockfs_recovery_descendants_refresh(struct lockfs_table *t, struct held_lock *c,
					uint64_t *version);

#endif
