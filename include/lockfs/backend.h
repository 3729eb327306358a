/*
 * The seam between the lock engine (core/lock/) and the store that holds
 * the locks (core/backend/).  The engine reaches a store only through this
 * header; nothing above it knows whether the store is a local directory or
 * a cluster.  Records are bytes here: the engine encodes and parses them
 * (lockfs/record.h).  A backend makes taking a lock indivisible, orders
 * contenders, issues fences, makes every change conditional on the
 * identity it reported, reports changes, and says whether this daemon's
 * session with the store is alive.
 *
 * Threads.  Every op may be called from any thread, concurrently, for any
 * names.  The engine calls the ops that change NAME (acquire, claim, leave,
 * handoff, update, release, adopt) and the reads it bases them on (stat,
 * read) with NAME's stripe mutex held: a backend sees them one at a time
 * per name from this daemon and needs no per-name lock of its own.  No op
 * calls back into the engine, except lockfs_record_src.encode (takes no
 * engine lock) and the change callback given to start().
 *
 * Time.  stat, read, list and session wait on a network at most for one
 * bounded read (etcd: a name it does not watch is read once, then watched
 * for a while; list reads the prefix, cached 1 s), and never while the
 * store is known to be unreachable: a distributed backend then answers
 * from what it last learned, and says so (st->unconfirmed).  A write op returns within the backend's bound (etcd:
 * 1 s, and at once with -EIO while the store is known to be unreachable):
 * the engine calls it under a stripe mutex, and mkdir runs while the
 * kernel holds the mount root's lock.
 *
 * Errors.  Every op returns 0 or a negative errno unless its comment says
 * otherwise.  Besides the answers each op documents:
 *   -EIO     the store cannot do it now (unreachable, full, read-only,
 *            gone).  The backend says so once on stderr per condition, not
 *            per call.  A write that returns -EIO has not happened, or (a
 *            distributed store) may have: the backend then finds out and
 *            undoes it itself (a lock, a place), or completes it (a release,
 *            a leave).  The caller never sees a half-made lock.
 *   -ESTALE  IDENTITY or PLACE belongs to this daemon's session that was
 *            lost (LOCKFS_SESSION_LOST): it is not this daemon's any more.
 *   -ENOMEM
 * An errno of the medium never passes through: EPERM from an immutable
 * DIR would read as "not yours", ENOENT from a deleted DIR as "not held".
 */
#ifndef LOCKFS_BACKEND_H
#define LOCKFS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/limits.h"   /* LOCKFS_HOST_MAX, LOCKFS_STORE_KEY_MAX */

struct lockfs_backend;

/* ---- What the store says about a held lock ---- */

/* How a store field's value shows in `owner`. */
enum lockfs_store_value {
	LOCKFS_STORE_KEY,    /* the stat's KEY, as a string */
	LOCKFS_STORE_INT,    /* NUMBER, as an integer */
	LOCKFS_STORE_HEX,    /* NUMBER, as a string of 16 hex digits (an ID) */
};

/* One field a store adds to a lock's `owner` record (etcd: "key",
 * "lease", "create_revision"). */
struct lockfs_store_field {
	const char *name;       /* its JSON key (a static string) */
	/* The key it takes instead when the record itself has NAME (not
	 * null): the store's never hides the record's (etcd: "etcd_lease"
	 * beside a lock's own "lease").  NULL: it replaces it. */
	const char *alt_name;
	enum lockfs_store_value value;
	int64_t number;
};
#define LOCKFS_STORE_FIELDS_MAX 4

