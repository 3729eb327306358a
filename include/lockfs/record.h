/* The lock record: what `M/NAME/owner` shows and what DIR/NAME.lock holds. */
#ifndef LOCKFS_RECORD_H
#define LOCKFS_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/limits.h" /* LOCKFS_RECORD_MAX, _SHARED_MAX, _OPERATION_MAX */

/* A token is 128 random bits written as 32 lower-case hex digits. */
#define LOCKFS_TOKEN_HEX 32

/* The process that holds a lock, as recorded at acquisition. */
struct lockfs_holder {
	pid_t pid;                     /* thread-group id in the daemon's pid ns */
	pid_t ns_pid;                  /* its pid in its own innermost pid ns; 0 unknown */
	char *container;               /* its container (lockfs_proc.container), or
					  NULL in the daemon's own */
	unsigned long long start_time; /* /proc/PID/stat field 22, clock ticks */
	uid_t uid;
	gid_t gid;
	char *user;     /* user name, or NULL when the uid has none */
	char *comm;     /* /proc/PID/comm */
	char **cmdline; /* NULL-terminated argv (may be empty), never NULL */
	char *host;     /* gethostname() */
	char *boot_id;  /* /proc/sys/kernel/random/boot_id */
};

/* What keeps a lock held. */
enum lockfs_bound {
	LOCKFS_BOUND_PROCESS = 0, /* the holder process: released when it exits */
	LOCKFS_BOUND_SLUG,        /* (uid, slug): released by lease + evidence */
	LOCKFS_BOUND_FD,          /* an open file description (flock/fcntl on
				     M/.flock/NAME): released when it lets go */
};

enum lockfs_mode {
	LOCKFS_EXCLUSIVE = 0,
	LOCKFS_SHARED,            /* any number of holders, no exclusive one */
};

/* "flock:HEX" or "posix:HEX": the kernel's lock owner of an fd lock. */
#define LOCKFS_FD_OWNER_MAX 24

/* A via_file or ticket the record keeps: 0 is none, and JSON integers are
 * signed (a larger one is not kept: the lock then ends by its owner's
 * unlock or close only). */
#define LOCKFS_RECORD_ID_OK(v) ((v) != 0 && (v) <= (uint64_t)INT64_MAX)

/* One more holder of a shared lock, besides the record's `holder`. */
struct lockfs_share {
	struct lockfs_holder holder;
	enum lockfs_bound bound;  /* LOCKFS_BOUND_FD or _PROCESS (rebound) */
	char fd_owner[LOCKFS_FD_OWNER_MAX]; /* "" unless bound to an fd */
	uint64_t via_file;        /* the mount's open file an fcntl grant came
				     through (0: none); see lockfs_record.via_file */
	uint64_t fence;           /* this holder's grant */
	int64_t acquired_at_ms;
	char *slug;               /* its LOCKFS_SLUG when it asked, or NULL (a name
				     for the log; the share stays bound as BOUND says) */
};

/* A lease: the lock needs renewing within ttl_s seconds.  Deadlines are on
 * CLOCK_BOOTTIME, which is monotonic and shared by every process of one
 * boot, so they survive a daemon restart and never jump with the wall
 * clock. */
struct lockfs_lease {
	uint32_t ttl_s;            /* 0 = no lease */
	int64_t deadline_boot_ms;  /* CLOCK_BOOTTIME ms */
	int64_t expires_at_ms;     /* the same moment in Unix ms, for people */
};

/* A process started by a holder that exited: it keeps the lock. */
struct lockfs_descendant {
	pid_t pid;                     /* thread-group id in the daemon's pid ns */
	unsigned long long start_time; /* /proc/PID/stat field 22, clock ticks */
	char comm[16];                 /* its comm when last looked at ("" unknown) */
	/* Only found by a scan of the holder's session, not known to descend
	 * from it: it keeps the lock, but may not act for the holder. */
	bool candidate;
};

