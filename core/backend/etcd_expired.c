/*
 * An earlier daemon of this host whose session expired before this one
 * started (docs/etcd.md "Daemon restart").  Its keys went with its lease,
 * so nothing in etcd says any more which of this host's processes held
 * which lock -- but etcd's history does: the host key's last deletion
 * names the expired lease and its revision D, and the prefix as it was at
 * D - 1 has that lease's keys.  The ones that held a lock then (the first
 * of their name) are put into the mirror as they were, "expired keys",
 * for the startup scan only: the scan caches their records, releases the
 * dead holders' (etcd says -ENOENT: nothing to log) and asks to adopt the
 * live holders', which fails with -ENOENT because the key is gone -- and
 * the engine then does what it does for a lost session: `lost`, and the
 * holder's rmdir answers ESTALE.  start() takes the expired keys out of
 * the mirror before anything is served.
 *
 * When history cannot tell (compacted, etcd slow), this says so on stderr
 * and nothing more is done: the holders then find their lock simply free
 * (ENOENT), as before.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "base/clock.h"
#include "etcd.h"

/* What the watch on the host key's history found.  MU guards it all: the
 * watch's thread writes, open() waits on CV. */
struct host_history {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int64_t own_lease;  /* this daemon's put of the host key ends the history */
	bool done;          /* it was seen, or the watch ended */
	int error;          /* ENDED's error (0: our put was seen) */
	int64_t compact;    /* ENDED -ERANGE: the oldest revision left */
	int64_t lease;      /* the last deletion before our put: the lease it ended */
	int64_t rev;        /* ... its revision (0: none) */
	char *value;        /* ... the host key's value before it (malloc'd) */
};

static void on_history(void *arg, const struct lockfs_etcd_watch_msg *msg)
{
	struct host_history *hh = arg;

	pthread_mutex_lock(&hh->mu);
	if (msg->kind == LOCKFS_ETCD_WATCH_ENDED) {
		hh->done = true;
		hh->error = msg->error;
		hh->compact = msg->compact_revision;
	}
	for (size_t i = 0; i < msg->n_events && !hh->done; i++) {
		const struct lockfs_etcd_event *ev = &msg->events[i];

		if (ev->type == LOCKFS_ETCD_EVENT_PUT && ev->kv.lease == hh->own_lease) {
			hh->done = true;
		} else if (ev->type == LOCKFS_ETCD_EVENT_DELETE && ev->has_prev_kv) {
			free(hh->value);
			hh->value = strdup(ev->prev_kv.value);
			hh->lease = ev->prev_kv.lease;
			hh->rev = ev->kv.mod_revision;
		} else {
			/* Put back by another daemon since: not the last end. */
			hh->lease = hh->rev = 0;
		}
	}
	if (hh->done)
		pthread_cond_signal(&hh->cv);
	pthread_mutex_unlock(&hh->mu);
}

/* Watch the host key's history from FROM until our own put (within the
 * client's bound).  0 with HH filled; -ERANGE (HH->compact set); -errno. */
static int read_history(struct etcd_store *e, struct host_history *hh, int64_t from)
{
	struct lockfs_etcd_watch_req req = {
		.key = e->host_key, .start_revision = from, .prev_kv = true,
	};
	struct lockfs_etcd_watch *w;
	struct timespec until;
	int rc;

	hh->done = false;
	hh->error = 0;
	hh->lease = hh->rev = 0;
	rc = lockfs_etcd_watch_open(&w, e->client, &req, on_history, hh);
	if (rc)
		return rc;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += LOCKFS_ETCD_TIMEOUT_MS / 1000 + 1;
	pthread_mutex_lock(&hh->mu);
	while (!hh->done && pthread_cond_timedwait(&hh->cv, &hh->mu, &until) == 0)
		;
	rc = !hh->done ? -ETIMEDOUT : hh->error;
	pthread_mutex_unlock(&hh->mu);
	lockfs_etcd_watch_close(w);
	return rc;
}

/* Did the host key's value V (JSON) come from this machine and boot?
 * (Holders of another boot are gone: nothing to tell them.) */
static bool this_boot(struct etcd_store *e, const char *v)
{
	json_t *j = v ? json_loads(v, 0, NULL) : NULL;
	const char *machine = json_string_value(json_object_get(j, "machine_id"));
	const char *boot = json_string_value(json_object_get(j, "boot_id"));
	bool same = machine && boot && strcmp(machine, e->machine_id) == 0 &&
		    strcmp(boot, e->boot_id) == 0;

	json_decref(j);
	return same;
}

