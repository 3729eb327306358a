/*
 * The audit log (include/lockfs/log.h): one line per event, appended to
 * DIR/lock.log.
 *
 * The line is meant for `awk`, `grep` and `cut -d' '`: every field is
 * escaped so that it contains no space, no control byte and no newline,
 * which makes the number of fields on a line depend only on the number of
 * details.  Bytes >= 0x80 pass through so UTF-8 names stay readable.
 *
 * Several daemons (or threads) may append to one log: each line goes out
 * in a single write(2) on an O_APPEND descriptor, which the kernel appends
 * whole for regular files on local filesystems.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lockfs/log.h"
#include "lockfs/record.h"

struct lockfs_log {
	int fd; /* O_WRONLY|O_APPEND; written with one write(2) per line */
};

/*
 * Marks a field that was cut short to fit in LOCKFS_LOG_LINE_MAX.  The
 * escaping never produces a backslash followed by '.', so the marker cannot
 * be mistaken for field content.
 */
#define TRUNC_MARK "\\..."

static const char hexdig[] = "0123456789abcdef";

/* Does byte C need escaping?  In keys '=' does too (see escape_to()). */
static bool needs_escape(unsigned char c, bool key)
{
	return c <= 0x20 || c == 0x7f || c == '\\' || (key && c == '=');
}

/*
 * Escape SRC (NULL = empty) onto BUF at *POS, never writing past SIZE - 1
 * (room for the NUL is kept).  KEY also escapes '=', so that a detail
 * always splits at its first '=' into key and value (the header's rule
 * allows it: '=' is not a byte it requires to pass through, and keys are
 * our own constants anyway).
 *
 * When TRUNCATE is false, returns 0 or -ENOSPC (BUF then holds a partial
 * field that the caller discards).  When TRUNCATE is true, writes as many
 * whole escapes as fit, leaving room for TRUNC_MARK, appends TRUNC_MARK
 * if anything was left out, and returns 0 (or -ENOSPC when not even the
 * marker fits).
 */
static int escape_to(char *buf, size_t size, size_t *pos, const char *src,
		     bool key, bool truncate)
{
	const unsigned char *s = (const unsigned char *)(src ? src : "");
	size_t p = *pos;
	size_t limit = size; /* bytes p may grow to, NUL excluded: p < limit */

	if (size == 0 || p >= size)
		return -ENOSPC;
	if (truncate) {
		if (size - p <= sizeof(TRUNC_MARK) - 1)
			return -ENOSPC;
		limit = size - (sizeof(TRUNC_MARK) - 1);
	}

	/* "-" stands for the empty field, so a literal "-" is escaped. */
	if (s[0] == '\0' || (s[0] == '-' && s[1] == '\0')) {
		const char *e = s[0] ? "\\x2d" : "-";
		size_t n = strlen(e);

		if (p + n >= limit)
			goto full;
		memcpy(buf + p, e, n);
		*pos = p + n;
		buf[*pos] = '\0';
		return 0;
	}

	for (; *s; s++) {
		size_t n = !needs_escape(*s, key) ? 1 : *s == '\\' ? 2 : 4;

		if (p + n >= limit)
			goto full;
		if (n == 1) {
			buf[p] = (char)*s;
		} else if (n == 2) {
			buf[p] = '\\';
			buf[p + 1] = '\\';
		} else {
			buf[p] = '\\';
			buf[p + 1] = 'x';
			buf[p + 2] = hexdig[*s >> 4];
			buf[p + 3] = hexdig[*s & 0xf];
		}
		p += n;
	}
	*pos = p;
	buf[p] = '\0';
	return 0;
full:
	if (!truncate)
		return -ENOSPC;
	memcpy(buf + p, TRUNC_MARK, sizeof(TRUNC_MARK) - 1);
	p += sizeof(TRUNC_MARK) - 1;
	*pos = p;
	buf[p] = '\0';
	return 0;
}

/* Append the raw text S at *POS.  Returns 0 or -ENOSPC. */
static int put_raw(char *buf, size_t size, size_t *pos, const char *s)
{
	size_t n = strlen(s);

	if (*pos + n >= size)
		return -ENOSPC;
	memcpy(buf + *pos, s, n + 1);
	*pos += n;
	return 0;
}

int lockfs_log_escape(char *dst, size_t size, const char *src)
{
	size_t pos = 0;
	int rc = escape_to(dst, size, &pos, src, false, false);

	if (rc < 0) {
		if (size)
			dst[0] = '\0';
		return rc;
	}
	return (int)pos;
}

