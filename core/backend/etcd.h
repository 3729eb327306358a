/*
 * The etcd store (etcd.c, etcd_mirror.c, etcd_session.c): what its three
 * files share.  Not a public interface: lockfs/backend.h is, and the kind
 * lockfs_backend_etcd_kind is all registry.c sees.
 *
 * Data model (docs/etcd.md): lock NAME is the key range R(NAME) = PREFIX
 * NAME "/" .. ; each contender is one key PREFIX NAME "/" <lease hex>
 * "-" <seq hex> on this daemon's lease; the key with the lowest
 * create_revision holds NAME (etcd's concurrency.Mutex, which `etcdctl
 * lock` uses).  PREFIX ".hosts/" HOST is a daemon's host key, on its
 * lease.
 *
 * Locking: mirror.mu and session.mu are leaves of this backend.  Neither
 * is held across a network call or across the change callback; report_mu
 * is held only across the change callback (it serialises the watch thread
 * and the session thread as one reporter) and is taken by no op.
 */
#ifndef LOCKFS_BACKEND_ETCD_H
#define LOCKFS_BACKEND_ETCD_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/backend.h"
#include "lockfs/etcd_client.h"
#include "statedir.h"

extern const struct lockfs_backend_kind lockfs_backend_etcd_kind;

/* ---- The mirror (etcd_mirror.c): the prefix as the watch last showed it ---- */

/* One contender key of a name. */
struct etcd_key {
	char *key;               /* the whole key */
	char *value;             /* its value (NUL-terminated; "" for etcdctl's) */
	size_t value_len;
	/* The value's own "fence" (lockfs_record_peek_fence; 0: none), parsed
	 * once per value when a head is first copied out, not at every stat. */
	uint64_t record_fence;
	bool record_fence_known; /* record_fence is the current value's */
	int64_t create_rev;
	int64_t mod_rev;
	int64_t lease;
	int64_t seen_ms;         /* wall clock: when this daemon first saw it */
	/* The revision of this daemon's own update(GRANT) when the key has not
	 * changed since (mod_rev == grant_rev): the fence read() supplies for a
	 * record written without one.  0: none. */
	int64_t grant_rev;
	/* Deleted at mod_rev, kept until the watch has passed mod_rev so that a
	 * late event of the key's life does not bring it back. */
	bool dead;
};

struct etcd_name {
	char *name;
	struct etcd_key *keys;   /* sorted by create_rev (dead ones too) */
	size_t n, cap;
	int64_t delay_until_ms;  /* lock-delay: held by nobody until then */
	/* Every event of NAME before it is applied (its read's revision + 1,
	 * then its watch's resume point): dead keys before it are swept. */
	int64_t next_rev;
	/* A txn of this daemon proved at some revision that no key of NAME
	 * created before GONE_RANK lived then (a granted try-lock, a claim):
	 * such a key's life is over for good, so a read or a watch event that
	 * still shows it (issued before that txn, delivered after) is stale
	 * and never brings it back ahead of this daemon's grant.  0: none. */
	int64_t gone_rank;
	struct etcd_name *next;  /* hash chain */
};

struct etcd_host {
	char *host;
	int64_t lease;
	int64_t mod_rev;
	struct etcd_host *next;
};

#define MIRROR_BUCKETS 1024
/* Own write revisions remembered until the watch brings them back. */
#define MIRROR_OWN_REVS 64
#define MIRROR_OWN_MS 10000

struct etcd_mirror {
	pthread_mutex_t mu;      /* leaf: everything below */
	const char *prefix;      /* the store's (not owned) */
	size_t prefix_len;
	struct etcd_name *buckets[MIRROR_BUCKETS];
	/* Buckets that may hold a dead key or an empty name, one bit each:
	 * the only ones a sweep visits (it runs after every watch message). */
	uint64_t to_sweep[MIRROR_BUCKETS / 64];
	struct etcd_host *hosts;
	bool watching;           /* the watch stream is up and confirmed */
	/* Revisions of this daemon's own uncontended writes (see
	 * lockfs_etcdbe_mirror_note_own_locked), not yet delivered by the
	 * watch: their events are reported as CHANGE_OWN.  Unordered; each
	 * dropped once delivered, or after MIRROR_OWN_MS (its name may have
	 * stopped being watched). */
	int64_t own_revs[MIRROR_OWN_REVS];
	int64_t own_ms[MIRROR_OWN_REVS];
	size_t n_own_revs;
};

/* A copy of what a name's head says, for an op to use unlocked. */
struct etcd_head {
	bool held;                /* a live key, or lock-delay */
	bool has_key;             /* KEY below is set */
	char key[LOCKFS_STORE_KEY_MAX];
	int64_t create_rev, mod_rev, lease, seen_ms, grant_rev;
	int64_t delay_until_ms;
	char *value;              /* with WANT_VALUE: malloc'd copy, else NULL */
	size_t value_len;
	bool value_empty;
	uint64_t record_fence;    /* the value's own "fence", 0 when none */
};

