/*
 * What this daemon watches in etcd: only what its own callers need, so
 * that a lock taken on one host costs the other hosts nothing.
 *
 *  - a name with a key of this daemon (held or waited for here, also on a
 *    session just lost), in lock-delay, or with an undo pending;
 *  - a name looked at (lookup, stat, `owner`): ETCD_LOOK_MS after the last
 *    look;
 *  - the host keys (PREFIX .hosts/), for the sessions of other hosts and
 *    lock-delay.
 *
 * A name becomes watched by a range read of R(NAME) at revision R, into
 * the mirror, and a watch of R(NAME) from R + 1 in the watch set (one
 * WebSocket stream, core/etcd/wset.c); it is dropped, and its watch
 * cancelled, by the session thread's tick once nothing needs it.  Nothing
 * else flows to the daemon.
 *
 * A name only waited for here (no key of this daemon heads it, nobody
 * looks at it or follows it, no lock-delay, no undo pending) is narrowed
 * by that tick to the key just ahead of this daemon's first key, as
 * etcd's Mutex does: the other waiters' comings and goings, and other
 * hosts' hand-offs ahead, cost it nothing.  When that key goes, the name
 * is read again and watched again: narrowed to the next key ahead, or
 * whole when this daemon's key heads it.  A look or a follow widens it at
 * once (a read, then the whole range).  readdir is a range read of the whole prefix
 * (keys only), kept ETCD_LIST_CACHE_MS.  See docs/etcd.md "What a daemon
 * watches".
 *
 * A reader of events is interest too (lockfs_etcdbe_follow): names it
 * follows are kept as entries; while one follows every name, the whole
 * prefix is read and watched (as during the startup scan), until the last
 * such reader closes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "etcd.h"

static size_t bucket_of(const char *name)
{
	uint64_t h = 1469598103934665603u;

	for (; *name; name++)
		h = (h ^ (unsigned char)*name) * 1099511628211u;
	return h % ETCD_INTEREST_BUCKETS;
}

static struct etcd_interest_entry *find_locked(struct etcd_interest *in, const char *name)
{
	for (struct etcd_interest_entry *x = in->buckets[bucket_of(name)]; x; x = x->next)
		if (strcmp(x->name, name) == 0)
			return x;
	return NULL;
}

/* Does a reader of events follow NAME?  With IN->mu held. */
static bool is_followed_locked(const struct etcd_interest *in, const char *name)
{
	for (size_t i = 0; i < in->n_followed; i++)
		if (strcmp(in->followed[i], name) == 0)
			return true;
	return false;
}

/* R(NAME): PREFIX NAME "/" and its range end.  0; -ENAMETOOLONG. */
static int range_of(struct etcd_store *e, const char *name, char key[LOCKFS_STORE_KEY_MAX],
		    char end[LOCKFS_STORE_KEY_MAX])
{
	int n = snprintf(key, LOCKFS_STORE_KEY_MAX, "%s%s/", e->prefix, name);

	if (n < 0 || n >= LOCKFS_STORE_KEY_MAX - 40 || !*name || strchr(name, '/'))
		return -ENAMETOOLONG;
	end[lockfs_etcd_prefix_end(key, (size_t)n, end)] = '\0';
	return 0;
}

/* This daemon's leases: the current one and the lost ones. */
struct our_leases {
	int64_t v[9];
	size_t n;
};

static void our_leases(struct etcd_store *e, struct our_leases *o)
{
	struct etcd_session *s = &e->session;

	pthread_mutex_lock(&s->mu);
	o->n = 0;
	o->v[o->n++] = s->lease;
	for (size_t i = 0; i < s->n_lost && o->n < 9; i++)
		o->v[o->n++] = s->lost_leases[i];
	pthread_mutex_unlock(&s->mu);
}

static bool is_ours(void *arg, int64_t lease)
{
	const struct our_leases *o = arg;

	for (size_t i = 0; i < o->n; i++)
		if (o->v[i] == lease)
			return true;
	return false;
}

/* May X be narrowed to the key ahead?  Then that key into AHEAD, and the
 * revision to watch it from; else 0.  With IN->mu held. */
static int64_t narrow_from_locked(struct etcd_store *e, const struct etcd_interest_entry *x,
				  struct our_leases *ours, char ahead[LOCKFS_STORE_KEY_MAX])
{
	struct etcd_interest *in = &e->interest;
	int64_t from;

	if (in->scanning || in->follow_all || x->look_until_ms > lockfs_boot_ms() ||
	    is_followed_locked(in, x->name) || lockfs_etcdbe_session_pending_name(e, x->name))
		return 0;
	pthread_mutex_lock(&e->mirror.mu);
	from = lockfs_etcdbe_mirror_ahead_locked(&e->mirror, x->name, lockfs_wall_ms(), is_ours,
						 ours, ahead, LOCKFS_STORE_KEY_MAX);
	pthread_mutex_unlock(&e->mirror.mu);
	return from;
}

