/*
 * The lock table: the context every module of core/lock/ receives, the
 * stripes, and the cache of parsed records (table.c).  Not a public
 * interface; engine.c owns it inside its struct lockfs_core.
 *
 * Concurrency: operations on one name are serialised by its stripe's
 * mutex, which also protects the stripe's cache of parsed records, its
 * queues (queue.h) and its fd-lock bookkeeping (fdlock.h).  Every lock
 * that carries a record lockfs can read is in the cache: the cache is
 * what the liveness thread walks.  Acquisition needs no mutex (the
 * backend's step is indivisible); different names proceed in parallel.
 * Lock order: a stripe mutex, then the leaves (holders.mu, users_mu, the
 * liveness, quota and log mutexes); never two stripes at once.
 */
#ifndef LOCKFS_LOCK_TABLE_H
#define LOCKFS_LOCK_TABLE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/core.h"
#include "lockfs/holder.h"
#include "lockfs/limits.h"
#include "lockfs/log.h"
#include "lockfs/record.h"
#include "lockfs/backend.h"
#include "lockfs/descendants.h"
#include "proc/requesters.h"
#include "proc/liveness.h"
#include "quota.h"

struct lockq;            /* queue.h */
struct unlock_retry;     /* fdlock.h */
struct fdlock_via;       /* fdlock.h */
struct recovery_work;    /* recovery.c */
struct lockfs_changes;   /* changes.c */
struct lockfs_events;    /* events.h */
struct lockfs_follow;    /* follow.h */
struct lockfs_metrics;   /* metrics.h */

#define STRIPES 256
#define WHO_MAX (LOCKFS_SLUG_MAX + 32)

/* A parsed record of a held lock, valid while the store's identity is. */
struct held_lock {
	struct held_lock *next;
	char *name;
	uint64_t identity;
	struct lockfs_record rec;
	/* The token this daemon issued (or, first seeing the lock, adopted):
	 * a record re-read with another one was rewritten behind our back. */
	char issued[LOCKFS_TOKEN_HEX + 1];
	bool watched;        /* holds a liveness watch on rec.holder */
	bool elsewhere;      /* rec's holder is another host's: never judged,
				never due here (set with rec, in put()) */
	bool holder_gone;    /* the holder is dead: recover */
	bool expired_logged; /* the lease's expiry was logged */
	bool rebound;        /* an fd lock bound at a restart to the process that
				holds its old descriptor (rebound.c) */
	int64_t next_rebound_boot_ms; /* rebound: looked at in /proc not before */
	bool unlogged;       /* an acquisition the log refused that the store
				would not take back: its end is not logged
				either (the log never showed this holder) */
	bool queued;         /* a todo for it waits in t->work (recovery.c) */
	bool granted;        /* this daemon granted it (or took it over at start-up):
				only such a lock can be lost (session.h); a waiter's
				place that the store shows at the head is no grant
				until claimed */
	/* In t->holders while watched, until its holder's death is seen
	 * (protected by t->holders.mu, not by the stripe mutex): */
	bool indexed;
	struct held_lock *hnext, *hprev;
	pid_t hpid;                  /* the holder indexed, as indexed */
	unsigned long long hstart;
	uid_t huid;
	int64_t next_check_boot_ms; /* slug evidence: not before this */
	/* Descendants (descendants.c) of an exclusive process-bound holder: */
	bool desc_watched;   /* holds a descendants watch on rec.holder */
	bool watch_failed;   /* the last watch failed (no memory): forks since
				were not told, the next watch scans for them */
	uint64_t desc_version; /* of the list last written to the store */
	int64_t next_persist_boot_ms; /* a changed list: not written before this */
};

struct stripe {
	pthread_mutex_t mu;
	struct held_lock *head;     /* protected by mu */
	/* Boot ms from which the tick's collect() must look at this stripe
	 * (a lease runs out, a dead holder's lock is not queued, a holder is
	 * not watched); INT64_MAX: nothing to do.  Protected by mu. */
	int64_t due_boot_ms;
	/* Some entry may have a process-bound share (a shared lock rebound
	 * at a restart), which the tick polls (recovery.c).  Protected by mu. */
	bool process_shares;
	/* Entries whose holder is this host's (not `elsewhere`): on a store
	 * with sessions the tick looks at the session for them.  By mu. */
	unsigned own;
	struct lockq *queues;    /* protected by mu */
	struct unlock_retry *retries; /* protected by mu */
	/* Fences of the last grants a retry ended (fdlock.c): the store's
	 * view may still show such a grant a moment after (etcd: the watch
	 * not caught up), and it must not be released, or logged, again.
	 * Protected by mu. */
	uint64_t retry_ended[8];
	unsigned n_retry_ended;
	struct fdlock_via *via_files; /* fdlock.c; protected by mu */
	struct tombstone *tombstones; /* session.c: locks lost with the
					 session, for their holders' rmdir;
					 protected by mu */
};

