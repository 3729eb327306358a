/*
 * The lock directories: `mkdir M/NAME` (lockfs_core_acquire), `rmdir`
 * (lockfs_core_release, and lockfs_core_lost for a lock lost with the
 * store's session), the kernel's lookup (lockfs_core_stat, which also
 * recovers a foreign lock the store calls stale) and `break`.  Each is a
 * short sequence of calls into core/lock/: checks, the caller (caller.h),
 * the table (table.h), the queue (queue.h), the audit line (audit.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"
#include "base/clock.h"
#include "engine.h"
#include "lock/audit.h"
#include "lock/caller.h"
#include "lock/fdlock.h"
#include "lock/metrics.h"
#include "lock/queue.h"
#include "lock/recovery.h"
#include "lock/resume.h"
#include "lock/session.h"
#include "lock/store.h"
#include "lock/table.h"

/* The mount's view of a held lock: REC is NULL for a foreign lock. */
static void fill_lock_stat(struct lockfs_lock_stat *out, const struct lockfs_record *rec,
			   const struct lockfs_entry_stat *st)
{
	if (!out)
		return;
	out->identity = st->identity;
	out->generation = rec ? rec->fence : st->identity;
	out->fence = rec ? rec->fence : 0;
	out->foreign = !rec;
	if (!rec || !rec->has_holder) {
		out->uid = st->uid;
		out->gid = st->gid;
		out->mtime_ms = st->mtime_ms;
	} else {
		out->uid = rec->holder.uid;
		out->gid = rec->holder.gid;
		out->mtime_ms = rec->acquired_at_ms;
	}
}

/*
 * Take back NAME's acquisition (store identity IDENTITY) whose `acquired`
 * line could not be written (ERR): no lock is held that the log does not
 * show.  If the store refuses, it stays held by its holder, watched like
 * any other (fail closed), and we say so; its end is not logged either
 * (the log never showed this holder).  With s->mu held.
 */
static void undo_acquire_locked(struct lockfs_core *core, struct stripe *s, const char *name,
				uint64_t identity, int err)
{
	struct lockfs_table *t = &core->table;
	int rc = lockfs_store_release(t->be, name, identity);

	if (rc < 0 && rc != -ENOENT) {
		struct held_lock *c = lockfs_table_find(s, name);

		if (c)
			c->unlogged = true;
		fprintf(stderr, "lockfs: %s: the log refused its acquisition (%s), and taking it "
			"back failed (%s): it stays with its holder until that exits\n",
			name, strerror(-err), strerror(-rc));
		return;
	}
	lockfs_table_drop(t, s, name);
	/* A waiter that came meanwhile is tried now (and told the same). */
	lockfs_queue_grant_locked(t, s, name);
}

/*
 * Take NAME for REC in the store (fence issued there).  A foreign lock
 * the store's staleness policy gives up (-o stale: the seed tool's rule)
 * is recovered and NAME taken in the same request, as the seed tool would
 * (logged `recovered evidence=foreign-stale`, as by the periodic sweep).
 * 0 (ST filled), -EEXIST, -errno.
 */
static int acquire_or_stale(struct lockfs_core *core, const char *name,
			    struct lockfs_record *rec, struct lockfs_entry_stat *st)
{
	struct lockfs_table *t = &core->table;
	struct lockfs_grant_src g;
	int rc = lockfs_store_acquire(t->be, name, LOCKFS_ACQ_TRY,
				     lockfs_table_grant_src(&g, rec, 0), NULL, st);

	if (rc == -EEXIST && lockfs_store_stales_foreign(t->be) &&
	    lockfs_recovery_stale_foreign(t, name) > 0)
		rc = lockfs_store_acquire(t->be, name, LOCKFS_ACQ_TRY,
					 lockfs_table_grant_src(&g, rec, 0), NULL, st);
	if (rc == 0)
		lockfs_table_grant_fence(&g, st);
	return rc;
}

