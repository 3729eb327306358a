/*
 * Slots: counting semaphores (docs/slots.md).  Slot K of a slotted NAME
 * with N slots is the lock ".slotKofN:NAME" (base/name_slot.c), an
 * ordinary lock to every other file of the engine: its own record,
 * holder, fence, lease, recovery and log lines.  This file takes and
 * lets go of a name's slots: taking a free one (mkdir M/.slots/NAME=N),
 * letting the caller's go (rmdir M/.slots/NAME), and the one FIFO line per
 * slotted name of the flock waiters (M/.flock/.slots/NAME=N), granted
 * whenever any slot frees.  What the mount shows of them (`owner`,
 * `waiters`, `ls`) is slots_view.c's.
 *
 * On a store of several daemons (etcd) the line is one across hosts:
 * each waiter also asks for the lock ".slotline:NAME" (an fd lock of its
 * owner, so it stands in that lock's FIFO line in the store's order), and
 * only the waiter that holds it takes a slot, then lets it go to the next
 * in line, on whatever host.  A newcomer goes first only when that line
 * is empty, as with locks.
 *
 * It calls the other files of this floor only through their public
 * lockfs_core_* entry points (which accept stored slot names), and none
 * of them calls it: the arrows stay one-way.  Every slot is taken under
 * SLOTS->mu, so the capacity check and the take are one step for this
 * daemon: exact with dir (one daemon per DIR); with etcd other hosts'
 * takers are not under it (docs/etcd.md, "Slots across hosts").
 * Lock order: SLOTS->mu, then an engine stripe mutex, then the mount's
 * parked_mu (a waiter's DONE).
 */
#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lockfs/backend.h"
#include "lockfs/name.h"
#include "engine.h"
#include "lock/audit.h"
#include "lock/caller.h"
#include "lock/table.h"
#include "slots.h"
#include "slots_state.h"

/* How often the waker looks for slots freed without a request through
 * this file (a holder's death, a lease, a break): the bound on how long
 * a waiter can stay parked behind a free slot. */
#define SLOTS_POLL_MS 20


int lockfs_core_slots_new(struct lockfs_core *core)
{
	struct lockfs_slots *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	core->slots = s;
	return 0;
}

void lockfs_core_slots_changed(struct lockfs_table *t, const char *name)
{
	/* The table is the core's first member (engine.h). */
	struct lockfs_slots *s = ((struct lockfs_core *)t)->slots;
	const char *base;
	unsigned k, cap;

	if (!s || !lockfs_slot_name_parse(name, &base, &k, &cap))
		return;
	__atomic_store_n(&s->kicked, true, __ATOMIC_RELEASE);
	pthread_cond_signal(&s->cv);
}

void lockfs_core_slots_stop(struct lockfs_core *core)
{
	struct lockfs_slots *s = core->slots;
	bool join;

	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	join = s->waker_on;
	s->waker_on = false;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (join)
		pthread_join(s->waker, NULL);
}

void lockfs_core_slots_free(struct lockfs_core *core)
{
	struct lockfs_slots *s = core->slots;

	if (!s)
		return;
	lockfs_core_slots_stop(core);
	while (s->waiters) {
		struct slot_waiter *x = s->waiters;

		s->waiters = x->next;
		lockfs_core_fd_asker_free(x->asker);
		free(x);
	}
	while (s->grants) {
		struct slot_grant *g = s->grants;

		s->grants = g->next;
		free(g);
	}
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
	core->slots = NULL;
}

bool lockfs_slots_served(struct lockfs_core *core)
{
	return core->slots && (core->table.be->caps & LOCKFS_BE_SLOTS);
}

/* Do the waiters stand in one line across daemons (".slotline:NAME")?  A
 * store of several daemons (etcd); with dir this daemon's list is all. */
bool lockfs_slots_across_hosts(struct lockfs_core *core)
{
	return (core->table.be->caps & LOCKFS_BE_SESSIONS) != 0;
}

/* NAME as a caller gives it ("NAME" or "NAME=N") into BASE; *CAP 0 when
 * no N was given.  0, -EINVAL, -ENAMETOOLONG. */
