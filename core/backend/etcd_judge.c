/*
 * Was a head key's delete a release, or its session's end?  Lock-delay
 * (docs/etcd.md "Sessions") keeps a name from everyone for lock_delay
 * when its holder's session expired; a release starts none.  etcd deletes
 * an expired session's host key and all its keys in one revision, and the
 * host keys' watch and a name's watch bring their parts in either order.
 *
 * When a name's part comes first and the key was another lockfs host's,
 * the answer is a read of that host key at that revision.  Asked on the
 * watch's thread before anything else, it put a round trip into every
 * hand-off from another host.  So it is put off: the delete is applied
 * and reported at once, and a waiter here claims with one more compare in
 * its txn, "that session's host key is still on its lease" -- a session
 * that lives after the delete did not end with it, so the delete was a
 * release.  A claim that succeeds so settles it; one whose compare fails
 * asks, then claims again or waits out the delay.  For a name no waiter
 * here claims, the watch's thread asks right after its report; a try-lock,
 * a stat or a read of the name asks first if it comes before, and the
 * session's tick settles what a claim that never came left.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "etcd.h"

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

/* Put off judging the delete at REV of NAME's head key, on LEASE: true
 * when it is (another lockfs host's session, not known to have ended,
 * no other delete of NAME pending, room left); else ask now. */
static bool put_off(struct etcd_store *e, const char *name, int64_t lease, int64_t rev)
{
	struct etcd_unjudged *u = NULL;
	char host[LOCKFS_HOST_MAX];
	bool taken = false;
	int n;

	if (lockfs_etcdbe_mirror_host_of(&e->mirror, lease, host, sizeof(host)) < 0 ||
	    strlen(name) >= sizeof(u->name))
		return false;  /* not a lockfs session: nothing to ask */
	pthread_mutex_lock(&e->mirror.mu);
	if (!lockfs_etcdbe_expiry_locked(e, lease, rev, NULL))
		for (size_t i = 0; i < ETCD_UNJUDGED && !taken; i++) {
			struct etcd_unjudged *x = &e->unjudged[i];

			if (x->lease && strcmp(x->name, name) == 0)
				taken = true;
			else if (!x->lease && !u)
				u = x;
		}
	if (u && !taken) {
		n = snprintf(u->host_key, sizeof(u->host_key), "%s.hosts/%s", e->prefix, host);
		if (n > 0 && (size_t)n < sizeof(u->host_key)) {
			strcpy(u->name, name);
			__atomic_add_fetch(&e->n_unjudged, 1, __ATOMIC_RELEASE);
			u->lease = lease;
			u->rev = rev;
			u->at_ms = lockfs_wall_ms();
		} else {
			u = NULL;
		}
	}
	pthread_mutex_unlock(&e->mirror.mu);
	return u && !taken;
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
		 * own keys): no need to ask.  Another host's: put off, so
		 * that a waiter here claims first (the claim proves a release,
		 * or settles it). */
		if (lease && lockfs_etcdbe_mirror_is_head(m, evname, ev->kv.key) == 1) {
			bool ask = of == ETCD_WATCH_NAME &&
				   lease != __atomic_load_n(&e->session.lease, __ATOMIC_ACQUIRE);

			if (!ask || !put_off(e, evname, lease, ev->kv.mod_revision))
				ended[i] = session_ended(e, lease, ev->kv.mod_revision, ask);
		}
	}
}

/* X judged.  MIRROR_MU held. */
static void forget_locked(struct etcd_store *e, struct etcd_unjudged *x)
{
	x->lease = 0;
	__atomic_sub_fetch(&e->n_unjudged, 1, __ATOMIC_RELEASE);
}

bool lockfs_etcdbe_unjudged(struct etcd_store *e)
{
	return __atomic_load_n(&e->n_unjudged, __ATOMIC_ACQUIRE) != 0;
}

