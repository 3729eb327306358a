/*
 * The startup scan (startup.h): the locks the store holds when the daemon
 * starts.  Each record is read, cached and its holder watched; fd locks
 * are rebound to the processes that still hold their old descriptors --
 * unless this daemon resumes the same FUSE connection (resume.h): then they
 * stay bound to their open files;
 * then everything that died while no daemon watched is recovered, before
 * the mount serves anyone; last, with a store of sessions (etcd), the
 * locks left alive are adopted into this daemon's session.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "audit.h"
#include "rebound.h"
#include "recovery.h"
#include "resume.h"
#include "session.h"
#include "startup.h"
#include "store.h"
#include "table.h"

/* How often one lock's adoption is asked for while the store cannot
 * answer (each ask is bounded by the store: etcd 1 s). */
#define ADOPT_TRIES 3

/* Log C's `adopted` line: its key moved from session FROM to the store's
 * ST (the new one). */
static void log_adopted(struct lockfs_table *t, const struct held_lock *c, int64_t from,
			const struct lockfs_entry_stat *st)
{
	const struct lockfs_record *r = &c->rec;
	char who[WHO_MAX], fence[24], uid[16], pid[16], holders[16], session[24], old[24];
	const char *kv[] = { "fence", fence, "uid", uid, "pid", pid, "holders", holders,
			     "key", st->key, "session", session, "from", old,
			     "evidence", "daemon-restart", NULL };

	lockfs_audit_who(who, sizeof(who), r->slug, r->holder.comm, r->holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, r->fence);
	lockfs_audit_ids(uid, pid, r->holder.uid, r->holder.pid);
	snprintf(holders, sizeof(holders), "%zu", lockfs_record_holders(r));
	snprintf(session, sizeof(session), "%016" PRIx64, (uint64_t)st->lease);
	snprintf(old, sizeof(old), "%016" PRIx64, (uint64_t)from);
	lockfs_audit_event(t, who, c->name, kv, "adopted");
}

/*
 * C is a lock the scan kept: its holder lives by the rules above.  If it
 * is this host's, make it this daemon's in the store (adopt), with its
 * place and fence, and say so.  One the store no longer has (the earlier
 * daemon's session expired meanwhile) was lost: `lost`, and its holder's
 * rmdir answers ESTALE.  One the store cannot take now stays as it is
 * (the store says why on stderr) and ends with the earlier session.
 * With s->mu held; C may be gone afterwards.
 */
static void adopt_locked(struct lockfs_table *t, struct stripe *s, struct held_lock *c)
{
	struct lockfs_entry_stat before = { 0 }, after;
	int rc = -EIO;

	if (!c->rec.has_holder || lockfs_table_elsewhere(t, &c->rec.holder) ||
	    !lockfs_table_issued_here(c))
		return;
	/* The session the key is on now, for the line (the mirror: no wait). */
	(void)lockfs_store_stat(t->be, c->name, &before, true);
	for (int i = 0; i < ADOPT_TRIES && rc == -EIO; i++)
		rc = lockfs_store_adopt(t->be, c->name, c->identity, &after);
	if (rc == -ENOENT) {
		lockfs_session_lose_locked(t, s, c, before.lease);
		return;
	}
	/* Kept as it is (the store said why), or this daemon's already. */
	if (rc < 0 || (after.identity == c->identity && after.lease == before.lease))
		return;
	c->identity = after.identity;
	log_adopted(t, c, before.lease, &after);
}

/*
 * A store whose locks hang on a daemon's session (etcd): the locks of
 * this host that the scan kept are adopted, before start() lets go of
 * the earlier daemon's session (and with it every key not adopted: its
 * dead holders' were released above, its waiters' places died with their
 * requests).  dir has no sessions: its locks stay as they are, unasked.
 */
static void adopt_all(struct lockfs_table *t)
{
	if (!(t->be->caps & LOCKFS_BE_SESSIONS))
		return;
	for (int k = 0; k < STRIPES; k++) {
		struct stripe *s = &t->stripes[k];

		pthread_mutex_lock(&s->mu);
		for (struct held_lock *c = s->head, *next; c; c = next) {
			next = c->next;
			adopt_locked(t, s, c);
		}
		lockfs_table_unlock(s);
	}
}

int lockfs_startup_scan(struct lockfs_table *t)
{
	char **names;
	size_t n;
	int rc;

	t->starting = true;
	rc = lockfs_table_names(t, &names, &n);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		struct stripe *s = lockfs_table_stripe(t, names[i]);
		struct lockfs_entry_stat st;
		struct held_lock *c;
		bool foreign;

		/* Reading each record caches it and watches its holder; a
		 * holder that died while no daemon watched is marked gone. */
		pthread_mutex_lock(&s->mu);
		if (lockfs_table_reload(t, s, names[i], &st, &foreign, &c) == 0 && c) {
			/* The same connection: its open files still come. */
			if (t->resuming)
				lockfs_resume_keep_locked(t, s, c);
			else
				lockfs_rebound_bind_locked(t, s, c, &st);
		}
		lockfs_table_unlock(s);
	}
	if (rc == 0) {
		lockfs_table_names_free(names, n);
		/* Nothing is served yet: recover it all now, while the
		 * evidence is `exited-while-down`. */
		lockfs_recovery_startup(t);
		adopt_all(t);
	}
	t->starting = false;
	return rc;
}
