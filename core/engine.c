/*
 * The top of the core: every lockfs_core_* of include/lockfs/core.h, each
 * a short sequence of calls into core/lock/ -- checks, the caller
 * (caller.h), the table (table.h), the queue (queue.h), the audit line
 * (audit.h).  What happens without a request (holder death, leases,
 * restart) is recovery.c's and startup.c's, wired here to the liveness
 * thread.  docs/architecture.md draws the floors.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"
#include "base/clock.h"
#include "lock/session.h"
#include "lock/audit.h"
#include "lock/caller.h"
#include "lock/changes.h"
#include "lock/fdlock.h"
#include "lock/queue.h"
#include "lock/recovery.h"
#include "lock/startup.h"
#include "lock/store.h"
#include "lock/table.h"
#include "proc/fds.h"
#include "proc/procevents.h"
#include "engine_test.h"

#define DEFAULT_LEASE_S 600
/* Quota defaults (docs/quota.md says why).  A lock costs DIR up to
 * LOCK_BYTES (its record file: two pages with a 4 KiB command line) and
 * two inodes, and the daemon about 5 KiB. */
#define DEFAULT_LOCKS_PER_UID 1024
#define DEFAULT_WAITERS_PER_UID 1024
#define DEFAULT_OPEN_PER_UID 1024
#define DEFAULT_LOCKS_MAX 16384
#define DEFAULT_LOCKS_MIN 64
#define LOCK_BYTES 8192
#define LOCK_INODES 2
/* How often the liveness thread looks at leases and holders. */
#define TICK_MS 50
/* How much of a waiter's command line is kept for its record. */
#define WAITER_CMDLINE_MAX 4096

/* The engine: the table its floors share, and what only requests and
 * opening need.  Private to this file (core.h declares it opaque). */
struct lockfs_core {
	struct lockfs_table table;
	struct lockfs_procevents *procevents; /* NULL: descendants found by scans */
	struct lockfs_fds fds;  /* descriptors kept for callers (fds.h); its own mutex */
	bool open_cap_given;    /* -o max_open_per_uid was set; read-only */
};

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

