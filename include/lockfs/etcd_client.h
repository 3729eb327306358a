/*
 * A client for etcd's v3 JSON gateway (POST /v3/<service>/<method>), on
 * libcurl and jansson: the transport for the etcd backend (issue 11).
 * It knows etcd's calls, not lockfs's locks.  docs/etcd.md explains the
 * transport, the time bound, failover and watch resumption.
 *
 * Keys are NUL-terminated strings (etcd keys may hold any byte, ours never
 * hold NUL); values are bytes with a length.  Revisions, versions and
 * lease IDs are int64 here and decimal strings on the wire.
 *
 * Threads: every call except lockfs_etcd_close() may run concurrently on
 * one client from any number of threads.  Each call borrows one libcurl
 * handle (with its open connections) from the client's pool for its
 * duration, so sequential calls reuse a connection.  A watch has its own
 * handle, connection and thread.
 *
 * Errors: every call returns 0 or a negative errno:
 *   -ETIMEDOUT  the call's time bound (timeout_ms, default 1000 ms) ran
 *               out before an endpoint answered;
 *   -EIO        no endpoint answered: each refused or dropped the
 *               connection (or failed the TLS handshake for a reason other
 *               than credentials);
 *   -EAGAIN     etcd answered that it cannot serve now (gRPC UNAVAILABLE:
 *               no leader, leader changed, its own request timeout), on
 *               every endpoint tried;
 *   -EPROTO     the answer was not etcd's (not JSON, wrong shape, bad
 *               base64, larger than 64 MiB);
 *   -EACCES     the TLS peer was not trusted, our certificate was refused,
 *               or etcd refused the request (gRPC PERMISSION_DENIED,
 *               UNAUTHENTICATED);
 *   -ENOENT     the lease does not exist (expired, revoked, never granted);
 *   -EINVAL     a bad argument, or etcd rejected the request (gRPC
 *               INVALID_ARGUMENT);
 *   -ERANGE     the revision was compacted or is in the future (gRPC
 *               OUT_OF_RANGE);
 *   -ENOSPC     etcd's quota is exhausted (RESOURCE_EXHAUSTED: "database
 *               space exceeded", "too many requests");
 *   -EEXIST     a lease with the requested ID exists (FAILED_PRECONDITION,
 *               ALREADY_EXISTS);
 *   -ENOMEM     out of memory.
 * Other gRPC codes map to -EIO (UNKNOWN, INTERNAL, DATA_LOSS),
 * -ECANCELED (CANCELLED) and -EOPNOTSUPP (UNIMPLEMENTED).
 * A txn whose compare failed is not an error: it returns 0 with
 * succeeded = false.
 * After -ETIMEDOUT, -EIO, -EAGAIN or -EPROTO a write may or may not have
 * been applied (lockfs_etcd_outcome_unknown()): read before assuming.
 */
#ifndef LOCKFS_ETCD_CLIENT_H
#define LOCKFS_ETCD_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct lockfs_etcd;
struct lockfs_etcd_watch;

/* The default and the largest per-call time bound.  900 ms: an op through
 * the mount (its FUSE round trip, the engine, the log) must answer within
 * the 1 s, and a loaded machine needs some of the rest. */
#define LOCKFS_ETCD_TIMEOUT_MS 900
#define LOCKFS_ETCD_TIMEOUT_MAX_MS 60000

struct lockfs_etcd_config {
	/* Client URLs separated by ';': "http://10.0.0.1:2379;https://h2:2379".
	 * Only http:// and https://, no path.  Tried in this order. */
	const char *endpoints;
	/* TLS, for https:// endpoints (NULL: none).  CACERT verifies the
	 * server (NULL: the system's CAs); CERT and KEY (PEM, both or
	 * neither) authenticate us. */
	const char *cacert;
	const char *cert;
	const char *key;
	/* Bound on each call, failover included (0: LOCKFS_ETCD_TIMEOUT_MS).
	 * Also bounds a watch's start, until etcd confirms it. */
	int timeout_ms;
};

/*
 * Make a client.  Parses the endpoints and opens the TLS files to check
 * they can be read; does not contact etcd (lockfs_etcd_status() does).
 * Returns 0 and *OUT, -EINVAL for a bad endpoint list, a bad timeout or a
 * cert without its key (or the reverse), -errno of open(2) for an
 * unreadable TLS file, -ENOMEM, or -EIO when libcurl cannot start.
 */
int lockfs_etcd_open(struct lockfs_etcd **out, const struct lockfs_etcd_config *cfg)
	__attribute__((warn_unused_result));

