/*
 * Keys of this daemon's session that nobody here holds or waits with
 * (orphans: not in the owned set, etcd_owned.c), and claims whose outcome
 * was unknown (etcd.h: struct etcd_owned).  See docs/etcd.md, "Orphans".
 *
 * Why: a key of ours at the head of a name holds that name for every host
 * (etcdctl lock, concurrency.Mutex, other lockfs daemons) until it is
 * deleted or the session ends, which may be tens of seconds or never.  A
 * key can be left so when a write's outcome was unknown and the daemon
 * took it for failed (a claim etcd applied whose answer was lost), or when
 * the engine dropped a grant for any reason while etcd kept its key.  The
 * specific paths are closed where they are (etcd_leave, the pending
 * undos); this is the net under them: every key the engine was given (a
 * grant, a place) or that an op is writing is "owned" here, and on each
 * session tick a key of the current lease that heads its name and is not
 * owned, has no undo pending and was seen so, unchanged, on the tick
 * before too, is deleted -- guarded by its create_revision and
 * mod_revision, so a later life of the key is never touched -- and logged
 * on stderr.
 *
 * Fail closed: a key is owned from before its op's txn is sent until its
 * own guarded delete, so an op in flight is never taken for an orphan;
 * forgetting to drop one only keeps a key (as before), never deletes a
 * held one.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "etcd.h"

void lockfs_etcdbe_owned_init(struct etcd_owned *o)
{
	memset(o, 0, sizeof(*o));
	pthread_mutex_init(&o->mu, NULL);
	o->ready = true;
}

static void suspects_free(struct etcd_owned *o)
{
	for (size_t i = 0; i < o->n_suspects; i++)
		free(o->suspects[i].key);
	o->n_suspects = 0;
}

void lockfs_etcdbe_owned_destroy(struct etcd_owned *o)
{
	if (!o->ready)
		return;
	for (size_t b = 0; b < ETCD_OWNED_BUCKETS; b++)
		while (o->buckets[b]) {
			struct etcd_owned_key *k = o->buckets[b];

			o->buckets[b] = k->next;
			free(k);
		}
	suspects_free(o);
	lockfs_etcdbe_names_free(&o->recheck);
	pthread_mutex_destroy(&o->mu);
	o->ready = false;
}

void lockfs_etcdbe_recheck_later(struct etcd_store *e, const char *name)
{
	struct etcd_owned *o = &e->owned;
	char **v;

	pthread_mutex_lock(&o->mu);
	v = realloc(o->recheck.v, (o->recheck.n + 1) * sizeof(*v));
	if (v) {
		o->recheck.v = v;
		o->recheck.cap = o->recheck.n + 1;
		if ((v[o->recheck.n] = strdup(name)) != NULL)
			o->recheck.n++;
	}
	pthread_mutex_unlock(&o->mu);
}

/* The heads of the mirror's names on LEASE that are not owned: into
 * OUT (malloc'd keys, with their revisions and names' lengths). */
static void find_candidates(struct etcd_store *e, int64_t lease, struct etcd_suspect *out,
			    size_t *n_out)
{
	struct etcd_mirror *m = &e->mirror;
	int64_t now = lockfs_wall_ms();

	*n_out = 0;
	pthread_mutex_lock(&e->owned.mu);
	pthread_mutex_lock(&m->mu);
	for (size_t b = 0; b < MIRROR_BUCKETS && *n_out < ETCD_SUSPECTS_MAX; b++)
		for (struct etcd_name *n = m->buckets[b]; n && *n_out < ETCD_SUSPECTS_MAX;
		     n = n->next) {
			struct etcd_key *head = NULL;

			for (size_t i = 0; i < n->n && !head; i++)
				if (!n->keys[i].dead)
					head = &n->keys[i];
			if (!head || head->lease != lease || n->delay_until_ms > now ||
			    lockfs_etcdbe_owned_has_locked(&e->owned, head->key))
				continue;
			out[*n_out] = (struct etcd_suspect){
				.key = strdup(head->key), .create_rev = head->create_rev,
				.mod_rev = head->mod_rev, .name_len = strlen(n->name),
			};
			if (out[*n_out].key)
				(*n_out)++;
		}
	pthread_mutex_unlock(&m->mu);
	pthread_mutex_unlock(&e->owned.mu);
}

/* Was S a suspect at the last tick too, unchanged (and still not owned)? */
static bool seen_before(struct etcd_store *e, const struct etcd_suspect *s)
{
	struct etcd_owned *o = &e->owned;
	bool seen = false;

	pthread_mutex_lock(&o->mu);
	for (size_t i = 0; i < o->n_suspects && !seen; i++)
		seen = strcmp(o->suspects[i].key, s->key) == 0 &&
		       o->suspects[i].create_rev == s->create_rev &&
		       o->suspects[i].mod_rev == s->mod_rev;
	seen = seen && !lockfs_etcdbe_owned_has_locked(o, s->key);
	pthread_mutex_unlock(&o->mu);
	return seen;
}