bool lockfs_etcdbe_heads_here(struct etcd_store *e, const char *name)
{
	struct our_leases ours;
	bool heads;

	our_leases(e, &ours);
	pthread_mutex_lock(&e->mirror.mu);
	heads = lockfs_etcdbe_mirror_heads_locked(&e->mirror, name, lockfs_wall_ms(), is_ours,
						  &ours);
	pthread_mutex_unlock(&e->mirror.mu);
	return heads;
}

/* Stop X's watch, whatever it was: the caller reads X again (its watch_id
 * 0 says so to reload_name and to the tick).  With IN->mu held. */
static void unwatch_locked(struct etcd_interest *in, struct etcd_interest_entry *x)
{
	if (x->watch_id)
		lockfs_etcd_wset_cancel(in->wset, x->watch_id);
	x->watch_id = 0;
	x->ahead = false;
}

static int64_t add_watch(struct etcd_store *e, const char *name, int64_t from)
{
	char key[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];

	if (range_of(e, name, key, end))
		return 0;
	return lockfs_etcd_wset_add(e->interest.wset, key, end, from);
}

/* A name's lock-delay that began before this daemon watched it: a session
 * that ended at REV (its host key went, which the host keys' watch saw)
 * while its key headed R(NAME).  One read of R(NAME) at REV - 1 per such
 * session within lock_delay.  *UNTIL_MS: 0 or the delay's end. */
static void delay_before(struct etcd_store *e, const char *name, int64_t *until_ms)
{
	struct etcd_expiry recent[ETCD_EXPIRIES];
	size_t n = 0;
	int64_t now = lockfs_wall_ms();
	char key[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];

	*until_ms = 0;
	if (!e->lock_delay_s || range_of(e, name, key, end))
		return;
	pthread_mutex_lock(&e->mirror.mu);
	for (size_t i = 0; i < e->n_expiries && i < ETCD_EXPIRIES; i++)
		if (e->expiries[i].at_ms + e->lock_delay_s * 1000 > now)
			recent[n++] = e->expiries[i];
	pthread_mutex_unlock(&e->mirror.mu);
	for (size_t i = 0; i < n; i++) {
		struct lockfs_etcd_op op = {
			.type = LOCKFS_ETCD_RANGE, .key = key, .range_end = end, .limit = 1,
			.revision = recent[i].rev - 1, .sort_order = LOCKFS_ETCD_SORT_ASCEND,
			.sort_target = LOCKFS_ETCD_SORT_CREATE, .keys_only = true,
		};
		struct lockfs_etcd_op_resp r;

		if (lockfs_etcd_range(e->client, &op, &r) < 0)
			continue;
		if (r.n_kvs && r.kvs[0].lease == recent[i].lease &&
		    recent[i].at_ms + e->lock_delay_s * 1000 > *until_ms)
			*until_ms = recent[i].at_ms + e->lock_delay_s * 1000;
		lockfs_etcd_op_resp_free(&r);
	}
}

/* NAME to CHANGED (anything may have changed in it); on no memory, all. */
static void changed_add(struct etcd_names *changed, const char *name)
{
	char **v = realloc(changed->v, (changed->n + 1) * sizeof(*v));

	if (v) {
		changed->v = v;
		changed->cap = changed->n + 1;
	}
	if (v && (v[changed->n] = strdup(name)) != NULL)
		changed->n++;
	else
		changed->all = true;
}

/* Read NAME afresh and watch it again: its watch was lost (compacted),
 * never made, or stopped (watch_id 0).  Watched whole, or only the key
 * ahead when that is all this daemon needs of it.  Without IN->mu (it
 * asks etcd); the tick tries again when etcd does not answer. */
static void reload_name(struct etcd_store *e, const char *name, struct etcd_names *changed)
{
	struct etcd_interest *in = &e->interest;
	char key[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX], ahead[LOCKFS_STORE_KEY_MAX];
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = key, .range_end = end };
	struct lockfs_etcd_op_resp r;
	struct etcd_interest_entry *x;
	struct our_leases ours;

	if (range_of(e, name, key, end) || lockfs_etcd_range(e->client, &op, &r))
		return;
	our_leases(e, &ours);
	pthread_mutex_lock(&in->mu);
	x = find_locked(in, name);
	if (x && !x->watch_id &&
	    lockfs_etcdbe_mirror_load_name(&e->mirror, name, r.kvs, r.n_kvs, r.revision,
					   lockfs_wall_ms()) == 0) {
		x->ahead = narrow_from_locked(e, x, &ours, ahead) != 0;
		x->watch_id = x->ahead ? lockfs_etcd_wset_add(in->wset, ahead, NULL, r.revision + 1)
				       : add_watch(e, name, r.revision + 1);
		if (x->watch_id <= 0) {
			x->watch_id = 0;
			x->ahead = false;
		}
		changed_add(changed, name);
	}
	pthread_mutex_unlock(&in->mu);
	lockfs_etcd_op_resp_free(&r);
}

