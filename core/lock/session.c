/*
 * This daemon's session with the store: losing it, and what follows.
 * See session.h.
 *
 * Fail closed: once the store says this daemon's session is lost (its
 * TTL passed with no renewal confirmed), another host may already hold
 * what this host's processes think they hold.  Each of those locks is
 * logged `lost`, its holder is signalled (-o break_signal) and its rmdir
 * answers ESTALE, never 0: the holder must learn that its critical
 * section may not have been exclusive.  Nothing is re-held when the store
 * answers again.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "audit.h"
#include "caller.h"
#include "queue.h"
#include "session.h"
#include "table.h"

/* How long a holder's look at a lost NAME keeps answering ESTALE once it
 * was told: the kernel looks a name up again at once (LOOKUP_REVAL) when
 * a lookup says ESTALE, and that retry must say it too. */
#define TOLD_MS 200

/* A holder to signal once the stripe mutex is let go. */
struct to_signal {
	pid_t pid;
	unsigned long long start;
};

struct signals {
	struct to_signal *v;
	size_t n, cap;
};

static void signals_add(struct signals *sg, pid_t pid, unsigned long long start)
{
	if (sg->n == sg->cap) {
		size_t cap = sg->cap ? sg->cap * 2 : 16;
		struct to_signal *v = realloc(sg->v, cap * sizeof(*v));

		if (!v)
			return; /* no memory: the lost line and ESTALE still tell it */
		sg->v = v;
		sg->cap = cap;
	}
	sg->v[sg->n++] = (struct to_signal){ pid, start };
}

/* Keep holder I of C's record as a tombstone of S (no memory: its rmdir
 * answers ENOENT, as for a lock it never held). */
static void tombstone_add(struct stripe *s, const struct cached *c, size_t i)
{
	struct tombstone *ts = calloc(1, sizeof(*ts));

	if (!ts || !(ts->name = strdup(c->name))) {
		free(ts);
		return;
	}
	ts->fence = lockfs_record_fence_at(&c->rec, i);
	lockfs_caller_ref_at(&ts->holder, &c->rec, i);
	ts->next = s->tombstones;
	s->tombstones = ts;
}

/* Log holder I of C `lost` (session= the lost lease, in hex). */
static void log_lost(struct lockfs_table *t, const struct cached *c, size_t i, int64_t lease)
{
	const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);
	char who[WHO_MAX], fence[24], uid[16], pid[16], session[24];
	const char *kv[] = { "fence", fence, "uid", uid, "pid", pid,
			     "evidence", "session-expired", "session", session, NULL };

	lockfs_audit_who(who, sizeof(who), i == 0 ? c->rec.slug : NULL, h->comm, h->pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, lockfs_record_fence_at(&c->rec, i));
	lockfs_audit_ids(uid, pid, h->uid, h->pid);
	snprintf(session, sizeof(session), "%016" PRIx64, (uint64_t)lease);
	lockfs_audit_event(t, who, c->name, kv, "lost");
}

/* Is C a lock of this host that the store no longer keeps on a live
 * session of this daemon (LEASE lost)?  ALL: the session is LOST right
 * now, so every lock of this host is (backend.h).  With s->mu held. */
static bool lost_with(struct lockfs_table *t, const struct cached *c, int64_t lease, bool all)
{
	struct lockfs_entry_stat st;
	int rc;

	if (!c->rec.has_holder || lockfs_table_elsewhere(t, &c->rec.holder) ||
	    !lockfs_table_issued_here(c))
		return false;
	if (all)
		return true;
	rc = t->be->ops->stat(t->be, c->name, &st, true);
	if (rc == -ENOENT || rc == -ESTALE)
		return true;
	return rc == 0 && (st.identity != c->identity || (lease && st.lease == lease));
}

/* Every lock of this host lost with session LEASE: logged, tombstoned,
 * dropped from the cache; its holders go into SG, to be signalled once
 * no engine mutex is held. */
static void lose_all(struct lockfs_table *t, int64_t lease, bool all, struct signals *sg)
{
	for (int k = 0; k < STRIPES; k++) {
		struct stripe *s = &t->stripes[k];

		pthread_mutex_lock(&s->mu);
		for (struct cached *c = s->head, *next; c; c = next) {
			size_t n;

			next = c->next;
			if (!lost_with(t, c, lease, all))
				continue;
			n = lockfs_record_holders(&c->rec);
			for (size_t i = 0; i < n; i++) {
				const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);

				log_lost(t, c, i, lease);
				tombstone_add(s, c, i);
				if (t->break_signal && h->pid > 0)
					signals_add(sg, h->pid, h->start_time);
			}
			lockfs_table_drop(t, s, c->name);
		}
		lockfs_table_unlock(s);
	}
}