void lockfs_etcdbe_settle(struct etcd_store *e, const char *name, struct etcd_names *delayed)
{
	/* Bounded: each round settles one delete, and only the watch's
	 * thread puts new ones off. */
	for (size_t round = 0; round < ETCD_UNJUDGED; round++) {
		struct etcd_unjudged u = { .lease = 0 };
		bool ended;

		pthread_mutex_lock(&e->mirror.mu);
		for (size_t i = 0; i < ETCD_UNJUDGED && !u.lease; i++)
			if (e->unjudged[i].lease && (!name || strcmp(e->unjudged[i].name, name) == 0))
				u = e->unjudged[i];
		pthread_mutex_unlock(&e->mirror.mu);
		if (!u.lease)
			return;
		ended = session_ended(e, u.lease, u.rev, true);
		pthread_mutex_lock(&e->mirror.mu);
		/* The delay and the end of the put-off in one step: a claim
		 * sees one or the other (lockfs_etcdbe_release_proof). */
		if (ended && u.at_ms + e->lock_delay_s * 1000 > lockfs_wall_ms())
			lockfs_etcdbe_mirror_set_delay_locked(&e->mirror, u.name,
							      u.at_ms + e->lock_delay_s * 1000);
		else
			ended = false;
		for (size_t i = 0; i < ETCD_UNJUDGED; i++) {
			struct etcd_unjudged *x = &e->unjudged[i];

			if (x->lease == u.lease && x->rev == u.rev && strcmp(x->name, u.name) == 0)
				forget_locked(e, x);
		}
		pthread_mutex_unlock(&e->mirror.mu);
		if (ended)
			(void)lockfs_etcdbe_names_add(delayed, u.name);
	}
}

void lockfs_etcdbe_settle_unclaimed(struct etcd_store *e,
				    bool (*claims)(struct etcd_store *e, const char *name),
				    struct etcd_names *delayed)
{
	char names[ETCD_UNJUDGED][LOCKFS_STORE_KEY_MAX];
	size_t n = 0;

	pthread_mutex_lock(&e->mirror.mu);
	for (size_t i = 0; i < ETCD_UNJUDGED; i++)
		if (e->unjudged[i].lease)
			strcpy(names[n++], e->unjudged[i].name);
	pthread_mutex_unlock(&e->mirror.mu);
	for (size_t i = 0; i < n; i++)
		if (!claims(e, names[i]))
			lockfs_etcdbe_settle(e, names[i], delayed);
}

void lockfs_etcdbe_proved(struct etcd_store *e, const char *name, int64_t lease)
{
	pthread_mutex_lock(&e->mirror.mu);
	for (size_t i = 0; i < ETCD_UNJUDGED; i++) {
		struct etcd_unjudged *x = &e->unjudged[i];

		if (x->lease == lease && strcmp(x->name, name) == 0)
			forget_locked(e, x);
	}
	pthread_mutex_unlock(&e->mirror.mu);
}

int lockfs_etcdbe_release_proof(struct etcd_store *e, const char *name,
				char host_key[LOCKFS_STORE_KEY_MAX],
				struct lockfs_etcd_compare *proof)
{
	int rc = 0;

	pthread_mutex_lock(&e->mirror.mu);
	if (lockfs_etcdbe_mirror_delayed_locked(&e->mirror, name, lockfs_wall_ms()))
		rc = -EEXIST;
	for (size_t i = 0; i < ETCD_UNJUDGED && rc == 0; i++) {
		const struct etcd_unjudged *x = &e->unjudged[i];

		if (x->lease && strcmp(x->name, name) == 0) {
			strcpy(host_key, x->host_key);
			*proof = (struct lockfs_etcd_compare){
				.key = host_key, .target = LOCKFS_ETCD_LEASE, .number = x->lease,
			};
			rc = 1;
		}
	}
	pthread_mutex_unlock(&e->mirror.mu);
	return rc;
}