int lockfs_log_format(char *buf, size_t size, int64_t unix_ms, const char *who,
		      const char *name, const char *const *kv, const char *event)
{
	char ts[32];
	size_t pos = 0;
	int rc = 0;

	rc = put_raw(buf, size, &pos, lockfs_format_time(unix_ms, ts));
	rc = rc ?: put_raw(buf, size, &pos, " ");
	rc = rc ?: escape_to(buf, size, &pos, who, false, false);
	rc = rc ?: put_raw(buf, size, &pos, " ");
	rc = rc ?: escape_to(buf, size, &pos, name, false, false);
	for (size_t i = 0; !rc && kv && kv[i]; i += 2) {
		rc = put_raw(buf, size, &pos, " ");
		rc = rc ?: escape_to(buf, size, &pos, kv[i], true, false);
		rc = rc ?: put_raw(buf, size, &pos, "=");
		/* A key without a value (odd list) ends the list. */
		rc = rc ?: escape_to(buf, size, &pos, kv[i + 1], false, false);
		if (!kv[i + 1])
			break;
	}
	rc = rc ?: put_raw(buf, size, &pos, " ");
	rc = rc ?: escape_to(buf, size, &pos, event, false, false);
	rc = rc ?: put_raw(buf, size, &pos, "\n");
	if (rc < 0) {
		if (size)
			buf[0] = '\0';
		return rc;
	}
	return (int)pos;
}

/*
 * The last resort for lockfs_log_event(): the details are already gone and
 * the line is still too long, so WHO, NAME and EVENT are each cut to a
 * share of the line (whole escapes only, ending in TRUNC_MARK).  The shares
 * add up to well under LOCKFS_LOG_LINE_MAX, so this cannot fail.
 */
static int format_truncated(char *buf, size_t size, int64_t unix_ms,
			    const char *who, const char *name, const char *event)
{
	char ts[32], w[1024], n[2048], e[256];
	size_t wp = 0, np = 0, ep = 0, pos = 0;
	int rc;

	escape_to(w, sizeof(w), &wp, who, false, true);
	escape_to(n, sizeof(n), &np, name, false, true);
	escape_to(e, sizeof(e), &ep, event, false, true);
	rc = put_raw(buf, size, &pos, lockfs_format_time(unix_ms, ts));
	rc = rc ?: put_raw(buf, size, &pos, " ");
	rc = rc ?: put_raw(buf, size, &pos, w);
	rc = rc ?: put_raw(buf, size, &pos, " ");
	rc = rc ?: put_raw(buf, size, &pos, n);
	rc = rc ?: put_raw(buf, size, &pos, " details=dropped ");
	rc = rc ?: put_raw(buf, size, &pos, e);
	rc = rc ?: put_raw(buf, size, &pos, "\n");
	return rc < 0 ? rc : (int)pos;
}

int lockfs_log_open(struct lockfs_log **out, int dirfd, const char *name)
{
	struct lockfs_log *log = malloc(sizeof(*log));

	if (!log)
		return -ENOMEM;
	log->fd = openat(dirfd, name, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (log->fd < 0) {
		int err = errno;

		free(log);
		return -err;
	}
	*out = log;
	return 0;
}

/*
 * When the line does not fit in LOCKFS_LOG_LINE_MAX, fields are never cut
 * in the middle of an escape and the field count stays predictable:
 *   1. the details (KV) are replaced by the single detail
 *      "details=dropped";
 *   2. if that is still too long, WHO, NAME and EVENT are cut to at most
 *      1 KiB, 2 KiB and 256 bytes (escaped), each ending in "\..." when cut.
 */
int lockfs_log_event(struct lockfs_log *log, const char *who, const char *name,
		     const char *const *kv, const char *event)
{
	static const char *const dropped[] = { "details", "dropped", NULL };
	char line[LOCKFS_LOG_LINE_MAX];
	struct timespec now;
	int64_t ms;
	ssize_t w;
	int n;

	if (!log)
		return -EBADF;
	clock_gettime(CLOCK_REALTIME, &now);
	ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;

	n = lockfs_log_format(line, sizeof(line), ms, who, name, kv, event);
	if (n == -ENOSPC)
		n = lockfs_log_format(line, sizeof(line), ms, who, name, dropped, event);
	if (n == -ENOSPC)
		n = format_truncated(line, sizeof(line), ms, who, name, event);
	if (n < 0)
		return n;

	/* One write: a retry after a partial write could interleave with
	 * another writer's line, so a short write is reported, not resumed.
	 * EINTR means nothing was written, so retrying is safe. */
	do {
		w = write(log->fd, line, (size_t)n);
	} while (w < 0 && errno == EINTR);
	if (w < 0)
		return -errno;
	if (w != n)
		return -EIO;
	return 0;
}

void lockfs_log_close(struct lockfs_log *log)
{
	if (!log)
		return;
	close(log->fd);
	free(log);
}