void lockfs_etcdbe_mirror_init(struct etcd_mirror *m, const char *prefix);
void lockfs_etcdbe_mirror_free(struct etcd_mirror *m);

/* NAME of KEY (under the mirror's prefix) into BUF: 1 for a contender key,
 * 2 for a host key (BUF: the host), 0 for anything else. */
int lockfs_etcdbe_mirror_classify(const struct etcd_mirror *m, const char *key, char *buf, size_t size);
/* Is NAME one of the daemons' own keys' names, never a lock (a dot name
 * other than a slot's, docs/slots.md)? */
bool lockfs_etcdbe_reserved(const char *name);

/* Names that changed, for the reporter (a growable array of strings). */
struct etcd_names {
	char **v;
	size_t n, cap;
	bool all;                /* report "anything may have changed" */
	bool own;                /* only this daemon's own writes changed them
				    (reported as CHANGE_OWN, unless ALL) */
};
void lockfs_etcdbe_names_free(struct etcd_names *ns);
/* NAME to NS, once (NS NULL: nothing).  0; -ENOMEM (NS->all set). */
int lockfs_etcdbe_names_add(struct etcd_names *ns, const char *name);

/* Apply one PUT (KV) or DELETE (KEY at REV) with MIRROR_MU held.  A
 * DELETE of NAME's head key with DELAY_UNTIL_MS > 0 puts NAME in
 * lock-delay until then.  The name changed goes to CHANGED (may be NULL).
 * Returns -ENOMEM or 0. */
int lockfs_etcdbe_mirror_put_locked(struct etcd_mirror *m, const struct lockfs_etcd_kv *kv,
			   int64_t now_ms, struct etcd_names *changed);
/* A txn at revision REV proved that no key of NAME created before RANK
 * exists (TRY's empty range, claim's "K is the first"): the ones the watch
 * has not yet reported gone are marked gone at REV, so that stat and read
 * never show a holder older than this daemon's own grant. */
void lockfs_etcdbe_mirror_gone_before_locked(struct etcd_mirror *m, const char *name,
					     int64_t rank, int64_t rev);
int lockfs_etcdbe_mirror_delete_locked(struct etcd_mirror *m, const char *key, int64_t rev,
			      int64_t delay_until_ms, struct etcd_names *changed);

/* End the lock-delays that are over by NOW_MS; their names to OVER. */
void lockfs_etcdbe_mirror_delays_over(struct etcd_mirror *m, int64_t now_ms, struct etcd_names *over);

/* Replace the mirror with a fresh read (KVS at REV); keys written since
 * REV by this daemon stay.  CHANGED gets `all`. */
int lockfs_etcdbe_mirror_load(struct etcd_mirror *m, const struct lockfs_etcd_kv *kvs, size_t n,
		     int64_t rev, int64_t now_ms);

/*
 * This daemon's own write of KEY at revision REV, already applied to the
 * mirror, left no live key in NAME's line but KEY (its acquire or update
 * with nobody waiting, its release with nobody behind): remember REV, so
 * that the watch's echo of it is reported as CHANGE_OWN, which wakes
 * nobody.  A write that leaves others in NAME's line is not remembered:
 * its echo stays CHANGE_NAME, for the engine's queue.  With MIRROR_MU
 * held; when the set is full, REV is simply not remembered (CHANGE_NAME:
 * safe).
 */
void lockfs_etcdbe_mirror_note_own_locked(struct etcd_mirror *m, const char *name,
					  const char *key, int64_t rev);
/* Is KEY alone in NAME's line (no other live key)?  MIRROR_MU held. */
bool lockfs_etcdbe_mirror_alone_locked(struct etcd_mirror *m, const char *name, const char *key);
/* The lease of KEY (a contender key, or a host key) as the mirror has it
 * while KEY lives, into *LEASE: 0; -ENOENT (not there, or deleted).  With
 * MIRROR_MU held.  What a DELETE event without prev_kv deleted. */
int lockfs_etcdbe_mirror_lease_locked(struct etcd_mirror *m, const char *key, int64_t *lease);
/* Is REV one of this daemon's remembered own writes (then forgotten: an
 * event comes once)?  MIRROR_MU held. */
bool lockfs_etcdbe_mirror_is_own_locked(struct etcd_mirror *m, int64_t rev);

/* NAME as a fresh read of R(NAME) at REV showed it (KVS): keys the read
 * does not have and that changed no later than REV go; this daemon's
 * writes after REV stay; lock-delay stays.  Every event of NAME after REV
 * is to come.  0, -ENOMEM. */
int lockfs_etcdbe_mirror_load_name(struct etcd_mirror *m, const char *name,
				   const struct lockfs_etcd_kv *kvs, size_t n, int64_t rev,
				   int64_t now_ms);
/* The host keys as a fresh read at REV showed them (KVS). */
int lockfs_etcdbe_mirror_load_hosts(struct etcd_mirror *m, const struct lockfs_etcd_kv *kvs,
				    size_t n, int64_t rev);
