/*
 * The fd-lock API (lockfs_core_fd_* of include/lockfs/core.h): flock(2)
 * and whole-file fcntl locks on M/.flock/NAME, taken for an owner (an
 * open file or a process) and queued FIFO with mkdir's callers
 * (lock/queue.c); their grants are tracked by lock/fdlock.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/name.h"
#include "base/clock.h"
#include "engine.h"
#include "lock/audit.h"
#include "lock/caller.h"
#include "lock/deadlock.h"
#include "lock/fdlock.h"
#include "lock/metrics.h"
#include "lock/queue.h"
#include "lock/resume.h"
#include "lock/table.h"

/* How much of a waiter's command line is kept for its record. */
#define WAITER_CMDLINE_MAX 4096

/* A new queue entry for RQ from CALLER: its holder-to-be resolved, its
 * command line and slug read (all /proc reads a request needs).  0 or
 * -errno (-EACCES: holder unknown). */
static int make_entry(struct lockfs_table *t, const struct lockfs_caller *caller,
		      const struct lockfs_fd_request *rq, struct qentry **out)
{
	struct qentry *e = calloc(1, sizeof(*e));
	int rc;

	if (!e)
		return -ENOMEM;
	rc = lockfs_holder_resolve(t->procs, caller->tid, caller->uid, &t->helpers,
				   LOCKFS_PROC_NS, &e->who);
	if (rc < 0) {
		free(e);
		return rc == -ESRCH ? -EACCES : rc;
	}
	if (!e->who.have_ids) {
		e->who.uid = caller->uid;
		e->who.gid = caller->gid;
	}
	snprintf(e->owner, sizeof(e->owner), "%s", rq->owner);
	e->via_file = rq->via_file;
	e->ticket = caller->ticket;
	e->mode = rq->mode;
	e->uid = caller->uid;
	e->gid = caller->gid;
	e->since_ms = lockfs_wall_ms();
	/* Read now, not at the grant: a hand-off should do no /proc read. */
	if (lockfs_proc_source_cmdline(t->procs, e->who.pid, WAITER_CMDLINE_MAX, &e->cmdline) < 0)
		e->cmdline = NULL;
	{
		/* The caller's LOCKFS_SLUG names the holder (lockctl --slug);
		 * a bad one reads as none here rather than failing flock. */
		char slug[LOCKFS_SLUG_MAX];

		if (lockfs_caller_slug(t->procs, caller->tid, slug, sizeof(slug)) == 0 && *slug)
			e->slug = strdup(slug);
	}
	*out = e;
	return 0;
}

/* Enter E (RQ's, made by make_entry) in RQ->name's queue: E is the
 * queue's from here on. */
static int enter(struct lockfs_core *core, const struct lockfs_caller *caller, struct qentry *e,
		 const struct lockfs_fd_request *rq, struct lockfs_wait *w)
{
	struct lockfs_table *t = &core->table;
	struct lockfs_deadlock_waiter waiter;
	char who[WHO_MAX];
	int rc;

	if (caller->resent)
		lockfs_resume_note_resent(t);
	/* E is the queue's once entered: what the deadlock check needs of
	 * it is copied first. */
	lockfs_audit_who(who, sizeof(who), e->slug, e->who.comm, e->who.pid);
	waiter = (struct lockfs_deadlock_waiter){ .pid = e->who.pid,
		.start_time = e->who.start_time, .uid = e->uid, .who = who };
	rc = lockfs_queue_enter(t, e, rq, w);
	/* Contention: LOCK_NB or F_SETLK found it held (a wait counts when
	 * parked, lock/grant.c). */
	if (rc == -EWOULDBLOCK)
		lockfs_metrics_busy(t->metrics);
	/* Only a wait that is parked can close a cycle: an uncontended
	 * request never gets here.  A slot waiter's place in its name's line
	 * (".slotline:NAME", slots.c) is no wait for a holder: its head waits
	 * for any slot, which the graph does not see (docs/slots.md). */
	if (rc == -EINPROGRESS) {
		const char *base;

		lockfs_table_wake(t); /* a waiter: the tick polls its queue */
		if (!lockfs_slot_line_parse(rq->name, &base))
			rc = lockfs_deadlock_check(t, core->deadlock, rq->name, rq->owner, &waiter,
						   w);
	}
	return rc;
}

int lockfs_core_fd_lock(struct lockfs_core *core, const struct lockfs_caller *caller,
			const struct lockfs_fd_request *rq, struct lockfs_wait *w)
{
	struct qentry *e;
	int rc;

	rc = lockfs_name_check_stored(rq->name);
	if (rc < 0)
		return rc;
	if (strlen(rq->owner) >= LOCKFS_FD_OWNER_MAX)
		return -EINVAL;
	rc = make_entry(&core->table, caller, rq, &e);
	if (rc < 0)
		return rc;
	return enter(core, caller, e, rq, w);
}

/* A request's entry made once (slots.c: when a slot waiter parks) and
 * copied for each try, so that its grant reads nothing of /proc. */
struct lockfs_fd_asker {
	struct qentry e;
	struct lockfs_caller caller;
};

int lockfs_core_fd_asker_new(struct lockfs_core *core, const struct lockfs_caller *caller,
			     const struct lockfs_fd_request *rq, struct lockfs_fd_asker **out)
{
	struct lockfs_fd_asker *a;
	struct qentry *e;
	int rc;

	if (strlen(rq->owner) >= LOCKFS_FD_OWNER_MAX)
		return -EINVAL;
	rc = make_entry(&core->table, caller, rq, &e);
	if (rc < 0)
		return rc;
	a = calloc(1, sizeof(*a));
	if (!a) {
		lockfs_argv_free(e->cmdline);
		free(e->slug);
		lockfs_proc_put(&e->who);
		free(e);
		return -ENOMEM;
	}
	a->e = *e;
	a->caller = *caller;
	free(e);
	*out = a;
	return 0;
}

