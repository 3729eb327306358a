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

/* Events of one watch message looked at as a possible echo of an own
 * write whose answer is not in yet (one write's echo comes alone); a
 * longer message's are reported as changes. */
#define ECHO_EVENTS 8

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

void lockfs_etcdbe_apply_events(struct etcd_store *e, enum etcd_watch_of of, const char *name,
				const struct lockfs_etcd_event *events, size_t n_events,
				const bool ended[ETCD_JUDGED], int64_t next_rev,
				struct etcd_names *changed, struct etcd_names *own)
{
	struct etcd_mirror *m = &e->mirror;
	int64_t now = lockfs_wall_ms();
	char evname[LOCKFS_STORE_KEY_MAX];
	bool echo[ECHO_EVENTS] = { false };

	/* (Asked before mirror.mu: the owned set's lock comes first.) */
	for (size_t i = 0; of != ETCD_WATCH_HOSTS && n_events <= ECHO_EVENTS && i < n_events; i++)
		echo[i] = lockfs_etcdbe_owned_echo(e, events[i].kv.key,
						   events[i].type != LOCKFS_ETCD_EVENT_PUT);
	pthread_mutex_lock(&m->mu);
	for (size_t i = 0; i < n_events; i++) {
		const struct lockfs_etcd_event *ev = &events[i];
		/* The echo of this daemon's own uncontended write: the mirror
		 * and the engine have it already, or will have once its
		 * answer is in -- the watch often brings the echo first. */
		bool is_own = lockfs_etcdbe_mirror_is_own_locked(m, ev->kv.mod_revision) ||
			      (i < ECHO_EVENTS && echo[i] &&
			       lockfs_etcdbe_mirror_classify(m, ev->kv.key, evname,
							     sizeof(evname)) == 1 &&
			       lockfs_etcdbe_mirror_alone_locked(m, evname, ev->kv.key));
		struct etcd_names *to = is_own ? own : changed;

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