/* NAME's events before NEXT_REV are applied (MIRROR_MU held). */
void lockfs_etcdbe_mirror_set_next_locked(struct etcd_mirror *m, const char *name, int64_t next_rev);
/* Forget NAME (nobody here needs it any more).  MIRROR_MU held. */
void lockfs_etcdbe_mirror_forget_locked(struct etcd_mirror *m, const char *name);
/* Is NAME needed here: in lock-delay, or a live key on a lease OURS says
 * is this daemon's?  MIRROR_MU held. */
bool lockfs_etcdbe_mirror_wanted_locked(struct etcd_mirror *m, const char *name, int64_t now_ms,
					bool (*ours)(void *arg, int64_t lease), void *arg);
/* The key just ahead of this daemon's first live key of NAME (OURS tells
 * this daemon's leases), into BUF: the only key a waiter here needs to
 * watch, as etcd's Mutex does.  Returns the revision from which NAME's
 * events are not yet applied, or 0: no such key (NAME unknown, in
 * lock-delay, no key of this daemon, or its first key heads NAME).
 * MIRROR_MU held. */
int64_t lockfs_etcdbe_mirror_ahead_locked(struct etcd_mirror *m, const char *name, int64_t now_ms,
					   bool (*ours)(void *arg, int64_t lease), void *arg,
					   char *buf, size_t size);
/* Does this daemon's first live key (OURS tells its leases) head NAME,
 * out of lock-delay?  Keys ahead never come back and none can be made
 * ahead, so once the mirror shows no key ahead, none is in etcd either.
 * MIRROR_MU held. */
bool lockfs_etcdbe_mirror_heads_locked(struct etcd_mirror *m, const char *name, int64_t now_ms,
				       bool (*ours)(void *arg, int64_t lease), void *arg);
/* Put NAME in lock-delay until UNTIL_MS (it is kept till then). */
void lockfs_etcdbe_mirror_set_delay(struct etcd_mirror *m, const char *name, int64_t until_ms);
void lockfs_etcdbe_mirror_set_delay_locked(struct etcd_mirror *m, const char *name,
					   int64_t until_ms);
/* Is NAME in lock-delay at NOW_MS?  MIRROR_MU held. */
bool lockfs_etcdbe_mirror_delayed_locked(struct etcd_mirror *m, const char *name, int64_t now_ms);
/* Each name the mirror holds, to CB (copied out first).  0, -ENOMEM. */
int lockfs_etcdbe_mirror_each(struct etcd_mirror *m, lockfs_list_cb cb, void *arg);
/* The host whose key is on LEASE, into BUF: 0; -ENOENT. */
int lockfs_etcdbe_mirror_host_of(struct etcd_mirror *m, int64_t lease, char *buf, size_t size);

/* Forget dead keys the watch has passed, and own revisions it delivered
 * (with MIRROR_MU held). */
void lockfs_etcdbe_mirror_sweep_locked(struct etcd_mirror *m);

/* NAME's head (first live key, or lock-delay) into *H; with WANT_VALUE a
 * copy of its value (-ENOMEM).  0; -ENOENT: not held. */
int lockfs_etcdbe_mirror_head(struct etcd_mirror *m, const char *name, bool want_value, int64_t now_ms,
		     struct etcd_head *h);

/* The live key of NAME whose identity is IDENTITY into *H (with its
 * value when WANT_VALUE).  0; -ENOENT. */
int lockfs_etcdbe_mirror_find_identity(struct etcd_mirror *m, const char *name, uint64_t identity,
			      bool want_value, struct etcd_head *h);

/* Is KEY (of NAME) live in the mirror, and is it NAME's first live key?
 * 1: the head; 0: behind another; -ENOENT: not there. */
int lockfs_etcdbe_mirror_is_head(struct etcd_mirror *m, const char *name, const char *key);

/* The record this daemon itself wrote into KEY at REV has RECORD_FENCE
 * as its own "fence" (0: null): known without parsing it. */
void lockfs_etcdbe_mirror_set_fence_locked(struct etcd_mirror *m, const char *key, int64_t rev,
					   uint64_t record_fence);
/* Record this daemon's own grant of KEY at REV (GRANT_REV: its
 * update(GRANT) revision, else 0). */
void lockfs_etcdbe_mirror_set_grant(struct etcd_mirror *m, const char *key, int64_t rev,
			   int64_t grant_rev);

/* Each name with a live key or in lock-delay, to CB (copied out first, so
 * CB runs without the lock).  0, -ENOMEM. */
int lockfs_etcdbe_mirror_list(struct etcd_mirror *m, int64_t now_ms, lockfs_list_cb cb, void *arg);

/* HOST's host key: 0 (*LEASE), -ENOENT. */
int lockfs_etcdbe_mirror_host(struct etcd_mirror *m, const char *host, int64_t *lease);

/* The identity of a key at (CREATE, MOD): never 0. */
uint64_t lockfs_etcdbe_identity(int64_t create_rev, int64_t mod_rev);

/* ---- The session (etcd_session.c) ---- */