/* NAME, its watch just stopped by an op (a look, a follow), read and
 * watched whole again.  An op may not report a change (the engine may
 * hold what its callback takes): what the read brings is told at the
 * next tick. */
static void widen(struct etcd_store *e, const char *name)
{
	struct etcd_names changed = { 0 };

	reload_name(e, name, &changed);
	lockfs_etcdbe_names_free(&changed);
	pthread_mutex_lock(&e->interest.mu);
	changed_add(&e->interest.later, name);
	pthread_mutex_unlock(&e->interest.mu);
}

int lockfs_etcdbe_look(struct etcd_store *e, const char *name, bool look)
{
	struct etcd_interest *in = &e->interest;
	struct etcd_interest_entry *x;
	char key[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = key, .range_end = end };
	struct lockfs_etcd_op_resp r;
	int64_t delay_until;
	int rc;

	pthread_mutex_lock(&in->mu);
	x = in->scanning ? NULL : find_locked(in, name);
	/* Narrowed to the key ahead: a look, or a reader following NAME,
	 * needs all of it, now. */
	if (x && x->ahead && (look || is_followed_locked(in, name))) {
		if (look)
			x->look_until_ms = lockfs_boot_ms() + ETCD_LOOK_MS;
		unwatch_locked(in, x);
		pthread_mutex_unlock(&in->mu);
		widen(e, name);
		return 0;
	}
	/* The whole prefix in the mirror (the scan; every name followed,
	 * once read): nothing to read, and no second watch of NAME. */
	if (in->scanning || (in->follow_all && in->follow_id) || x) {
		if (x && look)
			x->look_until_ms = lockfs_boot_ms() + ETCD_LOOK_MS;
		pthread_mutex_unlock(&in->mu);
		return 0;
	}
	pthread_mutex_unlock(&in->mu);
	rc = range_of(e, name, key, end);
	if (rc || lockfs_etcdbe_reserved(name))
		return -ENOENT;  /* no lock has such a name */
	/* etcd is known to be out of reach: say so at once rather than make
	 * every lookup wait for the bound. */
	if (__atomic_load_n(&e->unreachable, __ATOMIC_ACQUIRE))
		return -EIO;
	rc = lockfs_etcd_range(e->client, &op, &r);
	if (rc) {
		if (rc != -ENOMEM)
			lockfs_etcdbe_say_unreachable(e, rc);
		return rc == -ENOMEM ? rc : -EIO;
	}
	delay_before(e, name, &delay_until);
	pthread_mutex_lock(&in->mu);
	x = find_locked(in, name);
	if (!x) {
		x = calloc(1, sizeof(*x));
		if (!x || !(x->name = strdup(name)) ||
		    (rc = lockfs_etcdbe_mirror_load_name(&e->mirror, name, r.kvs, r.n_kvs, r.revision,
							 lockfs_wall_ms())) != 0) {
			if (x)
				free(x->name);
			free(x);
			pthread_mutex_unlock(&in->mu);
			lockfs_etcd_op_resp_free(&r);
			return -ENOMEM;
		}
		if (delay_until)
			lockfs_etcdbe_mirror_set_delay(&e->mirror, name, delay_until);
		x->watch_id = add_watch(e, name, r.revision + 1);
		if (x->watch_id < 0)
			x->watch_id = 0;  /* the tick tries again */
		x->next = in->buckets[bucket_of(name)];
		in->buckets[bucket_of(name)] = x;
		in->count++;
	}
	if (look)
		x->look_until_ms = lockfs_boot_ms() + ETCD_LOOK_MS;
	pthread_mutex_unlock(&in->mu);
	lockfs_etcd_op_resp_free(&r);
	return 0;
}

/* The host keys afresh, and their watch again (without IN->mu). */
static void reload_hosts(struct etcd_store *e)
{
	struct etcd_interest *in = &e->interest;
	char key[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = key, .range_end = end };
	struct lockfs_etcd_op_resp r;

	if (range_of(e, ".hosts", key, end) || lockfs_etcd_range(e->client, &op, &r))
		return;
	pthread_mutex_lock(&in->mu);
	if (!in->hosts_id &&
	    lockfs_etcdbe_mirror_load_hosts(&e->mirror, r.kvs, r.n_kvs, r.revision) == 0) {
		in->hosts_id = lockfs_etcd_wset_add(in->wset, key, end, r.revision + 1);
		if (in->hosts_id < 0)
			in->hosts_id = 0;
	}
	pthread_mutex_unlock(&in->mu);
	lockfs_etcd_op_resp_free(&r);
}

/* ---- Every name followed (a reader of events with no names) ---- */

struct follow_load {
	struct etcd_store *e;
	const struct lockfs_etcd_op_resp *r;  /* the prefix, sorted by key */
};

