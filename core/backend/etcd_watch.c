/*
 * The etcd store's events and reporting: what the watches of the names
 * this daemon needs (etcd_interest.c) and of the host keys bring is
 * applied to the mirror (etcd_mirror.c) -- every PUT and DELETE, host keys
 * that expire starting lock-delay -- and the names it changed go to the
 * engine's change callback (lockfs_etcdbe_report, which the session thread
 * reaches through its hooks).  Runs on the watch set's thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "etcd.h"

/* ---- Reporting ---- */

void lockfs_etcdbe_report(struct etcd_store *e, struct etcd_names *changed, bool session_changed)
{
	/* report_mu makes the watch thread and the session thread one
	 * reporter (never concurrently with itself); no op takes it. */
	pthread_mutex_lock(&e->report_mu);
	if (e->change) {
		if (changed->all)
			e->change(e->change_arg, LOCKFS_CHANGE_ALL, NULL);
		else
			for (size_t i = 0; i < changed->n; i++)
				e->change(e->change_arg,
					  changed->own ? LOCKFS_CHANGE_OWN : LOCKFS_CHANGE_NAME,
					  changed->v[i]);
		if (session_changed)
			e->change(e->change_arg, LOCKFS_CHANGE_SESSION, NULL);
	}
	pthread_mutex_unlock(&e->report_mu);
	lockfs_etcdbe_names_free(changed);
}

/* Remember that LEASE's host key went at REV (an expiry or a revoke: the
 * lease's keys went with it).  MIRROR_MU held. */
static void note_expiry_locked(struct etcd_store *e, int64_t lease, int64_t rev)
{
	struct etcd_expiry *x = &e->expiries[e->n_expiries++ % ETCD_EXPIRIES];

	x->lease = lease;
	x->rev = rev;
	x->at_ms = lockfs_wall_ms();
}

bool lockfs_etcdbe_expiry_locked(struct etcd_store *e, int64_t lease, int64_t rev,
				 int64_t *at_ms)
{
	size_t n = e->n_expiries < ETCD_EXPIRIES ? e->n_expiries : ETCD_EXPIRIES;

	for (size_t i = 0; i < n; i++)
		if (e->expiries[i].lease == lease && (!rev || e->expiries[i].rev == rev)) {
			if (at_ms)
				*at_ms = e->expiries[i].at_ms;
			return true;
		}
	return false;
}

/*
 * Was the delete of a key on LEASE at REV its session's end?  A session
 * ends by deleting its host key and all its keys in one revision; the
 * host keys' watch and a name's watch deliver their parts of that
 * revision in either order.  When the host watch has not told yet and
 * LEASE is a live lockfs host's, ASK etcd whether its host key was there
 * at REV (a release leaves it; an expiry took it along).
 */
static bool session_ended(struct etcd_store *e, int64_t lease, int64_t rev, bool ask)
{
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .revision = rev, .count_only = true };
	struct lockfs_etcd_op_resp r;
	char host[LOCKFS_HOST_MAX], key[LOCKFS_STORE_KEY_MAX + LOCKFS_HOST_MAX];
	bool known, ended;

	pthread_mutex_lock(&e->mirror.mu);
	known = lockfs_etcdbe_expiry_locked(e, lease, rev, NULL);
	pthread_mutex_unlock(&e->mirror.mu);
	if (known || !ask)
		return known;
	if (lockfs_etcdbe_mirror_host_of(&e->mirror, lease, host, sizeof(host)) < 0)
		return false;  /* not a lockfs session (etcdctl lock) */
	snprintf(key, sizeof(key), "%s.hosts/%s", e->prefix, host);
	op.key = key;
	if (lockfs_etcd_range(e->client, &op, &r) < 0)
		return false;  /* cannot tell: no delay, as for a release */
	ended = r.count == 0;
	lockfs_etcd_op_resp_free(&r);
	if (ended) {
		pthread_mutex_lock(&e->mirror.mu);
		if (!lockfs_etcdbe_expiry_locked(e, lease, rev, NULL))
			note_expiry_locked(e, lease, rev);
		pthread_mutex_unlock(&e->mirror.mu);
	}
	return ended;
}