/*
 * A write whose outcome is unknown, to undo once etcd answers -- and again
 * whenever the watch shows KEY after all: a request held up on the way
 * (a partition, a proxy) can still be applied long after etcd answered
 * the first undo.  KEY is never written again by anyone else (a contender
 * key carries a sequence number of this daemon), so deleting it later is
 * always safe.  Kept until a delete took it out, or its lease is no longer
 * this daemon's (the key went with it); one with a known create_rev (a
 * place) only until etcd answered once: that key cannot come back.
 */
struct etcd_pending {
	char *key;
	int64_t lease;           /* delete KEY only while on this lease */
	int64_t create_rev;      /* and, when known, created at this revision */
	bool place_only;         /* and only while unwritten since (a place) */
	bool tried;              /* one delete was answered (KEY was not there) */
	struct etcd_pending *next;
};

struct etcd_store;

/*
 * What the session thread asks of the store above it, given once at
 * lockfs_etcdbe_session_init: the session keeps the lease and says what
 * became of it, as etcd's own Go client keeps its Session apart from the
 * Mutex; it calls no function of the files that call it.
 */
struct etcd_session_hooks {
	/* The watch ended: reopen it from revision FROM or, with *RESYNC
	 * (set also when FROM is compacted), from a fresh read.  0 or -errno. */
	int (*watch_reopen)(struct etcd_store *e, int64_t from, bool *resync);
	/* Report CHANGED (and free it) and, when SESSION_CHANGED, that the
	 * session changed state (lockfs_etcdbe_report). */
	void (*report)(struct etcd_store *e, struct etcd_names *changed, bool session_changed);
	/* Every keepalive interval: drop what is no longer needed. */
	void (*tick)(struct etcd_store *e);
};

struct etcd_session {
	const struct etcd_session_hooks *hooks; /* set at init, read-only then */
	pthread_mutex_t mu;      /* leaf: everything below */
	pthread_cond_t cv;       /* wakes the session thread */
	enum lockfs_session_state state; /* also read with __atomic by ops */
	int64_t since_ms;        /* wall clock: entered STATE */
	int64_t lease;           /* this daemon's lease (__atomic for ops) */
	int64_t sent_ms;         /* boot clock: send time of the last confirmed keepalive */
	int64_t lost_leases[8];  /* leases of this daemon that were lost */
	size_t n_lost;
	int64_t predecessor;     /* an earlier daemon's lease to revoke at start (0: none) */
	struct etcd_pending *pending;
	bool stop;
	bool watch_ended;        /* the watch sent ENDED: reopen it */
	bool watch_resync;       /* ... from a fresh read */
	int64_t watch_from;      /* ... else from this revision */
	bool running;            /* the thread runs */
	pthread_t thread;
};

/* ---- An earlier session that expired before this daemon (etcd_expired.c) ---- */

/* At open, when the host key was free (OWN_LEASE: the lease this daemon
 * put it on): find in etcd's history the session of this host, machine
 * and boot that ended last, and show its locks to the startup scan as
 * they were (the mirror, E->expired).  Says on stderr when history cannot
 * tell. */
void lockfs_etcdbe_find_expired(struct etcd_store *e, int64_t own_lease);
/* In start(): take those keys out of the mirror again (their names to
 * CHANGED), and free the list. */
void lockfs_etcdbe_drop_expired(struct etcd_store *e, struct etcd_names *changed);
/* Free the list (close, a failed open). */
void lockfs_etcdbe_free_expired(struct etcd_store *e);

/* ---- The store ---- */

/* ---- Keys to write again (etcd_keys.c) ---- */

#define ETCD_KEYS_BUCKETS 256
#define ETCD_KEYS_MAX 4096  /* names remembered at most; more are forgotten */

struct etcd_free_key {
	struct etcd_free_key *next;
	int64_t lease;           /* the session the key belongs to */
	uint64_t seq;            /* its suffix */
	char name[];
};

/* Per name, one contender key of this daemon that nobody holds, waits
 * with or will delete: the next acquire of the name writes it again
 * instead of a new one, so that etcd's index of R(NAME) does not grow with
 * every acquire.  mu is a leaf. */
struct etcd_keys {
	pthread_mutex_t mu;
	struct etcd_free_key *buckets[ETCD_KEYS_BUCKETS];  /* protected by mu */
	size_t count;                                      /* protected by mu */
	bool ready;
};

void lockfs_etcdbe_keys_init(struct etcd_keys *k);
void lockfs_etcdbe_keys_destroy(struct etcd_keys *k);
/* Key SEQ of NAME on LEASE was deleted by this daemon's own guarded
 * delete, or never made (a refused try-lock): it may be written again.
 * Remembered while there is room; forgetting is safe. */
void lockfs_etcdbe_key_free(struct etcd_keys *k, const char *name, int64_t lease, uint64_t seq);
/* Take NAME's remembered key for an acquire on LEASE: true and *SEQ, or
 * false (none, or one of an earlier lease, which is dropped). */
bool lockfs_etcdbe_key_reuse(struct etcd_keys *k, const char *name, int64_t lease, uint64_t *seq);
/* KEY is PREFIX NAME "/" <LEASE, 16 hex> "-" <seq hex>, this daemon's own
 * contender key on LEASE: true and *SEQ. */
