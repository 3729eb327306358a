/*
 * What happens to locks without a request: a holder dies, a lease runs
 * out, a share's holder dies, a release the store refused is tried again,
 * a foreign lock goes stale.  Runs on the liveness thread (and in
 * lockfs_core_open's startup scan, startup.c).  A break, asked for by an
 * administrator, runs in the write(2) request that asks for it
 * (lockfs_core_break, engine.c), on the same primitives.
 *
 * The rule throughout: release only on evidence, and say which.  A dead
 * process is evidence; elapsed time alone is not (an expired lease of a
 * live holder is logged and kept).  When the evidence cannot be had, the
 * lock stays.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"
#include "base/clock.h"
#include "audit.h"
#include "caller.h"
#include "changes.h"
#include "fdlock.h"
#include "queue.h"
#include "rebound.h"
#include "recovery.h"
#include "resume.h"
#include "session.h"
#include "store.h"
#include "table.h"

/* How much queued work the liveness thread does before it looks for
 * events again: at most this many todos ... */
#define SLICE_TODOS 64
/* ... and no more than this long by the boot clock (a slug check scans
 * /proc; a unit test that stops the clock gets the SLICE_TODOS bound). */
#define SLICE_MS 5
/* Stripes the tick walks in turn whether due or not, should a due time
 * ever be missed: every one once in 5 s at a 50 ms tick. */
#define STRIPES_PER_TURN (STRIPES / 100 + 1)

/* Locks of a dead holder marked and queued per turn of its uid. */
#define DEATH_CHUNK 32

/* What to do, queued for the liveness thread: about a lock (noted under
 * its stripe mutex, done after), or about a holder that died. */
struct todo {
	struct todo *next;
	enum { TODO_GONE, TODO_EXPIRED, TODO_SLUG, TODO_PERSIST, TODO_REBOUND,
	       TODO_DEATH } kind;
	uid_t uid;               /* the holder's: whose turn it is */
	char token[LOCKFS_TOKEN_HEX + 1];
	bool holder_exited;      /* kept for the holder's descendants */
	char *slug;              /* TODO_SLUG only */
	pid_t pid;               /* TODO_DEATH: the holder */
	unsigned long long start;
	char name[];             /* "" for TODO_DEATH */
};

/* The todos of one uid, oldest first. */
struct todo_user {
	struct todo_user *next;  /* in the ring */
	uid_t uid;
	struct todo *head, *tail;
};

/*
 * The liveness thread's work: what to do about each dead holder and each
 * lock, queued per uid and served one todo per uid in turn.  A dead
 * holder's locks are marked and queued DEATH_CHUNK at a time, each chunk
 * a turn of its own.  A user whose 50,000 locks die at once then delays
 * another user's recovery by a turn or two, not by 50,000 recoveries.
 * Owned by the liveness thread (and by lockfs_core_open before that
 * thread runs): no mutex.
 */
struct recovery_work {
	int turn;                /* collect(): the first stripe walked in turn */
	struct todo_user *cur;   /* served next; the users form a ring */
	struct todo_user *prev;  /* the one before CUR in the ring */
	struct todo_user *last;  /* the user the last todo went to (a hint) */
	size_t ntodo;
};

int lockfs_recovery_init(struct lockfs_table *t)
{
	t->work = calloc(1, sizeof(*t->work));
	return t->work ? 0 : -ENOMEM;
}

void lockfs_recovery_fini(struct lockfs_table *t)
{
	struct recovery_work *rw = t->work;

	if (!rw)
		return;
	if (rw->prev)
		rw->prev->next = NULL; /* the ring, opened into a list */
	while (rw->cur) {
		struct todo_user *u = rw->cur;

		rw->cur = u->next;
		while (u->head) {
			struct todo *todo = u->head;

			u->head = todo->next;
			free(todo->slug);
			free(todo);
		}
		free(u);
	}
	free(rw);
	t->work = NULL;
}

/* The queue of UID, made (at the end of the ring) if need be. */
static struct todo_user *todo_user_of(struct recovery_work *rw, uid_t uid)
{
	struct todo_user *u = rw->last;

	if (u && u->uid == uid && u->head)
		return u;
	u = rw->cur;
	do {
		if (u && u->uid == uid)
			return rw->last = u;
		u = u ? u->next : NULL;
	} while (u && u != rw->cur);
	u = calloc(1, sizeof(*u));
	if (!u)
		return NULL;
	u->uid = uid;
	if (!rw->cur) {
		u->next = u;
		rw->cur = rw->prev = u;
	} else {
		/* Just before CUR: served once everyone queued now had a turn. */
		u->next = rw->cur;
		rw->prev->next = u;
		rw->prev = u;
	}
	return rw->last = u;
}

/* Queue T at the end of UID's todos.  false (T not taken) when out of
 * memory. */