int lockfs_core_acquire(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller, struct lockfs_lock_stat *out)
{
	struct lockfs_table *t = &core->table;
	struct lockfs_entry_stat st;
	struct lockfs_record rec;
	struct lockfs_proc holder;
	char slug[LOCKFS_SLUG_MAX], who[WHO_MAX], fence[24], uid[16], pid[16];
	char **argv = NULL; /* the holder's, when lockfs_caller_identify read it */
	bool bad_slug;
	struct stripe *s;
	int rc;

	rc = lockfs_name_check(name);
	if (rc < 0)
		return rc;
	/* No "is it free?" pre-check: the kernel looked NAME up just before
	 * sending MKDIR and answers EEXIST itself when it exists; the
	 * backend's indivisible step decides the rest.  But a name with
	 * queued waiters is theirs first (no barging): it can only be free
	 * here if a lock we cannot watch (the seed's) just went, so grant
	 * the queue now and say EEXIST. */
	s = lockfs_table_stripe(t, name);
	pthread_mutex_lock(&s->mu);
	if (lockfs_queue_has_waiters(s, name)) {
		lockfs_queue_grant_locked(t, s, name);
		lockfs_table_unlock(s);
		return -EEXIST;
	}
	lockfs_table_unlock(s);
	/* With a pidfd opened before the holder's facts were read, watching
	 * it needs no second look at /proc -- unless the caller is watched
	 * already (a process that takes locks again and again), when the
	 * watch is simply shared. */
	rc = lockfs_caller_identify(t, caller, LOCKFS_PROC_NS |
				    (lockfs_liveness_watches_pid(t->liveness, caller->tid)
				     ? 0 : LOCKFS_PROC_PIDFD), &holder, slug, &argv, &bad_slug);
	if (bad_slug) {
		lockfs_audit_who(who, sizeof(who), NULL, "?", caller->tid);
		lockfs_audit_refusal(t, caller->uid, caller->tid, who, name, "bad-slug");
		return -EINVAL;
	}
	/* A helper that stops the walk at a uid boundary (`setpriv --reuid=U
	 * mkdir`) would hold the lock only until it exits, at once: nobody
	 * believable holds it.  A slug lock is (uid, slug)'s, not a process's. */
	if (rc == 0 && holder.at_uid_boundary && !*slug) {
		lockfs_proc_put(&holder);
		rc = -EACCES;
	}
	if (rc < 0) {
		if (rc == -EACCES) {
			lockfs_audit_who(who, sizeof(who), slug, "?", caller->tid);
			lockfs_audit_refusal(t, caller->uid, caller->tid, who, name,
					     "holder-unknown");
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
	/* Room for one more lock of the uid it will count against, kept
	 * until the cache counts it (or the store refuses). */
	{
		enum quota_reason why;

		rc = lockfs_quota_lock_reserve(t->quota, holder.uid, true, &why);
		if (rc < 0) {
			lockfs_audit_who(who, sizeof(who), slug, holder.comm, holder.pid);
			lockfs_caller_refuse(t, holder.uid, why, name, who, holder.pid);
			lockfs_proc_put(&holder);
			lockfs_argv_free(argv);
			return rc;
		}
	}
	rc = lockfs_caller_record(t, name, &holder, slug, &rec, &argv);
	if (rc < 0)
		goto unreserve;
	rc = acquire_or_stale(core, name, &rec, &st);
	if (rc < 0) {
		lockfs_record_clear(&rec);
		goto unreserve;
	}

	fill_lock_stat(out, &rec, &st);
	lockfs_audit_who(who, sizeof(who), rec.slug, rec.holder.comm, rec.holder.pid);
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
		const char *kv[] = { "fence", fence, "uid", uid, "pid", pid, NULL };

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

int lockfs_core_release(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
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
		if (rc < 0) {
			lockfs_table_unlock(s);
			lockfs_caller_denied(t, name, caller, foreign ? "foreign-lock" :
				   rc != -EPERM ? "caller-unknown" :
				   c->rec.has_holder && lockfs_table_elsewhere(t, &c->rec.holder)
				   ? "other-host" : "not-holder");
			return rc;
		}
		/* Also a grant whose descriptor let go while the store
		 * refused (struct unlock_retry): nothing was logged for it
		 * then, so this is its `released` -- unless it is a grant the
		 * log refused, which never showed in the log at all. */
		rc = lockfs_queue_let_go_locked(t, s, c, &(struct lockfs_let_go){
			.identity = st.identity, .index = i,
			.event = lockfs_fdlock_release_event(s, name, &c->rec, i) });
		/* The store refused it (etcd unreachable): the rmdir says EIO,
		 * and the engine completes the release once the store answers
		 * (the tick's retries), logged then with retried=1. */
		if (rc == -EIO && (t->be->caps & LOCKFS_BE_RETRY_RELEASES) &&
		    (c = lockfs_table_find(s, name)) && i < lockfs_record_holders(&c->rec) &&
		    lockfs_record_bound_at(&c->rec, i) != LOCKFS_BOUND_FD) {
			const struct lockfs_holder *hd = lockfs_record_holder(&c->rec, i);
			struct unlock_retry *r = lockfs_fdlock_retry_add(
				s, name, "", lockfs_record_fence_at(&c->rec, i), rc, true);

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

	if (!(t->be->caps & LOCKFS_BE_SESSIONS) || lockfs_name_check(name) < 0)
		return false;
	s = lockfs_table_stripe(t, name);
	pthread_mutex_lock(&s->mu);
	for (struct tombstone *ts = s->tombstones; ts && !lost; ts = ts->next)
		lost = strcmp(ts->name, name) == 0;
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

/* What the store says of where it keeps NAME's holder (etcd: its key,
 * lease in 16 hex digits, create_revision), and that the answer is from
 * the last state it confirmed: added to an `owner` object O.  Nothing for
 * dir (no key, always confirmed).  A lock with a lease of its own (a
 * slug's: an object) keeps it as `lease`; the key's is `etcd_lease`. */
static void add_store_fields(json_t *o, const struct lockfs_entry_stat *st)
{
	if (st->unconfirmed)
		json_object_set_new(o, "state", json_string("unconfirmed"));
	if (st->key[0]) {
		char lease[24];
		bool own = json_is_object(json_object_get(o, "lease"));

		snprintf(lease, sizeof(lease), "%016" PRIx64, (uint64_t)st->lease);
		json_object_set_new(o, "key", json_string(st->key));
		json_object_set_new(o, own ? "etcd_lease" : "lease", json_string(lease));
		json_object_set_new(o, "create_revision", json_integer(st->create_revision));
	}
}

/* O as `owner` text: indented, one newline after it.  NULL: no memory. */
static char *owner_text(json_t *o, size_t *len)
{
	char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);

	if (s) {
		size_t n = strlen(s);
		char *t = realloc(s, n + 2);

		if (!t) {
			free(s);
			return NULL;
		}
		t[n] = '\n';
		t[n + 1] = '\0';
		*len = n + 1;
		s = t;
	}
	return s;
}

/* The `owner` view of NAME in lock-delay (etcd: its holder's session
 * expired): held by nobody until then. */
static char *delay_json(const char *name, const struct lockfs_entry_stat *st, size_t *len)
{
	char when[32];
	json_t *o = json_object();
	char *s;

	if (!o)
		return NULL;
	json_object_set_new(o, "resource", json_string(name));
	json_object_set_new(o, "holder", json_null());
	json_object_set_new(o, "lock_delay_until",
			    json_string(lockfs_format_time(st->delay_until_ms, when)));
	json_object_set_new(o, "foreign", json_false());
	if (st->unconfirmed)
		json_object_set_new(o, "state", json_string("unconfirmed"));
	s = owner_text(o, len);
	json_decref(o);
	return s;
}

/* The `owner` view of a lock held without a record lockfs can read. */
static char *foreign_json(const char *name, const struct lockfs_entry_stat *st, size_t *len)
{
	char when[32];
	json_t *o;
	char *s;

	if (st->delay_until_ms > 0)
		return delay_json(name, st, len);
	o = json_object();
	if (!o)
		return NULL;
	json_object_set_new(o, "resource", json_string(name));
	json_object_set_new(o, "holder", json_null());
	json_object_set_new(o, "acquired_at", json_string(lockfs_format_time(st->mtime_ms, when)));
	json_object_set_new(o, "acquired_at_ms", json_integer(st->mtime_ms));
	json_object_set_new(o, "operation", json_null());
	json_object_set_new(o, "slug", json_null());
	json_object_set_new(o, "lease", json_null());
	json_object_set_new(o, "fence", json_null());
	json_object_set_new(o, "foreign", json_true());
	add_store_fields(o, st);
	s = owner_text(o, len);
	json_decref(o);
	return s;
}

/*
 * TEXT (C's `owner` view, malloc'd, *LEN) with what a store with sessions
 * adds: "session" ("live" | "uncertain") for this host's locks, and the
 * store fields (add_store_fields).  TEXT as it is for dir.  NULL: no
 * memory (TEXT freed).
 */
static char *with_store_fields(struct lockfs_table *t, const struct held_lock *c,
			       const struct lockfs_entry_stat *st, char *text, size_t *len)
{
	struct lockfs_session sess;
	json_t *o;
	char *s;

	if (!text || (!(t->be->caps & LOCKFS_BE_SESSIONS) && !st->unconfirmed && !st->key[0]))
		return text;
	o = json_loadb(text, *len, 0, NULL);
	free(text);
	if (!o)
		return NULL;
	if ((t->be->caps & LOCKFS_BE_SESSIONS) && c->rec.has_holder &&
	    !lockfs_table_elsewhere(t, &c->rec.holder) &&
	    lockfs_store_session(t->be, NULL, &sess) == 0)
		json_object_set_new(o, "session", json_string(
			sess.state == LOCKFS_SESSION_LIVE ? "live" : "uncertain"));
	add_store_fields(o, st);
	s = owner_text(o, len);
	json_decref(o);
	return s;
}

/* Where a view puts its text. */
struct text_out {
	char **text;
	size_t *len;
	uid_t reader;
	struct lockfs_core *core;
};

/* Copy TEXT (may be NULL) plus a newline into a malloc'd *OUT. */
static int line_of(const char *text, char **out, size_t *len)
{
	size_t n = text ? strlen(text) : 0;

	*out = malloc(n + 2);
	if (!*out)
		return -ENOMEM;
	memcpy(*out, text, n);
	(*out)[n] = '\n';
	(*out)[n + 1] = '\0';
	*len = n + 1;
	return 0;
}

static int view_owner(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
		      void *arg)
{
	struct text_out *o = arg;

	/* For this reader: the token and command lines only for their own
	 * uid and root (privacy.md). */
	if (!c)
		*o->text = foreign_json(name, st, o->len);
	else {
		if (c->rec.holder_exited)
			/* the ones alive now */
			lockfs_recovery_descendants_refresh(&o->core->table, c, NULL);
		*o->text = with_store_fields(&o->core->table, c, st,
					     lockfs_record_view(&c->rec, o->reader, o->len), o->len);
	}
	return *o->text ? 0 : -ENOMEM;
}

int lockfs_core_owner(struct lockfs_core *core, const char *name, uid_t reader, char **json,
		      size_t *len)
{
	struct text_out o = { json, len, reader, core };

	return lockfs_table_view(&core->table, name, view_owner, &o);
}

static int view_operation(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
			  void *arg)
{
	struct text_out *o = arg;

	if (c && c->rec.operation)
		return line_of(c->rec.operation, o->text, o->len);
	*o->text = strdup("");
	*o->len = 0;
	return *o->text ? 0 : -ENOMEM;
}

int lockfs_core_operation(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct text_out o = { text, len, 0, core };

	return lockfs_table_view(&core->table, name, view_operation, &o);
}

static int view_lease(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
		      void *arg)
{
	struct text_out *o = arg;

	if (!c || !c->rec.lease.ttl_s)
		return line_of("null", o->text, o->len);
	*o->text = lockfs_lease_encode(&c->rec.lease, o->len);
	return *o->text ? 0 : -ENOMEM;
}

int lockfs_core_lease(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct text_out o = { text, len, 0, core };

	return lockfs_table_view(&core->table, name, view_lease, &o);
}

int lockfs_core_check_holder(struct lockfs_core *core, const char *name,
			     const struct lockfs_caller *caller)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct lockfs_holder_ref h;
	struct held_lock *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc == 0)
		lockfs_caller_ref_at(&h, c ? &c->rec : NULL, 0);
	lockfs_table_unlock(s);
	return rc == 0 ? lockfs_caller_check(t, &h, caller) : rc;
}

/*
 * Run EDIT on NAME's fresh cache entry if CALLER may act as its holder,
 * then write the record back.  EDIT returns 0 or -errno and may leave the
 * record unchanged by returning 1 (nothing to write).
 */
static int edit_as_holder(struct lockfs_core *core, const char *name,
			  const struct lockfs_caller *caller,
			  int (*edit)(struct lockfs_core *, struct held_lock *, void *), void *arg)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc == 0)
		rc = lockfs_caller_may_act(t, c, caller);
	if (rc == 0)
		rc = edit(core, c, arg);
	if (rc == 0)
		rc = lockfs_table_persist(t, s, c, &st);
	lockfs_table_unlock(s);
	return rc == 1 ? 0 : rc;
}

