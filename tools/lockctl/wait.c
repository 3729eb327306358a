/*
 * Taking the lock: opening M/.flock/NAME, waiting in the daemon's queue
 * with flock(2) under --timeout, the waiting line on a terminal (a helper
 * thread; the main thread sits in flock), and the signals: a timeout,
 * a termination while waiting, and passing signals on to run's CMD.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "lockctl.h"

/* ------------------------------------------------------------------ */
/* the waiting line (a helper thread; the main thread sits in flock) */

/* The waiting line is on stderr (set by the display thread, read by the
 * signal handlers, which clear it before a fatal signal). */
static volatile sig_atomic_t line_on_tty;

struct display {
	const char *name;
	char *mnt;   /* malloc'd; NULL while the daemon is away; protected by mu */
	long long started_ms;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;   /* protected by mu */
	bool shown;  /* written only by the thread; read after join */
	bool running;
};

/* The pid of process PID's parent, or 0. */
static pid_t parent_of(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	int ppid = 0;
	if (!p || sscanf(p + 1, " %*c %d", &ppid) != 1)
		return 0;
	return ppid;
}

/*
 * Our place in WAITERS (1-based), or 0 if we are not there.  The daemon
 * lists the resolved holder-to-be, which is lockctl's parent (lockctl is a
 * helper) or, under other helpers (timeout, env...), a further ancestor;
 * our own pid is tried first, then the parent, then the ancestors.
 */
static size_t my_place(const json_t *waiters)
{
	pid_t chain[8];
	size_t nchain = 0;
	chain[nchain++] = getpid();
	chain[nchain++] = getppid();
	while (nchain < sizeof(chain) / sizeof(chain[0])) {
		pid_t p = parent_of(chain[nchain - 1]);
		if (p <= 1)
			break;
		chain[nchain++] = p;
	}
	for (size_t c = 0; c < nchain; c++) {
		for (size_t i = 0; i < json_array_size(waiters); i++) {
			long long pid;
			if (lockfs_ctl_jint(json_array_get(waiters, i), "pid", &pid) && pid == chain[c])
				return i + 1;
		}
	}
	return 0;
}

static void display_render(struct display *d)
{
	int err;
	pthread_mutex_lock(&d->mu);
	char *mnt = d->mnt ? strdup(d->mnt) : NULL;
	pthread_mutex_unlock(&d->mu);
	json_t *owner = mnt ? lockfs_ctl_read_owner(mnt, d->name, &err) : NULL;
	json_t *waiters = mnt ? lockfs_ctl_read_waiters(mnt, d->name) : json_array();
	char *who = owner ? lockfs_ctl_describe_holder(mnt, d->name, owner) :
		mnt ? xasprintf("held") : xasprintf("the lockfs daemon is away, trying again");
	free(mnt);
	size_t total = json_array_size(waiters), place = my_place(waiters);
	char waited[24], where[64];
	lockfs_ctl_fmt_duration(lockfs_ctl_now_ms() - d->started_ms, waited, sizeof(waited));
	if (place)
		snprintf(where, sizeof(where), "place %zu of %zu in line", place, total);
	else if (total)
		snprintf(where, sizeof(where), "%zu in line", total);
	else
		snprintf(where, sizeof(where), "in line");
	char *text = xasprintf("lockctl: waiting for %s: %s; %s; waited %s", d->name, who,
			       where, waited);
	lockfs_ctl_printable(text);
	/* Never wrap: a wrapped line cannot be rewritten with \r.  (Cut at a
	 * byte count, which is at least the columns; never inside a
	 * character.) */
	struct winsize ws;
	if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 &&
	    strlen(text) >= ws.ws_col) {
		size_t cut = ws.ws_col - 1;
		while (cut > 0 && ((unsigned char)text[cut] & 0xc0) == 0x80)
			cut--;
		text[cut] = '\0';
	}
	fprintf(stderr, "\r\033[K%s", text);
	fflush(stderr);
	d->shown = true;
	free(text);
	free(who);
	json_decref(owner);
	json_decref(waiters);
}