void lockfs_session_lose_locked(struct lockfs_table *t, struct stripe *s, struct cached *c,
				int64_t lease)
{
	size_t n = lockfs_record_holders(&c->rec);

	for (size_t i = 0; i < n; i++) {
		const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);

		log_lost(t, c, i, lease);
		tombstone_add(s, c, i);
		/* The liveness mutex is a leaf: taken inside a stripe's. */
		if (t->break_signal && h->pid > 0)
			(void)lockfs_liveness_signal(t->liveness, h->pid, h->start_time,
						     t->break_signal);
	}
	lockfs_table_drop(t, s, c->name);
}

/* Drop tombstones whose holder is gone: nobody is left to tell. */
static void prune_tombstones(struct lockfs_table *t)
{
	for (int k = 0; k < STRIPES; k++) {
		struct stripe *s = &t->stripes[k];

		pthread_mutex_lock(&s->mu);
		for (struct tombstone **pp = &s->tombstones; *pp;) {
			struct tombstone *ts = *pp;
			unsigned long long start;

			if (lockfs_procs_start_time(t->procs, ts->holder.pid, &start) == 0 &&
			    start == ts->holder.start) {
				pp = &ts->next;
				continue;
			}
			*pp = ts->next;
			free(ts->name);
			free(ts);
		}
		lockfs_table_unlock(s);
	}
}

void lockfs_session_check(struct lockfs_table *t)
{
	struct lockfs_session cur;
	struct signals sg = { 0 };
	int64_t lost = 0;
	bool rejoin = false, tombs = false;

	if (!(t->be->caps & LOCKFS_BE_SESSIONS) || t->be->ops->session(t->be, NULL, &cur) < 0)
		return;
	pthread_mutex_lock(&t->session_mu);
	if (cur.state == LOCKFS_SESSION_LOST) {
		lost = cur.id;
	} else if (t->session_id && cur.id != t->session_id) {
		lost = t->session_id; /* lost and replaced before we looked */
	}
	if (lost && lost == t->session_lost_id)
		lost = 0; /* acted on already */
	if (lost) {
		t->session_lost_id = lost;
		lose_all(t, lost, cur.state == LOCKFS_SESSION_LOST, &sg);
	}
	if (cur.state == LOCKFS_SESSION_LIVE && cur.id && cur.id != t->session_id) {
		rejoin = t->session_id != 0;
		t->session_id = cur.id;
	}
	for (int k = 0; k < STRIPES && !tombs; k++)
		tombs = t->stripes[k].tombstones != NULL; /* racy read: a hint */
	pthread_mutex_unlock(&t->session_mu);
	for (size_t i = 0; i < sg.n; i++)
		lockfs_liveness_signal(t->liveness, sg.v[i].pid, sg.v[i].start, t->break_signal);
	free(sg.v);
	if (rejoin) {
		for (int k = 0; k < STRIPES; k++) {
			struct stripe *s = &t->stripes[k];

			pthread_mutex_lock(&s->mu);
			lockfs_queue_rejoin_locked(t, s, cur.id);
			lockfs_table_unlock(s);
		}
	}
	if (tombs)
		prune_tombstones(t);
}

int lockfs_session_tombstone_take(struct lockfs_table *t, struct stripe *s, const char *name,
				  const struct lockfs_caller *caller)
{
	int64_t now = lockfs_boot_ms();

	for (struct tombstone **pp = &s->tombstones; *pp; pp = &(*pp)->next) {
		struct tombstone *ts = *pp;

		if (strcmp(ts->name, name) != 0 || lockfs_caller_check(t, &ts->holder, caller) < 0)
			continue;
		if (!ts->told_until_ms)
			ts->told_until_ms = now + TOLD_MS;
		if (now < ts->told_until_ms)
			return -ESTALE;
		*pp = ts->next; /* told: from now on NAME is simply free */
		free(ts->name);
		free(ts);
		return -ENOENT;
	}
	return -ENOENT;
}

void lockfs_session_free_tombstones(struct stripe *s)
{
	while (s->tombstones) {
		struct tombstone *ts = s->tombstones;

		s->tombstones = ts->next;
		free(ts->name);
		free(ts);
	}
}
