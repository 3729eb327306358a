/*
 * The engine's shared state, for engine.c (requests) and recovery.c
 * (holder death, leases, breaks, restart).  Not a public interface.
 *
 * Concurrency: operations on one name are serialised by its stripe's
 * mutex, which also protects the stripe's cache of parsed records.  Every
 * lock that carries a record lockfs can read is in the cache: the cache is
 * what the liveness thread walks.  Acquisition needs no mutex (the
 * backend's step is indivisible); different names proceed in parallel.
 * Lock order: a stripe mutex, then (inside liveness) the liveness mutex;
 * never two stripes at once.
 */
#ifndef LOCKFS_CORE_TABLE_H
#define LOCKFS_CORE_TABLE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "lockfs/core.h"
#include "lockfs/holder.h"
#include "lockfs/limits.h"
#include "lockfs/log.h"
#include "lockfs/record.h"
#include "backend_v1.h"
#include "fdlock.h"
#include "proc/descendants.h"
#include "proc/fds.h"
#include "backend/fence.h"
#include "proc/liveness.h"
#include "proc/procevents.h"
#include "quota.h"

#define STRIPES 256
#define WHO_MAX (LOCKFS_SLUG_MAX + 32)

/* A parsed record of a held lock, valid while the store's identity is. */
struct cached {
	struct cached *next;
	char *name;
	uint64_t identity;
	struct lockfs_record rec;
	/* The token this daemon issued (or, first seeing the lock, adopted):
	 * a record re-read with another one was rewritten behind our back. */
	char issued[LOCKFS_TOKEN_HEX + 1];
	bool watched;        /* holds a liveness watch on rec.holder */
	bool holder_gone;    /* the holder is dead: recover */
	bool expired_logged; /* the lease's expiry was logged */
	bool rebound;        /* an fd lock bound at a restart to the process that
				holds its old descriptor (rebound.c) */
	int64_t next_rebound_boot_ms; /* rebound: looked at in /proc not before */
	bool unlogged;       /* an acquisition the log refused that the store
				would not take back: its end is not logged
				either (the log never showed this holder) */
	bool queued;         /* a todo for it waits in core->work (recovery.c) */
	/* In core->holders while watched, until its holder's death is seen
	 * (protected by core->holders.mu, not by the stripe mutex): */
	bool indexed;
	struct cached *hnext, *hprev;
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

/* One place in a name's FIFO queue (queue.c). */
struct qentry {
	struct qentry *next, *prev;
	struct lockfs_wait *w;   /* NULL: a place kept for an interrupted waiter */
	char owner[LOCKFS_FD_OWNER_MAX];
	uint64_t via_file;       /* the open file it asks through (0: none) */
	enum lockfs_mode mode;
	struct lockfs_proc who;  /* the holder-to-be (helpers skipped) */
	char **cmdline;          /* its argv, read when it asked (may be NULL) */
	char *slug;              /* the caller's LOCKFS_SLUG, or NULL */
	uid_t uid;               /* of the caller */
	gid_t gid;
	int64_t since_ms;        /* wall clock, for `waiters` */
	int64_t keep_until_ms;   /* boot clock: a kept place's end */
};

/* The waiters of one name; exists while it has any. */
struct lockq {
	struct lockq *next;
	char *name;
	struct qentry *head, *tail;
	size_t nactive;          /* entries with a parked request */
};

/* An fd lock whose owner let go (last close, LOCK_UN) while the store
 * could not be written, or a grant the log refused that the store would
 * not take back: still held in DIR, by nobody.  The tick retries, and the
 * `released` line is written when the store takes it (none for a grant
 * whose `acquired` the log never had). */
struct unlock_retry {
	struct unlock_retry *next;
	char *name;
	char owner[LOCKFS_FD_OWNER_MAX];
	uint64_t fence;          /* of that holder: only that grant is ended */
	bool logged;             /* its `acquired` is in the log */
};

struct stripe {
	pthread_mutex_t mu;
	struct cached *head;     /* protected by mu */
	/* Boot ms from which the tick's collect() must look at this stripe
	 * (a lease runs out, a dead holder's lock is not queued, a holder is
	 * not watched); INT64_MAX: nothing to do.  Protected by mu. */
	int64_t due_boot_ms;
	/* Some entry may have a process-bound share (a shared lock rebound
	 * at a restart), which queue_tick() polls.  Protected by mu. */
	bool process_shares;
	struct lockq *queues;    /* protected by mu */
	struct unlock_retry *retries; /* protected by mu */
	struct fdlock_via *via_files; /* fdlock.c; protected by mu */
};

/* The watched entries of the cache by holder (pid, start): what a death
 * releases, found without a walk of the cache.  MU is taken inside a
 * stripe mutex, never the other way round. */
#define HOLDER_BUCKETS 4096
struct holder_index {
	pthread_mutex_t mu;
	struct cached *buckets[HOLDER_BUCKETS]; /* by pid; protected by mu */
};

struct uid_name {
	uid_t uid;
	char *name; /* NULL when the uid has no passwd entry */
};

struct lockfs_core {
	struct lockfs_backend *be;
	struct lockfs_log *log;
	struct lockfs_fence *fence;
	struct lockfs_liveness *liveness;
	struct lockfs_descendants *descendants;
	struct lockfs_procevents *procevents; /* NULL: descendants found by scans */
	struct lockfs_helpers helpers;
	const struct lockfs_proc_source *procs;
	int dirfd;              /* borrowed */
	char host[LOCKFS_HOST_MAX];
	char boot_id[40];
	uint32_t default_lease_s;
	uint32_t stale_s;
	int break_signal;
	int64_t next_stale_scan_ms;
	dev_t mount_dev;        /* of the mount served; 0 = not known (set before
				   the liveness thread starts) */
	bool starting;          /* in lockfs_core_open's scan */
	struct lockfs_fds fds;  /* descriptors kept for callers (fds.h) */
	struct quota *quota;    /* what each uid holds (quota.h) */
	bool open_cap_given;    /* -o max_open_per_uid was set */
	struct recovery_work *work; /* the liveness thread's (recovery.c) */
	struct holder_index holders;
	struct stripe stripes[STRIPES];

