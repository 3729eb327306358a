/* What one user may hold; see quota.h. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "quota.h"

#define BUCKETS 256
/* By the boot clock (base/clock.h, which a unit test may move): a burst
 * ends after this long without a refusal ... */
#define BURST_QUIET_MS 1000
/* ... or this long after it began (a refusal loop still shows every 10 s). */
#define BURST_MAX_MS 10000

/* What UID holds.  Exists while any count is not zero. */
struct user {
	struct user *next;
	uid_t uid;
	uint64_t locks;    /* holders of locks in the engine's cache */
	uint64_t reserved; /* locks being made (lockfs_quota_lock_reserve) */
	uint64_t waiters;
	uint64_t open;
};

struct quota {
	pthread_mutex_t mu;
	struct quota_limits lim;       /* protected by mu */
	struct user *users[BUCKETS];   /* protected by mu */
	uint64_t locks, reserved;      /* in all; protected by mu */
	struct quota_burst *bursts;    /* protected by mu */
};

int lockfs_quota_new(struct quota **out, const struct quota_limits *lim)
{
	struct quota *q = calloc(1, sizeof(*q));

	if (!q)
		return -ENOMEM;
	pthread_mutex_init(&q->mu, NULL);
	q->lim = *lim;
	*out = q;
	return 0;
}

void lockfs_quota_free(struct quota *q)
{
	if (!q)
		return;
	for (int i = 0; i < BUCKETS; i++) {
		while (q->users[i]) {
			struct user *u = q->users[i];

			q->users[i] = u->next;
			free(u);
		}
	}
	while (q->bursts) {
		struct quota_burst *b = q->bursts;

		q->bursts = b->next;
		free(b);
	}
	pthread_mutex_destroy(&q->mu);
	free(q);
}

void lockfs_quota_set_open_limit(struct quota *q, uint32_t open_per_uid)
{
	pthread_mutex_lock(&q->mu);
	q->lim.open_per_uid = open_per_uid;
	pthread_mutex_unlock(&q->mu);
}

const char *lockfs_quota_reason_name(enum quota_reason r)
{
	switch (r) {
	case QUOTA_OPEN_PER_UID:
		return "open-per-uid";
	case QUOTA_FD_RESERVE:
		return "fd-reserve";
	case QUOTA_LOCKS_PER_UID:
		return "locks-per-uid";
	case QUOTA_WAITERS_PER_UID:
		return "waiters-per-uid";
	case QUOTA_LOCKS:
		return "locks";
	}
	return "?";
}

/* UID's entry, made when MAKE (NULL when absent, or out of memory: then
 * the caller counts nothing, and refuses nothing it could not count).
 * Called with q->mu held. */
static struct user *user_of(struct quota *q, uid_t uid, bool make)
{
	struct user **pp = &q->users[uid % BUCKETS];

	for (; *pp; pp = &(*pp)->next)
		if ((*pp)->uid == uid)
			return *pp;
	if (!make)
		return NULL;
	*pp = calloc(1, sizeof(**pp));
	if (*pp)
		(*pp)->uid = uid;
	return *pp;
}

/* Forget U when it holds nothing.  Called with q->mu held. */
static void user_maybe_free(struct quota *q, struct user *u)
{
	if (u->locks || u->reserved || u->waiters || u->open)
		return;
	for (struct user **pp = &q->users[u->uid % BUCKETS]; *pp; pp = &(*pp)->next) {
		if (*pp == u) {
			*pp = u->next;
			free(u);
			return;
		}
	}
}

static uint64_t dec(uint64_t v)
{
	return v ? v - 1 : 0;
}

int lockfs_quota_lock_reserve(struct quota *q, uid_t uid, bool grows, enum quota_reason *why)
{
	struct user *u;
	int rc = 0;

	pthread_mutex_lock(&q->mu);
	u = user_of(q, uid, true);
	if (uid != 0 && u && u->locks + u->reserved >= q->lim.locks_per_uid) {
		*why = QUOTA_LOCKS_PER_UID;
		rc = -EDQUOT;
	} else if (uid != 0 && grows && q->locks + q->reserved >= q->lim.locks) {
		*why = QUOTA_LOCKS;
		rc = -ENOSPC;
	} else {
		if (u)
			u->reserved++;
		if (grows)
			q->reserved++;
	}
	if (u && rc < 0)
		user_maybe_free(q, u);
	pthread_mutex_unlock(&q->mu);
	return rc;
}

void lockfs_quota_lock_unreserve(struct quota *q, uid_t uid, bool grows)
{
	struct user *u;

	pthread_mutex_lock(&q->mu);
	u = user_of(q, uid, false);
	if (u) {
		u->reserved = dec(u->reserved);
		user_maybe_free(q, u);
	}
	if (grows)
		q->reserved = dec(q->reserved);
	pthread_mutex_unlock(&q->mu);
}

void lockfs_quota_locks_add(struct quota *q, uid_t uid, int delta)
{
	struct user *u;

	if (!delta)
		return;
	pthread_mutex_lock(&q->mu);
	u = user_of(q, uid, delta > 0);
	if (delta > 0) {
		if (u)
			u->locks += (uint64_t)delta;
		q->locks += (uint64_t)delta;
	} else {
		uint64_t d = (uint64_t)-(int64_t)delta;

		if (u) {
			u->locks = u->locks > d ? u->locks - d : 0;
			user_maybe_free(q, u);
		}
		q->locks = q->locks > d ? q->locks - d : 0;
	}
	pthread_mutex_unlock(&q->mu);
}

