/*
 * lockctl run NAME... -- CMD: take every NAME in one canonical order,
 * run CMD with the fences of its grants in LOCKFS_FENCE, stop it should a
 * lock be lost (lost.c), and release everything once it ends.
 *
 * The order is the byte order of the names (strcmp), whatever order they
 * were given in: two runs that share names then wait for them in the same
 * order, and neither can hold one the other waits for while it waits for
 * one the other holds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "lockfs/limits.h"
#include "lockctl.h"

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct run_lock *)a)->name, ((const struct run_lock *)b)->name);
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * Give up the lock run held for CMD through FD, and close FD.  When the
 * daemon's connection went while CMD ran, the lock was not lost: it stays
 * in DIR, a restarted daemon rebinds it to this process (which holds the
 * old descriptor), and it ends when lockctl exits; say so.
 */
static void run_unlock(const char *name, int fd)
{
	int rc;
	while ((rc = flock(fd, LOCK_UN)) < 0 && errno == EINTR)
		;
	int e = rc < 0 ? errno : 0;
	close(fd);
	if (lockfs_ctl_is_conn_error(e))
		warnmsg("%s: the connection to the lockfs daemon was lost while CMD ran (%s), and"
			" CMD was left to finish; the lock stayed in the daemon's directory, and a"
			" restarted daemon ends it as lockctl exits", name, strerror(e));
}

/* Release LOCKS[0..N), the last taken first. */
static void release_all(struct run_lock *locks, size_t n)
{
	while (n > 0) {
		n--;
		run_unlock(locks[n].name, locks[n].fd);
		locks[n].fd = -1;
	}
}

/*
 * Take LOCKS[N] in their order; --timeout bounds the whole, not each.
 * Returns 0 with all held, or the exit status of the one that could not
 * be taken, after saying why, with none held.
 */
static int take_all(const struct opts *o, char **mnt, double restart_wait,
		    struct run_lock *locks, size_t n)
{
	double deadline = mono_s() + o->timeout;
	for (size_t i = 0; i < n; i++) {
		struct opts one = *o;
		one.name = locks[i].name;
		if (o->has_timeout && o->timeout > 0) {
			/* The time left; none left is one last try. */
			double left = deadline - mono_s();
			one.timeout = left > 1e-3 ? left : 0;
		}
		int rc = lockfs_ctl_take_lock(&one, mnt, restart_wait,
					      o->shared ? LOCK_SH : LOCK_EX, &locks[i].fd);
		if (rc) {
			release_all(locks, i);
			return rc;
		}
	}
	return 0;
}

/* LOCKFS_FENCE: the fences of LOCKS[N], in their order, space-separated
 * ("0" for one whose fence owner did not show). */
static int export_fences(const struct run_lock *locks, size_t n)
{
	size_t size = n * 21 + 1, len = 0;
	char *text = malloc(size);
	if (!text)
		oom();
	text[0] = '\0';
	for (size_t i = 0; i < n; i++)
		len += (size_t)snprintf(text + len, size - len, "%s%lld", i ? " " : "",
					locks[i].fence);
	int rc = setenv("LOCKFS_FENCE", text, 1);
	free(text);
	return rc < 0 ? -errno : 0;
}

/* LOCKFS_SLOT: the slot the daemon says FD's lock holds (a read of the
 * .flock/.slots file).  0 or EXIT_FAIL after saying why. */
static int export_slot(int fd)
{
	char buf[16];
	ssize_t got = pread(fd, buf, sizeof(buf) - 1, 0);
	if (got <= 1 || buf[got - 1] != '\n')
		return fail(EXIT_FAIL, "the daemon did not say which slot was granted (%s)",
			    got < 0 ? strerror(errno) : "no answer");
	buf[got - 1] = '\0';
	if (setenv("LOCKFS_SLOT", buf, 1) < 0)
		return fail(EXIT_FAIL, "setenv LOCKFS_SLOT: %s", strerror(errno));
	return 0;
}

/* The fence of the grant of slot $LOCKFS_SLOT in VIEW's owner (every
 * slot's holders, each with its "slot"): holders of two runs of one
 * shell look alike, their slots do not.  0 when it does not show. */
static long long slot_fence(const char *mnt, const char *view)
{
	int err;
	long long slot = atoll(getenv("LOCKFS_SLOT")), k, fence = 0;
	json_t *owner = lockfs_ctl_read_owner(mnt, view, &err);
	json_t *hs = owner ? json_object_get(owner, "holders") : NULL;
	for (size_t i = 0; json_is_array(hs) && i < json_array_size(hs); i++) {
		json_t *h = json_array_get(hs, i);
		if (lockfs_ctl_jint(h, "slot", &k) && k == slot)
			lockfs_ctl_jint(h, "fence", &fence);
	}
	json_decref(owner);
	return fence;
}

int lockfs_ctl_run(const struct opts *o, char **mnt, double restart_wait)
{
	int sig;
	double grace;
	int rc = lockfs_ctl_lost_policy(o, &sig, &grace);
	if (rc)
		return rc;

	size_t n = (size_t)o->nnames;
	struct run_lock locks[RUN_NAMES_MAX];
	for (size_t i = 0; i < n; i++)
		locks[i] = (struct run_lock){ .name = o->names[i], .fd = -1, .fence = 0 };
	qsort(locks, n, sizeof(locks[0]), by_name);

	/* A slot: waited for on M/.flock/.slots/NAME=N, watched (fence, loss)
	 * through M/.slots/NAME, whose owner lists every slot's holders. */
	char slot_take[LOCKFS_NAME_MAX + 16], slot_view[LOCKFS_NAME_MAX + 16];
	if (o->slots) {
		snprintf(slot_take, sizeof(slot_take), ".slots/%s=%u", o->name, o->slots);
		snprintf(slot_view, sizeof(slot_view), ".slots/%s", o->name);
		locks[0].name = slot_take;
	}
	rc = take_all(o, mnt, restart_wait, locks, n);
	if (rc == 0 && o->slots) {
		rc = export_slot(locks[0].fd);
		locks[0].name = slot_view;
		if (rc)
			release_all(locks, n);
	}
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++)
		locks[i].fence = o->slots ? slot_fence(*mnt, locks[i].name)
					  : lockfs_ctl_grant_fence(*mnt, locks[i].name);
	int e = export_fences(locks, n);
	if (e) {
		release_all(locks, n);
		return fail(EXIT_FAIL, "setenv LOCKFS_FENCE: %s", strerror(-e));
	}

	pid_t pid = lockfs_ctl_spawn(o->cmd, locks, n);
	if (pid < 0) {
		release_all(locks, n);
		return fail(EXIT_FAIL, "fork: %s", strerror((int)-pid));
	}

	int st;
	int lost = lockfs_ctl_supervise(pid, *mnt, locks, n, sig, grace, &st);
	if (lost == -2) {
		e = errno;
		release_all(locks, n);
		return fail(EXIT_FAIL, "waitpid: %s", strerror(e));
	}
	release_all(locks, n);
	if (lost >= 0)
		return EX_LOST; /* said by lockfs_ctl_supervise */
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return EXIT_FAIL;
}
