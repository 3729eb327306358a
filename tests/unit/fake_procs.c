/*
 * The fake process table of fake_procs.h: a fixed small world, rows added by
 * a test, exits, and a pipe per opened pidfd that an exit makes readable.
 */
#include "fake_procs.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ROW(p, pp, s, st, e, ...) \
	{ .pid = (p), .ppid = (pp), .sid = (s), .start = (st), .exe = (e), __VA_ARGS__ }

/*
 * A small world.  Interactive login: sshd(400) -> bash(500, session leader).
 * Each comment says which tests use a row.
 */
static const struct fake_proc world[] = {
	ROW(1, 0, 1, 1, "systemd"),
	ROW(400, 1, 400, 500, "sshd"),
	ROW(500, 400, 500, 1000, "bash"),       /* the usual holder */
	ROW(600, 500, 500, 2000, "mkdir"),      /* mkdir run from bash */
	ROW(610, 500, 500, 2100, "rmdir"),      /* another child of bash */
	ROW(615, 500, 500, 2200, "sh"),
	ROW(620, 615, 500, 2300, "rmdir"),      /* grandchild of bash */
	ROW(710, 500, 500, 3000, "sudo"),       /* sudo -> env -> mkdir */
	ROW(711, 710, 500, 3001, "env"),
	ROW(712, 711, 500, 3002, "mkdir"),
	ROW(720, 500, 720, 3100, "sudo"),       /* sudo with a pty: own session */
	ROW(721, 720, 720, 3101, "mkdir"),
	ROW(730, 500, 500, 3200, "mkdir"),      /* busybox applet (exe = applet) */
	ROW(800, 500, 500, 4000, "python3"),    /* threads 801, 802 */
	ROW(900, 1, 500, 4500, "mkdir"),        /* orphan adopted by init */
	ROW(910, 500, 500, 5000, "bash"),       /* pid reused after 920 began */
	ROW(920, 910, 500, 2000, "mkdir"),
	ROW(930, 1, 930, 5100, "tini"),         /* subreaper */
	ROW(940, 930, 935, 5200, "mkdir"),      /* orphan of session 935 */
	ROW(950, 951, 500, 5300, "mkdir"),      /* parent 951 is gone */
	ROW(960, 961, 500, 5400, "mkdir"),      /* a cycle (only a fake can) */
	ROW(961, 960, 500, 5400, "mkdir"),
	ROW(970, 500, 500, 5500, ""),           /* exe unreadable */
	ROW(1500, 500, 500, 7000, "rmdir"),     /* bash -c 'mkdir X && rmdir X' */
	/* issue 8 §3: fakes and uid boundaries */
	ROW(1600, 500, 500, 8000, "mkdir", .file = FAKE_FILE_COPY),  /* ~/bin/mkdir, a python */
	ROW(1610, 500, 500, 8100, "mkdir", .file = FAKE_FILE_COPY, .multicall = "busybox"), /* ~/bin/busybox mkdir */
	ROW(1620, 500, 500, 8200, "mkdir", .multicall = "busybox"), /* /bin/busybox mkdir */
	ROW(1630, 500, 500, 8300, "mkdir", .multicall = "coreutils"), /* coreutils-single */
	ROW(1700, 400, 1700, 9000, "bash", .uid = FAKE_UID_ROOT),  /* a root shell */
	ROW(1701, 1700, 1700, 9001, "mkdir", .uid = 4242),    /* setpriv --reuid=4242 mkdir */
	ROW(1702, 1700, 1700, 9002, "env", .file = FAKE_FILE_COPY, .uid = 4242),         /* ... ~/bin/env */
	ROW(1703, 1700, 1700, 9003, "sh", .uid = 4242),       /* ... sh -c 'mkdir; ...' */
	ROW(1704, 1703, 1700, 9004, "mkdir", .uid = 4242),
	ROW(1705, 1700, 1700, 9005, "timeout", .uid = 4242),  /* ... timeout 5 mkdir */
	ROW(1706, 1705, 1700, 9006, "mkdir", .uid = 4242),
	ROW(1800, 400, 1800, 9500, "bash"),                     /* a user's shell */
	ROW(1801, 1800, 1800, 9501, "sudo", .file = FAKE_FILE_GENUINE_SETUID, .uid = FAKE_UID_ROOT),
	ROW(1802, 1801, 1800, 9502, "mkdir", .uid = FAKE_UID_ROOT), /* sudo mkdir */
	ROW(1811, 1800, 1800, 9511, "sudo", .file = FAKE_FILE_COPY_SETUID, .uid = FAKE_UID_ROOT),
	ROW(1812, 1811, 1800, 9512, "mkdir", .uid = FAKE_UID_ROOT), /* a fake sudo's mkdir */
	ROW(1821, 1800, 1800, 9521, "sudo", .uid = FAKE_UID_ROOT),  /* sudo, set-uid bit gone */
	ROW(1822, 1821, 1800, 9522, "mkdir", .uid = FAKE_UID_ROOT),
	ROW(1831, 1801, 1800, 9531, "mkdir", .uid = 4242),     /* sudo -u 4242 mkdir */
	/* a container: processes in another root (fake_root_dir) */
	ROW(1900, 400, 1900, 9600, "sh", .file = FAKE_FILE_IN_ROOT, .path = "bin/sh"),
	ROW(1901, 1900, 1900, 9601, "mkdir", .file = FAKE_FILE_IN_ROOT, .path = "usr/bin/mkdir"),
	ROW(1902, 1900, 1900, 9602, "mkdir", .file = FAKE_FILE_IN_ROOT, .path = "home/u/mkdir"),
	ROW(1903, 1900, 1900, 9603, "env", .file = FAKE_FILE_IN_ROOT, .path = "usr/local/bin/env"),
};

