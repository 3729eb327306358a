/*
 * lockfs: named mutual-exclusion locks as directories.
 *
 *   lockfs [-f] [-o backing=DIR] [-o helpers=a:b:c] [-o fence_file=PATH]
 *          [-o lease=SECONDS] [-o stale=SECONDS] [-o break_signal=SIG]
 *          [-o descendants=connector|scan]
 *          [-o log_max=SIZE] [-o log_keep=N] [-o log_denied_interval=SECONDS]
 *          [-o max_open_per_uid=N] [-o max_locks_per_uid=N]
 *          [-o max_waiters_per_uid=N] [-o max_locks=N]
 *          [FUSE options] [SOURCE] MOUNTPOINT
 *   lockfs --guard MOUNTPOINT
 *
 * SOURCE is what mount(8) passes through mount.fuse3 (`mount -t fuse.lockfs
 * lockfs /locks`); it is ignored.
 *
 * Checks the backing directory and takes it for this daemon before
 * mounting, so a misconfigured lock is a one-line error at second zero,
 * never a silent no-op mutex.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemonize.h"
#include "fs.h"
#include "guard.h"
#include "stop.h"
#include "takeover.h"
#include "service.h"
/* The v1 store interface, until B2 opens stores through the v2 registry. */
#include "../core/lock/backend_v1.h"
#include "lockfs/core.h"

/* Works on a fresh machine as root: lock state needs no disk, and /run is
 * a tmpfs on systemd hosts. */
#define DEFAULT_BACKING "/run/lockfs"
/* Fences must never go backwards, also when DIR is a tmpfs that a reboot
 * empties: the counter lives on persistent storage. */
#define DEFAULT_FENCE_DIR "/var/lib/lockfs"
#define DEFAULT_FENCE_FILE DEFAULT_FENCE_DIR "/fence"
#define DAEMON_LOCK ".lockfs"

struct options {
	char *backing;
	char *helpers;
	char *fence_file;
	char *lease;
	char *stale;
	char *break_signal;
	char *descendants;
	char *max_open_per_uid;
	char *max_locks_per_uid;
	char *max_waiters_per_uid;
	char *max_locks;
	char *log_max;
	char *log_keep;
	char *log_denied_interval;
	int show_help;
	/* The positional arguments: [SOURCE] MOUNTPOINT. */
	char *positional[2];
	int n_positional;
};

