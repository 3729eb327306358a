/*
 * Opening a store's local state directory: the checks that make it safe
 * to trust (nobody but the daemon's user may forge or remove what is in
 * it) and the one-daemon lock.  Moved here from fs/main.c's open_backing
 * and claim_backing; the messages are theirs, word for word, without the
 * "lockfs: " that main() puts in front.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "statedir.h"

static void say(char *why, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void say(char *why, size_t size, const char *fmt, ...)
{
	va_list ap;

	if (!why || size == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(why, size, fmt, ap);
	va_end(ap);
}

/*
 * Check DIR and open it.  The default is created when missing; an explicit
 * one must already be there.  Returns an fd, or -errno with WHY said.
 */
static int open_checked(const char *dir, bool is_default, char *why, size_t size)
{
	struct stat st;
	int fd, err;

	/* Created here: only the daemon reads it (records name holders);
	 * one that exists keeps its mode and is checked as any other. */
	if (is_default && mkdir(dir, 0700) < 0 && errno != EEXIST) {
		err = errno;
		say(why, size, "cannot create backing dir %s: %s", dir, strerror(err));
		return -err;
	}
	if (stat(dir, &st) < 0) {
		err = errno;
		say(why, size, "backing dir %s: %s", dir, strerror(err));
		return -err;
	}
	if (!S_ISDIR(st.st_mode)) {
		say(why, size, "backing dir %s is not a directory", dir);
		return -ENOTDIR;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		say(why, size, "backing dir %s is writable by %s (mode %04o); "
		    "anyone could forge or remove locks: chmod go-w it",
		    dir, st.st_mode & S_IWOTH ? "all users" : "its group",
		    (unsigned)(st.st_mode & 07777));
		return -EPERM;
	}
	/* Its owner can write it whatever the mode says. */
	if (st.st_uid != geteuid() && st.st_uid != 0) {
		say(why, size, "backing dir %s belongs to uid %u, who could forge or remove "
		    "locks: chown it to uid %u", dir, (unsigned)st.st_uid, (unsigned)geteuid());
		return -EPERM;
	}
	if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) < 0) {
		err = errno;
		say(why, size, "backing dir %s is not writable: %s", dir, strerror(err));
		return -err;
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		err = errno;
		say(why, size, "backing dir %s: %s", dir, strerror(err));
		return -err;
	}
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
 * One daemon per directory: hold flock(2) on DIR/.lockfs for the daemon's
 * whole life (it survives fuse_daemonize's fork: the lock belongs to the
 * open file description).  The file is truncated and gets the pid, so
 * nothing planted there (a hard link to a file elsewhere, a FIFO) is used:
 * it is looked at before it is opened, and again once open.  A predecessor
 * that died but is wedged in the kernel is aborted and replaced (TAKEOVER);
 * one that is stopping is waited for (predecessor.c); a live one is
 * refused.  What was found of the predecessor goes in *PREV.  Returns the
 * fd, or -errno with WHY said.
 */
static int claim(int dirfd, const char *dir, lockfs_takeover_fn takeover, void *arg,
		 struct lockfs_predecessor *prev, char *why, size_t size)
{
	char pid[32] = "";
	const char *bad = NULL;
	struct stat st;
	int fd, err;

	if (fstatat(dirfd, LOCKFS_STATEDIR_LOCK, &st, AT_SYMLINK_NOFOLLOW) == 0)
		bad = not_own_plain_file(&st);
	fd = bad ? -1 : openat(dirfd, LOCKFS_STATEDIR_LOCK, O_RDWR | O_CREAT | O_CLOEXEC |
			       O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644);
	if (fd < 0 && !bad)
		err = errno;
	if (fd >= 0 && fstat(fd, &st) == 0)
		bad = not_own_plain_file(&st);
	if (bad) {
		say(why, size, "%s/" LOCKFS_STATEDIR_LOCK " is %s, not a plain file of lockfs's "
		    "own; lockfs writes its pid there, so it will not start: remove it", dir, bad);
		if (fd >= 0)
			close(fd);
		return -EPERM;
	}
	if (fd < 0) {
		say(why, size, "cannot open %s/" LOCKFS_STATEDIR_LOCK ": %s", dir, strerror(err));
		return -err;
	}
	memset(prev, 0, sizeof(*prev));
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		/* The pid before the takeover reads it: a wedged one is
		 * reported as taken over, not as crashed. */
		pid_t holder = lockfs_statedir_pid_in(fd);
		int64_t t0 = lockfs_boot_ms();
		int rc;

		rc = takeover ? takeover(arg, fd, dirfd, dir) : -EBUSY;
		ssize_t n;

