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

#endif