#define OPT(t, p) { t, offsetof(struct options, p), 1 }
static const struct fuse_opt option_spec[] = {
	OPT("backing=%s", backing),
	OPT("helpers=%s", helpers),
	OPT("fence_file=%s", fence_file),
	OPT("lease=%s", lease),
	OPT("stale=%s", stale),
	OPT("break_signal=%s", break_signal),
	OPT("descendants=%s", descendants),
	OPT("max_open_per_uid=%s", max_open_per_uid),
	OPT("max_locks_per_uid=%s", max_locks_per_uid),
	OPT("max_waiters_per_uid=%s", max_waiters_per_uid),
	OPT("max_locks=%s", max_locks),
	OPT("log_max=%s", log_max),
	OPT("log_keep=%s", log_keep),
	OPT("log_denied_interval=%s", log_denied_interval),
	/* mount(8)'s own options, which reach us from fstab through
	 * mount.fuse3 (it drops only some of them): they mean nothing here. */
	FUSE_OPT_KEY("nofail", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("_netdev", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("defaults", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("auto", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("noauto", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("user", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("nouser", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("users", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("owner", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("group", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("comment=", FUSE_OPT_KEY_DISCARD),
	/* mount.fuse3 adds these unless told nodev/nosuid: there are no device
	 * or set-uid files here, so keep libfuse's nodev,nosuid either way. */
	FUSE_OPT_KEY("dev", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("suid", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_END
};

/*
 * fuse_opt_parse's callback for what option_spec does not name: collects
 * the positional arguments (put back once we know which is the mount
 * point) and drops fstab's x-* and X-* options (x-systemd.*, x-mount.*),
 * which are for mount(8) and systemd.  Everything else goes on to libfuse.
 */
static int other_arg(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct options *o = data;

	(void)outargs;
	if (key == FUSE_OPT_KEY_OPT)
		return strncmp(arg, "x-", 2) == 0 || strncmp(arg, "X-", 2) == 0 ? 0 : 1;
	if (key != FUSE_OPT_KEY_NONOPT)
		return 1;
	if (o->n_positional < 2) {
		o->positional[o->n_positional] = strdup(arg);
		if (!o->positional[o->n_positional])
			return -1;
	}
	o->n_positional++;
	return 0;
}

/*
 * Sort out [SOURCE] MOUNTPOINT: hand MOUNTPOINT back to libfuse.  SOURCE
 * means nothing: mount(8) wants one, and canonicalises it against its
 * working directory (a file "lockfs" there turns "lockfs" into a path), so
 * it cannot name the backing dir reliably.  Only a SOURCE that is another
 * directory gets a warning, in case it was meant as the backing dir.
 * Returns 0, or -1 after one line on stderr.
 */
static int take_positional(struct options *o, struct fuse_args *args)
{
	const char *source = o->n_positional == 2 ? o->positional[0] : NULL;
	const char *backing = o->backing ? o->backing : DEFAULT_BACKING;
	struct stat st;

	if (o->n_positional > 2) {
		fprintf(stderr, "lockfs: too many arguments: want [SOURCE] MOUNTPOINT\n");
		return -1;
	}
	if (source && source[0] == '/' && strcmp(source, backing) != 0 &&
	    stat(source, &st) == 0 && S_ISDIR(st.st_mode))
		fprintf(stderr, "lockfs: warning: source %s is ignored; the backing dir is %s "
			"(-o backing=DIR)\n", source, backing);
	if (o->n_positional > 0 &&
	    fuse_opt_add_arg(args, o->positional[o->n_positional - 1]) == -1)
		return -1;
	return 0;
}

static void usage(const char *prog)
{
	printf("usage: %s [-f] [-o OPTION[,OPTION...]] [SOURCE] MOUNTPOINT\n"
	       "       %s --guard MOUNTPOINT   make MOUNTPOINT immutable while nothing is\n"
	       "                               mounted on it, so mkdir there fails (root)\n"
	       "(SOURCE, which mount(8) passes, is ignored: write lockfs)\n\n"
	       "lockfs options:\n"
	       "    -o backing=DIR        backing directory (default " DEFAULT_BACKING ")\n"
	       "    -o helpers=A:B:...    programs skipped when resolving a holder\n"
	       "                          (default " LOCKFS_DEFAULT_HELPERS ")\n"
	       "    -o fence_file=PATH    fence counter (default " DEFAULT_FENCE_FILE ")\n"
	       "    -o lease=SECONDS      lease of slug-bound locks (default 600)\n"
	       "    -o stale=SECONDS      recover foreign locks older than this (default never)\n"
	       "    -o break_signal=SIG   signal a holder whose lock is broken or recovered\n"
	       "    -o descendants=HOW    how a dead holder's descendants are found:\n"
	       "                          connector (default; scan when unavailable) or scan\n"
	       "    -o max_open_per_uid=N files and directories of M one uid may hold open\n"
	       "                          (default 1024, or a quarter of the descriptors the\n"
	       "                          daemon may keep for callers if fewer; EMFILE past it)\n"
	       "    -o max_locks_per_uid=N  locks one uid may hold (default 1024; EDQUOT)\n"
	       "    -o max_waiters_per_uid=N  flock/fcntl requests one uid may have waiting\n"
	       "                          (default 1024; EDQUOT)\n"
	       "    -o max_locks=N        locks in all (default 16384, or what a quarter of\n"
	       "                          DIR's file system holds if fewer; ENOSPC)\n"
	       "                          root is exempt from all four; 0 = no limit\n"
	       "    -o log_max=SIZE       rotate DIR/lock.log before it passes SIZE (K, M, G\n"
	       "                          suffixes; 0 = never; default 4M, at least 16K)\n"
	       "    -o log_keep=N         rotated logs kept: lock.log.1 .. lock.log.N (default 4)\n"
	       "    -o log_denied_interval=SECONDS\n"
	       "                          at most one `denied` line per uid per SECONDS\n"
	       "                          during a burst (default 10; 0 = log every one)\n"
	       "    -o allow_other        let other users and containers use the mount\n"
	       "    -o auto_unmount       unmount when the daemon dies (unattended use)\n\n",
	       prog, prog);
}

/*
 * The holder rule reads /proc by the pids FUSE reports, which are pids of
 * our own pid namespace.  Under a /proc of another namespace (unshare -p
 * without a proc of its own) those pids would name strangers: then every
 * caller counts as one we cannot see (EACCES, fail closed), and we say so.
 * Returns true when /proc is ours; false after one line on stderr.
 */
static bool proc_is_ours(void)
{
	char self[32];
	ssize_t n = readlink("/proc/self", self, sizeof(self) - 1);

	if (n >= 0) {
		self[n] = '\0';
		if (strtol(self, NULL, 10) == (long)getpid())
			return true;
	}
	fprintf(stderr, "lockfs: warning: /proc is not of this pid namespace; every caller is "
		"refused (EACCES) until the daemon runs with its own proc (unshare --mount-proc)\n");
	return false;
}

/*
 * Check DIR and open it.  The default is created when missing; an explicit
 * one must already be there.  Returns an fd or -1 after one line on stderr.
 */
static int open_backing(const char *dir, int is_default)
{
	struct stat st;
	int fd;

	/* Created here: only the daemon reads it (owner.json names holders);
	 * one that exists keeps its mode and is checked as any other. */
	if (is_default && mkdir(dir, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "lockfs: cannot create backing dir %s: %s\n", dir, strerror(errno));
		return -1;
	}
	if (stat(dir, &st) < 0) {
		fprintf(stderr, "lockfs: backing dir %s: %s\n", dir, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		fprintf(stderr, "lockfs: backing dir %s is not a directory\n", dir);
		return -1;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		fprintf(stderr, "lockfs: backing dir %s is writable by %s (mode %04o); "
			"anyone could forge or remove locks: chmod go-w it\n",
			dir, st.st_mode & S_IWOTH ? "all users" : "its group",
			(unsigned)(st.st_mode & 07777));
		return -1;
	}
	/* Its owner can write it whatever the mode says. */
	if (st.st_uid != geteuid() && st.st_uid != 0) {
		fprintf(stderr, "lockfs: backing dir %s belongs to uid %u, who could forge or remove "
			"locks: chown it to uid %u\n", dir, (unsigned)st.st_uid, (unsigned)geteuid());
		return -1;
	}
	if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) < 0) {
		fprintf(stderr, "lockfs: backing dir %s is not writable: %s\n", dir, strerror(errno));
		return -1;
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		fprintf(stderr, "lockfs: backing dir %s: %s\n", dir, strerror(errno));
	return fd;
}

/* Why ST is not a file the daemon may write its pid into (truncating it
 * first): NULL when it is a plain file of its own with one link. */
static const char *not_own_plain_file(const struct stat *st)
{
	if (S_ISLNK(st->st_mode))
		return "a symbolic link";
	if (!S_ISREG(st->st_mode))
		return "not a regular file";
	if (st->st_nlink != 1)
		return "a file with other hard links";
	if (st->st_uid != geteuid())
		return "another user's file";
	return NULL;
}

/*
 * One daemon per backing dir: hold flock(2) on DIR/.lockfs for our whole
 * life (it survives daemonize.c's fork: the lock belongs to the open
 * file description).  The file is truncated and gets our pid, so nothing
 * planted there (a hard link to a file elsewhere, a FIFO) is used: it is
 * looked at before it is opened, and again once open.  A predecessor that
 * died but is wedged in the kernel is aborted and replaced (takeover.c);
 * a live one is refused.  Returns the fd, or -1 after one line on stderr.
 */
static int claim_backing(int dirfd, const char *dir)
{
	char pid[32] = "";
	const char *bad = NULL;
	struct stat st;
	int fd;

	if (fstatat(dirfd, DAEMON_LOCK, &st, AT_SYMLINK_NOFOLLOW) == 0)
		bad = not_own_plain_file(&st);
	fd = bad ? -1 : openat(dirfd, DAEMON_LOCK, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW |
			       O_NONBLOCK | O_NOCTTY, 0644);
	if (fd >= 0 && fstat(fd, &st) == 0)
		bad = not_own_plain_file(&st);
	if (bad) {
		fprintf(stderr, "lockfs: %s/" DAEMON_LOCK " is %s, not a plain file of lockfs's "
			"own; lockfs writes its pid there, so it will not start: remove it\n",
			dir, bad);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	if (fd < 0) {
		fprintf(stderr, "lockfs: cannot open %s/" DAEMON_LOCK ": %s\n", dir, strerror(errno));
		return -1;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int rc = lockfs_takeover(fd, dirfd, dir);
		ssize_t n;

		if (rc == 0)
			return fd;
		if (rc != -EBUSY) {
			close(fd);
			return -1;
		}
		n = pread(fd, pid, sizeof(pid) - 1, 0);

		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		if (errno == EWOULDBLOCK || errno == EAGAIN || n >= 0)
			fprintf(stderr, "lockfs: backing dir %s is already served by another lockfs "
				"daemon%s%s%s; mount it once and bind-mount that\n",
				dir, *pid ? " (pid " : "", pid, *pid ? ")" : "");
		close(fd);
		return -1;
	}
	return fd;
}

/* "SECONDS" (1..10 years) into *OUT; one line on stderr when it is not. */
static int parse_seconds(const char *opt, const char *text, uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = text && *text >= '0' && *text <= '9' ? strtoul(text, &end, 10) : 0;
	if (!text || errno || *end || v == 0 || v > 10ul * 365 * 24 * 3600) {
		fprintf(stderr, "lockfs: -o %s=%s: want a whole number of seconds > 0\n",
			opt, text ? text : "");
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

/* A cap "N" (0 = none: LOCKFS_NO_LIMIT) into *OUT; one line on stderr
 * when it is not a whole number up to 2^31. */
static int parse_cap(const char *opt, const char *text, uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = *text >= '0' && *text <= '9' ? strtoul(text, &end, 10) : ULONG_MAX;
	if (v == ULONG_MAX || errno || *end || v > 0x80000000ul) {
		fprintf(stderr, "lockfs: -o %s=%s: want a whole number (0 = no limit)\n", opt, text);
		return -1;
	}
	*out = v == 0 ? LOCKFS_NO_LIMIT : (uint32_t)v;
	return 0;
}

/*
 * Every open M/.log and every watched holder costs the daemon a
 * descriptor: use all the hard limit allows (the soft one is often 1024).
 * Callers never get the last of them (see core/proc/fds.h).
 */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		fprintf(stderr, "lockfs: warning: cannot raise the descriptor limit to %llu: %s\n",
			(unsigned long long)rl.rlim_max, strerror(errno));
}

/* "TERM", "SIGTERM" or "15" into *OUT; one line on stderr when unknown. */
static int parse_signal(const char *text, int *out)
{
	const char *name = strncmp(text, "SIG", 3) == 0 ? text + 3 : text;
	char *end;
	long v = strtol(text, &end, 10);

	if (*text && !*end && v > 0 && v < NSIG) {
		*out = (int)v;
		return 0;
	}
	for (int sig = 1; sig < NSIG; sig++) {
		const char *abbrev = sigabbrev_np(sig);

		if (abbrev && strcmp(abbrev, name) == 0) {
			*out = sig;
			return 0;
		}
	}
	fprintf(stderr, "lockfs: -o break_signal=%s: unknown signal\n", text);
	return -1;
}

/* The fence file: the option, else the persistent default, else (no
 * /var/lib to write) DIR/.fence with a warning. */
static const char *fence_path(const char *opt, const char *dir)
{
	int fd;

	if (opt)
		return opt;
	if (mkdir(DEFAULT_FENCE_DIR, 0755) < 0 && errno != EEXIST)
		goto fallback;
	fd = open(DEFAULT_FENCE_FILE, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		goto fallback;
	close(fd);
	return DEFAULT_FENCE_FILE;
fallback:
	fprintf(stderr, "lockfs: warning: cannot use " DEFAULT_FENCE_FILE " (%s); keeping fences "
		"in %s/.fence, which must survive reboots\n", strerror(errno), dir);
	return ".fence";
}

static void record_pid(int fd)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());

	if (ftruncate(fd, 0) == 0 && pwrite(fd, buf, (size_t)n, 0) != n)
		fprintf(stderr, "lockfs: warning: cannot record pid in " DAEMON_LOCK "\n");
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts opts = { 0 };
	struct options o = { 0 };
	struct lockfs_fs fs = { 0 };
	struct lockfs_backend *be = NULL;
	struct lockfs_core_config cfg = { 0 };
	struct fuse_loop_config *loop_cfg = NULL;
	struct lockfs_log_limits log_limits;
	const char *backing;
	char *fsname = NULL, *mnt_abs = NULL;
	int dirfd = -1, lockfd = -1, rc, ret = 1;

	if (argc >= 2 && strcmp(argv[1], "--guard") == 0)
		return lockfs_guard_main(argc, argv);
	pthread_mutex_init(&fs.parked_mu, NULL);
	pthread_mutex_init(&fs.handles_mu, NULL);
	lockfs_errlog_start();
	if (fuse_opt_parse(&args, &o, option_spec, other_arg) == -1 ||
	    take_positional(&o, &args) < 0 || fuse_parse_cmdline(&args, &opts) != 0)
		goto out_args;
	if (opts.show_help) {
		usage(argv[0]);
		fuse_cmdline_help();
		fuse_lowlevel_help();
		ret = 0;
		goto out_args;
	}
	if (opts.show_version) {
		printf("lockfs version %s\n", LOCKFS_VERSION);
		fuse_lowlevel_version();
		ret = 0;
		goto out_args;
	}
	if (!opts.mountpoint) {
		fprintf(stderr, "lockfs: no mountpoint given (see %s --help)\n", argv[0]);
		goto out_args;
	}
	backing = o.backing ? o.backing : DEFAULT_BACKING;
	umask(022);
	if ((o.lease && parse_seconds("lease", o.lease, &cfg.lease_s) < 0) ||
	    (o.stale && parse_seconds("stale", o.stale, &cfg.stale_s) < 0) ||
	    (o.break_signal && parse_signal(o.break_signal, &cfg.break_signal) < 0) ||
	    (o.max_open_per_uid &&
	     parse_cap("max_open_per_uid", o.max_open_per_uid, &cfg.max_open_per_uid) < 0) ||
	    (o.max_locks_per_uid &&
	     parse_cap("max_locks_per_uid", o.max_locks_per_uid, &cfg.max_locks_per_uid) < 0) ||
	    (o.max_waiters_per_uid &&
	     parse_cap("max_waiters_per_uid", o.max_waiters_per_uid, &cfg.max_waiters_per_uid) < 0) ||
	    (o.max_locks && parse_cap("max_locks", o.max_locks, &cfg.max_locks) < 0) ||
	    lockfs_log_limits_parse(o.log_max, o.log_keep, o.log_denied_interval, &log_limits) < 0)
		goto out_args;
	if (o.descendants && strcmp(o.descendants, "connector") != 0 &&
	    strcmp(o.descendants, "scan") != 0) {
		fprintf(stderr, "lockfs: -o descendants=%s: want connector or scan\n", o.descendants);
		goto out_args;
	}
	cfg.descendants_scan = o.descendants && strcmp(o.descendants, "scan") == 0;
	raise_fd_limit();

	fs.proc_foreign = !proc_is_ours();
	/* The default is created also when spelled out (fstab's
	 * backing=/run/lockfs at boot, before anything made it). */
	dirfd = open_backing(backing, strcmp(backing, DEFAULT_BACKING) == 0);
	if (dirfd < 0)
		goto out_args;
	lockfd = claim_backing(dirfd, backing);
	if (lockfd < 0)
		goto out_dir;

	rc = lockfs_backend_dir_open(&be, dirfd, backing);
	if (rc < 0) {
		fprintf(stderr, "lockfs: backing dir %s: %s\n", backing,
			rc == -EINVAL ? "filesystem lacks rename(RENAME_NOREPLACE), "
			"so acquisition could not be atomic" : strerror(-rc));
		goto out_lock;
	}
	if (lockfs_log_open_audit(dirfd, backing, &log_limits, &cfg.log) < 0) {
		be->ops->destroy(be);
		goto out_lock;
	}
	cfg.dirfd = dirfd;
	cfg.backend = be;
	cfg.helpers = o.helpers;
	cfg.fence_path = fence_path(o.fence_file, backing);
	rc = lockfs_core_open(&fs.core, &cfg);
	if (rc < 0) {
		be->ops->destroy(be);
		fprintf(stderr, "lockfs: cannot start the lock engine on %s: %s\n",
			backing, rc == -EINVAL ? "bad helpers= list or fence file" :
			rc == -EMLINK ? "the fence file is a symlink, a FIFO, another user's or has "
			"other hard links (it is rewritten in place): remove it, or name another "
			"with -o fence_file=" : strerror(-rc));
		goto out_lock;
	}
	fs.inodes = lockfs_inodes_new();
	if (!fs.inodes) {
		fprintf(stderr, "lockfs: out of memory\n");
		goto out_inodes;
	}
	fs.mount_uid = getuid();
	fs.mount_gid = getgid();
	clock_gettime(CLOCK_REALTIME, &fs.mounted_at);

	/* Show as fuse.lockfs in /proc/mounts, with the backing dir as source. */
	if (fuse_opt_add_arg(&args, "-osubtype=lockfs") == -1 ||
	    fuse_opt_add_opt_escaped(&fsname, backing) == -1)
		goto out_inodes;
	{
		char *opt = malloc(strlen(fsname) + 16);

		if (!opt)
			goto out_inodes;
		sprintf(opt, "-ofsname=%s", fsname);
		rc = fuse_opt_add_arg(&args, opt);
		free(opt);
		if (rc == -1)
			goto out_inodes;
	}

	fs.se = fuse_session_new(&args, &lockfs_ops, sizeof(lockfs_ops), &fs);
	if (!fs.se)
		goto out_inodes;
	lockfs_log_signals_set(fs.core);
	if (fuse_set_signal_handlers(fs.se) != 0)
		goto out_session;
	if (lockfs_stop_install(fs.se) < 0) {
		fprintf(stderr, "lockfs: cannot set signal handlers: %s\n", strerror(errno));
		goto out_signals;
	}
	/* Nothing may touch the mount point before a dead mount of ours is
	 * gone from it: a hung one would hang us. */
	if (lockfs_clear_dead_mount(dirfd, backing, opts.mountpoint) < 0)
		goto out_signals;
	lockfs_guard_before_mount(opts.mountpoint);
	/* Resolved before mounting: afterwards a lookup of the mount point
	 * would be a request to ourselves, with nobody serving yet. */
	mnt_abs = realpath(opts.mountpoint, NULL);
	if (fuse_session_mount(fs.se, opts.mountpoint) != 0)
		goto out_signals;
	{
		/* Tells descriptors of this mount from an earlier mount's (fd
		 * locks rebound at a restart); unknown, all count as earlier. */
		dev_t dev;

		if (mnt_abs && lockfs_mount_dev(mnt_abs, &dev) == 0)
			lockfs_core_set_mount_dev(fs.core, dev);
	}
	/* Detach only now, and `lockfs` returns only once the child has
	 * recorded its pid and serves (daemonize.c). */
	if (!opts.foreground) {
		rc = lockfs_daemonize();
		if (rc < 0) {
			fprintf(stderr, "lockfs: cannot detach: %s\n", strerror(-rc));
			goto out_unmount;
		}
		if (lockfs_errlog_detach() == 0)
			fprintf(stderr, "lockfs: notice: serving %s (backing dir %s)\n",
				opts.mountpoint, backing);
	}
	record_pid(lockfd);
	/* Threads start after the fork that detaching makes. */
	if (lockfs_core_start(fs.core) < 0 || lockfs_stop_start() < 0) {
		int err = errno ? errno : EIO;

		fprintf(stderr, "lockfs: cannot start threads: %s\n", strerror(err));
		lockfs_daemonize_done(err);
		goto out_unmount;
	}

	lockfs_notify_ready(opts.mountpoint, backing);
	lockfs_daemonize_done(0);
	if (opts.singlethread) {
		rc = fuse_session_loop(fs.se);
	} else {
		loop_cfg = fuse_loop_cfg_create();
		if (!loop_cfg) {
			rc = -ENOMEM;
		} else {
			fuse_loop_cfg_set_clone_fd(loop_cfg, opts.clone_fd);
			/* libfuse 3.14 leaves these at UINT_MAX when not given,
			 * then complains about its own default: pass only
			 * values the user set. */
			if (opts.max_idle_threads <= 100000)
				fuse_loop_cfg_set_idle_threads(loop_cfg, opts.max_idle_threads);
			if (opts.max_threads <= 100000)
				fuse_loop_cfg_set_max_threads(loop_cfg, opts.max_threads);
			rc = fuse_session_loop_mt(fs.se, loop_cfg);
			fuse_loop_cfg_destroy(loop_cfg);
		}
	}
	/* A signal or an unmount both end the loop; either is a clean exit. */
	ret = rc < 0 && rc != -EINTR ? 1 : 0;
	lockfs_notify_stopping();
out_unmount:
	lockfs_stop_loop_ended();
	/* No thread of ours ever waits in the kernel on this mount (we send
	 * no notifications: ops.c), so none of these steps can hang, and the
	 * unmount or our exit ends every request still waiting. */
	lockfs_core_stop(fs.core);
	/* Nothing grants any more: tell the waiters the service is gone. */
	lockfs_flock_shutdown(&fs);
	fuse_session_unmount(fs.se);
out_signals:
	fuse_remove_signal_handlers(fs.se);
out_session:
	fuse_session_destroy(fs.se);
	lockfs_handles_free_all(&fs);
out_inodes:
	lockfs_log_signals_set(NULL);
	free(fsname);
	lockfs_inodes_free(fs.inodes);
	lockfs_core_close(fs.core);
out_lock:
	close(lockfd);
out_dir:
	close(dirfd);
out_args:
	free(mnt_abs);
	free(opts.mountpoint);
	free(o.backing);
	free(o.helpers);
	free(o.fence_file);
	free(o.lease);
	free(o.stale);
	free(o.break_signal);
	free(o.positional[0]);
	free(o.positional[1]);
	free(o.descendants);
	free(o.max_open_per_uid);
	free(o.max_locks_per_uid);
	free(o.max_waiters_per_uid);
	free(o.max_locks);
	free(o.log_max);
	free(o.log_keep);
	free(o.log_denied_interval);
	fuse_opt_free_args(&args);
	return ret;
}