	pthread_mutex_t users_mu;
	struct uid_name *users; /* protected by users_mu */
	size_t nusers;
};

struct stripe *stripe_of(struct lockfs_core *core, const char *name);
/* Called with s->mu held. */
struct cached *cache_find(struct stripe *s, const char *name);
void cache_drop(struct lockfs_core *core, struct stripe *s, const char *name);
int load_locked(struct lockfs_core *core, struct stripe *s, const char *name,
		struct lockfs_entry_stat *st, bool *foreign, bool fresh, struct cached **c);

/*
 * Remove C's lock from the store (or hand it to the queue's head), then
 * log EVENT with fence=, uid=, pid= and then EXTRA (key, value, ...,
 * NULL; may be NULL); EVENT NULL (or C unlogged) logs nothing.  The line
 * is written only once the store has let go, and before s->mu is: nobody
 * is granted NAME through this daemon in between, because every grant
 * happens, and every `acquired` line is written, only after taking s->mu
 * -- so the log never shows two holders at once, nor a release that did
 * not happen.  The line never waits for the log (log_event): a full disk
 * delays the line, never the release.
 * Called with s->mu held and C a fresh entry (read from the store under
 * this hold).  0 (C dropped), -ENOENT (gone behind our back: C dropped,
 * nothing logged), or -errno of the store (-EIO): then the lock is still
 * held, C stays cached and its holder watched, and nothing is logged.
 */
int release_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
		   uint64_t identity, const char *event, const char *const *extra);

/* "comm[pid]", or the slug when there is one. */
void who_of(char *buf, size_t size, const char *slug, const char *comm, pid_t pid);
/* WHO for the process of thread TID: its resolved holder's comm[pid] or
 * its LOCKFS_SLUG.  Returns the pid WHO stands for: the resolved process,
 * else TID (0 = not visible). */
pid_t who_of_caller(struct lockfs_core *core, pid_t tid, char *buf, size_t size);
/* Decimal UID and PID into the buffers, for a line's uid= and pid=. */
void ids_of(char uid[16], char pid[16], uid_t u, pid_t p);
/* Log EVENT: written now, or kept until the log takes writes again (and
 * sent to syslog meanwhile).  Never fails the request: for what happens
 * whether or not it can be logged (releases, recoveries, refusals). */
