/*
 * The lock-name rule (include/lockfs/name.h).
 *
 * A name becomes a directory entry on the mount and DIR/NAME.lock on the
 * backing store, and it is printed in logs and JSON.  So it must be short
 * enough for NAME_MAX with ".lock" appended, must not contain '/', must be
 * text every consumer agrees on (strict UTF-8: overlong forms and
 * surrogates are the classic ways to smuggle a '/' or a NUL past a
 * byte-level check), and must not contain control characters or line and
 * paragraph separators (U+2028, U+2029, categories Zl and Zp) that would
 * corrupt terminals and line-oriented logs: printed raw, a name with one
 * starts a new line where a reader that splits on it (Python's
 * str.splitlines(), a terminal) sees a line the name forged.
 *
 * Names that look the same must be the same lock or be refused: a name must
 * be in Unicode NFC (so `café` has one spelling, not a precomposed and a
 * decomposed one), must hold no format character (category Cf: zero-width
 * and bidi controls, which are invisible or reorder what is printed), and
 * must not be only whitespace.  The Unicode tables are libunistring's.
 * ASCII needs none of them: it is always NFC and has no format character,
 * so the common name costs no more than before.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <unictype.h>
#include <uninorm.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"

/* C0 controls, DEL and the C1 controls U+0080..U+009F. */
static bool is_control(uint32_t cp)
{
	return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F);
}

/* Is the valid UTF-8 text S (LEN bytes) in NFC?  1, 0, or -ENOMEM. */
static int is_nfc(const unsigned char *s, size_t len)
{
	size_t n = 0;
	uint8_t *nfc = u8_normalize(UNINORM_NFC, s, len, NULL, &n);
	int same;

	if (!nfc)
		return -ENOMEM;
	same = n == len && memcmp(nfc, s, len) == 0;
	free(nfc);
	return same;
}

int lockfs_name_check(const char *name)
{
	const unsigned char *p = (const unsigned char *)name;
	size_t len, i = 0;
	bool ascii = true, blank = true;
	uint32_t cp;
	int nfc;

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
		size_t n = lockfs_utf8_decode(name + i, len - i, &cp);

		if (n == 0 || cp == '/' || is_control(cp))
			return -EINVAL;
		if (cp < 0x80) {
			blank = blank && cp == ' ';
		} else {
			ascii = false;
			if (uc_is_general_category(cp, UC_CATEGORY_Cf) ||
			    uc_is_general_category(cp, UC_CATEGORY_Zl) ||
			    uc_is_general_category(cp, UC_CATEGORY_Zp))
				return -EINVAL;
			blank = blank && uc_is_property_white_space(cp);
		}
		i += n;
	}
	if (blank)
		return -EINVAL;
	if (ascii)
		return 0;
	nfc = is_nfc(p, len);
	return nfc < 0 ? nfc : nfc ? 0 : -EINVAL;
}