/*
 * A resent mkdir (lockfs_caller.resent) of NAME, which is held: did the
 * predecessor grant NAME to this very request and die before its answer
 * went out?  The record says so when its holder is the caller's
 * holder-to-be HOLDER and it names this request (record.ticket; a record
 * without one: the holder alone -- who holds NAME anyway, so 0 gives
 * nobody a lock they did not have).  Then the answer is the one that was
 * lost: 0 with that lock, its fence and its `acquired` line unchanged.
 * 0 (OUT filled) or -EEXIST.
 */
static int resent_acquire(struct lockfs_core *core, const char *name,
			  const struct lockfs_caller *caller, const struct lockfs_proc *holder,
			  struct lockfs_lock_stat *out)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	int rc = -EEXIST;

	pthread_mutex_lock(&s->mu);
	if (lockfs_table_load(t, s, name, &st, &foreign, &c) == 0 && c && c->rec.has_holder &&
	    c->rec.bound != LOCKFS_BOUND_FD && lockfs_table_issued_here(c) &&
	    !lockfs_table_elsewhere(t, &c->rec.holder) &&
	    c->rec.holder.pid == holder->pid && c->rec.holder.start_time == holder->start_time &&
	    (!c->rec.ticket || c->rec.ticket == caller->ticket)) {
		fill_lock_stat(out, &c->rec, &st);
		rc = 0;
	}
	lockfs_table_unlock(s);
	return rc;
}