/* The first of R's keys not below KEY (etcd returns a range sorted by key). */
static size_t lower_bound(const struct lockfs_etcd_op_resp *r, const char *key)
{
	size_t lo = 0, hi = r->n_kvs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(r->kvs[mid].key, key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* NAME as the prefix's read shows it, unless it has a watch of its own.
 * With IN->mu held (mirror_each's callback). */
static int follow_load_name(void *arg, const char *name)
{
	struct follow_load *w = arg;
	struct etcd_store *e = w->e;
	char key[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];
	size_t first, n = 0;

	if (find_locked(&e->interest, name) || range_of(e, name, key, end))
		return 0;
	first = lower_bound(w->r, key);
	while (first + n < w->r->n_kvs && strcmp(w->r->kvs[first + n].key, end) < 0)
		n++;
	(void)lockfs_etcdbe_mirror_load_name(&e->mirror, name, w->r->kvs + first, n,
					     w->r->revision, lockfs_wall_ms());
	return 0;
}

/*
 * Every name followed: read the whole prefix, put each name without a
 * watch of its own into the mirror as it shows (and take out the keys
 * of those it no longer shows), and watch the prefix from after the read.
 * Without IN->mu (it asks etcd).  Nothing is reported: a reader sees what
 * changes from now on.  When etcd does not answer, the sweep tries again.
 */
static void follow_prefix(struct etcd_store *e)
{
	struct etcd_interest *in = &e->interest;
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = e->prefix, .prefix = true };
	struct lockfs_etcd_op_resp r;
	struct follow_load w = { .e = e, .r = &r };
	char name[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];

	if (lockfs_etcd_range(e->client, &op, &r))
		return;
	pthread_mutex_lock(&in->mu);
	if (in->follow_all && !in->follow_id) {
		/* Names the mirror has that the read may not show... */
		(void)lockfs_etcdbe_mirror_each(&e->mirror, follow_load_name, &w);
		/* ... and those it shows. */
		for (size_t i = 0; i < r.n_kvs; i++)
			if (lockfs_etcdbe_mirror_classify(&e->mirror, r.kvs[i].key, name,
							  sizeof(name)) == 1 &&
			    (i == 0 || strncmp(r.kvs[i - 1].key, r.kvs[i].key,
					       strlen(e->prefix) + strlen(name) + 1) != 0))
				(void)follow_load_name(&w, name);
		end[lockfs_etcd_prefix_end(e->prefix, strlen(e->prefix), end)] = '\0';
		in->follow_next = r.revision + 1;
		in->follow_id = lockfs_etcd_wset_add(in->wset, e->prefix, end, in->follow_next);
		if (in->follow_id < 0)
			in->follow_id = 0;  /* the sweep tries again */
	}
	pthread_mutex_unlock(&in->mu);
	lockfs_etcd_op_resp_free(&r);
}

/* The prefix watch's events of names without a watch of their own (the
 * others' come through theirs) and of the host keys.  With IN->mu held. */
static void follow_apply_locked(struct etcd_store *e, const struct lockfs_etcd_wset_msg *msg,
				const bool ended[ETCD_JUDGED], struct etcd_names *changed,
				struct etcd_names *own)
{
	struct etcd_interest *in = &e->interest;
	struct lockfs_etcd_event *kept = malloc((msg->n_events ? msg->n_events : 1) * sizeof(*kept));
	bool kept_ended[ETCD_JUDGED] = { false };
	char name[LOCKFS_STORE_KEY_MAX];
	size_t n = 0;

	if (!kept) {
		changed->all = true;  /* and the events are lost: read again */
		lockfs_etcd_wset_cancel(in->wset, in->follow_id);
		in->follow_id = 0;
		return;
	}
	for (size_t i = 0; i < msg->n_events; i++) {
		if (lockfs_etcdbe_mirror_classify(&e->mirror, msg->events[i].kv.key, name,
						  sizeof(name)) == 1 && find_locked(in, name))
			continue;
		if (n < ETCD_JUDGED && i < ETCD_JUDGED)
			kept_ended[n] = ended[i];
		kept[n++] = msg->events[i];
	}
	lockfs_etcdbe_apply_events(e, ETCD_WATCH_PREFIX, NULL, kept, n, kept_ended,
				   msg->next_revision, changed, own);
	in->follow_next = msg->next_revision;
	free(kept);
}

static void on_wset(void *arg, const struct lockfs_etcd_wset_msg *msg)
{
	struct etcd_store *e = arg;
	struct etcd_interest *in = &e->interest;
	struct etcd_names changed = { 0 }, own = { .own = true };
	char name[LOCKFS_STORE_KEY_MAX];

	switch (msg->kind) {
	case LOCKFS_ETCD_WSET_UP:
	case LOCKFS_ETCD_WSET_DOWN:
		pthread_mutex_lock(&e->mirror.mu);
		e->mirror.watching = msg->kind == LOCKFS_ETCD_WSET_UP;
		pthread_mutex_unlock(&e->mirror.mu);
		return;
	case LOCKFS_ETCD_WSET_EVENTS: {
		enum etcd_watch_of of;
		bool ended[ETCD_JUDGED];
		char *ahead_gone = NULL;

		/* Judged without IN->mu: it may ask etcd, and looks wait on it. */
		pthread_mutex_lock(&in->mu);
		of = msg->id == in->hosts_id ? ETCD_WATCH_HOSTS :
		     (in->scanning && msg->id == in->scan_id) ||
		     (in->follow_id && msg->id == in->follow_id) ? ETCD_WATCH_PREFIX :
		     ETCD_WATCH_NAME;
		pthread_mutex_unlock(&in->mu);
		lockfs_etcdbe_judge_events(e, of, msg->events, msg->n_events, ended);
		pthread_mutex_lock(&in->mu);
		if (msg->id == in->hosts_id) {
			lockfs_etcdbe_apply_events(e, ETCD_WATCH_HOSTS, NULL, msg->events,
						   msg->n_events, ended, msg->next_revision, &changed,
						   &own);
		} else if (in->scanning && msg->id == in->scan_id) {
			lockfs_etcdbe_apply_events(e, ETCD_WATCH_PREFIX, NULL, msg->events,
						   msg->n_events, ended, msg->next_revision, &changed,
						   &own);
			in->scan_next = msg->next_revision;
		} else if (in->follow_id && msg->id == in->follow_id) {
			follow_apply_locked(e, msg, ended, &changed, &own);
		} else if (msg->n_events &&
			   lockfs_etcdbe_mirror_classify(&e->mirror, msg->events[0].kv.key, name,
							 sizeof(name)) == 1) {
			struct etcd_interest_entry *x = find_locked(in, name);

			/* A watch cancelled meanwhile: its name may be gone. */
			if (x && x->watch_id == msg->id) {
				lockfs_etcdbe_apply_events(e, ETCD_WATCH_NAME, x->name, msg->events,
							   msg->n_events, ended, msg->next_revision,
							   &changed, &own);
				/* The key ahead went: read NAME again, to
				 * watch the next key ahead, or all of NAME
				 * once this daemon's key heads it. */
				for (size_t i = 0; x->ahead && i < msg->n_events; i++)
					if (msg->events[i].type == LOCKFS_ETCD_EVENT_DELETE) {
						unwatch_locked(in, x);
						ahead_gone = strdup(x->name);
						if (!ahead_gone)
							changed.all = true;
					}
			}
		}
		pthread_mutex_unlock(&in->mu);
		if (ahead_gone && lockfs_etcdbe_heads_here(e, ahead_gone)) {
			/* The hand-off: told first, so the claim (whose
			 * compare is the proof) runs beside the read. */
			lockfs_etcdbe_report_both(e, &changed, &own);
			changed = (struct etcd_names){ 0 };
			own = (struct etcd_names){ .own = true };
		}
		if (ahead_gone)
			reload_name(e, ahead_gone, &changed);
		free(ahead_gone);
		lockfs_etcdbe_report_both(e, &changed, &own);
		/* After the report; a waiter's claim here judges its own. */
		changed = (struct etcd_names){ 0 };
		own = (struct etcd_names){ .own = true };
		lockfs_etcdbe_settle_unclaimed(e, lockfs_etcdbe_heads_here, &changed);
		lockfs_etcdbe_report_both(e, &changed, &own);
		return;
	}
	case LOCKFS_ETCD_WSET_LOST:
		pthread_mutex_lock(&in->mu);
		if (msg->id == in->hosts_id) {
			in->hosts_id = 0;
			pthread_mutex_unlock(&in->mu);
			reload_hosts(e);
			return;
		} else if (in->follow_id && msg->id == in->follow_id) {
			/* Compacted: read the prefix again. */
			in->follow_id = 0;
			pthread_mutex_unlock(&in->mu);
			follow_prefix(e);
			changed.all = true;
			lockfs_etcdbe_report_both(e, &changed, &own);
			return;
		} else if (in->scanning && msg->id == in->scan_id) {
			/* Compacted during the scan: read the prefix again. */
			struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = e->prefix,
						     .prefix = true };
			struct lockfs_etcd_op_resp r;
			char end[LOCKFS_STORE_KEY_MAX];

			end[lockfs_etcd_prefix_end(e->prefix, strlen(e->prefix), end)] = '\0';
			if (lockfs_etcd_range(e->client, &op, &r) == 0) {
				if (lockfs_etcdbe_mirror_load(&e->mirror, r.kvs, r.n_kvs, r.revision,
							      lockfs_wall_ms()) == 0)
					in->scan_next = r.revision + 1;
				lockfs_etcd_op_resp_free(&r);
			}
			in->scan_id = lockfs_etcd_wset_add(in->wset, e->prefix, end, in->scan_next);
			changed.all = true;
		} else {
			char *lost = NULL;

			for (size_t b = 0; b < ETCD_INTEREST_BUCKETS && !lost; b++)
				for (struct etcd_interest_entry *x = in->buckets[b]; x && !lost;
				     x = x->next)
					if (x->watch_id == msg->id) {
						x->watch_id = 0;
						lost = strdup(x->name);
					}
			pthread_mutex_unlock(&in->mu);
			if (lost)
				reload_name(e, lost, &changed);
			free(lost);
			lockfs_etcdbe_report_both(e, &changed, &own);
			return;
		}
		pthread_mutex_unlock(&in->mu);
		lockfs_etcdbe_report_both(e, &changed, &own);
		return;
	}
}

int lockfs_etcdbe_interest_open(struct etcd_store *e, int64_t from)
{
	struct etcd_interest *in = &e->interest;
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = e->prefix, .prefix = true };
	struct lockfs_etcd_op_resp r;
	char key[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];
	int rc;

	(void)from;
	pthread_mutex_init(&in->mu, NULL);
	pthread_mutex_init(&in->list_mu, NULL);
	/* The whole prefix once, for the startup scan (adoption judges every
	 * lock of this host); start() keeps what is needed. */
	rc = lockfs_etcd_range(e->client, &op, &r);
	if (rc)
		return rc;
	rc = lockfs_etcdbe_mirror_load(&e->mirror, r.kvs, r.n_kvs, r.revision, lockfs_wall_ms());
	in->scanning = true;
	in->scan_next = r.revision + 1;
	lockfs_etcd_op_resp_free(&r);
	if (rc)
		return rc;
	rc = lockfs_etcd_wset_open(&in->wset, e->client, (int)(e->ttl_s * 1000 / 3), on_wset, e);
	if (rc)
		return rc;
	if (range_of(e, ".hosts", key, end))
		return -ENAMETOOLONG;
	/* Under MU: their first events must find their ids set. */
	pthread_mutex_lock(&in->mu);
	in->hosts_id = lockfs_etcd_wset_add(in->wset, key, end, in->scan_next);
	end[lockfs_etcd_prefix_end(e->prefix, strlen(e->prefix), end)] = '\0';
	in->scan_id = lockfs_etcd_wset_add(in->wset, e->prefix, end, in->scan_next);
	rc = in->hosts_id < 0 || in->scan_id < 0 ? -ENOMEM : 0;
	pthread_mutex_unlock(&in->mu);
	return rc;
}

