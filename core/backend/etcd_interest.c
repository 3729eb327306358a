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
 * else flows to the daemon.  readdir is a range read of the whole prefix
 * (keys only), kept ETCD_LIST_CACHE_MS.  See docs/etcd.md "What a daemon
 * watches".
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
	if (in->scanning || x) {
		if (x && look)
			x->look_until_ms = lockfs_boot_ms() + ETCD_LOOK_MS;
		pthread_mutex_unlock(&in->mu);
		return 0;
	}
	pthread_mutex_unlock(&in->mu);
	rc = range_of(e, name, key, end);
	if (rc || name[0] == '.')
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

/* Read NAME afresh and watch it again: its watch was lost (compacted) or
 * never made (watch_id 0).  Without IN->mu (it asks etcd); the tick tries
 * again when etcd does not answer. */
static void reload_name(struct etcd_store *e, const char *name, struct etcd_names *changed)
{
	struct etcd_interest *in = &e->interest;
	char key[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = key, .range_end = end };
	struct lockfs_etcd_op_resp r;
	struct etcd_interest_entry *x;

	if (range_of(e, name, key, end) || lockfs_etcd_range(e->client, &op, &r))
		return;
	pthread_mutex_lock(&in->mu);
	x = find_locked(in, name);
	if (x && !x->watch_id &&
	    lockfs_etcdbe_mirror_load_name(&e->mirror, name, r.kvs, r.n_kvs, r.revision,
					   lockfs_wall_ms()) == 0) {
		x->watch_id = add_watch(e, name, r.revision + 1);
		if (x->watch_id < 0)
			x->watch_id = 0;
		changed_add(changed, name);
	}
	pthread_mutex_unlock(&in->mu);
	lockfs_etcd_op_resp_free(&r);
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

		/* Judged without IN->mu: it may ask etcd, and looks wait on it. */
		pthread_mutex_lock(&in->mu);
		of = msg->id == in->hosts_id ? ETCD_WATCH_HOSTS :
		     in->scanning && msg->id == in->scan_id ? ETCD_WATCH_PREFIX : ETCD_WATCH_NAME;
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
		} else if (msg->n_events &&
			   lockfs_etcdbe_mirror_classify(&e->mirror, msg->events[0].kv.key, name,
							 sizeof(name)) == 1) {
			struct etcd_interest_entry *x = find_locked(in, name);

			/* A watch cancelled meanwhile: its name may be gone. */
			if (x && x->watch_id == msg->id)
				lockfs_etcdbe_apply_events(e, ETCD_WATCH_NAME, x->name, msg->events,
							   msg->n_events, ended, msg->next_revision,
							   &changed, &own);
		}
		pthread_mutex_unlock(&in->mu);
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
};

static int keep_or_forget(void *arg, const char *name)
{
	struct start_walk *w = arg;
	struct etcd_store *e = w->e;
	struct etcd_interest *in = &e->interest;
	struct etcd_interest_entry *x;
	bool wanted;

	pthread_mutex_lock(&e->mirror.mu);
	wanted = lockfs_etcdbe_mirror_wanted_locked(&e->mirror, name, lockfs_wall_ms(), is_ours,
						    &w->ours);
	pthread_mutex_unlock(&e->mirror.mu);
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
	x->watch_id = add_watch(e, name, in->scan_next);
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

	our_leases(e, &w.ours);
	pthread_mutex_lock(&in->mu);
	if (in->scanning) {
		in->scanning = false;
		lockfs_etcd_wset_cancel(in->wset, in->scan_id);
		in->scan_id = 0;
		(void)lockfs_etcdbe_mirror_each(&e->mirror, keep_or_forget, &w);
	}
	pthread_mutex_unlock(&in->mu);
}

void lockfs_etcdbe_watch_own(struct etcd_store *e, const char *name, int64_t from)
{
	struct etcd_interest *in = &e->interest;
	struct etcd_interest_entry *x;

	pthread_mutex_lock(&in->mu);
	if (!in->scanning && !find_locked(in, name)) {
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

void lockfs_etcdbe_interest_sweep(struct etcd_store *e)
{
	struct etcd_interest *in = &e->interest;
	struct etcd_names changed = { 0 }, own = { .own = true }, retry = { 0 };
	struct our_leases ours;
	int64_t now = lockfs_boot_ms();
	bool hosts_lost;

	lockfs_etcdbe_session_pending_each(e, watch_pending, e);
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
			bool wanted = x->look_until_ms > now;

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
	pthread_mutex_unlock(&in->mu);
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
	for (size_t i = 0; i < in->n_list; i++)
		free(in->list[i]);
	free(in->list);
	in->list = NULL;
	in->n_list = 0;
}
