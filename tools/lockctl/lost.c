/*
 * run's watch over its grants while CMD runs, and what it does when one is
 * lost: as `consul lock` does, CMD is told with a signal (SIGTERM unless
 * --lost-signal), SIGKILLed after a grace (--lost-grace), and lockctl
 * exits EX_LOST.
 *
 * How run learns of a loss.  A lost lock (its etcd session lost, its key
 * removed behind it, a root's break) is dropped by the daemon: M/NAME/owner
 * no longer shows our grant's fence (the name is free, in lock-delay, or
 * another's, with a higher fence), and a lookup by the holder's tree may
 * answer ESTALE.  The daemon's own notice, -o break_signal, goes to the
 * recorded holder -- for an fd lock taken by lockctl, the process that ran
 * lockctl, not lockctl -- and only when the administrator set it; inotify
 * sees nothing of releases the daemon makes itself, and M's files cannot be
 * polled for events.  So run reads M/NAME/owner every LOST_CHECK_MS: the
 * daemon answers it from memory (no store round trip), and a daemon that
 * is away (a restart) is no loss: a restarted daemon keeps the grant.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lockctl.h"

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

/* ------------------------------------------------------------------ */
/* the policy: which signal, how long a grace */

static const struct {
	const char *name;
	int sig;
} SIGNALS[] = {
	{ "HUP", SIGHUP }, { "INT", SIGINT }, { "QUIT", SIGQUIT }, { "ABRT", SIGABRT },
	{ "KILL", SIGKILL }, { "USR1", SIGUSR1 }, { "USR2", SIGUSR2 }, { "PIPE", SIGPIPE },
	{ "ALRM", SIGALRM }, { "TERM", SIGTERM }, { "CONT", SIGCONT }, { "STOP", SIGSTOP },
	{ "TSTP", SIGTSTP }, { "WINCH", SIGWINCH }, { "XCPU", SIGXCPU }, { "PWR", SIGPWR },
};

bool lockfs_ctl_parse_signal(const char *text, int *sig)
{
	if (text[0] >= '0' && text[0] <= '9') {
		char *end;
		errno = 0;
		long v = strtol(text, &end, 10);
		if (errno || *end || v < 1 || v > SIGRTMAX)
			return false;
		*sig = (int)v;
		return true;
	}
	if (strncmp(text, "SIG", 3) == 0)
		text += 3;
	for (size_t i = 0; i < sizeof(SIGNALS) / sizeof(SIGNALS[0]); i++) {
		if (strcmp(text, SIGNALS[i].name) == 0) {
			*sig = SIGNALS[i].sig;
			return true;
		}
	}
	return false;
}

