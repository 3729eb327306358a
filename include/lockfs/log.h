/* The audit log: DIR/lock.log, one line per event. */
#ifndef LOCKFS_LOG_H
#define LOCKFS_LOG_H

#include <stddef.h>
#include <stdint.h>

/*
 * Line format:  TIMESTAMP WHO NAME [KEY=VALUE ...] EVENT\n
 * TIMESTAMP is RFC 3339 UTC with milliseconds.  In WHO, NAME, keys and
 * values every byte <= 0x20, 0x7f and '\\' is escaped: '\\' as "\\\\", the
 * others as "\\xHH", so a line always splits on single spaces the same way.
 * An empty field is written as "-", and a field that is exactly "-" as
 * "\\x2d", so "-" always means empty.
 */

struct lockfs_log;

/* Longest line lockfs_log_event() writes; longer details are truncated. */
#define LOCKFS_LOG_LINE_MAX 4096

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
 * Open (creating, mode 0644) the log file NAME relative to DIRFD for
 * appending.  Returns 0 and sets *OUT, or -errno.
 */
int lockfs_log_open(struct lockfs_log **out, int dirfd, const char *name)
	__attribute__((warn_unused_result));

/*
 * Append one event with the current time, in a single O_APPEND write(2).
 * Returns 0 or -errno (the caller decides whether a lost log line matters).
 */
int lockfs_log_event(struct lockfs_log *log, const char *who, const char *name,
		     const char *const *kv, const char *event);

void lockfs_log_close(struct lockfs_log *log);

#endif