struct text_arg {
	const char *text;
	size_t len;
};

static int edit_operation(struct lockfs_core *core, struct held_lock *c, void *arg)
{
	struct text_arg *t = arg;
	char *op = t->len ? strndup(t->text, t->len) : NULL;

	if (t->len && !op)
		return -ENOMEM;
	free(c->rec.operation);
	c->rec.operation = op;
	return 0;
}

int lockfs_core_set_operation(struct lockfs_core *core, const char *name,
			      const struct lockfs_caller *caller, const char *text, size_t len)
{
	struct text_arg t = { text, len };

	if (t.len > 0 && text[t.len - 1] == '\n')
		t.len--;
	if (t.len > LOCKFS_OPERATION_MAX)
		return -EFBIG;
	if (memchr(text, '\0', t.len) || !lockfs_utf8_valid(text, t.len))
		return -EINVAL;
	return edit_as_holder(core, name, caller, edit_operation, &t);
}

static int edit_lease(struct lockfs_core *core, struct held_lock *c, void *arg)
{
	uint32_t ttl = *(uint32_t *)arg;

	if (ttl == 0 && c->rec.bound == LOCKFS_BOUND_SLUG)
		return -EINVAL; /* a slug lock's lease is its only liveness */
	lockfs_lease_start(&c->rec.lease, ttl);
	c->expired_logged = false;
	c->next_check_boot_ms = 0;
	return 0;
}

int lockfs_core_set_lease(struct lockfs_core *core, const char *name,
			  const struct lockfs_caller *caller, const char *text, size_t len)
{
	char buf[24], *end;
	unsigned long long v;

	while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' '))
		len--;
	if (len == 0 || len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, text, len);
	buf[len] = '\0';
	if (buf[0] < '0' || buf[0] > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(buf, &end, 10);
	if (errno || *end || v > LOCKFS_LEASE_MAX_S)
		return -EINVAL;
	{
		uint32_t ttl = (uint32_t)v;

		return edit_as_holder(core, name, caller, edit_lease, &ttl);
	}
}