int lockfs_ctl_lost_policy(const struct opts *o, int *sig, double *grace)
{
	*sig = SIGTERM;
	*grace = LOST_GRACE_DEFAULT_S;
	const char *env = getenv("LOCKFS_LOST_SIGNAL");
	if (o->has_lost_signal)
		*sig = o->lost_signal;
	else if (env && *env && !lockfs_ctl_parse_signal(env, sig))
		return fail(EX_USAGE, "LOCKFS_LOST_SIGNAL=%s: want a signal name (TERM, SIGINT)"
			    " or number", env);
	env = getenv("LOCKFS_LOST_GRACE");
	if (o->has_lost_grace) {
		*grace = o->lost_grace;
	} else if (env && *env) {
		char *end;
		errno = 0;
		double v = strtod(env, &end);
		if (errno || end == env || *end || !isfinite(v) || v < 0 || v > RESTART_WAIT_MAX_S)
			return fail(EX_USAGE, "LOCKFS_LOST_GRACE=%s: want a number of seconds, 0"
				    " to %d", env, RESTART_WAIT_MAX_S);
		*grace = v;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* our grant, as owner shows it */

/* Process PID's parent (field 4) and start time (field 22): true when it
 * exists. */
static bool proc_stat(pid_t pid, pid_t *ppid, unsigned long long *start)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	int pp;
	if (!p || sscanf(p + 1, " %*c %d", &pp) != 1)
		return false;
	*ppid = pp;
	/* After ") ": state is field 3; start time is field 22. */
	p += 2;
	for (int field = 3; field < 22 && p; field++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	return p && sscanf(p, "%llu", start) == 1;
}

/* Is PID lockctl or one of its ancestors?  The daemon records an fd
 * lock's holder past helpers such as lockctl: its parent, or further up. */
static bool is_us_or_above(long long pid)
{
	pid_t p = getpid();
	for (int depth = 0; depth < 16 && p > 0; depth++) {
		if (p == pid)
			return true;
		pid_t up;
		unsigned long long start;
		if (!proc_stat(p, &up, &start))
			return false;
		p = up;
	}
	return false;
}

long long lockfs_ctl_grant_fence(const char *mnt, const char *name)
{
	int err;
	json_t *owner = lockfs_ctl_read_owner(mnt, name, &err);
	if (!owner)
		return 0;
	json_t *hs = json_object_get(owner, "holders");
	long long best = 0, only = 0;
	size_t fd_bound = 0;
	for (size_t i = 0; json_is_array(hs) && i < json_array_size(hs); i++) {
		const json_t *h = json_array_get(hs, i);
		long long fence, pid;
		const char *bound = lockfs_ctl_jstr(h, "bound");
		if (!lockfs_ctl_jint(h, "fence", &fence) || !bound || strcmp(bound, "fd") != 0)
			continue;
		fd_bound++;
		only = fence;
		/* Two shared grants of one shell's two runs both name the
		 * shell: ours is then the newer, taken just now. */
		if (lockfs_ctl_pid_here(h, &pid) && is_us_or_above(pid) && fence > best)
			best = fence;
	}
	if (!best && fd_bound == 1)
		best = only; /* a holder outside our pid namespace: the one there is */
	if (!best && !json_is_array(hs))
		lockfs_ctl_jint(owner, "fence", &best); /* a record with no holders list */
	json_decref(owner);
	return best;
}

/* Is a FUSE file system mounted on MNT now?  Between a daemon's death and
 * its restart the mount point may be a bare directory, where every NAME is
 * missing: that says nothing of the lock. */
static bool fuse_mounted(const char *mnt)
{
	struct statfs fs;
	struct stat here, above;
	char *parent = xasprintf("%s/..", mnt);
	bool ok = statfs(mnt, &fs) == 0 && fs.f_type == FUSE_SUPER_MAGIC &&
		  stat(mnt, &here) == 0 && stat(parent, &above) == 0 &&
		  here.st_dev != above.st_dev;
	free(parent);
	return ok;
}

/* Does owner still show L's grant?  1 yes, 0 no (lost), -1 cannot tell
 * now (the daemon away, an error): asked again next time. */
static int still_held(const char *mnt, const struct run_lock *l)
{
	int err;
	json_t *owner = lockfs_ctl_read_owner(mnt, l->name, &err);
	if (!owner && err == ENOENT)
		return fuse_mounted(mnt) ? 0 : -1;
	if (!owner)
		return err == ESTALE ? 0 : -1;
	json_t *hs = json_object_get(owner, "holders");
	int held = 0;
	for (size_t i = 0; json_is_array(hs) && i < json_array_size(hs) && !held; i++) {
		long long fence;
		if (lockfs_ctl_jint(json_array_get(hs, i), "fence", &fence) && fence == l->fence)
			held = 1;
	}
	long long top;
	if (!json_is_array(hs) && lockfs_ctl_jint(owner, "fence", &top) && top == l->fence)
		held = 1;
	json_decref(owner);
	return held;
}

/* ------------------------------------------------------------------ */
/* stopping CMD and what it started */

struct proc_ref {
	pid_t pid;
	unsigned long long start;
};

struct tree {
	struct proc_ref *v;
	size_t n, cap;
};

static void tree_add(struct tree *t, pid_t pid, unsigned long long start)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->v[i].pid == pid && t->v[i].start == start)
			return;
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		struct proc_ref *v = realloc(t->v, cap * sizeof(*v));
		if (!v)
			oom();
		t->v = v;
		t->cap = cap;
	}
	t->v[t->n++] = (struct proc_ref){ pid, start };
}

/* Add ROOT and its descendants now (one pass over /proc per generation),
 * to those T holds already (an earlier look: what CMD started since). */
