/*
 * The engine's counters and M/.metrics' text (metrics.h).
 *
 * Cardinality is bounded by construction: every label's values are a
 * fixed list (the `bound` of a grant, how a grant ended, the evidence of
 * a recovery, the session states), and the per-name series exist only
 * for the names -o metrics_names lists.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "lockfs/name.h"
#include "metrics.h"
#include "queue.h"
#include "store.h"

/* Upper bounds of the histograms' buckets, in milliseconds (+Inf last). */
static const int64_t bucket_ms[] = { 1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 60000,
				     300000, 3600000 };
#define NBUCKETS (sizeof(bucket_ms) / sizeof(bucket_ms[0]))

struct histogram {
	uint64_t le[NBUCKETS + 1]; /* not cumulative; [NBUCKETS]: +Inf only */
	uint64_t count;
	uint64_t sum_ms;
};

/* How a grant ends: the event of its last line. */
static const char *const ends[] = { "released", "recovered", "broken", "lost" };
#define NENDS (sizeof(ends) / sizeof(ends[0]))

/* The evidence a `recovered` line gives (docs/log.md); anything else is
 * counted as "other", so that no value from outside makes a series. */
static const char *const evidences[] = {
	"exited", "exited,descendants-exited", "exited-while-down",
	"exited,descendants-exited-while-down", "boot-changed", "closed", "closed-while-down",
	"lease-expired,no-process-with-slug", "foreign-stale", "other",
};
#define NEVIDENCES (sizeof(evidences) / sizeof(evidences[0]))

/* Every counter: relaxed atomics, added to from any thread. */
struct lockfs_metrics {
	uint64_t acquired_dir, acquired_fd;
	uint64_t ended[NENDS];
	uint64_t recovered[NEVIDENCES];
	uint64_t waits, busy, deadlocks;
	struct histogram wait, hold;
	char **names;   /* -o metrics_names; read-only */
	size_t nnames;
};

static void add(uint64_t *counter, uint64_t n)
{
	__atomic_add_fetch(counter, n, __ATOMIC_RELAXED);
}

static uint64_t get(const uint64_t *counter)
{
	return __atomic_load_n(counter, __ATOMIC_RELAXED);
}

int lockfs_metrics_new(struct lockfs_metrics **out, const char *names)
{
	struct lockfs_metrics *m = calloc(1, sizeof(*m));
	char *copy, *save = NULL;
	int rc = 0;

	if (!m)
		return -ENOMEM;
	copy = strdup(names ? names : "");
	if (!copy) {
		free(m);
		return -ENOMEM;
	}
	for (char *n = strtok_r(copy, ":", &save); n; n = strtok_r(NULL, ":", &save)) {
		char **more = realloc(m->names, (m->nnames + 1) * sizeof(*more));

		if (lockfs_name_check(n) < 0) {
			rc = -EINVAL;
			break;
		}
		if (!more || !(more[m->nnames] = strdup(n))) {
			m->names = more ? more : m->names;
			rc = -ENOMEM;
			break;
		}
		m->names = more;
		m->nnames++;
	}
	free(copy);
	if (rc < 0) {
		lockfs_metrics_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

void lockfs_metrics_free(struct lockfs_metrics *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->nnames; i++)
		free(m->names[i]);
	free(m->names);
	free(m);
}

static void observe(struct histogram *h, int64_t ms)
{
	size_t i = 0;

	if (ms < 0)
		ms = 0;
	while (i < NBUCKETS && ms > bucket_ms[i])
		i++;
	add(&h->le[i], 1);
	add(&h->count, 1);
	add(&h->sum_ms, (uint64_t)ms);
}

/* The value of KEY in KV, or NULL. */
static const char *kv_get(const char *const *kv, const char *key)
{
	for (; kv && kv[0] && kv[1]; kv += 2)
		if (strcmp(kv[0], key) == 0)
			return kv[1];
	return NULL;
}

void lockfs_metrics_event(struct lockfs_metrics *m, const char *const *kv, const char *event,
			  int64_t since_ms)
{
	const char *v;

	if (!m)
		return;
	if (strcmp(event, "acquired") == 0) {
		v = kv_get(kv, "bound");
		add(v && strcmp(v, "fd") == 0 ? &m->acquired_fd : &m->acquired_dir, 1);
		return;
	}
	for (size_t i = 0; i < NENDS; i++) {
		if (strcmp(event, ends[i]) != 0)
			continue;
		/* The log's own `lost` (lines dropped) names no fence. */
		if (!kv_get(kv, "fence") && strcmp(event, "recovered") != 0)
			return;
		add(&m->ended[i], 1);
		if (since_ms > 0)
			observe(&m->hold, lockfs_wall_ms() - since_ms);
		break;
	}
	if (strcmp(event, "deadlock") == 0) {
		add(&m->deadlocks, 1);
		return;
	}
	if (strcmp(event, "recovered") == 0) {
		size_t i = 0;

		v = kv_get(kv, "evidence");
		while (i + 1 < NEVIDENCES && !(v && strcmp(v, evidences[i]) == 0))
			i++;
		add(&m->recovered[i], 1);
	}
}

void lockfs_metrics_waiting(struct lockfs_metrics *m)
{
	if (m)
		add(&m->waits, 1);
}

void lockfs_metrics_busy(struct lockfs_metrics *m)
{
	if (m)
		add(&m->busy, 1);
}

void lockfs_metrics_granted(struct lockfs_metrics *m, int64_t waited_ms)
{
	if (m)
		observe(&m->wait, waited_ms);
}

/* A growing text; OK turns false on the first failure. */
struct out {
	char *s;
	size_t len, cap;
	bool ok;
};

__attribute__((format(printf, 2, 3)))
static void say(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!o->ok)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(o->s ? o->s + o->len : NULL, o->s ? o->cap - o->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->ok = false;
			return;
		}
		if (o->s && (size_t)n < o->cap - o->len)
			break;
		{
			size_t cap = (o->cap + (size_t)n + 1) * 2;
			char *p = realloc(o->s, cap);

			if (!p) {
				o->ok = false;
				return;
			}
			o->s = p;
			o->cap = cap;
		}
	}
	o->len += (size_t)n;
}