static int edit_renew(struct lockfs_core *core, struct held_lock *c, void *arg)
{
	if (!c->rec.lease.ttl_s)
		return 1; /* nothing to renew: touching is still allowed */
	return edit_lease(core, c, &c->rec.lease.ttl_s);
}

int lockfs_core_renew(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *caller)
{
	return edit_as_holder(core, name, caller, edit_renew, NULL);
}

struct name_list {
	char **names;
	size_t count, cap;
	int err;
};

static int collect_name(void *arg, const char *name)
{
	struct name_list *l = arg;

	if (lockfs_name_check(name) < 0)
		return 0; /* DIR/x.lock whose x no mount could name */
	if (l->count + 2 > l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		char **n = realloc(l->names, cap * sizeof(*n));

		if (!n) {
			l->err = -ENOMEM;
			return 1;
		}
		l->names = n;
		l->cap = cap;
	}
	l->names[l->count] = strdup(name);
	if (!l->names[l->count]) {
		l->err = -ENOMEM;
		return 1;
	}
	l->names[++l->count] = NULL;
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void lockfs_names_free(char **names)
{
	if (!names)
		return;
	for (char **p = names; *p; p++)
		free(*p);
	free(names);
}

/* Hand L's names out sorted and without repeats (or free them on RC < 0). */
static int list_done(struct name_list *l, int rc, char ***names, size_t *count)
{
	size_t out = 0;

	if (rc == 0)
		rc = l->err;
	if (rc == 0 && !l->names && !(l->names = calloc(1, sizeof(char *))))
		rc = -ENOMEM;
	if (rc < 0) {
		lockfs_names_free(l->names);
		return rc;
	}
	qsort(l->names, l->count, sizeof(char *), cmp_names);
	for (size_t i = 0; i < l->count; i++) {
		if (out > 0 && strcmp(l->names[out - 1], l->names[i]) == 0)
			free(l->names[i]);
		else
			l->names[out++] = l->names[i];
	}
	l->names[out] = NULL;
	*names = l->names;
	*count = out;
	return 0;
}

int lockfs_core_list(struct lockfs_core *core, char ***names, size_t *count)
{
	struct lockfs_table *t = &core->table;
	struct name_list l = { 0 };

	return list_done(&l, lockfs_store_list(t->be, collect_name, &l), names, count);
}

int lockfs_core_list_flock(struct lockfs_core *core, char ***names, size_t *count)
{
	struct lockfs_table *t = &core->table;
	struct name_list l = { 0 };
	int rc = lockfs_store_list(t->be, collect_name, &l);

	/* Held names, and names that only have waiters (behind nothing we
	 * could read yet, or in between). */
	for (int i = 0; rc == 0 && !l.err && i < STRIPES; i++) {
		struct stripe *s = &t->stripes[i];

		pthread_mutex_lock(&s->mu);
		for (struct lockq *q = s->queues; q && !l.err; q = q->next)
			if (q->nactive)
				collect_name(&l, q->name);
		pthread_mutex_unlock(&s->mu);
	}
	return list_done(&l, rc, names, count);
}

int lockfs_core_log_open_ro(struct lockfs_core *core)
{
	return lockfs_log_open_ro(core->table.log);
}

void lockfs_core_log_reopen(struct lockfs_core *core)
{
	lockfs_log_request_reopen(core->table.log);
}

/* The descendants tracker, fed by the process-event connector unless
 * SCAN_ONLY or the kernel refuses it (then scans answer, and we say so
 * once).  0 or -errno. */
static int descendants_open(struct lockfs_core *core, bool scan_only)
{
	struct lockfs_event_source events;
	char why[160];
	int rc;

	if (!scan_only) {
		if (lockfs_procevents_open(&core->procevents, why, sizeof(why)) == 0)
			events = lockfs_procevents_source(core->procevents);
		else
			fprintf(stderr, "lockfs: warning: no process events (%s); a holder's "
				"descendants are found by scanning /proc for its session, which "
				"misses those that left it (docs/holder.md)\n", why);
	}
	rc = lockfs_descendants_new(&core->table.descendants,
				    core->procevents ? &events : NULL, NULL);
	/* The same events keep repeat requesters' /proc facts exact. */
	if (rc == 0 && core->procevents && lockfs_requesters_new(&core->table.requesters) == 0)
		lockfs_descendants_observe(core->table.descendants, lockfs_requesters_event,
					   core->table.requesters);
	return rc;
}

/* A cap from the configuration: 0 is DEFAULT, LOCKFS_NO_LIMIT none. */
static uint32_t cap_of(uint32_t given, uint32_t dflt)
{
	return given == LOCKFS_NO_LIMIT ? QUOTA_NONE : given ? given : dflt;
}

/*
 * The default of -o max_locks: DEFAULT_LOCKS_MAX, but never more than a
 * quarter of DIR's file system at the largest cost of a lock, in bytes
 * and in inodes -- so that a small tmpfs (a /run of 10 % of a small
 * machine's memory) cannot be filled by locks either.
 */
static uint32_t default_max_locks(int dirfd)
{
	struct statvfs sv;
	uint64_t n = DEFAULT_LOCKS_MAX;

	if (dirfd >= 0 && fstatvfs(dirfd, &sv) == 0) {
		uint64_t by_bytes = (uint64_t)sv.f_blocks * sv.f_frsize / 4 / LOCK_BYTES;
		uint64_t by_inodes = (uint64_t)sv.f_files / 4 / LOCK_INODES;

		if (sv.f_blocks && by_bytes < n)
			n = by_bytes;
		if (sv.f_files && by_inodes < n) /* 0: no inode limit (btrfs) */
			n = by_inodes;
	}
	return n < DEFAULT_LOCKS_MIN ? DEFAULT_LOCKS_MIN : (uint32_t)n;
}

/* Make core->table.quota with CFG's caps.  The open-file cap's default depends
 * on the descriptor limit, known at lockfs_core_start.  0 or -ENOMEM. */
static int quota_open_limits(struct lockfs_core *core, const struct lockfs_core_config *cfg)
{
	struct quota_limits lim = {
		.open_per_uid = cap_of(cfg->max_open_per_uid, DEFAULT_OPEN_PER_UID),
		.locks_per_uid = cap_of(cfg->max_locks_per_uid, DEFAULT_LOCKS_PER_UID),
		.waiters_per_uid = cap_of(cfg->max_waiters_per_uid, DEFAULT_WAITERS_PER_UID),
		.locks = cfg->max_locks ? cap_of(cfg->max_locks, 0) : default_max_locks(cfg->backend ? cfg->backend->state_dirfd : -1),
	};

	core->open_cap_given = cfg->max_open_per_uid != 0;
	return lockfs_quota_new(&core->table.quota, &lim);
}

int lockfs_core_handle_open(struct lockfs_core *core, const struct lockfs_caller *caller,
			    bool keeps_fd, const char *name)
{
	struct lockfs_table *t = &core->table;

	if (lockfs_quota_open_add(t->quota, caller->uid) < 0) {
		lockfs_caller_refuse(t, caller->uid, QUOTA_OPEN_PER_UID, name, NULL, caller->tid);
		return -EMFILE;
	}
	if (keeps_fd && !lockfs_fds_take(&core->fds, caller->uid == 0 ? LOCKFS_FD_PRIVILEGED
								    : LOCKFS_FD_CALLER)) {
		lockfs_quota_open_sub(t->quota, caller->uid);
		lockfs_caller_refuse(t, caller->uid, QUOTA_FD_RESERVE, name, NULL, caller->tid);
		return -EMFILE;
	}
	return 0;
}

void lockfs_core_handle_close(struct lockfs_core *core, uid_t uid, bool keeps_fd)
{
	lockfs_quota_open_sub(core->table.quota, uid);
	if (keeps_fd)
		lockfs_fds_give(&core->fds);
}

void lockfs_core_set_mount_dev(struct lockfs_core *core, dev_t dev)
{
	core->table.mount_dev = dev;
}

int lockfs_core_open(struct lockfs_core **out, const struct lockfs_core_config *cfg)
{
	struct lockfs_core *core = calloc(1, sizeof(*core));
	struct lockfs_table *t;
	int rc;

	if (!core) {
		lockfs_log_close(cfg->log);
		return -ENOMEM;
	}
	t = &core->table;
	for (int i = 0; i < STRIPES; i++)
		pthread_mutex_init(&t->stripes[i].mu, NULL);
	pthread_mutex_init(&t->users_mu, NULL);
	pthread_mutex_init(&t->session_mu, NULL);
	pthread_mutex_init(&t->holders.mu, NULL);
	for (int i = 0; i < STRIPES; i++)
		t->stripes[i].due_boot_ms = INT64_MAX;
	lockfs_fds_init(&core->fds);
	t->procs = cfg->procs ? cfg->procs : &lockfs_proc_real;
	t->default_lease_s = cfg->lease_s ? cfg->lease_s : DEFAULT_LEASE_S;
	t->break_signal = cfg->break_signal;
	t->log = cfg->log;
	if (!t->log) {
		rc = -EINVAL;
		goto fail;
	}
	rc = lockfs_helpers_parse(&t->helpers,
				  cfg->helpers ? cfg->helpers : LOCKFS_DEFAULT_HELPERS);
	if (rc < 0)
		goto fail;
	if (!cfg->backend) {
		rc = -EINVAL;
		goto fail;
	}
	/* This host, as the store names it in records: the holders the
	 * engine may judge by pid and boot id are this host's only. */
	snprintf(t->host, sizeof(t->host), "%s", cfg->backend->host);
	rc = lockfs_boot_id(t->boot_id);
	if (rc < 0)
		goto fail;
	rc = quota_open_limits(core, cfg);
	if (rc < 0)
		goto fail;
	rc = lockfs_recovery_init(t);
	if (rc < 0)
		goto fail;
	rc = lockfs_changes_init(t);
	if (rc < 0)
		goto fail;
	/* table.c calls up into session.c through this, as the store's
	 * answer replaces a cached lock (a loss, on a store with sessions). */
	t->vanished = lockfs_session_vanished_locked;
	/* The thread calls up into recovery.c through these, with the table. */
	rc = lockfs_liveness_new(&t->liveness, lockfs_recovery_holder_exited, lockfs_recovery_tick,
				 t, TICK_MS);
	if (rc < 0)
		goto fail;
	rc = descendants_open(core, cfg->descendants_scan);
	if (rc < 0)
		goto fail;
	lockfs_liveness_set_fds(t->liveness, &core->fds);
	lockfs_liveness_set_work(t->liveness, lockfs_recovery_work);
	t->be = cfg->backend;
	rc = lockfs_startup_scan(t);
	if (rc < 0) {
		t->be = NULL; /* the caller still owns it on failure */
		goto fail;
	}
	*out = core;
	return 0;
fail:
	lockfs_core_close(core);
	return rc;
}

int lockfs_core_start(struct lockfs_core *core)
{
	struct lockfs_table *t = &core->table;
	int rc;

	/* The mount is made: what is open now is the daemon's own. */
	lockfs_fds_start(&core->fds);
	if (!core->open_cap_given) {
		long room = lockfs_fds_callers_max(&core->fds) / 4;

		lockfs_quota_set_open_limit(t->quota, room < DEFAULT_OPEN_PER_UID ?
				     (uint32_t)(room > 0 ? room : 1) : DEFAULT_OPEN_PER_UID);
	}
	rc = lockfs_liveness_run(t->liveness);
	if (rc < 0)
		return rc;
	/* The session the engine acts on from now on (a store with
	 * sessions): one lost before the first report is still noticed. */
	lockfs_session_check(t);
	/* The store reports changes from now on: the startup scan is over,
	 * and the thread that takes them in runs. */
	return lockfs_store_start(t->be, lockfs_changes_report, t);
}

void lockfs_core_stop(struct lockfs_core *core)
{
	struct lockfs_table *t;

	if (!core)
		return;
	t = &core->table;
	lockfs_liveness_stop(t->liveness);
	/* Releases the store refused get one last try before the daemon
	 * goes; what is left stays in DIR (see lockfs_queue_free_all). */
	lockfs_recovery_retry_all(t);
	lockfs_quota_flush(t->quota, true, lockfs_audit_refused, t);
}

void lockfs_core_close(struct lockfs_core *core)
{
	struct lockfs_table *t;

	if (!core)
		return;
	t = &core->table;
	/* The thread first: it calls into everything below.  Then the store,
	 * whose reports kick that thread (changes.c): none may come once the
	 * thread is freed, and nothing below needs the store. */
	lockfs_liveness_stop(t->liveness);
	if (t->be)
		lockfs_store_close(t->be);
	t->be = NULL;
	for (int i = 0; i < STRIPES; i++) {
		while (t->stripes[i].head) {
			struct held_lock *c = t->stripes[i].head;

			lockfs_table_drop(t, &t->stripes[i], c->name);
		}
		lockfs_queue_free_all(&t->stripes[i]);
		lockfs_session_free_tombstones(&t->stripes[i]);
		pthread_mutex_destroy(&t->stripes[i].mu);
	}
	lockfs_liveness_free(t->liveness);
	lockfs_descendants_free(t->descendants);
	lockfs_requesters_free(t->requesters);
	lockfs_procevents_close(core->procevents);
	lockfs_recovery_fini(t);
	lockfs_quota_free(t->quota);
	pthread_mutex_destroy(&t->holders.mu);
	for (size_t i = 0; i < t->nusers; i++)
		free(t->users[i].name);
	free(t->users);
	pthread_mutex_destroy(&t->users_mu);
	pthread_mutex_destroy(&t->session_mu);
	lockfs_changes_fini(t);
	{
		size_t left = lockfs_log_close(t->log);

		if (left)
			fprintf(stderr, "lockfs: warning: %zu audit log line(s) could not be written "
				"to the log before exit; they went to syslog\n", left);
	}
	lockfs_helpers_free(&t->helpers);
	free(core);
}

int lockfs_core_fd_lock(struct lockfs_core *core, const struct lockfs_caller *caller,
			const struct lockfs_fd_request *rq, struct lockfs_wait *w)
{
	struct lockfs_table *t = &core->table;
	struct qentry *e;
	int rc;

	rc = lockfs_name_check(rq->name);
	if (rc < 0)
		return rc;
	if (strlen(rq->owner) >= LOCKFS_FD_OWNER_MAX)
		return -EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	rc = lockfs_holder_resolve(t->procs, caller->tid, caller->uid, &t->helpers,
				   LOCKFS_PROC_NS, &e->who);
	if (rc < 0) {
		free(e);
		return rc == -ESRCH ? -EACCES : rc;
	}
	if (!e->who.have_ids) {
		e->who.uid = caller->uid;
		e->who.gid = caller->gid;
	}
	snprintf(e->owner, sizeof(e->owner), "%s", rq->owner);
	e->via_file = rq->via_file;
	e->mode = rq->mode;
	e->uid = caller->uid;
	e->gid = caller->gid;
	e->since_ms = lockfs_wall_ms();
	/* Read now, not at the grant: a hand-off should do no /proc read. */
	if (lockfs_procs_cmdline(t->procs, e->who.pid, WAITER_CMDLINE_MAX, &e->cmdline) < 0)
		e->cmdline = NULL;
	{
		/* The caller's LOCKFS_SLUG names the holder (lockctl --slug);
		 * a bad one reads as none here rather than failing flock. */
		char slug[LOCKFS_SLUG_MAX];

		if (lockfs_caller_slug(t->procs, caller->tid, slug, sizeof(slug)) == 0 && *slug)
			e->slug = strdup(slug);
	}
	return lockfs_queue_enter(t, e, rq, w);
}

int lockfs_core_fd_cancel(struct lockfs_core *core, const char *name, struct lockfs_wait *w)
{
	return lockfs_queue_cancel(&core->table, name, w);
}


int lockfs_core_fd_unlock(struct lockfs_core *core, const char *name, const char *owner)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	long held;
	int rc;

	if (lockfs_name_check(name) < 0)
		return 0;
	pthread_mutex_lock(&s->mu);
	/* The owner lets go: a place kept for it is no longer wanted. */
	lockfs_queue_forget_kept(s, name, owner);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	held = rc == 0 && c ? lockfs_fdlock_holder_of(s, name, &c->rec, owner) : -1;
	rc = 0;
	if (held >= 0) {
		if (!lockfs_table_issued_here(c)) {
			/* Rewritten behind our back: keep it, say so (whose it
			 * is, the record cannot be trusted to tell). */
			const char *kv[] = { "uid", "", "pid", "", "reason", "token-mismatch", NULL };

			lockfs_audit_event(t, "?", name, kv, "denied");
			rc = -EPERM;
		} else {
			uint64_t fence = lockfs_record_fence_at(&c->rec, (size_t)held);

			rc = lockfs_queue_let_go_locked(t, s, c, &(struct lockfs_let_go){
				.identity = st.identity, .index = (size_t)held,
				.event = "released" });
			if (rc < 0 && rc != -ENOENT)
				lockfs_fdlock_retry_add(s, name, owner, fence, rc, true);
		}
	}
	lockfs_table_unlock(s);
	return rc;
}

