/*
 * What the real /proc's readers (procfs.c) share with the helper list
 * (helpers.c): the multi-call binaries, whose applets are judged by the
 * binary itself; and with the source wrappers (proc_source.c): the real
 * pidfd_open.  Internal to core/proc.
 */
#ifndef LOCKFS_PROC_PROCFS_H
#define LOCKFS_PROC_PROCFS_H

#include <stdbool.h>
#include <sys/types.h>

/* busybox, toybox, and coreutils built as one program (uutils, Fedora's
 * coreutils-single). */
#define LOCKFS_MULTICALL_COUNT 3
extern const char *const lockfs_multicall_names[LOCKFS_MULTICALL_COUNT];

/* Is NAME one of lockfs_multicall_names? */
bool lockfs_is_multicall(const char *name);

/* pidfd_open(2) of thread group PID (proc_source.c's default): a pidfd,
 * or -errno. */
int lockfs_procfs_pidfd_open(pid_t pid);

#endif
