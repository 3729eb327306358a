/* The lock-name rule, shared by the mount, the tools and the tests. */
#ifndef LOCKFS_NAME_H
#define LOCKFS_NAME_H

#include <stddef.h>

#include "lockfs/limits.h" /* LOCKFS_NAME_MAX */

/*
 * Check that NAME may name a lock: 1..LOCKFS_NAME_MAX bytes of valid UTF-8
 * (no overlong forms, no surrogates, nothing above U+10FFFF), no '/', no
 * control character (C0, DEL, C1), and not beginning with '.' (reserved for
 * the daemon's own entries); in Unicode NFC, with no format character
 * (general category Cf), and not made only of whitespace (White_Space).
 *
 * Returns 0 when valid, -ENAMETOOLONG when longer than LOCKFS_NAME_MAX bytes,
 * -ENOMEM when the NFC check could not allocate, -EINVAL for anything else
 * wrong (including the empty name).
 */
int lockfs_name_check(const char *name) __attribute__((warn_unused_result));

/*
 * Slots (docs/slots.md).  A slotted NAME with N slots is asked for as
 * "NAME=N" (N: 1..LOCKFS_SLOTS_MAX, decimal, no leading zero); its slot K
 * is stored as the lock ".slotKofN:NAME", a name no caller can use as a
 * lock name (it begins with '.').  A slotted NAME is a valid lock name
 * of at most LOCKFS_SLOT_NAME_MAX bytes that does not itself end in
 * "=DIGITS" (so "NAME=N" is never ambiguous).
 */
/* Is BASE a valid slotted name?  0, -EINVAL, -ENAMETOOLONG, -ENOMEM. */
int lockfs_slot_base_check(const char *base) __attribute__((warn_unused_result));
/* Split REQ ("NAME=N") into BASE (SIZE bytes) and *CAP.  0; -EINVAL
 * (no "=N", a bad N, a bad NAME), -ENAMETOOLONG. */
int lockfs_slot_request_parse(const char *req, char *base, size_t size, unsigned *cap)
	__attribute__((warn_unused_result));
/* The stored name of slot K of BASE with CAP slots into OUT (SIZE bytes). */
void lockfs_slot_name(char *out, size_t size, const char *base, unsigned k, unsigned cap);
/* Is NAME a stored slot name?  1 (*BASE points into NAME, *K, *CAP set)
 * or 0. */
int lockfs_slot_name_parse(const char *name, const char **base, unsigned *k, unsigned *cap);
/* The lock whose FIFO line slot waiters of BASE stand in on a store of
 * several daemons (etcd; docs/slots.md), ".slotline:BASE", into OUT. */
void lockfs_slot_line_name(char *out, size_t size, const char *base);
/* Is NAME a stored line name?  1 (*BASE points into NAME) or 0. */
int lockfs_slot_line_parse(const char *name, const char **base);
/* The engine's rule for what a store may hold: a valid lock name
 * (lockfs_name_check), a stored slot name or a line name.  Never for a
 * caller's path. */
int lockfs_name_check_stored(const char *name) __attribute__((warn_unused_result));

#endif