static bool todo_push(struct recovery_work *rw, uid_t uid, struct todo *todo)
{
	struct todo_user *u = todo_user_of(rw, uid);

	if (!u)
		return false;
	todo->uid = uid;
	todo->next = NULL;
	if (u->tail)
		u->tail->next = todo;
	else
		u->head = todo;
	u->tail = todo;
	rw->ntodo++;
	return true;
}

/* Queue KIND for C's lock.  Called with C's stripe mutex held.  Out of
 * memory, nothing is queued and the tick tries again. */
static void todo_add(struct lockfs_table *t, struct held_lock *c, int kind)
{
	size_t len = strlen(c->name);
	struct todo *todo = calloc(1, sizeof(*todo) + len + 1);

	if (!todo || (kind == TODO_SLUG && !(todo->slug = strdup(c->rec.slug ? c->rec.slug : "")))) {
		free(todo);
		return;
	}
	memcpy(todo->name, c->name, len + 1);
	memcpy(todo->token, c->rec.token, sizeof(todo->token));
	todo->kind = kind;
	todo->holder_exited = c->rec.holder_exited;
	if (!todo_push(t->work, c->rec.holder.uid, todo)) {
		free(todo->slug);
		free(todo);
		return;
	}
	c->queued = true;
}

/* The next todo, taking turns between uids (NULL: none). */
static struct todo *todo_next(struct recovery_work *rw)
{
	struct todo_user *u = rw->cur;
	struct todo *todo;

	if (!u)
		return NULL;
	todo = u->head;
	u->head = todo->next;
	if (!u->head)
		u->tail = NULL;
	rw->ntodo--;
	if (!u->head) {
		/* Its turn ends with its last todo: out of the ring. */
		if (u->next == u) {
			rw->cur = rw->prev = NULL;
		} else {
			rw->prev->next = u->next;
			rw->cur = u->next;
		}
		if (rw->last == u)
			rw->last = NULL;
		free(u);
	} else {
		rw->prev = u;
		rw->cur = u->next;
	}
	todo->next = NULL;
	return todo;
}

/* Does an rmdir of C's holder that the store refused wait in S's retries?
 * Then that rmdir ends the grant once the store answers (logged `released
 * retried=1`), whatever the holder does meanwhile: it is no recovery. */
static bool rmdir_pending(const struct stripe *s, const struct held_lock *c)
{
	for (const struct unlock_retry *r = s->retries; r; r = r->next)
		if (!r->owner[0] && r->fence == c->rec.fence && strcmp(r->name, c->name) == 0)
			return true;
	return false;
}

/*
 * Recover NAME if the store still shows the acquisition TOKEN names: log
 * `recovered` with EXTRA as evidence, remove it, tell the mount, and
 * signal the holder when SIGNAL and -o break_signal ask for it.
 */
static void recover(struct lockfs_table *t, const char *name, const char *token,
		    const char *const *extra, bool signal)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign, released = false;
	pid_t pid = 0;
	unsigned long long start = 0;

	pthread_mutex_lock(&s->mu);
	if (lockfs_table_reload(t, s, name, &st, &foreign, &c) == 0 && c &&
	    strcmp(c->rec.token, token) == 0 && !rmdir_pending(s, c)) {
		bool shared = c->rec.nshares > 0;

		pid = c->rec.holder.pid;
		start = c->rec.holder.start_time;
		/* A shared lock loses this holder only; the others keep it. */
		released = lockfs_queue_let_go_locked(t, s, c,
				&(struct lockfs_let_go){ .identity = st.identity, .event = "recovered",
							 .extra = extra }) == 0;
		if (shared)
			released = false;
	}
	if (!released && (c = lockfs_table_find(s, name)))
		lockfs_table_note_due(t, s, c); /* what is left is the tick's again */
	lockfs_table_unlock(s);
	if (!released)
		return;
	if (signal && t->break_signal && pid > 0)
		lockfs_liveness_signal(t->liveness, pid, start, t->break_signal);
}

int lockfs_recovery_descendants_refresh(struct lockfs_table *t, struct held_lock *c,
					uint64_t *version)
{
	struct lockfs_descendant *v;
	size_t n;
	int rc = lockfs_descendants_list(t->descendants, c->rec.holder.pid,
					 c->rec.holder.start_time, &v, &n, version);

	if (rc < 0)
		return rc;
	free(c->rec.descendants);
	c->rec.descendants = v;
	c->rec.ndescendants = n;
	return 0;
}

/* Write C's list of descendants to the store, if it changed since it was
 * last written.  With s->mu held; C may be replaced (store refused: read back). */
static void persist_descendants_locked(struct lockfs_table *t, struct stripe *s,
				       struct held_lock *c)
{
	struct lockfs_entry_stat st = { .identity = c->identity };
	uint64_t version = c->desc_version;