void lockfs_core_fd_file_closed(struct lockfs_core *core, const char *name, uint64_t file)
{
	struct stripe *s = lockfs_table_stripe(&core->table, name);
	struct fdlock_via *taken;

	if (!file)
		return;
	pthread_mutex_lock(&s->mu);
	taken = lockfs_fdlock_take_file(s, name, file);
	lockfs_table_unlock(s);
	/* Each unlock takes the stripe mutex again: it may hand NAME on. */
	for (struct fdlock_via *v = taken; v; v = v->next)
		lockfs_core_fd_unlock(core, name, v->owner);
	lockfs_fdlock_free(taken);
}

int lockfs_core_fd_test(struct lockfs_core *core, const struct lockfs_fd_request *rq,
			struct lockfs_fd_conflict *out)
{
	struct lockfs_table *t = &core->table;
	const char *name = rq->name, *owner = rq->owner;
	bool shared = rq->mode == LOCKFS_SHARED;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -EINVAL;
	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc == -ENOENT) {
		rc = 0;
	} else if (rc == 0 && !c) {
		out->shared = false; /* a foreign lock: exclusive, holder unknown */
		out->pid = 0;
		rc = 1;
	} else if (rc == 0) {
		long mine = lockfs_fdlock_holder_of(s, name, &c->rec, owner);
		bool others = lockfs_record_holders(&c->rec) > (mine >= 0 ? 1u : 0u);
		struct lockq *q = lockfs_queue_find(s, name);

		/* POSIX: a process's own lock never conflicts with itself.  A
		 * shared request may join readers only with nobody queued
		 * ahead (as F_SETLK would find). */
		if (others && (!(shared && c->rec.mode == LOCKFS_SHARED) || (q && q->nactive))) {
			out->shared = c->rec.mode == LOCKFS_SHARED;
			out->pid = mine == 0 && c->rec.nshares ? c->rec.shares[0].holder.pid
							       : c->rec.holder.pid;
			rc = 1;
		}
	}
	lockfs_table_unlock(s);
	return rc;
}