/* Free the client.  Every call and watch on it must have returned. */
void lockfs_etcd_close(struct lockfs_etcd *c);

/* Number of endpoints, and the Ith one's URL (as given, without a
 * trailing '/'), for messages. */
size_t lockfs_etcd_endpoint_count(const struct lockfs_etcd *c);
const char *lockfs_etcd_endpoint(const struct lockfs_etcd *c, size_t i);

/* True for the errors after which a write's outcome is unknown. */
bool lockfs_etcd_outcome_unknown(int rc);
/* Did the last call made by this thread perhaps reach etcd twice?  libcurl
 * silently sends a request again on a new connection when the one it kept
 * died before any answer came, which happens also after etcd applied the
 * first copy (a lost answer).  Then a guarded write's "compare failed"
 * may be the echo of its own first copy.  Read right after the call. */
bool lockfs_etcd_last_call_resent(void);

/* ---- Key-values (core/etcd/kv.c) ---- */

struct lockfs_etcd_kv {
	char *key;               /* NUL-terminated (key_len bytes before it) */
	size_t key_len;
	char *value;             /* NUL-terminated, never NULL; empty when etcd sent
				    none (an empty value, keys_only, a DELETE event) */
	size_t value_len;
	int64_t create_revision; /* 0 in a DELETE event's kv */
	int64_t mod_revision;
	int64_t version;
	int64_t lease;           /* 0: none */
};

enum lockfs_etcd_op_type { LOCKFS_ETCD_RANGE, LOCKFS_ETCD_PUT, LOCKFS_ETCD_DELETE };
enum lockfs_etcd_sort_order { LOCKFS_ETCD_SORT_NONE, LOCKFS_ETCD_SORT_ASCEND, LOCKFS_ETCD_SORT_DESCEND };
enum lockfs_etcd_sort_target {
	LOCKFS_ETCD_SORT_KEY, LOCKFS_ETCD_SORT_VERSION, LOCKFS_ETCD_SORT_CREATE,
	LOCKFS_ETCD_SORT_MOD, LOCKFS_ETCD_SORT_VALUE
};

/*
 * One operation, alone (lockfs_etcd_range/put/delete) or in a txn.
 * Fields not used by TYPE are ignored; zero means "not set".
 */
struct lockfs_etcd_op {
	enum lockfs_etcd_op_type type;
	const char *key;
	/* RANGE, DELETE: the keys [KEY, RANGE_END); NULL: KEY alone; "":
	 * every key from KEY on.  PREFIX: every key that starts with KEY
	 * (RANGE_END is ignored; KEY "" means every key). */
	const char *range_end;
	bool prefix;
	/* PUT */
	const void *value;
	size_t value_len;
	int64_t lease;
	/* PUT, DELETE: return the key-value(s) as they were before */
	bool prev_kv;
	/* RANGE */
	int64_t revision;            /* read as of this revision (0: latest) */
	int64_t limit;               /* at most this many kvs (0: all) */
	int64_t max_create_revision; /* only keys created at or before it */
	enum lockfs_etcd_sort_order sort_order;
	enum lockfs_etcd_sort_target sort_target;
	bool keys_only;
	bool count_only;
};

/* The answer to one operation.  Free with lockfs_etcd_op_resp_free(). */
struct lockfs_etcd_op_resp {
	enum lockfs_etcd_op_type type;
	int64_t revision;   /* the store's revision after the operation */
	/* RANGE: the kvs found; DELETE: the deleted kvs (with prev_kv);
	 * PUT: the previous kv, if any (with prev_kv). */
	struct lockfs_etcd_kv *kvs;
	size_t n_kvs;
	int64_t count;      /* RANGE: keys in the range; DELETE: keys deleted */
	bool more;          /* RANGE: LIMIT left some out */
};

enum lockfs_etcd_target {
	LOCKFS_ETCD_VERSION, LOCKFS_ETCD_CREATE, LOCKFS_ETCD_MOD,
	LOCKFS_ETCD_VALUE, LOCKFS_ETCD_LEASE
};
enum lockfs_etcd_cmp { LOCKFS_ETCD_EQUAL, LOCKFS_ETCD_GREATER, LOCKFS_ETCD_LESS, LOCKFS_ETCD_NOT_EQUAL };

/* KEY's TARGET compared with NUMBER (VERSION, CREATE, MOD, LEASE) or with
 * VALUE (VALUE).  A missing key has version, create and mod revision 0
 * and lease 0.  With RANGE_END, the compare covers the keys [KEY,
 * RANGE_END) ("": every key from KEY on): it holds when it holds for every
 * key in the range, and an empty range compares as one missing key. */
