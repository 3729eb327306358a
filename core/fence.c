/* The persisted fence counter; see fence.h. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fence.h"

struct lockfs_fence {
	pthread_mutex_t mu;
	int dirfd;        /* where PATH is resolved; borrowed */
	char *path;       /* the counter file */
	uint64_t next;     /* next number to hand out; protected by mu */
	uint64_t reserved; /* highest number written to disk; protected by mu */
};

/* Write "RESERVED\n" to PATH through a temporary file and rename(2), so a
 * crash leaves either the old or the new number, never a torn one. */
static int fence_persist(struct lockfs_fence *f, uint64_t reserved)
{
	char tmp[PATH_MAX], buf[32];
	int n, fd, rc = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", f->path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	n = snprintf(buf, sizeof(buf), "%" PRIu64 "\n", reserved);
	fd = openat(f->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, buf, n) != n || fsync(fd) < 0)
		rc = errno ? -errno : -EIO;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && renameat(f->dirfd, tmp, f->dirfd, f->path) < 0)
		rc = -errno;
	if (rc < 0)
		unlinkat(f->dirfd, tmp, 0);
	return rc;
}

static int fence_read(int dirfd, const char *path, uint64_t *value)
{
	char buf[32], *end;
	ssize_t n;
	int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	*value = 0;
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
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

int lockfs_fence_open(struct lockfs_fence **out, int dirfd, const char *path)
{
	struct lockfs_fence *f = calloc(1, sizeof(*f));
	uint64_t last;
	int rc;

	if (!f)
		return -ENOMEM;
	f->dirfd = dirfd;
	f->path = strdup(path);
	if (!f->path) {
		free(f);
		return -ENOMEM;
	}
	pthread_mutex_init(&f->mu, NULL);
	rc = fence_read(dirfd, path, &last);
	if (rc < 0)
		goto fail;
	/* Everything up to LAST may have been handed out before a crash. */
	f->next = last + 1;
	f->reserved = last;
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
		rc = fence_persist(f, f->next + LOCKFS_FENCE_BLOCK - 1);
		if (rc == 0)
			f->reserved = f->next + LOCKFS_FENCE_BLOCK - 1;
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
	pthread_mutex_destroy(&f->mu);
	free(f->path);
	free(f);
}