/* Where a view of the queue puts its text. */
struct queue_text {
	char **text;
	size_t *len;
	struct stripe *s;
};

static int view_waiters(struct stripe *s, const char *name, char **text, size_t *len)
{
	struct lockq *q = lockfs_queue_find(s, name);
	size_t used = 0, cap = 64;
	char *buf = malloc(cap);

	if (!buf)
		return -ENOMEM;
	buf[0] = '\0';
	for (struct qentry *e = q ? q->head : NULL; e; e = e->next) {
		char when[32], *line;
		json_t *o;
		size_t n;

		if (!e->w)
			continue;
		/* comm is any bytes (prctl): "o" takes the lossy string. */
		o = json_pack("{s:i, s:o, s:o, s:o, s:i, s:s, s:s, s:s}",
			      "pid", (int)e->who.pid,
			      "ns_pid", e->who.ns_pid > 0 ? json_integer(e->who.ns_pid) : json_null(),
			      "container", e->who.container[0]
					   ? lockfs_json_string_lossy(e->who.container) : json_null(),
			      "comm", lockfs_json_string_lossy(e->who.comm),
			      "uid", (int)e->uid,
			      "mode", e->mode == LOCKFS_SHARED ? "shared" : "exclusive",
			      "kind", strncmp(e->owner, "posix:", 6) == 0 ? "posix" : "flock",
			      "since", lockfs_format_time(e->since_ms, when));
		line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
		json_decref(o);
		if (!line) {
			free(buf);
			return -ENOMEM;
		}
		n = strlen(line);
		if (used + n + 2 > cap) {
			char *b;

			while (used + n + 2 > cap)
				cap *= 2;
			b = realloc(buf, cap);
			if (!b) {
				free(line);
				free(buf);
				return -ENOMEM;
			}
			buf = b;
		}
		memcpy(buf + used, line, n);
		used += n;
		buf[used++] = '\n';
		buf[used] = '\0';
		free(line);
	}
	*text = buf;
	*len = used;
	return 0;
}