struct lockfs_entry_stat {
	/* Changes whenever the stored lock or its record changes; never 0 for
	 * a held lock.  While it stays, a record read with it still stands. */
	uint64_t identity;
	/* The fence of the stored lock's acquisition (the record's `fence`):
	 * always set by read(), acquire(), claim(), handoff(), and update(GRANT)
	 * (there: the new grant's fence); 0 from stat() when it would cost a read
	 * (dir), and 0 for a foreign lock. */
	uint64_t fence;
	uid_t uid;              /* of the stored lock: what a foreign lock shows */
	gid_t gid;
	int64_t mtime_ms;       /* when the stored lock was made (dir: mtime of
				   DIR/NAME.lock; etcd: when this daemon first saw
				   the holder's key) */
	bool unconfirmed;       /* answered from the last state the store
				   confirmed; it cannot be reached now */
	int64_t delay_until_ms; /* > 0: held by nobody until then (etcd's
				   lock-delay); read() gives no record */
	/* Where the store keeps the holder, for log lines ("" and 0: nothing
	 * to say; dir leaves them empty): its key, and the session it hangs on
	 * (etcd: the lease ID). */
	char key[LOCKFS_STORE_KEY_MAX];
	int64_t lease;
	/* What the store adds to `owner` about the holder, in this order (dir:
	 * none).  The engine copies them without knowing their names. */
	struct lockfs_store_field fields[LOCKFS_STORE_FIELDS_MAX];
	size_t n_fields;
};

/* The engine's record of a new grant, encoded once the fence is known. */
struct lockfs_record_src {
	/* Encode the record with FENCE as the fence of the grant this write
	 * makes.  FENCE 0: the store issues the fence by this write itself and
	 * supplies it on every read (write "fence": null), or the write is an
	 * EDIT (the record keeps the fences it has).  Malloc'd *JSON and *LEN.
	 * 0 or -ENOMEM.  Called at most once per op, before the store is
	 * written, with no backend lock held that the engine could need. */
	int (*encode)(void *arg, uint64_t fence, char **json, size_t *len);
	void *arg;
};

/* A contender's place in NAME's line.  Smaller rank is ahead. */
struct lockfs_place {
	int64_t rank;     /* dir: a counter of this daemon; etcd: the key's
			     create_revision (and so its fence once granted) */
	uint64_t seq;     /* the backend's name for it (etcd: key suffix) */
	int64_t session;  /* the session it was taken in (etcd: lease ID; dir 0) */
};

enum lockfs_acquire_how {
	LOCKFS_ACQ_TRY,      /* take NAME if nobody holds it and nobody waits
				for it in the store; else -EEXIST and nothing
				is left behind (mkdir, LOCK_NB) */
	LOCKFS_ACQ_OR_QUEUE, /* as TRY; when not granted, take a place at the
				tail of NAME's line: *PLACE, -EINPROGRESS */
	LOCKFS_ACQ_QUEUE,    /* take a place at the tail, never granted now:
				*PLACE, -EINPROGRESS (local waiters are ahead) */
};

enum lockfs_update_how {
	LOCKFS_UPD_EDIT,  /* the same grant(s): operation, lease, bind, descendants */
	LOCKFS_UPD_GRANT, /* one more grant in the held lock (a shared holder
			     joins): a fence is issued, and only while nobody
			     waits for NAME in the store (else -EAGAIN) */
};

/* Called once per held lock by list(); return non-zero to stop early. */
typedef int (*lockfs_list_cb)(void *arg, const char *name);

/* One contender waiting in the store's own line for a name, on any host
 * (backend op `line`): its place and its record as stored (empty for a
 * key that a client other than lockfs wrote, e.g. `etcdctl lock`). */
struct lockfs_line_entry {
	int64_t rank;        /* its place (etcd: the key's create_revision) */
	const char *record;
	size_t record_len;
};
typedef int (*lockfs_line_cb)(void *arg, const struct lockfs_line_entry *e);

/* What changed, reported through start()'s callback. */
enum lockfs_change {
	LOCKFS_CHANGE_NAME,    /* NAME's lock appeared, changed or vanished, or a
				  place ahead in its line left, or its lock-delay
				  ended */
	LOCKFS_CHANGE_ALL,     /* anything may have changed (inotify overflow,
				  a watch resumed from a fresh read); NAME NULL */
	LOCKFS_CHANGE_SESSION, /* this daemon's session changed state; NAME NULL */
	LOCKFS_CHANGE_OWN,     /* NAME changed by this daemon's own call (acquire,
				  claim, handoff, update, release), which the
				  engine made and cached itself: the report is
				  only a hint.  Never for a change made outside
				  (that is CHANGE_NAME).  A backend may report
				  its own changes as CHANGE_NAME instead. */
};
/* From a thread of the backend's own, never concurrently with itself, with
 * no backend lock held.  Must return soon and must not call the backend.
 * Changes made through this daemon's own calls may be reported too
 * (CHANGE_OWN when the backend can tell them apart exactly). */