/* mkdir M/NAME (lockfs_core_acquire, which counts its EEXISTs). */
static int acquire(struct lockfs_core *core, const char *name,
		   const struct lockfs_caller *caller, struct lockfs_lock_stat *out)
{
	struct lockfs_table *t = &core->table;
	struct lockfs_entry_stat st;
	struct lockfs_record rec;
	struct lockfs_proc holder;
	char slug[LOCKFS_SLUG_MAX], who[WHO_MAX], fence[24], uid[16], pid[16];
	char **argv = NULL; /* the holder's, when lockfs_caller_identify read it */
	bool bad_slug, waiters;
	struct stripe *s;
	int rc;

	rc = lockfs_name_check_stored(name);
	if (rc < 0)
		return rc;
	if (caller->resent)
		lockfs_resume_note_resent(t);
	/* No "is it free?" pre-check: the kernel looked NAME up just before
	 * sending MKDIR and answers EEXIST itself when it exists; the
	 * backend's indivisible step decides the rest.  But a name with
	 * queued waiters is theirs first (no barging): it can only be free
	 * here if a lock we cannot watch (the seed's) just went, so grant
	 * the queue now and say EEXIST. */
	s = lockfs_table_stripe(t, name);
	pthread_mutex_lock(&s->mu);
	waiters = lockfs_queue_has_waiters(s, name);
	if (waiters)
		lockfs_queue_grant_locked(t, s, name);
	lockfs_table_unlock(s);
	/* A resent one may be the holder's own, answered below. */
	if (waiters && !caller->resent)
		return -EEXIST;
	/* With a pidfd opened before the holder's facts were read, watching
	 * it needs no second look at /proc -- unless the caller is watched
	 * already (a process that takes locks again and again), when the
	 * watch is simply shared. */
	rc = lockfs_caller_identify(t, caller, LOCKFS_PROC_NS |
				    (lockfs_liveness_watches_pid(t->liveness, caller->tid)
				     ? 0 : LOCKFS_PROC_PIDFD), &holder, slug, &argv, &bad_slug);
	/* A helper that stops the walk at a uid boundary (`setpriv --reuid=U
	 * mkdir`) would hold the lock only until it exits, at once: nobody
	 * believable holds it.  A slug lock is (uid, slug)'s, not a process's. */
	if (rc == 0 && holder.at_uid_boundary && !*slug) {
		lockfs_proc_put(&holder);
		rc = -EACCES;
	}
	if (rc < 0) {
		/* Refused before a holder is known: the log names the caller
		 * by its thread (and its slug, unless that is what is wrong). */
		if (bad_slug || rc == -EACCES) {
			char container[LOCKFS_CONTAINER_MAX];

			lockfs_audit_who(who, sizeof(who), bad_slug ? NULL : slug, "?", caller->tid);
			lockfs_caller_container(t, caller->tid, container, sizeof(container));
			lockfs_audit_refusal(t, caller->uid, caller->tid, container, who, name,
					     bad_slug ? "bad-slug" : "holder-unknown");
		}
		lockfs_argv_free(argv);
		/* A caller gone before we could read it gets no answer anyway. */
		return rc == -ESRCH ? -EACCES : rc;
	}
	if (!holder.have_ids || *slug) {
		/* The caller itself holds: its credentials came with the request.
		 * A slug lock is bound to the uid of the process that asked,
		 * whichever process the helper rule shows as holder. */
		holder.uid = caller->uid;
		holder.gid = caller->gid;
	}
	/* WHO, built once: what a refusal and the `acquired` line name (the
	 * record's slug, comm and pid are copies of these). */
	lockfs_audit_who(who, sizeof(who), slug, holder.comm, holder.pid);
	/* Room for one more lock of the uid it will count against, kept
	 * until the cache counts it (or the store refuses). */
	{
		enum quota_reason why;

		rc = lockfs_quota_lock_reserve(t->quota, holder.uid, true, &why);
		if (rc < 0) {
			lockfs_caller_refuse(t, holder.uid, why, name, who, holder.pid);
			lockfs_proc_put(&holder);
			lockfs_argv_free(argv);
			return rc;
		}
	}
	rc = lockfs_caller_record(t, name, &holder, slug, &rec, &argv);
	if (rc < 0)
		goto unreserve;
	/* Which request this grant answers: a resent copy of it is known. */
	rec.ticket = caller->ticket;
	rc = waiters ? -EEXIST : acquire_or_stale(core, name, &rec, &st);
	if (rc < 0) {
		lockfs_record_clear(&rec);
		if (rc == -EEXIST && caller->resent)
			rc = resent_acquire(core, name, caller, &holder, out);
		goto unreserve;
	}

	fill_lock_stat(out, &rec, &st);
	snprintf(fence, sizeof(fence), "%" PRIu64, rec.fence);
	lockfs_audit_ids(uid, pid, rec.holder.uid, rec.holder.pid);
	/* The line under the stripe mutex: nothing can end this
	 * acquisition before its `acquired` is written, or see it if that
	 * write fails and it is taken back.  And only after taking it: a
	 * release of NAME that made room for this acquisition writes its
	 * line before it lets the mutex go (lockfs_queue_let_go_locked), so the log
	 * never shows two holders at once. */
	pthread_mutex_lock(&s->mu);
	lockfs_table_put_new(t, s, name, st.identity, &rec, holder.has_pidfd ? holder.pidfd : -1);
	lockfs_session_tombstone_forget(s, lockfs_table_find(s, name)); /* it has NAME again */
	{
		const char *kv[9] = { "fence", fence, "uid", uid, "pid", pid };

		lockfs_audit_put_container(kv, 6, holder.container);
		rc = lockfs_audit_acquired(t, who, name, kv);
	}
	if (rc < 0)
		undo_acquire_locked(core, s, name, st.identity, rc);
	lockfs_table_unlock(s);
	lockfs_quota_lock_unreserve(t->quota, holder.uid, true);
	lockfs_record_clear(&rec);
	return rc;
unreserve:
	lockfs_quota_lock_unreserve(t->quota, holder.uid, true);
	lockfs_proc_put(&holder);
	lockfs_argv_free(argv);
	return rc;
}

int lockfs_core_acquire(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller, struct lockfs_lock_stat *out)
{
	int rc = acquire(core, name, caller, out);

	/* Contention: the lock was held (or had waiters). */
	if (rc == -EEXIST)
		lockfs_metrics_busy(core->table.metrics);
	return rc;
}

