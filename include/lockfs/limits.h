/*
 * Every limit that the daemon, lockctl and the tests share, in one place,
 * so that a client refuses exactly what the mount would refuse.  Sizes in
 * bytes unless the name says otherwise.
 */
#ifndef LOCKFS_LIMITS_H
#define LOCKFS_LIMITS_H

/* Longest lock name: NAME plus ".lock" must fit in NAME_MAX (255). */
#define LOCKFS_NAME_MAX 250
/* A LOCKFS_SLUG of 1..255 bytes, plus the NUL: the size of a slug buffer. */
#define LOCKFS_SLUG_MAX 256
/* Largest `operation` text. */
#define LOCKFS_OPERATION_MAX 1024
/* Largest reason written to `break`. */
#define LOCKFS_REASON_MAX LOCKFS_OPERATION_MAX
/* Longest lease, in seconds: ten years. */
#define LOCKFS_LEASE_MAX_S (10u * 365 * 24 * 3600)
/* Largest record accepted from the store: room for LOCKFS_SHARED_MAX
 * holders with 4 KiB command lines each. */
#define LOCKFS_RECORD_MAX (8 * 1024 * 1024)
/* Most holders of one shared lock; one more gets ENOLCK. */
#define LOCKFS_SHARED_MAX 1024
/* A host name as records carry it, with its NUL (HOST_NAME_MAX is 64;
 * room for a longer name given to a distributed store). */
#define LOCKFS_HOST_MAX 256
/* Where a store keeps a holder, with its NUL (backend.h's `key`): a name
 * of LOCKFS_NAME_MAX bytes, a store's prefix and a 33-byte suffix. */
#define LOCKFS_STORE_KEY_MAX 512

/* Slots (docs/slots.md): most slots a slotted name may have, and the
 * longest slotted name (its slot K is stored as ".slotKofN:NAME", which
 * must fit in LOCKFS_NAME_MAX). */
#define LOCKFS_SLOTS_MAX 256
#define LOCKFS_SLOT_NAME_MAX 236

#endif