typedef void (*lockfs_change_fn)(void *arg, enum lockfs_change what, const char *name);

enum lockfs_session_state {
	LOCKFS_SESSION_LIVE,
	LOCKFS_SESSION_UNCERTAIN, /* no renewal confirmed for 2/3 of its TTL:
				     no grants (write ops that grant: -EIO) */
	LOCKFS_SESSION_LOST,      /* its TTL passed since the last confirmed
				     renewal: every lock of this daemon is gone
				     or about to be; a new session follows */
};
struct lockfs_session {
	enum lockfs_session_state state;
	int64_t since_ms;   /* wall clock, when it entered STATE */
	int64_t id;         /* etcd: the lease ID; dir: 0 */
};

/* Capabilities (struct lockfs_backend.caps). */
#define LOCKFS_BE_SESSIONS       0x1 /* session() can be other than LIVE:
					`owner` shows "session" */
#define LOCKFS_BE_SLOTS          0x4 /* slot locks (".slotKofN:NAME") are
					served as locks: docs/slots.md */
#define LOCKFS_BE_RETRY_RELEASES 0x2 /* a release the store refused (-EIO) is
					completed by the engine once the store
					answers; without it the lock stays held
					and its holder must rmdir again (dir) */

struct lockfs_backend_ops {
	/*
	 * Take NAME for the record SRC encodes, in one indivisible step, or
	 * take a place in its line (HOW).  PLACE may be NULL for TRY.
	 * 0: granted (ST filled: identity, fence); -EEXIST: TRY and not granted
	 * (held, waited for, or in lock-delay); -EINPROGRESS: *PLACE taken, NAME
	 * not granted (OR_QUEUE, QUEUE).
	 */
	int (*acquire)(struct lockfs_backend *be, const char *name,
		       enum lockfs_acquire_how how, const struct lockfs_record_src *src,
		       struct lockfs_place *place, struct lockfs_entry_stat *st);

	/*
	 * Grant NAME to PLACE if PLACE is at the head of NAME's line and NAME
	 * is free for it (no holder, no lock-delay): store SRC's record, issue
	 * the fence.  0 (ST filled); -EEXIST: not yet, PLACE stays in line;
	 * -ENOENT: PLACE is gone (broken, expired).
	 */
	int (*claim)(struct lockfs_backend *be, const char *name,
		     const struct lockfs_place *place, const struct lockfs_record_src *src,
		     struct lockfs_entry_stat *st);

	/* Give PLACE up (interrupted, failed or granted-elsewhere waiter, a
	 * kept place that ran out).  0 also when it is gone already. */
	int (*leave)(struct lockfs_backend *be, const char *name,
		     const struct lockfs_place *place);

	/*
	 * End the grant IDENTITY of NAME and grant NAME to PLACE (the engine's
	 * next in line), so that no contender behind PLACE can take NAME in
	 * between.  0: PLACE holds NAME (ST: its grant; SRC's record stored,
	 * fence issued).  1: the old grant ended, but a contender ahead of
	 * PLACE (another host's, a foreign one) holds or is next; PLACE stays
	 * in line.  -ENOENT: IDENTITY is gone or replaced; nothing changed.
	 */
	int (*handoff)(struct lockfs_backend *be, const char *name, uint64_t identity,
		       const struct lockfs_place *place, const struct lockfs_record_src *src,
		       struct lockfs_entry_stat *st);

	/*
	 * Replace NAME's record with SRC's while the stored lock is the one
	 * IDENTITY names; ST gets the new identity (and with GRANT the new
	 * grant's fence).  0; -ENOENT: gone or replaced; -EAGAIN (GRANT only):
	 * someone waits for NAME in the store.  Nothing changed on error.
	 */
	int (*update)(struct lockfs_backend *be, const char *name, uint64_t identity,
		      enum lockfs_update_how how, const struct lockfs_record_src *src,
		      struct lockfs_entry_stat *st);

	/* Remove NAME while the stored lock is the one IDENTITY names (a
	 * foreign one too: break, stale recovery).  0; -ENOENT: gone or
	 * replaced, nothing removed. */
	int (*release)(struct lockfs_backend *be, const char *name, uint64_t identity);

