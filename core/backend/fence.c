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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fence.h"

#define FIELD 21 /* 20 digits and a newline */

struct lockfs_fence {
	pthread_mutex_t mu;
	int fd;            /* the counter file */
	uint64_t next;     /* next number to hand out; protected by mu */
	uint64_t reserved; /* last number of our block; protected by mu */
	int failing;       /* errno of the last failed reservation, 0 when
			      it worked; protected by mu */
	char *path;        /* for messages */
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
		errno = 0;
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

/* Is ST a file the counter may be rewritten in: a plain file of ours
 * with one link?  (A hard link would carry our writes to another name.) */
static bool own_plain_file(const struct stat *st)
{
	return S_ISREG(st->st_mode) && st->st_nlink == 1 && st->st_uid == geteuid();
}

int lockfs_fence_open(struct lockfs_fence **out, int dirfd, const char *path)
{
	struct lockfs_fence *f = calloc(1, sizeof(*f));
	struct stat st;
	uint64_t last;
	int rc;

	if (!f)
		return -ENOMEM;
	pthread_mutex_init(&f->mu, NULL);
	f->fd = -1;
	f->path = strdup(path);
	if (!f->path) {
		rc = -ENOMEM;
		goto fail;
	}
	/* Look before opening: opening a FIFO or a device may do things. */
	if (fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 && !own_plain_file(&st)) {
		rc = -EMLINK;
		goto fail;
	}
	f->fd = openat(dirfd, path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK |
		       O_NOCTTY, 0600);
	if (f->fd < 0) {
		rc = errno == ELOOP ? -EMLINK : -errno;
		goto fail;
	}
	if (fstat(f->fd, &st) < 0 || !own_plain_file(&st)) {
		rc = -EMLINK;
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
	if (f->next > f->reserved) {
		rc = fence_reserve(f);
		/* The counter is the engine's store: whatever the file
		 * system said, the caller gets EIO (an EPERM from an
		 * immutable file must not read as "not yours"), and what is
		 * wrong is said once, not per request. */
		if (rc < 0 && rc != -ENOMEM) {
			if (f->failing != -rc)
				fprintf(stderr, "lockfs: fence file %s cannot be written (%s); "
					"acquisitions fail with EIO until it can\n", f->path,
					strerror(-rc));
			f->failing = -rc;
			rc = -EIO;
		} else if (rc == 0 && f->failing) {
			fprintf(stderr, "lockfs: fence file %s can be written again\n", f->path);
			f->failing = 0;
		}
	}
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
	free(f->path);
	free(f);
}
