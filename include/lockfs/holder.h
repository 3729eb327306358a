/* Who is asking: processes as /proc describes them, and the holder rule. */
#ifndef LOCKFS_HOLDER_H
#define LOCKFS_HOLDER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Longest `container` id kept: a 64-hex id, or an lxc/nspawn name. */
#define LOCKFS_CONTAINER_MAX 128

/* One process (thread group) as /proc describes it. */
struct lockfs_proc {
	pid_t pid;    /* thread-group id (Tgid) */
	pid_t ppid;   /* parent's thread-group id; 0 for none */
	pid_t sid;    /* session id (NSsid, outermost) */
	uid_t uid;    /* effective uid; valid when have_ids */
	gid_t gid;    /* effective gid; valid when have_ids */
	bool have_ids;
	/* A pidfd opened BEFORE the facts above were read (LOCKFS_PROC_PIDFD):
	 * if PID changed hands in between, it names the old, dead process
	 * and reads as exited -- never a stranger.  Valid when has_pidfd;
	 * the receiver closes it. */
	bool has_pidfd;
	int pidfd;
	unsigned long long start_time; /* /proc/PID/stat field 22 */
	char comm[64];                 /* /proc/PID/stat comm, without ( ) */
	/* basename of /proc/PID/exe; for busybox/toybox the applet name
	 * (basename of argv[0]); "" when unreadable (kernel thread, gone)
	 * or not asked for */
	char exe[256];
	/* "busybox", "toybox" or "coreutils" when exe names an applet of
	 * that binary, else "": the file a genuine applet must be. */
	char multicall[16];
	/* Set by lockfs_holder_resolve() on the holder it returns: this
	 * process is a genuine helper, but its parent runs as another uid, so
	 * the walk stopped here (holder.md, "The uid boundary"). */
	bool at_uid_boundary;
	/* LOCKFS_PROC_NS: the pid in its own innermost pid namespace (the last
	 * field of NSpid), 0 when unknown; and the container its cgroup path
	 * names, "" for none. */
	pid_t ns_pid;
	char container[LOCKFS_CONTAINER_MAX];
};

/* What read_tid() must fill besides pid, ppid, sid, start_time and comm
 * (a source may fill more than asked). */
#define LOCKFS_PROC_EXE 0x1 /* exe */
#define LOCKFS_PROC_IDS 0x2 /* uid, gid, have_ids */
#define LOCKFS_PROC_PIDFD 0x4 /* pidfd, has_pidfd (a source may not) */
/* For lockfs_holder_resolve() only: fill the holder's ns_pid and container
 * (through read_ns; never asked of read_tid). */
#define LOCKFS_PROC_NS 0x8

/* "The caller's uid is not known: read it from /proc." */
#define LOCKFS_UID_UNKNOWN ((uid_t)-1)

/* Close P's pidfd, if it has one. */
void lockfs_proc_put(struct lockfs_proc *p);

/*
 * Where process facts come from: /proc in the daemon, a fake table in the
 * unit tests.  read_tid() describes the thread group that thread TID
 * belongs to (TID may be a thread id or a thread-group id), filling at
 * least what WANT (LOCKFS_PROC_* bits) asks for: every /proc read costs
 * microseconds on the path of every mkdir and rmdir.
 * Returns 0, or -ENOENT when there is no such thread/process, or -errno.
 *
 * The other three are asked only when they matter, and a source may leave
 * any of them NULL (then no helper is genuine, or no namespace is known):
 * - exe_stat(): stat(2) of the file process PID runs (/proc/PID/exe).
 *   0 or -errno.
 * - open_root(): an O_PATH descriptor of PID's root directory
 *   (/proc/PID/root), which the caller closes; or -errno.
 * - read_ns(): fill ns_pid and container of *P, the process P->pid that
 *   started at P->start_time.  0 or -errno.
 *
 * The last five answer what the engine asks of processes besides the
 * holder rule; each NULL means the real /proc (and the kernel), so that
 * a test's source gives only what it fakes.  Reach them through the
 * lockfs_procs_* functions below, which pick the real one for NULL:
 * - pidfd_open(): a pidfd of thread group PID, or -errno.
 * - cmdline(), getenv(), start_time(), env_exists(): as
 *   lockfs_proc_cmdline(), lockfs_proc_getenv(), lockfs_proc_start_time()
 *   and lockfs_proc_env_exists().
 */