static void *display_main(void *arg)
{
	struct display *d = arg;
	pthread_mutex_lock(&d->mu);
	while (!d->done) {
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += DISPLAY_PERIOD_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		while (!d->done && pthread_cond_timedwait(&d->cv, &d->mu, &until) != ETIMEDOUT)
			;
		if (d->done)
			break;
		pthread_mutex_unlock(&d->mu);
		display_render(d);
		line_on_tty = 1;
		pthread_mutex_lock(&d->mu);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

/* Start the line on a terminal; with all signals blocked in the thread, so
 * they reach the main thread in flock(2). */
static void display_start(struct display *d, const char *mnt, const char *name)
{
	memset(d, 0, sizeof(*d));
	if (!isatty(STDERR_FILENO))
		return;
	d->mnt = mnt ? strdup(mnt) : NULL;
	d->name = name;
	d->started_ms = lockfs_ctl_now_ms();
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&d->mu, NULL);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	d->running = pthread_create(&d->thread, NULL, display_main, d) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Stop the thread and clear its line. */
static void display_stop(struct display *d)
{
	if (!d->running)
		return;
	pthread_mutex_lock(&d->mu);
	d->done = true;
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
	pthread_join(d->thread, NULL);
	d->running = false;
	if (d->shown) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
	}
	line_on_tty = 0;
	pthread_cond_destroy(&d->cv);
	pthread_mutex_destroy(&d->mu);
	free(d->mnt);
	d->mnt = NULL;
}

/* The mount the line reads from now: MNT, or NULL while the daemon is away. */
static void display_set_mount(struct display *d, const char *mnt)
{
	if (!d->running)
		return;
	char *copy = mnt ? strdup(mnt) : NULL;
	pthread_mutex_lock(&d->mu);
	free(d->mnt);
	d->mnt = copy;
	pthread_mutex_unlock(&d->mu);
}

/* ------------------------------------------------------------------ */
/* signals */

#define NFWD 3
static const int FWD_SIGNALS[NFWD] = { SIGINT, SIGTERM, SIGHUP };
static struct sigaction fwd_orig[NFWD]; /* as inherited, for CMD */

static volatile sig_atomic_t timed_out;
static volatile sig_atomic_t child_pid;

static void on_alarm(int sig)
{
	(void)sig;
	timed_out = 1;
}

/* While waiting: a termination signal ends lockctl as it would without a
 * handler (the daemon drops the waiter, the close drops the rest), after
 * clearing the waiting line. */
static void on_stop_while_waiting(int sig)
{
	if (line_on_tty) {
		ssize_t r = write(STDERR_FILENO, "\r\033[K", 4);
		(void)r;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	sigaction(sig, &sa, NULL);
	raise(sig); /* blocked until this handler returns, then fatal */
}

/* While CMD runs: pass the signal on. */
static void on_forward(int sig)
{
	int e = errno;
	if (child_pid > 0)
		kill((pid_t)child_pid, sig);
	errno = e;
}

/* Install HANDLER for the forwarded signals, except those that were
 * ignored when lockctl started (a background job's SIGINT stays ignored). */
static void set_fwd_handlers(void (*handler)(int))
{
	for (int i = 0; i < NFWD; i++) {
		if (fwd_orig[i].sa_handler == SIG_IGN)
			continue;
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = handler;
		sigemptyset(&sa.sa_mask);
		sa.sa_flags = 0; /* no SA_RESTART: waiting syscalls see EINTR */
		sigaction(FWD_SIGNALS[i], &sa, NULL);
	}
}

void lockfs_ctl_save_signals(void)
{
	for (int i = 0; i < NFWD; i++)
		sigaction(FWD_SIGNALS[i], NULL, &fwd_orig[i]);
}

/* Arm (SECS > 0) or disarm (SECS == 0) the timeout: SIGALRM at SECS, then
 * every TIMER_KICK_MS until disarmed. */
static void set_timer(double secs)
{
	struct itimerval it;
	memset(&it, 0, sizeof(it));
	if (secs > 0) {
		double whole = floor(secs);
		it.it_value.tv_sec = (time_t)whole;
		it.it_value.tv_usec = (suseconds_t)((secs - whole) * 1e6);
		if (it.it_value.tv_sec == 0 && it.it_value.tv_usec == 0)
			it.it_value.tv_usec = 1;
		it.it_interval.tv_usec = TIMER_KICK_MS * 1000;
	}
	setitimer(ITIMER_REAL, &it, NULL);
}

/* ------------------------------------------------------------------ */
/* taking the lock */

int lockfs_ctl_open_flock(const char *opt_mount, const char *mnt, const char *name, int *down)
{
	char *path = xasprintf("%s/.flock/%s", mnt, name);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	int e = errno;
	free(path);
	if (fd >= 0) {
		/* run's CMD inherits this descriptor: keep it clear of 0 to 9,
		 * which scripts redirect (`exec 3>log`) and would so drop CMD's
		 * share of the lock. */
		int high = fcntl(fd, F_DUPFD_CLOEXEC, LOCK_FD_MIN);
		if (high >= 0) {
			close(fd);
			fd = high;
		}
		return fd;
	}
	if (lockfs_ctl_is_conn_error(e)) {
		*down = e;
		return -1;
	}
	char *dir = xasprintf("%s/.flock", mnt);
	struct stat st;
	int se = stat(dir, &st) == 0 ? (S_ISDIR(st.st_mode) ? 0 : ENOTDIR) : errno;
	free(dir);
	if (lockfs_ctl_is_conn_error(se)) {
		*down = se;
		return -1;
	}
	if (se == ENOENT || se == ENOTDIR) {
		/* No .flock: the mount went since it was found (a restart, and
		 * the mount point is bare now), or its daemon is too old. */
		char *again = NULL;
		int rc = lockfs_ctl_find_mount(opt_mount, &again);
		free(again);
		if (rc < 0) {
			*down = -rc;
			return -1;
		}
		if (rc > 0)
			return -rc;
		return -fail(EX_UNAVAILABLE, "%s has no .flock directory: this lockfs daemon is too"
			     " old for lockctl", mnt);
	}
	if (se)
		e = se;
	if (e == EINVAL || e == ENAMETOOLONG)
		return -fail(EX_USAGE, "'%s' is not a valid lock name: %s", name, strerror(e));
	return -fail(errno_status(e), "cannot open %s/.flock/%s: %s", mnt, name, strerror(e));
}

/* A one-line description of who holds NAME now (for errors): malloc'd. */
char *lockfs_ctl_holder_now(const char *mnt, const char *name)
{
	int err;
	json_t *owner = lockfs_ctl_read_owner(mnt, name, &err);
	if (!owner)
		return xasprintf("busy");
	char *s = lockfs_ctl_describe_holder(mnt, name, owner);
	json_decref(owner);
	return s;
}

/* Say why flock(2) on NAME failed with E; the exit status. */
static int flock_failed(const char *name, int e)
{
	if (e == EACCES)
		return fail(EX_NOPERM, "%s: refused (%s): the daemon cannot tell who would hold the"
			    " lock; run lockctl from a process that stays alive, not an orphaned"
			    " background job", name, strerror(e));
	return fail(errno_status(e), "%s: flock: %s", name, strerror(e));
}

/*
 * One go at the lock on FD: flock(2) OP, at once when TRY_ONCE, else
 * waiting in line until granted or timed out (timed_out, set by SIGALRM).
 * Returns 0 with the lock, or the errno (EINTR: timed out).
 */
static int flock_fd(int fd, int op, bool try_once)
{
	if (try_once)
		return flock(fd, op | LOCK_NB) == 0 ? 0 : errno;
	for (;;) {
		if (timed_out)
			return EINTR;
		if (flock(fd, op) == 0)
			return 0; /* a grant that raced the deadline is still a grant */
		if (errno != EINTR)
			return errno;
		/* Another signal than ours: ask again at once, and the daemon
		 * gives back the place it kept for this open file. */
	}
}

/* Say why taking NAME on MNT failed with E; the exit status. */
static int take_failed(const struct opts *o, const char *mnt, int e)
{
	const char *name = o->name;
	if (e == EWOULDBLOCK) {
		char *who = lockfs_ctl_holder_now(mnt, name);
		int rc = fail(EX_TEMPFAIL, "%s: %s; not waiting (--timeout 0)", name, who);
		free(who);
		return rc;
	}
	if (e == EINTR) {
		char buf[32];
		snprintf(buf, sizeof(buf), "%g", o->timeout);
		char *who = mnt ? lockfs_ctl_holder_now(mnt, name) :
			xasprintf("the lockfs daemon was away");
		int st = fail(EX_TEMPFAIL, "%s: timed out after %ss waiting in line (%s)", name, buf,
			      who);
		free(who);
		return st;
	}
	if (e == ENOLCK)
		return fail(EX_UNAVAILABLE, "%s: flock on %s/.flock is not supported: this lockfs"
			    " daemon is too old for lockctl", name, mnt);
	return flock_failed(name, e);
}

static long long mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int lockfs_ctl_take_lock(const struct opts *o, char **mnt, double restart_wait, int op,
			 int *fdp)
{
	const char *name = o->name;
	bool try_once = o->has_timeout && o->timeout == 0;

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART: flock(2) returns EINTR */
	sigaction(SIGALRM, &sa, NULL);
	set_fwd_handlers(on_stop_while_waiting);

	struct display d;
	if (!try_once)
		display_start(&d, *mnt, name);
	else
		memset(&d, 0, sizeof(d));
	timed_out = 0;
	if (o->has_timeout && !try_once)
		set_timer(o->timeout);
	lockfs_ctl_wait_mount_change(0); /* from now on, no mount goes unseen */

	/* While the daemon is away (since AWAY_SINCE, ms), every try finds
	 * the mount anew: a restarted daemon mounts a new file system. */
	long long away_since = -1;
	int rc, fd = -1;
	for (;;) {
		int away = 0;
		if (!*mnt) {
			int r = lockfs_ctl_find_mount(o->mount, mnt);
			if (r > 0) {
				rc = r;
				break;
			}
			if (r < 0)
				away = -r;
			else
				display_set_mount(&d, *mnt);
		}
		if (!away) {
			fd = lockfs_ctl_open_flock(o->mount, *mnt, name, &away);
			if (fd < 0 && !away) {
				rc = -fd;
				break;
			}
		}
		if (!away) {
			away_since = -1;
			int e = flock_fd(fd, op, try_once);
			if (e == 0) {
				rc = 0;
				break;
			}
			/* A dead connection is no place in any line: let go of the
			 * old mount at once, so that it can be detached. */
			close(fd);
			fd = -1;
			if (!lockfs_ctl_is_conn_error(e)) {
				rc = take_failed(o, *mnt, e);
				break;
			}
			away = e;
		}

		/* The daemon is away: a restart, unless it lasts too long. */
		if (*mnt) {
			free(*mnt);
			*mnt = NULL;
			display_set_mount(&d, NULL);
		}
		long long now = mono_ms();
		if (away_since < 0)
			away_since = now;
		long long left = (long long)(restart_wait * 1000) - (now - away_since);
		if (timed_out) {
			rc = take_failed(o, NULL, EINTR);
			break;
		}
		if (try_once || left <= 0) {
			const char *m = o->mount ? o->mount : getenv("LOCKFS_MOUNT");
			m = m && *m ? m : DEFAULT_MOUNT;
			if (try_once || restart_wait == 0)
				rc = fail(EX_UNAVAILABLE, "%s: no lockfs daemon answers at %s (%s);"
					  " not waiting (%s 0)", name, m, lockfs_ctl_down_reason(away),
					  try_once ? "--timeout" : "--restart-wait");
			else
				rc = fail(EX_UNAVAILABLE, "%s: no lockfs daemon answered at %s for %gs"
					  " (%s); see --restart-wait", name, m, restart_wait,
					  lockfs_ctl_down_reason(away));
			break;
		}
		lockfs_ctl_wait_mount_change(left < RESTART_RETRY_MS ? (int)left : RESTART_RETRY_MS);
	}
	if (o->has_timeout && !try_once)
		set_timer(0);
	if (!try_once)
		display_stop(&d);
	if (rc == 0)
		*fdp = fd;
	return rc;
}

/* Give up FD's lock, if any, and close it. */
void lockfs_ctl_unlock_close(int fd)
{
	while (flock(fd, LOCK_UN) < 0 && errno == EINTR)
		;
	close(fd);
}

/* ------------------------------------------------------------------ */
/* running CMD */

pid_t lockfs_ctl_spawn(char **cmd, const struct run_lock *locks, size_t nlocks)
{
	/* Hold the forwarded signals until the child's pid is known, so that
	 * none is lost between fork and the handler's first use. */
	sigset_t fwd, old;
	sigemptyset(&fwd);
	for (int i = 0; i < NFWD; i++)
		sigaddset(&fwd, FWD_SIGNALS[i]);
	sigprocmask(SIG_BLOCK, &fwd, &old);
	set_fwd_handlers(on_forward);
	pid_t pid = fork();
	if (pid == 0) {
		/* CMD gets lockctl's dispositions and mask as inherited, and the
		 * lock's descriptor: the lock belongs to the open file description,
		 * so with CMD sharing it, the lock lasts while CMD runs even if
		 * lockctl is killed (as under flock(1)); lockctl's unlock when CMD
		 * ends still ends it for every sharer. */
		for (int i = 0; i < NFWD; i++)
			sigaction(FWD_SIGNALS[i], &fwd_orig[i], NULL);
		signal(SIGALRM, SIG_DFL);
		sigprocmask(SIG_SETMASK, &old, NULL);
		for (size_t i = 0; i < nlocks; i++) {
			int flags = fcntl(locks[i].fd, F_GETFD);
			if (flags < 0 ||
			    fcntl(locks[i].fd, F_SETFD, flags & ~FD_CLOEXEC) < 0) {
				/* Without it CMD would run unprotected once lockctl died. */
				fprintf(stderr, PROG ": cannot pass the lock to %s: %s\n", cmd[0],
					strerror(errno));
				_exit(126);
			}
		}
		execvp(cmd[0], cmd);
		int e = errno;
		fprintf(stderr, PROG ": cannot run %s: %s\n", cmd[0], strerror(e));
		_exit(e == ENOENT ? 127 : 126);
	}
	if (pid < 0) {
		int e = errno;
		sigprocmask(SIG_SETMASK, &old, NULL);
		return -e;
	}
	child_pid = pid;
	sigprocmask(SIG_SETMASK, &old, NULL);
	return pid;
}
