/*
 * What happens to locks without a request: a holder dies, a lease runs
 * out, an administrator breaks a lock, the daemon starts on a store that
 * already holds locks.  Runs on the liveness thread (and in
 * lockfs_core_open), never inside a FUSE request.
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
#include <time.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"
#include "base/clock.h"
#include "table.h"

/* How much queued work the liveness thread does before it looks for
 * events again: at most this many todos ... */
#define SLICE_TODOS 64
/* ... and no more than this long (a slug check scans /proc). */
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

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int recovery_init(struct lockfs_core *core)
{
	core->work = calloc(1, sizeof(*core->work));
	return core->work ? 0 : -ENOMEM;
}

void recovery_fini(struct lockfs_core *core)
{
	struct recovery_work *rw = core->work;

	if (!rw)
		return;
	if (rw->prev)
		rw->prev->next = NULL; /* the ring, opened into a list */
	while (rw->cur) {
		struct todo_user *u = rw->cur;

		rw->cur = u->next;
		while (u->head) {
			struct todo *t = u->head;

			u->head = t->next;
			free(t->slug);
			free(t);
		}
		free(u);
	}
	free(rw);
	core->work = NULL;
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
static bool todo_push(struct recovery_work *rw, uid_t uid, struct todo *t)
{
	struct todo_user *u = todo_user_of(rw, uid);

	if (!u)
		return false;
	t->uid = uid;
	t->next = NULL;
	if (u->tail)
		u->tail->next = t;
	else
		u->head = t;
	u->tail = t;
	rw->ntodo++;
	return true;
}

/* Queue KIND for C's lock.  Called with C's stripe mutex held.  Out of
 * memory, nothing is queued and the tick tries again. */
static void todo_add(struct lockfs_core *core, struct cached *c, int kind)
{
	size_t len = strlen(c->name);
	struct todo *t = calloc(1, sizeof(*t) + len + 1);

	if (!t || (kind == TODO_SLUG && !(t->slug = strdup(c->rec.slug ? c->rec.slug : "")))) {
		free(t);
		return;
	}
	memcpy(t->name, c->name, len + 1);
	memcpy(t->token, c->rec.token, sizeof(t->token));
	t->kind = kind;
	t->holder_exited = c->rec.holder_exited;
	if (!todo_push(core->work, c->rec.holder.uid, t)) {
		free(t->slug);
		free(t);
		return;
	}
	c->queued = true;
}

/* The next todo, taking turns between uids (NULL: none). */
static struct todo *todo_next(struct recovery_work *rw)
{
	struct todo_user *u = rw->cur;
	struct todo *t;

	if (!u)
		return NULL;
	t = u->head;
	u->head = t->next;
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
	t->next = NULL;
	return t;
}

/*
 * Recover NAME if the store still shows the acquisition TOKEN names: log
 * `recovered` with EXTRA as evidence, remove it, tell the mount, and
 * signal the holder when SIGNAL and -o break_signal ask for it.
 */
static void recover(struct lockfs_core *core, const char *name, const char *token,
		    const char *const *extra, bool signal)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	bool foreign, released = false;
	pid_t pid = 0;
	unsigned long long start = 0;

	pthread_mutex_lock(&s->mu);
	if (load_locked(core, s, name, &st, &foreign, true, &c) == 0 && c &&
	    strcmp(c->rec.token, token) == 0) {
		bool shared = c->rec.nshares > 0;

		pid = c->rec.holder.pid;
		start = c->rec.holder.start_time;
		/* A shared lock loses this holder only; the others keep it. */
		released = drop_holder_locked(core, s, c, st.identity, 0, "recovered", extra) == 0;
		if (shared)
			released = false;
	}
	if (!released && (c = cache_find(s, name)))
		stripe_note_due(s, c); /* what is left is the tick's again */
	stripe_unlock(s);
	if (!released)
		return;
	if (signal && core->break_signal && pid > 0)
		lockfs_liveness_signal(core->liveness, pid, start, core->break_signal);
}

