/*
 * lockfs: named mutual-exclusion locks as directories.
 *
 *   lockfs [-f] [-o backing=DIR] [-o helpers=a:b:c] [-o fence_file=PATH]
 *          [FUSE options] MOUNTPOINT
 *
 * Checks the backing directory and takes it for this daemon before
 * mounting, so a misconfigured lock is a one-line error at second zero,
 * never a silent no-op mutex.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
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
#define DAEMON_LOCK ".lockfs"

struct options {
	char *backing;
	char *helpers;
	char *fence_file;
	int show_help;
};

#define OPT(t, p) { t, offsetof(struct options, p), 1 }
static const struct fuse_opt option_spec[] = {
	OPT("backing=%s", backing),
	OPT("helpers=%s", helpers),
	OPT("fence_file=%s", fence_file),
	FUSE_OPT_END
};

static void usage(const char *prog)
{
	printf("usage: %s [-f] [-o OPTION[,OPTION...]] MOUNTPOINT\n\n"
	       "lockfs options:\n"
	       "    -o backing=DIR        backing directory (default " DEFAULT_BACKING ")\n"
	       "    -o helpers=A:B:...    programs skipped when resolving a holder\n"
	       "                          (default " LOCKFS_DEFAULT_HELPERS ")\n"
	       "    -o fence_file=PATH    fence counter (default DIR/.fence)\n"
	       "    -o allow_other        let other users and containers use the mount\n\n",
	       prog);
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
	if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) < 0) {
		fprintf(stderr, "lockfs: backing dir %s is not writable: %s\n", dir, strerror(errno));
		return -1;
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		fprintf(stderr, "lockfs: backing dir %s: %s\n", dir, strerror(errno));
	return fd;
}

/*
 * One daemon per backing dir: hold flock(2) on DIR/.lockfs for our whole
 * life (it survives fuse_daemonize's fork: the lock belongs to the open
 * file description).  Returns the fd, or -1 after one line on stderr.
 */
static int claim_backing(int dirfd, const char *dir)
{
	char pid[32] = "";
	int fd = openat(dirfd, DAEMON_LOCK, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);

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
	char *fsname = NULL;
	int dirfd = -1, lockfd = -1, rc, ret = 1;

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

	dirfd = open_backing(backing, !o.backing);
	if (dirfd < 0)
		goto out_args;
	lockfd = claim_backing(dirfd, backing);
	if (lockfd < 0)
		goto out_dir;

	rc = lockfs_backend_dir_open(&be, dirfd);
	if (rc < 0) {
		fprintf(stderr, "lockfs: backing dir %s: %s\n", backing,
			rc == -EINVAL ? "filesystem lacks rename(RENAME_NOREPLACE), "
			"so acquisition could not be atomic" : strerror(-rc));
		goto out_lock;
	}
	cfg.dirfd = dirfd;
	cfg.backend = be;
	cfg.helpers = o.helpers;
	cfg.fence_path = o.fence_file;
	rc = lockfs_core_open(&fs.core, &cfg);
	if (rc < 0) {
		be->ops->destroy(be);
		fprintf(stderr, "lockfs: cannot start the lock engine on %s: %s\n",
			backing, rc == -EINVAL ? "bad helpers= list or fence file" : strerror(-rc));
		goto out_lock;
	}
	fs.inodes = inodes_new();
	if (!fs.inodes) {
		fprintf(stderr, "lockfs: out of memory\n");
		goto out_core;
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
	if (fuse_set_signal_handlers(fs.se) != 0)
		goto out_session;
	if (fuse_session_mount(fs.se, opts.mountpoint) != 0)
		goto out_signals;
	/* Detach only now: when `lockfs` returns, the mount is ready. */
	fuse_daemonize(opts.foreground);
	record_pid(lockfd);

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
	fuse_session_unmount(fs.se);
out_signals:
	fuse_remove_signal_handlers(fs.se);
out_session:
	fuse_session_destroy(fs.se);
out_inodes:
	free(fsname);
	inodes_free(fs.inodes);
out_core:
	lockfs_core_close(fs.core);
out_lock:
	close(lockfd);
out_dir:
	close(dirfd);
out_args:
	free(opts.mountpoint);
	free(o.backing);
	free(o.helpers);
	free(o.fence_file);
	fuse_opt_free_args(&args);
	return ret;
}
