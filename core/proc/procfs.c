/*
 * Process facts as the real /proc describes them: the source the daemon
 * uses (lockfs_procfs_source: stat, status, the exe link, the root, the pid
 * namespace and cgroup), and the readers of cmdline, environ and the start
 * time, and the boot id (see include/lockfs/proc.h).
 *
 * lockfs_holder_resolve() runs on every mkdir and may_release() on every
 * rmdir, so describing a process costs as few /proc reads as the question
 * needs: stat always (parent, session, start time, comm, and whether the
 * id is a thread-group leader), the exe link only where helpers are
 * skipped (plus comm or cmdline for busybox/toybox, whose exe says nothing), and
 * status -- the dearest file, ~10 us -- only for a non-leader thread's
 * Tgid or where uid and gid are asked for.
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

#include "lockfs/proc.h"
#include "helper_files.h"
#include "procfs.h"

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

int lockfs_proc_stat_parse(const char *text, struct lockfs_proc_stat *out)
{
	const char *open_paren = strchr(text, '(');
	const char *close_paren = strrchr(text, ')');
	unsigned long long ppid = 0, session = 0, threads = 0, start = 0;
	const char *p;
	size_t clen;

	if (!open_paren || !close_paren || close_paren < open_paren || close_paren[1] != ' ' ||
	    !close_paren[2])
		return -EIO;
	clen = (size_t)(close_paren - open_paren - 1);
	if (clen >= sizeof(out->comm))
		clen = sizeof(out->comm) - 1;
	memcpy(out->comm, open_paren + 1, clen);
	out->comm[clen] = '\0';
	out->state = close_paren[2];

	/* Field 3 (state) starts after ") "; walk to fields 4, 6, 20, 22, 38. */
	p = close_paren + 1;
	out->leader = true;
	for (int field = 3; field <= 38; field++) {
		while (*p == ' ')
			p++;
		if (!*p)
			return -EIO;
		if (field == 4 || field == 6 || field == 20 || field == 22) {
			char *end;
			if (parse_ull(p, &end, field == 4 ? &ppid : field == 6 ? &session :
				      field == 20 ? &threads : &start) < 0)
				return -EIO;
		}
		if (field == 38)
			out->leader = !(p[0] == '-' && p[1] == '1' && (!p[2] || p[2] == ' ' ||
								      p[2] == '\n'));
		while (*p && *p != ' ')
			p++;
	}
	if (session > INT_MAX || ppid > INT_MAX || threads > LONG_MAX)
		return -EIO;
	out->ppid = (pid_t)ppid;
	out->sid = (pid_t)session;
	out->threads = (long)threads;
	out->start_time = start;
	return 0;
}

int lockfs_procfs_stat(pid_t pid, pid_t tid, struct lockfs_proc_stat *out)
{
	char path[64], buf[2048];
	ssize_t n;

	if (pid <= 0 || tid < 0)
		return -ENOENT;
	if (tid > 0)
		snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, (int)tid);
	else
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	n = read_small(path, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	return lockfs_proc_stat_parse(buf, out);
}

/*
 * Fill PID, PPID, SID, START_TIME and COMM of *OUT from /proc/PID/stat, and
 * tell through *LEADER whether PID leads its thread group.  The session
 * here is the one in /proc's pid namespace, i.e. the outermost NSsid.
 * Returns 0 or -errno.
 */