/* The backend op `line` (etcd_line.c): NAME's waiting contenders, every
 * host's, in etcd's order. */
int lockfs_etcdbe_line(struct lockfs_backend *be, const char *name, lockfs_line_cb cb, void *arg);

bool lockfs_etcdbe_own_key_seq(const char *prefix, const char *name, const char *key,
			       int64_t lease, uint64_t *seq);

/* ---- Keys the engine has (etcd_owned.c), and orphans (etcd_orphan.c) ---- */

#define ETCD_OWNED_BUCKETS 256
#define ETCD_SUSPECTS_MAX 64     /* orphans looked at per tick, at most */

struct etcd_owned_key {
	struct etcd_owned_key *next;
	bool granted;            /* an op of ours returned it to the engine as a grant */
	bool deleting;           /* its release's delete is on its way */
	char key[];
};

/* A head key of the current lease that nobody here owned at a tick. */
struct etcd_suspect {
	char *key;
	int64_t create_rev, mod_rev;
	size_t name_len;         /* its name: KEY after the prefix, this long */
};

/* Every contender key of this daemon that the engine holds or waits with,
 * or that an op is writing; the suspects of the last tick; names to report
 * again at the next tick (claims whose outcome was unknown).  mu is taken
 * before mirror.mu (etcd_orphan.c), never the other way. */
struct etcd_owned {
	pthread_mutex_t mu;
	struct etcd_owned_key *buckets[ETCD_OWNED_BUCKETS];
	size_t unsure;           /* adds that found no memory: no orphan is sure */
	struct etcd_suspect suspects[ETCD_SUSPECTS_MAX];
	size_t n_suspects;
	struct etcd_names recheck;
	bool ready;
};

void lockfs_etcdbe_owned_init(struct etcd_owned *o);
void lockfs_etcdbe_owned_destroy(struct etcd_owned *o);
/* KEY is the engine's (a grant or a place), or an op is about to write it. */
void lockfs_etcdbe_owned_add(struct etcd_store *e, const char *key);
/* KEY's life here ended (its own guarded delete, or the op made nothing). */
void lockfs_etcdbe_owned_drop(struct etcd_store *e, const char *key);
/* KEY (owned) was returned to the engine as a grant; was it? */
void lockfs_etcdbe_owned_granted(struct etcd_store *e, const char *key);
bool lockfs_etcdbe_owned_is_granted(struct etcd_store *e, const char *key);
/* KEY's release is about to send its delete (ON), or it failed (off). */
void lockfs_etcdbe_owned_deleting(struct etcd_store *e, const char *key, bool on);
/*
 * May an event of KEY be the echo of a write of this daemon's whose answer
 * is not in yet?  A PUT of an owned key: every write of an owned key is
 * ours (owned from before it is sent).  A DELETE only while its release is
 * on its way: any other delete of an owned key is news (removed behind
 * its holder, its session's end).
 */
bool lockfs_etcdbe_owned_echo(struct etcd_store *e, const char *key, bool deleted);
/* Is KEY owned (or is any add unsure)?  With O->mu held. */
bool lockfs_etcdbe_owned_has_locked(struct etcd_owned *o, const char *key);
/* A claim of NAME's place had an unknown outcome: report NAME changed at
 * the next tick, so the engine claims again or leaves. */
void lockfs_etcdbe_recheck_later(struct etcd_store *e, const char *name);
/* The session thread's tick: drop what is no longer watched, report the
 * names to recheck, delete the orphans (docs/etcd.md "Orphans"). */
void lockfs_etcdbe_tick(struct etcd_store *e);

/* ---- What this daemon watches (etcd_interest.c) ---- */

/* How long a name stays watched after its last lookup, stat or read. */
#define ETCD_LOOK_MS 3000
/* How long a listing (readdir) is answered from its last range read. */
#define ETCD_LIST_CACHE_MS 1000
/* Listings longer than this are not kept. */
#define ETCD_LIST_CACHE_MAX 100000
#define ETCD_INTEREST_BUCKETS 1024

/* One name this daemon watches. */
struct etcd_interest_entry {
	char *name;
	int64_t watch_id;        /* in the watch set */
	/* WATCH_ID watches only the key just ahead of this daemon's first key
	 * of NAME (a waiter's whole need: etcd's Mutex protocol), not R(NAME);
	 * the mirror's other keys of NAME are then as last read. */
	bool ahead;
	int64_t look_until_ms;   /* boot clock: looked at until then */
	struct etcd_interest_entry *next;
};