struct lockfs_proc_source {
	int (*read_tid)(void *ctx, pid_t tid, unsigned want, struct lockfs_proc *out);
	void *ctx;
	int (*exe_stat)(void *ctx, pid_t pid, struct stat *st);
	int (*open_root)(void *ctx, pid_t pid);
	int (*read_ns)(void *ctx, pid_t pid, struct lockfs_proc *p);
	int (*pidfd_open)(void *ctx, pid_t pid);
	int (*cmdline)(void *ctx, pid_t pid, size_t max_bytes, char ***argv);
	int (*getenv)(void *ctx, pid_t pid, const char *var, char *buf, size_t size);
	int (*start_time)(void *ctx, pid_t pid, unsigned long long *start);
	int (*env_exists)(void *ctx, uid_t uid, const char *var, const char *value,
			  pid_t *pid);
};

/* The real source, reading /proc of the daemon's mount namespace. */
extern const struct lockfs_proc_source lockfs_proc_real;

/* The default helper list (mount option `helpers=`, ':'-separated). */
#define LOCKFS_DEFAULT_HELPERS \
	"mkdir:rmdir:flock:timeout:sudo:xargs:env:nice:nohup:stdbuf:lockctl"

struct lockfs_genuine; /* holder.c: the files each helper name may be */

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
 * The container id that a /proc/PID/cgroup text names, into OUT (SIZE
 * bytes): the innermost path component that podman (libpod-ID.scope,
 * libpod-conmon-ID.scope, libpod_parent/libpod-ID), docker (docker-ID.scope,
 * /docker/ID), containerd (cri-containerd-ID.scope), cri-o (crio-ID.scope,
 * crio-conmon-ID.scope) or kubernetes (a bare 64-hex component) names by a
 * 64-hex id, or lxc (lxc.payload.NAME, /lxc/NAME) or systemd-nspawn
 * (machine-NAME.scope, systemd-nspawn@NAME.service) by name.  The unified
 * (0::) line is looked at first.  Returns 1 when found, 0 when the text
 * names no container (OUT = "").
 */
int lockfs_container_of_cgroup(const char *text, char *out, size_t size);

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
 * helper's uid (a genuine `sudo`).
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

/*
 * Read the NUL-separated argv of PID into a malloc'd NULL-terminated array
 * (at most MAX_BYTES of it).  Returns 0 or -errno; an empty cmdline (kernel
 * thread, zombie) gives an empty array.
 */
int lockfs_proc_cmdline(pid_t pid, size_t max_bytes, char ***argv)
	__attribute__((warn_unused_result));
void lockfs_argv_free(char **argv);

/*
 * Look up VAR in the environment PID was exec'd with (/proc/PID/environ).
 * Copies the value into BUF.  Returns its length, -ENOENT when unset,
 * -ENAMETOOLONG when it does not fit, or -errno.
 */
int lockfs_proc_getenv(pid_t pid, const char *var, char *buf, size_t size);

/* The start time (/proc/PID/stat field 22) of thread group PID.
 * Returns 0, -ENOENT when there is no such process, or -errno. */
int lockfs_proc_start_time(pid_t pid, unsigned long long *start);

/*
 * Does any process with effective uid UID have VAR=VALUE in the
 * environment it was exec'd with?  Scans /proc (pid 1 excepted: init runs
 * nobody's commands).  Returns 1 (yes, and the first such pid in *PID),
 * 0 (no), or -errno when /proc, or the environment of some process of
 * UID, cannot be read -- the caller must then treat the answer as
 * unknown, not as "no".
 */
int lockfs_proc_env_exists(uid_t uid, const char *var, const char *value, pid_t *pid);

/* SRC's answer (NULL: lockfs_proc_real's), or the real one when SRC
 * leaves that function NULL.  Returns what the function does. */
int lockfs_procs_pidfd_open(const struct lockfs_proc_source *src, pid_t pid);
int lockfs_procs_cmdline(const struct lockfs_proc_source *src, pid_t pid, size_t max_bytes,
			 char ***argv) __attribute__((warn_unused_result));
int lockfs_procs_getenv(const struct lockfs_proc_source *src, pid_t pid, const char *var,
			char *buf, size_t size);
int lockfs_procs_start_time(const struct lockfs_proc_source *src, pid_t pid,
			    unsigned long long *start);
int lockfs_procs_env_exists(const struct lockfs_proc_source *src, uid_t uid, const char *var,
			    const char *value, pid_t *pid);

/* Read /proc/sys/kernel/random/boot_id (36 chars) into BUF.  0 or -errno. */
int lockfs_boot_id(char buf[40]);

#endif