struct lockfs_etcd_compare {
	const char *key;
	const char *range_end;   /* NULL: KEY alone */
	enum lockfs_etcd_target target;
	enum lockfs_etcd_cmp result;
	int64_t number;
	const void *value;
	size_t value_len;
};

struct lockfs_etcd_txn {
	const struct lockfs_etcd_compare *compare;
	size_t n_compare;
	const struct lockfs_etcd_op *success;  /* run when every compare holds */
	size_t n_success;
	const struct lockfs_etcd_op *failure;  /* run otherwise */
	size_t n_failure;
};

/* Free with lockfs_etcd_txn_resp_free(). */
struct lockfs_etcd_txn_resp {
	int64_t revision;   /* after the txn: a put in it created/modified at this revision */
	bool succeeded;     /* the compares held: SUCCESS ran; else FAILURE ran */
	struct lockfs_etcd_op_resp *ops;  /* one per operation that ran, in order */
	size_t n_ops;
};

/*
 * Read OP (type RANGE) into *OUT (kvs in key order unless sorted
 * otherwise).  Retried on another endpoint when one fails.
 * 0 (also when nothing matched: n_kvs 0), -ERANGE for a compacted or
 * future OP->revision, or the errors above.  *OUT is zeroed on error.
 */
int lockfs_etcd_range(struct lockfs_etcd *c, const struct lockfs_etcd_op *op,
		      struct lockfs_etcd_op_resp *out)
	__attribute__((warn_unused_result));

/* Store OP (type PUT).  OUT may be NULL.  0, -ENOENT when OP->lease does
 * not exist, or the errors above. */
int lockfs_etcd_put(struct lockfs_etcd *c, const struct lockfs_etcd_op *op,
		    struct lockfs_etcd_op_resp *out)
	__attribute__((warn_unused_result));

/* Delete OP (type DELETE).  OUT may be NULL.  0 (count = keys deleted,
 * maybe 0), or the errors above. */
int lockfs_etcd_delete(struct lockfs_etcd *c, const struct lockfs_etcd_op *op,
		       struct lockfs_etcd_op_resp *out)
	__attribute__((warn_unused_result));

/*
 * Run TXN in one indivisible step.  0 with OUT->succeeded telling which
 * branch ran (a failed compare is not an error), -ENOENT when a PUT names
 * a lease that does not exist (nothing ran), -EINVAL for a txn etcd
 * refuses (e.g. two writes to one key), or the errors above.  A txn is
 * never resent after it may have reached etcd.  *OUT is zeroed on error.
 */
int lockfs_etcd_txn(struct lockfs_etcd *c, const struct lockfs_etcd_txn *txn,
		    struct lockfs_etcd_txn_resp *out)
	__attribute__((warn_unused_result));
/* lockfs_etcd_txn for a TXN that is harmless to apply twice (a delete
 * guarded by create_revision): like a range, each endpoint gets a fair
 * share of the bound and one that does not answer in it is left for the
 * next, with the txn sent again (lockfs_etcd_last_call_resent() then
 * says so: a failed compare may be the first copy's doing). */
int lockfs_etcd_txn_resendable(struct lockfs_etcd *c, const struct lockfs_etcd_txn *txn,
			       struct lockfs_etcd_txn_resp *out)
	__attribute__((warn_unused_result));

/* Discard history before REVISION (watches and reads from older
 * revisions then fail).  0, -ERANGE when REVISION was compacted already or
 * is in the future, or the errors above. */
int lockfs_etcd_compact(struct lockfs_etcd *c, int64_t revision)
	__attribute__((warn_unused_result));

void lockfs_etcd_op_resp_free(struct lockfs_etcd_op_resp *r);
void lockfs_etcd_txn_resp_free(struct lockfs_etcd_txn_resp *r);

/*
 * The end of the range of every key that starts with PREFIX (PREFIX_LEN
 * bytes): PREFIX with its last byte below 0xff incremented and the rest
 * dropped ("/locks/" -> "/locks0").  Writes at most PREFIX_LEN bytes to
 * END and returns its length; returns 0 when every byte is 0xff (the
 * range then has no end: etcd's "\0").
 */
size_t lockfs_etcd_prefix_end(const char *prefix, size_t prefix_len, char *end);

/* ---- Leases (core/etcd/lease.c) ---- */

/* Grant a lease of TTL_S seconds (etcd may raise a small TTL).  ID 0 lets
 * etcd choose.  *OUT_ID is the lease, *OUT_TTL (may be NULL) its TTL.
 * 0, -EEXIST when lease ID exists, or the errors above.  Not resent after
 * it may have reached etcd (a lease granted but unanswered expires). */
