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
#include "lockfs/log.h"
#include "lockfs/record.h"
#include "fence.h"
#include "liveness.h"

#define STRIPES 256
#define SLUG_MAX 256
#define WHO_MAX (SLUG_MAX + 32)

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
	int64_t next_check_boot_ms; /* slug evidence: not before this */
};

/* One place in a name's FIFO queue (queue.c). */
struct qentry {
	struct qentry *next, *prev;
	struct lockfs_wait *w;   /* NULL: a place kept for an interrupted waiter */
	char owner[LOCKFS_FD_OWNER_MAX];
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
 * could not be written: still held in DIR, by nobody.  The tick retries,
 * and its `released` line is written when the store takes it. */
struct unlock_retry {
	struct unlock_retry *next;
	char *name;
	char owner[LOCKFS_FD_OWNER_MAX];
	uint64_t fence;          /* of that holder: only that grant is ended */
};

struct stripe {
	pthread_mutex_t mu;
	struct cached *head;     /* protected by mu */
	struct lockq *queues;    /* protected by mu */
	struct unlock_retry *retries; /* protected by mu */
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
	struct lockfs_helpers helpers;
	const struct lockfs_proc_source *procs;
	int dirfd;              /* borrowed */
	char *log_name;
	char host[256];
	char boot_id[40];
	uint32_t default_lease_s;
	uint32_t stale_s;
	int break_signal;
	lockfs_removed_fn removed;
	void *removed_arg;
	int64_t next_stale_scan_ms;
	int64_t next_rebound_check_ms; /* boot clock; liveness thread only */
	dev_t mount_dev;        /* of the mount served; 0 = not known (set before
				   the liveness thread starts) */
	bool starting;          /* in lockfs_core_open's scan */
	struct stripe stripes[STRIPES];

	pthread_mutex_t users_mu;
	struct uid_name *users; /* protected by users_mu */
	size_t nusers;
};

int64_t lockfs_wall_ms(void);
int64_t lockfs_boot_ms(void);

struct stripe *stripe_of(struct lockfs_core *core, const char *name);
/* Called with s->mu held. */
struct cached *cache_find(struct stripe *s, const char *name);
void cache_drop(struct lockfs_core *core, struct stripe *s, const char *name);
int load_locked(struct lockfs_core *core, struct stripe *s, const char *name,
		struct lockfs_entry_stat *st, bool *foreign, bool fresh, struct cached **c);

/*
 * Remove C's lock from the store (or hand it to the queue's head), then
 * log EVENT with fence=, pid= and then EXTRA (key, value, ..., NULL; may
 * be NULL); EVENT NULL logs nothing.  The line is written only once the
 * store has let go, and before s->mu is: nobody is granted NAME through
 * this daemon in between, because every grant happens, and every
 * `acquired` line is written, only after taking s->mu -- so the log never
 * shows two holders at once, nor a release that did not happen.
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
 * its LOCKFS_SLUG. */
void who_of_caller(struct lockfs_core *core, pid_t tid, char *buf, size_t size);
void log_event(struct lockfs_core *core, const char *who, const char *name,
	       const char *const *kv, const char *event);
void notify_removed(struct lockfs_core *core, const char *name);

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
int caller_slug(pid_t tid, char *buf, size_t size);

/*
 * Holder I of C (0 = rec.holder, I >= 1 = rec.shares[I - 1]) lets go:
 * the last holder releases the lock (release_locked, which hands it to
 * the queue's head), any other is removed from the record.  Logs EVENT
 * (unless NULL) for that holder.  With s->mu held and C fresh.  0 or -errno.
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

/* fd locks across a restart (rebound.c).  At startup, with s->mu held and
 * C fresh: bind C's fd holders to the processes that still hold their old
 * descriptors, end those whose descriptor is closed, log it.  C may be
 * gone afterwards.  rebound_tick: about once a second, end rebound locks
 * whose descriptor nobody holds any more (liveness thread). */
void rebind_fd_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
		      struct lockfs_entry_stat *st);
void rebound_tick(struct lockfs_core *core);

/* Recovery (recovery.c). */
void recovery_holder_exited(void *arg, pid_t pid, unsigned long long start);
void recovery_tick(void *arg);
int recovery_startup_scan(struct lockfs_core *core);

#endif
