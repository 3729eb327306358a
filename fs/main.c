/*
 * lockfs: named mutual-exclusion locks as directories.
 *
 *   lockfs [-f] [-o backing=DIR] [-o helpers=a:b:c] [-o fence_file=PATH]
 *          [-o lease=SECONDS] [-o stale=SECONDS] [-o break_signal=SIG]
 *          [FUSE options] MOUNTPOINT
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
#include <sys/stat.h>
#include <unistd.h>

#include "fs.h"
#include "lockfs/backend.h"
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
	int show_help;
};

#define OPT(t, p) { t, offsetof(struct options, p), 1 }
static const struct fuse_opt option_spec[] = {
	OPT("backing=%s", backing),
	OPT("helpers=%s", helpers),
	OPT("fence_file=%s", fence_file),
	OPT("lease=%s", lease),
	OPT("stale=%s", stale),
	OPT("break_signal=%s", break_signal),
	FUSE_OPT_END
};

static void usage(const char *prog)
{
	printf("usage: %s [-f] [-o OPTION[,OPTION...]] MOUNTPOINT\n\n"
	       "lockfs options:\n"
	       "    -o backing=DIR        backing directory (default " DEFAULT_BACKING ")\n"
	       "    -o helpers=A:B:...    programs skipped when resolving a holder\n"
	       "                          (default " LOCKFS_DEFAULT_HELPERS ")\n"
	       "    -o fence_file=PATH    fence counter (default " DEFAULT_FENCE_FILE ")\n"
	       "    -o lease=SECONDS      lease of slug-bound locks (default 600)\n"
	       "    -o stale=SECONDS      recover foreign locks older than this (default never)\n"
	       "    -o break_signal=SIG   signal a holder whose lock is broken or recovered\n"
	       "    -o allow_other        let other users and containers use the mount\n"
	       "    -o auto_unmount       unmount when the daemon dies (unattended use)\n\n",
	       prog);
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

	if (is_default && mkdir(dir, 0755) < 0 && errno != EEXIST) {
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
 * life (it survives fuse_daemonize's fork: the lock belongs to the open
 * file description).  The file is truncated and gets our pid, so nothing
 * planted there (a hard link to a file elsewhere, a FIFO) is used: it is
 * looked at before it is opened, and again once open.  Returns the fd, or
 * -1 after one line on stderr.
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
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);

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
	const char *backing;
	char *fsname = NULL, *mnt_abs = NULL;
	int dirfd = -1, lockfd = -1, rc, ret = 1;

	pthread_mutex_init(&fs.parked_mu, NULL);
	pthread_mutex_init(&fs.handles_mu, NULL);
	if (fuse_opt_parse(&args, &o, option_spec, NULL) == -1)
		return 1;
	if (fuse_parse_cmdline(&args, &opts) != 0)
		return 1;
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
	    (o.break_signal && parse_signal(o.break_signal, &cfg.break_signal) < 0))
		goto out_args;

	fs.proc_foreign = !proc_is_ours();
	dirfd = open_backing(backing, !o.backing);
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
	fs.inodes = inodes_new();
	fs.notifier = notifier_new(&fs);
	if (!fs.inodes || !fs.notifier) {
		fprintf(stderr, "lockfs: out of memory\n");
		goto out_inodes;
	}
	lockfs_core_set_removed(fs.core, notifier_removed, fs.notifier);
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
	if (fuse_set_signal_handlers(fs.se) != 0)
		goto out_session;
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
	/* Detach only now: when `lockfs` returns, the mount is ready. */
	fuse_daemonize(opts.foreground);
	record_pid(lockfd);
	/* Threads start after the fork that detaching makes. */
	if (notifier_run(fs.notifier) < 0 || lockfs_core_start(fs.core) < 0) {
		fprintf(stderr, "lockfs: cannot start threads: %s\n", strerror(errno));
		goto out_unmount;
	}

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
out_unmount:
	/* The engine's thread feeds the notifier, which talks to the
	 * session: stop them in that order, before the session goes. */
	lockfs_core_stop(fs.core);
	notifier_free(fs.notifier);
	fs.notifier = NULL;
	/* Nothing grants any more: tell the waiters the service is gone. */
	flock_shutdown(&fs);
	fuse_session_unmount(fs.se);
out_signals:
	fuse_remove_signal_handlers(fs.se);
out_session:
	fuse_session_destroy(fs.se);
	handles_free_all(&fs);
out_inodes:
	free(fsname);
	notifier_free(fs.notifier);
	inodes_free(fs.inodes);
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
	fuse_opt_free_args(&args);
	return ret;
}