void log_event(struct lockfs_core *core, const char *who, const char *name,
	       const char *const *kv, const char *event);
/* Log a grant's `acquired` line now or not at all.  Returns 0, or the
 * -errno of the failed write (-ENOSPC, -EDQUOT, -EFBIG, -ENOMEM, or -EIO
 * for any other): then the grant must be undone. */
int log_acquired(struct lockfs_core *core, const char *who, const char *name,
		 const char *const *kv);
/* A refused request by CALLER (uid from the kernel, PID the process WHO
 * names), rate-limited per uid (lockfs_log_denied). */
void log_refusal(struct lockfs_core *core, const struct lockfs_caller *caller, pid_t pid,
		 const char *who, const char *name, const char *reason);

/*
 * Run VIEW on NAME's record (C is NULL for a foreign lock) with the stripe
 * mutex held: the shape of every read-only request (engine.c).  Returns
 * VIEW's result, -ENOENT when not held, -errno.
 */
int with_record(struct lockfs_core *core, const char *name,
		int (*view)(const char *name, struct cached *c,
			    const struct lockfs_entry_stat *st, void *arg),
		void *arg);

/* Drop S's mutex. */
void stripe_unlock(struct stripe *s);

/* Does a holder's exit leave REC to the holder's descendants?  Exclusive
 * process-bound locks only: slug-bound and fd locks have rules of their
 * own, and a shared lock's holders leave one by one. */
bool descendants_keep(const struct lockfs_record *rec);

/* Count (SIGN 1) or stop counting (-1) every holder of C's record against
 * its uid's locks (quota.h).  The cache is what is counted: every change
 * of a cached record is bracketed by the two.  With s->mu held. */
void cache_account(struct lockfs_core *core, const struct cached *c, int sign);

/*
 * Refuse a request of UID for REASON: counted into the uid's burst of
 * refusals, which is logged as one `refused` line when it ends.  NAME is
 * what was asked for (may be NULL); WHO the caller as the log names it and
 * PID the process it stands for (0 = not known), or WHO NULL to resolve
 * thread PID now (only for a burst's first refusal).
 */
void quota_refuse(struct lockfs_core *core, uid_t uid, enum quota_reason reason,
		  const char *name, const char *who, pid_t pid);
/* Log the `refused` line of burst B (a quota_flush() callback; ARG is the core). */
void log_refused(void *arg, const struct quota_burst *b);

/* Is holder (PID, START) in the index (the holder of some watched lock)?
 * Then true, and *UID its uid. */
bool holder_uid(struct lockfs_core *core, pid_t pid, unsigned long long start, uid_t *uid);
/* Take up to MAX locks of dead holder (PID, START) out of the index: their
 * names, malloc'd (free each and the array; *NAMES may be NULL when none).
 * 0 (fewer than MAX: none is left) or -ENOMEM (some may be left). */
int holder_take(struct lockfs_core *core, pid_t pid, unsigned long long start, size_t max,
		char ***names, size_t *count) __attribute__((warn_unused_result));
/* The tick must look at S by when C needs it (see due_boot_ms); with
 * s->mu held.  stripe_set_due recomputes it from every entry. */
void stripe_note_due(struct stripe *s, const struct cached *c);
void stripe_set_due(struct stripe *s);

/* Watching holders (engine.c); with s->mu held. */
void cache_watch(struct lockfs_core *core, struct cached *c, int pidfd);
void cache_unwatch(struct lockfs_core *core, struct cached *c);
void cache_put(struct lockfs_core *core, struct stripe *s, const char *name,
	       uint64_t identity, struct lockfs_record *rec, int pidfd, bool ours);
int persist_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
		   struct lockfs_entry_stat *st);
/* Fill H (zeroed) with process P's facts, as for a new holder: CMDLINE,
 * when it points to an argv read earlier, is taken over, else P's is read.
 * 0 or -ENOMEM (then H is cleared). */
int holder_fill(struct lockfs_core *core, struct lockfs_holder *h, const struct lockfs_proc *p,
		char ***cmdline);
