/* The mount-point guard (guard.c). */
#ifndef LOCKFS_GUARD_H
#define LOCKFS_GUARD_H

/*
 * Make the directory that MOUNTPOINT (absolute, canonical) shows when no
 * lockfs is mounted on it immutable, so that mkdir there fails (EPERM)
 * instead of making a plain directory that is no lock.  Works before any
 * mount and under a running lockfs (root).  Returns 0 when it is guarded
 * (now or already), else -errno with *WHY a reason for people (or NULL:
 * then strerror says it).
 */
int lockfs_guard(const char *mountpoint, const char **why);

/* The daemon, before it mounts: guard MOUNTPOINT, or say loudly on stderr
 * why it cannot. */
void lockfs_guard_before_mount(const char *mountpoint);

/* `lockfs --guard MOUNTPOINT`: exit status 0 (guarded), 1 (one line on
 * stderr says why not), 2 (usage). */
int lockfs_guard_main(int argc, char *argv[]);

#endif