	if (lockfs_recovery_descendants_refresh(t, c, &version) < 0 || version == c->desc_version)
		return;
	c->next_persist_boot_ms = lockfs_boot_ms() + 1000;
	if (lockfs_table_persist(t, s, c, &st) == 0)
		c->desc_version = version;
}

/*
 * C's holder exited: if a process it started while holding the lock
 * lives on, keep the lock for them (holder_exited in the record, one
 * `holder-exited` line) and return true.  When that cannot be told, the
 * lock is kept too.  NAME is C's, in memory that outlives C: with s->mu
 * held, C may be replaced here (the store refused the record: C is read
 * back as the store has it, and the next tick decides again).
 */
static bool keep_for_descendants_locked(struct lockfs_table *t, struct stripe *s,
					struct held_lock *c, const char *name)
{
	struct lockfs_record *r = &c->rec;
	struct lockfs_entry_stat st = { .identity = c->identity };
	char who[WHO_MAX], fence[24], uid[16], pid[16], start[24], count[24];
	bool first = !r->holder_exited;
	uint64_t version = 0;
	int n;

	/* At daemon start nothing told of the forks made meanwhile: the
	 * record's list and a scan count too. */
	n = lockfs_descendants_holder_exited(t->descendants, &(struct lockfs_exited_holder){
		.pid = r->holder.pid, .start = r->holder.start_time, .sid = r->holder_session,
		.known = r->descendants, .nknown = r->ndescendants, .scan = t->starting,
		.take_ref = !c->desc_watched });
	if (n == 0)
		return false;
	if (n > 0)
		c->desc_watched = true; /* the module counted a watch for us */
	c->holder_gone = false;
	r->holder_exited = true;
	if (n > 0)
		(void)lockfs_recovery_descendants_refresh(t, c, &version);
	lockfs_audit_who(who, sizeof(who), NULL, r->holder.comm, r->holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, r->fence);
	lockfs_audit_ids(uid, pid, r->holder.uid, r->holder.pid);
	snprintf(start, sizeof(start), "%llu", r->holder.start_time);
	if (n > 0)
		snprintf(count, sizeof(count), "%d", n);
	else
		snprintf(count, sizeof(count), "unknown");
	c->next_persist_boot_ms = lockfs_boot_ms() + 1000;
	/* The line once the store shows it (as for a release: see
	 * lockfs_queue_let_go_locked).  A store that refuses the record leaves C read
	 * back as it was, its holder gone: the next tick decides (and says)
	 * it again, and until then the lock is kept, with nothing said but
	 * the backend's word on what is wrong with the store. */
	if (lockfs_table_persist(t, s, c, &st) < 0)
		return true;
	c->desc_version = version;
	if (first) {
		const char *kv[17] = { "fence", fence, "uid", uid, "pid", pid };
		size_t at = lockfs_audit_put_container(kv, 6, c->rec.holder.container);

		memcpy(kv + at, (const char *[]){ "holder", who, "start", start, "descendants",
						  count, "evidence",
						  t->starting ? "exited-while-down" : "exited", NULL },
		       9 * sizeof(*kv));
		lockfs_audit_event(t, who, name, kv, "holder-exited");
	}
	return true;
}

/* Recover a lock whose process-bound holder is gone, unless processes it
 * started live on. */