void lockfs_etcdbe_judge_events(struct etcd_store *e, enum etcd_watch_of of,
				const struct lockfs_etcd_event *events, size_t n_events,
				bool ended[ETCD_JUDGED])
{
	struct etcd_mirror *m = &e->mirror;
	char host[LOCKFS_HOST_MAX], evname[LOCKFS_STORE_KEY_MAX];

	memset(ended, 0, ETCD_JUDGED * sizeof(*ended));

	/* Host keys deleted: those sessions ended at that revision.  (The
	 * prefix watch brings them in the same message as their keys.) */
	pthread_mutex_lock(&m->mu);
	for (size_t i = 0; of != ETCD_WATCH_NAME && i < n_events; i++) {
		const struct lockfs_etcd_event *ev = &events[i];
		int64_t lease = 0;

		if (ev->type == LOCKFS_ETCD_EVENT_DELETE &&
		    lockfs_etcdbe_mirror_classify(m, ev->kv.key, host, sizeof(host)) == 2 &&
		    lockfs_etcdbe_mirror_lease_locked(m, ev->kv.key, &lease) == 0 &&
		    !lockfs_etcdbe_expiry_locked(e, lease, ev->kv.mod_revision, NULL))
			note_expiry_locked(e, lease, ev->kv.mod_revision);
	}
	pthread_mutex_unlock(&m->mu);
	/* A name's deletes on a lease whose session may have ended: judged
	 * first, without the mirror's lock (it may ask etcd).  The watch
	 * carries no prev_kv (it would cost etcd a read and the daemon a
	 * record per delete): a deleted key's lease is the one the mirror
	 * has for it, or the one a PUT earlier in this message gave it. */
	for (size_t i = 0; of != ETCD_WATCH_HOSTS && e->lock_delay_s && i < n_events &&
	     i < ETCD_JUDGED; i++) {
		const struct lockfs_etcd_event *ev = &events[i];
		int64_t lease = 0;
		size_t j = i;

		if (ev->type != LOCKFS_ETCD_EVENT_DELETE ||
		    lockfs_etcdbe_mirror_classify(m, ev->kv.key, evname, sizeof(evname)) != 1)
			continue;
		while (j > 0 && !(events[j - 1].type == LOCKFS_ETCD_EVENT_PUT &&
				  strcmp(events[j - 1].kv.key, ev->kv.key) == 0))
			j--;
		pthread_mutex_lock(&m->mu);
		if (j > 0)
			lease = events[j - 1].kv.lease;
		else
			(void)lockfs_etcdbe_mirror_lease_locked(m, ev->kv.key, &lease);
		pthread_mutex_unlock(&m->mu);
		/* This daemon's own live session did not end (it releases its
		 * own keys): no need to ask. */
		if (lease && lockfs_etcdbe_mirror_is_head(m, evname, ev->kv.key) == 1)
			ended[i] = session_ended(e, lease, ev->kv.mod_revision,
						 of == ETCD_WATCH_NAME &&
						 lease != __atomic_load_n(&e->session.lease,
									  __ATOMIC_ACQUIRE));
	}
}

void lockfs_etcdbe_apply_events(struct etcd_store *e, enum etcd_watch_of of, const char *name,
				const struct lockfs_etcd_event *events, size_t n_events,
				const bool ended[ETCD_JUDGED], int64_t next_rev,
				struct etcd_names *changed, struct etcd_names *own)
{
	struct etcd_mirror *m = &e->mirror;
	int64_t now = lockfs_wall_ms();
	char evname[LOCKFS_STORE_KEY_MAX];

	pthread_mutex_lock(&m->mu);
	for (size_t i = 0; i < n_events; i++) {
		const struct lockfs_etcd_event *ev = &events[i];
		/* The echo of this daemon's own uncontended write: the mirror
		 * and the engine have it already. */
		struct etcd_names *to = lockfs_etcdbe_mirror_is_own_locked(m, ev->kv.mod_revision)
					? own : changed;

		if (ev->type == LOCKFS_ETCD_EVENT_PUT) {
			(void)lockfs_etcdbe_mirror_put_locked(m, &ev->kv, now, to);
			continue;
		}
		(void)lockfs_etcdbe_mirror_delete_locked(m, ev->kv.key, ev->kv.mod_revision,
							 i < ETCD_JUDGED && ended[i] ?
							 now + e->lock_delay_s * 1000 : 0, to);
	}
	if (of == ETCD_WATCH_NAME)
		lockfs_etcdbe_mirror_set_next_locked(m, name, next_rev);
	for (size_t i = 0; of == ETCD_WATCH_PREFIX && i < n_events; i++)
		if (lockfs_etcdbe_mirror_classify(m, events[i].kv.key, evname, sizeof(evname)) == 1)
			lockfs_etcdbe_mirror_set_next_locked(m, evname, next_rev);
	lockfs_etcdbe_mirror_sweep_locked(m);
	pthread_mutex_unlock(&m->mu);
	__atomic_add_fetch(&e->list_gen, 1, __ATOMIC_RELEASE);
}

void lockfs_etcdbe_report_both(struct etcd_store *e, struct etcd_names *changed,
			       struct etcd_names *own)
{
	if (changed->n || changed->all)
		lockfs_etcdbe_report(e, changed, false);
	else
		lockfs_etcdbe_names_free(changed);
	if (own->n || own->all)
		lockfs_etcdbe_report(e, own, false);
	else
		lockfs_etcdbe_names_free(own);
}
