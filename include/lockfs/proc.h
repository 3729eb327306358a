/*
 * Processes as /proc describes them: the facts lockfs reads, where they
 * come from (struct lockfs_proc_source), and two families of functions:
 * - lockfs_procfs_*: the real /proc, always (procfs.c);
 * - lockfs_proc_source_*: ask a source, which may be a test's fake table
 *   (proc_source.c); the real /proc where it gives no function.
 */
#ifndef LOCKFS_PROC_H
#define LOCKFS_PROC_H

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
	/* Set by lockfs_holder_resolve() on the holder it returns: this
	 * process is a genuine helper, but its parent is outside its pid
	 * namespace (or outside the daemon's: its ppid reads 0), so the walk
	 * stopped here (holder.md, "The pid namespace boundary"). */
	bool at_pidns_boundary;
	/* LOCKFS_PROC_NS: the pid in its own innermost pid namespace (the last
	 * field of NSpid), 0 when unknown; and its container: "" in the
	 * daemon's own pid namespace, else the id its cgroup path names below
	 * the daemon's own cgroup, else "pidns:INODE" of its pid namespace. */
	pid_t ns_pid;
	char container[LOCKFS_CONTAINER_MAX];
};

/* What lockfs reads of one line of /proc/PID/stat (or of a thread's,
 * /proc/PID/task/TID/stat).  Fields are counted after the last ')', as the
 * comm may hold spaces and parentheses. */
struct lockfs_proc_stat {
	char comm[64];                 /* field 2, without ( ), cut short */
	char state;                    /* field 3: 'R', 'S', 'D', 'Z', 'X', ... */
	pid_t ppid;                    /* field 4 */
	pid_t sid;                     /* field 6, in /proc's pid namespace */
	long threads;                  /* field 20 */
	unsigned long long start_time; /* field 22 */
	/* field 38 (exit_signal) is not -1: a thread-group leader, not a
	 * thread made with CLONE_THREAD */
	bool leader;
};

/* Parse the text of a /proc/PID/stat into *OUT.  0, or -EIO when it is not
 * one (a field up to 38 missing or not a number). */
int lockfs_proc_stat_parse(const char *text, struct lockfs_proc_stat *out);

/*
 * Read and parse /proc/PID/stat, or /proc/PID/task/TID/stat when TID > 0
 * (the one /proc/PID/stat reader of the daemon).  Returns 0, -ENOENT when
 * there is no such process or thread (or it exited while read), -EIO, or
 * -errno.
 */
int lockfs_procfs_stat(pid_t pid, pid_t tid, struct lockfs_proc_stat *out);

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
 * The other four are asked only when they matter, and a source may leave
 * any of them NULL (then no helper is genuine, or no namespace is known):
 * - exe_stat(): stat(2) of the file process PID runs (/proc/PID/exe).
 *   0 or -errno.
 * - open_root(): an O_PATH descriptor of PID's root directory
 *   (/proc/PID/root), which the caller closes; or -errno.
 * - read_ns(): fill ns_pid and container of *P, the process P->pid that
 *   started at P->start_time (0: not known; then P->pid may be a thread id
 *   of a caller waiting in its request, and nothing is remembered of it).
 *   0 or -errno.
 * - pidns(): the identity of the pid namespace of process PID, which
 *   started at START_TIME, into *NS (the inode of /proc/PID/ns/pid): two
 *   processes are in one pid namespace when they have the same.  0,
 *   -ENOENT when PID is gone, or -errno (-EACCES: not ours to look at).
 *   NULL: every process is taken to be in one pid namespace.
 *
 * The last five answer what the engine asks of processes besides the
 * holder rule; each NULL means the real /proc (and the kernel), so that
 * a test's source gives only what it fakes.  Reach them through the
 * lockfs_proc_source_* functions below, which pick the real one for NULL:
 * - pidfd_open(): a pidfd of thread group PID, or -errno.
 * - cmdline(), getenv(), start_time(), env_exists(): as
 *   lockfs_procfs_cmdline(), lockfs_procfs_getenv(), lockfs_procfs_start_time()
 *   and lockfs_procfs_env_exists().
 */