static void recover_gone(struct lockfs_table *t, const struct todo *todo)
{
	struct stripe *s = lockfs_table_stripe(t, todo->name);
	char holder[WHO_MAX], start[24];
	const char *evidence;
	struct held_lock *c;

	pthread_mutex_lock(&s->mu);
	c = lockfs_table_find(s, todo->name);
	if (!c || strcmp(c->rec.token, todo->token) != 0) {
		lockfs_table_unlock(s);
		return;
	}
	c->queued = false; /* T is being done */
	if (strcmp(c->rec.holder.boot_id, t->boot_id) != 0) {
		evidence = "boot-changed";
	} else if (lockfs_table_desc_keep(&c->rec) && keep_for_descendants_locked(t, s, c, todo->name)) {
		/* Kept (and, if the store took it, due: each tick counts the
		 * descendants, see collect()). */
		lockfs_table_unlock(s);
		return;
	} else if (c->rec.holder_exited) {
		/* The last of them is gone (or, at daemon start, went while
		 * no daemon ran). */
		evidence = t->starting ? "exited,descendants-exited-while-down"
					  : "exited,descendants-exited";
	} else {
		evidence = t->starting ? "exited-while-down" : "exited";
	}
	lockfs_audit_who(holder, sizeof(holder), NULL, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(start, sizeof(start), "%llu", c->rec.holder.start_time);
	lockfs_table_unlock(s);
	{
		const char *extra[] = { "holder", holder, "start", start, "evidence", evidence, NULL };

		recover(t, todo->name, todo->token, extra, false);
	}
}

/* Log `expired` for a lease that ran out while its holder lives on. */
static void log_expired(struct lockfs_table *t, const char *name, const char *token,
			const char *evidence, pid_t evidence_pid)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	char who[WHO_MAX], fence[24], ttl[16], uid[16], pid[16], epid[16];
	char container[LOCKFS_CONTAINER_MAX];
	struct held_lock *c;

	pthread_mutex_lock(&s->mu);
	c = lockfs_table_find(s, name);
	if (!c || strcmp(c->rec.token, token) != 0) {
		lockfs_table_unlock(s);
		return;
	}
	c->expired_logged = true;
	c->queued = false; /* its todo is being done */
	lockfs_table_note_due(t, s, c);
	lockfs_audit_who(who, sizeof(who), c->rec.slug, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, c->rec.fence);
	snprintf(ttl, sizeof(ttl), "%u", c->rec.lease.ttl_s);
	lockfs_audit_ids(uid, pid, c->rec.holder.uid, c->rec.holder.pid);
	snprintf(container, sizeof(container), "%s",
		 c->rec.holder.container ? c->rec.holder.container : "");
	snprintf(epid, sizeof(epid), "%d", (int)evidence_pid);
	lockfs_table_unlock(s);
	{
		/* pid= is the holder's, as on every line; a slug lock's
		 * evidence is another process: evidence_pid=. */
		const char *kv[15] = { "fence", fence, "uid", uid, "pid", pid };
		size_t n = lockfs_audit_put_container(kv, 6, container);

		memcpy(kv + n, (const char *[]){ "ttl_s", ttl, "evidence", evidence,
						 evidence_pid ? "evidence_pid" : NULL, epid,
						 NULL }, 7 * sizeof(*kv));
		lockfs_audit_event(t, who, name, kv, "expired");
	}
}

/* A slug lock's lease ran out: recover it only if no process of its uid
 * still carries the slug.  Unknown (no /proc) keeps it. */
static void check_slug(struct lockfs_table *t, const struct todo *todo, bool logged)
{
	pid_t pid = 0;
	int rc = lockfs_proc_source_env_exists(t->procs, todo->uid, "LOCKFS_SLUG", todo->slug, &pid);

	if (rc == 0) {
		const char *extra[] = { "slug", todo->slug,
					"evidence", "lease-expired,no-process-with-slug", NULL };

		recover(t, todo->name, todo->token, extra, true);
	} else if (rc == 1 && !logged) {
		log_expired(t, todo->name, todo->token, "process-with-slug", pid);
	}
}

/*
 * Queue what the tick finds: locks whose holder is gone (and not queued
 * yet: a recovery the store refused is tried again), locks kept for a dead
 * holder's descendants whose last one is gone or whose list changed,
 * fd locks rebound at startup whose old descriptor is to be looked for
 * again, leases that ran out.  A process-bound lock whose holder could not
 * be watched at all (no memory) is watched again here.  LEASES false:
 * holders only (startup).
 *
 * Only stripes that are due are walked (see stripe.due_boot_ms), and a
 * few others in turn (every stripe once in 5 s, should a due time have
 * been missed): a tick over 50,000 locks with nothing to do walks none of
 * them.  ALL: walk every stripe.
 */
static void collect(struct lockfs_table *t, bool leases, bool all)
{
	struct recovery_work *rw = t->work;
	int64_t now = lockfs_boot_ms();

	for (int i = 0; i < STRIPES; i++) {
		struct stripe *s = &t->stripes[i];
		bool in_turn = (unsigned)(i - rw->turn) % STRIPES < STRIPES_PER_TURN;

		pthread_mutex_lock(&s->mu);
		if (!all && !in_turn && now < s->due_boot_ms) {
			lockfs_table_unlock(s);
			continue;
		}
		for (struct held_lock *c = s->head; c; c = c->next) {
			const struct lockfs_lease *lease = &c->rec.lease;

			/* Another host's lock is never judged here (table.h). */
			if (c->queued || (c->rec.has_holder &&
					  lockfs_table_elsewhere(t, &c->rec.holder)))
				continue;
			if (!c->holder_gone && !c->watched && c->rec.has_holder &&
			    c->rec.bound == LOCKFS_BOUND_PROCESS && !c->rec.holder_exited)
				lockfs_table_watch(t, c, -1);
			if (!c->holder_gone && c->rec.holder_exited && lockfs_table_desc_keep(&c->rec)) {
				/* Kept for the holder's descendants: until the
				 * last one is gone (or nobody tracks them). */
				uint64_t version = c->desc_version;
				int n = lockfs_descendants_count(t->descendants,
								 c->rec.holder.pid,
								 c->rec.holder.start_time,
								 &version);

				if (n <= 0) {
					c->holder_gone = true;
				} else if (version != c->desc_version &&
					   now >= c->next_persist_boot_ms) {
					todo_add(t, c, TODO_PERSIST);
					continue; /* one todo at a time per lock */
				}
			}
			if (c->holder_gone) {
				todo_add(t, c, TODO_GONE);
			} else if (leases && c->rebound && now >= c->next_rebound_boot_ms) {
				/* Does anyone still hold its old descriptor?
				 * (rebound.c; /proc is read once a second.) */
				c->next_rebound_boot_ms = now + REBOUND_CHECK_MS;
				todo_add(t, c, TODO_REBOUND);
			} else if (leases && lease->ttl_s && now >= lease->deadline_boot_ms) {
				if (c->rec.bound == LOCKFS_BOUND_PROCESS && !c->expired_logged) {
					todo_add(t, c, TODO_EXPIRED);
				} else if (c->rec.bound == LOCKFS_BOUND_SLUG &&
					   now >= c->next_check_boot_ms) {
					/* /proc is scanned at most once a second per lock. */
					c->next_check_boot_ms = now + 1000;
					todo_add(t, c, TODO_SLUG);
				}
			}
		}
		lockfs_table_set_due(s);
		lockfs_table_unlock(s);
	}
	rw->turn = (rw->turn + STRIPES_PER_TURN) % STRIPES;
}