struct start_walk {
	struct etcd_store *e;
	struct our_leases ours;
	int64_t from;            /* the prefix watch's resume point */
};

static int keep_or_forget(void *arg, const char *name)
{
	struct start_walk *w = arg;
	struct etcd_store *e = w->e;
	struct etcd_interest *in = &e->interest;
	struct etcd_interest_entry *x;
	bool wanted;

	if (find_locked(in, name))
		return 0;  /* watched by itself all along */
	pthread_mutex_lock(&e->mirror.mu);
	wanted = lockfs_etcdbe_mirror_wanted_locked(&e->mirror, name, lockfs_wall_ms(), is_ours,
						    &w->ours);
	pthread_mutex_unlock(&e->mirror.mu);
	if (!wanted)
		wanted = is_followed_locked(in, name);
	if (!wanted)
		wanted = lockfs_etcdbe_session_pending_name(e, name);
	if (!wanted) {
		pthread_mutex_lock(&e->mirror.mu);
		lockfs_etcdbe_mirror_forget_locked(&e->mirror, name);
		pthread_mutex_unlock(&e->mirror.mu);
		return 0;
	}
	x = calloc(1, sizeof(*x));
	if (!x || !(x->name = strdup(name))) {
		free(x);
		return 0;  /* not watched: the next look reads it */
	}
	/* Every event the prefix's watch did not bring yet. */
	x->watch_id = add_watch(e, name, w->from);
	if (x->watch_id < 0)
		x->watch_id = 0;
	x->next = in->buckets[bucket_of(name)];
	in->buckets[bucket_of(name)] = x;
	in->count++;
	return 0;
}