int lockfs_etcd_lease_grant(struct lockfs_etcd *c, int64_t ttl_s, int64_t id,
			    int64_t *out_id, int64_t *out_ttl)
	__attribute__((warn_unused_result));

/* Renew lease ID once (one POST).  *TTL (may be NULL) is the TTL it was
 * renewed to.  0, -ENOENT when the lease is gone (etcd answers with no
 * TTL), or the errors above. */
int lockfs_etcd_lease_keepalive(struct lockfs_etcd *c, int64_t id, int64_t *ttl)
	__attribute__((warn_unused_result));

/* Revoke lease ID: its keys are deleted.  0, -ENOENT when the lease is
 * gone already, or the errors above. */
int lockfs_etcd_lease_revoke(struct lockfs_etcd *c, int64_t id)
	__attribute__((warn_unused_result));

struct lockfs_etcd_lease_info {
	int64_t ttl;          /* seconds left */
	int64_t granted_ttl;
	char **keys;          /* with WANT_KEYS: NULL-terminated, else NULL */
	size_t n_keys;
};

/* What is left of lease ID.  Free INFO with lockfs_etcd_lease_info_free().
 * 0, -ENOENT when the lease is gone, or the errors above. */
int lockfs_etcd_lease_timetolive(struct lockfs_etcd *c, int64_t id, bool want_keys,
				 struct lockfs_etcd_lease_info *info)
	__attribute__((warn_unused_result));
void lockfs_etcd_lease_info_free(struct lockfs_etcd_lease_info *info);

/* ---- Cluster (core/etcd/kv.c) ---- */

struct lockfs_etcd_status {
	char version[32];   /* etcd's, e.g. "3.4.23" */
	uint64_t member_id; /* the member that answered */
	uint64_t leader;    /* 0: that member knows no leader */
	int64_t revision;
	int64_t raft_term;
};

/* Ask the first endpoint that answers for its status (a cheap "is etcd
 * there" for start-up).  0, or the errors above. */
int lockfs_etcd_status(struct lockfs_etcd *c, struct lockfs_etcd_status *out)
	__attribute__((warn_unused_result));

/* ---- Watch (core/etcd/watch.c) ---- */

enum lockfs_etcd_event_type { LOCKFS_ETCD_EVENT_PUT, LOCKFS_ETCD_EVENT_DELETE };

struct lockfs_etcd_event {
	enum lockfs_etcd_event_type type;
	struct lockfs_etcd_kv kv;       /* DELETE: key and mod_revision only */
	struct lockfs_etcd_kv prev_kv;  /* valid when has_prev_kv */
	bool has_prev_kv;
};

enum lockfs_etcd_watch_kind {
	LOCKFS_ETCD_WATCH_CREATED,  /* etcd confirmed the watch */
	LOCKFS_ETCD_WATCH_EVENTS,   /* one or more events, in revision order */
	LOCKFS_ETCD_WATCH_PROGRESS, /* no events, nothing missed up to REVISION */
	LOCKFS_ETCD_WATCH_ENDED,    /* the last message: see ERROR */
};

struct lockfs_etcd_watch_msg {
	enum lockfs_etcd_watch_kind kind;
	int64_t revision;        /* the message's header.revision (0 if absent) */
	const struct lockfs_etcd_event *events;  /* EVENTS */
	size_t n_events;
	/* Every event up to NEXT_REVISION - 1 has been delivered: a new watch
	 * from NEXT_REVISION misses nothing (unless RESYNC). */
	int64_t next_revision;
	/* ENDED only.  ERROR says why:
	 *   -ERANGE      history from next_revision was compacted
	 *                (COMPACT_REVISION is the oldest left): RESYNC;
	 *   -ECANCELED   etcd cancelled the watch for another reason;
	 *   -ECONNRESET  the stream ended: etcd stopped, the connection
	 *                broke, or an error line arrived;
	 *   -ETIMEDOUT   nothing arrived for idle_timeout_ms;
	 *   -EPROTO      a line that is not etcd's, or bad base64;
	 *   -ENOMEM.
	 * RESYNC: events are lost; read the range afresh and watch from that
	 * read's revision + 1.  Otherwise a watch from NEXT_REVISION resumes. */
	int error;
	bool resync;
	int64_t compact_revision;
};

/* Called on the watch's thread, never concurrently with itself, with no
 * lock of the client held.  MSG and what it points to are valid only
 * during the call.  It must not call lockfs_etcd_watch_close() on its own
 * watch, and should return soon (the stream waits). */