int lockfs_core_release(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	const int64_t asked_ms = lockfs_wall_ms(); /* before the store is tried */
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	int rc;

	if (lockfs_name_check_stored(name) < 0)
		return -ENOENT;
	if (caller->resent)
		lockfs_resume_note_resent(t);
	/* A session lost since the store last reported: its locks are lost
	 * (tombstoned) before this rmdir looks for NAME. */
	lockfs_session_check(t);
	pthread_mutex_lock(&s->mu);
	/* Release only what the record in the store says: the cached copy
	 * counts only while the record file's identity (inode, times, size)
	 * is unchanged, else it is read and parsed again. */
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc == -ENOENT && s->tombstones)
		rc = lockfs_session_tombstone_take(t, s, name, caller); /* lost: ESTALE */
	/*
	 * A resent rmdir (lockfs_caller.resent) of a free name: the kernel
	 * sent it while NAME was there (it looked NAME up first), so the
	 * predecessor most likely released it for this very request and died
	 * before answering.  0 is safe whatever happened: a free name is
	 * nobody's, so the answer ends no one's lock and grants none -- at
	 * worst a caller whose lock went another way (its holder exited, a
	 * break) hears "released" for a lock that is gone either way.  A name
	 * held by anyone, the caller included, goes through the rule below
	 * as usual (someone else's: EPERM).
	 */
	if (rc == -ENOENT && caller->resent) {
		rc = 0;
		goto out;
	}
	if (rc < 0)
		goto out;
	if (c && !lockfs_table_issued_here(c)) {
		/* The record is not the one we issued: someone rewrote the
		 * store behind our back.  Fail closed: keep it, say so. */
		lockfs_table_unlock(s);
		lockfs_caller_denied(t, name, caller, "token-mismatch");
		return -EPERM;
	}
	/* A shared lock: the caller lets go of the first share it holds. */
	{
		size_t i = 0, n = c ? lockfs_record_holders(&c->rec) : 0;
		struct lockfs_holder_ref h;
		uint64_t fence;
		bool ended;

		rc = -EPERM;
		do {
			lockfs_caller_ref_at(&h, c ? &c->rec : NULL, i);
			rc = lockfs_caller_check(t, &h, caller);
		} while (rc == -EPERM && ++i < n);
		/* The caller's own lock was lost, and NAME was taken since
		 * (here, on another host, by a foreign client): the answer is
		 * "yours was lost" (ESTALE), asked before "not yours" (EPERM). */
		if (rc < 0 && s->tombstones &&
		    lockfs_session_tombstone_take(t, s, name, caller) == -ESTALE) {
			rc = -ESTALE;
			goto out;
		}
		/* A resent rmdir that the predecessor carried out by handing
		 * NAME to the head of its queue (record.handed_by): that was
		 * its answer, 0.  NAME stays the new holder's. */
		if (rc == -EPERM && c && caller->resent && caller->ticket &&
		    c->rec.handed_by == caller->ticket) {
			rc = 0;
			goto out;
		}
		if (rc < 0) {
			lockfs_table_unlock(s);
			lockfs_caller_denied(t, name, caller, foreign ? "foreign-lock" :
				   rc != -EPERM ? "caller-unknown" :
				   c->rec.has_holder && lockfs_table_elsewhere(t, &c->rec.holder)
				   ? "other-host" : "not-holder");
			return rc;
		}
		/* The caller's tree asked for NAME by flock and gave up just
		 * as its place became the head (or waits there still): that
		 * place, never granted, is withdrawn as its own unlock would
		 * withdraw it -- no end line for a grant nobody had. */
		if (lockfs_table_place_only(t, c)) {
			char owner[LOCKFS_FD_OWNER_MAX];

			snprintf(owner, sizeof(owner), "%s", lockfs_record_fd_owner_at(&c->rec, i));
			lockfs_queue_forget_kept(s, name, owner);
			rc = lockfs_core_fd_let_go_locked(t, s, name, c, st.identity, i, owner,
							  asked_ms);
			goto out;
		}
		/* Also a grant whose descriptor let go while the store
		 * refused (struct unlock_retry): nothing was logged for it
		 * then, so this is its `released` -- unless it is a grant the
		 * log refused, which never showed in the log at all, or one
		 * logged `lost` already, whose key the store still shows (a
		 * view of it from before the loss): that one ended then. */
		fence = lockfs_record_fence_at(&c->rec, i);
		ended = lockfs_session_tombstoned(s, name, fence);
		rc = lockfs_queue_let_go_locked(t, s, c, &(struct lockfs_let_go){
			.identity = st.identity, .index = i, .ticket = caller->ticket,
			.event = ended ? NULL : lockfs_fdlock_release_event(s, name, &c->rec, i) });
		/* The store says the session that held it is gone (-ESTALE):
		 * the grant is lost now, before its holder is told. */
		if (rc == -ESTALE && (c = lockfs_table_find(s, name)))
			lockfs_session_vanished_locked(t, s, c, NULL);
		/* Lost before or while it was let go (the store found its key
		 * gone): the holder hears ESTALE, once, never 0. */
		if (ended || lockfs_session_tombstoned(s, name, fence)) {
			rc = lockfs_session_tombstone_take(t, s, name, caller);
			goto out;
		}
		/* The store refused it (etcd unreachable): the rmdir says EIO,
		 * and the engine completes the release once the store answers
		 * (the tick's retries), logged then with retried=1. */
		if (rc == -EIO && (t->be->caps & LOCKFS_BE_RETRY_RELEASES) &&
		    (c = lockfs_table_find(s, name)) && i < lockfs_record_holders(&c->rec) &&
		    lockfs_record_bound_at(&c->rec, i) != LOCKFS_BOUND_FD) {
			const struct lockfs_holder *hd = lockfs_record_holder(&c->rec, i);
			struct unlock_retry *r = lockfs_fdlock_retry_add(
				t, s, name, "", lockfs_record_fence_at(&c->rec, i), rc, true, asked_ms);

			if (r) {
				lockfs_audit_who(r->who, sizeof(r->who), i == 0 ? c->rec.slug : NULL,
						 hd->comm, hd->pid);
				r->uid = hd->uid;
				r->pid = hd->pid;
			}
		}
	}
