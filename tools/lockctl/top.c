/*
 * lockctl top: a live view of the held locks, their holders, their queues
 * and how long each has waited, redrawn whenever M/.events brings an event
 * (and once a second, for the clocks), until `q`, SIGINT or SIGTERM.
 *
 * Standard output not a terminal: one frame, no escapes, and exit.
 *
 * A FUSE file cannot be poll(2)ed for data (the daemon has no poll op:
 * the kernel says "readable" at once), so a thread reads M/.events and
 * wakes the main loop through a pipe; the main loop polls that pipe and
 * the terminal.  The terminal is put in non-canonical mode without echo
 * (signals stay on) and in the alternate screen, and restored on every way
 * out.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "lockctl.h"

#define RECENT 6 /* events shown under the table */

static int wake_pipe[2] = { -1, -1 };
static volatile sig_atomic_t quit_asked;

static struct {
	pthread_mutex_t mu;
	char lines[RECENT][160]; /* the last events, oldest first */
	int n;
	bool ended;              /* M/.events ended: the daemon stopped */
} recent = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void on_quit(int sig)
{
	int saved = errno;

	(void)sig;
	quit_asked = 1;
	if (write(wake_pipe[1], "q", 1) < 0) {
		/* full: a wake-up is pending anyway */
	}
	errno = saved;
}

/* One event line of M/.events as "HH:MM:SS event name who". */
static void remember(const char *line)
{
	json_t *ev = json_loads(line, 0, NULL);
	const char *time, *event, *name, *who;
	char text[160];

	if (!ev)
		return;
	time = lockfs_ctl_jstr(ev, "time");
	event = lockfs_ctl_jstr(ev, "event");
	name = lockfs_ctl_jstr(ev, "name");
	who = lockfs_ctl_jstr(ev, "who");
	snprintf(text, sizeof(text), "%.8s  %-9s %s %s", time && strlen(time) > 11 ? time + 11 : "",
		 event ? event : "?", name ? name : "", who ? who : "");
	lockfs_ctl_printable(text);
	json_decref(ev);
	pthread_mutex_lock(&recent.mu);
	if (recent.n == RECENT) {
		memmove(recent.lines[0], recent.lines[1], sizeof(recent.lines[0]) * (RECENT - 1));
		recent.n--;
	}
	snprintf(recent.lines[recent.n++], sizeof(recent.lines[0]), "%s", text);
	pthread_mutex_unlock(&recent.mu);
}

/* The reader thread: every read of M/.events wakes the main loop. */
static void *events_thread(void *arg)
{
	int fd = (int)(long)arg;
	static char buf[65536];
	size_t have = 0;

	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
		char *start = buf, *nl;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = '\0';
		while ((nl = strchr(start, '\n'))) {
			*nl = '\0';
			remember(start);
			start = nl + 1;
		}
		have -= (size_t)(start - buf);
		memmove(buf, start, have);
		if (have == sizeof(buf) - 1)
			have = 0; /* a line longer than the buffer: dropped */
		if (write(wake_pipe[1], "e", 1) < 0) {
			/* full: a wake-up is pending anyway */
		}
	}
	pthread_mutex_lock(&recent.mu);
	recent.ended = true;
	pthread_mutex_unlock(&recent.mu);
	if (write(wake_pipe[1], "x", 1) < 0) {
		/* full: a wake-up is pending anyway */
	}
	return NULL;
}

/* A growing screen text. */
struct screen {
	char *s;
	size_t len, cap;
};

__attribute__((format(printf, 2, 3)))
static void put(struct screen *sc, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (sc->len + (size_t)n + 1 > sc->cap) {
		sc->cap = (sc->len + (size_t)n + 1) * 2;
		sc->s = realloc(sc->s, sc->cap);
		if (!sc->s)
			oom();
	}
	va_start(ap, fmt);
	vsnprintf(sc->s + sc->len, sc->cap - sc->len, fmt, ap);
	va_end(ap);
	sc->len += (size_t)n;
}

/* "2026-12-06T08:09:44.246Z" as Unix ms: true when it parses. */
static bool parse_time_ms(const char *s, long long *ms)
{
	struct tm tm = { 0 };
	int frac = 0;

	if (!s || sscanf(s, "%d-%d-%dT%d:%d:%d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
			 &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &frac) < 6)
		return false;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	*ms = (long long)timegm(&tm) * 1000 + frac;
	return true;
}