static void head(struct out *o, const char *name, const char *type, const char *help)
{
	say(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void histogram(struct out *o, const char *name, const char *help,
		      const struct histogram *h)
{
	uint64_t cum = 0;

	head(o, name, "histogram", help);
	for (size_t i = 0; i < NBUCKETS; i++) {
		cum += get(&h->le[i]);
		say(o, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, (double)bucket_ms[i] / 1000.0, cum);
	}
	cum += get(&h->le[NBUCKETS]);
	say(o, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
	say(o, "%s_sum %.3f\n%s_count %" PRIu64 "\n", name, (double)get(&h->sum_ms) / 1000.0,
	    name, get(&h->count));
}

/* A lock name as a label value: backslash, quote and newline escaped (the
 * format's only escapes).  Names are the administrator's, checked. */
static void label_value(struct out *o, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			say(o, "\\%c", *v);
		else if (*v == '\n')
			say(o, "\\n");
		else
			say(o, "%c", *v);
	}
}

/* Holders and parked waiters of NAME now.  Takes NAME's stripe mutex. */
static void name_counts(struct lockfs_table *t, const char *name, uint64_t *holders,
			uint64_t *waiters)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	struct held_lock *c = lockfs_table_find(s, name);
	struct lockq *q = s->queues;

	/* Read the list here rather than call queue.c: this file sits below
	 * it (queue.c's grants are counted here). */
	while (q && strcmp(q->name, name) != 0)
		q = q->next;

	*holders = c && c->rec.has_holder ? lockfs_record_holders(&c->rec) : 0;
	*waiters = q ? q->nactive : 0;
	lockfs_table_unlock(s);
}

/* The gauges: names held, holders and parked waiters, in all. */
static void gauges(struct out *o, struct lockfs_table *t)
{
	uint64_t held = 0, holders = 0, waiters = 0;

	for (size_t i = 0; i < STRIPES; i++) {
		struct stripe *s = &t->stripes[i];

		pthread_mutex_lock(&s->mu);
		for (struct held_lock *c = s->head; c; c = c->next) {
			if (!c->rec.has_holder)
				continue;
			held++;
			holders += lockfs_record_holders(&c->rec);
		}
		for (struct lockq *q = s->queues; q; q = q->next)
			waiters += q->nactive;
		pthread_mutex_unlock(&s->mu);
	}
	head(o, "lockfs_locks_held", "gauge", "Locks held now (names), as this daemon knows them.");
	say(o, "lockfs_locks_held %" PRIu64 "\n", held);
	head(o, "lockfs_lock_holders", "gauge", "Holders of those locks (a shared lock has several).");
	say(o, "lockfs_lock_holders %" PRIu64 "\n", holders);
	head(o, "lockfs_waiters", "gauge", "Requests parked waiting for a lock on this daemon.");
	say(o, "lockfs_waiters %" PRIu64 "\n", waiters);
}

static void session(struct out *o, struct lockfs_table *t)
{
	static const char *const states[] = { "live", "uncertain", "lost" };
	struct lockfs_session ses;

	if (!t->be || !(t->be->caps & LOCKFS_BE_SESSIONS) ||
	    lockfs_store_session(t->be, t->host, &ses) < 0)
		return;
	head(o, "lockfs_session_state", "gauge",
	     "This daemon's session with the store (etcd): 1 for the state it is in.");
	for (size_t i = 0; i < 3; i++)
		say(o, "lockfs_session_state{state=\"%s\"} %d\n", states[i], (size_t)ses.state == i);
	head(o, "lockfs_session_state_since_seconds", "gauge",
	     "Unix time the session entered its state.");
	say(o, "lockfs_session_state_since_seconds %.3f\n", (double)ses.since_ms / 1000.0);
}

int lockfs_metrics_render(struct lockfs_table *t, char **text, size_t *len)
{
	struct lockfs_metrics *m = t->metrics;
	struct out o = { .ok = true };

	gauges(&o, t);
	head(&o, "lockfs_acquisitions_total", "counter",
	     "Grants: mkdir of a lock (bound=dir) and flock/fcntl grants on .flock (bound=fd).");
	say(&o, "lockfs_acquisitions_total{bound=\"dir\"} %" PRIu64 "\n", get(&m->acquired_dir));
	say(&o, "lockfs_acquisitions_total{bound=\"fd\"} %" PRIu64 "\n", get(&m->acquired_fd));
	head(&o, "lockfs_grant_ends_total", "counter",
	     "Grants ended, by how: released by the holder, recovered, broken, lost.");
	for (size_t i = 0; i < NENDS; i++)
		say(&o, "lockfs_grant_ends_total{how=\"%s\"} %" PRIu64 "\n", ends[i], get(&m->ended[i]));
	head(&o, "lockfs_recoveries_total", "counter",
	     "Locks the daemon released because their holder was gone, by evidence.");
	for (size_t i = 0; i < NEVIDENCES; i++)
		say(&o, "lockfs_recoveries_total{evidence=\"%s\"} %" PRIu64 "\n", evidences[i],
		    get(&m->recovered[i]));
	head(&o, "lockfs_contention_total", "counter",
	     "Requests that found the lock held: a flock/fcntl that waited (waited), a LOCK_NB"
	     " or F_SETLK refused or a mkdir the daemon answered EEXIST (refused).");
	say(&o, "lockfs_contention_total{how=\"waited\"} %" PRIu64 "\n", get(&m->waits));
	say(&o, "lockfs_contention_total{how=\"refused\"} %" PRIu64 "\n", get(&m->busy));
	head(&o, "lockfs_deadlocks_total", "counter",
	     "Waits refused with EDEADLK because they would have closed a cycle.");
	say(&o, "lockfs_deadlocks_total %" PRIu64 "\n", get(&m->deadlocks));
	histogram(&o, "lockfs_wait_seconds", "Time a parked waiter waited until it was granted.",
		  &m->wait);
	histogram(&o, "lockfs_hold_seconds", "Time from a grant to its end (any end).", &m->hold);
	head(&o, "lockfs_store_errors_total", "counter",
	     "Store operations answered EIO (unreachable or refused).");
	say(&o, "lockfs_store_errors_total %" PRIu64 "\n", lockfs_store_errors());
	session(&o, t);
	if (m->nnames) {
		head(&o, "lockfs_lock_name_holders", "gauge", "Holders of a lock named by -o metrics_names.");
		for (size_t i = 0; i < m->nnames; i++) {
			uint64_t h, w;

			name_counts(t, m->names[i], &h, &w);
			say(&o, "lockfs_lock_name_holders{name=\"");
			label_value(&o, m->names[i]);
			say(&o, "\"} %" PRIu64 "\n", h);
		}
		head(&o, "lockfs_lock_name_waiters", "gauge",
		     "Parked waiters of a lock named by -o metrics_names.");
		for (size_t i = 0; i < m->nnames; i++) {
			uint64_t h, w;

			name_counts(t, m->names[i], &h, &w);
			say(&o, "lockfs_lock_name_waiters{name=\"");
			label_value(&o, m->names[i]);
			say(&o, "\"} %" PRIu64 "\n", w);
		}
	}
	if (!o.ok) {
		free(o.s);
		return -ENOMEM;
	}
	*text = o.s;
	*len = o.len;
	return 0;
}