	/*
	 * NAME's lock IDENTITY was taken on this host under an earlier daemon
	 * (the startup scan found its holder alive): make it this daemon's,
	 * keeping its place and fence.  0 (ST: its identity now); -ENOENT.
	 * A backend whose locks hang on a daemon's session (etcd) releases in
	 * start() every lock of the earlier daemon that was not adopted (unless
	 * an adopt could not reach the store: then they end with that session);
	 * dir has no sessions: adopt does nothing and start releases nothing,
	 * and the engine does not call it (startup.c).
	 */
	int (*adopt)(struct lockfs_backend *be, const char *name, uint64_t identity,
		     struct lockfs_entry_stat *st);

	/*
	 * NAME's record, malloc'd in *RECORD and *LEN, and ST (may be NULL).
	 * *RECORD NULL with 0: held without a record lockfs wrote (foreign,
	 * or ST->delay_until_ms).  0; -ENOENT: not held.
	 */
	int (*read)(struct lockfs_backend *be, const char *name,
		    char **record, size_t *len, struct lockfs_entry_stat *st);

	/* Is NAME held?  ST (may be NULL) without the record.  LIKELY_HELD:
	 * the engine has it cached (look in the right place first).
	 * 0; -ENOENT. */
	int (*stat)(struct lockfs_backend *be, const char *name,
		    struct lockfs_entry_stat *st, bool likely_held);

	/* CB for every held name, in no particular order.  0; -EIO. */
	int (*list)(struct lockfs_backend *be, lockfs_list_cb cb, void *arg);

	/* As list, for the names that begin with PREFIX only, as the store
	 * has them now even where list() answers from a cache (etcd: one
	 * range read; the last known state when the store cannot be read).
	 * May be NULL: list() is exact already (dir). */
	int (*list_prefix)(struct lockfs_backend *be, const char *prefix, lockfs_list_cb cb,
			   void *arg);

	/* CB for every contender waiting for NAME in the store's line --
	 * every host's, not the holder -- in the store's order.  May be NULL
	 * (dir: the line is this daemon's queue).  0; -EIO; CB's error. */
	int (*line)(struct lockfs_backend *be, const char *name, lockfs_line_cb cb, void *arg);

	/*
	 * The store's staleness policy for foreign locks (may be NULL: never).
	 * 1: NAME is held by a foreign lock that may be recovered now (ST
	 * filled: its identity and mtime); 0: no.  Called on contact (mkdir
	 * meets EEXIST) and by the periodic sweep.
	 */
	int (*foreign_stale)(struct lockfs_backend *be, const char *name,
			     struct lockfs_entry_stat *st);

	/* HOST's session (NULL: this daemon's).  0; -ENOENT: this store knows
	 * no session of HOST (dir: any other host). */
	int (*session)(struct lockfs_backend *be, const char *host,
		       struct lockfs_session *out);

	/*
	 * The startup scan is over: release what this host's earlier daemon
	 * left and nobody adopted, then report changes to FN (see
	 * lockfs_change_fn) until close().  Called once.  0; -errno.
	 */
	int (*start)(struct lockfs_backend *be, lockfs_change_fn fn, void *arg);

	/*
	 * What this daemon's readers of events (M/.events) follow, replacing
	 * what the last call said: every name (ALL), or the N NAMES.  A store
	 * that tells this daemon only of the names it needs (etcd) reports
	 * changes of these too from now on, made on any host; with ALL
	 * false and N 0 it goes back to its callers' needs alone.  Called
	 * only when the set changes, one call at a time, never under an
	 * engine lock.  May be NULL (dir: every change is seen anyway).
	 * 0; -EIO, -ENOMEM: followed as far as the store could (it tries no
	 * further; events of the rest may be missing).
	 */
	int (*follow)(struct lockfs_backend *be, bool all, const char *const *names, size_t n);

	/* Is the store still there?  About every tick.  0; -EIO (said once).
	 * May be NULL. */
	int (*check)(struct lockfs_backend *be);

	/* Stop reporting, let go of the store (locks stay for the next daemon)
	 * and free BE.  No callback runs after it returns. */
	void (*close)(struct lockfs_backend *be);
};