/* Most descendants a record lists; more still keep the lock (a daemon
 * restart finds them by scanning, see docs/holder.md). */
#define LOCKFS_DESCENDANTS_MAX 4096

struct lockfs_record {
	char *resource;   /* the lock name */
	enum lockfs_bound bound;  /* of `holder` */
	enum lockfs_mode mode;
	char fd_owner[LOCKFS_FD_OWNER_MAX]; /* `holder`'s open file; "" unless fd-bound */
	/* `holder`'s fcntl grant came through this open file of the mount (its
	 * handle, 0: none): its last close ends the lock.  Kept in the store so
	 * that a daemon resuming the same FUSE connection still knows it. */
	uint64_t via_file;
	/* The kernel's number of the request that was granted `holder` (its
	 * FUSE unique, bit 63 cleared; 0: unknown): a resent request with this
	 * number is that same request (lockfs_caller.ticket). */
	uint64_t ticket;
	/* The request (its ticket) that let the previous holder go by handing
	 * NAME to `holder` -- an rmdir with waiters queued; 0: none.  A resent
	 * copy of that rmdir is told it succeeded, though NAME is `holder`'s. */
	uint64_t handed_by;
	size_t nshares;           /* shared: the other holders, in grant order */
	struct lockfs_share *shares;
	bool has_holder;  /* false for a record that names no holder */
	struct lockfs_holder holder;
	int64_t acquired_at_ms; /* Unix time in milliseconds */
	char *operation;  /* what the holder says it is doing; NULL = none */
	char *slug;       /* LOCKFS_SLUG of the acquiring process; NULL = none */
	struct lockfs_lease lease;
	uint64_t fence;   /* strictly increasing per acquisition of the name */
	/* `holder`'s own grant: the same as fence and acquired_at_ms except
	 * in a shared lock whose first holder has left. */
	uint64_t holder_fence;
	int64_t holder_acquired_at_ms;
	char token[LOCKFS_TOKEN_HEX + 1]; /* "" when unknown/hidden */
	/* The holder's session id at acquisition (0 = unknown): where a
	 * scan looks for its descendants (core/proc/descendants.c). */
	pid_t holder_session;
	/* A process-bound holder that exited while processes it started
	 * live on: the lock is theirs until the last one exits. */
	bool holder_exited;
	size_t ndescendants;
	struct lockfs_descendant *descendants; /* the live ones, when last looked */
};

/* Flags for lockfs_record_encode(). */
#define LOCKFS_RECORD_WITH_TOKEN 0x1 /* include "token" */
#define LOCKFS_RECORD_PRETTY     0x2 /* indented, for people; else compact */

/*
 * Encode R as JSON followed by a newline.  Strings that are not valid UTF-8
 * are encoded with each bad byte replaced by U+FFFD.  Returns a malloc'd
 * NUL-terminated buffer and stores its length (without the NUL) in *LEN,
 * or NULL when out of memory.
 */
char *lockfs_record_encode(const struct lockfs_record *r, int flags, size_t *len)
	__attribute__((warn_unused_result));

/*
 * What reader uid READER sees in `M/NAME/owner`: R indented, with the token
 * only when READER is 0 or holder.uid, and each holder's `cmdline` only
 * when READER is 0 or that holder's uid (else `"cmdline": null`; see
 * docs/privacy.md).  Returns what lockfs_record_encode() does.
 */
char *lockfs_record_view(const struct lockfs_record *r, uid_t reader, size_t *len)
	__attribute__((warn_unused_result));

/*
 * Who reads `owner`: a uid and, for root in a container whose root powers
 * stop at its own container (-o container_root=own), that container, with
 * the daemon's host and boot id: only a holder recorded on this host, in
 * this boot, in that same container is its own (docs/privacy.md).
 */
struct lockfs_reader {
	uid_t uid;
	const char *container; /* NULL: root (uid 0) over every holder */
	const char *host, *boot_id;
};