int lockfs_slots_base_of(const char *name, char base[LOCKFS_NAME_MAX + 1], unsigned *cap)
{
	int rc = lockfs_slot_request_parse(name, base, LOCKFS_NAME_MAX + 1, cap);

	if (rc == 0)
		return 0;
	*cap = 0;
	rc = lockfs_slot_base_check(name);
	if (rc < 0)
		return rc;
	snprintf(base, LOCKFS_NAME_MAX + 1, "%s", name);
	return 0;
}


int lockfs_slots_held(struct lockfs_core *core, const char *base, struct held_slots *h)
{
	char **names;
	size_t count;
	/* Read now: a listing kept a while (etcd's, for `ls`) could show a
	 * slot another host took as free, or one it let go as held. */
	int rc = lockfs_table_names_fresh(&core->table, ".slot", &names, &count);

	memset(h, 0, sizeof(*h));
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < count; i++) {
		const char *b;
		unsigned k, cap;

		if (!lockfs_slot_name_parse(names[i], &b, &k, &cap) || strcmp(b, base) != 0)
			continue;
		if (h->cap && h->cap != cap)
			rc = -ERANGE;
		h->cap = cap > h->cap ? cap : h->cap;
		h->held[k] = 1;
		h->n++;
	}
	lockfs_table_names_free(names, count);
	return rc;
}

/* Is a flock waiter of BASE parked?  Its capacity into *CAP.  With mu. */
static bool has_waiters(struct lockfs_slots *s, const char *base, unsigned *cap)
{
	for (struct slot_waiter *x = s->waiters; x; x = x->next)
		if (strcmp(x->base, base) == 0) {
			if (cap)
				*cap = x->cap;
			return true;
		}
	return false;
}

/* Does anybody wait for a slot of BASE, here or (across hosts) on any
 * host: is its line lock held or asked for?  A newcomer then queues.
 * With mu. */
static bool line_busy(struct lockfs_core *core, const char *base)
{
	char line[LOCKFS_NAME_MAX + 1];
	struct lockfs_lock_stat ls;

	if (has_waiters(core->slots, base, NULL))
		return true;
	if (!lockfs_slots_across_hosts(core))
		return false;
	lockfs_slot_line_name(line, sizeof(line), base);
	return lockfs_core_stat(core, line, &ls) != -ENOENT;
}

/* The `denied` line of a taker whose capacity disagrees: NAME, what it
 * asked and what the slots have. */
static void log_conflict(struct lockfs_core *core, const struct lockfs_caller *caller,
			 const char *base, unsigned asked, unsigned has)
{
	struct lockfs_table *t = &core->table;
	char who[WHO_MAX], uid[16], pid[16], a[16], h[16];
	pid_t p = lockfs_caller_who(t, caller->tid, who, sizeof(who));

	lockfs_audit_ids(uid, pid, caller->uid, p);
	snprintf(a, sizeof(a), "%u", asked);
	snprintf(h, sizeof(h), "%u", has);
	lockfs_audit_event(t, who, base, (const char *const[]){ "uid", uid, "pid", pid,
		"slots", a, "has_slots", h, "reason", "slots-conflict", NULL }, "denied");
}

/* May CAP slots of BASE be taken, by what is held and what waits?  0, or
 * -ERANGE (logged).  With mu. */
static int check_capacity(struct lockfs_core *core, const struct lockfs_caller *caller,
			  const char *base, unsigned cap, struct held_slots *h)
{
	unsigned queued = 0;
	int rc = lockfs_slots_held(core, base, h);

	if (rc < 0 && rc != -ERANGE)
		return rc;
	if (!h->cap && has_waiters(core->slots, base, &queued))
		h->cap = queued;
	if (rc == -ERANGE || (h->cap && h->cap != cap)) {
		log_conflict(core, caller, base, cap, h->cap);
		return -ERANGE;
	}
	return 0;
}