struct lockfs_backend {
	const struct lockfs_backend_ops *ops;
	const struct lockfs_backend_kind *kind;
	unsigned caps;                 /* LOCKFS_BE_* */
	char host[LOCKFS_HOST_MAX];    /* this daemon's host name, as records carry it */
	int state_dirfd;               /* this host's local directory (owned): the
					  audit log lives here */
	const char *state_path;        /* its path, for messages */
	const char *source;            /* the mount's source in /proc/mounts */
	uint32_t stale_s;              /* foreign_stale's age limit in seconds, for
					  the `recovered` line (0: none) */
	struct lockfs_statedir *statedir; /* the one-daemon lock on state_dirfd
					     (see lockfs_backend_record_pid) */
};

/* ---- Opening a store by name ---- */

struct lockfs_backend_option {
	const char *key, *value;       /* -o KEY=VALUE as given */
};

/* Called when another process holds STATE_DIR's one-daemon lock.  1: it
 * was a wedged predecessor, now aborted and gone, and LOCKFD holds the
 * lock; 0: it finished exiting by itself meanwhile, and LOCKFD holds the
 * lock; -EBUSY: a live daemon holds it (it may be stopping: the state
 * directory then waits for it); another -errno: refuse, said on stderr. */
typedef int (*lockfs_takeover_fn)(void *arg, int lockfd, int dirfd, const char *path);

struct lockfs_backend_config {
	const struct lockfs_backend_option *options; /* this kind's keys only */
	size_t n_options;
	const char *boot_id;
	lockfs_takeover_fn takeover;   /* may be NULL: refuse */
	void *takeover_arg;
	char *why;                     /* on failure: one line, without "lockfs: " */
	size_t why_size;
};

struct lockfs_backend_kind {
	const char *name;                  /* "dir", "etcd" */
	const char *const *option_keys;    /* NULL-terminated -o keys it takes */
	const char *help;                  /* its lines for `lockfs --help` */
	int (*open)(const struct lockfs_backend_config *cfg, struct lockfs_backend **out)
		__attribute__((warn_unused_result));
};

/* "N" whole seconds, MIN..LOCKFS_LEASE_MAX_S (digits only), into *OUT:
 * the grammar of every -o option that takes seconds, the daemon's and the
 * stores' alike (core/backend/options.c).  0; -EINVAL. */
int lockfs_backend_parse_seconds(const char *text, int64_t min, int64_t *out);

/* The kinds built in (NULL-terminated), and one by name (NULL: unknown). */
extern const struct lockfs_backend_kind *const lockfs_backend_kinds[];
const struct lockfs_backend_kind *lockfs_backend_kind(const char *name);
/* Close BE, a store a kind's open() gave, that no engine took (the engine
 * closes the store it was given through its own wrappers, core/lock/store.c):
 * what fs/main.c does when a start fails after the store opened. */
void lockfs_backend_close(struct lockfs_backend *be);

/* Write the daemon's pid into the state directory's one-daemon lock file
 * (DIR/.lockfs): call it after fuse_daemonize (the lock survives the
 * fork, the pid does not).  0, or -errno after a warning on stderr. */
int lockfs_backend_record_pid(struct lockfs_backend *be);

/* What the daemon found of its predecessor when it took DIR. */
struct lockfs_predecessor {
	/* The pid its predecessor left in DIR/.lockfs: a daemon that stops
	 * cleanly empties the file, so one left there ended otherwise (killed,
	 * crashed, or wedged and taken over).  0: none. */
	pid_t left_pid;
	bool taken_over;     /* left_pid was wedged and had to be aborted */
	pid_t waited_pid;    /* a predecessor that was stopping, waited for (0: none) */
	unsigned waited_ms;  /* how long */
};

/* What BE's daemon found of its predecessor when it took the state
 * directory (all zero for a store without one). */
struct lockfs_predecessor lockfs_backend_predecessor(const struct lockfs_backend *be);

/* The predecessor is reported (lockfs_statedir_forget_predecessor). */
void lockfs_backend_forget_predecessor(struct lockfs_backend *be);

/* The daemon is stopping: a successor waits for it rather than refusing
 * (lockfs_statedir_mark_stopping).  Async-signal-safe. */
void lockfs_backend_mark_stopping(const struct lockfs_backend *be);

#endif