/* Delete orphan S (guarded by both of its revisions) and log it.  Its
 * name goes to CHANGED. */
static void delete_orphan(struct etcd_store *e, const struct etcd_suspect *s,
			  struct etcd_names *changed)
{
	struct lockfs_etcd_compare cmps[2] = {
		{ .key = s->key, .target = LOCKFS_ETCD_CREATE, .number = s->create_rev },
		{ .key = s->key, .target = LOCKFS_ETCD_MOD, .number = s->mod_rev },
	};
	struct lockfs_etcd_op del = { .type = LOCKFS_ETCD_DELETE, .key = s->key };
	struct lockfs_etcd_txn txn = { .compare = cmps, .n_compare = 2, .success = &del,
				       .n_success = 1 };
	struct lockfs_etcd_txn_resp r;
	char name[LOCKFS_STORE_KEY_MAX];
	size_t plen = strlen(e->prefix);

	if (lockfs_etcd_txn(e->client, &txn, &r))
		return;  /* the next tick tries again */
	if (r.succeeded) {
		snprintf(name, sizeof(name), "%.*s", (int)s->name_len, s->key + plen);
		fprintf(stderr, "lockfs: etcd: %s (create_revision %" PRId64 ", mod_revision %"
			PRId64 ") headed %s with nobody here holding or waiting for it: an "
			"orphan, deleted at revision %" PRId64 "\n", s->key, s->create_rev,
			s->mod_rev, name, r.revision);
		pthread_mutex_lock(&e->mirror.mu);
		(void)lockfs_etcdbe_mirror_delete_locked(&e->mirror, s->key, r.revision, 0,
							 changed);
		pthread_mutex_unlock(&e->mirror.mu);
		lockfs_etcdbe_list_changed(e);
	}
	lockfs_etcd_txn_resp_free(&r);
}

/* Forget the keys of other leases than LEASE: a lost session's keys went
 * with it, and only the current lease's are ever looked at. */
static void forget_other_leases(struct etcd_store *e, int64_t lease)
{
	struct etcd_owned *o = &e->owned;
	char hex[17];

	snprintf(hex, sizeof(hex), "%016" PRIx64, (uint64_t)lease);
	pthread_mutex_lock(&o->mu);
	for (size_t b = 0; b < ETCD_OWNED_BUCKETS; b++)
		for (struct etcd_owned_key **pp = &o->buckets[b]; *pp;) {
			const char *slash = strrchr((*pp)->key, '/');

			if (slash && strncmp(slash + 1, hex, 16) != 0) {
				struct etcd_owned_key *k = *pp;

				*pp = k->next;
				free(k);
			} else {
				pp = &(*pp)->next;
			}
		}
	pthread_mutex_unlock(&o->mu);
}

/* The orphans of this tick: the suspects of the last one still there,
 * unchanged, are deleted; this tick's are kept for the next. */
static void sweep_orphans(struct etcd_store *e, struct etcd_names *changed)
{
	struct etcd_owned *o = &e->owned;
	struct etcd_suspect found[ETCD_SUSPECTS_MAX];
	size_t n = 0;
	int64_t lease;

	if (lockfs_etcdbe_session_state(e, &lease) == LOCKFS_SESSION_LIVE) {
		forget_other_leases(e, lease);
		find_candidates(e, lease, found, &n);
	}
	for (size_t i = 0; i < n; i++) {
		char name[LOCKFS_STORE_KEY_MAX];

		snprintf(name, sizeof(name), "%.*s", (int)found[i].name_len,
			 found[i].key + strlen(e->prefix));
		/* An undo of ours is pending there: it is the undo's. */
		if (seen_before(e, &found[i]) && !lockfs_etcdbe_session_pending_name(e, name))
			delete_orphan(e, &found[i], changed);
	}
	pthread_mutex_lock(&o->mu);
	suspects_free(o);
	for (size_t i = 0; i < n; i++)
		o->suspects[i] = found[i];
	o->n_suspects = n;
	pthread_mutex_unlock(&o->mu);
}

void lockfs_etcdbe_tick(struct etcd_store *e)
{
	struct etcd_owned *o = &e->owned;
	struct etcd_names changed = { 0 };

	lockfs_etcdbe_interest_sweep(e);
	/* Claims whose outcome was unknown: the engine claims again (which
	 * completes a claim etcd applied: the grant is given and logged) or,
	 * when its waiter is gone, has left (etcd_leave deletes it). */
	pthread_mutex_lock(&o->mu);
	changed = o->recheck;
	memset(&o->recheck, 0, sizeof(o->recheck));
	pthread_mutex_unlock(&o->mu);
	sweep_orphans(e, &changed);
	/* Deletes put off whose claim never came (etcd_judge.c). */
	lockfs_etcdbe_settle(e, NULL, &changed);
	if (changed.n || changed.all)
		lockfs_etcdbe_report(e, &changed, false);
	else
		lockfs_etcdbe_names_free(&changed);
}
