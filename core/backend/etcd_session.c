/*
 * The etcd store's session: this daemon's lease and the thread that keeps
 * it (docs/etcd.md "Sessions").  Every locks' key of this daemon hangs on
 * the lease, so the lease is the daemon's standing with the cluster:
 *
 *   LIVE       a keepalive was confirmed less than 2/3 ttl ago (counted
 *              from the keepalive's send time, on the boot clock);
 *   UNCERTAIN  none for 2/3 ttl: no grants (write ops that grant: -EIO);
 *   LOST       none for ttl, or etcd said the lease is gone: etcd may have
 *              deleted every key of the lease, so none of them is this
 *              daemon's any more (-ESTALE).  Once etcd answers, the old
 *              lease is revoked (its host key goes in the same revision,
 *              so other daemons see an expiry) and a new lease and host
 *              key are made: nothing is re-held silently.
 *
 * The same thread reopens the watch after it ended (from its resume point,
 * or from a fresh read after a compaction) and undoes writes whose outcome
 * was unknown (the pending list).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lockfs/proc.h"
#include "base/clock.h"
#include "etcd.h"

/* The keepalive interval: ttl/6, at least this often (ms). */
#define KEEPALIVE_MIN_MS 250

static int64_t interval_ms(const struct etcd_store *e)
{
	int64_t ms = e->ttl_s * 1000 / 6;

	return ms < KEEPALIVE_MIN_MS ? KEEPALIVE_MIN_MS : ms;
}

/* ---- Saying once that etcd does not answer, and that it does again ---- */

void lockfs_etcdbe_say_unreachable(struct etcd_store *e, int rc)
{
	if (rc == -ENOMEM || __atomic_exchange_n(&e->unreachable, true, __ATOMIC_ACQ_REL))
		return;
	fprintf(stderr, "lockfs: etcd %s does not answer (%s): writes fail with EIO, reads "
		"answer from the last known state, until it does\n", e->endpoints,
		strerror(-rc));
}

void lockfs_etcdbe_say_reachable(struct etcd_store *e)
{
	if (__atomic_load_n(&e->unreachable, __ATOMIC_ACQUIRE) &&
	    __atomic_exchange_n(&e->unreachable, false, __ATOMIC_ACQ_REL))
		fprintf(stderr, "lockfs: etcd %s answers again\n", e->endpoints);
}

/* The state by the clock alone (with s->mu held): an op must see
 * UNCERTAIN and LOST on time even when the session thread is late (a
 * keepalive takes up to 1 s while etcd does not answer). */
static enum lockfs_session_state state_now_locked(const struct etcd_store *e)
{
	const struct etcd_session *s = &e->session;
	int64_t quiet = lockfs_boot_ms() - s->sent_ms;

	if (s->state == LOCKFS_SESSION_LOST || quiet >= e->ttl_s * 1000)
		return LOCKFS_SESSION_LOST;
	if (s->state == LOCKFS_SESSION_UNCERTAIN || quiet >= e->ttl_s * 1000 * 2 / 3)
		return LOCKFS_SESSION_UNCERTAIN;
	return LOCKFS_SESSION_LIVE;
}

enum lockfs_session_state lockfs_etcdbe_session_state(struct etcd_store *e, int64_t *lease)
{
	struct etcd_session *s = &e->session;
	enum lockfs_session_state st;

	pthread_mutex_lock(&s->mu);
	st = state_now_locked(e);
	if (lease)
		*lease = s->lease;
	pthread_mutex_unlock(&s->mu);
	return st;
}

void lockfs_etcdbe_session_get(struct etcd_store *e, struct lockfs_session *out)
{
	struct etcd_session *s = &e->session;

	pthread_mutex_lock(&s->mu);
	out->state = state_now_locked(e);
	out->since_ms = out->state == s->state ? s->since_ms : lockfs_wall_ms();
	out->id = s->lease;
	pthread_mutex_unlock(&s->mu);
}

bool lockfs_etcdbe_session_lost_lease(struct etcd_store *e, int64_t lease)
{
	struct etcd_session *s = &e->session;
	bool lost = false;

	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->n_lost && !lost; i++)
		lost = s->lost_leases[i] == lease;
	if (lease == s->lease && state_now_locked(e) == LOCKFS_SESSION_LOST)
		lost = true;
	pthread_mutex_unlock(&s->mu);
	return lost;
}

