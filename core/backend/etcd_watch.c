/*
 * The etcd store's watch and reporting: the one prefix watch keeps the
 * mirror (etcd_mirror.c) as etcd has it -- every PUT and DELETE applied,
 * host keys that expire starting lock-delay -- and the names it changed go
 * to the engine's change callback (lockfs_etcdbe_report, which the
 * session thread reaches through its hooks).  The watch's own thread runs
 * on_watch; the session thread reopens the watch when it ended.
 */
#include <errno.h>
#include <pthread.h>
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

/* A revision's host-key deletions, for lock-delay: the lease of a daemon
 * whose host key went (expired or revoked) at REV. */
struct gone_host {
	int64_t lease, rev;
};

static void on_watch(void *arg, const struct lockfs_etcd_watch_msg *msg)
{
	struct etcd_store *e = arg;
	struct etcd_mirror *m = &e->mirror;
	struct etcd_names changed = { 0 }, own = { .own = true };
	int64_t now = lockfs_wall_ms();

	switch (msg->kind) {
	case LOCKFS_ETCD_WATCH_CREATED:
		pthread_mutex_lock(&m->mu);
		m->watching = true;
		pthread_mutex_unlock(&m->mu);
		return;
	case LOCKFS_ETCD_WATCH_EVENTS: {
		struct gone_host gone[16];
		size_t n_gone = 0;
		char host[LOCKFS_HOST_MAX];

		pthread_mutex_lock(&m->mu);
		/* An expired session deletes its host key and every key of its
		 * lease in one revision: its head keys start lock-delay.  The
		 * watch carries no prev_kv (it would cost etcd a read and every
		 * watching daemon a record per delete): a deleted key's lease is
		 * the one the mirror has for it, or the one a PUT earlier in
		 * this message gave it. */
		for (size_t i = 0; i < msg->n_events && n_gone < 16; i++) {
			const struct lockfs_etcd_event *ev = &msg->events[i];
			int64_t lease = 0;
			size_t j = i;

			if (ev->type != LOCKFS_ETCD_EVENT_DELETE ||
			    lockfs_etcdbe_mirror_classify(m, ev->kv.key, host, sizeof(host)) != 2)
				continue;
			while (j > 0 && !(msg->events[j - 1].type == LOCKFS_ETCD_EVENT_PUT &&
					  strcmp(msg->events[j - 1].kv.key, ev->kv.key) == 0))
				j--;
			if (j > 0)
				lease = msg->events[j - 1].kv.lease;
			else
				(void)lockfs_etcdbe_mirror_lease_locked(m, ev->kv.key, &lease);
			if (lease)
				gone[n_gone++] = (struct gone_host){ lease, ev->kv.mod_revision };
		}
		for (size_t i = 0; i < msg->n_events; i++) {
			const struct lockfs_etcd_event *ev = &msg->events[i];
			/* The echo of this daemon's own uncontended write: the
			 * mirror and the engine have it already. */
			struct etcd_names *to = lockfs_etcdbe_mirror_is_own_locked(m, ev->kv.mod_revision)
						? &own : &changed;
			int64_t delay = 0;

			if (ev->type == LOCKFS_ETCD_EVENT_PUT) {
				(void)lockfs_etcdbe_mirror_put_locked(m, &ev->kv, now, to);
				continue;
			}
			if (n_gone && e->lock_delay_s) {
				int64_t lease = 0;

				(void)lockfs_etcdbe_mirror_lease_locked(m, ev->kv.key, &lease);
				for (size_t g = 0; g < n_gone && lease; g++)
					if (gone[g].lease == lease &&
					    gone[g].rev == ev->kv.mod_revision)
						delay = now + e->lock_delay_s * 1000;
			}
			(void)lockfs_etcdbe_mirror_delete_locked(m, ev->kv.key, ev->kv.mod_revision, delay,
							to);
		}
		if (msg->next_revision > m->next_rev)
			m->next_rev = msg->next_revision;
		lockfs_etcdbe_mirror_sweep_locked(m);
		pthread_mutex_unlock(&m->mu);
		break;
	}
	case LOCKFS_ETCD_WATCH_PROGRESS:
		pthread_mutex_lock(&m->mu);
		if (msg->next_revision > m->next_rev)
			m->next_rev = msg->next_revision;
		lockfs_etcdbe_mirror_sweep_locked(m);
		pthread_mutex_unlock(&m->mu);
		return;
	case LOCKFS_ETCD_WATCH_ENDED:
		pthread_mutex_lock(&m->mu);
		m->watching = false;
		pthread_mutex_unlock(&m->mu);
		lockfs_etcdbe_session_watch_ended(e, msg->resync, msg->next_revision);
		return;
	}
	if (changed.n || changed.all)
		lockfs_etcdbe_report(e, &changed, false);
	else
		lockfs_etcdbe_names_free(&changed);
	if (own.n || own.all)
		lockfs_etcdbe_report(e, &own, false);
	else
		lockfs_etcdbe_names_free(&own);
}

int lockfs_etcdbe_watch_start(struct etcd_store *e, int64_t from)
{
	struct lockfs_etcd_watch_req req = {
		.key = e->prefix, .prefix = true, .progress_notify = true,
		.idle_timeout_ms = (int)(e->ttl_s * 1000 / 3),
	};
	int rc;

	if (from == 0) {
		/* A fresh read, then every change after it. */
		struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = e->prefix,
					     .prefix = true };
		struct lockfs_etcd_op_resp r;

		rc = lockfs_etcd_range(e->client, &op, &r);
		if (rc)
			return rc;
		rc = lockfs_etcdbe_mirror_load(&e->mirror, r.kvs, r.n_kvs, r.revision, lockfs_wall_ms());
		from = r.revision + 1;
		lockfs_etcd_op_resp_free(&r);
		if (rc)
			return rc;
	}
	req.start_revision = from;
	return lockfs_etcd_watch_open(&e->watch, e->client, &req, on_watch, e);
}

int lockfs_etcdbe_watch_reopen(struct etcd_store *e, int64_t from, bool *resync)
{
	int rc;

	if (e->watch) {
		lockfs_etcd_watch_close(e->watch);
		e->watch = NULL;
		pthread_mutex_lock(&e->mirror.mu);
		e->mirror.watching = false;
		pthread_mutex_unlock(&e->mirror.mu);
	}
	rc = lockfs_etcdbe_watch_start(e, *resync ? 0 : from);
	if (rc == -ERANGE && !*resync) {
		/* FROM was compacted: what happened since is lost. */
		*resync = true;
		rc = lockfs_etcdbe_watch_start(e, 0);
	}
	return rc;
}
