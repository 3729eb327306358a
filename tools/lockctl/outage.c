/*
 * Riding out a daemon restart: which errors mean that the mount's daemon
 * is away for a moment (a dead connection, or nothing yet mounted on a
 * guarded mount point), how long run and acquire keep trying
 * (--restart-wait, LOCKFS_RESTART_WAIT), and waiting for the mount table
 * to change between two tries.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <math.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "lockctl.h"

bool lockfs_ctl_is_conn_error(int e)
{
	return e == ENOTCONN || e == ECONNABORTED;
}

bool lockfs_ctl_is_guarded(const char *path)
{
	/* lockfs --guard (chattr +i) marks a directory as the place of a lockfs
	 * mount: with nothing on it, a lockfs is being (re)started there. */
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return false;
	int flags = 0;
	bool guarded = ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 && (flags & FS_IMMUTABLE_FL);
	close(fd);
	return guarded;
}

const char *lockfs_ctl_down_reason(int e)
{
	if (e == ERR_NOTHING_MOUNTED)
		return "nothing is mounted on its guarded mount point";
	return strerror(e);
}

int lockfs_ctl_restart_wait(const struct opts *o, double *secs)
{
	if (o->has_restart_wait) {
		*secs = o->restart_wait;
		return 0;
	}
	const char *env = getenv("LOCKFS_RESTART_WAIT");
	if (!env || !*env) {
		*secs = RESTART_WAIT_DEFAULT_S;
		return 0;
	}
	char *end;
	errno = 0;
	double v = strtod(env, &end);
	if (errno || end == env || *end || !isfinite(v) || v < 0 || v > RESTART_WAIT_MAX_S)
		return fail(EX_USAGE, "LOCKFS_RESTART_WAIT=%s: want a number of seconds, 0 to %d",
			    env, RESTART_WAIT_MAX_S);
	*secs = v;
	return 0;
}

/*
 * Sleep until the mount table changes (a mount or unmount: the restarted
 * daemon's mount, or the dead one detached), a signal arrives, or MAX_MS
 * passes.  /proc/self/mountinfo reports a change as POLLPRI.
 */
void lockfs_ctl_wait_mount_change(int max_ms)
{
	static int mountinfo = -2;
	if (mountinfo == -2)
		mountinfo = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
	if (max_ms <= 0)
		return;
	if (mountinfo < 0) {
		poll(NULL, 0, max_ms);
		return;
	}
	struct pollfd p = { .fd = mountinfo, .events = POLLPRI };
	poll(&p, 1, max_ms);
}