typedef void (*lockfs_etcd_watch_cb)(void *arg, const struct lockfs_etcd_watch_msg *msg);

struct lockfs_etcd_watch_req {
	const char *key;
	const char *range_end;  /* as in struct lockfs_etcd_op */
	bool prefix;
	int64_t start_revision; /* 0: from now on */
	bool prev_kv;           /* events carry the kv as it was before */
	bool progress_notify;   /* ask etcd for PROGRESS messages when idle */
	int idle_timeout_ms;    /* end with -ETIMEDOUT after this long with
				   no byte from etcd (0: never) */
};

/*
 * Start a watch on its own connection and thread, and wait (at most the
 * client's timeout_ms) until etcd confirms it; the CREATED message has
 * been delivered to CB when this returns 0.  Later messages follow on the
 * watch's thread until ENDED, which is the last.  The caller resumes a
 * watch by closing it and opening a new one (see ENDED).
 * 0 and *OUT, or -EINVAL (bad request), -ENOMEM, -EAGAIN (no thread), or
 * the errors above for the start.
 */
int lockfs_etcd_watch_open(struct lockfs_etcd_watch **out, struct lockfs_etcd *c,
			   const struct lockfs_etcd_watch_req *req,
			   lockfs_etcd_watch_cb cb, void *arg)
	__attribute__((warn_unused_result));

/* Stop the watch (promptly, even on a frozen connection), join its thread
 * and free it.  No callback runs after it returns; a watch stopped this
 * way gets no ENDED message.  Never from the watch's own callback. */
void lockfs_etcd_watch_close(struct lockfs_etcd_watch *w);

/* ---- Watch set (core/etcd/wset.c, websocket.c) ---- */

/*
 * Many watches on one stream: a WebSocket to /v3/watch driven by one
 * thread, watches added and cancelled while it lives (docs/etcd.md "Watch
 * set").  The set reconnects by itself when the stream breaks or stays
 * silent past IDLE_TIMEOUT_MS (it pings every half of that), and creates
 * every watch again from its own next revision: nothing missed, nothing
 * repeated.
 */
struct lockfs_etcd_wset;

enum lockfs_etcd_wset_kind {
	LOCKFS_ETCD_WSET_EVENTS, /* watch ID's events, in revision order */
	LOCKFS_ETCD_WSET_LOST,   /* watch ID ended and is gone: its history was
				    compacted (ERROR -ERANGE, COMPACT_REVISION)
				    or etcd refused it; read afresh, add again */
	LOCKFS_ETCD_WSET_UP,     /* the stream is up, every watch created */
	LOCKFS_ETCD_WSET_DOWN,   /* the stream broke (ERROR); reconnecting */
};

struct lockfs_etcd_wset_msg {
	enum lockfs_etcd_wset_kind kind;
	int64_t id;
	const struct lockfs_etcd_event *events;
	size_t n_events;
	int64_t next_revision;     /* EVENTS: the watch's resume point */
	int64_t compact_revision;
	int error;
};

/* On the set's thread, never concurrently with itself.  May call
 * lockfs_etcd_wset_add and _cancel, not _close. */
typedef void (*lockfs_etcd_wset_cb)(void *arg, const struct lockfs_etcd_wset_msg *msg);

/* Connect (within the client's bound) and start the thread.  0, or the
 * client's errors (-EPROTO: the endpoint serves no WebSocket). */
int lockfs_etcd_wset_open(struct lockfs_etcd_wset **out, struct lockfs_etcd *c, int idle_timeout_ms,
			  lockfs_etcd_wset_cb cb, void *arg)
	__attribute__((warn_unused_result));
/* Watch KEY (or [KEY, RANGE_END)) from START_REVISION (> 0).  Returns the
 * watch's id (> 0) at once; etcd is asked from the set's thread. */
int64_t lockfs_etcd_wset_add(struct lockfs_etcd_wset *s, const char *key, const char *range_end,
			     int64_t start_revision);
/* Stop watch ID (an event already on its way may still be delivered). */
void lockfs_etcd_wset_cancel(struct lockfs_etcd_wset *s, int64_t id);
/* How many watches the set has (not cancelled). */
size_t lockfs_etcd_wset_count(struct lockfs_etcd_wset *s);
/* Drop the stream and connect again (the peer may be frozen). */
void lockfs_etcd_wset_restart(struct lockfs_etcd_wset *s);
/* Stop the thread and free the set; no callback runs after it returns. */
void lockfs_etcd_wset_close(struct lockfs_etcd_wset *s);

#endif
