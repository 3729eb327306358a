/*
 * One line of the audit log (include/lockfs/log.h): escaping and
 * formatting, no I/O (the file is core/base/log.c's).
 *
 * The line is meant for `awk`, `grep` and `cut -d' '`: every field is
 * escaped so that it contains no space, no control byte and no newline,
 * which makes the number of fields on a line depend only on the number of
 * details.  Bytes >= 0x80 pass through so UTF-8 names stay readable.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/log.h"
#include "clock.h"

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


/* The details no shortening drops: who the line is about, as the kernel
 * says (a slug or a name can be long; these are what cannot be forged). */
static bool kept_key(const char *key)
{
	return strcmp(key, "uid") == 0 || strcmp(key, "pid") == 0;
}

/*
 * The last resort for lockfs_log_format_fit(): the other details are
 * already gone and the line is still too long, so WHO, NAME and EVENT are
 * each cut to a share of the line (whole escapes only, ending in
 * TRUNC_MARK).  The shares add up to well under LOCKFS_LOG_LINE_MAX, with
 * room for KEPT (uid=, pid=, details=dropped), so this cannot fail.
 */
static int format_truncated(char *buf, size_t size, int64_t unix_ms, const char *who,
			    const char *name, const char *const *kept, const char *event)
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
	for (size_t i = 0; !rc && kept[i] && kept[i + 1]; i += 2) {
		rc = put_raw(buf, size, &pos, " ");
		rc = rc ?: escape_to(buf, size, &pos, kept[i], true, false);
		rc = rc ?: put_raw(buf, size, &pos, "=");
		rc = rc ?: escape_to(buf, size, &pos, kept[i + 1], false, false);
	}
	rc = rc ?: put_raw(buf, size, &pos, " ");
	rc = rc ?: put_raw(buf, size, &pos, e);
	rc = rc ?: put_raw(buf, size, &pos, "\n");
	return rc < 0 ? rc : (int)pos;
}

int lockfs_log_format_fit(char buf[LOCKFS_LOG_LINE_MAX], int64_t unix_ms, const char *who,
			  const char *name, const char *const *kv, const char *event)
{
	const char *kept[8];
	size_t n = 0;
	int rc = lockfs_log_format(buf, LOCKFS_LOG_LINE_MAX, unix_ms, who, name, kv, event);

	if (rc != -ENOSPC)
		return rc;
	for (size_t i = 0; kv && kv[i] && kv[i + 1] && n < 4; i += 2) {
		if (kept_key(kv[i]) && strlen(kv[i + 1]) < 32) {
			kept[n++] = kv[i];
			kept[n++] = kv[i + 1];
		}
	}
	kept[n++] = "details";
	kept[n++] = "dropped";
	kept[n] = NULL;
	rc = lockfs_log_format(buf, LOCKFS_LOG_LINE_MAX, unix_ms, who, name, kept, event);
	if (rc != -ENOSPC)
		return rc;
	return format_truncated(buf, LOCKFS_LOG_LINE_MAX, unix_ms, who, name, kept, event);
}

int lockfs_log_parse_size(const char *text, uint64_t *out)
{
	unsigned long long v;
	unsigned shift = 0;
	char *end;

	if (!text || *text < '0' || *text > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(text, &end, 10);
	if (errno)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	default: break;
	}
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}