/* T is being done: its lock is no longer queued.  Returns whether the
 * lock's expiry was logged already. */
static bool unqueue(struct lockfs_table *t, const struct todo *todo)
{
	struct stripe *s = lockfs_table_stripe(t, todo->name);
	struct held_lock *c;
	bool logged = false;

	pthread_mutex_lock(&s->mu);
	c = lockfs_table_find(s, todo->name);
	if (c && strcmp(c->rec.token, todo->token) == 0) {
		c->queued = false;
		logged = c->expired_logged;
	}
	lockfs_table_unlock(s);
	return logged;
}

/* T is done.  A lock it left behind (a recovery the store refused, a
 * lease still to be watched) is the tick's again. */
static void settle(struct lockfs_table *t, const struct todo *todo)
{
	struct stripe *s = lockfs_table_stripe(t, todo->name);
	struct held_lock *c;

	pthread_mutex_lock(&s->mu);
	c = lockfs_table_find(s, todo->name);
	if (c && strcmp(c->rec.token, todo->token) == 0)
		lockfs_table_note_due(t, s, c);
	lockfs_table_unlock(s);
}

/* Write the changed list of descendants of T's lock, kept for them. */
static void persist_todo(struct lockfs_table *t, const struct todo *todo)
{
	struct stripe *s = lockfs_table_stripe(t, todo->name);
	struct held_lock *c;

	pthread_mutex_lock(&s->mu);
	c = lockfs_table_find(s, todo->name);
	if (c && strcmp(c->rec.token, todo->token) == 0) {
		c->queued = false; /* T is being done */
		if (c->rec.holder_exited)
			persist_descendants_locked(t, s, c);
	}
	lockfs_table_unlock(s);
}

/*
 * Mark up to MAX locks of dead holder (PID, START) gone, and queue them
 * (QUEUE) or leave them to the tick.  Found through the holder index,
 * which they leave: a death costs what its holder held, never a walk of
 * every lock.  Returns true when some may be left (MAX were taken, or
 * memory ran out: then try again).
 */
static bool mark_dead(struct lockfs_table *t, pid_t pid, unsigned long long start, size_t max,
		      bool queue)
{
	char **names;
	size_t n;
	int rc = lockfs_table_take_dead(t, pid, start, max, &names, &n);

	for (size_t i = 0; i < n; i++) {
		struct stripe *s = lockfs_table_stripe(t, names[i]);
		struct held_lock *c;

		pthread_mutex_lock(&s->mu);
		c = lockfs_table_find(s, names[i]);
		if (c && c->watched && c->rec.bound == LOCKFS_BOUND_PROCESS &&
		    c->rec.holder.pid == pid && c->rec.holder.start_time == start) {
			c->holder_gone = true;
			if (queue && !c->queued)
				todo_add(t, c, TODO_GONE);
			lockfs_table_note_due(t, s, c); /* not queued: the tick's */
		}
		lockfs_table_unlock(s);
		free(names[i]);
	}
	free(names);
	return rc < 0 || n == max;
}

/* Out of memory for a death's todo: mark all its locks now (the tick
 * queues them), for as long as memory lets the index be read. */
static void mark_all_dead(struct lockfs_table *t, pid_t pid, unsigned long long start)
{
	for (int chunks = 0; chunks < 1 << 20; chunks++)
		if (!mark_dead(t, pid, start, DEATH_CHUNK, false))
			break;
}