/* The keys of LEASE that held a lock at revision REV - 1, into the mirror
 * and E->expired.  0 or -errno. */
static int show_expired_keys(struct etcd_store *e, int64_t lease, int64_t rev)
{
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = e->prefix, .prefix = true,
				     .revision = rev - 1 };
	struct lockfs_etcd_op_resp r;
	char name[LOCKFS_STORE_KEY_MAX], next[LOCKFS_STORE_KEY_MAX];
	int64_t now = lockfs_wall_ms();
	int rc = lockfs_etcd_range(e->client, &op, &r);

	if (rc)
		return rc;
	/* In key order, each name's keys are next to each other (they share
	 * "PREFIX NAME/"): the first by create_revision of each run holds it. */
	for (size_t i = 0; i < r.n_kvs && rc == 0;) {
		const struct lockfs_etcd_kv *head;
		size_t j = i;

		if (lockfs_etcdbe_mirror_classify(&e->mirror, r.kvs[i].key, name, sizeof(name)) != 1) {
			i++;
			continue;
		}
		head = &r.kvs[i];
		while (++j < r.n_kvs &&
		       lockfs_etcdbe_mirror_classify(&e->mirror, r.kvs[j].key, next,
						     sizeof(next)) == 1 &&
		       strcmp(next, name) == 0)
			if (r.kvs[j].create_revision < head->create_revision)
				head = &r.kvs[j];
		i = j;
		/* Ours, with a record (a waiter's place is never first). */
		if (head->lease != lease || head->value_len == 0)
			continue;
		if (e->n_expired == e->cap_expired) {
			size_t cap = e->cap_expired ? e->cap_expired * 2 : 16;
			char **v = realloc(e->expired, cap * sizeof(*v));

			if (!v) {
				rc = -ENOMEM;
				break;
			}
			e->expired = v;
			e->cap_expired = cap;
		}
		if (!(e->expired[e->n_expired] = strdup(head->key))) {
			rc = -ENOMEM;
			break;
		}
		e->n_expired++;
		pthread_mutex_lock(&e->mirror.mu);
		rc = lockfs_etcdbe_mirror_put_locked(&e->mirror, head, now, NULL);
		pthread_mutex_unlock(&e->mirror.mu);
	}
	e->expired_rev = rev;
	lockfs_etcd_op_resp_free(&r);
	return rc;
}

void lockfs_etcdbe_find_expired(struct etcd_store *e, int64_t own_lease)
{
	struct host_history hh = { .own_lease = own_lease };
	int rc;

	pthread_mutex_init(&hh.mu, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&hh.cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	rc = read_history(e, &hh, 1);
	if (rc == -ERANGE && hh.compact > 1)
		rc = read_history(e, &hh, hh.compact);
	if (rc == 0 && hh.rev && this_boot(e, hh.value))
		rc = show_expired_keys(e, hh.lease, hh.rev);
	if (rc && rc != -ENOMEM)
		fprintf(stderr, "lockfs: etcd: cannot tell which locks of host %s ended with its "
			"earlier session (%s): their holders find them free\n", e->base.host,
			rc == -ERANGE ? "etcd's history of it was compacted" : strerror(-rc));
	free(hh.value);
	pthread_cond_destroy(&hh.cv);
	pthread_mutex_destroy(&hh.mu);
}

void lockfs_etcdbe_drop_expired(struct etcd_store *e, struct etcd_names *changed)
{
	pthread_mutex_lock(&e->mirror.mu);
	for (size_t i = 0; i < e->n_expired; i++)
		(void)lockfs_etcdbe_mirror_delete_locked(&e->mirror, e->expired[i], e->expired_rev, 0,
							 changed);
	lockfs_etcdbe_mirror_sweep_locked(&e->mirror);
	pthread_mutex_unlock(&e->mirror.mu);
	lockfs_etcdbe_free_expired(e);
}

void lockfs_etcdbe_free_expired(struct etcd_store *e)
{
	for (size_t i = 0; i < e->n_expired; i++)
		free(e->expired[i]);
	free(e->expired);
	e->expired = NULL;
	e->n_expired = e->cap_expired = 0;
}