/* One lock's rows: its holder, then each waiter with how long it waits. */
static void lock_rows(struct screen *sc, const char *mnt, const char *name, long long now,
		      size_t *nwaiting)
{
	int err;
	json_t *owner = lockfs_ctl_read_owner(mnt, name, &err);
	json_t *waiters;
	const json_t *h = NULL;
	long long pid = 0, since;
	char held[32] = "?", shown[64];

	if (!owner)
		return; /* released since the listing */
	lockfs_ctl_holders_of(owner, &h);
	if (h && lockfs_ctl_acquired_ms(h, owner, &since))
		lockfs_ctl_fmt_duration(now - since, held, sizeof(held));
	if (h && !lockfs_ctl_pid_here(h, &pid))
		lockfs_ctl_jint(h, "pid", &pid);
	snprintf(shown, sizeof(shown), "%s", name);
	lockfs_ctl_printable(shown);
	{
		char comm[64];

		snprintf(comm, sizeof(comm), "%s", h && lockfs_ctl_jstr(h, "comm") ?
			 lockfs_ctl_jstr(h, "comm") : "?");
		lockfs_ctl_printable(comm);
		waiters = lockfs_ctl_read_waiters(mnt, name);
		put(sc, "%-24s %-16s %8lld %8s %7zu\n", shown, comm, pid, held,
		    json_array_size(waiters));
	}
	for (size_t i = 0; i < json_array_size(waiters); i++) {
		json_t *w = json_array_get(waiters, i);
		char comm[64], waited[32] = "?";
		long long wpid = 0;

		snprintf(comm, sizeof(comm), "%s", lockfs_ctl_jstr(w, "comm") ?
			 lockfs_ctl_jstr(w, "comm") : "?");
		lockfs_ctl_printable(comm);
		lockfs_ctl_jint(w, "pid", &wpid);
		if (parse_time_ms(lockfs_ctl_jstr(w, "since"), &since))
			lockfs_ctl_fmt_duration(now - since, waited, sizeof(waited));
		put(sc, "  %-22s %-16s %8lld %8s\n", i == 0 ? "waiting:" : "", comm, wpid, waited);
		(*nwaiting)++;
	}
	json_decref(waiters);
	json_decref(owner);
}

static void draw(const char *mnt, bool screen)
{
	struct screen sc = { 0 };
	long long now = lockfs_ctl_now_ms();
	size_t nwaiting = 0, nlocks = 0;
	char **names = NULL, clock[16];
	size_t count = 0;
	time_t t = (time_t)(now / 1000);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
	if (screen)
		put(&sc, "\033[H\033[2J");
	put(&sc, "lockctl top  %s  %sZ   (q to quit)\n\n", mnt, clock);
	put(&sc, "%-24s %-16s %8s %8s %7s\n", "NAME", "HOLDER", "PID", "HELD", "WAITERS");
	if (lockfs_ctl_list_names(mnt, &names, &count) == 0) {
		for (size_t i = 0; i < count; i++) {
			lock_rows(&sc, mnt, names[i], now, &nwaiting);
			free(names[i]);
			nlocks++;
		}
		free(names);
	}
	put(&sc, "\n%zu held, %zu waiting\n\nrecent events:\n", nlocks, nwaiting);
	pthread_mutex_lock(&recent.mu);
	for (int i = 0; i < recent.n; i++)
		put(&sc, "  %s\n", recent.lines[i]);
	if (recent.ended)
		put(&sc, "  (the daemon stopped: no more events)\n");
	pthread_mutex_unlock(&recent.mu);
	if (sc.s && write(STDOUT_FILENO, sc.s, sc.len) < 0) {
		/* the terminal went away: the loop ends on its hang-up */
	}
	free(sc.s);
}

int lockfs_ctl_top(const char *mnt)
{
	struct termios saved, raw;
	bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
	struct sigaction sa = { .sa_handler = on_quit };
	pthread_t reader;
	int fd;

	/* Not a terminal (a pipe, a file): one frame, for a script or a log. */
	if (!isatty(STDOUT_FILENO)) {
		draw(mnt, false);
		return 0;
	}
	fd = lockfs_ctl_events_open(mnt, NULL, 0);
	if (fd == -ENOENT)
		return fail(EX_UNAVAILABLE, "%s/.events is missing: this lockfs daemon is too old"
			    " for lockctl top", mnt);
	if (fd < 0)
		return fail(errno_status(-fd), "%s/.events: %s", mnt, strerror(-fd));
	if (pipe(wake_pipe) < 0)
		return fail(EXIT_FAIL, "pipe: %s", strerror(errno));
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	if (pthread_create(&reader, NULL, events_thread, (void *)(long)fd) != 0)
		return fail(EXIT_FAIL, "cannot start a thread");
	pthread_detach(reader);
	if (tty) {
		raw = saved;
		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		raw.c_cc[VMIN] = 1;
		raw.c_cc[VTIME] = 0;
		tcsetattr(STDIN_FILENO, TCSANOW, &raw);
	}
	/* The alternate screen, cursor hidden. */
	fputs("\033[?1049h\033[?25l", stdout);
	fflush(stdout);
	while (!quit_asked) {
		struct pollfd p[2] = { { .fd = wake_pipe[0], .events = POLLIN },
				       { .fd = STDIN_FILENO, .events = POLLIN } };
		char c[64];

		draw(mnt, true);
		if (poll(p, tty ? 2 : 1, 1000) < 0 && errno != EINTR)
			break;
		if (p[0].revents & POLLIN)
			(void)!read(wake_pipe[0], c, sizeof(c));
		if (tty && (p[1].revents & (POLLHUP | POLLERR)))
			break;
		if (tty && (p[1].revents & POLLIN)) {
			ssize_t n = read(STDIN_FILENO, c, sizeof(c));

			if (n <= 0 || memchr(c, 'q', (size_t)n) || memchr(c, 'Q', (size_t)n))
				break;
		}
	}
	fputs("\033[?25h\033[?1049l", stdout);
	fflush(stdout);
	if (tty)
		tcsetattr(STDIN_FILENO, TCSANOW, &saved);
	/* The reader thread may be blocked in a read of M/.events: our exit
	 * interrupts it (the daemon answers the interrupt). */
	return 0;
}