/* A record for a new holder WHO of NAME (fresh fence and token). */
int build_record(struct lockfs_core *core, const char *name,
		 const struct lockfs_proc *p, const char *slug, struct lockfs_record *rec,
		 char ***cmdline);
void lease_start(struct lockfs_lease *lease, uint32_t ttl_s);
int caller_slug(const struct lockfs_proc_source *src, pid_t tid, char *buf, size_t size);

/*
 * Holder I of C (0 = rec.holder, I >= 1 = rec.shares[I - 1]) lets go:
 * the last holder releases the lock (release_locked, which hands it to
 * the queue's head), any other is removed from the record.  Logs EVENT
 * (unless NULL) for that holder once the store took the change (see
 * release_locked).  With s->mu held and C fresh.  0 or -errno (the store
 * refused: C is read back as the store still has it, nothing logged).
 */
int drop_holder_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
		       uint64_t identity, size_t i, const char *event,
		       const char *const *extra);
size_t holder_count(const struct lockfs_record *rec);
/* May CALLER act as C's holder (the rmdir rule)?  0, -EPERM, -EACCES. */
int holder_check_entry(struct lockfs_core *core, const struct cached *c,
		       const struct lockfs_caller *caller);

/* Is holder I of NAME's record REC a grant whose descriptor let go while
 * the store refused the release (struct unlock_retry)?  With s->mu held. */
bool retry_pending_locked(struct stripe *s, const char *name, const struct lockfs_record *rec,
			  size_t i);
/* The event that ends holder I of NAME's record REC: "released", or NULL
 * for a grant the log refused and the store would not take back (struct
 * unlock_retry), whose `acquired` the log never had.  With s->mu held. */
const char *release_event_locked(struct stripe *s, const char *name,
				 const struct lockfs_record *rec, size_t i);
/* Try the pending retries of every stripe once (queue.c; takes the mutexes). */
void queue_retry_all(struct lockfs_core *core);

/* The queue (queue.c); all with s->mu held. */
struct lockq *queue_find(struct stripe *s, const char *name);
/* Grant NAME's head (and the shared requests right behind it) if the lock
 * allows now; drops the queue when it is empty. */
void queue_grant_locked(struct lockfs_core *core, struct stripe *s, const char *name);
/* Give C's lock (being released, store identity IDENTITY) straight to
 * the queue's head by rewriting the record in place: nobody can take it
 * in between.  true if handed off (C is then replaced in the cache). */
bool queue_handoff_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
			  uint64_t identity, const char *who, const char *const *kv,
			  const char *event);
/* Kept places that ran out, retries behind locks we cannot watch (the
 * seed's), holders of rebound shared locks that died.  Liveness thread. */
void queue_tick(struct lockfs_core *core);
void queue_free_all(struct stripe *s);

/* Replace C's list of descendants by the live ones (in memory; the tick
 * writes a changed list to the store), and set *VERSION (may be NULL) to
 * the list's version.  With the stripe mutex held.  0 or -errno. */
int descendants_refresh(struct lockfs_core *core, struct cached *c, uint64_t *version);

/* fd locks across a restart (rebound.c).  At startup, with s->mu held and
 * C fresh: bind C's fd holders to the processes that still hold their old
 * descriptors, end those whose descriptor is closed, log it.  C may be
 * gone afterwards.  A rebound lock is due for the tick every
 * REBOUND_CHECK_MS (entry_due), which queues it in its uid's turn;
 * rebound_check then ends the holders of NAME's acquisition TOKEN whose
 * old descriptor nobody holds any more (liveness thread, no mutex held:
 * it reads /proc). */
#define REBOUND_CHECK_MS 1000
void rebind_fd_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
		      struct lockfs_entry_stat *st);
void rebound_check(struct lockfs_core *core, const char *name, const char *token);

/* Recovery (recovery.c), on the liveness thread.  Deaths and ticks queue
 * todos per uid; recovery_work does them a bounded slice at a time, one
 * uid after another. */
int recovery_init(struct lockfs_core *core);
void recovery_fini(struct lockfs_core *core);
void recovery_holder_exited(void *arg, pid_t pid, unsigned long long start);
void recovery_tick(void *arg);
bool recovery_work(void *arg);
int recovery_startup_scan(struct lockfs_core *core);

#endif