void lockfs_etcdbe_session_pending(struct etcd_store *e, const char *key, int64_t lease,
			  int64_t create_rev, bool place_only)
{
	struct etcd_session *s = &e->session;
	struct etcd_pending *p = calloc(1, sizeof(*p));

	if (!p || !(p->key = strdup(key))) {
		/* No memory: the key stays until its lease ends. */
		free(p);
		return;
	}
	p->lease = lease;
	p->create_rev = create_rev;
	p->place_only = place_only;
	pthread_mutex_lock(&s->mu);
	p->next = s->pending;
	s->pending = p;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void lockfs_etcdbe_session_watch_ended(struct etcd_store *e, bool resync, int64_t from)
{
	struct etcd_session *s = &e->session;

	pthread_mutex_lock(&s->mu);
	s->watch_ended = true;
	s->watch_resync = s->watch_resync || resync;
	s->watch_from = from;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

int lockfs_etcdbe_state_id(struct etcd_store *e, char out[48])
{
	struct stat st;

	if (fstat(e->sd.dirfd, &st) < 0)
		return -errno;
	snprintf(out, 48, "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
	return 0;
}

/* The host key's value for LEASE. */
static int host_value(struct etcd_store *e, int64_t lease)
{
	unsigned long long start = 0;
	char state[48] = "";
	char *v;

	if (lockfs_procfs_start_time(getpid(), &start) < 0)
		start = 0;
	(void)lockfs_etcdbe_state_id(e, state);
	if (asprintf(&v, "{\"host\": \"%s\", \"machine_id\": \"%s\", \"boot_id\": \"%s\", "
		     "\"pid\": %d, \"start_time\": %llu, \"lease\": \"%016" PRIx64 "\", "
		     "\"state_dir\": \"%s\"}",
		     e->base.host, e->machine_id, e->boot_id, (int)getpid(), start,
		     (uint64_t)lease, state) < 0)
		return -ENOMEM;
	free(e->host_value);
	e->host_value = v;
	return 0;
}

int lockfs_etcdbe_session_put_host(struct etcd_store *e, int64_t lease, int64_t old)
{
	struct lockfs_etcd_compare cmp = {
		.key = e->host_key, .target = old ? LOCKFS_ETCD_LEASE : LOCKFS_ETCD_CREATE,
		.number = old,
	};
	struct lockfs_etcd_op put = {
		.type = LOCKFS_ETCD_PUT, .key = e->host_key, .lease = lease,
	};
	struct lockfs_etcd_txn txn = { .compare = &cmp, .n_compare = 1, .success = &put,
				       .n_success = 1 };
	struct lockfs_etcd_txn_resp r;
	int rc = host_value(e, lease);

	if (rc)
		return rc;
	put.value = e->host_value;
	put.value_len = strlen(e->host_value);
	rc = lockfs_etcd_txn(e->client, &txn, &r);
	if (rc)
		return rc;
	rc = r.succeeded ? 0 : -EEXIST;
	lockfs_etcd_txn_resp_free(&r);
	return rc;
}

int lockfs_etcdbe_session_init(struct etcd_store *e, const struct etcd_session_hooks *hooks)
{
	struct etcd_session *s = &e->session;
	int64_t lease = 0;
	int rc;

	s->hooks = hooks;
	pthread_mutex_init(&s->mu, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&s->cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	s->sent_ms = lockfs_boot_ms();
	rc = lockfs_etcd_lease_grant(e->client, e->ttl_s, 0, &lease, NULL);
	if (rc)
		return rc;
	s->lease = lease;
	s->state = LOCKFS_SESSION_LIVE;
	s->since_ms = lockfs_wall_ms();
	return 0;
}

bool lockfs_etcdbe_session_pending_name(struct etcd_store *e, const char *name)
{
	struct etcd_session *s = &e->session;
	size_t plen = strlen(e->prefix), nlen = strlen(name);
	bool found = false;

	pthread_mutex_lock(&s->mu);
	for (struct etcd_pending *p = s->pending; p && !found; p = p->next)
		found = strncmp(p->key, e->prefix, plen) == 0 &&
			strncmp(p->key + plen, name, nlen) == 0 && p->key[plen + nlen] == '/';
	pthread_mutex_unlock(&s->mu);
	return found;
}

void lockfs_etcdbe_session_pending_each(struct etcd_store *e, lockfs_list_cb cb, void *arg)
{
	struct etcd_session *s = &e->session;
	size_t plen = strlen(e->prefix), n = 0;
	char *names[16];

	pthread_mutex_lock(&s->mu);
	for (struct etcd_pending *p = s->pending; p && n < 16; p = p->next) {
		const char *rest = p->key + plen, *slash = strchr(rest, '/');

		if (strncmp(p->key, e->prefix, plen) == 0 && slash &&
		    (names[n] = strndup(rest, (size_t)(slash - rest))) != NULL)
			n++;
	}
	pthread_mutex_unlock(&s->mu);
	for (size_t i = 0; i < n; i++) {
		cb(arg, names[i]);
		free(names[i]);
	}
}

/* Is KEY in the mirror (the watch showed it, not deleted since)? */
static bool mirror_has(struct etcd_store *e, const char *key)
{
	int64_t lease;
	bool has;

	pthread_mutex_lock(&e->mirror.mu);
	has = lockfs_etcdbe_mirror_lease_locked(&e->mirror, key, &lease) == 0;
	pthread_mutex_unlock(&e->mirror.mu);
	return has;
}

/* Try to undo the pending writes (see struct etcd_pending): each once,
 * then again only when the mirror shows its key.  Runs on the session
 * thread only. */
static void resolve_pending(struct etcd_store *e)
{
	struct etcd_session *s = &e->session;
	struct etcd_pending *list, **pp;
	int64_t lease;

	pthread_mutex_lock(&s->mu);
	list = s->pending;
	s->pending = NULL;
	lease = s->lease;
	pthread_mutex_unlock(&s->mu);
	for (pp = &list; *pp;) {
		struct etcd_pending *p = *pp;
		struct lockfs_etcd_compare cmps[3] = {
			{ .key = p->key, .target = LOCKFS_ETCD_LEASE, .number = p->lease },
		};
		size_t n = 1;
		struct lockfs_etcd_op del = { .type = LOCKFS_ETCD_DELETE, .key = p->key };
		struct lockfs_etcd_txn txn = { .compare = cmps, .success = &del, .n_success = 1 };
		struct lockfs_etcd_txn_resp r;
		int rc;

		if (p->create_rev) {
			cmps[n++] = (struct lockfs_etcd_compare){ .key = p->key,
				.target = LOCKFS_ETCD_CREATE, .number = p->create_rev };
			if (p->place_only)
				cmps[n++] = (struct lockfs_etcd_compare){ .key = p->key,
					.target = LOCKFS_ETCD_MOD, .number = p->create_rev };
		}
		txn.n_compare = n;
		/* Its lease is gone (renewed after a loss): so is the key. */
		if (p->lease != lease) {
			*pp = p->next;
			free(p->key);
			free(p);
			continue;
		}
		if (p->tried && !mirror_has(e, p->key)) {
			pp = &p->next;
			continue;
		}
		rc = lockfs_etcd_txn(e->client, &txn, &r);
		if (rc == 0 && r.succeeded) {
			/* Deleted: it had been made after all. */
			if (p->create_rev)
				fprintf(stderr, "lockfs: etcd: %s (create_revision %" PRId64 "), "
					"left while etcd did not answer: deleted at revision %"
					PRId64 "\n", p->key, p->create_rev, r.revision);
			lockfs_etcd_txn_resp_free(&r);
			*pp = p->next;
			free(p->key);
			free(p);
			continue;
		}
		if (rc == 0 && p->create_rev) {
			/* Not there at that revision, or written since: that
			 * key can never come back. */
			lockfs_etcd_txn_resp_free(&r);
			*pp = p->next;
			free(p->key);
			free(p);
			continue;
		}
		if (rc == 0) {
			lockfs_etcd_txn_resp_free(&r);
			p->tried = true;
		}
		pp = &p->next;
	}
	if (list) {
		pthread_mutex_lock(&s->mu);
		for (pp = &list; *pp; pp = &(*pp)->next)
			;
		*pp = s->pending;
		s->pending = list;
		pthread_mutex_unlock(&s->mu);
	}
}

/* LOST: revoke the old lease (its keys and host key go in one revision:
 * others see an expiry), then a new lease and host key.  0 once LIVE
 * again; else try again on the next tick. */
static int renew_session(struct etcd_store *e)
{
	struct etcd_session *s = &e->session;
	int64_t old, lease;
	int rc;

	pthread_mutex_lock(&s->mu);
	old = s->lease;
	pthread_mutex_unlock(&s->mu);
	rc = lockfs_etcd_lease_revoke(e->client, old);
	if (rc && rc != -ENOENT)
		return rc;
	rc = lockfs_etcd_lease_grant(e->client, e->ttl_s, 0, &lease, NULL);
	if (rc)
		return rc;
	rc = lockfs_etcdbe_session_put_host(e, lease, 0);
	if (rc) {
		(void)!lockfs_etcd_lease_revoke(e->client, lease);
		return rc;
	}
	pthread_mutex_lock(&s->mu);
	s->lease = lease;
	s->state = LOCKFS_SESSION_LIVE;
	s->since_ms = lockfs_wall_ms();
	s->sent_ms = lockfs_boot_ms();
	pthread_mutex_unlock(&s->mu);
	fprintf(stderr, "lockfs: etcd: new session %016" PRIx64 " (the locks of session "
		"%016" PRIx64 " were lost)\n", (uint64_t)lease, (uint64_t)old);
	return 0;
}

/* Enter STATE (with s->mu held); true when it changed. */
static bool enter_locked(struct etcd_session *s, enum lockfs_session_state state)
{
	if (s->state == state)
		return false;
	if (state == LOCKFS_SESSION_LOST) {
		if (s->n_lost == sizeof(s->lost_leases) / sizeof(s->lost_leases[0])) {
			memmove(s->lost_leases, s->lost_leases + 1,
				sizeof(s->lost_leases) - sizeof(s->lost_leases[0]));
			s->n_lost--;
		}
		s->lost_leases[s->n_lost++] = s->lease;
	}
	s->state = state;
	s->since_ms = lockfs_wall_ms();
	return true;
}

/*
 * A release's guarded delete of a key on LEASE found the key gone.  Who
 * removed it decides how the grant ended, and only etcd can say:
 *  - LEASE is gone too (expired or revoked): etcd ended the session and
 *    its keys with it, before this delete.  The grant is lost, even when
 *    an earlier copy of the delete (RESENT) may have removed the key
 *    first: nothing confirmed that it did, so the holder hears ESTALE
 *    (fail closed; docs/errors.md).  The session is LOST from now on, as
 *    the keepalive would find at its next turn.
 *  - LEASE lives: an earlier copy of this very delete removed the key
 *    (RESENT: the release happened, 0), or someone removed it behind this
 *    daemon's back (-ENOENT: the engine logs it lost).
 * When etcd cannot be asked, the answer is as before the question: 0 when
 * RESENT, else -ENOENT.
 */
int lockfs_etcdbe_release_missed(struct etcd_store *e, int64_t lease, bool resent)
{
	struct etcd_session *s = &e->session;
	struct lockfs_etcd_lease_info info;
	int rc = lockfs_etcd_lease_timetolive(e->client_short, lease, false, &info);
	bool changed = false;

	lockfs_etcd_lease_info_free(&info);
	if (rc != -ENOENT && !lockfs_etcdbe_session_lost_lease(e, lease))
		return resent ? 0 : -ENOENT;
	pthread_mutex_lock(&s->mu);
	if (s->lease == lease)
		changed = enter_locked(s, LOCKFS_SESSION_LOST);
	pthread_mutex_unlock(&s->mu);
	if (changed)
		fprintf(stderr, "lockfs: etcd: session %016" PRIx64 " is lost (a release found "
			"its key gone with it)\n", (uint64_t)lease);
	return -ESTALE;
}

static const char *state_name(enum lockfs_session_state st)
{
	return st == LOCKFS_SESSION_LIVE ? "live" : st == LOCKFS_SESSION_UNCERTAIN ?
	       "uncertain" : "lost";
}

/* One keepalive, and the state it leaves.  True when the state changed.
 * Once ttl has passed since the last confirmed send, the session is lost
 * for good, even if etcd answers this keepalive: the lock of this daemon
 * may have been someone else's in between (nothing is re-held). */
static bool keep_alive(struct etcd_store *e)
{
	struct etcd_session *s = &e->session;
	int64_t lease, sent, quiet;
	bool changed = false, gone;
	int rc;

	pthread_mutex_lock(&s->mu);
	lease = s->lease;
	if (state_now_locked(e) == LOCKFS_SESSION_LOST) {
		changed = enter_locked(s, LOCKFS_SESSION_LOST);
		pthread_mutex_unlock(&s->mu);
		goto said;
	}
	pthread_mutex_unlock(&s->mu);
	sent = lockfs_boot_ms();
	rc = lockfs_etcd_lease_keepalive(e->client, lease, NULL);
	gone = rc == -ENOENT;
	/* etcd did not answer: the watch's connection may be as frozen as
	 * this one, with nothing to say so (a partition): reopen it. */
	if (rc && !gone)
		lockfs_etcdbe_session_watch_ended(e, false, 0);
	if (rc == 0)
		lockfs_etcdbe_say_reachable(e);
	else if (!gone)
		lockfs_etcdbe_say_unreachable(e, rc);
	pthread_mutex_lock(&s->mu);
	if (s->lease == lease) {
		quiet = lockfs_boot_ms() - s->sent_ms;
		if (gone || quiet >= e->ttl_s * 1000) {
			changed = enter_locked(s, LOCKFS_SESSION_LOST);
		} else {
			if (rc == 0 && sent > s->sent_ms)
				s->sent_ms = sent;
			quiet = lockfs_boot_ms() - s->sent_ms;
			changed = enter_locked(s, quiet >= e->ttl_s * 1000 * 2 / 3 ?
					       LOCKFS_SESSION_UNCERTAIN : LOCKFS_SESSION_LIVE);
		}
	}
	pthread_mutex_unlock(&s->mu);
said:
	if (changed)
		fprintf(stderr, "lockfs: etcd: session %016" PRIx64 " is %s\n", (uint64_t)lease,
			state_name(lockfs_etcdbe_session_state(e, NULL)));
	return changed;
}

/* Reopen the watch when it ended.  True when it did so from a fresh read
 * (anything may have changed). */
static bool restart_watch(struct etcd_store *e)
{
	struct etcd_session *s = &e->session;
	bool ended, resync;
	int64_t from;

	pthread_mutex_lock(&s->mu);
	ended = s->watch_ended;
	resync = s->watch_resync;
	from = s->watch_from;
	pthread_mutex_unlock(&s->mu);
	if (!ended)
		return false;
	if (s->hooks->watch_reopen(e, from, &resync))
		return false;
	pthread_mutex_lock(&s->mu);
	s->watch_ended = false;
	s->watch_resync = false;
	pthread_mutex_unlock(&s->mu);
	return resync;
}

static void *session_thread(void *arg)
{
	struct etcd_store *e = arg;
	struct etcd_session *s = &e->session;
	int64_t next = lockfs_boot_ms(), watch_retry = 0;

	for (;;) {
		struct etcd_names all = { 0 };
		bool session_changed = false;
		struct timespec ts;
		int64_t wait_ms;

		pthread_mutex_lock(&s->mu);
		wait_ms = next - lockfs_boot_ms();
		/* A watch that failed to reopen is retried with the keepalives,
		 * not in a loop. */
		if (!s->stop && (!s->watch_ended || lockfs_boot_ms() < watch_retry) &&
		    wait_ms > 0) {
			clock_gettime(CLOCK_MONOTONIC, &ts);
			ts.tv_sec += wait_ms / 1000;
			ts.tv_nsec += (wait_ms % 1000) * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		}
		if (s->stop) {
			pthread_mutex_unlock(&s->mu);
			break;
		}
		pthread_mutex_unlock(&s->mu);

		if (lockfs_boot_ms() >= next) {
			next = lockfs_boot_ms() + interval_ms(e);
			session_changed = keep_alive(e);
			if (lockfs_etcdbe_session_state(e, NULL) == LOCKFS_SESSION_LOST &&
			    renew_session(e) == 0)
				session_changed = true;
			resolve_pending(e);
			lockfs_etcdbe_mirror_delays_over(&e->mirror, lockfs_wall_ms(), &all);
			s->hooks->tick(e);
		}
		if (lockfs_boot_ms() >= watch_retry) {
			bool ended;

			all.all = restart_watch(e);
			pthread_mutex_lock(&s->mu);
			ended = s->watch_ended;
			pthread_mutex_unlock(&s->mu);
			watch_retry = ended ? lockfs_boot_ms() + interval_ms(e) : 0;
		}
		if (all.all || all.n || session_changed)
			s->hooks->report(e, &all, session_changed);
	}
	return NULL;
}

int lockfs_etcdbe_session_start(struct etcd_store *e)
{
	struct etcd_session *s = &e->session;
	int rc = -pthread_create(&s->thread, NULL, session_thread, e);

	if (rc == 0) {
		pthread_setname_np(s->thread, "lockfs-session");
		s->running = true;
	}
	return rc;
}

void lockfs_etcdbe_session_stop(struct etcd_store *e)
{
	struct etcd_session *s = &e->session;

	if (!s->running)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->thread, NULL);
	s->running = false;
}

void lockfs_etcdbe_session_destroy(struct etcd_store *e)
{
	struct etcd_session *s = &e->session;

	while (s->pending) {
		struct etcd_pending *p = s->pending;

		s->pending = p->next;
		free(p->key);
		free(p);
	}
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
}
