/*
 * The persisted fence counter; see fence.h.
 *
 * The file holds the highest number any daemon has reserved, as a
 * fixed-width decimal, so an update is one small pwrite that never needs
 * a truncate.  Reservations happen under flock(2) on the file: daemons on
 * different backing dirs may share one counter file (the default lives on
 * persistent storage) and still never hand out the same number.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "fence.h"

#define FIELD 21 /* 20 digits and a newline */

struct lockfs_fence {
	pthread_mutex_t mu;
	int fd;            /* the counter file */
	uint64_t next;     /* next number to hand out; protected by mu */
	uint64_t reserved; /* last number of our block; protected by mu */
};

/* The number in the file; 0 for an empty file.  -EINVAL for garbage. */
static int fence_read(int fd, uint64_t *value)
{
	char buf[64], *end;
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	*value = 0;
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	if (n == 0)
		return 0;
	errno = 0;
	*value = strtoull(buf, &end, 10);
	if (errno || end == buf || (*end != '\n' && *end != '\0'))
		return -EINVAL;
	return 0;
}

/* Reserve the block after everything reserved so far, by anyone.  Called
 * with f->mu held. */
static int fence_reserve(struct lockfs_fence *f)
{
	char buf[FIELD + 1];
	uint64_t last;
	int rc;

	if (flock(f->fd, LOCK_EX) < 0)
		return -errno;
	rc = fence_read(f->fd, &last);
	if (rc == 0) {
		uint64_t start = last + 1 > f->next ? last + 1 : f->next;
		uint64_t end = start + LOCKFS_FENCE_BLOCK - 1;

		snprintf(buf, sizeof(buf), "%020" PRIu64 "\n", end);
		if (pwrite(f->fd, buf, FIELD, 0) != FIELD || fdatasync(f->fd) < 0) {
			rc = errno ? -errno : -EIO;
		} else {
			f->next = start;
			f->reserved = end;
		}
	}
	flock(f->fd, LOCK_UN);
	return rc;
}

int lockfs_fence_open(struct lockfs_fence **out, int dirfd, const char *path)
{
	struct lockfs_fence *f = calloc(1, sizeof(*f));
	uint64_t last;
	int rc;

	if (!f)
		return -ENOMEM;
	pthread_mutex_init(&f->mu, NULL);
	f->fd = openat(dirfd, path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (f->fd < 0) {
		rc = -errno;
		goto fail;
	}
	rc = fence_read(f->fd, &last);
	if (rc < 0)
		goto fail;
	/* Nothing is reserved for us yet: the first fence_next() reserves. */
	f->next = last + 1;
	f->reserved = 0;
	*out = f;
	return 0;
fail:
	lockfs_fence_close(f);
	return rc;
}

int lockfs_fence_next(struct lockfs_fence *f, uint64_t *fence)
{
	int rc = 0;

	pthread_mutex_lock(&f->mu);
	if (f->next > f->reserved)
		rc = fence_reserve(f);
	if (rc == 0)
		*fence = f->next++;
	pthread_mutex_unlock(&f->mu);
	return rc;
}

int lockfs_fence_observe(struct lockfs_fence *f, uint64_t seen)
{
	pthread_mutex_lock(&f->mu);
	if (seen >= f->next)
		f->next = seen + 1;
	pthread_mutex_unlock(&f->mu);
	return 0;
}

void lockfs_fence_close(struct lockfs_fence *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	pthread_mutex_destroy(&f->mu);
	free(f);
}
