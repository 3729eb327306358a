/*
 * lockctl (see lockctl.h): the verbs run, acquire, release and break, and
 * main, which parses the command line, finds the mount and runs the verb.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <unistd.h>

#include <jansson.h>

#include "lockfs/limits.h"

#include "lockctl.h"

/* ------------------------------------------------------------------ */
/* verbs */

/* Write TEXT to PATH (no O_TRUNC, one write).  Returns 0 or errno. */
static int write_text(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return errno;
	size_t len = strlen(text);
	ssize_t n;
	do
		n = write(fd, text, len);
	while (n < 0 && errno == EINTR);
	int e = n < 0 ? errno : (size_t)n != len ? EIO : 0;
	if (close(fd) < 0 && !e && errno != EINTR)
		e = errno;
	return e;
}

static int cmd_acquire(const struct opts *o, char **mnt, double restart_wait,
		       const char *slug)
{
	/* acquire binds the lock to the process that ran lockctl, and the
	 * daemon never looks for it outside lockctl's pid namespace: with a
	 * parent there (getppid() is 0: the first process of `unshare --pid
	 * --fork`, or `podman exec C lockctl acquire`), lockctl itself would
	 * hold, and the lock would go when it exits.  Say so before waiting.
	 * A slug lock is nobody's process's. */
	if (!slug && getppid() == 0)
		return fail(EX_USAGE, "%s: acquire binds the lock to the process that ran lockctl,"
			    " which is outside this pid namespace; use lockctl run, --slug, or a"
			    " shell inside (sh -c 'lockctl acquire ...; ...')", o->name);
	int fd, e;
	for (;;) {
		int rc = lockfs_ctl_take_lock(o, mnt, restart_wait, LOCK_EX, &fd);
		if (rc)
			return rc;
		char *path = xasprintf("%s/%s/bind", *mnt, o->name);
		e = write_text(path, slug ? "slug\n" : "process\n");
		free(path);
		if (!lockfs_ctl_is_conn_error(e))
			break;
		/* The daemon went between the grant and the bind: that grant
		 * was the old connection's.  Let its descriptor go (the
		 * restarted daemon ends what it rebound to us once nobody has
		 * it) and take the lock anew. */
		close(fd);
		free(*mnt);
		*mnt = NULL;
	}
	if (e) {
		/* Not bound: give the lock back rather than leave it to this
		 * process's exit. */
		lockfs_ctl_unlock_close(fd);
		if (e == ENOENT)
			return fail(EX_UNAVAILABLE, "%s: %s/%s/bind is missing: this lockfs daemon is"
				    " too old for lockctl acquire", o->name, *mnt, o->name);
		/* EACCES: the daemon would bind the lock to a helper (this
		 * lockctl, or the timeout or env that ran it) that exits at
		 * once, its parent being another user's or outside its pid
		 * namespace (holder.md). */
		if (e == EACCES && !slug)
			return fail(EX_NOPERM, "%s: cannot bind the lock to the calling process: %s"
				    " (no process above lockctl can hold it: the parent of lockctl, or"
				    " of the helper that ran it, is another user's or outside this pid"
				    " namespace; run lockctl from a shell)", o->name, strerror(e));
		if (e == EPERM || e == EACCES)
			return fail(EX_NOPERM, "%s: cannot bind the lock to %s: %s", o->name,
				    slug ? "the slug" : "the calling process", strerror(e));
		return fail(EXIT_FAIL, "%s: cannot bind the lock to %s: %s", o->name,
			    slug ? "the slug" : "the calling process", strerror(e));
	}
	close(fd); /* bound: this close releases nothing */
	return 0;
}

static int cmd_release(const struct opts *o, const char *mnt)
{
	char *path = xasprintf("%s/%s", mnt, o->name);
	int rc = rmdir(path);
	int e = errno;
	free(path);
	if (rc == 0)
		return 0;
	if (e == ENOENT)
		return fail(EXIT_FAIL, "%s is not held", o->name);
	if (e == EPERM) {
		char *who = lockfs_ctl_holder_now(mnt, o->name);
		int st = fail(EX_NOPERM, "%s: not yours to release (%s)", o->name, who);
		free(who);
		return st;
	}
	if (e == EACCES)
		return fail(EX_NOPERM, "%s: release refused: %s", o->name, strerror(e));
	if (e == EINVAL || e == ENAMETOOLONG)
		return fail(EX_USAGE, "'%s' is not a valid lock name: %s", o->name, strerror(e));
	return fail(errno_status(e), "%s: rmdir: %s", o->name, strerror(e));
}