/* lockfs_exited_fn: queue the death in its uid's turn. */
void lockfs_recovery_holder_exited(void *arg, pid_t pid, unsigned long long start)
{
	struct lockfs_table *t = arg;
	struct todo *todo = calloc(1, sizeof(*todo) + 1);
	uid_t uid;

	if (!lockfs_table_holder_uid(t, pid, start, &uid)) {
		free(todo);
		return; /* it holds nothing (any more) */
	}
	if (todo) {
		todo->kind = TODO_DEATH;
		todo->pid = pid;
		todo->start = start;
	}
	if (!todo || !todo_push(t->work, uid, todo)) {
		free(todo);
		mark_all_dead(t, pid, start);
	}
}

/* Do T.  A death todo that found a full chunk goes back to the end of its
 * uid's queue, behind the recoveries it queued; every other todo is
 * freed. */
static void act(struct lockfs_table *t, struct todo *todo)
{
	if (todo->kind == TODO_DEATH) {
		bool more = mark_dead(t, todo->pid, todo->start, DEATH_CHUNK, true);

		/* More to find: back in line, behind the recoveries it queued. */
		if (more && todo_push(t->work, todo->uid, todo))
			return;
		if (more)
			mark_all_dead(t, todo->pid, todo->start); /* out of memory */
		free(todo);
		return;
	}
	switch (todo->kind) {
	case TODO_GONE:
		recover_gone(t, todo);
		break;
	case TODO_EXPIRED:
		log_expired(t, todo->name, todo->token,
			    todo->holder_exited ? "descendants-alive" : "holder-alive", 0);
		break;
	case TODO_PERSIST:
		persist_todo(t, todo);
		settle(t, todo);
		break;
	case TODO_SLUG:
		check_slug(t, todo, unqueue(t, todo));
		settle(t, todo);
		break;
	case TODO_REBOUND:
		(void)unqueue(t, todo);
		lockfs_rebound_check(t, todo->name, todo->token);
		settle(t, todo);
		break;
	case TODO_DEATH:
		break;
	}
	free(todo->slug);
	free(todo);
}

/*
 * lockfs_work_fn: a slice of the queued todos, one uid after another.
 * true while some are left.
 */
bool lockfs_recovery_work(void *arg)
{
	struct lockfs_table *t = arg;
	struct recovery_work *rw = t->work;
	int64_t until = lockfs_boot_ms() + SLICE_MS;
	struct todo *todo;

	/* What the store reported first: a waiter behind a lock that
	 * vanished is granted now. */
	bool more = lockfs_changes_drain(t);

	for (int n = 0; n < SLICE_TODOS && (todo = todo_next(rw)); n++) {
		act(t, todo);
		if (lockfs_boot_ms() >= until)
			break;
	}
	return more || rw->ntodo > 0;
}

int lockfs_recovery_stale_foreign(struct lockfs_table *t, const char *name)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	int rc = 0;

	pthread_mutex_lock(&s->mu);
	/* A lock in the cache carries a record lockfs wrote: never by age. */
	if (!lockfs_table_find(s, name) && lockfs_store_foreign_stale(t->be, name, &st) == 1) {
		int64_t now = lockfs_wall_ms();
		char age[24], stale[24], uid[16], pid[16];
		/* uid= owns the stored lock; no process is known (pid=-). */
		const char *kv[] = { "uid", uid, "pid", pid, "age_s", age, "stale_s", stale,
				     "evidence", "foreign-stale", NULL };

		lockfs_audit_ids(uid, pid, st.uid, 0);
		snprintf(age, sizeof(age), "%" PRId64, (now - st.mtime_ms) / 1000);
		snprintf(stale, sizeof(stale), "%u", t->be->stale_s);
		/* Logged once it happened, under the mutex (lockfs_queue_let_go_locked). */
		rc = lockfs_store_release(t->be, name, st.identity);
		if (rc == 0) {
			lockfs_audit_event(t, "?", name, kv, "recovered");
			rc = 1;
		} else if (rc == -ENOENT) {
			rc = 0; /* gone or replaced meanwhile: nothing of ours */
		}
	}
	lockfs_table_unlock(s);
	return rc;
}

/* -o stale, the periodic sweep: every foreign lock the store's policy
 * gives up (the seed's, or made by hand), also when nobody asks for it. */
