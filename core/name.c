/*
 * The lock-name rule (include/lockfs/name.h).
 *
 * A name becomes a directory entry on the mount and DIR/NAME.lock on the
 * backing store, and it is printed in logs and JSON.  So it must be short
 * enough for NAME_MAX with ".lock" appended, must not contain '/', must be
 * text every consumer agrees on (strict UTF-8: overlong forms and
 * surrogates are the classic ways to smuggle a '/' or a NUL past a
 * byte-level check), and must not contain control characters that would
 * corrupt terminals and line-oriented logs.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "lockfs/name.h"

/*
 * Decode one strict UTF-8 sequence at S (LEN > 0 bytes available).
 * Returns its length (1..4) and stores the code point in *CP, or 0 when the
 * bytes at S do not start a valid sequence (bad lead byte, truncated,
 * bad continuation, overlong, surrogate, above U+10FFFF).
 */
static size_t utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
	uint32_t c = s[0];
	uint32_t min;
	size_t n;

	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	/* 0x80..0xBF are continuation bytes, 0xC0/0xC1 can only start
	 * overlong 2-byte forms, 0xF5..0xFF only code points > U+10FFFF. */
	if (c >= 0xC2 && c <= 0xDF) {
		n = 2;
		c &= 0x1F;
		min = 0x80;
	} else if (c >= 0xE0 && c <= 0xEF) {
		n = 3;
		c &= 0x0F;
		min = 0x800;
	} else if (c >= 0xF0 && c <= 0xF4) {
		n = 4;
		c &= 0x07;
		min = 0x10000;
	} else {
		return 0;
	}
	if (len < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		c = (c << 6) | (s[i] & 0x3F);
	}
	if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
		return 0;
	*cp = c;
	return n;
}

int lockfs_utf8_valid(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;
	uint32_t cp;

	while (i < len) {
		size_t n = utf8_decode(p + i, len - i, &cp);

		if (n == 0)
			return 0;
		i += n;
	}
	return 1;
}

/* C0 controls, DEL and the C1 controls U+0080..U+009F. */
static bool is_control(uint32_t cp)
{
	return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F);
}

int lockfs_name_check(const char *name)
{
	const unsigned char *p = (const unsigned char *)name;
	size_t len, i = 0;
	uint32_t cp;

	if (!name)
		return -EINVAL;
	/* Length first: an overlong name is ENAMETOOLONG whatever else is
	 * wrong with it, as the kernel would report it.  strnlen bounds the
	 * scan. */
	len = strnlen(name, LOCKFS_NAME_MAX + 1);
	if (len > LOCKFS_NAME_MAX)
		return -ENAMETOOLONG;
	if (len == 0 || name[0] == '.')
		return -EINVAL;
	while (i < len) {
		size_t n = utf8_decode(p + i, len - i, &cp);

		if (n == 0 || cp == '/' || is_control(cp))
			return -EINVAL;
		i += n;
	}
	return 0;
}
