/*
 * Is a process a genuine helper (helpers.c), for the holder rule
 * (holder.c).  Internal to core/proc.
 */
#ifndef LOCKFS_PROC_HELPERS_H
#define LOCKFS_PROC_HELPERS_H

#include <sys/stat.h>
#include <sys/types.h>

#include "lockfs/holder.h"

/*
 * Is process P, of uid UID, running the genuine file of helper P->exe (for
 * an applet, of its multi-call binary)?  *EXE gets the file's stat.  The
 * daemon's cached files first (one stat); on a miss, the files are looked
 * up again in P's root: the daemon's (and the cache refreshed) or another
 * (a container's, a user's chroot), off the request path within a bound
 * (helper_files.c says why).
 * Returns 1 (genuine), 0 (not), or -EACCES: P's root did not answer in
 * time, so nobody can say.
 */
int lockfs_helpers_genuine(const struct lockfs_proc_source *src, struct lockfs_helpers *h,
			   const struct lockfs_proc *p, uid_t uid, struct stat *exe);

#endif