static const struct { pid_t tid, tgid; } world_threads[] = {
	{ 801, 800 },
	{ 802, 800 },
};

#define ADDED_MAX 64
#define EXITED_MAX 256
#define PIDFDS_MAX 256

/* The state a test changes, under `mu`.  Rows come back by pointer from
 * fake_procs_find(); a row is never changed or removed before
 * fake_procs_reset(), so the pointer stays good meanwhile. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_proc added[ADDED_MAX];
static size_t n_added;
static pid_t exited[EXITED_MAX];
static size_t n_exited;
/* The write end of each pipe handed out as a pidfd, with its pid. */
static struct { pid_t pid; int wfd; } pidfds[PIDFDS_MAX];
static size_t n_pidfds;

int fake_procs_reads;
char fake_procs_root_dir[PATH_MAX];

static bool exited_locked(pid_t pid)
{
	for (size_t i = 0; i < n_exited; i++)
		if (exited[i] == pid)
			return true;
	return false;
}

/* The process TID belongs to (itself unless it is a thread of the world). */
static pid_t tgid_of(pid_t tid)
{
	for (size_t i = 0; i < sizeof(world_threads) / sizeof(world_threads[0]); i++)
		if (world_threads[i].tid == tid)
			return world_threads[i].tgid;
	return tid;
}

static const struct fake_proc *find_locked(pid_t tid)
{
	pid_t pid = tgid_of(tid);

	if (exited_locked(pid))
		return NULL;
	for (size_t i = 0; i < n_added; i++)
		if (added[i].pid == pid)
			return &added[i];
	for (size_t i = 0; i < sizeof(world) / sizeof(world[0]); i++)
		if (world[i].pid == pid)
			return &world[i];
	return NULL;
}

const struct fake_proc *fake_procs_find(pid_t tid)
{
	const struct fake_proc *f;

	pthread_mutex_lock(&mu);
	f = find_locked(tid);
	pthread_mutex_unlock(&mu);
	return f;
}

static uid_t uid_of(const struct fake_proc *f)
{
	return f->uid == FAKE_UID_ROOT ? 0 : f->uid == 0 ? 1000 : (uid_t)f->uid;
}

static int fake_pidfd_open(void *ctx, pid_t pid);