/*
 * Across hosts, a first taker (no slot of BASE held anywhere) holds BASE's
 * line lock while it reads the slots again and takes one: two first takers
 * on two hosts with other counts cannot both go by an empty read, since
 * the second either finds the line taken or reads the first's slot (and
 * is refused ERANGE if its count is another).  Held for that moment as the
 * taker's own: a mkdir's as the caller's lock (OWNER NULL), a flock's as
 * an fd lock of its OWNER, as its slot will be.  0 (held: first_take_end
 * after), -EEXIST (another's now: a first taker or a waiter, on any host),
 * -errno.  With mu.
 */
static int first_take_begin(struct lockfs_core *core, const struct lockfs_caller *caller,
			    const char *base, const char *owner)
{
	char line[LOCKFS_NAME_MAX + 1];
	struct lockfs_fd_request rq = { .name = line, .owner = owner, .mode = LOCKFS_EXCLUSIVE };
	struct lockfs_lock_stat ls;
	struct lockfs_wait none = { 0 };
	int rc;

	lockfs_slot_line_name(line, sizeof(line), base);
	if (!owner)
		return lockfs_core_acquire(core, line, caller, &ls);
	rc = lockfs_core_fd_lock(core, caller, &rq, &none);
	return rc == -EWOULDBLOCK ? -EEXIST : rc;
}

static void first_take_end(struct lockfs_core *core, const struct lockfs_caller *caller,
			   const char *base, const char *owner)
{
	char line[LOCKFS_NAME_MAX + 1];

	lockfs_slot_line_name(line, sizeof(line), base);
	if (owner)
		(void)lockfs_core_fd_unlock(core, line, owner);
	else
		(void)lockfs_core_release(core, line, caller);
}

/* Is this take of BASE a first one across hosts (none held, H fresh)? */
static bool first_take(struct lockfs_core *core, const struct held_slots *h)
{
	return lockfs_slots_across_hosts(core) && h->n == 0;
}

/* Take a free slot of BASE (H: those held) for CALLER, by mkdir: 0 (OUT
 * filled), -EEXIST (none free).  With mu. */
static int take_dir(struct lockfs_core *core, const struct lockfs_caller *caller,
		    const char *base, unsigned cap, const struct held_slots *h,
		    struct lockfs_lock_stat *out)
{
	char name[LOCKFS_NAME_MAX + 1];
	int rc = -EEXIST;

	for (unsigned k = 0; k < cap && rc == -EEXIST; k++) {
		if (h->held[k])
			continue;
		lockfs_slot_name(name, sizeof(name), base, k, cap);
		rc = lockfs_core_acquire(core, name, caller, out);
	}
	return rc;
}