void lockfs_etcdbe_interest_start(struct etcd_store *e)
{
	struct etcd_interest *in = &e->interest;
	struct start_walk w = { .e = e };

	bool follow;

	our_leases(e, &w.ours);
	pthread_mutex_lock(&in->mu);
	if (in->scanning) {
		in->scanning = false;
		lockfs_etcd_wset_cancel(in->wset, in->scan_id);
		in->scan_id = 0;
		w.from = in->scan_next;
		(void)lockfs_etcdbe_mirror_each(&e->mirror, keep_or_forget, &w);
	}
	/* A reader that followed every name during the scan. */
	follow = in->follow_all = in->follow_all_wanted;
	pthread_mutex_unlock(&in->mu);
	if (follow)
		follow_prefix(e);
}

/* Nobody follows every name any more: the prefix's watch goes, and each
 * name it brought is kept (watched by itself from where the prefix's
 * watch stopped) if it is needed here, else forgotten.  IN->mu held. */
static void follow_all_end_locked(struct etcd_store *e)
{
	struct etcd_interest *in = &e->interest;
	struct start_walk w = { .e = e, .from = in->follow_next };

	our_leases(e, &w.ours);
	if (in->follow_id)
		lockfs_etcd_wset_cancel(in->wset, in->follow_id);
	in->follow_all = false;
	in->follow_id = 0;
	(void)lockfs_etcdbe_mirror_each(&e->mirror, keep_or_forget, &w);
}