int fake_procs_read_tid(void *ctx, pid_t tid, unsigned want, struct lockfs_proc *out)
{
	const struct fake_proc *f;
	/* The fake always knows everything; but a pidfd only when asked
	 * (the engine's mkdir), opened first as the real source does. */
	int pidfd = want & LOCKFS_PROC_PIDFD ? fake_pidfd_open(ctx, tgid_of(tid)) : -1;

	pthread_mutex_lock(&mu);
	fake_procs_reads++;
	f = find_locked(tid);
	pthread_mutex_unlock(&mu);
	if (!f) {
		if (pidfd >= 0)
			close(pidfd);
		return -ENOENT;
	}
	memset(out, 0, sizeof(*out));
	out->has_pidfd = pidfd >= 0;
	out->pidfd = pidfd;
	out->pid = f->pid;
	out->ppid = f->ppid;
	out->sid = f->sid;
	out->uid = uid_of(f);
	out->gid = out->uid;
	out->have_ids = true;
	out->start_time = f->start;
	snprintf(out->comm, sizeof(out->comm), "%s", f->exe);
	snprintf(out->exe, sizeof(out->exe), "%s", f->exe);
	snprintf(out->multicall, sizeof(out->multicall), "%s", f->multicall ? f->multicall : "");
	return 0;
}

ino_t fake_procs_name_ino(const char *name)
{
	ino_t h = 5381;

	while (*name)
		h = h * 33 + (unsigned char)*name++;
	return h;
}

/* Made-up files: a device no real file system has, and an inode per name
 * (genuine) or per process (a copy).  A test trusts the genuine ones as the
 * system's copies (lockfs_helpers_trust_file with fake_procs_name_ino). */
static int fake_exe_stat(void *ctx, pid_t pid, struct stat *st)
{
	const struct fake_proc *f = fake_procs_find(pid);
	char path[PATH_MAX * 2];
	bool genuine, setuid;

	(void)ctx;
	if (!f)
		return -ENOENT;
	if (f->file == FAKE_FILE_IN_ROOT) {
		snprintf(path, sizeof(path), "%s/%s", fake_procs_root_dir, f->path);
		return stat(path, st) == 0 ? 0 : -errno;
	}
	genuine = f->file == FAKE_FILE_GENUINE || f->file == FAKE_FILE_GENUINE_SETUID;
	setuid = f->file == FAKE_FILE_GENUINE_SETUID || f->file == FAKE_FILE_COPY_SETUID;
	memset(st, 0, sizeof(*st));
	st->st_dev = FAKE_PROCS_DEV;
	st->st_ino = genuine ? fake_procs_name_ino(f->multicall ? f->multicall : f->exe)
			     : (ino_t)f->pid;
	st->st_mode = S_IFREG | 0755 | (setuid ? S_ISUID : 0);
	st->st_uid = f->file == FAKE_FILE_COPY ? uid_of(f) : 0;
	return 0;
}

/* Processes that run a file of the fake container live in its root; the
 * others in a root no lookup finds anything in. */