int descendants_refresh(struct lockfs_core *core, struct cached *c, uint64_t *version)
{
	struct lockfs_descendant *v;
	size_t n;
	int rc = lockfs_descendants_list(core->descendants, c->rec.holder.pid,
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
static void persist_descendants_locked(struct lockfs_core *core, struct stripe *s,
				       struct cached *c)
{
	struct lockfs_entry_stat st = { .identity = c->identity };
	uint64_t version = c->desc_version;

	if (descendants_refresh(core, c, &version) < 0 || version == c->desc_version)
		return;
	c->next_persist_boot_ms = lockfs_boot_ms() + 1000;
	if (persist_locked(core, s, c, &st) == 0)
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
static bool keep_for_descendants_locked(struct lockfs_core *core, struct stripe *s,
					struct cached *c, const char *name)
{
	struct lockfs_record *r = &c->rec;
	struct lockfs_entry_stat st = { .identity = c->identity };
	char who[WHO_MAX], fence[24], uid[16], pid[16], start[24], count[24];
	bool first = !r->holder_exited;
	uint64_t version = 0;
	int n;

	/* At daemon start nothing told of the forks made meanwhile: the
	 * record's list and a scan count too. */
	n = lockfs_descendants_holder_exited(core->descendants, r->holder.pid,
					     r->holder.start_time, r->holder_session,
					     r->descendants, r->ndescendants, core->starting,
					     !c->desc_watched);
	if (n == 0)
		return false;
	if (n > 0)
		c->desc_watched = true; /* the module counted a watch for us */
	c->holder_gone = false;
	r->holder_exited = true;
	if (n > 0)
		(void)descendants_refresh(core, c, &version);
	who_of(who, sizeof(who), NULL, r->holder.comm, r->holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, r->fence);
	ids_of(uid, pid, r->holder.uid, r->holder.pid);
	snprintf(start, sizeof(start), "%llu", r->holder.start_time);
	if (n > 0)
		snprintf(count, sizeof(count), "%d", n);
	else
		snprintf(count, sizeof(count), "unknown");
	c->next_persist_boot_ms = lockfs_boot_ms() + 1000;
	/* The line once the store shows it (as for a release: see
	 * release_locked).  A store that refuses the record leaves C read
	 * back as it was, its holder gone: the next tick decides (and says)
	 * it again, and until then the lock is kept, with nothing said but
	 * the backend's word on what is wrong with the store. */
	if (persist_locked(core, s, c, &st) < 0)
		return true;
	c->desc_version = version;
	if (first) {
		const char *kv[] = { "fence", fence, "uid", uid, "pid", pid, "holder", who,
				     "start", start, "descendants", count, "evidence",
				     core->starting ? "exited-while-down" : "exited", NULL };

		log_event(core, who, name, kv, "holder-exited");
	}
	return true;
}

/* Recover a lock whose process-bound holder is gone, unless processes it
 * started live on. */
static void recover_gone(struct lockfs_core *core, const struct todo *t)
{
	struct stripe *s = stripe_of(core, t->name);
	char holder[WHO_MAX], start[24];
	const char *evidence;
	struct cached *c;

	pthread_mutex_lock(&s->mu);
	c = cache_find(s, t->name);
	if (!c || strcmp(c->rec.token, t->token) != 0) {
		stripe_unlock(s);
		return;
	}
	c->queued = false; /* T is being done */
	if (strcmp(c->rec.holder.boot_id, core->boot_id) != 0) {
		evidence = "boot-changed";
	} else if (descendants_keep(&c->rec) && keep_for_descendants_locked(core, s, c, t->name)) {
		/* Kept (and, if the store took it, due: each tick counts the
		 * descendants, see collect()). */
		stripe_unlock(s);
		return;
	} else if (c->rec.holder_exited) {
		/* The last of them is gone (or, at daemon start, went while
		 * no daemon ran). */
		evidence = core->starting ? "exited,descendants-exited-while-down"
					  : "exited,descendants-exited";
	} else {
		evidence = core->starting ? "exited-while-down" : "exited";
	}
	who_of(holder, sizeof(holder), NULL, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(start, sizeof(start), "%llu", c->rec.holder.start_time);
	stripe_unlock(s);
	{
		const char *extra[] = { "holder", holder, "start", start, "evidence", evidence, NULL };

		recover(core, t->name, t->token, extra, false);
	}
}

/* Log `expired` for a lease that ran out while its holder lives on. */
static void log_expired(struct lockfs_core *core, const char *name, const char *token,
			const char *evidence, pid_t evidence_pid)
{
	struct stripe *s = stripe_of(core, name);
	char who[WHO_MAX], fence[24], ttl[16], uid[16], pid[16], epid[16];
	struct cached *c;

	pthread_mutex_lock(&s->mu);
	c = cache_find(s, name);
	if (!c || strcmp(c->rec.token, token) != 0) {
		stripe_unlock(s);
		return;
	}
	c->expired_logged = true;
	c->queued = false; /* its todo is being done */
	stripe_note_due(s, c);
	who_of(who, sizeof(who), c->rec.slug, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, c->rec.fence);
	snprintf(ttl, sizeof(ttl), "%u", c->rec.lease.ttl_s);
	ids_of(uid, pid, c->rec.holder.uid, c->rec.holder.pid);
	snprintf(epid, sizeof(epid), "%d", (int)evidence_pid);
	stripe_unlock(s);
	{
		/* pid= is the holder's, as on every line; a slug lock's
		 * evidence is another process: evidence_pid=. */
		const char *kv[] = { "fence", fence, "uid", uid, "pid", pid, "ttl_s", ttl,
				     "evidence", evidence, evidence_pid ? "evidence_pid" : NULL, epid,
				     NULL };

		log_event(core, who, name, kv, "expired");
	}
}

/* A slug lock's lease ran out: recover it only if no process of its uid
 * still carries the slug.  Unknown (no /proc) keeps it. */
static void check_slug(struct lockfs_core *core, const struct todo *t, bool logged)
{
	pid_t pid = 0;
	int rc = lockfs_procs_env_exists(core->procs, t->uid, "LOCKFS_SLUG", t->slug, &pid);

	if (rc == 0) {
		const char *extra[] = { "slug", t->slug,
					"evidence", "lease-expired,no-process-with-slug", NULL };

		recover(core, t->name, t->token, extra, true);
	} else if (rc == 1 && !logged) {
		log_expired(core, t->name, t->token, "process-with-slug", pid);
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
static void collect(struct lockfs_core *core, bool leases, bool all)
{
	struct recovery_work *rw = core->work;
	int64_t now = lockfs_boot_ms();

	for (int i = 0; i < STRIPES; i++) {
		struct stripe *s = &core->stripes[i];
		bool in_turn = (unsigned)(i - rw->turn) % STRIPES < STRIPES_PER_TURN;

		pthread_mutex_lock(&s->mu);
		if (!all && !in_turn && now < s->due_boot_ms) {
			stripe_unlock(s);
			continue;
		}
		for (struct cached *c = s->head; c; c = c->next) {
			const struct lockfs_lease *lease = &c->rec.lease;

			if (c->queued)
				continue;
			if (!c->holder_gone && !c->watched && c->rec.has_holder &&
			    c->rec.bound == LOCKFS_BOUND_PROCESS && !c->rec.holder_exited)
				cache_watch(core, c, -1);
			if (!c->holder_gone && c->rec.holder_exited && descendants_keep(&c->rec)) {
				/* Kept for the holder's descendants: until the
				 * last one is gone (or nobody tracks them). */
				uint64_t version = c->desc_version;
				int n = lockfs_descendants_count(core->descendants,
								 c->rec.holder.pid,
								 c->rec.holder.start_time,
								 &version);

				if (n <= 0) {
					c->holder_gone = true;
				} else if (version != c->desc_version &&
					   now >= c->next_persist_boot_ms) {
					todo_add(core, c, TODO_PERSIST);
					continue; /* one todo at a time per lock */
				}
			}
			if (c->holder_gone) {
				todo_add(core, c, TODO_GONE);
			} else if (leases && c->rebound && now >= c->next_rebound_boot_ms) {
				/* Does anyone still hold its old descriptor?
				 * (rebound.c; /proc is read once a second.) */
				c->next_rebound_boot_ms = now + REBOUND_CHECK_MS;
				todo_add(core, c, TODO_REBOUND);
			} else if (leases && lease->ttl_s && now >= lease->deadline_boot_ms) {
				if (c->rec.bound == LOCKFS_BOUND_PROCESS && !c->expired_logged) {
					todo_add(core, c, TODO_EXPIRED);
				} else if (c->rec.bound == LOCKFS_BOUND_SLUG &&
					   now >= c->next_check_boot_ms) {
					/* /proc is scanned at most once a second per lock. */
					c->next_check_boot_ms = now + 1000;
					todo_add(core, c, TODO_SLUG);
				}
			}
		}
		stripe_set_due(s);
		stripe_unlock(s);
	}
	rw->turn = (rw->turn + STRIPES_PER_TURN) % STRIPES;
}

/* T is being done: its lock is no longer queued.  Returns whether the
 * lock's expiry was logged already. */
static bool unqueue(struct lockfs_core *core, const struct todo *t)
{
	struct stripe *s = stripe_of(core, t->name);
	struct cached *c;
	bool logged = false;

	pthread_mutex_lock(&s->mu);
	c = cache_find(s, t->name);
	if (c && strcmp(c->rec.token, t->token) == 0) {
		c->queued = false;
		logged = c->expired_logged;
	}
	stripe_unlock(s);
	return logged;
}

/* T is done.  A lock it left behind (a recovery the store refused, a
 * lease still to be watched) is the tick's again. */
static void settle(struct lockfs_core *core, const struct todo *t)
{
	struct stripe *s = stripe_of(core, t->name);
	struct cached *c;

	pthread_mutex_lock(&s->mu);
	c = cache_find(s, t->name);
	if (c && strcmp(c->rec.token, t->token) == 0)
		stripe_note_due(s, c);
	stripe_unlock(s);
}

/* Write the changed list of descendants of T's lock, kept for them. */
static void persist_todo(struct lockfs_core *core, const struct todo *t)
{
	struct stripe *s = stripe_of(core, t->name);
	struct cached *c;

	pthread_mutex_lock(&s->mu);
	c = cache_find(s, t->name);
	if (c && strcmp(c->rec.token, t->token) == 0) {
		c->queued = false; /* T is being done */
		if (c->rec.holder_exited)
			persist_descendants_locked(core, s, c);
	}
	stripe_unlock(s);
}

/*
 * Mark up to MAX locks of dead holder (PID, START) gone, and queue them
 * (QUEUE) or leave them to the tick.  Found through the holder index,
 * which they leave: a death costs what its holder held, never a walk of
 * every lock.  Returns true when some may be left (MAX were taken, or
 * memory ran out: then try again).
 */
static bool mark_dead(struct lockfs_core *core, pid_t pid, unsigned long long start,
		      size_t max, bool queue)
{
	char **names;
	size_t n;
	int rc = holder_take(core, pid, start, max, &names, &n);

	for (size_t i = 0; i < n; i++) {
		struct stripe *s = stripe_of(core, names[i]);
		struct cached *c;

		pthread_mutex_lock(&s->mu);
		c = cache_find(s, names[i]);
		if (c && c->watched && c->rec.bound == LOCKFS_BOUND_PROCESS &&
		    c->rec.holder.pid == pid && c->rec.holder.start_time == start) {
			c->holder_gone = true;
			if (queue && !c->queued)
				todo_add(core, c, TODO_GONE);
			stripe_note_due(s, c); /* not queued: the tick's */
		}
		stripe_unlock(s);
		free(names[i]);
	}
	free(names);
	return rc < 0 || n == max;
}

/* Out of memory for a death's todo: mark all its locks now (the tick
 * queues them), for as long as memory lets the index be read. */
static void mark_all_dead(struct lockfs_core *core, pid_t pid, unsigned long long start)
{
	for (int chunks = 0; chunks < 1 << 20; chunks++)
		if (!mark_dead(core, pid, start, DEATH_CHUNK, false))
			break;
}

/* lockfs_exited_fn: queue the death in its uid's turn. */
void recovery_holder_exited(void *arg, pid_t pid, unsigned long long start)
{
	struct lockfs_core *core = arg;
	struct todo *t = calloc(1, sizeof(*t) + 1);
	uid_t uid;

	if (!holder_uid(core, pid, start, &uid)) {
		free(t);
		return; /* it holds nothing (any more) */
	}
	if (t) {
		t->kind = TODO_DEATH;
		t->pid = pid;
		t->start = start;
	}
	if (!t || !todo_push(core->work, uid, t)) {
		free(t);
		mark_all_dead(core, pid, start);
	}
}

/* Do T.  A death todo that found a full chunk goes back to the end of its
 * uid's queue, behind the recoveries it queued; every other todo is
 * freed. */
static void act(struct lockfs_core *core, struct todo *t)
{
	if (t->kind == TODO_DEATH) {
		bool more = mark_dead(core, t->pid, t->start, DEATH_CHUNK, true);

		/* More to find: back in line, behind the recoveries it queued. */
		if (more && todo_push(core->work, t->uid, t))
			return;
		if (more)
			mark_all_dead(core, t->pid, t->start); /* out of memory */
		free(t);
		return;
	}
	switch (t->kind) {
	case TODO_GONE:
		recover_gone(core, t);
		break;
	case TODO_EXPIRED:
		log_expired(core, t->name, t->token,
			    t->holder_exited ? "descendants-alive" : "holder-alive", 0);
		break;
	case TODO_PERSIST:
		persist_todo(core, t);
		settle(core, t);
		break;
	case TODO_SLUG:
		check_slug(core, t, unqueue(core, t));
		settle(core, t);
		break;
	case TODO_REBOUND:
		(void)unqueue(core, t);
		rebound_check(core, t->name, t->token);
		settle(core, t);
		break;
	case TODO_DEATH:
		break;
	}
	free(t->slug);
	free(t);
}

/*
 * lockfs_work_fn: a slice of the queued todos, one uid after another.
 * true while some are left.
 */
bool recovery_work(void *arg)
{
	struct lockfs_core *core = arg;
	struct recovery_work *rw = core->work;
	int64_t until = mono_ms() + SLICE_MS;
	struct todo *t;

	for (int n = 0; n < SLICE_TODOS && (t = todo_next(rw)); n++) {
		act(core, t);
		if (mono_ms() >= until)
			break;
	}
	return rw->ntodo > 0;
}

struct name_vec {
	char **v;
	size_t n, cap;
};

static int add_name(void *arg, const char *name)
{
	struct name_vec *nv = arg;

	if (lockfs_name_check(name) < 0)
		return 0;
	if (nv->n == nv->cap) {
		size_t cap = nv->cap ? nv->cap * 2 : 16;
		char **v = realloc(nv->v, cap * sizeof(*v));

		if (!v)
			return 1;
		nv->v = v;
		nv->cap = cap;
	}
	nv->v[nv->n] = strdup(name);
	if (nv->v[nv->n])
		nv->n++;
	return 0;
}

static void name_vec_free(struct name_vec *nv)
{
	for (size_t i = 0; i < nv->n; i++)
		free(nv->v[i]);
	free(nv->v);
}

/* -o stale: recover foreign locks (the seed's, or made by hand) whose
 * mtime is older than stale_s -- the seed tool's own rule, for users who
 * mix both tools.  Locks with a lockfs record are never judged by age. */
static void recover_stale_foreign(struct lockfs_core *core)
{
	struct name_vec nv = { 0 };
	int64_t now = lockfs_wall_ms();

	if (core->be->ops->list(core->be, add_name, &nv) < 0)
		goto out;
	for (size_t i = 0; i < nv.n; i++) {
		struct stripe *s = stripe_of(core, nv.v[i]);
		struct lockfs_entry_stat st;
		struct cached *c;
		bool foreign, released = false;
		char age[24], stale[24], uid[16], pid[16];

		pthread_mutex_lock(&s->mu);
		if (!cache_find(s, nv.v[i]) &&
		    load_locked(core, s, nv.v[i], &st, &foreign, true, &c) == 0 && foreign &&
		    now - st.mtime_ms >= (int64_t)core->stale_s * 1000) {
			/* uid= owns DIR/NAME.lock; no process is known (pid=-). */
			const char *kv[] = { "uid", uid, "pid", pid, "age_s", age, "stale_s", stale,
					     "evidence", "foreign-stale", NULL };

			ids_of(uid, pid, st.uid, 0);
			snprintf(age, sizeof(age), "%" PRId64, (now - st.mtime_ms) / 1000);
			snprintf(stale, sizeof(stale), "%u", core->stale_s);
			/* Logged once it happened, under the mutex (release_locked). */
			released = core->be->ops->release(core->be, nv.v[i], st.identity) == 0;
			if (released)
				log_event(core, "?", nv.v[i], kv, "recovered");
		}
		stripe_unlock(s);
	}
out:
	name_vec_free(&nv);
}

void recovery_tick(void *arg)
{
	struct lockfs_core *core = arg;
	/* A store gone bad is noticed (and said) within a tick: two
	 * syscalls, whatever the number of locks.  A DIR that was removed or
	 * replaced fails every operation for good (EIO until a restart, see
	 * backend.h): then the locks are not walked for recoveries and
	 * checks that cannot happen -- each would be tried again every tick
	 * -- and they stay as they are (fail closed). */
	bool vanished = core->be->ops->check && core->be->ops->check(core->be) < 0;

	lockfs_log_tick(core->log);
	/* Take in the process events first: a descendant's exit frees its
	 * holder's lock in the collect() below. */
	lockfs_descendants_tick(core->descendants);
	if (!vanished)
		collect(core, true, false);
	queue_tick(core);
	quota_flush(core->quota, false, log_refused, core);
	if (!vanished && core->stale_s && lockfs_wall_ms() >= core->next_stale_scan_ms) {
		core->next_stale_scan_ms = lockfs_wall_ms() + 1000;
		recover_stale_foreign(core);
	}
}

int recovery_startup_scan(struct lockfs_core *core)
{
	struct name_vec nv = { 0 };
	int rc;

	core->starting = true;
	rc = core->be->ops->list(core->be, add_name, &nv);
	for (size_t i = 0; rc == 0 && i < nv.n; i++) {
		struct stripe *s = stripe_of(core, nv.v[i]);
		struct lockfs_entry_stat st;
		struct cached *c;
		bool foreign;

		/* Reading each record caches it and watches its holder; a
		 * holder that died while no daemon watched is marked gone. */
		pthread_mutex_lock(&s->mu);
		if (load_locked(core, s, nv.v[i], &st, &foreign, true, &c) == 0 && c)
			rebind_fd_locked(core, s, c, &st);
		stripe_unlock(s);
	}
	name_vec_free(&nv);
	if (rc == 0) {
		/* Nothing is served yet: recover it all now, while the
		 * evidence is `exited-while-down`. */
		collect(core, false, true);
		while (recovery_work(core))
			;
	}
	core->starting = false;
	return rc;
}

int lockfs_core_break(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *caller, const char *reason, size_t len)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	char by[WHO_MAX], by_uid[16], by_pid[16], uid[16], none[16], *why;
	bool foreign;
	pid_t pid = 0;
	unsigned long long start = 0;
	int rc;

	if (len > 0 && reason[len - 1] == '\n')
		len--;
	if (len > LOCKFS_REASON_MAX)
		return -EFBIG;
	if (len == 0 || memchr(reason, '\0', len) || !lockfs_utf8_valid(reason, len))
		return -EINVAL;
	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	why = strndup(reason, len);
	if (!why)
		return -ENOMEM;
	/* The breaker, as the kernel tells it, beside the name it goes by. */
	ids_of(by_uid, by_pid, caller->uid, who_of_caller(core, caller->tid, by, sizeof(by)));

	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, true, &c);
	if (rc == 0 && c) {
		const char *extra[] = { "by", by, "by_uid", by_uid, "by_pid", by_pid,
					"reason", why, NULL };

		pid = c->rec.holder.pid;
		start = c->rec.holder.start_time;
		rc = release_locked(core, s, c, st.identity, "broken", extra);
	} else if (rc == 0) {
		/* A foreign lock: uid= owns DIR/NAME.lock, no process known. */
		const char *kv[] = { "uid", uid, "pid", none, "by", by, "by_uid", by_uid,
				     "by_pid", by_pid, "reason", why, NULL };

		ids_of(uid, none, st.uid, 0);
		/* Logged once it happened, under the mutex (release_locked). */
		rc = core->be->ops->release(core->be, name, st.identity);
		if (rc == 0)
			log_event(core, "?", name, kv, "broken");
	}
	stripe_unlock(s);
	free(why);
	if (rc < 0)
		return rc;
	if (core->break_signal && pid > 0)
		lockfs_liveness_signal(core->liveness, pid, start, core->break_signal);
	return 0;
}