static void tree_collect(struct tree *t, pid_t root)
{
	pid_t ppid;
	unsigned long long start;
	if (!proc_stat(root, &ppid, &start))
		return;
	tree_add(t, root, start);
	bool grew = true;
	for (int gen = 0; gen < 64 && grew; gen++) {
		grew = false;
		DIR *d = opendir("/proc");
		if (!d)
			return;
		struct dirent *e;
		while ((e = readdir(d))) {
			char *end;
			long pid = strtol(e->d_name, &end, 10);
			if (*end || pid <= 0 || !proc_stat((pid_t)pid, &ppid, &start))
				continue;
			size_t n = t->n;
			for (size_t i = 0; i < n; i++) {
				if (t->v[i].pid == ppid) {
					tree_add(t, (pid_t)pid, start);
					grew |= t->n > n;
					break;
				}
			}
		}
		closedir(d);
	}
}

/* Send SIG to every process of T that is still the one we saw. */
static size_t tree_signal(const struct tree *t, int sig)
{
	size_t alive = 0;
	for (size_t i = 0; i < t->n; i++) {
		pid_t ppid;
		unsigned long long start;
		if (!proc_stat(t->v[i].pid, &ppid, &start) || start != t->v[i].start)
			continue;
		alive++;
		if (sig)
			kill(t->v[i].pid, sig);
	}
	return alive;
}

/* ------------------------------------------------------------------ */
/* waiting for CMD */

static long long mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A pidfd of PID, readable once it exits; -1 on kernels without one. */
static int open_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
	return (int)syscall(SYS_pidfd_open, pid, 0);
#else
	(void)pid;
	errno = ENOSYS;
	return -1;
#endif
}

/* "SIGTERM", or "signal 40" for one without a name here, into BUF. */
static const char *signal_name(int sig, char *buf, size_t size)
{
	for (size_t i = 0; i < sizeof(SIGNALS) / sizeof(SIGNALS[0]); i++) {
		if (SIGNALS[i].sig == sig) {
			snprintf(buf, size, "SIG%s", SIGNALS[i].name);
			return buf;
		}
	}
	snprintf(buf, size, "signal %d", sig);
	return buf;
}

int lockfs_ctl_supervise(pid_t pid, const char *mnt, const struct run_lock *locks, size_t n,
			 int sig, double grace, int *st)
{
	int pidfd = open_pidfd(pid);
	long long next_check = mono_ms() + LOST_CHECK_MS, kill_at = 0;
	int lost = -1;
	bool killed = false;
	struct tree tree = { 0 };

	for (;;) {
		pid_t r = waitpid(pid, st, WNOHANG);
		if (r == pid)
			break;
		if (r < 0 && errno != EINTR) {
			int e = errno;
			if (pidfd >= 0)
				close(pidfd);
			free(tree.v);
			errno = e;
			return -2;
		}
		long long now = mono_ms();
		if (lost < 0 && now >= next_check) {
			for (size_t i = 0; i < n && lost < 0; i++)
				if (locks[i].fence > 0 && still_held(mnt, &locks[i]) == 0)
					lost = (int)i;
			next_check = now + LOST_CHECK_MS;
			if (lost >= 0) {
				char sname[24];
				warnmsg("%s: the lock was lost while CMD ran (owner no longer shows"
					" its grant, fence %lld); sending %s to CMD, SIGKILL in %gs",
					locks[lost].name, locks[lost].fence,
					signal_name(sig, sname, sizeof(sname)), grace);
				tree_collect(&tree, pid);
				tree_signal(&tree, sig);
				kill_at = now + (long long)(grace * 1000);
			}
		}
		if (lost >= 0 && !killed && now >= kill_at) {
			tree_collect(&tree, pid); /* what CMD started since */
			tree_signal(&tree, SIGKILL);
			killed = true;
		}
		long long until = lost < 0 ? next_check : killed ? now + 1000 : kill_at;
		int ms = until > now ? (int)(until - now) : 0;
		if (pidfd >= 0) {
			struct pollfd p = { .fd = pidfd, .events = POLLIN };
			poll(&p, 1, ms);
		} else {
			poll(NULL, 0, ms < 50 ? ms : 50); /* no pidfd: look often */
		}
	}
	if (pidfd >= 0)
		close(pidfd);
	/* CMD ended; what it started and left behind, still at work with a
	 * lock that is not held, gets the rest of the grace. */
	while (lost >= 0 && !killed && tree_signal(&tree, 0) > 0) {
		long long now = mono_ms();
		if (now >= kill_at) {
			tree_signal(&tree, SIGKILL);
			break;
		}
		poll(NULL, 0, kill_at - now < 50 ? (int)(kill_at - now) : 50);
	}
	free(tree.v);
	return lost;
}