struct etcd_interest {
	/* Held across a watch's events being applied, and across adding or
	 * dropping a name, never across a call to etcd (lookups wait on
	 * it): above mirror.mu, session.mu and the watch set's. */
	pthread_mutex_t mu;
	struct etcd_interest_entry *buckets[ETCD_INTEREST_BUCKETS];
	size_t count;
	int64_t hosts_id;        /* the host keys' watch */
	bool scanning;           /* open .. start(): the mirror has the whole
				    prefix, read at open, for the startup scan,
				    kept by one watch of the prefix (SCAN_ID) */
	int64_t scan_id;
	int64_t scan_next;       /* its resume point */
	/* What readers of M/.events follow (lockfs_etcdbe_follow).  With
	 * FOLLOW_ALL the whole prefix is followed: the mirror has every name,
	 * those without an entry kept by one watch of the prefix (FOLLOW_ID,
	 * 0 until read; resume point FOLLOW_NEXT); entries are neither
	 * dropped meanwhile nor, once FOLLOW_ID is set, added (a name has one
	 * watch only, so that no event comes twice).  FOLLOWED: names followed
	 * (each kept as an entry); FOLLOW_ALL_WANTED: asked during the scan,
	 * begun by start(). */
	bool follow_all, follow_all_wanted;
	/* Names an op read again (widened from the key ahead): told to the
	 * engine as changed by the next tick, as an op may not report. */
	struct etcd_names later;
	int64_t follow_id, follow_next;
	char **followed;
	size_t n_followed;
	struct lockfs_etcd_wset *wset;
	/* The last listing: names (sorted), when read (boot clock), and the
	 * events' count (list_gen) then.  list_mu is a leaf. */
	pthread_mutex_t list_mu;
	char **list;
	size_t n_list;
	int64_t list_ms;
	uint64_t list_gen;
};

/* A host key deleted at REV: its lease's session ended then. */
struct etcd_expiry {
	int64_t lease, rev, at_ms;
};
#define ETCD_EXPIRIES 32

/* A head key of another lockfs host's live session deleted, not yet
 * judged a release or that session's end (etcd_judge.c).  In use while
 * LEASE is not 0. */
struct etcd_unjudged {
	char name[LOCKFS_STORE_KEY_MAX];
	char host_key[LOCKFS_STORE_KEY_MAX];  /* that session's host key */
	int64_t lease, rev, at_ms;
};
#define ETCD_UNJUDGED 8

struct etcd_store {
	struct lockfs_backend base;
	struct lockfs_statedir sd;    /* backing=: log and pid lock (owned) */
	struct lockfs_etcd *client;   /* owned */
	struct lockfs_etcd *client_short; /* the same endpoints, a shorter bound,
					     for a second call within one op (owned) */
	char *endpoints;              /* as given, for messages (owned) */
	char *prefix;                 /* ends in '/' (owned) */
	char *source;                 /* "etcd:" PREFIX (owned) */
	char *host_key;               /* PREFIX ".hosts/" HOST (owned) */
	char *host_value;             /* its JSON value (owned) */
	char machine_id[64];
	char boot_id[64];
	uid_t uid;                    /* the daemon's, owner of every entry */
	gid_t gid;
	int64_t ttl_s;
	int64_t lock_delay_s;
	uint64_t seq;                 /* key suffixes (__atomic) */
	struct etcd_keys free_keys;   /* suffixes to use again */
	struct etcd_owned owned;      /* keys the engine has (etcd_orphan.c) */

	struct etcd_mirror mirror;
	struct etcd_session session;

	struct etcd_interest interest;
	/* Sessions seen ending (host keys deleted), for lock-delay; a ring,
	 * protected by mirror.mu. */
	struct etcd_expiry expiries[ETCD_EXPIRIES];
	size_t n_expiries;
	/* Deletes whose judgment is put off (etcd_judge.c), protected by
	 * mirror.mu. */
	struct etcd_unjudged unjudged[ETCD_UNJUDGED];
	unsigned n_unjudged;          /* in use (written under mirror.mu,
					 read without it: __atomic) */
	uint64_t list_gen;            /* events applied (__atomic): a listing
					 read before the last one may be stale */

	pthread_mutex_t report_mu;    /* held across the change callback only */
	lockfs_change_fn change;      /* set by start(), under report_mu */
	void *change_arg;

	bool unreachable;             /* said "no endpoint answers" (__atomic) */
	/* adopt() could not move a key of the earlier daemon (etcd did not
	 * answer): start() keeps its lease, so that lock ends with it rather
	 * than now.  Set and read during the startup scan and start() only,
	 * on the thread that opens the mount. */
	bool adopt_failed;
	/* The keys of an earlier session of this host that expired before
	 * this daemon started, shown to the startup scan (etcd_expired.c);
	 * deleted from the mirror at EXPIRED_REV by start().  Same thread
	 * rule as ADOPT_FAILED. */
	char **expired;
	size_t n_expired, cap_expired;
	int64_t expired_rev;
};

/* The bound of a second call within one op (hand-off's grant), so that
 * the op as a whole stays within LOCKFS_ETCD_TIMEOUT_MS. */
#define SHORT_TIMEOUT_MS 400
/* A release whose short call failed at once waits this long before its
 * next try (etcd_release: riding out an election). */
#define RELEASE_RETRY_GAP_MS 50

/* Open the store CFG describes (etcd_open.c): options, client, lease,
 * host key, watch, session thread; E->base without its ops, kind and
 * caps, which etcd.c sets.  0, or -errno with one line in CFG->why. */
