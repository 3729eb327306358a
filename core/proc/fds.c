/* The daemon's file descriptors; see fds.h. */
#include <dirent.h>
#include <limits.h>
#include <sys/resource.h>

#include "fds.h"

#define RESERVE_MIN 64
#define RESERVE_MAX 256

void lockfs_fds_init(struct lockfs_fds *f)
{
	atomic_init(&f->held, 0);
	f->limit = 0;
	f->base = 0;
	f->reserve = 0;
}

/* Descriptors open in this process now (without the one used to count). */
static long count_open(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	long n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;
}

void lockfs_fds_start(struct lockfs_fds *f)
{
	struct rlimit rl;
	long open = count_open();
	long limit;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || open < 0)
		return; /* unknown: refuse nothing, as before */
	limit = rl.rlim_cur > LONG_MAX / 2 ? LONG_MAX / 2 : (long)rl.rlim_cur;
	f->reserve = limit / 8 < RESERVE_MIN ? RESERVE_MIN : limit / 8 > RESERVE_MAX ? RESERVE_MAX
										: limit / 8;
	f->base = open - atomic_load(&f->held);
	if (f->base < 0)
		f->base = 0;
	f->limit = limit;
}

/* The most descriptors USE may leave held. */
static long ceiling(const struct lockfs_fds *f, enum lockfs_fd_use use)
{
	if (!f->limit)
		return LONG_MAX;
	return f->limit - f->base - (use == LOCKFS_FD_CALLER ? f->reserve : f->reserve / 2);
}

bool lockfs_fds_take(struct lockfs_fds *f, enum lockfs_fd_use use)
{
	long max = ceiling(f, use);
	long held = atomic_load(&f->held);

	do {
		if (held >= max)
			return false;
	} while (!atomic_compare_exchange_weak(&f->held, &held, held + 1));
	return true;
}

void lockfs_fds_give(struct lockfs_fds *f)
{
	atomic_fetch_sub(&f->held, 1);
}

long lockfs_fds_left(struct lockfs_fds *f)
{
	long max = ceiling(f, LOCKFS_FD_CALLER);
	long held = atomic_load(&f->held);

	return max == LONG_MAX ? LONG_MAX : max > held ? max - held : 0;
}

long lockfs_fds_callers_max(const struct lockfs_fds *f)
{
	long max = ceiling(f, LOCKFS_FD_CALLER);

	return max < 0 ? 0 : max;
}
