/* The audit log: DIR/lock.log, one line per event (docs/log.md). */
#ifndef LOCKFS_LOG_H
#define LOCKFS_LOG_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Line format:  TIMESTAMP WHO NAME [KEY=VALUE ...] EVENT\n
 * TIMESTAMP is RFC 3339 UTC with milliseconds.  In WHO, NAME, keys and
 * values every byte <= 0x20, 0x7f and '\\' is escaped: '\\' as "\\\\", the
 * others as "\\xHH", so a line always splits on single spaces the same way.
 * So is each byte of a character that breaks or reorders a line
 * (lockfs_utf8_unsafe_in_line(): C1, U+2028, U+2029, bidi controls) and
 * each byte that is not UTF-8, so that no reader (Python's splitlines(),
 * a terminal) sees a line end before the newline.
 * An empty field is written as "-", and a field that is exactly "-" as
 * "\\x2d", so "-" always means empty.
 */

struct lockfs_log;

/* Longest line lockfs_log_event() writes; longer details are truncated. */
#define LOCKFS_LOG_LINE_MAX 4096

/* How much the log may hold and how often a uid's refusals are logged. */
struct lockfs_log_limits {
	uint64_t max_bytes;   /* rotate before the file would pass this; 0 = never */
	unsigned keep;        /* rotated files kept (NAME.1 .. NAME.KEEP), >= 1 */
	unsigned denied_interval_s; /* at most one `denied` line per uid per
				       interval during a burst; 0 = every one */
};

/* The defaults (docs/log.md, lockfs --help). */
#define LOCKFS_LOG_MAX_DEFAULT (4ull << 20)
#define LOCKFS_LOG_MAX_MIN (16ull << 10)
#define LOCKFS_LOG_KEEP_DEFAULT 4
#define LOCKFS_LOG_KEEP_MAX 1000
#define LOCKFS_LOG_DENIED_INTERVAL_DEFAULT 10
/* Lines kept in memory while the file cannot be written, at most. */
#define LOCKFS_LOG_KEPT_MAX_BYTES (4u << 20)

/*
 * Escape SRC into DST (SIZE bytes, NUL-terminated).  Returns the length
 * written, or -ENOSPC when it does not fit.
 */
int lockfs_log_escape(char *dst, size_t size, const char *src);

/*
 * Format one line (with the trailing newline) into BUF.  KV is a
 * NULL-terminated list of key, value, key, value, ... (may be NULL).
 * Returns the length, or -ENOSPC when it does not fit in SIZE.
 */
int lockfs_log_format(char *buf, size_t size, int64_t unix_ms, const char *who,
		      const char *name, const char *const *kv, const char *event);

/*
 * Format one line that always fits in LOCKFS_LOG_LINE_MAX: when it would
 * not, the details except uid= and pid= are replaced by "details=dropped",
 * and if it still does not fit WHO, NAME and EVENT are cut to at most 1
 * KiB, 2 KiB and 256 bytes (escaped, whole escapes only), each ending in
 * the marker \... when cut.  Returns the length (> 0).
 */
int lockfs_log_format_fit(char buf[LOCKFS_LOG_LINE_MAX], int64_t unix_ms, const char *who,
			  const char *name, const char *const *kv, const char *event);

/*
 * Parse a size such as "4194304", "512K", "10M" or "1G" (powers of 1024)
 * into *OUT.  Returns 0, or -EINVAL when TEXT is not one.
 */
int lockfs_log_parse_size(const char *text, uint64_t *out);

/*
 * Open (creating it fresh, mode 0644) the log file NAME relative to DIRFD
 * for appending, with LIMITS (NULL = the defaults).  An existing file is
 * used only when it is a regular file with no other hard link.
 * Returns 0 and sets *OUT, or -ELOOP (NAME is a symbolic link), -EMLINK
 * (it has other hard links), -EINVAL (not a regular file, or bad LIMITS),
 * -errno.
 */
int lockfs_log_open(struct lockfs_log **out, int dirfd, const char *name,
		    const struct lockfs_log_limits *limits)
	__attribute__((warn_unused_result));

/*
 * Append one event with the current time, written now or not at all: the
 * lines kept from earlier failures go first, then this one, each in one
 * write(2) (a short write is completed or taken back, never left torn).
 * Returns 0, or -errno of the failed write (nothing of this line is in the
 * file).  For what must not happen without its line (a grant).
 */
int lockfs_log_event(struct lockfs_log *log, const char *who, const char *name,
		     const char *const *kv, const char *event);

/*
 * The same for what must happen whether or not it can be logged now (a
 * release): a line that cannot be written is kept in memory, in order, and
 * written as soon as the file takes writes again (lockfs_log_tick, or the
 * next event); meanwhile it goes to syslog (LOG_DAEMON).  Past
 * LOCKFS_LOG_KEPT_MAX_BYTES, lines go to syslog only and are counted in a
 * `lost` line.  Returns 0 when written now, else the -errno that kept it.
 */
int lockfs_log_event_or_keep(struct lockfs_log *log, const char *who, const char *name,
			     const char *const *kv, const char *event);

/*
 * A refused request by UID, process PID (0 = unknown), logged as
 * "WHO NAME uid=UID pid=PID reason=REASON denied", at most once per uid
 * and interval: the first refusal of a burst at once, the others counted
 * and written by lockfs_log_tick as one line of the last of them with
 * count=N.  Never fails the caller (as lockfs_log_event_or_keep).
 */
void lockfs_log_denied(struct lockfs_log *log, uid_t uid, pid_t pid, const char *who,
		       const char *name, const char *reason);
/* The same for a caller in container CONTAINER (NULL, "": none), written
 * as container=CONTAINER after pid=. */
void lockfs_log_denied_in(struct lockfs_log *log, uid_t uid, pid_t pid, const char *container,
			  const char *who, const char *name, const char *reason);

/*
 * Ask for DIR/NAME to be opened again (logrotate moved it): done by the
 * next event or tick.  Async-signal-safe (a SIGHUP handler may call it).
 */
void lockfs_log_request_reopen(struct lockfs_log *log);

/*
 * Housekeeping, about every 50 ms from a thread that serves no request: a
 * requested reopen, the kept lines, the count lines of bursts whose
 * interval ended.
 */
void lockfs_log_tick(struct lockfs_log *log);
/* Nothing for lockfs_log_tick to do: no line kept, no burst of denials
 * open, no reopen asked.  LOG may be NULL. */
bool lockfs_log_idle(struct lockfs_log *log);
/* WAKE(ARG) is called when something for lockfs_log_tick appears (a line
 * kept, a burst begun, a reopen asked -- the last from a signal handler:
 * WAKE must be async-signal-safe).  Before any thread uses LOG. */
void lockfs_log_set_waker(struct lockfs_log *log, void (*wake)(void *arg), void *arg);

/*
 * A read-only view of the file the daemon writes now, whatever its name
 * (for M/.log).  Returns a new descriptor (the caller closes it; it is
 * only ever read with pread) or -errno.
 */
int lockfs_log_open_ro(struct lockfs_log *log);

/*
 * Write what is kept if the file allows, and free everything.  Returns the
 * number of kept lines that could not be written (they went to syslog).
 */
size_t lockfs_log_close(struct lockfs_log *log);

#endif