/* The watched entries of the cache by holder (pid, start): what a death
 * releases, found without a walk of the cache.  MU is taken inside a
 * stripe mutex, never the other way round. */
#define HOLDER_BUCKETS 4096
struct holder_index {
	pthread_mutex_t mu;
	struct held_lock *buckets[HOLDER_BUCKETS]; /* by pid; protected by mu */
};

struct uid_name {
	uid_t uid;
	char *name; /* NULL when the uid has no passwd entry */
};


/*
 * The context of the engine's floors (everything in core/lock/).  Set up
 * by lockfs_core_open before the liveness thread starts; after that the
 * fields without a rule of their own are read-only.
 */
struct lockfs_table {
	struct lockfs_backend *be;      /* the store; its own locking */
	struct lockfs_log *log;         /* the audit log; its own mutex */
	struct lockfs_events *events;   /* events.c: M/.events; its own mutex */
	struct lockfs_follow *follow;   /* follow.c: what its readers follow; its own mutex */
	struct lockfs_metrics *metrics; /* metrics.c: atomic counters */
	struct lockfs_liveness *liveness;       /* its own mutex */
	struct lockfs_descendants *descendants; /* its own mutex */
	/* Repeat requesters' /proc facts (caller.c), kept exact by the
	 * descendants tracker's events; NULL without them.  Its own mutex. */
	struct lockfs_requesters *requesters;
	struct quota *quota;            /* what each uid holds; its own mutex */
	struct lockfs_helpers helpers;  /* read-only */
	const struct lockfs_proc_source *procs; /* read-only */
	char host[LOCKFS_HOST_MAX];     /* be->host: this host, as records name it;
					   read-only */
	char boot_id[40];               /* read-only */
	uint32_t default_lease_s;       /* read-only */
	int break_signal;               /* read-only */
	/* -o container_root=host: root in a container is root over every
	 * lock (caller.c, lockfs_caller_root_over); read-only */
	bool container_root_host;
	dev_t mount_dev;        /* of the mount served; 0 = not known (set before
				   the liveness thread starts, read-only after) */
	/* The liveness thread's own (and lockfs_core_open's before it runs):
	 * no mutex. */
	bool starting;                  /* in lockfs_core_open's scan */
	/* resume.h: a daemon that took over a live FUSE connection
	 * (lockfs_core_config.resuming); read-only. */
	bool resuming;
	/* resume.h: while set, requests the kernel resent may still come,
	 * and no waiter is granted.  Both atomic (__atomic_*): requests read
	 * them with no mutex, the liveness thread ends the hold. */
	int resume_hold;
	int64_t resume_hold_until_ms;   /* boot clock */
	int64_t next_stale_scan_ms;
	struct recovery_work *work;     /* recovery.c */
	/* Queues tried although the store reported no change: a waiter the
	 * store could not answer (EIO) is tried again by then. */
	int64_t next_queue_retry_ms;
	struct lockfs_changes *changes; /* changes.c; its own mutex (a leaf) */
	/* session.c: the store's session as the engine last acted on it.
	 * session_mu is taken before any stripe mutex, never inside one. */
	pthread_mutex_t session_mu;
	int64_t session_id;             /* protected by session_mu; 0: none seen */
	int64_t session_lost_id;        /* the last session whose locks were
					   lost; protected by session_mu */
	/*
	 * Called by lockfs_table_load/reload with S's mutex held, as the
	 * store's answer for C's name is about to replace the cached lock C:
	 * the store no longer shows C (TOKEN NULL: the name is free or not
	 * readable; else the token of the record it shows now).  The floor
	 * above sets it before the first load (engine.c wires session.c's
	 * lockfs_session_vanished_locked), so that this file never calls up;
	 * NULL: nothing to do.  Read-only.
	 */
	void (*vanished)(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			 const char *token);
	/*
	 * Called with S's mutex held as a cached lock held on another host
	 * comes into the cache or gets a new fence (EVENT "acquired") and as
	 * one leaves it or is replaced ("released"), whichever request or
	 * report made the cache look: so another host's lock is an event
	 * once, however this daemon learns of it.  Set by the floor above
	 * (engine.c wires remote.c's lockfs_remote_note), NULL while closing;
	 * NULL: nothing to do.  Read-only.
	 */
	void (*elsewhere)(struct lockfs_table *t, const struct held_lock *c, const char *event);
	/*
	 * Called by changes.c, with no mutex held, once the store's report
	 * that NAME changed is taken in: engine.c wires slots.c's
	 * lockfs_core_slots_changed, so that a slot freed on another host
	 * wakes the slots' waiters at once.  NULL while closing.  Read-only.
	 */
	void (*changed)(struct lockfs_table *t, const char *name);
	struct holder_index holders;    /* its own mutex, inside a stripe's */
	struct stripe stripes[STRIPES]; /* each its own mutex */

