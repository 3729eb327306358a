/*
 * The fast encoder of the lock record (record_compact.c), for
 * record_encode.c only: an exclusive record's compact form is written on
 * every acquisition, so it is produced directly rather than through a
 * tree of jansson objects.
 */
#ifndef LOCKFS_BASE_RECORD_COMPACT_H
#define LOCKFS_BASE_RECORD_COMPACT_H

#include <stddef.h>

#include "lockfs/record.h"

/*
 * R (exclusive, no shares) in the compact form, equal byte for byte to
 * jansson's JSON_COMPACT dump of the same record (record_encode.c), with
 * a final newline; the token too with LOCKFS_RECORD_WITH_TOKEN.  Malloc'd
 * (*LEN its length, LEN may be NULL), or NULL when out of memory.
 */
char *lockfs_record_encode_compact(const struct lockfs_record *r, int flags, size_t *len);

#endif
