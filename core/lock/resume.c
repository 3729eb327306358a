/*
 * Taking over a live FUSE connection (resume.h).
 *
 * What a resumed daemon may rely on: the kernel kept every open file of the
 * mount open and keeps sending their requests -- the LOCK_UN, the FLUSH and
 * the RELEASE of each, with the same handle (fi->fh) and lock owner as
 * before -- and it resends every request the predecessor had read but not
 * answered.  So, unlike after an ordinary restart (rebound.c), an fd lock
 * can still end the way it was meant to, by its open file letting go: it
 * stays bound to that file.  The store's record says which file an fcntl
 * grant came through (record.via_file), which the in-memory table of the
 * predecessor (fdlock.h) knew.
 *
 * The kernel resends from its per-connection hash of requests being
 * processed, bucket by bucket: a waiter that had waited longer may come
 * back after one that came later.  Each waiter's place is its request's
 * number (lockfs_caller.ticket, the order the kernel made them), and the
 * queue keeps that order (queue.c); the hold keeps every lock from being
 * handed to the head of a queue until every resent request is in -- the
 * kernel puts them all ahead of any new request, so the request loop knows
 * when (lockfs_core_resume_done); the tick ends the hold at the latest
 * LOCKFS_RESUME_QUIET_MS after the last resent request it saw, and never
 * before LOCKFS_RESUME_HOLD_MS after the takeover unless told.
 */
#include "lockfs/core.h"
#include "base/clock.h"
#include "fdlock.h"
#include "queue.h"
#include "resume.h"

void lockfs_resume_init(struct lockfs_table *t, bool resuming)
{
	t->resuming = resuming;
	if (!resuming)
		return;
	__atomic_store_n(&t->resume_hold_until_ms, lockfs_boot_ms() + LOCKFS_RESUME_HOLD_MS,
			 __ATOMIC_RELAXED);
	__atomic_store_n(&t->resume_hold, 1, __ATOMIC_RELEASE);
}

void lockfs_resume_keep_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c)
{
	const struct lockfs_record *r = &c->rec;

	(void)t;
	for (size_t i = 0; i < lockfs_record_holders(r); i++) {
		uint64_t via = lockfs_record_via_file_at(r, i);

		if (lockfs_record_bound_at(r, i) == LOCKFS_BOUND_FD && via)
			lockfs_fdlock_granted_via(s, c->name, lockfs_record_fd_owner_at(r, i), via);
	}
	/* A share bound to a process at an earlier, ordinary restart is
	 * polled by the tick as it was then (recovery.c). */
	for (size_t i = 1; i < lockfs_record_holders(r); i++)
		if (lockfs_record_bound_at(r, i) == LOCKFS_BOUND_PROCESS)
			s->process_shares = true;
}

void lockfs_resume_note_resent(struct lockfs_table *t)
{
	int64_t until = lockfs_boot_ms() + LOCKFS_RESUME_QUIET_MS;
	int64_t now_until = __atomic_load_n(&t->resume_hold_until_ms, __ATOMIC_RELAXED);

	if (!lockfs_table_resume_holding(t))
		return;
	/* Only ever later: a lost race leaves the later of the two. */
	while (now_until < until &&
	       !__atomic_compare_exchange_n(&t->resume_hold_until_ms, &now_until, until, false,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

void lockfs_resume_end(struct lockfs_table *t)
{
	/* Exactly one caller serves the queues. */
	if (!__atomic_exchange_n(&t->resume_hold, 0, __ATOMIC_ACQ_REL))
		return;
	for (int k = 0; k < STRIPES; k++) {
		struct stripe *s = &t->stripes[k];

		pthread_mutex_lock(&s->mu);
		if (s->queues)
			lockfs_queue_poll_locked(t, s);
		lockfs_table_unlock(s);
	}
}

void lockfs_resume_tick(struct lockfs_table *t)
{
	if (lockfs_table_resume_holding(t) &&
	    lockfs_boot_ms() >= __atomic_load_n(&t->resume_hold_until_ms, __ATOMIC_RELAXED))
		lockfs_resume_end(t);
}
