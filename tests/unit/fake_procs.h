/*
 * A made-up process table behind struct lockfs_proc_source, for unit tests
 * that must not depend on the machine's /proc: a small fixed world (an
 * interactive login, helpers, sudo, orphans, a container; see fake_procs.c),
 * rows a test adds, and processes a test makes exit.
 *
 * Locking: every function may be called from any thread (the engine's
 * liveness thread opens pidfds while a test makes processes exit); one
 * mutex inside fake_procs.c guards the table's changing state.
 */
#ifndef LOCKFS_TESTS_FAKE_PROCS_H
#define LOCKFS_TESTS_FAKE_PROCS_H

#include <limits.h>
#include <stdbool.h>
#include <sys/types.h>

#include "lockfs/holder.h"

/* What file a fake process runs (see the exe_stat of fake_procs.c). */
enum fake_file {
	FAKE_FILE_GENUINE = 0,     /* the system's copy of its exe name */
	FAKE_FILE_GENUINE_SETUID,  /* the same, set-uid root (sudo) */
	FAKE_FILE_COPY,            /* a copy elsewhere (a user's ~/bin/NAME) */
	FAKE_FILE_COPY_SETUID,     /* a set-uid root file that is not the system's copy */
	FAKE_FILE_IN_ROOT,         /* a real file in fake_procs_root_dir (a container's root) */
};

/* fake_proc.uid: 0 means the default uid 1000, FAKE_UID_ROOT means 0. */
#define FAKE_UID_ROOT (-1)

struct fake_proc {
	pid_t pid, ppid, sid;
	unsigned long long start;
	const char *exe;
	enum fake_file file;
	int uid;               /* 0: the default 1000; FAKE_UID_ROOT: 0 */
	const char *multicall; /* "busybox" for an applet of it */
	const char *path;      /* FAKE_FILE_IN_ROOT: the file under fake_procs_root_dir */
	const char *slug;      /* its LOCKFS_SLUG, or NULL */
};

/* The device of every made-up file: no real file system has it. */
#define FAKE_PROCS_DEV ((dev_t)0xfff00fffULL)

/* The source: read_tid, exe_stat, open_root, read_ns, pidfd_open,
 * cmdline, getenv, start_time and env_exists all answer from the table. */
extern const struct lockfs_proc_source fake_procs_source;

/* How many times read_tid ran (a test resets it to check a walk's length). */
extern int fake_procs_reads;

/* The root directory of the fake container (a real temporary tree the test
 * makes), or "" when there is none. */
extern char fake_procs_root_dir[PATH_MAX];

/* The made-up inode of the system's copy of NAME (on FAKE_PROCS_DEV). */
ino_t fake_procs_name_ino(const char *name);

/* The live row of TID (a thread id maps to its process), or NULL when no
 * such process exists or it has exited. */
const struct fake_proc *fake_procs_find(pid_t tid);

/* The read_tid of fake_procs_source, for a test that builds a source with
 * fewer functions.  With LOCKFS_PROC_PIDFD in WANT, *OUT carries a fake
 * pidfd (the caller closes it).  0, or -ENOENT for a pid that does not (or
 * no longer) exist. */
int fake_procs_read_tid(void *ctx, pid_t tid, unsigned want, struct lockfs_proc *out);

/* Add ROW (copied; its strings must outlive the test) to the world.  0, or
 * -EEXIST for a pid already live, -ENOSPC when the table is full. */
int fake_procs_add(const struct fake_proc *row);

/* PID exits: every pidfd opened on it becomes readable, and from then on it
 * is gone (read_tid -ENOENT, pidfd_open -ESRCH).  0, or -ESRCH when PID is
 * not a live process of the table. */
int fake_procs_exit(pid_t pid);

/* Back to the fixed world: added rows and exits forgotten, the write ends of
 * the pidfd pipes closed, fake_procs_reads = 0.  (The read ends belong to
 * whoever opened them.) */
void fake_procs_reset(void);

#endif