/* Is holder H one that root reader R has root's powers over? */
bool lockfs_reader_root_over(const struct lockfs_reader *r, const struct lockfs_holder *h);

/* lockfs_record_view for reader R: the token and a holder's cmdline for a
 * holder of R's uid other than 0, and for root over that holder. */
char *lockfs_record_view_for(const struct lockfs_record *r, const struct lockfs_reader *reader,
			     size_t *len) __attribute__((warn_unused_result));

/*
 * Parse a record written by lockfs_record_encode(..., WITH_TOKEN).  Every
 * field is checked for presence and type; "token" must be 32 hex digits.
 * On success fills *OUT (release it with lockfs_record_clear) and returns 0.
 * Returns -EFBIG when LEN > LOCKFS_RECORD_MAX, -EINVAL when malformed,
 * -ENOMEM when out of memory; *OUT is left cleared on failure.
 */
int lockfs_record_parse(const char *buf, size_t len, struct lockfs_record *out)
	__attribute__((warn_unused_result));

/*
 * Only the top-level "fence" of a record (a backend's read, which needs
 * the fence and not the rest): 0 and *FENCE, or -EFBIG (LEN >
 * LOCKFS_RECORD_MAX), -EINVAL (not a JSON object, or no fence >= 1),
 * -ENOMEM.  It checks nothing else: a record it accepts may still fail
 * lockfs_record_parse.
 */
int lockfs_record_peek_fence(const char *buf, size_t len, uint64_t *fence)
	__attribute__((warn_unused_result));

/* LEASE as one line of JSON, exactly as it appears in the record ("null"
 * when none), malloc'd, with *LEN.  NULL when out of memory. */
char *lockfs_lease_encode(const struct lockfs_lease *lease, size_t *len);

/* The fence and time of `holder`'s own grant (see holder_fence). */
uint64_t lockfs_holder_fence(const struct lockfs_record *r);
int64_t lockfs_holder_acquired_at(const struct lockfs_record *r);

/* R's holders, one by one: holder 0 is r->holder, holder I >= 1 is
 * r->shares[I - 1].  How many (0 when R has no holder). */
size_t lockfs_record_holders(const struct lockfs_record *r);
/* Holder I of R (I < lockfs_record_holders(R)).  Like strchr, a const
 * record gives a pointer the caller must not write through. */
struct lockfs_holder *lockfs_record_holder(const struct lockfs_record *r, size_t i);
/* What holder I is bound to; lockfs_record_set_bound_at changes it. */
enum lockfs_bound lockfs_record_bound_at(const struct lockfs_record *r, size_t i);
void lockfs_record_set_bound_at(struct lockfs_record *r, size_t i, enum lockfs_bound b);
/* Holder I's own fence (holder 0: lockfs_holder_fence). */
uint64_t lockfs_record_fence_at(const struct lockfs_record *r, size_t i);
/* Holder I's fd-lock owner key ("" unless bound to an fd), and its slug
 * (NULL when none). */
const char *lockfs_record_fd_owner_at(const struct lockfs_record *r, size_t i);
/* Holder I's via_file (0: none). */
uint64_t lockfs_record_via_file_at(const struct lockfs_record *r, size_t i);
const char *lockfs_record_slug_at(const struct lockfs_record *r, size_t i);

/* S as a JSON string, each byte that is not UTF-8 replaced by U+FFFD
 * (comm and cmdline are any bytes).  NULL when out of memory. */
struct json_t;
struct json_t *lockfs_json_string_lossy(const char *s);

/* "process", "slug" or "fd". */
const char *lockfs_bound_name(enum lockfs_bound b);

/* Free everything H owns and zero it. */
void lockfs_holder_clear(struct lockfs_holder *h);

/* Free everything R owns and zero it.  Safe on a zeroed record. */
void lockfs_record_clear(struct lockfs_record *r);


#endif