int lockfs_etcdbe_open(const struct lockfs_backend_config *cfg, struct etcd_store **out);
/* Stop reporting, let go of etcd (the lease stays, for the next daemon to
 * adopt its locks) and free E. */
void lockfs_etcdbe_close(struct etcd_store *e);
/* The backend's session and start ops (lockfs/backend.h), etcd_open.c:
 * start ends the startup scan, drops an expired session's keys and
 * revokes the earlier daemon's lease. */
int lockfs_etcdbe_session_op(struct lockfs_backend *be, const char *host,
			     struct lockfs_session *out);
int lockfs_etcdbe_start_op(struct lockfs_backend *be, lockfs_change_fn fn, void *arg);

/* ---- The watch and reporting (etcd_watch.c) ---- */

/* Report CHANGED (and free it) and WHAT=SESSION when SESSION_CHANGED, to
 * the engine's callback if start() gave one.  No backend lock held. */
void lockfs_etcdbe_report(struct etcd_store *e, struct etcd_names *changed, bool session_changed);

/* Apply a watch's EVENTS to the mirror and report what changed: NAME's
 * watch (its events before NEXT_REV are all delivered), the host keys', or
 * the prefix's (OF).  Lock-delay for a head key whose session ended.  The
 * names changed go to CHANGED, those only this daemon's own writes
 * changed to OWN, for lockfs_etcdbe_report_both once no lock is held. */
enum etcd_watch_of {
	ETCD_WATCH_NAME,         /* one name's: R(NAME) */
	ETCD_WATCH_HOSTS,        /* the host keys' */
	ETCD_WATCH_PREFIX,       /* the whole prefix's (open .. start) */
};
#define ETCD_JUDGED 64
void lockfs_etcdbe_apply_events(struct etcd_store *e, enum etcd_watch_of of, const char *name,
				const struct lockfs_etcd_event *events, size_t n_events,
				const bool ended[ETCD_JUDGED], int64_t next_rev,
				struct etcd_names *changed, struct etcd_names *own);
/* Report CHANGED, then OWN (CHANGE_OWN), and free both.  No lock held. */
void lockfs_etcdbe_report_both(struct etcd_store *e, struct etcd_names *changed,
			       struct etcd_names *own);

/* ---- Was a head key's delete its session's end? (etcd_judge.c) ---- */

/* First, with no lock held: which of a message's deletes of a head key
 * went with their session (ENDED[i]: lock-delay), and the host keys
 * deleted (sessions that ended).  A name watch's delete on another
 * lockfs host's live session is put off (ENDED[i] false): settled by
 * lockfs_etcdbe_settle, or proved a release by a claim. */
void lockfs_etcdbe_judge_events(struct etcd_store *e, enum etcd_watch_of of,
				const struct lockfs_etcd_event *events, size_t n_events,
				bool ended[ETCD_JUDGED]);
/* Is any delete's judgment put off?  (No lock: a hint.) */
bool lockfs_etcdbe_unjudged(struct etcd_store *e);
/* Judge the deletes put off, of NAME (NULL: all): ask etcd, and put the
 * names whose session had ended in lock-delay, and into DELAYED (may be
 * NULL).  No lock held; it asks etcd. */
void lockfs_etcdbe_settle(struct etcd_store *e, const char *name, struct etcd_names *delayed);
/* The same, for the names whose delete no claim here will judge: those
 * CLAIMS (no lock held) says no key of this daemon heads. */
void lockfs_etcdbe_settle_unclaimed(struct etcd_store *e,
				    bool (*claims)(struct etcd_store *e, const char *name),
				    struct etcd_names *delayed);
/* A claim of NAME proved the delete on LEASE a release: judged. */
void lockfs_etcdbe_proved(struct etcd_store *e, const char *name, int64_t lease);
/* What a claim of NAME must also compare: 0, nothing; 1, the host key of
 * the session whose delete is not judged yet is still on its lease (so
 * that delete was a release), into *PROOF (its key in HOST_KEY); -EEXIST,
 * NAME is in lock-delay.  One look under mirror.mu. */
int lockfs_etcdbe_release_proof(struct etcd_store *e, const char *name,
				char host_key[LOCKFS_STORE_KEY_MAX],
				struct lockfs_etcd_compare *proof);
/* Did LEASE's session end (its host key deleted) at REV (0: any)?
 * *AT_MS: when this daemon saw it.  MIRROR_MU held. */
bool lockfs_etcdbe_expiry_locked(struct etcd_store *e, int64_t lease, int64_t rev,
				 int64_t *at_ms);

/* Does this daemon's key head NAME now, as far as the mirror shows (no
 * lock held)?  When the key ahead of a waiter here went and no other key
 * was ahead, the waiter is first: its claim need not wait for NAME to be
 * read again (a key the mirror missed ahead makes the claim's compare
 * fail, and the read that follows finds it). */
bool lockfs_etcdbe_heads_here(struct etcd_store *e, const char *name);
/* The watch set and the host keys' watch, from FROM (open), with the
 * mirror holding the whole prefix for the startup scan.  0 or -errno. */
