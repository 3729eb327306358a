/* Strict UTF-8 (include/lockfs/utf8.h): a leaf, used by name.c, record.c,
 * log_line.c, the engine, the mount and lockctl. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lockfs/utf8.h"

size_t lockfs_utf8_decode(const char *s, size_t len, uint32_t *cp)
{
	const unsigned char *p = (const unsigned char *)s;
	uint32_t c = p[0];
	uint32_t min;
	size_t n;

	if (c < 0x80) {
		if (cp)
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
		if ((p[i] & 0xC0) != 0x80)
			return 0;
		c = (c << 6) | (p[i] & 0x3F);
	}
	if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
		return 0;
	if (cp)
		*cp = c;
	return n;
}

int lockfs_utf8_valid(const char *s, size_t len)
{
	size_t i = 0;

	while (i < len) {
		size_t n = lockfs_utf8_decode(s + i, len - i, NULL);

		if (n == 0)
			return 0;
		i += n;
	}
	return 1;
}

bool lockfs_utf8_cut_short(const char *s, size_t len)
{
	const unsigned char *t = (const unsigned char *)s;

	for (size_t k = 1; k <= 3 && k <= len; k++) {
		unsigned char lead = t[len - k];
		size_t need = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 && lead <= 0xEF ? 3 :
			      lead >= 0xC2 && lead <= 0xDF ? 2 : 0;
		bool cont = true;

		for (size_t i = len - k + 1; i < len; i++)
			cont = cont && t[i] >= 0x80 && t[i] <= 0xBF;
		if (need > k && cont)
			return lockfs_utf8_valid(s, len - k);
		if (lead < 0x80 || lead >= 0xC0)
			return false; /* a lead byte or ASCII that is no cut start */
	}
	return false;
}

bool lockfs_utf8_unsafe_in_line(uint32_t cp)
{
	if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F))
		return true;
	if (cp < 0x061C)
		return false; /* the common case: Latin and most scripts stop here */
	return cp == 0x061C || cp == 0x200E || cp == 0x200F || cp == 0x2028 || cp == 0x2029 ||
	       (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}