static int fake_open_root(void *ctx, pid_t pid)
{
	const struct fake_proc *f = fake_procs_find(pid);
	int fd;

	(void)ctx;
	if (!f)
		return -ENOENT;
	if (f->file != FAKE_FILE_IN_ROOT || !fake_procs_root_dir[0])
		return -ENOENT;
	fd = open(fake_procs_root_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	return fd >= 0 ? fd : -errno;
}

/* The container's processes (1900, 1901) see themselves as pids 1 and 2. */
static int fake_read_ns(void *ctx, pid_t pid, struct lockfs_proc *p)
{
	(void)ctx;
	if (pid == 1901 || pid == 1900) {
		p->ns_pid = pid - 1899;
		snprintf(p->container, sizeof(p->container), "%s", "c0ffee");
	} else {
		p->ns_pid = pid;
	}
	return 0;
}

/* A pipe stands for the pidfd: its read end is returned (O_CLOEXEC, like a
 * pidfd), and fake_procs_exit() writes a byte into the write end, which is
 * what makes a real pidfd readable: POLLIN once the process exited.  A
 * thread id is EINVAL, as for pidfd_open(2) without PIDFD_THREAD. */
static int fake_pidfd_open(void *ctx, pid_t pid)
{
	int fds[2], rc = 0;

	(void)ctx;
	if (tgid_of(pid) != pid)
		return -EINVAL;
	pthread_mutex_lock(&mu);
	if (!find_locked(pid))
		rc = -ESRCH;
	else if (n_pidfds == PIDFDS_MAX)
		rc = -EMFILE;
	else if (pipe2(fds, O_CLOEXEC) < 0)
		rc = -errno;
	if (rc == 0) {
		pidfds[n_pidfds].pid = pid;
		pidfds[n_pidfds].wfd = fds[1];
		n_pidfds++;
	}
	pthread_mutex_unlock(&mu);
	return rc < 0 ? rc : fds[0];
}

/* One argument: the exe name. */
static int fake_cmdline(void *ctx, pid_t pid, size_t max_bytes, char ***argv)
{
	const struct fake_proc *f = fake_procs_find(pid);
	char **v;

	(void)ctx;
	(void)max_bytes;
	if (!f)
		return -ENOENT;
	v = calloc(2, sizeof(*v));
	if (!v || !(v[0] = strdup(f->exe))) {
		free(v);
		return -ENOMEM;
	}
	*argv = v;
	return 0;
}

/* LOCKFS_SLUG only, as lockfs_procfs_getenv: its length with the value in
 * BUF, -ENOENT when unset or the process is gone, -ENAMETOOLONG when BUF is
 * too small. */
static int fake_getenv(void *ctx, pid_t pid, const char *var, char *buf, size_t size)
{
	const struct fake_proc *f = fake_procs_find(pid);
	size_t len;

	(void)ctx;
	if (!f || strcmp(var, "LOCKFS_SLUG") != 0 || !f->slug)
		return -ENOENT;
	len = strlen(f->slug);
	if (len >= size)
		return -ENAMETOOLONG;
	memcpy(buf, f->slug, len + 1);
	return (int)len;
}

static int fake_start_time(void *ctx, pid_t pid, unsigned long long *start)
{
	const struct fake_proc *f = fake_procs_find(pid);

	(void)ctx;
	if (!f)
		return -ENOENT;
	*start = f->start;
	return 0;
}

/* Whether a live process of UID has VAR=VALUE (LOCKFS_SLUG only): 1 with
 * its pid, else 0. */
static int fake_env_exists(void *ctx, uid_t uid, const char *var, const char *value,
			   pid_t *pid)
{
	const struct fake_proc *rows[2] = { world, added };
	size_t counts[2] = { sizeof(world) / sizeof(world[0]), 0 };
	int found = 0;

	(void)ctx;
	if (strcmp(var, "LOCKFS_SLUG") != 0)
		return 0;
	pthread_mutex_lock(&mu);
	counts[1] = n_added;
	for (size_t r = 0; r < 2 && !found; r++)
		for (size_t i = 0; i < counts[r] && !found; i++) {
			const struct fake_proc *f = &rows[r][i];

			if (f->slug && strcmp(f->slug, value) == 0 && uid_of(f) == uid &&
			    find_locked(f->pid) == f) {
				*pid = f->pid;
				found = 1;
			}
		}
	pthread_mutex_unlock(&mu);
	return found;
}

const struct lockfs_proc_source fake_procs_source = {
	.read_tid = fake_procs_read_tid,
	.exe_stat = fake_exe_stat,
	.open_root = fake_open_root,
	.read_ns = fake_read_ns,
	.pidfd_open = fake_pidfd_open,
	.cmdline = fake_cmdline,
	.getenv = fake_getenv,
	.start_time = fake_start_time,
	.env_exists = fake_env_exists,
};

int fake_procs_add(const struct fake_proc *row)
{
	int rc = 0;

	pthread_mutex_lock(&mu);
	if (find_locked(row->pid))
		rc = -EEXIST;
	else if (n_added == ADDED_MAX)
		rc = -ENOSPC;
	else
		added[n_added++] = *row;
	pthread_mutex_unlock(&mu);
	return rc;
}

int fake_procs_exit(pid_t pid)
{
	int rc = 0;

	pthread_mutex_lock(&mu);
	if (tgid_of(pid) != pid || !find_locked(pid))
		rc = -ESRCH;
	else if (n_exited == EXITED_MAX)
		rc = -ENOSPC;
	if (rc == 0) {
		exited[n_exited++] = pid;
		for (size_t i = 0; i < n_pidfds; i++)
			/* EPIPE: that pidfd was closed, nobody watches it
			 * (a test that closes pidfds ignores SIGPIPE). */
			if (pidfds[i].pid == pid && write(pidfds[i].wfd, "x", 1) != 1 &&
			    errno != EPIPE)
				rc = -errno;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

void fake_procs_reset(void)
{
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < n_pidfds; i++)
		close(pidfds[i].wfd);
	n_pidfds = 0;
	n_added = 0;
	n_exited = 0;
	fake_procs_reads = 0;
	pthread_mutex_unlock(&mu);
}