	pthread_mutex_t users_mu;       /* a leaf */
	struct uid_name *users;         /* protected by users_mu */
	size_t nusers;                  /* protected by users_mu */
};

/* Is H a holder on another host than this daemon's (t->host)?  Such a
 * holder is never judged by pid or boot id -- its pids and boots are not
 * this machine's: it is never watched, rebound, slug-scanned or
 * recovered here, and its lock lasts as long as the store keeps it
 * (be->ops->session; the dir store knows no other host's session, so its
 * locks stay until broken).  A record without a host is this host's. */
bool lockfs_table_elsewhere(const struct lockfs_table *t, const struct lockfs_holder *h);

/* NAME's stripe. */
struct stripe *lockfs_table_stripe(struct lockfs_table *t, const char *name);
/* Drop S's mutex. */
void lockfs_table_unlock(struct stripe *s);

/* The rest with s->mu held. */

/* NAME's cache entry, or NULL. */
struct held_lock *lockfs_table_find(struct stripe *s, const char *name);
/* Forget NAME's entry (unwatched, uncounted, freed); nothing if none. */
void lockfs_table_drop(struct lockfs_table *t, struct stripe *s, const char *name);
/* lockfs_table_drop, if NAME's cached holder is on another host: the store
 * just gave NAME to this host, so that holder is gone (its `released`
 * event comes before the grant's). */
void lockfs_table_drop_elsewhere(struct lockfs_table *t, struct stripe *s, const char *name);

/*
 * Find NAME's parsed record: from the cache when the store's identity still
 * matches, else read and parsed from the store and cached.
 * lockfs_table_reload always reads the store, ignoring the cache.  Sets *C
 * to the cache entry -- valid only while the stripe mutex is held -- or to
 * NULL with *FOREIGN set when NAME is held without a record lockfs can
 * read.  Returns 0, -ENOENT when not held, -errno.
 */
int lockfs_table_load(struct lockfs_table *t, struct stripe *s, const char *name,
		      struct lockfs_entry_stat *st, bool *foreign, struct held_lock **c);
int lockfs_table_reload(struct lockfs_table *t, struct stripe *s, const char *name,
			struct lockfs_entry_stat *st, bool *foreign, struct held_lock **c);

/*
 * Take over REC as NAME's cached record (store identity IDENTITY) and
 * watch its holder.  lockfs_table_put_new: REC is an acquisition this
 * daemon just made, whose token it issues; PIDFD (>= 0) is the holder's
 * pidfd, taken over.  lockfs_table_put_read: REC was read from the store,
 * and only a name seen for the first time adopts its token.  On
 * allocation failure REC is cleared and nothing cached.
 */
void lockfs_table_put_new(struct lockfs_table *t, struct stripe *s, const char *name,
			  uint64_t identity, struct lockfs_record *rec, int pidfd);
void lockfs_table_put_read(struct lockfs_table *t, struct stripe *s, const char *name,
			   uint64_t identity, struct lockfs_record *rec);

/* Does the store still show the token this daemon issued (or adopted)
 * for C's acquisition?  false: the record was rewritten behind our back. */
bool lockfs_table_issued_here(const struct held_lock *c);

/* Is C only a waiter's place, which a store with a line of its own (etcd)
 * shows as the holder once it is the head, before the claim that would
 * grant it -- never granted by this daemon?  Nobody holds it, and no
 * `acquired` was logged: letting go of it withdraws it, with no end line,
 * and nobody may bind it. */
bool lockfs_table_place_only(const struct lockfs_table *t, const struct held_lock *c);

/* Write C's record back to the store and follow its new identity (ST's
 * identity is the one written over, and is updated).  0 or -errno (then C
 * is gone: the entry is read back from the store as it was).
 * lockfs_table_persist_grant: the record has one more holder, share
 * SHARE (a shared holder joins), whose fence the store issues in the same
 * write (update GRANT); -EAGAIN: someone waits for NAME in the store. */
int lockfs_table_persist(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			 struct lockfs_entry_stat *st);
int lockfs_table_persist_grant(struct lockfs_table *t, struct stripe *s, struct held_lock *c,
			       struct lockfs_entry_stat *st, size_t share);

