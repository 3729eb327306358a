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

#endif