uint64_t lockfs_quota_locks_of(struct quota *q, uid_t uid)
{
	struct user *u;
	uint64_t n;

	pthread_mutex_lock(&q->mu);
	u = user_of(q, uid, false);
	n = u ? u->locks : 0;
	pthread_mutex_unlock(&q->mu);
	return n;
}

uint64_t lockfs_quota_locks_total(struct quota *q)
{
	uint64_t n;

	pthread_mutex_lock(&q->mu);
	n = q->locks;
	pthread_mutex_unlock(&q->mu);
	return n;
}

/* The per-uid counts that are capped one at a time. */
enum counter { COUNT_WAITERS, COUNT_OPEN };

static uint64_t *counter_of(struct user *u, enum counter c)
{
	return c == COUNT_WAITERS ? &u->waiters : &u->open;
}

/* One more of UID's counter C unless it is at its cap.  0 or -1. */
static int count_add(struct quota *q, uid_t uid, enum counter c)
{
	struct user *u;
	int rc = 0;

	pthread_mutex_lock(&q->mu);
	u = user_of(q, uid, true);
	if (u) {
		uint32_t cap = c == COUNT_WAITERS ? q->lim.waiters_per_uid : q->lim.open_per_uid;

		if (uid != 0 && *counter_of(u, c) >= cap) {
			rc = -1;
			user_maybe_free(q, u);
		} else {
			++*counter_of(u, c);
		}
	}
	pthread_mutex_unlock(&q->mu);
	return rc;
}

static void count_sub(struct quota *q, uid_t uid, enum counter c)
{
	struct user *u;

	pthread_mutex_lock(&q->mu);
	u = user_of(q, uid, false);
	if (u) {
		*counter_of(u, c) = dec(*counter_of(u, c));
		user_maybe_free(q, u);
	}
	pthread_mutex_unlock(&q->mu);
}

int lockfs_quota_waiter_add(struct quota *q, uid_t uid)
{
	return count_add(q, uid, COUNT_WAITERS) < 0 ? -EDQUOT : 0;
}

void lockfs_quota_waiter_sub(struct quota *q, uid_t uid)
{
	count_sub(q, uid, COUNT_WAITERS);
}

int lockfs_quota_open_add(struct quota *q, uid_t uid)
{
	return count_add(q, uid, COUNT_OPEN) < 0 ? -EMFILE : 0;
}

void lockfs_quota_open_sub(struct quota *q, uid_t uid)
{
	count_sub(q, uid, COUNT_OPEN);
}

static uint32_t limit_for(const struct quota_limits *lim, enum quota_reason r)
{
	switch (r) {
	case QUOTA_OPEN_PER_UID:
		return lim->open_per_uid;
	case QUOTA_LOCKS_PER_UID:
		return lim->locks_per_uid;
	case QUOTA_WAITERS_PER_UID:
		return lim->waiters_per_uid;
	case QUOTA_LOCKS:
		return lim->locks;
	case QUOTA_FD_RESERVE:
		break;
	}
	return QUOTA_NONE;
}

/* Called with q->mu held. */
static struct quota_burst *burst_find(struct quota *q, uid_t uid, enum quota_reason reason)
{
	for (struct quota_burst *b = q->bursts; b; b = b->next)
		if (b->uid == uid && b->reason == reason)
			return b;
	return NULL;
}

bool lockfs_quota_refused(struct quota *q, uid_t uid, enum quota_reason reason, const char *name)
{
	int64_t now = lockfs_boot_ms();
	struct quota_burst *b;
	bool fresh = false;

	pthread_mutex_lock(&q->mu);
	b = burst_find(q, uid, reason);
	if (!b && (b = calloc(1, sizeof(*b)))) {
		b->uid = uid;
		b->reason = reason;
		b->limit = limit_for(&q->lim, reason);
		b->first_ms = now;
		snprintf(b->name, sizeof(b->name), "%s", name ? name : "");
		{
			struct quota_burst **pp = &q->bursts;

			while (*pp)
				pp = &(*pp)->next;
			*pp = b; /* oldest first: logged in the order they began */
		}
		fresh = true;
	}
	if (b) {
		b->count++;
		b->last_ms = now;
	}
	pthread_mutex_unlock(&q->mu);
	return fresh;
}

void lockfs_quota_burst_who(struct quota *q, uid_t uid, enum quota_reason reason, const char *who,
			    pid_t pid)
{
	struct quota_burst *b;

	pthread_mutex_lock(&q->mu);
	b = burst_find(q, uid, reason);
	if (b && !b->who[0]) {
		snprintf(b->who, sizeof(b->who), "%s", who);
		b->pid = pid;
	}
	pthread_mutex_unlock(&q->mu);
}

bool lockfs_quota_idle(struct quota *q)
{
	bool idle;

	if (!q)
		return true;
	pthread_mutex_lock(&q->mu);
	idle = q->bursts == NULL;
	pthread_mutex_unlock(&q->mu);
	return idle;
}

void lockfs_quota_flush(struct quota *q, bool all,
		 void (*emit)(void *arg, const struct quota_burst *b), void *arg)
{
	int64_t now = lockfs_boot_ms();
	struct quota_burst *done = NULL, **tail = &done;

	pthread_mutex_lock(&q->mu);
	for (struct quota_burst **pp = &q->bursts, *b; (b = *pp);) {
		if (all || now - b->last_ms >= BURST_QUIET_MS || now - b->first_ms >= BURST_MAX_MS) {
			*pp = b->next;
			b->next = NULL;
			*tail = b;
			tail = &b->next;
		} else {
			pp = &b->next;
		}
	}
	pthread_mutex_unlock(&q->mu);
	while (done) {
		struct quota_burst *b = done;

		done = b->next;
		emit(arg, b);
		free(b);
	}
}
