/*
 * Who is asking: processes as /proc describes them, the helper list and the
 * holder rule (see include/lockfs/holder.h).
 *
 * lockfs_holder_resolve() runs on every mkdir and may_release() on every
 * rmdir, so describing a process costs as few /proc reads as the question
 * needs: stat always (parent, session, start time, comm, and whether the
 * id is a thread-group leader), the exe link only where helpers are
 * skipped (plus comm or cmdline for busybox/toybox, whose exe says nothing), and
 * status -- the dearest file, ~10 us -- only for a non-leader thread's
 * Tgid or where uid and gid are asked for.
 *
 * A helper is skipped only when it is genuine: the very file (device and
 * inode) that its name stands for in the system directories of its root.
 * The daemon's own root is looked up once and cached, so a genuine helper
 * costs one stat(2) of /proc/PID/exe; a miss looks again (a package
 * upgrade replaces the file), and a process in another root (a container)
 * is looked up in that root, through /proc/PID/root.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lockfs/holder.h"
#include "helper_files.h"

/* Longest parent walk; a real process tree is never this deep, so hitting
 * it means a cycle in the source (pid reuse in a fake or a racing /proc). */
#define WALK_MAX 4096

/* Largest /proc/PID/environ we look through. */
#define ENVIRON_MAX (1024 * 1024)

/* Map an errno from reading /proc to ours: a process that exits between
 * open and read makes read fail with ESRCH; to callers that is "gone". */
static int proc_errno(int e)
{
	return e == ESRCH ? -ENOENT : -e;
}

/*
 * Read up to SIZE - 1 bytes of PATH into BUF and NUL-terminate it.
 * Returns the number of bytes read, or -errno.
 */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return proc_errno(errno);
	size_t len = 0;
	while (len + 1 < size) {
		ssize_t n = read(fd, buf + len, size - 1 - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			int rc = proc_errno(errno);
			close(fd);
			return rc;
		}
		len += (size_t)n;
		/* /proc files are produced whole on the first read: a short
		 * read is the end, and one more read(2) would only say so. */
		if (n == 0 || len + 1 < size)
			break;
	}
	close(fd);
	buf[len] = '\0';
	return (ssize_t)len;
}

/*
 * Read up to MAX bytes of PATH into a malloc'd buffer (*OUT, *LEN), with a
 * NUL after the data.  *TRUNCATED tells whether the file had more.
 * Returns 0 or -errno.
 */
static int read_all(const char *path, size_t max, char **out, size_t *len,
		    bool *truncated)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return proc_errno(errno);
	size_t cap = max < 4096 ? max : 4096;
	size_t used = 0;
	char *buf = malloc(cap + 1);
	int rc = 0;
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	*truncated = false;
	for (;;) {
		if (used == cap) {
			if (cap >= max) {
				/* Full: is there more? One byte tells. */
				char c;
				ssize_t n;
				do
					n = read(fd, &c, 1);
				while (n < 0 && errno == EINTR);
				*truncated = n > 0;
				break;
			}
			size_t ncap = cap * 2 > max ? max : cap * 2;
			char *nbuf = realloc(buf, ncap + 1);
			if (!nbuf) {
				rc = -ENOMEM;
				break;
			}
			buf = nbuf;
			cap = ncap;
		}
		ssize_t n = read(fd, buf + used, cap - used);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = proc_errno(errno);
			break;
		}
		if (n == 0)
			break;
		used += (size_t)n;
		/* cmdline and environ come whole from one read when they fit
		 * (the kernel copies up to the buffer); a short read is the end. */
		if (used < cap)
			break;
	}
	close(fd);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	buf[used] = '\0';
	*out = buf;
	*len = used;
	return 0;
}

/* Parse a decimal number at S (leading blanks allowed) into *OUT; set *END
 * past it.  Returns 0, or -EINVAL when there is no number. */
static int parse_ull(const char *s, char **end, unsigned long long *out)
{
	while (*s == ' ' || *s == '\t')
		s++;
	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	*out = strtoull(s, end, 10);
	return errno ? -EINVAL : 0;
}

/* The value after "KEY:" in a /proc status text, or NULL. */
static const char *status_field(const char *text, const char *key)
{
	size_t klen = strlen(key);
	for (const char *line = text; line && *line; ) {
		if (strncmp(line, key, klen) == 0 && line[klen] == ':')
			return line + klen + 1;
		line = strchr(line, '\n');
		if (line)
			line++;
	}
	return NULL;
}

/* The INDEXth (0-based) number after "KEY:"; 0 or -EINVAL. */
static int status_num(const char *text, const char *key, int index,
		      unsigned long long *out)
{
	const char *p = status_field(text, key);
	if (!p)
		return -EINVAL;
	for (int i = 0; ; i++) {
		char *end;
		if (parse_ull(p, &end, out) < 0)
			return -EINVAL;
		if (i == index)
			return 0;
		p = end;
	}
}

/*
 * Fill PID, PPID, UID and GID of *OUT from /proc/TID/status.  Everything
 * needed comes before "Groups:", so the first 4 KiB is enough even for a
 * process with thousands of supplementary groups.  Returns 0 or -errno.
 */
