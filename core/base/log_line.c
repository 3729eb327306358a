/*
 * One line of the audit log (include/lockfs/log.h): escaping and
 * formatting, no I/O (the file is core/base/log.c's).
 *
 * The line is meant for `awk`, `grep` and `cut -d' '`: every field is
 * escaped so that it contains no space, no control byte and no newline,
 * which makes the number of fields on a line depend only on the number of
 * details.  UTF-8 passes through so names stay readable, except the
 * characters that break a line or turn it around when printed
 * (lockfs_utf8_unsafe_in_line(): C1 controls, U+2028, U+2029, bidi
 * controls) and bytes that are not UTF-8: every field holds text a caller
 * chose (a name, a comm, a slug), and a reader that splits lines as
 * Python's str.splitlines() does, or a terminal, must still see one line
 * per event, written by lockfs.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/log.h"
#include "lockfs/utf8.h"
#include "clock.h"

/*
 * Marks a field that was cut short to fit in LOCKFS_LOG_LINE_MAX.  The
 * escaping never produces a backslash followed by '.', so the marker cannot
 * be mistaken for field content.
 */
#define TRUNC_MARK "\\..."

static const char hexdig[] = "0123456789abcdef";

/* Does the ASCII byte C need escaping?  In keys '=' does too (see
 * escape_to()). */
static bool needs_escape(unsigned char c, bool key)
{
	return c <= 0x20 || c == 0x7f || c == '\\' || (key && c == '=');
}

/*
 * The unit at S (a byte >= 0x80 starts it): how many bytes it spans, and
 * whether they are escaped.  A character that is text passes whole; one
 * that breaks or reorders a line is escaped byte by byte; a byte that
 * starts no valid sequence is escaped alone.
 */
static size_t high_unit(const unsigned char *s, bool *escape)
{
	size_t avail = 1, n;
	uint32_t cp;

	while (avail < 4 && s[avail]) /* a NUL ends the field, and any sequence */
		avail++;
	n = lockfs_utf8_decode((const char *)s, avail, &cp);
	if (n == 0) {
		*escape = true;
		return 1;
	}
	*escape = lockfs_utf8_unsafe_in_line(cp);
	return n;
}

/* Write the N bytes at S as \xHH each at BUF. */
static void put_hex(char *buf, const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n; i++, buf += 4) {
		buf[0] = '\\';
		buf[1] = 'x';
		buf[2] = hexdig[s[i] >> 4];
		buf[3] = hexdig[s[i] & 0xf];
	}
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

	while (*s) {
		bool escape;
		size_t in, out;

		/* Printable ASCII, nearly every byte of every field: copied as
		 * it always was, at the cost of one test more. */
		if (*s < 0x80 && !needs_escape(*s, key)) {
			if (p + 1 >= limit)
				goto full;
			buf[p++] = (char)*s++;
			continue;
		}
		if (*s < 0x80) {
			in = 1;
			escape = true;
			out = *s == '\\' ? 2 : 4;
		} else {
			in = high_unit(s, &escape);
			out = escape ? 4 * in : in;
		}
		/* A unit fits whole or not at all: a cut splits neither an
		 * escape nor a character. */
		if (p + out >= limit)
			goto full;
		if (!escape)
			memcpy(buf + p, s, in);
		else if (out == 2)
			memcpy(buf + p, "\\\\", 2);
		else
			put_hex(buf + p, s, in);
		p += out;
		s += in;
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