void lockfs_core_fd_asker_free(struct lockfs_fd_asker *a)
{
	if (!a)
		return;
	lockfs_argv_free(a->e.cmdline);
	free(a->e.slug);
	lockfs_proc_put(&a->e.who);
	free(a);
}

int lockfs_core_fd_lock_as(struct lockfs_core *core, const struct lockfs_fd_asker *a,
			   const struct lockfs_fd_request *rq, struct lockfs_wait *w)
{
	struct qentry *e;
	int rc = lockfs_name_check_stored(rq->name);

	if (rc < 0)
		return rc;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	*e = a->e;
	e->next = e->prev = NULL;
	e->who.has_pidfd = false; /* the template keeps its own */
	e->slug = a->e.slug ? strdup(a->e.slug) : NULL;
	e->cmdline = a->e.cmdline ? lockfs_argv_dup(a->e.cmdline) : NULL;
	snprintf(e->owner, sizeof(e->owner), "%s", rq->owner);
	e->via_file = rq->via_file;
	e->mode = rq->mode;
	return enter(core, &a->caller, e, rq, w);
}

int lockfs_core_fd_cancel(struct lockfs_core *core, const char *name, struct lockfs_wait *w)
{
	int rc = lockfs_queue_cancel(&core->table, name, w);

	if (rc == 0)
		lockfs_deadlock_cancelled(core->deadlock, w);
	return rc;
}

int lockfs_core_fd_let_go_locked(struct lockfs_table *t, struct stripe *s, const char *name,
				 struct held_lock *c, uint64_t identity, size_t i, const char *owner,
				 int64_t asked_ms)
{
	uint64_t fence = lockfs_record_fence_at(&c->rec, i);
	/* OWNER's place at the head of the store's line, never claimed (its
	 * waiter gave up just then): withdrawn, no end line, and a refused
	 * withdrawal is the engine's to retry, not the caller's error. */
	const bool granted = !lockfs_table_place_only(t, c);
	int rc = lockfs_queue_let_go_locked(t, s, c, &(struct lockfs_let_go){
		.identity = identity, .index = i, .event = granted ? "released" : NULL });

	if (rc < 0 && rc != -ENOENT)
		lockfs_fdlock_retry_add(t, s, name, owner, fence, rc, granted, asked_ms);
	return granted ? rc : 0;
}

int lockfs_core_fd_unlock(struct lockfs_core *core, const char *name, const char *owner)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	const int64_t asked_ms = lockfs_wall_ms(); /* before the store is tried */
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	long held;
	int rc;

	if (lockfs_name_check_stored(name) < 0)
		return 0;
	pthread_mutex_lock(&s->mu);
	/* The owner lets go: a place kept for it is no longer wanted. */
	lockfs_queue_forget_kept(s, name, owner);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	held = rc == 0 && c ? lockfs_fdlock_holder_of(s, name, &c->rec, owner, t->host) : -1;
	rc = 0;
	if (held >= 0) {
		if (!lockfs_table_issued_here(c)) {
			/* Rewritten behind our back: keep it, say so (whose it
			 * is, the record cannot be trusted to tell). */
			const char *kv[] = { "uid", "", "pid", "", "reason", "token-mismatch", NULL };

			lockfs_audit_event(t, "?", name, kv, "denied");
			rc = -EPERM;
		} else {
			rc = lockfs_core_fd_let_go_locked(t, s, name, c, st.identity, (size_t)held,
							  owner, asked_ms);
		}
	}
	lockfs_table_unlock(s);
	return rc;
}

void lockfs_core_fd_file_closed(struct lockfs_core *core, const char *name, uint64_t file)
{
	struct stripe *s = lockfs_table_stripe(&core->table, name);
	struct fdlock_via *taken;

	if (!file)
		return;
	pthread_mutex_lock(&s->mu);
	taken = lockfs_fdlock_take_file(s, name, file);
	lockfs_table_unlock(s);
	/* Each unlock takes the stripe mutex again: it may hand NAME on. */
	for (struct fdlock_via *v = taken; v; v = v->next)
		lockfs_core_fd_unlock(core, name, v->owner);
	lockfs_fdlock_free(taken);
}

int lockfs_core_fd_test(struct lockfs_core *core, const struct lockfs_fd_request *rq,
			struct lockfs_fd_conflict *out)
{
	struct lockfs_table *t = &core->table;
	const char *name = rq->name, *owner = rq->owner;
	bool shared = rq->mode == LOCKFS_SHARED;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	int rc;

	if (lockfs_name_check_stored(name) < 0)
		return -EINVAL;
	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc == -ENOENT) {
		rc = 0;
	} else if (rc == 0 && !c) {
		out->shared = false; /* a foreign lock: exclusive, holder unknown */
		out->pid = 0;
		rc = 1;
	} else if (rc == 0) {
		long mine = lockfs_fdlock_holder_of(s, name, &c->rec, owner, t->host);
		bool others = lockfs_record_holders(&c->rec) > (mine >= 0 ? 1u : 0u);
		struct lockq *q = lockfs_queue_find(s, name);

		/* POSIX: a process's own lock never conflicts with itself.  A
		 * shared request may join readers only with nobody queued
		 * ahead (as F_SETLK would find). */
		if (others && (!(shared && c->rec.mode == LOCKFS_SHARED) || (q && q->nactive))) {
			out->shared = c->rec.mode == LOCKFS_SHARED;
			out->pid = mine == 0 && c->rec.nshares ? c->rec.shares[0].holder.pid
							       : c->rec.holder.pid;
			rc = 1;
		}
	}
	lockfs_table_unlock(s);
	return rc;
}