struct lockfs_proc_source {
	int (*read_tid)(void *ctx, pid_t tid, unsigned want, struct lockfs_proc *out);
	void *ctx;
	int (*exe_stat)(void *ctx, pid_t pid, struct stat *st);
	int (*open_root)(void *ctx, pid_t pid);
	int (*read_ns)(void *ctx, pid_t pid, struct lockfs_proc *p);
	int (*pidns)(void *ctx, pid_t pid, unsigned long long start_time, unsigned long long *ns);
	int (*pidfd_open)(void *ctx, pid_t pid);
	int (*cmdline)(void *ctx, pid_t pid, size_t max_bytes, char ***argv);
	int (*getenv)(void *ctx, pid_t pid, const char *var, char *buf, size_t size);
	int (*start_time)(void *ctx, pid_t pid, unsigned long long *start);
	int (*env_exists)(void *ctx, uid_t uid, const char *var, const char *value,
			  pid_t *pid);
};

/* The real source, reading /proc of the daemon's mount namespace: what the
 * lockfs_procfs_* functions read. */
extern const struct lockfs_proc_source lockfs_procfs_source;

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
 * The same, seen from a process whose own /proc/self/cgroup text is OWN
 * (the daemon's; NULL: from the root): in each hierarchy, a path at or
 * below OWN's path for that hierarchy is read from below it, so the
 * container OWN is in names nobody and one started inside it is named by
 * its own id (docs/holder.md, "The daemon in a container").
 */
int lockfs_container_of_cgroup_under(const char *text, const char *own, char *out, size_t size);

/*
 * Read the NUL-separated argv of PID into a malloc'd NULL-terminated array
 * (at most MAX_BYTES of it).  Returns 0 or -errno; an empty cmdline (kernel
 * thread, zombie) gives an empty array.
 */
int lockfs_procfs_cmdline(pid_t pid, size_t max_bytes, char ***argv)
	__attribute__((warn_unused_result));
void lockfs_argv_free(char **argv);
/* A copy of ARGV (NULL-terminated; NULL: an empty one), or NULL when out
 * of memory. */
char **lockfs_argv_dup(char *const *argv);

/*
 * Look up VAR in the environment PID was exec'd with (/proc/PID/environ).
 * Copies the value into BUF.  Returns its length, -ENOENT when unset,
 * -ENAMETOOLONG when it does not fit, or -errno.
 */
int lockfs_procfs_getenv(pid_t pid, const char *var, char *buf, size_t size);

/* The start time (/proc/PID/stat field 22) of thread group PID.
 * Returns 0, -ENOENT when there is no such process, or -errno. */
int lockfs_procfs_start_time(pid_t pid, unsigned long long *start);

/*
 * Does any process with effective uid UID have VAR=VALUE in the
 * environment it was exec'd with?  Scans /proc (pid 1 excepted: init runs
 * nobody's commands).  Returns 1 (yes, and the first such pid in *PID),
 * 0 (no), or -errno when /proc, or the environment of some process of
 * UID, cannot be read -- the caller must then treat the answer as
 * unknown, not as "no".
 */
int lockfs_procfs_env_exists(uid_t uid, const char *var, const char *value, pid_t *pid);

/* SRC's answer (NULL: lockfs_procfs_source's), or the real one when SRC
 * leaves that function NULL.  Returns what the function does. */
int lockfs_proc_source_pidfd_open(const struct lockfs_proc_source *src, pid_t pid);
int lockfs_proc_source_cmdline(const struct lockfs_proc_source *src, pid_t pid,
			       size_t max_bytes, char ***argv) __attribute__((warn_unused_result));
int lockfs_proc_source_getenv(const struct lockfs_proc_source *src, pid_t pid, const char *var,
			      char *buf, size_t size);
int lockfs_proc_source_start_time(const struct lockfs_proc_source *src, pid_t pid,
				  unsigned long long *start);
int lockfs_proc_source_env_exists(const struct lockfs_proc_source *src, uid_t uid,
				  const char *var, const char *value, pid_t *pid);

/* Read /proc/sys/kernel/random/boot_id (36 chars) into BUF.  0 or -errno. */
int lockfs_procfs_boot_id(char buf[40]);

#endif