static int read_status(pid_t tid, struct lockfs_proc *out)
{
	char path[64], buf[4096];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)tid);
	ssize_t n = read_small(path, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	unsigned long long tgid, ppid, uid, gid;
	if (status_num(buf, "Tgid", 0, &tgid) < 0 ||
	    status_num(buf, "PPid", 0, &ppid) < 0 ||
	    status_num(buf, "Uid", 1, &uid) < 0 ||
	    status_num(buf, "Gid", 1, &gid) < 0)
		return -EIO;
	if (tgid == 0 || tgid > INT_MAX || ppid > INT_MAX)
		return -EIO;
	out->pid = (pid_t)tgid;
	out->ppid = (pid_t)ppid;
	out->uid = (uid_t)uid;
	out->gid = (gid_t)gid;
	return 0;
}

/*
 * Fill PPID, SID, START_TIME and COMM of *OUT from /proc/PID/stat, and
 * tell through *LEADER whether PID leads its thread group: a thread made
 * with CLONE_THREAD has exit_signal (field 38) -1, a leader never does.
 * The comm may hold spaces and parentheses, so fields are counted after
 * the last ')'.  The session here is the one in /proc's pid namespace,
 * i.e. the outermost NSsid.  Returns 0 or -errno.
 */
static int read_stat(pid_t pid, struct lockfs_proc *out, bool *leader)
{
	char path[64], buf[2048];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	ssize_t n = read_small(path, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	char *open_paren = strchr(buf, '(');
	char *close_paren = strrchr(buf, ')');
	if (!open_paren || !close_paren || close_paren < open_paren)
		return -EIO;
	size_t clen = (size_t)(close_paren - open_paren - 1);
	if (clen >= sizeof(out->comm))
		clen = sizeof(out->comm) - 1;
	memcpy(out->comm, open_paren + 1, clen);
	out->comm[clen] = '\0';

	/* Field 3 (state) starts after ") "; walk to fields 4, 6, 22, 38. */
	const char *p = close_paren + 1;
	unsigned long long ppid = 0, session = 0, start = 0;
	*leader = true;
	for (int field = 3; field <= 38; field++) {
		while (*p == ' ')
			p++;
		if (!*p)
			return -EIO;
		if (field == 4 || field == 6 || field == 22) {
			char *end;
			if (parse_ull(p, &end, field == 4 ? &ppid :
				      field == 6 ? &session : &start) < 0)
				return -EIO;
		}
		if (field == 38)
			*leader = strncmp(p, "-1 ", 3) != 0;
		while (*p && *p != ' ')
			p++;
	}
	if (session > INT_MAX || ppid > INT_MAX)
		return -EIO;
	out->pid = pid;
	out->ppid = (pid_t)ppid;
	out->sid = (pid_t)session;
	out->start_time = start;
	return 0;
}

/* Copy SRC into DST (SIZE bytes), cut short if need be. */
static void copy_str(char *dst, size_t size, const char *src)
{
	size_t len = strnlen(src, size - 1);
	memcpy(dst, src, len);
	dst[len] = '\0';
}

/* Multi-call binaries, whose applets are judged by the binary itself:
 * busybox, toybox, and coreutils built as one program (uutils, Fedora's
 * coreutils-single). */
static const char *const multicall_names[] = { "busybox", "toybox", "coreutils" };
#define NMULTI (sizeof(multicall_names) / sizeof(multicall_names[0]))

static bool is_multicall(const char *name)
{
	for (size_t i = 0; i < NMULTI; i++)
		if (strcmp(name, multicall_names[i]) == 0)
			return true;
	return false;
}

static const char *base_name(const char *path)
{
	const char *base = strrchr(path, '/');

	return base ? base + 1 : path;
}

/*
 * The applet a multi-call binary (PID, whose stat gave COMM) runs, into
 * BUF; BUF is left alone when nothing tells.  Busybox's shell runs some
 * applets in a forked child without exec: the shell's argv stays and only
 * comm names the applet.  Otherwise argv[0] names it (a symlink, where comm
 * says the same), or argv[1] after an explicit `busybox APPLET`.
 */
static void read_applet(pid_t pid, const char *comm, char *buf, size_t size)
{
	char path[64], cmd[512];
	const char *base;
	ssize_t n;

	if (*comm && !is_multicall(comm)) {
		snprintf(buf, size, "%s", comm);
		return;
	}
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	n = read_small(path, cmd, sizeof(cmd));
	if (n <= 0)
		return;
	/* read_small NUL-terminated it: cmd is argv[0] (maybe cut short) */
	base = base_name(cmd);
	if (is_multicall(base) && strlen(cmd) + 1 < (size_t)n)
		base = base_name(cmd + strlen(cmd) + 1);
	if (*base)
		copy_str(buf, size, base);
}

/* Fill EXE of *OUT from /proc/PID/exe: its basename, "" when unreadable
 * (kernel threads and zombies have none). */
static void read_exe(pid_t pid, struct lockfs_proc *out)
{
	static const char deleted[] = " (deleted)";
	char path[64], target[PATH_MAX];
	out->exe[0] = '\0';
	snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
	ssize_t n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0)
		return;
	target[n] = '\0';
	size_t dlen = sizeof(deleted) - 1;
	if ((size_t)n > dlen && strcmp(target + n - dlen, deleted) == 0)
		target[n - dlen] = '\0';
	const char *base = strrchr(target, '/');
	base = base ? base + 1 : target;
	copy_str(out->exe, sizeof(out->exe), base);
	/* A multi-call binary tells what it is running only through argv[0]. */
	if (is_multicall(out->exe)) {
		copy_str(out->multicall, sizeof(out->multicall), out->exe);
		read_applet(pid, out->comm, out->exe, sizeof(out->exe));
	}
}

void lockfs_proc_put(struct lockfs_proc *p)
{
	if (p && p->has_pidfd) {
		close(p->pidfd);
		p->has_pidfd = false;
		p->pidfd = -1;
	}
}

