/*
 * fd locks across a daemon restart.
 *
 * An fd lock belongs to an open file description of the mount: it ends
 * when that description lets go (LOCK_UN, the last close).  After a
 * restart nothing can come through the old mount's descriptors any more --
 * their close gets ENOTCONN and never reaches the new daemon -- so the
 * lock can no longer end by a request.  What the new daemon can see is
 * processes, and, in /proc, which of them still hold a descriptor of the
 * lock's file on the old mount (descriptors.c).
 *
 * So a lock found bound to a descriptor at startup is bound to the process
 * that holds that descriptor now: its recorded holder if it does, else the
 * first of the holder's descendants that does (for `flock FILE CMD` the
 * holder is the shell that ran flock(1), and the descriptor is
 * flock(1)'s).  It is watched like any process-bound lock, so it ends
 * when that process exits; and about once a second (REBOUND_CHECK_MS: the
 * tick queues the lock in its uid's turn when it is due, like any other
 * work of the liveness thread) the daemon looks whether that process or a
 * descendant still holds such a descriptor, and ends it when none does
 * (the close it could not hear).  A lock whose descriptor was closed
 * while no daemon ran ends at startup.  Either way the same process
 * asking again through the new mount is a new request like any other,
 * never a waiter behind itself.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc/descriptors.h"
#include "audit.h"
#include "caller.h"
#include "queue.h"
#include "rebound.h"
#include "table.h"

/*
 * Which process holds holder H's old descriptor of NAME: H itself or one
 * of its descendants.  1 and *PID and *START, 0 when none does, -ESRCH
 * when H is gone, or -errno when it cannot be known: never 0 on a guess.
 *
 * Only H's tree is looked at, not every process: a descriptor whose path
 * ends in "/.flock/NAME" on a dead mount may as well belong to another
 * lockfs instance (another DIR, the same lock name), and taking it for
 * ours would keep this lock forever.  A descriptor handed outside the
 * tree (SCM_RIGHTS, a double fork whose parent then exits) is therefore
 * not seen (docs/waiting.md).
 */
static int who_holds(const struct lockfs_holder *h, const char *name, dev_t live_dev, pid_t *pid,
		     unsigned long long *start)
{
	return lockfs_proc_tree_holds_old_flock(h->pid, h->start_time, name, live_dev, pid,
						start);
}

/* Make H the process (PID, START), its facts read now (its session into
 * *SID).  0 or -errno (H unchanged). */
static int holder_move(struct lockfs_table *t, struct lockfs_holder *h, pid_t pid,
		       unsigned long long start, pid_t *sid)
{
	struct lockfs_holder moved;
	struct lockfs_proc p;
	int rc = t->procs->read_tid(t->procs->ctx, pid, LOCKFS_PROC_IDS, &p);

	if (rc < 0)
		return rc;
	if (p.start_time != start)
		return -ESRCH;
	/* Where it runs (ns_pid, container), as for any holder; unknown
	 * (0, "") when that cannot be read. */
	if (!t->procs->read_ns || t->procs->read_ns(t->procs->ctx, pid, &p) < 0) {
		p.ns_pid = 0;
		p.container[0] = '\0';
	}
	*sid = p.sid;
	memset(&moved, 0, sizeof(moved));
	rc = lockfs_caller_fill_holder(t, &moved, &p, NULL);
	if (rc < 0)
		return rc;
	lockfs_holder_clear(h);
	*h = moved;
	return 0;
}

/* End holder I of C, whose old descriptor nobody holds any more: logged
 * `recovered` with EVIDENCE, like a holder that exited.  With s->mu held
 * and C fresh; C may be gone afterwards.  0 or -errno. */
static int end_closed(struct lockfs_table *t, struct stripe *s, struct held_lock *c, size_t i,
		      const char *evidence)
{
	const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);
	char holder[WHO_MAX], start[24];
	const char *extra[] = { "holder", holder, "start", start, "evidence", evidence, NULL };

	lockfs_audit_who(holder, sizeof(holder), NULL, h->comm, h->pid);
	snprintf(start, sizeof(start), "%llu", h->start_time);
	return lockfs_queue_let_go_locked(t, s, c,
					  &(struct lockfs_let_go){ .identity = c->identity, .index = i,
								   .event = "recovered",
								   .extra = extra });
}

void lockfs_rebound_bind_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
				struct lockfs_entry_stat *st)
{
	struct lockfs_record *r = &c->rec;
	size_t n = lockfs_record_holders(r);
	bool any = false, *closed = calloc(n ? n : 1, sizeof(bool));
	char who[WHO_MAX], fence[24], uid[16], pid[16], holders[16];