		if (rc == -EBUSY)
			rc = lockfs_statedir_wait_predecessor(fd, &prev->waited_pid,
							      &prev->waited_ms);
		else if (rc > 0)
			prev->taken_over = holder > 0;
		if (rc == 0 && !prev->waited_pid && holder > 0) {
			/* A zombie that finished exiting within the takeover's grace. */
			prev->waited_pid = holder;
			prev->waited_ms = (unsigned)(lockfs_boot_ms() - t0);
		}
		if (rc >= 0) {
			prev->left_pid = prev->taken_over ? holder : lockfs_statedir_pid_in(fd);
			return fd;
		}
		if (rc == -ETIMEDOUT) {
			say(why, size, "backing dir %s is still served by a lockfs daemon that is "
			    "stopping (pid %d) but has not exited after %d s; try again once it "
			    "has", dir, (int)prev->waited_pid, LOCKFS_STATEDIR_WAIT_MS / 1000);
			close(fd);
			return rc;
		}
		if (rc != -EBUSY) {
			/* The takeover said why on stderr itself. */
			say(why, size, "cannot take over %s/" LOCKFS_STATEDIR_LOCK ": %s", dir,
			    strerror(-rc));
			close(fd);
			return rc;
		}
		n = pread(fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		say(why, size, "backing dir %s is already served by another lockfs "
		    "daemon%s%s%s; mount it once and bind-mount that",
		    dir, *pid ? " (pid " : "", pid, *pid ? ")" : "");
		close(fd);
		return -EBUSY;
	}
	prev->left_pid = lockfs_statedir_pid_in(fd);
	return fd;
}

int lockfs_statedir_open(struct lockfs_statedir *sd, const char *path, bool is_default,
			 lockfs_takeover_fn takeover, void *takeover_arg,
			 char *why, size_t why_size)
{
	int dirfd, lockfd;

	sd->dirfd = sd->lockfd = -1;
	sd->pid_recorded = false;
	sd->path = strdup(path);
	if (!sd->path) {
		say(why, why_size, "out of memory");
		return -ENOMEM;
	}
	dirfd = open_checked(path, is_default, why, why_size);
	if (dirfd < 0)
		goto fail;
	lockfd = claim(dirfd, path, takeover, takeover_arg, &sd->prev, why, why_size);
	if (lockfd < 0) {
		close(dirfd);
		dirfd = lockfd;
		goto fail;
	}
	sd->dirfd = dirfd;
	sd->lockfd = lockfd;
	return 0;
fail:
	free(sd->path);
	sd->path = NULL;
	return dirfd;
}

int lockfs_statedir_record_pid(struct lockfs_statedir *sd)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());

	if (ftruncate(sd->lockfd, 0) == 0 && pwrite(sd->lockfd, buf, (size_t)n, 0) == n) {
		/* Emptied again at a clean stop (lockfs_statedir_close). */
		sd->pid_recorded = true;
		return 0;
	}
	fprintf(stderr, "lockfs: warning: cannot record pid in " LOCKFS_STATEDIR_LOCK "\n");
	return -EIO;
}

int lockfs_backend_record_pid(struct lockfs_backend *be)
{
	return be->statedir ? lockfs_statedir_record_pid(be->statedir) : 0;
}

void lockfs_statedir_forget_predecessor(struct lockfs_statedir *sd)
{
	if (sd->lockfd >= 0 && sd->prev.left_pid > 0 && !sd->pid_recorded &&
	    ftruncate(sd->lockfd, 0) < 0)
		fprintf(stderr, "lockfs: warning: cannot empty %s/" LOCKFS_STATEDIR_LOCK ": %s\n",
			sd->path, strerror(errno));
}

void lockfs_statedir_mark_stopping(const struct lockfs_statedir *sd)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1 };

	/* Nobody else takes this lock: it cannot fail for contention.  A
	 * second call (signal, then the loop's end) changes nothing. */
	if (sd && sd->lockfd >= 0)
		(void)fcntl(sd->lockfd, F_OFD_SETLK, &fl);
}

struct lockfs_predecessor lockfs_backend_predecessor(const struct lockfs_backend *be)
{
	struct lockfs_predecessor none = { 0 };

	return be->statedir ? be->statedir->prev : none;
}

void lockfs_backend_forget_predecessor(struct lockfs_backend *be)
{
	if (be->statedir)
		lockfs_statedir_forget_predecessor(be->statedir);
}

void lockfs_backend_mark_stopping(const struct lockfs_backend *be)
{
	lockfs_statedir_mark_stopping(be->statedir);
}

void lockfs_statedir_close(struct lockfs_statedir *sd)
{
	/* An empty file is the mark of a clean stop: the next daemon finds
	 * no pid and so reports no crash (a pid left there is reported). */
	if (sd->lockfd >= 0 && sd->pid_recorded && ftruncate(sd->lockfd, 0) < 0)
		fprintf(stderr, "lockfs: warning: cannot empty %s/" LOCKFS_STATEDIR_LOCK ": %s\n",
			sd->path, strerror(errno));
	if (sd->lockfd >= 0)
		close(sd->lockfd); /* the flock goes with its last descriptor */
	if (sd->dirfd >= 0)
		close(sd->dirfd);
	free(sd->path);
	sd->dirfd = sd->lockfd = -1;
	sd->path = NULL;
}