static int cmd_break(const struct opts *o, const char *mnt)
{
	char *path = xasprintf("%s/%s/break", mnt, o->name);
	int e = write_text(path, o->reason);
	free(path);
	if (!e)
		return 0;
	if (e == ENOENT)
		return fail(EXIT_FAIL, "%s is not held", o->name);
	if (e == EPERM || e == EACCES)
		return fail(EX_NOPERM, "%s: only root or the user who mounted %s may break a lock"
			    " (%s)", o->name, mnt, strerror(e));
	if (e == EINVAL || e == EFBIG)
		return fail(EX_USAGE, "%s: reason refused: %s (1 to %d bytes of UTF-8, no NUL)",
			    o->name, strerror(e), LOCKFS_REASON_MAX);
	return fail(errno_status(e), "%s: break: %s", o->name, strerror(e));
}

/* ------------------------------------------------------------------ */

/*
 * The daemon reads LOCKFS_SLUG from /proc/PID/environ, the environment at
 * exec time, so a slug given on the command line only counts once lockctl
 * runs with it: set it and exec ourselves again (same pid, same parent).
 * Returns only on failure, with an exit status.
 */
static int reexec_with_slug(char **argv, const char *slug)
{
	if (setenv("LOCKFS_SLUG", slug, 1) < 0)
		return fail(EXIT_FAIL, "setenv LOCKFS_SLUG: %s", strerror(errno));
	execv("/proc/self/exe", argv);
	return fail(EXIT_FAIL, "cannot re-execute /proc/self/exe with LOCKFS_SLUG set: %s",
		    strerror(errno));
}

/* watch's names: the words after "watch" that are not options (ARGV is
 * reordered so that they come first from the returned pointer). */
static char **watch_names(int argc, char **argv)
{
	int n = 0;
	bool after_verb = false;

	for (int i = 1; i < argc; i++) {
		if (argv[i][0] == '-') {
			if (strcmp(argv[i], "--mount") == 0)
				i++; /* its value */
			continue;
		}
		if (!after_verb) {
			after_verb = true;
			continue;
		}
		argv[n++] = argv[i]; /* argv[0] and the verb are read no more */
	}
	argv[n] = NULL;
	return argv;
}

int main(int argc, char **argv)
{
	struct opts o;
	int rc = lockfs_ctl_parse_args(argc, argv, &o);
	if (rc)
		return rc;
	if (o.help) {
		fputs(lockfs_ctl_usage, stdout);
		return fflush(stdout) == 0 ? 0 : EXIT_FAIL;
	}
	if (o.version) {
		printf("lockctl %s\n", LOCKFS_VERSION);
		return 0;
	}
	rc = lockfs_ctl_check_args(&o);
	if (rc)
		return rc;

	const char *env_slug = getenv("LOCKFS_SLUG");
	if (o.slug && (!env_slug || strcmp(env_slug, o.slug) != 0))
		return reexec_with_slug(argv, o.slug);
	/* As for mkdir: a slug in the environment binds acquire to it. */
	const char *slug = o.slug ? o.slug : env_slug && *env_slug ? env_slug : NULL;

	char *mnt = NULL;
	double restart_wait = 0;
	if (o.verb == V_RUN || o.verb == V_ACQUIRE) {
		/* These two ride out a daemon that is away (a restart): the
		 * mount is found again as they take the lock. */
		rc = lockfs_ctl_restart_wait(&o, &restart_wait);
		if (rc)
			return rc;
		rc = lockfs_ctl_find_mount(o.mount, &mnt);
		if (rc > 0)
			return rc;
	} else {
		rc = lockfs_ctl_find_mount_now(o.mount, &mnt);
		if (rc)
			return rc;
	}
	lockfs_ctl_save_signals();

	switch (o.verb) {
	case V_RUN:
		rc = lockfs_ctl_run(&o, &mnt, restart_wait); /* run.c */
		break;
	case V_ACQUIRE:
		rc = cmd_acquire(&o, &mnt, restart_wait, slug);
		break;
	case V_RELEASE:
		rc = cmd_release(&o, mnt);
		break;
	case V_STATUS:
		rc = lockfs_ctl_status(&o, mnt);
		break;
	case V_BREAK:
		rc = cmd_break(&o, mnt);
		break;
	case V_WATCH: {
		char **names = watch_names(argc, argv);
		int n = 0;

		while (names[n])
			n++;
		rc = lockfs_ctl_watch(mnt, names, n);
		break;
	}
	case V_METRICS:
		rc = lockfs_ctl_metrics(mnt);
		break;
	case V_TOP:
		rc = lockfs_ctl_top(mnt);
		break;
	default:
		rc = lockfs_ctl_usage_error("no command given");
		break;
	}
	free(mnt);
	return rc;
}
