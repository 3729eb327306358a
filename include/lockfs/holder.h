/* Who is asking: the helpers skipped on the way to a holder, and the
 * holder rule.  The process facts it reads are lockfs/proc.h's. */
#ifndef LOCKFS_HOLDER_H
#define LOCKFS_HOLDER_H

#include <pthread.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "lockfs/proc.h"

/* The default helper list (mount option `helpers=`, ':'-separated). */
#define LOCKFS_DEFAULT_HELPERS \
	"mkdir:rmdir:flock:timeout:sudo:xargs:env:nice:nohup:stdbuf:lockctl"

struct lockfs_genuine; /* core/proc/helpers.c: the files each helper name may be */

/*
 * The helpers: executable basenames that are skipped when resolving a
 * holder, and the genuine system files each of them may be (holder.md,
 * "Genuine helpers").  NAMES is immutable after parse; the genuine files
 * are looked up at parse time and again when a helper's file is not among
 * them (an upgraded package), under MU.
 */
struct lockfs_helpers {
	char **names; /* NULL-terminated */
	pthread_mutex_t mu;
	struct lockfs_genuine *genuine; /* protected by mu */
};

/*
 * Parse a ':'-separated list ("" = no helpers), and find the genuine file
 * of each name in the system directories of the daemon's root.  Returns 0
 * or -EINVAL (empty element, '/' in an element) / -ENOMEM.
 */
int lockfs_helpers_parse(struct lockfs_helpers *h, const char *list)
	__attribute__((warn_unused_result));
void lockfs_helpers_free(struct lockfs_helpers *h);
bool lockfs_helpers_contains(const struct lockfs_helpers *h, const char *exe);

/*
 * Also accept the file (DEV, INO) as a genuine NAME (NAME must be on the
 * list, or "busybox", "toybox" or "coreutils").  For tests, which describe processes that
 * run no real file.  0, -ENOENT (not on the list) or -ENOSPC.
 */
int lockfs_helpers_trust_file(struct lockfs_helpers *h, const char *name, dev_t dev,
			      ino_t ino);

/*
 * The holder rule.  Start at the thread group of CALLER_TID, whose
 * (effective) uid is CALLER_UID (LOCKFS_UID_UNKNOWN: read it); while its
 * executable is a genuine helper (on the list, and the very file the name
 * stands for in the system directories of its root), move to its parent.
 * Every move must be believable: the parent must exist, not be pid 1, must
 * not have started after the child (pid reuse), and, unless the child
 * leads its own session, must share the child's session (an adopted
 * orphan does not).  A move never crosses a uid boundary: when the parent
 * runs as another uid than the helper, the walk stops at the helper
 * (at_uid_boundary set), unless the helper's file is set-uid to the
 * helper's uid (a genuine `sudo`).  Nor does a move leave the helper's pid
 * namespace (SRC's pidns): when the parent is in another one, or the
 * daemon cannot see it (ppid 0), the helper holds (at_pidns_boundary
 * set).  A parent that left while being read is looked for again: the
 * helper was given another (a subreaper, conmon).
 *
 * The holder's uid and gid are read (have_ids set) when it is not the
 * caller's own thread group; for the caller itself they are left to the
 * credentials FUSE reports with the request.
 *
 * WANT may hold LOCKFS_PROC_PIDFD: then *HOLDER carries a pidfd (when the
 * source can open one) that the caller must close (lockfs_proc_put); and
 * LOCKFS_PROC_NS: then its ns_pid and container are filled (0 and "" when
 * the source cannot tell).
 *
 * HELPERS' genuine files may be looked up again (under its mutex).
 *
 * On success fills *HOLDER and returns 0.  Returns -EACCES when CALLER_TID
 * is 0 (a pid namespace the daemon cannot see), when the holder would be
 * pid 1, or when a move is not believable; -ESRCH when the caller vanished.
 */
int lockfs_holder_resolve(const struct lockfs_proc_source *src, pid_t caller_tid,
			  uid_t caller_uid, struct lockfs_helpers *helpers, unsigned want,
			  struct lockfs_proc *holder)
	__attribute__((warn_unused_result));

/*
 * May the process of CALLER_TID release a lock held by (HOLDER_PID,
 * HOLDER_START)?  Yes when the caller's own thread group is the holder
 * (compared first, before any helper is skipped), or when the holder is
 * one of its ancestors, following parents only while each parent started
 * no later than its child.  HOLDER_ALIVE says the caller knows (from a
 * pidfd) that the holder process is alive right now: its pid then names
 * it alone, so matching the pid is enough and fewer /proc reads are made.
 *
 * Returns 0 for yes, -EPERM for no, -EACCES when CALLER_TID is 0,
 * -ESRCH when the caller vanished.
 */
int lockfs_holder_may_release(const struct lockfs_proc_source *src, pid_t caller_tid,
			      pid_t holder_pid, unsigned long long holder_start,
			      bool holder_alive)
	__attribute__((warn_unused_result));

#endif