static int view_waiters_of(const char *name, struct held_lock *c,
			   const struct lockfs_entry_stat *st, void *arg)
{
	struct queue_text *o = arg;

	return view_waiters(o->s, name, o->text, o->len);
}

int lockfs_core_waiters(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct lockfs_table *t = &core->table;
	struct queue_text o = { text, len, lockfs_table_stripe(t, name) };

	return lockfs_table_view(t, name, view_waiters_of, &o);
}

static int view_binding(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
			void *arg)
{
	struct queue_text *o = arg;
	const char *b = c ? lockfs_bound_name(c->rec.bound) : "foreign";

	*o->len = strlen(b) + 1;
	*o->text = malloc(*o->len + 1);
	if (!*o->text)
		return -ENOMEM;
	snprintf(*o->text, *o->len + 1, "%s\n", b);
	return 0;
}

int lockfs_core_binding(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct queue_text o = { text, len, NULL };

	return lockfs_table_view(&core->table, name, view_binding, &o);
}

int lockfs_core_bind(struct lockfs_core *core, const char *name, const struct lockfs_caller *caller,
		     const char *text, size_t len)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	char slug[LOCKFS_SLUG_MAX], who[WHO_MAX], fence[24], uid[16], pid[16];
	struct lockfs_proc writer;
	struct held_lock *c;
	bool foreign, to_slug;
	int rc;

	if (len > 0 && text[len - 1] == '\n')
		len--;
	to_slug = len == 4 && memcmp(text, "slug", 4) == 0;
	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	slug[0] = '\0';
	if (to_slug && lockfs_caller_slug(t->procs, caller->tid, slug, sizeof(slug)) < 0)
		slug[0] = '\0';
	/* The writer as a holder (genuine helpers of its own uid skipped),
	 * resolved outside the mutex: `lockctl acquire` writes for the shell
	 * that ran it. */
	if (lockfs_holder_resolve(t->procs, caller->tid, caller->uid, &t->helpers, 0,
				  &writer) < 0)
		writer.pid = 0;

	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc < 0)
		goto out;
	if (!c || !lockfs_table_issued_here(c)) {
		rc = -EPERM;
		goto out;
	}
	/* "The resolved holder ... may write": the writer that resolves to
	 * the holder itself (it asked for the fd lock through a genuine
	 * helper such as lockctl, which never leads across a uid boundary
	 * but through sudo); any other descendant by the rmdir rule.  Anyone
	 * else: EPERM, whatever they wrote. */
	if (!(writer.pid > 0 && writer.pid == c->rec.holder.pid &&
	      writer.start_time == c->rec.holder.start_time &&
	      strcmp(c->rec.holder.boot_id, t->boot_id) == 0))
		rc = lockfs_caller_may_act(t, c, caller);
	/* A grant its descriptor let go (the store is yet to take it) is
	 * nobody's to keep. */
	if (rc == 0 && lockfs_fdlock_retry_pending(s, name, &c->rec, 0))
		rc = -EPERM;
	if (rc < 0)
		goto out;
	if ((!to_slug && !(len == 7 && memcmp(text, "process", 7) == 0)) ||
	    (to_slug && !*slug) || c->rec.bound != LOCKFS_BOUND_FD ||
	    c->rec.mode != LOCKFS_EXCLUSIVE || c->rec.nshares) {
		rc = -EINVAL;
		goto out;
	}
	/* A writer named like a helper that binds the lock to itself is a
	 * lockctl that was not skipped: one past a uid boundary (`setpriv
	 * --reuid=U lockctl acquire`, run by root) or a copy that is not the
	 * genuine one (holder.md).  It exits at once, and with it a
	 * process-bound lock: EACCES, as mkdir gets, rather than no lock.
	 * A slug lock is the writer's uid's to keep. */
	if (!to_slug && writer.pid == c->rec.holder.pid &&
	    lockfs_helpers_contains(&t->helpers, writer.exe)) {
		rc = -EACCES;
		goto out;
	}
	c->rec.fd_owner[0] = '\0';
	if (to_slug) {
		char *dup = strdup(slug);

		if (!dup) {
			rc = -ENOMEM;
			goto out;
		}
		free(c->rec.slug);
		c->rec.slug = dup;
		c->rec.bound = LOCKFS_BOUND_SLUG;
		/* A slug lock belongs to the uid that asked for it, and counts
		 * against it from now on. */
		lockfs_table_account(t, c, -1);
		c->rec.holder.uid = caller->uid;
		c->rec.holder.gid = caller->gid;
		lockfs_table_account(t, c, 1);
		lockfs_lease_start(&c->rec.lease, t->default_lease_s);
	} else {
		c->rec.bound = LOCKFS_BOUND_PROCESS;
	}
	lockfs_audit_who(who, sizeof(who), c->rec.slug, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, c->rec.fence);
	lockfs_audit_ids(uid, pid, c->rec.holder.uid, c->rec.holder.pid);
	rc = lockfs_table_persist(t, s, c, &st);
	if (rc == 0) {
		const char *kv[] = { "fence", fence, "uid", uid, "pid", pid,
				     "bound", to_slug ? "slug" : "process", NULL };

		lockfs_audit_event(t, who, name, kv, "bound");
		lockfs_table_watch(t, c, -1);
	}
