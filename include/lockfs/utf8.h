/*
 * Strict UTF-8, the one validator of the project: names, records, the
 * `operation` and `break` texts, and lockctl all decide with it.  Strict:
 * no overlong forms, no surrogates, nothing above U+10FFFF (the classic
 * ways to smuggle a '/' or a NUL past a byte-level check).  NUL and the
 * control characters are valid here; a caller that refuses them says so.
 */
#ifndef LOCKFS_UTF8_H
#define LOCKFS_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Decode the sequence at S (LEN > 0 bytes available).  Returns its length
 * (1..4), with its code point in *CP (CP may be NULL); or 0 when the bytes
 * at S do not start a valid sequence (bad lead byte, truncated, bad
 * continuation, overlong, surrogate, above U+10FFFF).
 */
size_t lockfs_utf8_decode(const char *s, size_t len, uint32_t *cp);

/* Are the LEN bytes at S valid UTF-8?  1 when valid, 0 when not. */
int lockfs_utf8_valid(const char *s, size_t len);

/*
 * Are the LEN bytes at S valid UTF-8 but for a character that their last
 * 1-3 bytes begin and do not finish?  (A write(2) that ends inside a
 * character, which the next write completes.)  False for valid text.
 */
bool lockfs_utf8_cut_short(const char *s, size_t len);

/*
 * Does code point CP, printed raw, break a line or change how the rest of
 * it reads?  True for the C0 controls, DEL and the C1 controls (U+0080 to
 * U+009F, NEL U+0085 and CSI U+009B among them), the line and paragraph
 * separators U+2028 and U+2029, and the bidirectional controls (U+061C,
 * U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069: Unicode's
 * Bidi_Control).  Together with LF, VT, FF, CR and U+001C to U+001E
 * (which are C0) this is every character at which Python's
 * str.splitlines() splits.  The audit log escapes these and lockctl shows
 * them as '?'.
 */
bool lockfs_utf8_unsafe_in_line(uint32_t cp);

#endif
