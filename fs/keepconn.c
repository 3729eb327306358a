/*
 * The serving process's side of a FUSE connection that outlives it: the
 * first start sets up the keeper (keeper.c) once the kernel is known to
 * resend unanswered requests; every serving process marks itself serving
 * in the state (connstate.c), a successor rebuilds its tables from it and
 * has the kernel resend; a hand-over (`lockfs --upgrade`) leaves without
 * touching anything; a taken-over session unmounts at its clean stop.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "connstate.h"
#include "fdstore.h"
#include "keepconn.h"
#include "keeper.h"
#include "mounts.h"
#include "stop.h"

/* systemd's store keeps the connection (fdstore.c), not a keeper process. */
static bool via_systemd;

bool lockfs_keeper_wanted(const char *keeper, const struct fuse_cmdline_opts *opts, int argc,
			  char *argv[])
{
	if (keeper && strcmp(keeper, "off") == 0)
		return false;
	/* A keeper for the detached daemon; under systemd (in the
	 * foreground, as its units run it) its descriptor store. */
	if (opts->foreground && !lockfs_fdstore_available())
		return false;
	if (opts->singlethread || opts->clone_fd || opts->max_idle_threads <= 100000) {
		fprintf(stderr, "lockfs: notice: no keeper with -s, clone_fd or max_idle_threads "
			"(libfuse's own loops): a restart is seen by clients\n");
		return false;
	}
	for (int i = 1; i < argc; i++)
		if (strstr(argv[i], "auto_unmount")) {
			fprintf(stderr, "lockfs: notice: no keeper with -o auto_unmount (it "
				"unmounts when this process ends): a restart is seen by clients\n");
			return false;
		}
	return true;
}

int lockfs_keeper_setup(struct fuse_session *se, const char *mnt_abs, uint64_t dev,
			char *argv[], int dirfd)
{
	char binary[PATH_MAX], cwd[PATH_MAX];
	int fd = fuse_session_fd(se), state, rc;
	ssize_t n;
	pid_t keeper;

	/* Nothing was read yet: the kernel resends nothing, it only says
	 * whether it knows the notification. */
	rc = lockfs_resume_resend(fd);
	if (rc == -EINVAL || rc == -ENOSYS) {
		fprintf(stderr, "lockfs: notice: this kernel cannot resend requests "
			"(FUSE_NOTIFY_RESEND, Linux 6.9): no keeper, a restart is seen by "
			"clients\n");
		return -1;
	}
	if (rc < 0) {
		fprintf(stderr, "lockfs: warning: FUSE_NOTIFY_RESEND failed (%s): no keeper\n",
			strerror(-rc));
		return -1;
	}
	n = readlink("/proc/self/exe", binary, sizeof(binary) - 1);
	if (n <= 0 || !mnt_abs) {
		fprintf(stderr, "lockfs: warning: cannot tell %s: no keeper\n",
			n <= 0 ? "this program's path (/proc/self/exe)" : "the mount point");
		return -1;
	}
	binary[n] = '\0';
	if (!getcwd(cwd, sizeof(cwd)))
		strcpy(cwd, "/");
	state = lockfs_connstate_create();
	if (state < 0) {
		fprintf(stderr, "lockfs: warning: cannot make the connection's state: %s: no "
			"keeper\n", strerror(-state));
		return -1;
	}
	lockfs_connstate_set_mount(mnt_abs, dev, binary, cwd);
	lockfs_connstate_set_server(getpid());
	if (lockfs_fdstore_available()) {
		rc = lockfs_fdstore_send(fd, state, dirfd, major(dev), minor(dev));
		if (rc < 0) {
			fprintf(stderr, "lockfs: warning: cannot hand the connection to the "
				"service manager's descriptor store: %s\n", strerror(-rc));
			return -1;
		}
		via_systemd = true;
		return 0;
	}
	keeper = lockfs_keeper_start(binary, fd, state, argv);
	if (keeper < 0) {
		fprintf(stderr, "lockfs: warning: cannot start the keeper: %s\n",
			strerror((int)-keeper));
		return -1;
	}
	return 0;
}

void lockfs_keeper_serving(struct lockfs_fs *fs, const struct lockfs_resume *r)
{
	int rc;

	if (r && r->from_systemd)
		via_systemd = true;
	lockfs_connstate_set_server(getpid());
	if (r) {
		lockfs_inodes_restore(fs->inodes);
		lockfs_handles_restore(fs);
	}
	lockfs_connstate_set_phase(LOCKFS_PHASE_SERVING);
	if (!r)
		return;
	rc = lockfs_resume_resend(fuse_session_fd(fs->se));
	if (rc < 0)
		fprintf(stderr, "lockfs: the kernel refused to resend the requests that the "
			"previous daemon had not answered (%s): their callers wait for ever\n",
			strerror(-rc));
}

void lockfs_keeper_kept(void)
{
	int rc = lockfs_stop_install_handover();

	if (rc < 0)
		fprintf(stderr, "lockfs: warning: cannot set the SIGUSR2 handler: %s: `lockfs "
			"--upgrade` will not work\n", strerror(-rc));
}

void lockfs_keeper_stopped(int dirfd)
{
	lockfs_connstate_set_phase(LOCKFS_PHASE_STOPPED);
	if (via_systemd)
		lockfs_fdstore_forget(dirfd);
}

void lockfs_keeper_hand_over(void)
{
	lockfs_connstate_set_phase(LOCKFS_PHASE_HANDOVER);
	fflush(stderr);
	_exit(LOCKFS_EXIT_HANDOVER);
}

/* Is the top mount on MNT_ABS the connection's (fuse.lockfs, the state's
 * device)? */
static bool is_our_mount(const char *mnt_abs)
{
	struct lockfs_mount top;
	char *buf = NULL;
	uint64_t dev = lockfs_connstate_mount_dev();
	bool ours;

	ours = lockfs_mount_top(mnt_abs, &top, &buf) > 0 && strcmp(top.fstype, "fuse.lockfs") == 0 &&
	       (!dev || makedev(top.major, top.minor) == (dev_t)dev);
	free(buf);
	return ours;
}

bool lockfs_resume_still_mounted(void)
{
	const char *mnt = lockfs_connstate_mountpoint();

	if (*mnt && is_our_mount(mnt))
		return true;
	fprintf(stderr, "lockfs: notice: the mount of this connection is gone from %s "
		"(another daemon replaced it): not taking it over\n", mnt);
	return false;
}

void lockfs_resume_unmount(const char *mnt_abs)
{
	if (!mnt_abs || !is_our_mount(mnt_abs))
		return;
	if (geteuid() == 0) {
		if (umount2(mnt_abs, MNT_DETACH) < 0)
			fprintf(stderr, "lockfs: cannot unmount %s: %s\n", mnt_abs, strerror(errno));
		return;
	}
	{
		pid_t pid = fork();
		int status;

		if (pid == 0) {
			execlp("fusermount3", "fusermount3", "-u", "-z", "--", mnt_abs, (char *)NULL);
			_exit(127);
		}
		if (pid > 0)
			while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
				;
	}
}