out:
	lockfs_table_unlock(s);
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

int lockfs_core_break(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *caller, const char *reason, size_t len)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	char by[WHO_MAX], by_uid[16], by_pid[16], uid[16], none[16], *why;
	bool foreign;
	pid_t pid = 0;
	unsigned long long start = 0;
	int rc;

	if (len > 0 && reason[len - 1] == '\n')
		len--;
	if (len > LOCKFS_REASON_MAX)
		return -EFBIG;
	if (len == 0 || memchr(reason, '\0', len) || !lockfs_utf8_valid(reason, len))
		return -EINVAL;
	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	why = strndup(reason, len);
	if (!why)
		return -ENOMEM;
	/* The breaker, as the kernel tells it, beside the name it goes by. */
	lockfs_audit_ids(by_uid, by_pid, caller->uid,
			 lockfs_caller_who(t, caller->tid, by, sizeof(by)));

	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_reload(t, s, name, &st, &foreign, &c);
	if (rc == 0 && c) {
		const char *extra[6 + BREAK_PLACE_MAX] = { "by", by, "by_uid", by_uid,
							   "by_pid", by_pid };

		put_break_place(t, &st, why, extra, 6);
		pid = c->rec.holder.pid;
		start = c->rec.holder.start_time;
		rc = lockfs_queue_let_go_locked(t, s, c, &(struct lockfs_let_go){
			.identity = st.identity, .all = true, .event = "broken", .extra = extra });
	} else if (rc == 0) {
		/* A foreign lock: uid= owns DIR/NAME.lock, no process known. */
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
	if (rc < 0)
		return rc;
	if (t->break_signal && pid > 0)
		lockfs_liveness_signal(t->liveness, pid, start, t->break_signal);
	return 0;
}

/* For unit tests only (tests/unit/engine_harness.c): the table, so that a
 * test calls the liveness thread's entry points (lock/recovery.h,
 * lock/changes.h) itself, one step at a time, instead of starting it. */
struct lockfs_table *lockfs_core_table(struct lockfs_core *core)
{
	return &core->table;
}
