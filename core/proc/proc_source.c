/*
 * Asking a struct lockfs_proc_source what the engine asks of processes
 * besides the holder rule: the source's own function when it has one (a
 * test's fake table), else the real /proc's (procfs.c).
 */
#include <stddef.h>
#include <sys/types.h>

#include "lockfs/proc.h"
#include "procfs.h"

int lockfs_proc_source_pidfd_open(const struct lockfs_proc_source *src, pid_t pid)
{
	if (src && src->pidfd_open)
		return src->pidfd_open(src->ctx, pid);
	return lockfs_procfs_pidfd_open(pid);
}

int lockfs_proc_source_cmdline(const struct lockfs_proc_source *src, pid_t pid,
			       size_t max_bytes, char ***argv)
{
	if (src && src->cmdline)
		return src->cmdline(src->ctx, pid, max_bytes, argv);
	return lockfs_procfs_cmdline(pid, max_bytes, argv);
}

int lockfs_proc_source_getenv(const struct lockfs_proc_source *src, pid_t pid, const char *var,
			      char *buf, size_t size)
{
	if (src && src->getenv)
		return src->getenv(src->ctx, pid, var, buf, size);
	return lockfs_procfs_getenv(pid, var, buf, size);
}

int lockfs_proc_source_start_time(const struct lockfs_proc_source *src, pid_t pid,
				  unsigned long long *start)
{
	if (src && src->start_time)
		return src->start_time(src->ctx, pid, start);
	return lockfs_procfs_start_time(pid, start);
}

int lockfs_proc_source_env_exists(const struct lockfs_proc_source *src, uid_t uid,
				  const char *var, const char *value, pid_t *pid)
{
	if (src && src->env_exists)
		return src->env_exists(src->ctx, uid, var, value, pid);
	return lockfs_procfs_env_exists(uid, var, value, pid);
}