/* pidfd_open(2) of thread group PID, or -1 (not a leader, gone, no fds). */
static int open_pidfd(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* lockfs_proc_source.read_tid on the real /proc. */
static int proc_read_tid(void *ctx, pid_t tid, unsigned want, struct lockfs_proc *out)
{
	(void)ctx;
	if (tid <= 0)
		return -ENOENT;
	struct lockfs_proc p;
	bool leader;
	memset(&p, 0, sizeof(p));
	/* The pidfd first, the facts after: see has_pidfd in holder.h.
	 * (It fails for a thread id; that thread's leader gets one below.) */
	int fd = want & LOCKFS_PROC_PIDFD ? open_pidfd(tid) : -1;
	int rc = read_stat(tid, &p, &leader);
	if (rc < 0)
		goto fail;
	if (!leader || (want & LOCKFS_PROC_IDS)) {
		struct lockfs_proc s = { 0 };
		rc = read_status(tid, &s);
		if (rc < 0)
			goto fail;
		p.uid = s.uid;
		p.gid = s.gid;
		p.have_ids = true;
		/* stat of a non-leader thread has the thread's own start
		 * time: the process is named by its leader's. */
		if (s.pid != tid) {
			if (fd >= 0)
				close(fd);
			fd = want & LOCKFS_PROC_PIDFD ? open_pidfd(s.pid) : -1;
			rc = read_stat(s.pid, &p, &leader);
			if (rc < 0)
				goto fail;
		}
	}
	if (want & LOCKFS_PROC_EXE)
		read_exe(p.pid, &p);
	p.has_pidfd = fd >= 0;
	p.pidfd = fd;
	*out = p;
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	return rc;
}

/* lockfs_proc_source.exe_stat on the real /proc. */
static int proc_exe_stat(void *ctx, pid_t pid, struct stat *st)
{
	char path[64];

	(void)ctx;
	snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
	/* The attributes the kernel has: the file may be on a FUSE file
	 * system of the caller's that never answers a GETATTR. */
	int rc = lockfs_stat_cached(AT_FDCWD, path, st);
	return rc == -ESRCH ? -ENOENT : rc;
}

/* lockfs_proc_source.open_root on the real /proc. */
static int proc_open_root(void *ctx, pid_t pid)
{
	char path[64];
	int fd;

	(void)ctx;
	snprintf(path, sizeof(path), "/proc/%d/root", (int)pid);
	fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	return fd >= 0 ? fd : proc_errno(errno);
}

/* The daemon's own pid namespace, "pid:[INODE]", read once. */
static char own_pidns[64];
static pthread_once_t own_pidns_once = PTHREAD_ONCE_INIT;

static void read_own_pidns(void)
{
	ssize_t n = readlink("/proc/self/ns/pid", own_pidns, sizeof(own_pidns) - 1);

	own_pidns[n > 0 ? n : 0] = '\0';
}

/*
 * Processes lately seen in the daemon's own pid namespace, by (pid, start
 * time): a process's pid namespace never changes, and the same holders (a
 * shell running a script, a program taking lock after lock) come back
 * again and again.  Direct-mapped by pid; protected by same_ns_mu.
 */
#define SAME_NS_SLOTS 256
static struct {
	pid_t pid;
	unsigned long long start;
} same_ns[SAME_NS_SLOTS];
static pthread_mutex_t same_ns_mu = PTHREAD_MUTEX_INITIALIZER;

/*
 * lockfs_proc_source.read_ns on the real /proc.  P->pid is PID and
 * P->start_time its start time.  A process in the daemon's own pid
 * namespace is its own ns_pid and is taken for no container: one readlink
 * the first time it is seen, where status and cgroup would cost ~25 us on
 * every mkdir.  Only a process in another pid namespace (a container's)
 * has both read, every time (its cgroup may change).
 */
static int proc_read_ns(void *ctx, pid_t pid, struct lockfs_proc *p)
{
	char path[64], ns[64], buf[4096];
	size_t slot = (size_t)pid % SAME_NS_SLOTS;
	unsigned long long v;
	bool seen;
	ssize_t n;
	int rc;

	(void)ctx;
	p->ns_pid = 0;
	p->container[0] = '\0';
	pthread_mutex_lock(&same_ns_mu);
	seen = same_ns[slot].pid == pid && same_ns[slot].start == p->start_time;
	pthread_mutex_unlock(&same_ns_mu);
	if (seen) {
		p->ns_pid = pid;
		return 0;
	}
	pthread_once(&own_pidns_once, read_own_pidns);
	snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
	n = readlink(path, ns, sizeof(ns) - 1);
	if (n <= 0)
		return proc_errno(errno);
	ns[n] = '\0';
	if (own_pidns[0] && strcmp(ns, own_pidns) == 0) {
		p->ns_pid = pid;
		pthread_mutex_lock(&same_ns_mu);
		same_ns[slot].pid = pid;
		same_ns[slot].start = p->start_time;
		pthread_mutex_unlock(&same_ns_mu);
		return 0;
	}
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	n = read_small(path, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	/* NSpid lists the pid in every namespace, outermost first. */
	for (int i = 0; (rc = status_num(buf, "NSpid", i, &v)) == 0; i++)
		if (v > 0 && v <= INT_MAX)
			p->ns_pid = (pid_t)v;
	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	n = read_small(path, buf, sizeof(buf));
	if (n > 0)
		lockfs_container_of_cgroup(buf, p->container, sizeof(p->container));
	return 0;
}

const struct lockfs_proc_source lockfs_proc_real = {
	.read_tid = proc_read_tid,
	.ctx = NULL,
	.exe_stat = proc_exe_stat,
	.open_root = proc_open_root,
	.read_ns = proc_read_ns,
};

/* ---- genuine helpers ------------------------------------------------ */

/* Most distinct files one name may be (system_dirs, plus the lockctl
 * beside the daemon). */
#define FILES_MAX 8
/* Most files tests may add per name (lockfs_helpers_trust_file). */
#define TRUSTED_MAX 4

/* The genuine files of one name. */
struct genuine_set {
	struct lockfs_file_id found[FILES_MAX];   /* looked up in the daemon's root */
	size_t nfound;
	struct lockfs_file_id trusted[TRUSTED_MAX]; /* added by lockfs_helpers_trust_file */
	size_t ntrusted;
};

struct lockfs_genuine {
	int rootfd;          /* O_PATH of the daemon's "/" */
	struct stat root;    /* its fstat: id and owner */
	char *self_dir;      /* the directory of the daemon's executable, or NULL */
	size_t nnames;       /* helpers; then NMULTI multi-call binaries */
	struct genuine_set *sets;
};

/* The lockctl that came with the daemon: beside its executable (as
 * installed) or in tools/ below it (as meson builds it), when that
 * directory is trusted as the daemon's: owned by root or by the daemon's
 * user, and writable by nobody else.  Adds what it finds to SET. */
static void find_beside_daemon(struct lockfs_genuine *g, struct genuine_set *set)
{
	static const char *const where[] = { ".", "tools" };

	for (size_t i = 0; g->self_dir && i < sizeof(where) / sizeof(where[0]); i++) {
		char path[PATH_MAX];
		struct stat st;
		int dirfd, fd;

		if ((size_t)snprintf(path, sizeof(path), "%s/%s", g->self_dir, where[i]) >=
		    sizeof(path))
			continue;
		dirfd = open(path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (dirfd < 0)
			continue;
		fd = openat(dirfd, "lockctl", O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0 && lockfs_helper_file_trusted(fd, dirfd, &g->root, geteuid(), &st))
			set->nfound = lockfs_file_ids_add(set->found, set->nfound, FILES_MAX,
							  st.st_dev, st.st_ino);
		if (fd >= 0)
			close(fd);
		close(dirfd);
	}
}

/* Name I of the set (a helper, or a multi-call binary). */
static const char *set_name(const struct lockfs_helpers *h, size_t i)
{
	return i < h->genuine->nnames ? h->names[i] : multicall_names[i - h->genuine->nnames];
}

/* Look set I's files up in the daemon's root, into *SET (its found
 * files only).  Reads only what never changes after parse (rootfd, root,
 * self_dir, the names), so it needs no lock. */
static void lookup_set(const struct lockfs_helpers *h, size_t i, struct genuine_set *set)
{
	struct lockfs_genuine *g = h->genuine;
	const char *name = set_name(h, i);

	set->nfound = g->rootfd >= 0 ? lockfs_helper_files_find(g->rootfd, &g->root, name,
								set->found, FILES_MAX, NULL) : 0;
	if (strcmp(name, "lockctl") == 0)
		find_beside_daemon(g, set);
}

/* The index of NAME's set, or -1. */
static long set_index(const struct lockfs_helpers *h, const char *name)
{
	size_t total = h->genuine ? h->genuine->nnames + NMULTI : 0;

	for (size_t i = 0; i < total; i++)
		if (strcmp(set_name(h, i), name) == 0)
			return (long)i;
	return -1;
}

static bool in_set(const struct genuine_set *set, const struct stat *st)
{
	for (size_t i = 0; i < set->nfound; i++)
		if (set->found[i].dev == st->st_dev && set->found[i].ino == st->st_ino)
			return true;
	for (size_t i = 0; i < set->ntrusted; i++)
		if (set->trusted[i].dev == st->st_dev && set->trusted[i].ino == st->st_ino)
			return true;
	return false;
}

/*
 * Is process P, of uid UID, running the genuine file of helper P->exe (for
 * an applet, of its multi-call binary)?  *EXE gets the file's stat.  The
 * daemon's cached files first (one stat); on a miss, the files are looked
 * up again in P's root: the daemon's (and the cache refreshed) or another
 * (a container's, a user's chroot), off the request path within a bound
 * (helper_files.c says why).  Nothing here asks a file system for fresh
 * attributes: P's executable and root may be on a FUSE file system of the
 * caller's that never answers.
 * Returns 1 (genuine), 0 (not), or -EACCES: P's root did not answer in
 * time, so nobody can say.
 */
static int genuine_helper(const struct lockfs_proc_source *src, struct lockfs_helpers *h,
			  const struct lockfs_proc *p, uid_t uid, struct stat *exe)
{
	const char *name = p->multicall[0] ? p->multicall : p->exe;
	long i = set_index(h, name);
	struct stat root;
	int ok, rootfd;

	if (i < 0 || !src->exe_stat || src->exe_stat(src->ctx, p->pid, exe) < 0)
		return 0;
	pthread_mutex_lock(&h->mu);
	ok = in_set(&h->genuine->sets[i], exe);
	pthread_mutex_unlock(&h->mu);
	if (ok || !src->open_root)
		return ok;
	rootfd = src->open_root(src->ctx, p->pid);
	if (rootfd < 0)
		return 0;
	if (lockfs_stat_cached(rootfd, "", &root) == 0) {
		if (root.st_dev == h->genuine->root.st_dev &&
		    root.st_ino == h->genuine->root.st_ino) {
			/* Look again (an upgrade replaces the file), outside
			 * the lock: the other helpers' checks need not wait.
			 * This walks the daemon's own mount namespace, where
			 * only root mounts, whatever namespace P is in. */
			struct genuine_set fresh;
			struct genuine_set *set = &h->genuine->sets[i];

			lookup_set(h, (size_t)i, &fresh);
			pthread_mutex_lock(&h->mu);
			memcpy(set->found, fresh.found, sizeof(set->found));
			set->nfound = fresh.nfound;
			ok = in_set(set, exe);
			pthread_mutex_unlock(&h->mu);
		} else {
			ok = lockfs_helper_files_find_foreign(rootfd, &root, name, exe, uid);
			if (ok < 0)
				ok = -EACCES;
		}
	}
	close(rootfd);
	return ok;
}

void lockfs_helpers_free(struct lockfs_helpers *h)
{
	if (!h || !h->names)
		return;
	for (char **n = h->names; *n; n++)
		free(*n);
	free(h->names);
	h->names = NULL;
	if (h->genuine) {
		if (h->genuine->rootfd >= 0)
			close(h->genuine->rootfd);
		free(h->genuine->self_dir);
		free(h->genuine->sets);
		free(h->genuine);
		h->genuine = NULL;
	}
	pthread_mutex_destroy(&h->mu);
}

/* The directory of the daemon's executable, malloc'd, or NULL. */
static char *self_dir(void)
{
	char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
	char *slash;

	if (n <= 0)
		return NULL;
	path[n] = '\0';
	slash = strrchr(path, '/');
	if (!slash || strstr(path, " (deleted)"))
		return NULL;
	*slash = '\0';
	return strdup(*path ? path : "/");
}

/* Find the genuine files of every name of H (just parsed).  0 or -ENOMEM. */
static int genuine_init(struct lockfs_helpers *h, size_t count)
{
	struct lockfs_genuine *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	g->nnames = count;
	g->sets = calloc(count + NMULTI, sizeof(*g->sets));
	if (!g->sets) {
		free(g);
		return -ENOMEM;
	}
	g->rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (g->rootfd >= 0 && fstat(g->rootfd, &g->root) < 0) {
		close(g->rootfd);
		g->rootfd = -1;
	}
	g->self_dir = self_dir();
	h->genuine = g;
	for (size_t i = 0; i < count + NMULTI; i++)
		lookup_set(h, i, &g->sets[i]); /* nobody else sees H yet */
	return 0;
}

int lockfs_helpers_parse(struct lockfs_helpers *h, const char *list)
{
	memset(h, 0, sizeof(*h));
	if (!list)
		list = LOCKFS_DEFAULT_HELPERS;
	size_t count = 0;
	if (*list) {
		count = 1;
		for (const char *p = list; *p; p++)
			count += *p == ':';
	}
	char **names = calloc(count + 1, sizeof(*names));
	if (!names)
		return -ENOMEM;
	pthread_mutex_init(&h->mu, NULL);
	h->names = names;
	const char *p = list;
	for (size_t i = 0; i < count; i++) {
		const char *end = strchrnul(p, ':');
		size_t len = (size_t)(end - p);
		if (len == 0 || memchr(p, '/', len)) {
			lockfs_helpers_free(h);
			return -EINVAL;
		}
		names[i] = strndup(p, len);
		if (!names[i]) {
			lockfs_helpers_free(h);
			return -ENOMEM;
		}
		p = *end ? end + 1 : end;
	}
	if (genuine_init(h, count) < 0) {
		lockfs_helpers_free(h);
		return -ENOMEM;
	}
	return 0;
}

bool lockfs_helpers_contains(const struct lockfs_helpers *h, const char *exe)
{
	if (!h || !h->names || !exe || !*exe)
		return false;
	for (char **n = h->names; *n; n++)
		if (strcmp(*n, exe) == 0)
			return true;
	return false;
}

int lockfs_helpers_trust_file(struct lockfs_helpers *h, const char *name, dev_t dev,
			      ino_t ino)
{
	long i = set_index(h, name);
	struct genuine_set *set;
	int rc = 0;

	if (i < 0)
		return -ENOENT;
	pthread_mutex_lock(&h->mu);
	set = &h->genuine->sets[i];
	if (set->ntrusted == TRUSTED_MAX)
		rc = -ENOSPC;
	else
		set->ntrusted = lockfs_file_ids_add(set->trusted, set->ntrusted, TRUSTED_MAX, dev,
						     ino);
	pthread_mutex_unlock(&h->mu);
	return rc;
}

/* ---- container ids from cgroup paths --------------------------------- */

static bool is_hex64(const char *s, size_t len)
{
	if (len != 64)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* Does COMP (LEN bytes) start with PREFIX and end with SUFFIX (either may
 * be "")?  Sets *MID, *MIDLEN to what lies between. */
static bool wraps(const char *comp, size_t len, const char *prefix, const char *suffix,
		  const char **mid, size_t *midlen)
{
	size_t pl = strlen(prefix), sl = strlen(suffix);

	if (len <= pl + sl || memcmp(comp, prefix, pl) != 0 ||
	    memcmp(comp + len - sl, suffix, sl) != 0)
		return false;
	*mid = comp + pl;
	*midlen = len - pl - sl;
	return true;
}

/* Copy a systemd unit-name fragment, undoing its \xNN escapes, into OUT.
 * Returns false when it does not fit or holds a control character. */
static bool unescape_unit(const char *s, size_t len, char *out, size_t size)
{
	size_t o = 0;

	for (size_t i = 0; i < len; i++) {
		unsigned c = (unsigned char)s[i];
		unsigned v;

		if (c == '\\' && i + 3 < len && s[i + 1] == 'x' &&
		    sscanf(s + i + 2, "%2x", &v) == 1) {
			c = v;
			i += 3;
		}
		if (c < 0x20 || c == 0x7f || o + 1 >= size)
			return false;
		out[o++] = (char)c;
	}
	out[o] = '\0';
	return o > 0;
}

/*
 * The container that path component COMP (LEN bytes) names, after the
 * component PREV (PLEN bytes; "" at the top), into OUT.  True if found.
 */
static bool container_of_component(const char *prev, size_t plen, const char *comp,
				   size_t len, char *out, size_t size)
{
	/* runtimes that name the container by its 64-hex id */
	static const char *const hex_forms[][2] = {
		{ "libpod-conmon-", ".scope" }, { "libpod-", ".scope" }, { "libpod-", "" },
		{ "docker-", ".scope" }, { "cri-containerd-", ".scope" },
		{ "crio-conmon-", ".scope" }, { "crio-", ".scope" }, { "", "" },
	};
	/* and those that name it by its name */
	static const char *const name_forms[][2] = {
		{ "lxc.payload.", "" }, { "machine-", ".scope" },
		{ "systemd-nspawn@", ".service" },
	};
	const char *mid;
	size_t mlen;

	for (size_t i = 0; i < sizeof(hex_forms) / sizeof(hex_forms[0]); i++) {
		if (wraps(comp, len, hex_forms[i][0], hex_forms[i][1], &mid, &mlen) &&
		    is_hex64(mid, mlen) && mlen < size) {
			memcpy(out, mid, mlen);
			out[mlen] = '\0';
			return true;
		}
	}
	for (size_t i = 0; i < sizeof(name_forms) / sizeof(name_forms[0]); i++)
		if (wraps(comp, len, name_forms[i][0], name_forms[i][1], &mid, &mlen) &&
		    unescape_unit(mid, mlen, out, size))
			return true;
	/* the old lxc layout: /lxc/NAME */
	return plen == 3 && memcmp(prev, "lxc", 3) == 0 && unescape_unit(comp, len, out, size);
}

/* The innermost container the cgroup PATH (LEN bytes) names; true if any. */
static bool container_of_path(const char *path, size_t len, char *out, size_t size)
{
	const char *prev = "", *comp = NULL;
	size_t plen = 0;
	bool found = false;
	char tmp[LOCKFS_CONTAINER_MAX];

	for (size_t i = 0; i <= len; i++) {
		if (i < len && path[i] != '/') {
			if (!comp)
				comp = path + i;
			continue;
		}
		if (comp) {
			size_t clen = (size_t)(path + i - comp);

			if (container_of_component(prev, plen, comp, clen, tmp,
						   size < sizeof(tmp) ? size : sizeof(tmp))) {
				snprintf(out, size, "%s", tmp);
				found = true;
			}
			prev = comp;
			plen = clen;
			comp = NULL;
		}
	}
	return found;
}

int lockfs_container_of_cgroup(const char *text, char *out, size_t size)
{
	/* Pass 0 looks at the unified hierarchy (0::PATH) only, pass 1 at
	 * the v1 controllers. */
	if (size == 0)
		return 0;
	out[0] = '\0';
	for (int pass = 0; pass < 2; pass++) {
		for (const char *line = text; line && *line;) {
			const char *nl = strchrnul(line, '\n');
			const char *c1 = memchr(line, ':', (size_t)(nl - line));
			const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(nl - c1 - 1)) : NULL;
			bool unified = c1 && c2 == c1 + 1 && c1 - line == 1 && line[0] == '0';

			if (c2 && unified == (pass == 0) &&
			    container_of_path(c2 + 1, (size_t)(nl - c2 - 1), out, size))
				return 1;
			line = *nl ? nl + 1 : NULL;
		}
	}
	return 0;
}

/* ---- the holder rule -------------------------------------------------- */

/* Read the thread group of TID; the caller's own absence is -ESRCH. */
static int read_caller(const struct lockfs_proc_source *src, pid_t tid,
		       unsigned want, struct lockfs_proc *out)
{
	int rc = src->read_tid(src->ctx, tid, want, out);
	return rc == -ENOENT ? -ESRCH : rc;
}

/* The effective uid of P: *UID when known, else read (then stored in
 * *UID).  0 or -errno. */
static int uid_of(const struct lockfs_proc_source *src, const struct lockfs_proc *p, uid_t *uid)
{
	struct lockfs_proc tmp;
	int rc;

	if (*uid != LOCKFS_UID_UNKNOWN)
		return 0;
	if (p->have_ids) {
		*uid = p->uid;
		return 0;
	}
	rc = src->read_tid(src->ctx, p->pid, LOCKFS_PROC_IDS, &tmp);
	if (rc < 0)
		return rc;
	lockfs_proc_put(&tmp);
	if (!tmp.have_ids || tmp.pid != p->pid || tmp.start_time != p->start_time)
		return -ENOENT; /* gone, or its pid reused */
	*uid = tmp.uid;
	return 0;
}

int lockfs_holder_resolve(const struct lockfs_proc_source *src, pid_t caller_tid,
			  uid_t caller_uid, struct lockfs_helpers *helpers, unsigned want,
			  struct lockfs_proc *holder)
{
	if (caller_tid <= 0)
		return -EACCES;
	if (!src)
		src = &lockfs_proc_real;
	struct lockfs_proc p, q;
	struct stat exe;
	uid_t uid = caller_uid; /* p's effective uid, or unknown */
	bool ns = want & LOCKFS_PROC_NS;
	want &= LOCKFS_PROC_PIDFD;
	int rc = read_caller(src, caller_tid, LOCKFS_PROC_EXE | want, &p);
	if (rc < 0)
		return rc;
	p.at_uid_boundary = false;
	int steps = 0;
	/* A helper on the list, but only a genuine copy of it: anything else
	 * named so is a program like any other, and holds. */
	while (lockfs_helpers_contains(helpers, p.exe)) {
		/* Whose walk a lookup in P's root is (helper_files.c counts
		 * them per uid): P's uid, read when the caller's is unknown. */
		if (uid == LOCKFS_UID_UNKNOWN && uid_of(src, &p, &uid) < 0)
			uid = LOCKFS_UID_UNKNOWN;
		rc = genuine_helper(src, helpers, &p, uid, &exe);
		if (rc == 0)
			break;
		if (rc < 0)
			goto fail; /* P's root did not answer in time: nobody can say */
		rc = -EACCES;
		if (++steps > WALK_MAX)
			goto fail;
		/* An orphan of init or of nobody has no believable holder. */
		if (p.ppid <= 1)
			goto fail;
		rc = uid_of(src, &p, &uid);
		if (rc < 0) {
			rc = rc == -ENOENT ? (steps == 1 ? -ESRCH : -EACCES) : rc;
			goto fail;
		}
		rc = src->read_tid(src->ctx, p.ppid, LOCKFS_PROC_EXE | LOCKFS_PROC_IDS | want, &q);
		if (rc < 0) {
			if (rc == -ENOENT)
				rc = -EACCES; /* the parent left: cannot establish */
			goto fail;
		}
		/* Believable only if: the pid is the parent's, not init; the
		 * parent is not younger than its child (else it is a new
		 * process on a recycled pid, not the one that started the
		 * helper); and a child that does not lead its own session
		 * shares its parent's (a different one means a reaper adopted
		 * it). */
		rc = q.pid != p.ppid || q.pid <= 1 || q.start_time > p.start_time ||
		     (p.sid != q.sid && p.sid != p.pid) ? -EACCES : 0;
		if (rc < 0) {
			lockfs_proc_put(&q);
			goto fail;
		}
		/* Never across a uid boundary: the parent would answer for what
		 * a process of another user did.  Only a set-uid helper (sudo)
		 * runs as another user than its parent by design: the user who
		 * ran it is the one it acts for. */
		if (q.uid != uid && !((exe.st_mode & S_ISUID) && exe.st_uid == uid)) {
			lockfs_proc_put(&q);
			p.at_uid_boundary = true;
			break;
		}
		lockfs_proc_put(&p);
		p = q;
		p.at_uid_boundary = false;
		uid = q.uid;
	}
	if (p.pid <= 1) {
		rc = -EACCES;
		goto fail;
	}
	p.ns_pid = 0;
	p.container[0] = '\0';
	if (ns && src->read_ns && src->read_ns(src->ctx, p.pid, &p) < 0) {
		p.ns_pid = 0; /* unknown: the record says null */
		p.container[0] = '\0';
	}
	*holder = p;
	return 0;
fail:
	lockfs_proc_put(&p);
	return rc;
}

int lockfs_holder_may_release(const struct lockfs_proc_source *src, pid_t caller_tid,
			      pid_t holder_pid, unsigned long long holder_start,
			      bool holder_alive)
{
	if (caller_tid <= 0)
		return -EACCES;
	if (!src)
		src = &lockfs_proc_real;
	/* A live holder owns its pid, and thread ids are unique across the
	 * system: a caller with that id is the holder's own main thread. */
	if (holder_alive && caller_tid == holder_pid)
		return 0;
	struct lockfs_proc c, q;
	int rc = read_caller(src, caller_tid, 0, &c);
	if (rc < 0)
		return rc;
	/* First, before any helper logic: `sh -c 'mkdir X && rmdir X'` may
	 * exec rmdir in the very process that holds X. */
	if (c.pid == holder_pid && (holder_alive || c.start_time == holder_start))
		return 0;
	if (holder_pid <= 1)
		return -EPERM;
	for (int steps = 0; steps < WALK_MAX; steps++) {
		if (c.ppid <= 1)
			return -EPERM; /* reached init (never a holder) or the top */
		if (holder_alive && c.ppid == holder_pid)
			return 0; /* the live holder is our parent: no read needed */
		if (src->read_tid(src->ctx, c.ppid, 0, &q) < 0)
			return -EPERM; /* the chain is broken: no proof */
		if (q.pid != c.ppid || q.start_time > c.start_time)
			return -EPERM; /* recycled pid: not our ancestor */
		if (q.pid == holder_pid && q.start_time == holder_start)
			return 0;
		c = q;
	}
	return -EPERM;
}

void lockfs_argv_free(char **argv)
{
	if (!argv)
		return;
	for (char **a = argv; *a; a++)
		free(*a);
	free(argv);
}

int lockfs_proc_cmdline(pid_t pid, size_t max_bytes, char ***argv)
{
	char path[64];
	char *buf;
	size_t len;
	bool truncated;
	*argv = NULL;
	if (pid <= 0)
		return -ENOENT;
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	int rc = read_all(path, max_bytes, &buf, &len, &truncated);
	if (rc < 0)
		return rc;
	/* Count elements: every NUL ends one, and a final element without a
	 * NUL (cut short, or a rewritten argv) still counts. */
	size_t count = 0;
	for (size_t i = 0; i < len; i++)
		count += buf[i] == '\0';
	if (len > 0 && buf[len - 1] != '\0')
		count++;
	char **out = calloc(count + 1, sizeof(*out));
	if (!out) {
		free(buf);
		return -ENOMEM;
	}
	size_t off = 0;
	for (size_t i = 0; i < count; i++) {
		size_t elen = strnlen(buf + off, len - off);
		out[i] = strndup(buf + off, elen);
		if (!out[i]) {
			lockfs_argv_free(out);
			free(buf);
			return -ENOMEM;
		}
		off += elen + 1;
	}
	free(buf);
	*argv = out;
	return 0;
}

int lockfs_proc_getenv(pid_t pid, const char *var, char *buf, size_t size)
{
	char path[64];
	char *env;
	size_t len;
	bool truncated;
	if (pid <= 0)
		return -ENOENT;
	if (!var || !*var || strchr(var, '='))
		return -EINVAL;
	snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
	int rc = read_all(path, ENVIRON_MAX, &env, &len, &truncated);
	if (rc < 0)
		return rc;
	size_t vlen = strlen(var);
	rc = -ENOENT;
	for (size_t off = 0; off < len; ) {
		size_t elen = strnlen(env + off, len - off);
		/* An entry cut off at the cap may be missing its tail. */
		bool partial = off + elen == len && truncated;
		const char *e = env + off;
		if (!partial && elen > vlen && memcmp(e, var, vlen) == 0 &&
		    e[vlen] == '=') {
			size_t val = elen - vlen - 1;
			if (val >= size || val > INT_MAX) {
				rc = -ENAMETOOLONG;
			} else {
				memcpy(buf, e + vlen + 1, val);
				buf[val] = '\0';
				rc = (int)val;
			}
			break;
		}
		off += elen + 1;
	}
	free(env);
	return rc;
}

int lockfs_proc_start_time(pid_t pid, unsigned long long *start)
{
	struct lockfs_proc p;
	bool leader;
	int rc;

	if (pid <= 0)
		return -ENOENT;
	rc = read_stat(pid, &p, &leader);
	if (rc == 0 && !leader)
		return -ENOENT; /* a thread id, not a process */
	if (rc == 0)
		*start = p.start_time;
	return rc;
}

int lockfs_proc_env_exists(uid_t uid, const char *var, const char *value, pid_t *found)
{
	DIR *proc = opendir("/proc");
	struct dirent *de;
	char want[512];
	int rc = 0, unknown = 0;

	if (!proc)
		return -errno;
	if ((size_t)snprintf(want, sizeof(want), "%s", value) >= sizeof(want)) {
		closedir(proc);
		return -ENAMETOOLONG;
	}
	while ((de = readdir(proc))) {
		struct lockfs_proc p;
		char buf[512];
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		int env;

		/* Init never runs anyone's commands, and its environment may
		 * be closed even to root (a pid namespace's init). */
		if (*end || pid <= 1)
			continue;
		/* The uid from status, not from the owner of /proc/PID, which
		 * reads as root for a non-dumpable process. */
		if (read_status((pid_t)pid, &p) < 0 || p.uid != uid)
			continue; /* gone, or another user's */
		env = lockfs_proc_getenv((pid_t)pid, var, buf, sizeof(buf));
		if (env == -ENOENT || env == -ESRCH || (env >= 0 && strcmp(buf, want) != 0))
			continue; /* unset, gone, or another value */
		if (env < 0) {
			/* Cannot tell what this process carries: unless another
			 * one answers yes, the answer is "unknown", not "no". */
			unknown = env;
			continue;
		}
		if (found)
			*found = (pid_t)pid;
		rc = 1;
		break;
	}
	closedir(proc);
	return rc == 0 && unknown ? unknown : rc;
}

int lockfs_procs_pidfd_open(const struct lockfs_proc_source *src, pid_t pid)
{
	int fd;

	if (src && src->pidfd_open)
		return src->pidfd_open(src->ctx, pid);
	fd = open_pidfd(pid);
	return fd < 0 ? -errno : fd;
}

int lockfs_procs_cmdline(const struct lockfs_proc_source *src, pid_t pid, size_t max_bytes,
			 char ***argv)
{
	if (src && src->cmdline)
		return src->cmdline(src->ctx, pid, max_bytes, argv);
	return lockfs_proc_cmdline(pid, max_bytes, argv);
}

int lockfs_procs_getenv(const struct lockfs_proc_source *src, pid_t pid, const char *var,
			char *buf, size_t size)
{
	if (src && src->getenv)
		return src->getenv(src->ctx, pid, var, buf, size);
	return lockfs_proc_getenv(pid, var, buf, size);
}

int lockfs_procs_start_time(const struct lockfs_proc_source *src, pid_t pid,
			    unsigned long long *start)
{
	if (src && src->start_time)
		return src->start_time(src->ctx, pid, start);
	return lockfs_proc_start_time(pid, start);
}

int lockfs_procs_env_exists(const struct lockfs_proc_source *src, uid_t uid, const char *var,
			    const char *value, pid_t *pid)
{
	if (src && src->env_exists)
		return src->env_exists(src->ctx, uid, var, value, pid);
	return lockfs_proc_env_exists(uid, var, value, pid);
}

int lockfs_boot_id(char buf[40])
{
	ssize_t n = read_small("/proc/sys/kernel/random/boot_id", buf, 40);
	if (n < 0)
		return (int)n;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = '\0';
	return n > 0 ? 0 : -EIO;
}