out:
	lockfs_table_unlock(s);
	return rc;
}

bool lockfs_core_lost(struct lockfs_core *core, const char *name)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s;
	bool lost = false;

	if (!(t->be->caps & LOCKFS_BE_SESSIONS) || lockfs_name_check_stored(name) < 0)
		return false;
	s = lockfs_table_stripe(t, name);
	pthread_mutex_lock(&s->mu);
	for (struct tombstone *ts = s->tombstones; ts && !lost; ts = ts->next)
		lost = !ts->done && strcmp(ts->name, name) == 0;
	lockfs_table_unlock(s);
	return lost;
}

static int view_stat(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
		     void *arg)
{
	fill_lock_stat(arg, c ? &c->rec : NULL, st);
	return 0;
}

int lockfs_core_stat(struct lockfs_core *core, const char *name, struct lockfs_lock_stat *out)
{
	struct lockfs_table *t = &core->table;
	struct lockfs_lock_stat st;
	int rc = lockfs_table_view(t, name, view_stat, &st);

	/* A foreign lock the store gives up (-o stale) is recovered when
	 * met, as by the periodic sweep: the kernel looks NAME up before it
	 * sends a mkdir, so this is where `mkdir M/NAME` meets it -- the
	 * lookup says "free" and the mkdir that follows acquires. */
	if (rc == 0 && st.foreign && lockfs_store_stales_foreign(t->be) &&
	    lockfs_recovery_stale_foreign(t, name) == 1)
		rc = lockfs_table_view(t, name, view_stat, &st);
	if (rc == 0 && out)
		*out = st;
	return rc;
}

/* Entries put_break_place adds after KV[N], its NULL included. */
#define BREAK_PLACE_MAX 7

/*
 * The tail of a `broken` line, from KV[N] on: across hosts (a store that
 * names keys, etcd) the breaking host and the broken key, since the
 * holder's own host logs its side apart (as `lost`); then the reason.  KV
 * has room for N + BREAK_PLACE_MAX entries.
 */
static void put_break_place(const struct lockfs_table *t, const struct lockfs_entry_stat *st,
			    const char *why, const char **kv, size_t n)
{
	if (st->key[0]) {
		kv[n++] = "host";
		kv[n++] = t->be->host;
		kv[n++] = "key";
		kv[n++] = st->key;
	}
	kv[n++] = "reason";
	kv[n++] = why;
	kv[n] = NULL;
}