	if (!closed)
		return; /* stays an fd lock until the next start: kept (fail closed) */
	/* A holder may move to another process, of another uid: its lock
	 * counts against the uid it ends with (quota.h). */
	lockfs_table_account(t, c, -1);
	for (size_t i = 0; i < n; i++) {
		struct lockfs_holder *h = lockfs_record_holder(r, i);
		unsigned long long start;
		pid_t p;

		/* Another host's descriptor is not in this host's /proc. */
		if (lockfs_record_bound_at(r, i) != LOCKFS_BOUND_FD || lockfs_table_elsewhere(t, h))
			continue;
		any = true;
		lockfs_record_set_bound_at(r, i, LOCKFS_BOUND_PROCESS);
		/* A holder of another boot is recovered as such; one whose
		 * descriptor cannot be looked at stays the recorded holder's
		 * (and ends when that process exits). */
		if (strcmp(h->boot_id, t->boot_id) != 0)
			continue;
		switch (who_holds(h, c->name, 0, &p, &start)) {
		case 1: {
			pid_t sid;

			if ((p != h->pid || start != h->start_time) &&
			    holder_move(t, h, p, start, &sid) == 0 && i == 0)
				r->holder_session = sid;
			break;
		}
		case 0:
			closed[i] = true;
			break;
		}
	}
	lockfs_table_account(t, c, 1);
	r->fd_owner[0] = '\0';
	r->via_file = 0;
	for (size_t i = 0; i < r->nshares; i++) {
		r->shares[i].fd_owner[0] = '\0';
		r->shares[i].via_file = 0;
	}
	if (!any) {
		free(closed);
		return;
	}
	c->rebound = true;
	c->next_rebound_boot_ms = 0; /* looked at by the first tick */
	c->identity = st->identity;
	/* Closed while no daemon ran: ended now (each holder logged, the
	 * last one releases).  Each drop writes the record, conversions
	 * included. */
	for (size_t i = n; i-- > 0;) {
		bool last = lockfs_record_holders(&c->rec) <= 1;

		if (!closed[i])
			continue;
		if (end_closed(t, s, c, i, "closed-while-down") < 0 || last) {
			free(closed);
			return; /* gone, or the store refused (C read back as it was) */
		}
	}
	free(closed);
	r = &c->rec;
	lockfs_audit_who(who, sizeof(who), NULL, r->holder.comm, r->holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, r->fence);
	lockfs_audit_ids(uid, pid, r->holder.uid, r->holder.pid);
	snprintf(holders, sizeof(holders), "%zu", lockfs_record_holders(r));
	if (r->nshares)
		s->process_shares = true; /* the tick watches them (recovery.c) */
	st->identity = c->identity;
	if (lockfs_table_persist(t, s, c, st) < 0)
		return; /* read back as it was; the lock stays */
	{
		const char *kv[] = { "fence", fence, "uid", uid, "pid", pid, "holders", holders,
				     "bound", "process", "evidence", "daemon-restart", NULL };

		lockfs_audit_event(t, who, c->name, kv, "rebound");
	}
	lockfs_table_watch(t, c, -1);
}

/* A rebound holder of the lock being looked at, noted under its stripe
 * mutex. */
struct look {
	pid_t pid;
	unsigned long long start;
	int held;               /* 1: someone holds the old descriptor (or not
				   known), 0: nobody */
};

/* End NAME's rebound holder L if the lock is still the acquisition TOKEN
 * names and that holder is still in it. */
static void end_if_still(struct lockfs_table *t, const char *name, const char *token,
			 const struct look *l)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;

	pthread_mutex_lock(&s->mu);
	if (lockfs_table_reload(t, s, name, &st, &foreign, &c) == 0 && c && c->rebound &&
	    strcmp(c->rec.token, token) == 0 && lockfs_table_issued_here(c)) {
		for (size_t i = 0; i < lockfs_record_holders(&c->rec); i++) {
			const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);

			if (lockfs_record_bound_at(&c->rec, i) != LOCKFS_BOUND_PROCESS || h->pid != l->pid ||
			    h->start_time != l->start)
				continue;
			c->identity = st.identity;
			end_closed(t, s, c, i, "closed");
			break;
		}
	}
	lockfs_table_unlock(s);
}

void lockfs_rebound_check(struct lockfs_table *t, const char *name, const char *token)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	struct look *v = NULL;
	size_t n = 0;
	struct held_lock *c;

	pthread_mutex_lock(&s->mu);
	c = lockfs_table_find(s, name);
	if (c && c->rebound && strcmp(c->rec.token, token) == 0 &&
	    (v = calloc(lockfs_record_holders(&c->rec), sizeof(*v)))) {
		for (size_t i = 0; i < lockfs_record_holders(&c->rec); i++) {
			const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);

			if (lockfs_record_bound_at(&c->rec, i) != LOCKFS_BOUND_PROCESS ||
			    lockfs_table_elsewhere(t, h) || strcmp(h->boot_id, t->boot_id) != 0)
				continue;
			v[n].pid = h->pid;
			v[n].start = h->start_time;
			n++;
		}
	}
	lockfs_table_unlock(s);
	/* /proc is read with no mutex held, once per process (the shares of
	 * one process, e.g. readers that each opened the file). */
	for (size_t i = 0; i < n; i++) {
		unsigned long long start;
		pid_t p;

		v[i].held = -1;
		for (size_t j = 0; j < i && v[i].held < 0; j++)
			if (v[j].pid == v[i].pid && v[j].start == v[i].start)
				v[i].held = v[j].held;
		if (v[i].held < 0) {
			struct lockfs_holder h = { .pid = v[i].pid, .start_time = v[i].start };

			v[i].held = who_holds(&h, name, t->mount_dev, &p, &start) != 0;
		}
		/* Held, or not known (an exit is the pidfd's to see): kept.
		 * Nobody holds the old descriptor any more: ended. */
		if (!v[i].held)
			end_if_still(t, name, token, &v[i]);
	}
	free(v);
}