int lockfs_core_slot_acquire(struct lockfs_core *core, const char *request,
			     const struct lockfs_caller *caller, struct lockfs_lock_stat *out)
{
	struct lockfs_slots *s = core->slots;
	char base[LOCKFS_NAME_MAX + 1];
	struct held_slots h;
	unsigned cap;
	int rc;

	rc = lockfs_slot_request_parse(request, base, sizeof(base), &cap);
	if (rc < 0)
		return rc;
	if (!lockfs_slots_served(core))
		return -EOPNOTSUPP;
	pthread_mutex_lock(&s->mu);
	/* A count that disagrees is refused whatever else holds; then no
	 * barging: a name with flock waiters is theirs first. */
	rc = check_capacity(core, caller, base, cap, &h);
	if (rc == 0 && line_busy(core, base)) {
		rc = -EEXIST;
	} else if (rc == 0 && first_take(core, &h)) {
		rc = first_take_begin(core, caller, base, NULL);
		if (rc == 0) {
			rc = check_capacity(core, caller, base, cap, &h); /* again, under it */
			if (rc == 0)
				rc = take_dir(core, caller, base, cap, &h, out);
			first_take_end(core, caller, base, NULL);
		}
	} else if (rc == 0) {
		rc = take_dir(core, caller, base, cap, &h, out);
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

/* Grant the waiters of BASE at the head of its line as long as slots are
 * free, PREFER (a slot just freed, or -1) tried first.  With mu. */
static void grant_waiters(struct lockfs_core *core, const char *base, int prefer);

int lockfs_core_slot_release(struct lockfs_core *core, const char *name_given,
			     const struct lockfs_caller *caller)
{
	struct lockfs_slots *s = core->slots;
	char base[LOCKFS_NAME_MAX + 1], name[LOCKFS_NAME_MAX + 1];
	struct held_slots h;
	unsigned cap;
	int rc;

	if (lockfs_slots_base_of(name_given, base, &cap) < 0 || !lockfs_slots_served(core))
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = lockfs_slots_held(core, base, &h);
	if (rc == 0 || rc == -ERANGE)
		rc = h.n ? -EPERM : -ENOENT;
	for (unsigned k = 0; rc == -EPERM && k < h.cap; k++) {
		int r;

		if (!h.held[k])
			continue;
		lockfs_slot_name(name, sizeof(name), base, k, h.cap);
		r = lockfs_core_release(core, name, caller);
		if (r == 0) {
			grant_waiters(core, base, (int)k);
			rc = 0;
		} else if (r != -EPERM && r != -ENOENT) {
			rc = r;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}


/* ---- flock waiters ---- */

static struct slot_grant *grant_of(struct lockfs_slots *s, const char *base, const char *owner)
{
	for (struct slot_grant *g = s->grants; g; g = g->next)
		if (strcmp(g->base, base) == 0 && strcmp(g->owner, owner) == 0)
			return g;
	return NULL;
}

/* Take a free slot of BASE for OWNER as an fd lock, PREFER first.  The
 * slot's index, -EWOULDBLOCK (all held), or -errno.  With mu. */
static int take_fd(struct lockfs_core *core, const struct lockfs_caller *caller,
		   const struct lockfs_fd_asker *asker,
		   const char *base, unsigned cap, const char *owner, uint64_t via_file, int prefer)
{
	struct lockfs_slots *s = core->slots;
	char name[LOCKFS_NAME_MAX + 1];
	struct lockfs_wait none = { 0 };
	struct lockfs_lock_stat ls;

	for (int i = -1; i < (int)cap; i++) {
		int k = i < 0 ? prefer : i;
		struct slot_grant *g;
		int rc;

		if (k < 0 || (i >= 0 && k == prefer) || k >= (int)cap)
			continue;
		lockfs_slot_name(name, sizeof(name), base, (unsigned)k, cap);
		/* A held slot costs a look at the cache, not a /proc read. */
		if (lockfs_core_stat(core, name, &ls) == 0)
			continue;
		{
			struct lockfs_fd_request rq = { .name = name, .owner = owner,
				.via_file = via_file, .mode = LOCKFS_EXCLUSIVE, .wait = false };

			rc = asker ? lockfs_core_fd_lock_as(core, asker, &rq, &none)
				   : lockfs_core_fd_lock(core, caller, &rq, &none);
		}
		if (rc == -EWOULDBLOCK)
			continue;
		if (rc < 0)
			return rc;
		g = calloc(1, sizeof(*g));
		if (!g) {
			lockfs_core_fd_unlock(core, name, owner);
			return -ENOMEM;
		}
		snprintf(g->owner, sizeof(g->owner), "%s", owner);
		snprintf(g->base, sizeof(g->base), "%s", base);
		g->via_file = via_file;
		g->k = (unsigned)k;
		g->cap = cap;
		g->next = s->grants;
		s->grants = g;
		return k;
	}
	return -EWOULDBLOCK;
}

/* ---- the line across hosts ---- */

/* The engine's answer to X's request for the line lock (under an engine
 * mutex: only a flag, and the waker woken). */
static void line_done(struct lockfs_wait *w, int result)
{
	struct slot_waiter *x = (struct slot_waiter *)((char *)w - offsetof(struct slot_waiter, line));

	__atomic_store_n(&x->at_head, result < 0 ? result : 1, __ATOMIC_RELEASE);
	pthread_cond_signal(x->wake);
}

/* X (not yet listed) asks for the line lock of its name: granted at once
 * (x->at_head 1: nobody waits, on any host) or parked in its queue.  0 or
 * -errno (the line refused: EDEADLK, the store's error).  With mu. */
static int join_line(struct lockfs_core *core, struct slot_waiter *x)
{
	char line[LOCKFS_NAME_MAX + 1];
	struct lockfs_fd_request rq = { .name = line, .owner = x->owner, .via_file = x->via_file,
					.mode = LOCKFS_EXCLUSIVE, .wait = true };
	int rc;

	lockfs_slot_line_name(line, sizeof(line), x->base);
	x->line.done = line_done;
	x->wake = &core->slots->cv;
	rc = lockfs_core_fd_lock_as(core, x->asker, &rq, &x->line);
	if (rc == 0)
		x->at_head = 1;
	else if (rc != -EINPROGRESS)
		return rc;
	x->in_line = true;
	return 0;
}

/* X is done waiting (a slot, an error, cancelled): it lets go of the line
 * lock, held or still asked for, so that the next in line is the head.
 * With mu. */
static void leave_line(struct lockfs_core *core, struct slot_waiter *x)
{
	char line[LOCKFS_NAME_MAX + 1];

	if (!x->in_line)
		return;
	x->in_line = false;
	lockfs_slot_line_name(line, sizeof(line), x->base);
	/* Still parked: out of the queue, never granted.  Else (granted, or
	 * being granted: cancel waits for it) it holds the lock. */
	if (__atomic_load_n(&x->at_head, __ATOMIC_ACQUIRE) == 0 &&
	    lockfs_core_fd_cancel(core, line, &x->line) == 0)
		return;
	(void)lockfs_core_fd_unlock(core, line, x->owner);
}

static void grant_waiters(struct lockfs_core *core, const char *base, int prefer)
{
	struct lockfs_slots *s = core->slots;
	struct slot_waiter **pp = &s->waiters;

	while (*pp) {
		struct slot_waiter *x = *pp;
		int rc, head = 1;

		if (strcmp(x->base, base) != 0) {
			pp = &x->next;
			continue;
		}
		/* Across hosts only the line's head takes a slot: until its
		 * line lock is granted, the head of the line is elsewhere. */
		if (x->in_line)
			head = __atomic_load_n(&x->at_head, __ATOMIC_ACQUIRE);
		if (head == 0)
			return;
		rc = head < 0 ? head
			      : take_fd(core, &x->caller, x->asker, base, x->cap, x->owner,
					x->via_file, prefer);
		if (rc == -EWOULDBLOCK)
			return; /* FIFO: nobody behind the head goes first */
		prefer = -1;
		*pp = x->next;
		x->w->parked = false;
		x->w->done(x->w, rc < 0 ? rc : 0);
		/* Then the line goes on (one more write to the store, which
		 * the waiter answered first need not wait for; a request of
		 * its owner's that would join the line again waits for mu). */
		leave_line(core, x);
		lockfs_core_fd_asker_free(x->asker);
		free(x);
	}
}

/* Grant every slotted name that has waiters, each as far as its slots
 * allow.  With mu. */
static void grant_all(struct lockfs_core *core)
{
	struct lockfs_slots *s = core->slots;
	char done[8][LOCKFS_NAME_MAX + 1];
	size_t n = 0;

	for (struct slot_waiter *x = s->waiters; x; ) {
		char base[LOCKFS_NAME_MAX + 1];
		bool seen = false;

		for (size_t i = 0; i < n && !seen; i++)
			seen = strcmp(done[i], x->base) == 0;
		if (seen) {
			x = x->next;
			continue;
		}
		snprintf(base, sizeof(base), "%s", x->base);
		if (n < 8)
			snprintf(done[n++], sizeof(done[0]), "%s", base);
		grant_waiters(core, base, -1);
		/* The list changed: start again, skipping the names done. */
		x = n < 8 ? s->waiters : NULL;
	}
}

/* The waker: slots freed by the engine on its own (a holder's death, a
 * lease, a break, a holder's rmdir of its slot lock) go to the waiters
 * within SLOTS_POLL_MS; a slot the store reports changed (another host's
 * release, lockfs_core_slots_changed) at once.  Sleeps while nobody
 * waits. */
static void *waker(void *arg)
{
	struct lockfs_core *core = arg;
	struct lockfs_slots *s = core->slots;

	pthread_mutex_lock(&s->mu);
	while (!s->stop) {
		struct timespec until;

		if (!s->waiters) {
			pthread_cond_wait(&s->cv, &s->mu);
			continue;
		}
		/* A slot's change came while it was busy: no wait. */
		if (__atomic_exchange_n(&s->kicked, false, __ATOMIC_ACQ_REL)) {
			grant_all(core);
			continue;
		}
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += SLOTS_POLL_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&s->cv, &s->mu, &until);
		if (!s->stop)
			grant_all(core);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

int lockfs_core_slot_fd_lock(struct lockfs_core *core, const struct lockfs_caller *caller,
			     const struct lockfs_fd_request *rq, struct lockfs_wait *w)
{
	struct lockfs_slots *s = core->slots;
	char base[LOCKFS_NAME_MAX + 1];
	struct held_slots h;
	struct slot_waiter *x;
	unsigned cap;
	int rc;

	rc = lockfs_slot_request_parse(rq->name, base, sizeof(base), &cap);
	if (rc < 0)
		return rc;
	if (!lockfs_slots_served(core))
		return -EOPNOTSUPP;
	if (strlen(rq->owner) >= LOCKFS_FD_OWNER_MAX)
		return -EINVAL;
	pthread_mutex_lock(&s->mu);
	if (grant_of(s, base, rq->owner)) {
		rc = 0; /* the same owner again: it has its slot */
		goto out;
	}
	rc = check_capacity(core, caller, base, cap, &h);
	if (rc < 0)
		goto out;
	/* A newcomer goes first only when nobody waits ahead of it (a first
	 * taker across hosts: nor another first taker, see first_take_begin). */
	if (line_busy(core, base)) {
		rc = -EWOULDBLOCK;
	} else if (first_take(core, &h)) {
		rc = first_take_begin(core, caller, base, rq->owner);
		if (rc == 0) {
			rc = check_capacity(core, caller, base, cap, &h);
			if (rc == 0)
				rc = take_fd(core, caller, NULL, base, cap, rq->owner, rq->via_file,
					     -1);
			first_take_end(core, caller, base, rq->owner);
		} else if (rc == -EEXIST) {
			rc = -EWOULDBLOCK; /* in line behind it, if it waits */
		}
	} else {
		rc = take_fd(core, caller, NULL, base, cap, rq->owner, rq->via_file, -1);
	}
	if (rc >= 0) {
		rc = 0;
		goto out;
	}
	if (rc != -EWOULDBLOCK || !rq->wait)
		goto out;
	x = calloc(1, sizeof(*x));
	if (!x) {
		rc = -ENOMEM;
		goto out;
	}
	rc = lockfs_core_fd_asker_new(core, caller, rq, &x->asker);
	if (rc < 0) {
		free(x);
		goto out;
	}
	x->w = w;
	x->caller = *caller;
	snprintf(x->owner, sizeof(x->owner), "%s", rq->owner);
	snprintf(x->base, sizeof(x->base), "%s", base);
	x->via_file = rq->via_file;
	x->cap = cap;
	if (lockfs_slots_across_hosts(core)) {
		int k = -EWOULDBLOCK;

		rc = join_line(core, x);
		/* At the line's head at once (its lock was free: the slots
		 * are all held, or one went meanwhile): one more try first. */
		if (rc == 0 && __atomic_load_n(&x->at_head, __ATOMIC_ACQUIRE) == 1)
			k = take_fd(core, caller, x->asker, base, cap, rq->owner, rq->via_file, -1);
		if (rc < 0 || k != -EWOULDBLOCK) {
			leave_line(core, x);
			lockfs_core_fd_asker_free(x->asker);
			free(x);
			rc = rc < 0 ? rc : k < 0 ? k : 0;
			goto out;
		}
	}
	{
		struct slot_waiter **pp = &s->waiters;

		while (*pp)
			pp = &(*pp)->next;
		*pp = x;
	}
	w->parked = true;
	if (!s->waker_on && !s->stop &&
	    pthread_create(&s->waker, NULL, waker, core) == 0)
		s->waker_on = true;
	pthread_cond_broadcast(&s->cv);
	rc = -EINPROGRESS;
out:
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int lockfs_core_slot_fd_cancel(struct lockfs_core *core, const char *name, struct lockfs_wait *w)
{
	struct lockfs_slots *s = core->slots;
	int rc = -EALREADY;

	(void)name;
	if (!s)
		return rc;
	pthread_mutex_lock(&s->mu);
	for (struct slot_waiter **pp = &s->waiters; *pp; pp = &(*pp)->next) {
		struct slot_waiter *x = *pp;

		if (x->w != w)
			continue;
		*pp = x->next;
		leave_line(core, x);
		w->parked = false;
		lockfs_core_fd_asker_free(x->asker);
		free(x);
		rc = 0;
		break;
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

/* End grant G (unlinked by the caller) and hand its slot on.  With mu. */
static int end_grant(struct lockfs_core *core, struct slot_grant *g)
{
	char name[LOCKFS_NAME_MAX + 1];
	int rc;

	lockfs_slot_name(name, sizeof(name), g->base, g->k, g->cap);
	rc = lockfs_core_fd_unlock(core, name, g->owner);
	grant_waiters(core, g->base, (int)g->k);
	free(g);
	return rc;
}

int lockfs_core_slot_fd_unlock(struct lockfs_core *core, const char *request, const char *owner)
{
	struct lockfs_slots *s = core->slots;
	char base[LOCKFS_NAME_MAX + 1];
	unsigned cap;
	int rc = 0;

	if (!s || lockfs_slot_request_parse(request, base, sizeof(base), &cap) < 0)
		return 0;
	pthread_mutex_lock(&s->mu);
	for (struct slot_grant **pp = &s->grants; *pp; pp = &(*pp)->next) {
		struct slot_grant *g = *pp;

		if (strcmp(g->base, base) != 0 || strcmp(g->owner, owner) != 0)
			continue;
		*pp = g->next;
		rc = end_grant(core, g);
		pthread_mutex_unlock(&s->mu);
		return rc;
	}
	/* No grant known: one made by a predecessor whose connection this
	 * daemon took over (its fd locks were kept, our records were not).
	 * Whatever slot OWNER holds is let go; it holds none, nothing is. */
	{
		char name[LOCKFS_NAME_MAX + 1];
		struct held_slots h;

		if (lockfs_slots_held(core, base, &h) == 0)
			for (unsigned k = 0; k < h.cap; k++) {
				if (!h.held[k])
					continue;
				lockfs_slot_name(name, sizeof(name), base, k, h.cap);
				if (lockfs_core_fd_unlock(core, name, owner) == 0 &&
				    lockfs_core_stat(core, name, &(struct lockfs_lock_stat){ 0 }) == -ENOENT)
					grant_waiters(core, base, (int)k);
			}
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void lockfs_core_slot_fd_file_closed(struct lockfs_core *core, const char *request, uint64_t file)
{
	struct lockfs_slots *s = core->slots;
	char base[LOCKFS_NAME_MAX + 1];
	unsigned cap;

	if (!s || !file || lockfs_slot_request_parse(request, base, sizeof(base), &cap) < 0)
		return;
	pthread_mutex_lock(&s->mu);
	for (struct slot_grant **pp = &s->grants; *pp; ) {
		struct slot_grant *g = *pp;

		if (strcmp(g->base, base) != 0 || g->via_file != file) {
			pp = &g->next;
			continue;
		}
		*pp = g->next;
		end_grant(core, g);
	}
	pthread_mutex_unlock(&s->mu);
}

int lockfs_core_slot_index(struct lockfs_core *core, const char *request, const char *owner)
{
	struct lockfs_slots *s = core->slots;
	char base[LOCKFS_NAME_MAX + 1];
	struct slot_grant *g;
	unsigned cap;
	int rc = -ENOENT;

	if (!s || lockfs_slot_request_parse(request, base, sizeof(base), &cap) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	g = grant_of(s, base, owner);
	if (g) {
		char name[LOCKFS_NAME_MAX + 1];
		struct lockfs_lock_stat ls;

		/* Still its own: not recovered, broken or released by rmdir. */
		lockfs_slot_name(name, sizeof(name), base, g->k, g->cap);
		if (lockfs_core_stat(core, name, &ls) == 0)
			rc = (int)g->k;
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