/* Every name followed: the prefix's watch skips names with an entry, so a
 * narrowed one is read and watched whole. */
static void widen_all_narrowed(struct etcd_store *e)
{
	struct etcd_interest *in = &e->interest;
	struct etcd_names narrowed = { 0 };

	pthread_mutex_lock(&in->mu);
	for (size_t b = 0; b < ETCD_INTEREST_BUCKETS; b++)
		for (struct etcd_interest_entry *x = in->buckets[b]; x; x = x->next)
			if (x->ahead) {
				unwatch_locked(in, x);
				changed_add(&narrowed, x->name);
			}
	pthread_mutex_unlock(&in->mu);
	for (size_t i = 0; i < narrowed.n; i++)
		widen(e, narrowed.v[i]);
	lockfs_etcdbe_names_free(&narrowed);
}

int lockfs_etcdbe_follow(struct lockfs_backend *be, bool all, const char *const *names, size_t n)
{
	struct etcd_store *e = (struct etcd_store *)be;
	struct etcd_interest *in = &e->interest;
	char **copy = n ? calloc(n, sizeof(*copy)) : NULL, **old;
	size_t n_old;
	bool begin;
	int rc = 0;

	if (n && !copy)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (!(copy[i] = strdup(names[i]))) {
			while (i--)
				free(copy[i]);
			free(copy);
			return -ENOMEM;
		}
	pthread_mutex_lock(&in->mu);
	old = in->followed;
	n_old = in->n_followed;
	in->followed = copy;
	in->n_followed = n;
	begin = all && !in->follow_all && !in->scanning;
	if (in->scanning)
		in->follow_all_wanted = all;  /* start() begins it */
	else if (begin)
		in->follow_all = true;
	else if (!all && in->follow_all)
		follow_all_end_locked(e);
	pthread_mutex_unlock(&in->mu);
	for (size_t i = 0; i < n_old; i++)
		free(old[i]);
	free(old);
	if (begin) {
		follow_prefix(e);
		widen_all_narrowed(e);
	}
	/* Each name watched (read first; a narrowed one read whole); the
	 * sweep drops the ones nobody follows any more once nothing else
	 * needs them. */
	for (size_t i = 0; i < n; i++) {
		int one = lockfs_etcdbe_look(e, names[i], false);

		if (one == -EIO || one == -ENOMEM)
			rc = one;
	}
	if (begin && !__atomic_load_n(&in->follow_id, __ATOMIC_RELAXED))
		rc = -EIO;
	return rc;
}

void lockfs_etcdbe_watch_own(struct etcd_store *e, const char *name, int64_t from)
{
	struct etcd_interest *in = &e->interest;
	struct etcd_interest_entry *x;

	pthread_mutex_lock(&in->mu);
	if (!in->scanning && !(in->follow_all && in->follow_id) && !find_locked(in, name)) {
		x = calloc(1, sizeof(*x));
		if (x && (x->name = strdup(name)) != NULL) {
			x->watch_id = add_watch(e, name, from);
			if (x->watch_id < 0)
				x->watch_id = 0;
			x->next = in->buckets[bucket_of(name)];
			in->buckets[bucket_of(name)] = x;
			in->count++;
		} else {
			free(x);
		}
	}
	pthread_mutex_unlock(&in->mu);
}

/* A name with an undo pending is watched, so that a late arrival of the
 * write shows (struct etcd_pending). */
static int watch_pending(void *arg, const char *name)
{
	(void)lockfs_etcdbe_look(arg, name, false);
	return 0;
}

/* Followed names that are not watched (etcd did not answer): again. */
static void follow_names_again(struct etcd_store *e)
{
	struct etcd_interest *in = &e->interest;
	struct etcd_names missing = { 0 };

	pthread_mutex_lock(&in->mu);
	for (size_t i = 0; !in->follow_all && i < in->n_followed; i++)
		if (!find_locked(in, in->followed[i]))
			changed_add(&missing, in->followed[i]);
	pthread_mutex_unlock(&in->mu);
	for (size_t i = 0; i < missing.n; i++)
		(void)lockfs_etcdbe_look(e, missing.v[i], false);
	lockfs_etcdbe_names_free(&missing);
}

/* At the tick: a name only waited for here is narrowed to the key ahead
 * of this daemon's first key, from where its whole watch stopped (nothing
 * of that key is missed); a narrowed one that needs more now (this
 * daemon's key heads it, a lock-delay, an undo) stops its watch, to be
 * read and watched whole.  With IN->mu held. */