static int read_stat(pid_t pid, struct lockfs_proc *out, bool *leader)
{
	struct lockfs_proc_stat st;
	int rc = lockfs_procfs_stat(pid, 0, &st);

	if (rc < 0)
		return rc;
	memcpy(out->comm, st.comm, sizeof(out->comm));
	out->pid = pid;
	out->ppid = st.ppid;
	out->sid = st.sid;
	out->start_time = st.start_time;
	*leader = st.leader;
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
const char *const lockfs_multicall_names[LOCKFS_MULTICALL_COUNT] = { "busybox", "toybox",
								      "coreutils" };

bool lockfs_is_multicall(const char *name)
{
	for (size_t i = 0; i < LOCKFS_MULTICALL_COUNT; i++)
		if (strcmp(name, lockfs_multicall_names[i]) == 0)
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

	if (*comm && !lockfs_is_multicall(comm)) {
		snprintf(buf, size, "%s", comm);
		return;
	}
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	n = read_small(path, cmd, sizeof(cmd));
	if (n <= 0)
		return;
	/* read_small NUL-terminated it: cmd is argv[0] (maybe cut short) */
	base = base_name(cmd);
	if (lockfs_is_multicall(base) && strlen(cmd) + 1 < (size_t)n)
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
	if (lockfs_is_multicall(out->exe)) {
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
	/* The pidfd first, the facts after: see has_pidfd in lockfs/proc.h.
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

/* The pid namespace a /proc/PID/ns/pid link at PATH names ("pid:[INODE]"),
 * as its inode, into *NS.  0 or -errno. */
static int pidns_at(const char *path, unsigned long long *ns)
{
	char link[64];
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	char *end;

	if (n <= 0)
		return n < 0 ? proc_errno(errno) : -EIO;
	link[n] = '\0';
	if (strncmp(link, "pid:[", 5) != 0 || parse_ull(link + 5, &end, ns) < 0 ||
	    strcmp(end, "]") != 0)
		return -EIO;
	return 0;
}

/* The daemon's own pid namespace, read once; 0 when unreadable. */
static unsigned long long own_pidns;
static pthread_once_t own_pidns_once = PTHREAD_ONCE_INIT;

/* And its own cgroups (/proc/self/cgroup), read at the same time: where
 * containers are named from (lockfs_container_of_cgroup_under). */
static char own_cgroup[4096];

static void read_own_pidns(void)
{
	if (pidns_at("/proc/self/ns/pid", &own_pidns) < 0)
		own_pidns = 0;
	ssize_t n = read_small("/proc/self/cgroup", own_cgroup, sizeof(own_cgroup));
	own_cgroup[n > 0 ? n : 0] = '\0';
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
 * lockfs_proc_source.pidns on the real /proc.  A process seen lately in
 * the daemon's own pid namespace costs no system call (same_ns); any
 * other, one readlink.  Sets *OWN when it is the daemon's namespace.
 */
static int pidns_of(pid_t pid, unsigned long long start, unsigned long long *ns, bool *own)
{
	size_t slot = (size_t)pid % SAME_NS_SLOTS;
	char path[64];
	bool seen;
	int rc;

	pthread_once(&own_pidns_once, read_own_pidns);
	pthread_mutex_lock(&same_ns_mu);
	/* Start time 0: not known (a caller's thread, asked about as it
	 * waits in its request): the link is read, nothing kept. */
	seen = start && same_ns[slot].pid == pid && same_ns[slot].start == start;
	pthread_mutex_unlock(&same_ns_mu);
	if (seen && own_pidns) {
		*ns = own_pidns;
		*own = true;
		return 0;
	}
	snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
	rc = pidns_at(path, ns);
	if (rc < 0)
		return rc;
	*own = own_pidns && *ns == own_pidns;
	if (*own && start) {
		pthread_mutex_lock(&same_ns_mu);
		same_ns[slot].pid = pid;
		same_ns[slot].start = start;
		pthread_mutex_unlock(&same_ns_mu);
	}
	return 0;
}

static int proc_pidns(void *ctx, pid_t pid, unsigned long long start, unsigned long long *ns)
{
	bool own;

	(void)ctx;
	return pidns_of(pid, start, ns, &own);
}

/*
 * lockfs_proc_source.read_ns on the real /proc.  P->pid is PID and
 * P->start_time its start time.  A process in the daemon's own pid
 * namespace is its own ns_pid and is taken for no container: one readlink
 * the first time it is seen, where status and cgroup would cost ~25 us on
 * every mkdir.  Only a process in another pid namespace (a container's)
 * has both read, every time (its cgroup may change); it is always in a
 * container: the one its cgroup names, else its pid namespace's.
 */
static int proc_read_ns(void *ctx, pid_t pid, struct lockfs_proc *p)
{
	char path[64], buf[4096];
	unsigned long long v, ns;
	bool own;
	ssize_t n;
	int rc;

	(void)ctx;
	p->ns_pid = 0;
	p->container[0] = '\0';
	rc = pidns_of(pid, p->start_time, &ns, &own);
	if (rc < 0)
		return rc;
	if (own) {
		p->ns_pid = pid;
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
	/* Named as seen from the daemon's own cgroup: the container the
	 * daemon itself runs in is nobody's (holder.md). */
	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	n = read_small(path, buf, sizeof(buf));
	if (n > 0)
		lockfs_container_of_cgroup_under(buf, own_cgroup[0] ? own_cgroup : NULL,
						 p->container, sizeof(p->container));
	if (!p->container[0])
		snprintf(p->container, sizeof(p->container), "pidns:%llu", ns);
	return 0;
}

const struct lockfs_proc_source lockfs_procfs_source = {
	.read_tid = proc_read_tid,
	.ctx = NULL,
	.exe_stat = proc_exe_stat,
	.open_root = proc_open_root,
	.read_ns = proc_read_ns,
	.pidns = proc_pidns,
};


void lockfs_argv_free(char **argv)
{
	if (!argv)
		return;
	for (char **a = argv; *a; a++)
		free(*a);
	free(argv);
}

char **lockfs_argv_dup(char *const *argv)
{
	size_t n = 0;
	char **out;

	while (argv && argv[n])
		n++;
	out = calloc(n + 1, sizeof(*out));
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		out[i] = strdup(argv[i]);
		if (!out[i]) {
			lockfs_argv_free(out);
			return NULL;
		}
	}
	return out;
}

int lockfs_procfs_cmdline(pid_t pid, size_t max_bytes, char ***argv)
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

int lockfs_procfs_getenv(pid_t pid, const char *var, char *buf, size_t size)
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

int lockfs_procfs_start_time(pid_t pid, unsigned long long *start)
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

int lockfs_procfs_env_exists(uid_t uid, const char *var, const char *value, pid_t *found)
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
		env = lockfs_procfs_getenv((pid_t)pid, var, buf, sizeof(buf));
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

int lockfs_procfs_pidfd_open(pid_t pid)
{
	int fd = open_pidfd(pid);

	return fd < 0 ? -errno : fd;
}

int lockfs_procfs_boot_id(char buf[40])
{
	ssize_t n = read_small("/proc/sys/kernel/random/boot_id", buf, 40);
	if (n < 0)
		return (int)n;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = '\0';
	return n > 0 ? 0 : -EIO;
}