int lockfs_etcdbe_interest_open(struct etcd_store *e, int64_t from);
/* start(): the scan is over; keep (and watch) only the names needed here. */
void lockfs_etcdbe_interest_start(struct etcd_store *e);
void lockfs_etcdbe_interest_close(struct etcd_store *e);
/* NAME is needed here: watched from now on (read first when it was not),
 * and with LOOK, looked at (kept ETCD_LOOK_MS).  0; -EIO (etcd could not
 * be read: NAME is not known here). */
int lockfs_etcdbe_look(struct etcd_store *e, const char *name, bool look);
/* This daemon's try-lock just made NAME's only key (the mirror has it):
 * watch NAME from FROM if it is not watched yet. */
void lockfs_etcdbe_watch_own(struct etcd_store *e, const char *name, int64_t from);
/* The backend op `follow`: NAMES (ALL: every name) are needed here while
 * readers of events follow them. */
int lockfs_etcdbe_follow(struct lockfs_backend *be, bool all, const char *const *names, size_t n);
/* Drop the names nobody here needs any more (session thread's tick). */
void lockfs_etcdbe_interest_sweep(struct etcd_store *e);
/* The watch stream may be frozen: reconnect (session hook). */
int lockfs_etcdbe_watch_reopen(struct etcd_store *e, int64_t from, bool *resync);
/* Every held name (readdir), from a range read of the prefix kept up to
 * ETCD_LIST_CACHE_MS.  0, -EIO, -ENOMEM. */
int lockfs_etcdbe_list(struct etcd_store *e, lockfs_list_cb cb, void *arg);
/* The backend's list and list_prefix ops (lockfs/backend.h). */
int lockfs_etcdbe_list_op(struct lockfs_backend *be, lockfs_list_cb cb, void *arg);
int lockfs_etcdbe_list_prefix(struct lockfs_backend *be, const char *prefix, lockfs_list_cb cb,
			      void *arg);
/* This daemon's own write changed the listing. */
void lockfs_etcdbe_list_changed(struct etcd_store *e);

/* Say once that etcd cannot be reached (RC the client's error), or that
 * it answers again (etcd_session.c: whether etcd answers is part of the
 * daemon's standing with it). */
void lockfs_etcdbe_say_unreachable(struct etcd_store *e, int rc);
void lockfs_etcdbe_say_reachable(struct etcd_store *e);

/* The session: grant the first lease (open), run the keepalive thread
 * (start .. close).  HOOKS (static) is what the thread calls above it. */
int lockfs_etcdbe_session_init(struct etcd_store *e, const struct etcd_session_hooks *hooks);
int lockfs_etcdbe_session_start(struct etcd_store *e);
void lockfs_etcdbe_session_stop(struct etcd_store *e);
void lockfs_etcdbe_session_destroy(struct etcd_store *e);

/* Put the host key on LEASE, if it does not exist (OLD 0) or is on lease
 * OLD.  0; -EEXIST: it exists otherwise; or the client's errors. */
int lockfs_etcdbe_session_put_host(struct etcd_store *e, int64_t lease, int64_t old);
/* The backing directory's "DEV:INO" into OUT (the host key's state_dir):
 * a daemon that finds it in the host key holds that directory's pid lock
 * now, so the daemon that wrote it is gone.  0 or -errno. */
int lockfs_etcdbe_state_id(struct etcd_store *e, char out[48]);
/* This daemon's session state and lease, as ops see them. */
enum lockfs_session_state lockfs_etcdbe_session_state(struct etcd_store *e, int64_t *lease);
/* This daemon's session as session() reports it. */
void lockfs_etcdbe_session_get(struct etcd_store *e, struct lockfs_session *out);
/* Is LEASE one of this daemon's lost leases? */
bool lockfs_etcdbe_session_lost_lease(struct etcd_store *e, int64_t lease);
/* A release's delete of a key on LEASE found the key gone (RESENT: the
 * delete was sent more than once).  -ESTALE when LEASE is gone in etcd
 * too (the session is LOST from now on), else 0 when RESENT, -ENOENT when
 * not (etcd_session.c says why). */
int lockfs_etcdbe_release_missed(struct etcd_store *e, int64_t lease, bool resent);
/* Does a pending undo wait for a key of NAME? */
bool lockfs_etcdbe_session_pending_name(struct etcd_store *e, const char *name);
/* The names of the pending undos' keys, to CB (copied out first). */
void lockfs_etcdbe_session_pending_each(struct etcd_store *e, lockfs_list_cb cb, void *arg);
/* Remember a write of KEY with an unknown outcome (see struct etcd_pending). */
void lockfs_etcdbe_session_pending(struct etcd_store *e, const char *key, int64_t lease,
			  int64_t create_rev, bool place_only);
/* The watch ended (from the watch thread): reopen from FROM, or RESYNC. */
void lockfs_etcdbe_session_watch_ended(struct etcd_store *e, bool resync, int64_t from);

#endif