static void narrow_or_widen_locked(struct etcd_store *e, struct etcd_interest_entry *x,
				   struct our_leases *ours)
{
	struct etcd_interest *in = &e->interest;
	char ahead[LOCKFS_STORE_KEY_MAX];
	int64_t from;

	if (!x->watch_id)
		return;  /* read and watched again below */
	from = narrow_from_locked(e, x, ours, ahead);
	if (x->ahead) {
		if (!from)
			unwatch_locked(in, x);
		return;
	}
	if (!from)
		return;
	lockfs_etcd_wset_cancel(in->wset, x->watch_id);
	x->watch_id = lockfs_etcd_wset_add(in->wset, ahead, NULL, from);
	x->ahead = x->watch_id > 0;
	if (x->watch_id < 0)
		x->watch_id = 0;
}

void lockfs_etcdbe_interest_sweep(struct etcd_store *e)
{
	struct etcd_interest *in = &e->interest;
	struct etcd_names changed = { 0 }, own = { .own = true }, retry = { 0 };
	struct our_leases ours;
	int64_t now = lockfs_boot_ms();
	bool hosts_lost;

	bool follow_again;

	lockfs_etcdbe_session_pending_each(e, watch_pending, e);
	follow_names_again(e);
	our_leases(e, &ours);
	pthread_mutex_lock(&in->mu);
	if (in->scanning) {
		pthread_mutex_unlock(&in->mu);
		return;
	}
	for (size_t b = 0; b < ETCD_INTEREST_BUCKETS; b++) {
		struct etcd_interest_entry **pp = &in->buckets[b];

		while (*pp) {
			struct etcd_interest_entry *x = *pp;
			/* (While every name is followed, no entry goes: the
			 * prefix's watch skips the names that have one.) */
			bool wanted = x->look_until_ms > now || in->follow_all ||
				      is_followed_locked(in, x->name);

			if (!wanted) {
				pthread_mutex_lock(&e->mirror.mu);
				wanted = lockfs_etcdbe_mirror_wanted_locked(&e->mirror, x->name,
									    lockfs_wall_ms(), is_ours,
									    &ours);
				pthread_mutex_unlock(&e->mirror.mu);
			}
			if (!wanted)
				wanted = lockfs_etcdbe_session_pending_name(e, x->name);
			if (wanted) {
				narrow_or_widen_locked(e, x, &ours);
				if (!x->watch_id)
					changed_add(&retry, x->name);
				pp = &x->next;
				continue;
			}
			if (x->watch_id)
				lockfs_etcd_wset_cancel(in->wset, x->watch_id);
			pthread_mutex_lock(&e->mirror.mu);
			lockfs_etcdbe_mirror_forget_locked(&e->mirror, x->name);
			pthread_mutex_unlock(&e->mirror.mu);
			*pp = x->next;
			in->count--;
			free(x->name);
			free(x);
		}
	}
	hosts_lost = !in->hosts_id;
	follow_again = in->follow_all && !in->follow_id;
	for (size_t i = 0; i < in->later.n; i++)
		changed_add(&changed, in->later.v[i]);
	changed.all = changed.all || in->later.all;
	lockfs_etcdbe_names_free(&in->later);
	pthread_mutex_unlock(&in->mu);
	if (follow_again)
		follow_prefix(e);
	/* Watches that could not be made: read and watch them again. */
	if (hosts_lost)
		reload_hosts(e);
	for (size_t i = 0; i < retry.n; i++)
		reload_name(e, retry.v[i], &changed);
	lockfs_etcdbe_names_free(&retry);
	lockfs_etcdbe_report_both(e, &changed, &own);
}

int lockfs_etcdbe_watch_reopen(struct etcd_store *e, int64_t from, bool *resync)
{
	(void)from;
	*resync = false;
	if (e->interest.wset)
		lockfs_etcd_wset_restart(e->interest.wset);
	return 0;
}

void lockfs_etcdbe_interest_close(struct etcd_store *e)
{
	struct etcd_interest *in = &e->interest;

	if (in->wset)
		lockfs_etcd_wset_close(in->wset);
	in->wset = NULL;
	for (size_t b = 0; b < ETCD_INTEREST_BUCKETS; b++)
		while (in->buckets[b]) {
			struct etcd_interest_entry *x = in->buckets[b];

			in->buckets[b] = x->next;
			free(x->name);
			free(x);
		}
	lockfs_etcdbe_names_free(&in->later);
	for (size_t i = 0; i < in->n_followed; i++)
		free(in->followed[i]);
	free(in->followed);
	in->followed = NULL;
	in->n_followed = 0;
	for (size_t i = 0; i < in->n_list; i++)
		free(in->list[i]);
	free(in->list);
	in->list = NULL;
	in->n_list = 0;
}