static void recover_stale_foreign(struct lockfs_table *t)
{
	char **names;
	size_t n;

	if (lockfs_table_names(t, &names, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++)
		lockfs_recovery_stale_foreign(t, names[i]);
	lockfs_table_names_free(names, n);
}

static bool record_has_fence(const struct lockfs_record *rec, uint64_t fence)
{
	for (size_t i = 0; i < lockfs_record_holders(rec); i++)
		if (lockfs_record_fence_at(rec, i) == fence)
			return true;
	return false;
}

/* Try S's retries once each; a retry ends when its grant is gone. */
static void retry_tick_locked(struct lockfs_table *t, struct stripe *s)
{
	for (struct unlock_retry **pp = &s->retries, *r; (r = *pp);) {
		struct lockfs_entry_stat st;
		struct held_lock *c;
		bool foreign, done = true, gone = false;
		int rc = lockfs_table_load(t, s, r->name, &st, &foreign, &c);

		if (rc == 0 && c && lockfs_table_issued_here(c)) {
			/* A cached lock without R's grant (fence) in it: the
			 * name was granted anew meanwhile, so R's grant ended. */
			gone = true;
			for (size_t i = 0; i < lockfs_record_holders(&c->rec); i++) {
				const char *const retried[] = { "retried", "1", "asked", r->asked,
								NULL };
				bool rmdir_retry = !r->owner[0];

				if (lockfs_record_fence_at(&c->rec, i) == r->fence)
					gone = false;
				if (rmdir_retry ? lockfs_record_bound_at(&c->rec, i) == LOCKFS_BOUND_FD ||
						  lockfs_record_fence_at(&c->rec, i) != r->fence
						: !lockfs_fdlock_holder_is(&c->rec, i, r->owner, r->fence, t->host))
					continue;
				/* Nothing was logged at the first try; nothing
				 * at all for a grant the log refused. */
				rc = lockfs_queue_let_go_locked(t, s, c,
					&(struct lockfs_let_go){ .identity = st.identity, .index = i,
								 .event = r->logged ? "released"
										    : NULL,
								 .extra = retried });
				done = rc == 0 || rc == -ENOENT;
				/* -ENOENT: the store no longer has it (the
				 * refused delete was applied after all). */
				gone = rc == -ENOENT;
				break;
			}
		} else if (rc == 0) {
			/* Held under another acquisition (another host's, one
			 * the daemon cannot read): R's grant ended, unless the
			 * record still carries its fence. */
			gone = !c || !record_has_fence(&c->rec, r->fence);
		} else if (rc != -ENOENT) {
			done = false; /* the store cannot tell yet */
		} else {
			gone = true;
		}
		if (gone && r->logged && r->who[0]) {
			/* The refused rmdir, or unlock or close of an fd lock,
			 * was applied after all (the store resolved its unknown
			 * outcome): it is the release. */
			char fence[24], uid[16], pid[16];
			const char *kv[] = { "fence", fence, "uid", uid, "pid", pid,
					     "retried", "1", "asked", r->asked, NULL };

			snprintf(fence, sizeof(fence), "%" PRIu64, r->fence);
			lockfs_audit_ids(uid, pid, r->uid, r->pid);
			lockfs_audit_event(t, r->who, r->name, kv, "released");
		}
		if (!done) {
			pp = &r->next;
			continue;
		}
		lockfs_fdlock_retry_done(s, pp);
	}
}

void lockfs_recovery_retry_all(struct lockfs_table *t)
{
	for (int i = 0; i < STRIPES; i++) {
		struct stripe *s = &t->stripes[i];

		pthread_mutex_lock(&s->mu);
		if (s->retries)
			retry_tick_locked(t, s);
		lockfs_table_unlock(s);
	}
}

/* Is a process-bound share's holder gone?  (Shares are few: only shared
 * locks rebound at a restart have them.)  Unknown counts as alive. */
static bool share_gone(const struct lockfs_table *t, const struct lockfs_share *sh)
{
	unsigned long long start;
	int rc;

	if (sh->bound != LOCKFS_BOUND_PROCESS || lockfs_table_elsewhere(t, &sh->holder))
		return false;
	if (strcmp(sh->holder.boot_id, t->boot_id) != 0)
		return true;
	rc = lockfs_proc_source_start_time(t->procs, sh->holder.pid, &start);
	return rc == -ESRCH || rc == -ENOENT || (rc == 0 && start != sh->holder.start_time);
}

/* Share K of C's record is ended if its process-bound holder died,
 * logged `recovered` as recover_gone() logs a holder (docs/log.md).  true
 * when it had died: then C may have changed or gone. */
static bool end_if_share_gone(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			      size_t k)
{
	const struct lockfs_holder *h = &c->rec.shares[k].holder;
	char holder[WHO_MAX], start[24];
	const char *kv[] = { "holder", holder, "start", start, "evidence", "exited", NULL };
	struct lockfs_entry_stat st;
	struct held_lock *fresh;
	bool foreign;
	char *name;

	if (!share_gone(t, &c->rec.shares[k]))
		return false;
	lockfs_audit_who(holder, sizeof(holder), NULL, h->comm, h->pid);
	snprintf(start, sizeof(start), "%llu", h->start_time);
	if (strcmp(h->boot_id, t->boot_id) != 0)
		kv[5] = "boot-changed";
	/* Only what the store still holds. */
	name = strdup(c->name);
	if (name && lockfs_table_load(t, s, name, &st, &foreign, &fresh) == 0 && fresh &&
	    k < fresh->rec.nshares && lockfs_table_issued_here(fresh))
		lockfs_queue_let_go_locked(t, s, fresh, &(struct lockfs_let_go){
			.identity = st.identity, .index = k + 1, .event = "recovered", .extra = kv });
	free(name);
	return true;
}

/* Shares of S whose process-bound holder died are ended.  With s->mu held. */
static void dead_shares_locked(struct lockfs_table *t, struct stripe *s)
{
	/* Only where some share may be process-bound (only shared locks
	 * rebound at a restart have such shares): a tick must not walk
	 * every lock. */
	bool again = s->process_shares;

	s->process_shares = false;
	/* Ending a share rewrites (or, failing, drops) the cache entry and
	 * may grant others: after each one start over from the head, a
	 * bounded number of times.  C is not touched after it acted. */
	for (int tries = 0; again && tries < 64; tries++) {
		again = false;
		for (struct held_lock *c = s->head; c && !again; c = again ? NULL : c->next) {
			for (size_t k = 0; !again && k < c->rec.nshares; k++) {
				if (c->rec.shares[k].bound == LOCKFS_BOUND_PROCESS)
					s->process_shares = true; /* look again next tick */
				again = end_if_share_gone(t, s, c, k);
			}
		}
	}
	if (again)
		s->process_shares = true; /* not done: next tick */
}

/* How often the queues are tried without a reported change (ms).  A
 * lock that vanishes is reported by the store (changes.c), so this only
 * retries waiters the store could not answer (EIO, no memory). */
#define QUEUE_RETRY_MS 1000

/* Each stripe in turn: refused releases tried again, now and then the
 * queues (see QUEUE_RETRY_MS), dead shares ended.  Whether some stripe
 * needs the tick: a due time (lease, dead or unwatched holder...), retry,
 * queue, tombstone, process-bound share; any lock on a store whose foreign
 * locks go stale; a lock of this host on a store with sessions (checked
 * each tick).  A holder a pidfd watches needs none: a death is an event. */
static bool stripes_tick(struct lockfs_table *t)
{
	bool retry_queues = lockfs_wall_ms() >= t->next_queue_retry_ms, busy = false;
	bool stales = lockfs_store_stales_foreign(t->be), sessions = t->be->caps & LOCKFS_BE_SESSIONS;

	if (retry_queues)
		t->next_queue_retry_ms = lockfs_wall_ms() + QUEUE_RETRY_MS;
	for (int i = 0; i < STRIPES; i++) {
		struct stripe *s = &t->stripes[i];

		pthread_mutex_lock(&s->mu);
		if (s->retries)
			retry_tick_locked(t, s);
		if (retry_queues)
			lockfs_queue_poll_locked(t, s);
		dead_shares_locked(t, s);
		busy = busy || s->due_boot_ms != INT64_MAX || s->retries || s->queues ||
		       s->tombstones || s->process_shares || (stales && s->head) ||
		       (sessions && s->own);
		lockfs_table_unlock(s);
	}
	return busy;
}

bool lockfs_recovery_tick(void *arg)
{
	struct lockfs_table *t = arg;
	/* A store gone bad is noticed (and said) within a tick: two
	 * syscalls, whatever the number of locks.  A DIR that was removed or
	 * replaced fails every operation for good (EIO until a restart, see
	 * backend.h): then the locks are not walked for recoveries and
	 * checks that cannot happen -- each would be tried again every tick
	 * -- and they stay as they are (fail closed).  An idle tick sleeps:
	 * the dir backend's watch reports DIR's removal, which wakes it. */
	bool vanished = lockfs_store_check(t->be) < 0, busy;

	lockfs_log_tick(t->log);
	/* A session lost without a report reaching us (or tombstones whose
	 * holders exited) is seen within a tick. */
	lockfs_session_check(t);
	/* Take in the process events first: a descendant's exit frees its
	 * holder's lock in the collect() below. */
	lockfs_descendants_tick(t->descendants);
	if (!vanished)
		collect(t, true, false);
	busy = stripes_tick(t);
	lockfs_resume_tick(t);
	lockfs_quota_flush(t->quota, false, lockfs_audit_refused, t);
	if (!vanished && lockfs_store_stales_foreign(t->be) &&
	    lockfs_wall_ms() >= t->next_stale_scan_ms) {
		t->next_stale_scan_ms = lockfs_wall_ms() + 1000;
		recover_stale_foreign(t);
	}
	/* Anything left to tick for?  What appears later wakes the thread
	 * (lockfs_table_wake, the log's waker, changes and deaths). */
	return busy || vanished || t->work->ntodo || lockfs_table_resume_holding(t) ||
	       !lockfs_log_idle(t->log) || !lockfs_quota_idle(t->quota) ||
	       !lockfs_descendants_idle(t->descendants);
}

void lockfs_recovery_startup(struct lockfs_table *t)
{
	collect(t, false, true);
	while (lockfs_recovery_work(t))
		;
}