/*
 * The record of a grant for the backend (struct lockfs_record_src): its
 * encode sets the fence the store issues as holder WHICH's (0: the lock's
 * own, i >= 1: share i-1) and encodes REC with its token.  A fence of 0
 * leaves the fences as they are.  Set up with lockfs_table_grant_src.
 */
struct lockfs_grant_src {
	struct lockfs_record *rec;
	size_t which;
	struct lockfs_record_src src;
};
const struct lockfs_record_src *lockfs_table_grant_src(struct lockfs_grant_src *g,
						       struct lockfs_record *rec, size_t which);

/* After a grant the store made from G: a store that issues fences by the
 * write itself (etcd: the key's create_revision) encoded "fence": null
 * and names the fence only in ST; take it into G's record, so the cache,
 * `owner` and the `acquired` line carry it.  No-op when encode had one. */
void lockfs_table_grant_fence(struct lockfs_grant_src *g, const struct lockfs_entry_stat *st);

/*
 * Run VIEW on NAME's record (C is NULL for a foreign lock) with the stripe
 * mutex taken here: the shape of every read-only request.  Returns VIEW's
 * result, -ENOENT when not held (or NAME is no lock name), -errno.
 */
int lockfs_table_view(struct lockfs_table *t, const char *name,
		      int (*view)(const char *name, struct held_lock *c,
				  const struct lockfs_entry_stat *st, void *arg),
		      void *arg);

/* Every lock name the store lists that is a valid name, malloc'd (free
 * each and the array).  0 or -errno (nothing to free then). */
int lockfs_table_names(struct lockfs_table *t, char ***names, size_t *count);
/* Those of them that begin with PREFIX (NULL: all), as the store has them
 * now, not from a listing it keeps (lockfs_store_list_prefix). */
int lockfs_table_names_fresh(struct lockfs_table *t, const char *prefix, char ***names,
			     size_t *count);
void lockfs_table_names_free(char **names, size_t count);

/* Does a holder's exit leave REC to the holder's descendants?  Exclusive
 * process-bound locks only: slug-bound and fd locks have rules of their
 * own, and a shared lock's holders leave one by one. */
bool lockfs_table_desc_keep(const struct lockfs_record *rec);

/* Count (SIGN 1) or stop counting (-1) every holder of C's record against
 * its uid's locks (quota.h).  The cache is what is counted: every change
 * of a cached record is bracketed by the two. */
void lockfs_table_account(struct lockfs_table *t, const struct held_lock *c, int sign);

/* Watching C's holder, if the lock is process-bound (through PIDFD when
 * >= 0, taken over).  A holder of another boot, or one gone already, marks
 * the entry for recovery instead. */
void lockfs_table_watch(struct lockfs_table *t, struct held_lock *c, int pidfd);
void lockfs_table_unwatch(struct lockfs_table *t, struct held_lock *c);

/* The tick must look at S by when C needs it (see due_boot_ms), and is
 * woken for it if it sleeps (lockfs_table_wake).  lockfs_table_set_due
 * recomputes it from every entry (the tick's own). */
void lockfs_table_note_due(struct lockfs_table *t, struct stripe *s, const struct held_lock *c);
void lockfs_table_set_due(struct stripe *s);
/* Something the tick must look at appeared (a due time, a queue, a retry,
 * a tombstone, a refusal burst): wake the liveness thread if its last
 * tick found nothing to do.  An atomic load when it is awake. */
void lockfs_table_wake(struct lockfs_table *t);

/* The holder index (takes holders.mu; no stripe mutex needed). */

/* Is holder (PID, START) in the index (the holder of some watched lock)?
 * Then true, and *UID its uid. */
bool lockfs_table_holder_uid(struct lockfs_table *t, pid_t pid, unsigned long long start,
			     uid_t *uid);
/* Take up to MAX locks of dead holder (PID, START) out of the index: their
 * names, malloc'd (free each and the array; *NAMES may be NULL when none).
 * 0 (fewer than MAX: none is left) or -ENOMEM (some may be left). */
int lockfs_table_take_dead(struct lockfs_table *t, pid_t pid, unsigned long long start, size_t max,
			   char ***names, size_t *count)
	__attribute__((warn_unused_result));

/* Is a resuming engine still waiting for resent requests (resume.h)?  No
 * waiter is granted then.  Any thread, no mutex needed. */
static inline bool lockfs_table_resume_holding(const struct lockfs_table *t)
{
	return __atomic_load_n(&t->resume_hold, __ATOMIC_ACQUIRE) != 0;
}

#endif
