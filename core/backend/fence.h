/*
 * The fence counter: one number for all names that only ever grows, also
 * across daemon restarts and reboots (keep the file on persistent
 * storage).  Numbers are reserved on disk a block at a time, so the hot
 * path is a mutex and an increment; a crash skips at most one block and
 * never goes back.
 */
#ifndef LOCKFS_CORE_FENCE_H
#define LOCKFS_CORE_FENCE_H

#include <stdint.h>

struct lockfs_fence;

/* How many numbers one write to disk reserves. */
#define LOCKFS_FENCE_BLOCK 1024

/*
 * Open the counter file PATH (relative to DIRFD unless absolute), creating
 * it empty when missing (an empty file counts from 1).  The number is
 * rewritten in place, so the file must be a plain file of the daemon's own
 * with one link: a symlink, a FIFO, a hard link or another user's file
 * planted there is refused.  Returns 0 and *OUT, or -errno (-EINVAL when
 * the file holds something that is not a number, -EMLINK when it is not
 * such a file).
 */
int lockfs_fence_open(struct lockfs_fence **out, int dirfd, const char *path)
	__attribute__((warn_unused_result));

/* Hand out the next number.  Returns 0 and *FENCE, or -EIO when the next
 * block could not be reserved on disk (then nothing is handed out, and
 * the cause is said on stderr once, until a reservation works again). */
int lockfs_fence_next(struct lockfs_fence *f, uint64_t *fence)
	__attribute__((warn_unused_result));

/* Make sure every later number is greater than SEEN (a fence found in a
 * record).  Returns 0 or -errno. */
int lockfs_fence_observe(struct lockfs_fence *f, uint64_t seen);

void lockfs_fence_close(struct lockfs_fence *f);

#endif