/*
 * May BREAKER break C (NULL: a foreign lock)?  Root outside containers, or
 * under -o container_root=host, breaks anything; root in a container only
 * a lock every holder of which is in its own container (holder.md, "Root
 * in a container"): not a foreign lock, whose holder nobody knows.
 */
static bool breaks_all(const struct lockfs_reader *breaker, const struct held_lock *c)
{
	if (!breaker->container)
		return true;
	if (!c)
		return false;
	for (size_t i = 0; i < lockfs_record_holders(&c->rec); i++)
		if (!lockfs_reader_root_over(breaker, lockfs_record_holder(&c->rec, i)))
			return false;
	return lockfs_record_holders(&c->rec) > 0;
}

int lockfs_core_break(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *caller, const char *reason, size_t len)
{
	struct lockfs_table *t = &core->table;
	struct lockfs_reader breaker;
	char by_container[LOCKFS_CONTAINER_MAX];
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	char by[WHO_MAX], by_uid[16], by_pid[16], uid[16], none[16], *why;
	bool foreign, elsewhere = false;
	pid_t pid = 0, by_p;
	unsigned long long start = 0;
	int rc;

	if (len > 0 && reason[len - 1] == '\n')
		len--;
	if (len > LOCKFS_REASON_MAX)
		return -EFBIG;
	if (len == 0 || memchr(reason, '\0', len) || !lockfs_utf8_valid(reason, len))
		return -EINVAL;
	if (lockfs_name_check_stored(name) < 0)
		return -ENOENT;
	why = strndup(reason, len);
	if (!why)
		return -ENOMEM;
	/* The breaker, as the kernel tells it, beside the name it goes by,
	 * and the container it breaks from (read before the mutex). */
	by_p = lockfs_caller_who(t, caller->tid, by, sizeof(by));
	lockfs_audit_ids(by_uid, by_pid, caller->uid, by_p);
	lockfs_caller_container(t, caller->tid, by_container, sizeof(by_container));
	breaker.uid = 0; /* the powers break gives are root's (ops.c decided who) */
	breaker.host = t->host;
	breaker.boot_id = t->boot_id;
	breaker.container = by_container[0] && !t->container_root_host ? by_container : NULL;

	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_reload(t, s, name, &st, &foreign, &c);
	if (rc == 0 && !breaks_all(&breaker, c)) {
		elsewhere = true;
		rc = -EPERM;
	}
	if (rc == 0 && c) {
		const char *extra[8 + BREAK_PLACE_MAX] = { "by", by, "by_uid", by_uid,
							   "by_pid", by_pid };
		size_t n = 6;

		if (by_container[0]) {
			extra[n++] = "by_container";
			extra[n++] = by_container;
		}
		put_break_place(t, &st, why, extra, n);
		pid = c->rec.holder.pid;
		start = c->rec.holder.start_time;
		rc = lockfs_queue_let_go_locked(t, s, c, &(struct lockfs_let_go){
			.identity = st.identity, .all = true, .event = "broken", .extra = extra });
	} else if (rc == 0) {
		/* A foreign lock: uid= owns DIR/NAME.lock, no process known
		 * (so no breaker in a container got here). */
		const char *kv[10 + BREAK_PLACE_MAX] = { "uid", uid, "pid", none, "by", by,
							 "by_uid", by_uid, "by_pid", by_pid };

		put_break_place(t, &st, why, kv, 10);
		lockfs_audit_ids(uid, none, st.uid, 0);
		/* Logged once it happened, under the mutex (lockfs_queue_let_go_locked). */
		rc = lockfs_store_release(t->be, name, st.identity);
		if (rc == 0)
			lockfs_audit_event(t, "?", name, kv, "broken");
	}
	lockfs_table_unlock(s);
	free(why);
	if (elsewhere)
		lockfs_audit_refusal(t, caller->uid, by_p, by_container, by, name,
				     "other-container");
	if (rc < 0)
		return rc;
	if (t->break_signal && pid > 0)
		lockfs_liveness_signal(t->liveness, pid, start, t->break_signal);
	return 0;
}
