/*
 * What lockctl prints of text that others chose: a holder's comm, slug and
 * operation, user and host names, lock names, a name from the command line.
 *
 * All of it reaches a terminal.  A control character there can move the
 * cursor or start an escape sequence (C1 CSI U+009B is ESC [), a line
 * separator starts a new line for many readers (U+2028, U+2029, NEL
 * U+0085), and a bidirectional control turns the rest of the line around
 * (U+202E shows "exe.txt" as "txt.exe").  So each of them, and each byte
 * that is not UTF-8, is shown as one '?'; other text, non-ASCII included,
 * is shown as it is.
 */
#include <stdint.h>
#include <string.h>

#include "lockfs/utf8.h"
#include "lockctl.h"

void lockfs_ctl_printable(char *s)
{
	char *out = s;

	while (*s) {
		uint32_t cp;
		size_t avail = strnlen(s, 4);
		size_t n = lockfs_utf8_decode(s, avail, &cp);

		if (n == 0 || lockfs_utf8_unsafe_in_line(cp)) {
			*out++ = '?';
			s += n ? n : 1;
		} else {
			memmove(out, s, n);
			out += n;
			s += n;
		}
	}
	*out = '\0';
}
