/*
 * lockctl: wait for, hold, inspect, release and break lockfs locks.
 *
 * It talks to the mount with plain syscalls, like any user (no daemon
 * header is included):
 *
 *   run      flock(M/.flock/NAME), fork+exec CMD, wait, unlock.  The lock
 *            belongs to lockctl's open file description, so however lockctl
 *            ends (even SIGKILL) the last close releases it.
 *   acquire  flock(LOCK_EX), then write "process" or "slug" to M/NAME/bind:
 *            the daemon resolves the writer past lockctl (a helper) to its
 *            parent, so the calling shell (or the slug) keeps the lock.
 *   release  rmdir M/NAME.
 *   status   M (readdir), M/NAME/owner, M/NAME/waiters.
 *   break    write the reason to M/NAME/break.
 *
 * Waiting is always a blocking flock(2), which the daemon queues FIFO.
 * --timeout interrupts it with SIGALRM from a handler installed without
 * SA_RESTART, so flock returns EINTR and the daemon drops the waiter; the
 * timer keeps firing every 50 ms after the deadline, so a signal that lands
 * just before flock(2) is entered cannot leave us blocked.
 *
 * Exit statuses (sysexits.h): 0, CMD's status for run, 64 usage, 69 no lockfs
 * mount, 75 timed out / busy, 77 permission refused, 1 anything else.
 * Every error is one line on stderr starting with "lockctl: ".
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#ifndef LOCKFS_VERSION
#define LOCKFS_VERSION "unknown"
#endif

#define PROG "lockctl"
#define EXIT_FAIL 1
#define DEFAULT_MOUNT "/locks"
#define NAME_MAX_BYTES 250
#define SLUG_MAX_BYTES 255
#define REASON_MAX_BYTES 1024
#define MAX_SECONDS 315360000.0 /* ten years, the daemon's lease limit */
#define DISPLAY_PERIOD_MS 500
#define TIMER_KICK_MS 50
#define FILE_MAX (1024 * 1024) /* owner and waiters files we read */

/* ------------------------------------------------------------------ */
/* messages */

/* The waiting line may be on stderr (set by the display thread, read by
 * signal handlers). */
static volatile sig_atomic_t line_on_tty;

__attribute__((format(printf, 1, 2)))
static void warnmsg(const char *fmt, ...)
{
	va_list ap;
	char buf[2048];
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	/* One line, whatever the text carried in (names, reasons). */
	for (char *p = buf; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	fprintf(stderr, "%s: %s\n", PROG, buf);
}

/* Print one error line; return STATUS, for `return fail(...)`. */
__attribute__((format(printf, 2, 3)))
static int fail(int status, const char *fmt, ...)
{
	va_list ap;
	char buf[2048];
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	warnmsg("%s", buf);
	return status;
}

__attribute__((noreturn))
static void oom(void)
{
	fputs(PROG ": out of memory\n", stderr);
	exit(EXIT_FAIL);
}

__attribute__((format(printf, 1, 2)))
static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *s;
	va_start(ap, fmt);
	int n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0)
		oom();
	return s;
}

/* ------------------------------------------------------------------ */
/* the command line */

enum verb { V_NONE, V_RUN, V_ACQUIRE, V_RELEASE, V_STATUS, V_BREAK };

struct opts {
	enum verb verb;
	const char *verb_word;
	const char *name;      /* NAME, or NULL */
	const char *slug;      /* --slug */
	const char *mount;     /* --mount */
	const char *reason;    /* --reason */
	double timeout;        /* --timeout, when has_timeout */
	bool has_timeout;
	bool shared, json, help, version;
	bool seen_poll, seen_stale, seen_double_dash;
	char **cmd;            /* after "--" */
	int ncmd;
};

static const char USAGE[] =
	"Usage:\n"
	"  lockctl run NAME [--slug S] [--timeout SECS] [--shared] -- CMD [ARG...]\n"
	"  lockctl acquire NAME [--slug S] [--timeout SECS]\n"
	"  lockctl release NAME [--slug S]\n"
	"  lockctl status [NAME] [--json]\n"
	"  lockctl break NAME --reason TEXT\n"
	"  lockctl --help | --version\n"
	"\n"
	"Wait for, hold, inspect and release lockfs locks. Waiting is a blocking\n"
	"flock(2) on M/.flock/NAME, which the daemon serves in arrival order.\n"
	"\n"
	"Verbs:\n"
	"  run      wait for NAME, run CMD, release NAME however CMD ends, and exit\n"
	"           with CMD's status (128+N if it died of signal N). SIGINT, SIGTERM\n"
	"           and SIGHUP are passed on to CMD. CMD does not inherit the lock.\n"
	"  acquire  wait for NAME and bind it to the calling shell (the parent of\n"
	"           lockctl), or to the slug, so that it stays held after lockctl exits.\n"
	"  release  release NAME (rmdir M/NAME): the holder's tree, or the slug.\n"
	"  status   list held locks: NAME MODE HOLDER PID USER HOST AGE LEASE\n"
	"           WAITERS OPERATION; --json prints the owner records, each with a\n"
	"           \"waiters\" array. With NAME, exits 1 when NAME is not held.\n"
	"  break    take NAME away from whoever holds it (root or the mounting user);\n"
	"           the reason is logged.\n"
	"\n"
	"Options:\n"
	"  --mount PATH    the lockfs mount (default: $LOCKFS_MOUNT, else /locks)\n"
	"  --slug S        bind to slug S (LOCKFS_SLUG=S): a lock taken by acquire\n"
	"                  belongs to (uid, S) under a lease, and any process of that\n"
	"                  uid with the slug may release it. Without --slug, a\n"
	"                  non-empty LOCKFS_SLUG in the environment counts, as for mkdir.\n"
	"  --timeout SECS  give up waiting after SECS (decimals allowed); 0 tries once\n"
	"  --shared        run: take the lock shared (many readers, no writer)\n"
	"  --json          status: JSON output\n"
	"  --reason TEXT   break: why (1 to 1024 bytes, required)\n"
	"  --poll N        accepted for the seed tool; no effect (waiting is queued)\n"
	"  --stale N       accepted for the seed tool; no effect (see lockfs -o stale)\n"
	"\n"
	"While waiting with stderr on a terminal, one line shows who holds the lock,\n"
	"for how long, and your place in line.\n"
	"\n"
	"Exit status:\n"
	"  0    success (run: CMD's own status instead)\n"
	"  1    other failure, e.g. release or status of a lock that is not held\n"
	"  64   usage error (bad option, missing NAME or CMD, invalid lock name)\n"
	"  69   the mount is missing or is not a fuse.lockfs mount\n"
	"  75   timed out waiting (also --timeout 0 when the lock is busy)\n"
	"  77   permission refused (EPERM, EACCES): not the holder, not allowed to break\n"
	"  126  run: CMD could not be executed; 127: CMD not found\n"
	"\n"
	"See lockctl(1).\n";

static int usage_error(const char *what)
{
	return fail(EX_USAGE, "%s (see lockctl --help)", what);
}

/*
 * Seconds: a decimal number, 0 to ten years.  Returns true and sets *OUT
 * when TEXT is one.
 */
static bool parse_seconds(const char *text, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(text, &end);
	if (errno || end == text || *end || !isfinite(v) || v < 0 || v > MAX_SECONDS)
		return false;
	/* strtod takes "inf", "nan" and hex; isfinite rules out the first two,
	 * and hex seconds are harmless. */
	*out = v;
	return true;
}

/* Does option ARG (starting with "--") name KEY, as "--KEY" or "--KEY=..."? */
static bool opt_is(const char *arg, const char *key, const char **inline_val)
{
	size_t n = strlen(key);
	if (strncmp(arg + 2, key, n) != 0)
		return false;
	if (arg[2 + n] == '\0') {
		*inline_val = NULL;
		return true;
	}
	if (arg[2 + n] == '=') {
		*inline_val = arg + 3 + n;
		return true;
	}
	return false;
}

static const struct {
	const char *word;
	enum verb verb;
} VERBS[] = {
	{ "run", V_RUN }, { "acquire", V_ACQUIRE }, { "release", V_RELEASE },
	{ "status", V_STATUS }, { "break", V_BREAK },
};

/*
 * Parse ARGV into O.  Options may come anywhere before "--"; the first
 * word is the verb, the second NAME.  Returns 0, or EX_USAGE after
 * printing why.
 */
static int parse_args(int argc, char **argv, struct opts *o)
{
	memset(o, 0, sizeof(*o));
	int npos = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val = NULL;
		if (strcmp(a, "--") == 0) {
			o->seen_double_dash = true;
			o->cmd = argv + i + 1;
			o->ncmd = argc - i - 1;
			break;
		}
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			o->help = true;
			continue;
		}
		if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
			o->version = true;
			continue;
		}
		if (strncmp(a, "--", 2) == 0) {
			static const char *const WITH_VALUE[] = {
				"slug", "timeout", "poll", "stale", "mount", "reason",
			};
			const char *key = NULL;
			for (size_t k = 0; k < sizeof(WITH_VALUE) / sizeof(WITH_VALUE[0]); k++) {
				if (opt_is(a, WITH_VALUE[k], &val)) {
					key = WITH_VALUE[k];
					break;
				}
			}
			if (key) {
				if (!val) {
					if (i + 1 >= argc) {
						char *m = xasprintf("option --%s needs a value", key);
						int rc = usage_error(m);
						free(m);
						return rc;
					}
					val = argv[++i];
				}
				double secs;
				if (strcmp(key, "slug") == 0) {
					o->slug = val;
				} else if (strcmp(key, "mount") == 0) {
					o->mount = val;
				} else if (strcmp(key, "reason") == 0) {
					o->reason = val;
				} else if (!parse_seconds(val, &secs)) {
					return fail(EX_USAGE, "--%s %s: want a number of seconds, 0 to %.0f"
						    " (see lockctl --help)", key, val, MAX_SECONDS);
				} else if (strcmp(key, "timeout") == 0) {
					o->timeout = secs;
					o->has_timeout = true;
				} else if (strcmp(key, "poll") == 0) {
					o->seen_poll = true;
				} else {
					o->seen_stale = true;
				}
				continue;
			}
			if (strcmp(a, "--shared") == 0) {
				o->shared = true;
				continue;
			}
			if (strcmp(a, "--json") == 0) {
				o->json = true;
				continue;
			}
			return fail(EX_USAGE, "unknown option %s (see lockctl --help)", a);
		}
		if (a[0] == '-' && a[1] != '\0')
			return fail(EX_USAGE, "unknown option %s (see lockctl --help)", a);
		if (npos == 0) {
			o->verb_word = a;
			for (size_t k = 0; k < sizeof(VERBS) / sizeof(VERBS[0]); k++)
				if (strcmp(a, VERBS[k].word) == 0)
					o->verb = VERBS[k].verb;
			if (o->verb == V_NONE && !o->help)
				return fail(EX_USAGE, "unknown command '%s' (see lockctl --help)", a);
		} else if (npos == 1) {
			o->name = a;
		} else {
			if (o->verb == V_RUN)
				return fail(EX_USAGE, "unexpected '%s': put the command after -- "
					    "(lockctl run NAME -- CMD...)", a);
			return fail(EX_USAGE, "unexpected argument '%s' (see lockctl --help)", a);
		}
		npos++;
	}
	return 0;
}

/* Check that O's options fit its verb.  Returns 0 or EX_USAGE. */
static int check_args(const struct opts *o)
{
	enum verb v = o->verb;
	if (v == V_NONE)
		return usage_error("no command given");
	const char *w = o->verb_word;
	if (v != V_STATUS && !o->name)
		return fail(EX_USAGE, "%s: NAME is missing (see lockctl --help)", w);
	if (o->name) {
		size_t n = strlen(o->name);
		if (n == 0 || n > NAME_MAX_BYTES || strchr(o->name, '/') || o->name[0] == '.')
			return fail(EX_USAGE, "'%s' is not a valid lock name (1 to %d bytes, no '/',"
				    " not starting with '.')", o->name, NAME_MAX_BYTES);
	}
	if (o->seen_double_dash && v != V_RUN)
		return fail(EX_USAGE, "%s takes no command after -- (see lockctl --help)", w);
	if (v == V_RUN && (!o->seen_double_dash || o->ncmd == 0))
		return usage_error("run: CMD is missing (lockctl run NAME -- CMD...)");
	if (o->slug && !(v == V_RUN || v == V_ACQUIRE || v == V_RELEASE))
		return fail(EX_USAGE, "%s does not take --slug", w);
	if (o->slug && (o->slug[0] == '\0' || strlen(o->slug) > SLUG_MAX_BYTES))
		return fail(EX_USAGE, "--slug: want 1 to %d bytes", SLUG_MAX_BYTES);
	if (o->has_timeout && !(v == V_RUN || v == V_ACQUIRE))
		return fail(EX_USAGE, "%s does not take --timeout", w);
	if ((o->seen_poll || o->seen_stale) && !(v == V_RUN || v == V_ACQUIRE || v == V_RELEASE))
		return fail(EX_USAGE, "%s does not take --poll or --stale", w);
	if (o->shared && v != V_RUN)
		return fail(EX_USAGE, "%s does not take --shared (only run does)", w);
	if (o->json && v != V_STATUS)
		return fail(EX_USAGE, "%s does not take --json (only status does)", w);
	if (o->reason && v != V_BREAK)
		return fail(EX_USAGE, "%s does not take --reason (only break does)", w);
	if (v == V_BREAK) {
		if (!o->reason)
			return usage_error("break: --reason TEXT is required");
		size_t n = strlen(o->reason);
		if (n == 0 || n > REASON_MAX_BYTES)
			return fail(EX_USAGE, "--reason: want 1 to %d bytes", REASON_MAX_BYTES);
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* the mount */

/* Undo the kernel's octal escapes (\040 for space, ...) in place. */
static void unescape_mountinfo(char *s)
{
	char *w = s;
	for (char *r = s; *r;) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] >= '0' && r[2] <= '7' &&
		    r[3] >= '0' && r[3] <= '7') {
			*w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
			r += 4;
		} else {
			*w++ = *r++;
		}
	}
	*w = '\0';
}

/*
 * The file system type of the topmost mount whose mount point is exactly
 * PATH (already canonical), from /proc/self/mountinfo: a malloc'd string,
 * or NULL when PATH is no mount point.  *ERR is set when mountinfo itself
 * cannot be read.
 */
static char *mount_fstype(const char *path, int *err)
{
	*err = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f) {
		*err = errno;
		return NULL;
	}
	char *line = NULL, *found = NULL;
	size_t cap = 0;
	while (getline(&line, &cap, f) > 0) {
		line[strcspn(line, "\n")] = '\0';
		char *sep = strstr(line, " - ");
		if (!sep)
			continue;
		*sep = '\0';
		/* 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw */
		char *save = NULL, *field = strtok_r(line, " ", &save);
		for (int k = 0; field && k < 4; k++)
			field = strtok_r(NULL, " ", &save);
		if (!field)
			continue;
		unescape_mountinfo(field);
		if (strcmp(field, path) != 0)
			continue;
		char *type = sep + 3;
		type[strcspn(type, " ")] = '\0';
		free(found);
		found = strdup(type);
		if (!found)
			oom();
	}
	free(line);
	fclose(f);
	return found;
}

/*
 * Resolve the mount (--mount, $LOCKFS_MOUNT, /locks) and check that it is
 * a fuse.lockfs mount.  Sets *OUT (malloc'd canonical path) and returns 0,
 * or prints why and returns EX_UNAVAILABLE.
 */
static int find_mount(const char *opt_mount, char **out)
{
	const char *m = opt_mount;
	const char *how = "--mount";
	if (!m) {
		m = getenv("LOCKFS_MOUNT");
		how = "LOCKFS_MOUNT";
		if (!m || !*m) {
			m = DEFAULT_MOUNT;
			how = "the default";
		}
	}
	char *real = realpath(m, NULL);
	if (!real)
		return fail(EX_UNAVAILABLE, "lockfs mount %s (%s): %s", m, how, strerror(errno));
	int err;
	char *type = mount_fstype(real, &err);
	if (err) {
		free(real);
		return fail(EX_UNAVAILABLE, "cannot read /proc/self/mountinfo: %s", strerror(err));
	}
	if (!type || strcmp(type, "fuse.lockfs") != 0) {
		int rc;
		if (!type)
			rc = fail(EX_UNAVAILABLE, "%s is not a lockfs mount (not a mount point);"
				  " give the mount with --mount PATH or LOCKFS_MOUNT", real);
		else
			rc = fail(EX_UNAVAILABLE, "%s is not a lockfs mount (type %s, not fuse.lockfs);"
				  " give the mount with --mount PATH or LOCKFS_MOUNT", real, type);
		free(type);
		free(real);
		return rc;
	}
	free(type);
	*out = real;
	return 0;
}

/* ------------------------------------------------------------------ */
/* reading the mount */

/*
 * Read all of PATH (at most FILE_MAX bytes) into a malloc'd NUL-terminated
 * buffer.  Returns 0, or -errno.
 */
static int read_whole(const char *path, char **buf, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t cap = 4096, n = 0;
	char *b = malloc(cap);
	if (!b)
		oom();
	for (;;) {
		if (n + 1 >= cap) {
			if (cap >= FILE_MAX) {
				free(b);
				close(fd);
				return -EFBIG;
			}
			cap *= 2;
			char *nb = realloc(b, cap);
			if (!nb)
				oom();
			b = nb;
		}
		ssize_t r = read(fd, b + n, cap - 1 - n);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			int e = errno;
			free(b);
			close(fd);
			return -e;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	b[n] = '\0';
	*buf = b;
	if (len)
		*len = n;
	return 0;
}

/* M/NAME/owner as a JSON object; NULL with *ERR = errno (EBADMSG: not JSON). */
static json_t *read_owner(const char *mnt, const char *name, int *err)
{
	char *path = xasprintf("%s/%s/owner", mnt, name);
	char *text;
	size_t len;
	int rc = read_whole(path, &text, &len);
	free(path);
	if (rc < 0) {
		*err = -rc;
		return NULL;
	}
	json_t *j = json_loadb(text, len, 0, NULL);
	free(text);
	if (!j || !json_is_object(j)) {
		json_decref(j);
		*err = EBADMSG;
		return NULL;
	}
	*err = 0;
	return j;
}

/*
 * M/NAME/waiters as a JSON array (one object per line, queue order).  A
 * missing file (a daemon without waiters) or a lock released meanwhile
 * gives an empty array; lines that are not JSON objects are skipped.
 */
static json_t *read_waiters(const char *mnt, const char *name)
{
	json_t *arr = json_array();
	if (!arr)
		oom();
	char *path = xasprintf("%s/%s/waiters", mnt, name);
	char *text;
	int rc = read_whole(path, &text, NULL);
	free(path);
	if (rc < 0)
		return arr;
	char *save = NULL;
	for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		json_t *w = json_loads(l, 0, NULL);
		if (w && json_is_object(w))
			json_array_append_new(arr, w);
		else
			json_decref(w);
	}
	free(text);
	return arr;
}

static const char *jstr(const json_t *o, const char *key)
{
	return json_string_value(json_object_get(o, key));
}

static bool jint(const json_t *o, const char *key, long long *v)
{
	json_t *x = json_object_get(o, key);
	if (!json_is_integer(x))
		return false;
	*v = json_integer_value(x);
	return true;
}

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "2026-11-29T16:58:14.933Z" -> Unix ms; false if it is not that shape. */
static bool parse_rfc3339_ms(const char *s, long long *ms)
{
	struct tm tm;
	int frac = 0, used = 0;
	memset(&tm, 0, sizeof(tm));
	if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &tm.tm_year, &tm.tm_mon,
			 &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &frac, &used) != 7 ||
	    s[used] != '\0')
		return false;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	time_t t = timegm(&tm);
	if (t == (time_t)-1)
		return false;
	*ms = (long long)t * 1000 + frac;
	return true;
}

/* When a holder (or the record, as fallback) acquired the lock, Unix ms. */
static bool acquired_ms(const json_t *holder, const json_t *owner, long long *ms)
{
	if (holder && (jint(holder, "acquired_at_ms", ms) ||
		       parse_rfc3339_ms(jstr(holder, "acquired_at"), ms)))
		return true;
	return jint(owner, "acquired_at_ms", ms) ||
	       parse_rfc3339_ms(jstr(owner, "acquired_at"), ms);
}

/* A duration for people: 42s, 3m05s, 2h07m, 3d04h. */
static void fmt_duration(long long ms, char *buf, size_t size)
{
	if (ms < 0)
		ms = 0;
	long long s = ms / 1000;
	if (s < 60)
		snprintf(buf, size, "%llds", s);
	else if (s < 3600)
		snprintf(buf, size, "%lldm%02llds", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, size, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
	else
		snprintf(buf, size, "%lldd%02lldh", s / 86400, (s % 86400) / 3600);
}

/* The holder objects of OWNER: "holders" if present, else [holder]. */
static size_t holders_of(const json_t *owner, const json_t **first)
{
	json_t *hs = json_object_get(owner, "holders");
	if (json_is_array(hs) && json_array_size(hs) > 0) {
		*first = json_array_get(hs, 0);
		return json_array_size(hs);
	}
	json_t *h = json_object_get(owner, "holder");
	*first = json_is_object(h) ? h : NULL;
	return *first ? 1 : 0;
}

/*
 * Who holds the lock, for one line: "bash[1234] for 12s", "slug agent-7
 * for 3m05s", "a foreign lock for 5s", "bash[12] and 2 more (shared) ...".
 * Malloc'd.
 */
static char *describe_holder(const json_t *owner)
{
	const json_t *h = NULL;
	size_t n = holders_of(owner, &h);
	long long at;
	char age[32] = "";
	if (acquired_ms(h, owner, &at)) {
		char d[24];
		fmt_duration(now_ms() - at, d, sizeof(d));
		snprintf(age, sizeof(age), " for %s", d);
	}
	const char *bound = jstr(owner, "bound");
	const char *slug = jstr(owner, "slug");
	if (json_is_true(json_object_get(owner, "foreign")) || !h)
		return xasprintf("held by a foreign lock (no lockfs record)%s", age);
	if (bound && strcmp(bound, "slug") == 0 && slug)
		return xasprintf("held by slug %s%s", slug, age);
	long long pid = 0;
	jint(h, "pid", &pid);
	const char *comm = jstr(h, "comm");
	if (n > 1)
		return xasprintf("held shared by %s[%lld] and %zu more%s", comm ? comm : "?", pid,
				 n - 1, age);
	return xasprintf("held by %s[%lld]%s", comm ? comm : "?", pid, age);
}

/* ------------------------------------------------------------------ */
/* the waiting line (a helper thread; the main thread sits in flock) */

struct display {
	const char *mnt, *name;
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
			if (jint(json_array_get(waiters, i), "pid", &pid) && pid == chain[c])
				return i + 1;
		}
	}
	return 0;
}

static void display_render(struct display *d)
{
	int err;
	json_t *owner = read_owner(d->mnt, d->name, &err);
	json_t *waiters = read_waiters(d->mnt, d->name);
	char *who = owner ? describe_holder(owner) : xasprintf("held");
	size_t total = json_array_size(waiters), place = my_place(waiters);
	char waited[24], where[64];
	fmt_duration(now_ms() - d->started_ms, waited, sizeof(waited));
	if (place)
		snprintf(where, sizeof(where), "place %zu of %zu in line", place, total);
	else if (total)
		snprintf(where, sizeof(where), "%zu in line", total);
	else
		snprintf(where, sizeof(where), "in line");
	char *text = xasprintf("lockctl: waiting for %s: %s; %s; waited %s", d->name, who,
			       where, waited);
	/* Never wrap: a wrapped line cannot be rewritten with \r. */
	struct winsize ws;
	if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 &&
	    strlen(text) >= ws.ws_col)
		text[ws.ws_col - 1] = '\0';
	for (char *p = text; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
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
	d->mnt = mnt;
	d->name = name;
	d->started_ms = now_ms();
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

static void save_fwd_dispositions(void)
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

static int errno_status(int e)
{
	if (e == EPERM || e == EACCES)
		return EX_NOPERM;
	if (e == ENOTCONN)
		return EX_UNAVAILABLE;
	return EXIT_FAIL;
}

/* Open M/.flock/NAME.  Returns the fd, or -(exit status) after saying why. */
static int open_flock(const char *mnt, const char *name)
{
	char *path = xasprintf("%s/.flock/%s", mnt, name);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	int e = errno;
	free(path);
	if (fd >= 0)
		return fd;
	char *dir = xasprintf("%s/.flock", mnt);
	struct stat st;
	int se = stat(dir, &st) == 0 ? (S_ISDIR(st.st_mode) ? 0 : ENOTDIR) : errno;
	free(dir);
	/* Only a daemon that answers can be too old: a dead one (ENOTCONN)
	 * says so itself. */
	if (se == ENOENT || se == ENOTDIR)
		return -fail(EX_UNAVAILABLE, "%s has no .flock directory: this lockfs daemon is too"
			     " old for lockctl", mnt);
	if (se)
		e = se;
	if (e == EINVAL || e == ENAMETOOLONG)
		return -fail(EX_USAGE, "'%s' is not a valid lock name: %s", name, strerror(e));
	return -fail(errno_status(e), "cannot open %s/.flock/%s: %s", mnt, name, strerror(e));
}

/* A one-line description of who holds NAME now (for errors): malloc'd. */
static char *holder_now(const char *mnt, const char *name)
{
	int err;
	json_t *owner = read_owner(mnt, name, &err);
	if (!owner)
		return xasprintf("busy");
	char *s = describe_holder(owner);
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
 * Take the lock on FD with flock(2) OP (LOCK_EX or LOCK_SH), waiting in the
 * daemon's queue; O's timeout decides for how long (0: try once).
 * Returns 0 with the lock held, or an exit status after saying why, with
 * no lock and no place in line.
 */
static int wait_for_lock(const struct opts *o, const char *mnt, int fd, int op)
{
	const char *name = o->name;
	if (o->has_timeout && o->timeout == 0) {
		if (flock(fd, op | LOCK_NB) == 0)
			return 0;
		int e = errno;
		if (e == EWOULDBLOCK) {
			char *who = holder_now(mnt, name);
			int rc = fail(EX_TEMPFAIL, "%s: %s; not waiting (--timeout 0)", name, who);
			free(who);
			return rc;
		}
		if (e == ENOLCK)
			return fail(EX_UNAVAILABLE, "%s: flock on %s/.flock is not supported: this"
				    " lockfs daemon is too old for lockctl", name, mnt);
		return flock_failed(name, e);
	}

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART: flock(2) returns EINTR */
	sigaction(SIGALRM, &sa, NULL);
	set_fwd_handlers(on_stop_while_waiting);

	struct display d;
	display_start(&d, mnt, name);
	timed_out = 0;
	if (o->has_timeout)
		set_timer(o->timeout);
	int rc = 0, e = 0;
	for (;;) {
		if (timed_out) {
			e = EINTR;
			rc = -1;
			break;
		}
		rc = flock(fd, op);
		if (rc == 0)
			break; /* a grant that raced the deadline is still a grant */
		e = errno;
		if (e != EINTR)
			break;
		/* Another signal than ours: ask again at once, and the daemon
		 * gives back the place it kept for this open file. */
	}
	if (o->has_timeout)
		set_timer(0);
	display_stop(&d);
	if (rc == 0)
		return 0;
	if (e == EINTR) {
		char buf[32];
		snprintf(buf, sizeof(buf), "%g", o->timeout);
		char *who = holder_now(mnt, name);
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

/* Give up FD's lock, if any, and close it. */
static void unlock_close(int fd)
{
	while (flock(fd, LOCK_UN) < 0 && errno == EINTR)
		;
	close(fd);
}

/* ------------------------------------------------------------------ */
/* verbs */

static int cmd_run(const struct opts *o, const char *mnt)
{
	int fd = open_flock(mnt, o->name);
	if (fd < 0)
		return -fd;
	int rc = wait_for_lock(o, mnt, fd, o->shared ? LOCK_SH : LOCK_EX);
	if (rc) {
		close(fd);
		return rc;
	}

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
		/* CMD gets lockctl's dispositions and mask as inherited; the lock
		 * fd is O_CLOEXEC, so CMD cannot keep the lock alive. */
		for (int i = 0; i < NFWD; i++)
			sigaction(FWD_SIGNALS[i], &fwd_orig[i], NULL);
		signal(SIGALRM, SIG_DFL);
		sigprocmask(SIG_SETMASK, &old, NULL);
		execvp(o->cmd[0], o->cmd);
		int e = errno;
		fprintf(stderr, PROG ": cannot run %s: %s\n", o->cmd[0], strerror(e));
		_exit(e == ENOENT ? 127 : 126);
	}
	if (pid < 0) {
		int e = errno;
		sigprocmask(SIG_SETMASK, &old, NULL);
		unlock_close(fd);
		return fail(EXIT_FAIL, "fork: %s", strerror(e));
	}
	child_pid = pid;
	sigprocmask(SIG_SETMASK, &old, NULL);

	int st;
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR) {
			int e = errno;
			unlock_close(fd);
			return fail(EXIT_FAIL, "waitpid: %s", strerror(e));
		}
	}
	unlock_close(fd);
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return EXIT_FAIL;
}

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

static int cmd_acquire(const struct opts *o, const char *mnt, const char *slug)
{
	int fd = open_flock(mnt, o->name);
	if (fd < 0)
		return -fd;
	int rc = wait_for_lock(o, mnt, fd, LOCK_EX);
	if (rc) {
		close(fd);
		return rc;
	}
	char *path = xasprintf("%s/%s/bind", mnt, o->name);
	int e = write_text(path, slug ? "slug\n" : "process\n");
	free(path);
	if (e) {
		/* Not bound: give the lock back rather than leave it to this
		 * process's exit. */
		unlock_close(fd);
		if (e == ENOENT)
			return fail(EX_UNAVAILABLE, "%s: %s/%s/bind is missing: this lockfs daemon is"
				    " too old for lockctl acquire", o->name, mnt, o->name);
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
		char *who = holder_now(mnt, o->name);
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
			    o->name, strerror(e), REASON_MAX_BYTES);
	return fail(errno_status(e), "%s: break: %s", o->name, strerror(e));
}

/* ------------------------------------------------------------------ */
/* status */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Display width of UTF-8 text (one column per code point). */
static size_t text_width(const char *s)
{
	size_t w = 0;
	for (; *s; s++)
		if (((unsigned char)*s & 0xc0) != 0x80)
			w++;
	return w;
}

#define NCOLS 10
static const char *const COLS[NCOLS] = {
	"NAME", "MODE", "HOLDER", "PID", "USER", "HOST", "AGE", "LEASE", "WAITERS", "OPERATION",
};

struct row {
	char *cell[NCOLS];
};

struct table {
	struct row *rows;
	size_t n, cap;
};

/* A cell: a copy of TEXT with control characters shown as '?', or "-". */
static char *cell(const char *text)
{
	char *s = strdup(text && *text ? text : "-");
	if (!s)
		oom();
	for (char *p = s; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	return s;
}

static void table_add(struct table *t, const json_t *owner, const json_t *holder,
		      size_t nwaiters, long long now)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 16;
		t->rows = realloc(t->rows, t->cap * sizeof(*t->rows));
		if (!t->rows)
			oom();
	}
	struct row *r = &t->rows[t->n++];
	bool foreign = json_is_true(json_object_get(owner, "foreign")) || !holder;
	char buf[64];
	long long v;

	r->cell[0] = cell(jstr(owner, "resource"));
	const char *mode = jstr(owner, "mode");
	/* Before issue 4 every lock was exclusive. */
	r->cell[1] = cell(foreign ? NULL : mode && strcmp(mode, "shared") == 0 ? "SH" : "EX");
	const char *bound = jstr(owner, "bound");
	const char *slug = jstr(owner, "slug");
	if (foreign) {
		r->cell[2] = cell(NULL);
	} else if (bound && strcmp(bound, "slug") == 0 && slug) {
		char *s = xasprintf("slug:%s", slug);
		r->cell[2] = cell(s);
		free(s);
	} else {
		r->cell[2] = cell(jstr(holder, "comm"));
	}
	if (!foreign && jint(holder, "pid", &v)) {
		snprintf(buf, sizeof(buf), "%lld", v);
		r->cell[3] = cell(buf);
	} else {
		r->cell[3] = cell(NULL);
	}
	if (foreign) {
		r->cell[4] = cell(NULL);
	} else if (jstr(holder, "user")) {
		r->cell[4] = cell(jstr(holder, "user"));
	} else if (jint(holder, "uid", &v)) {
		snprintf(buf, sizeof(buf), "%lld", v);
		r->cell[4] = cell(buf);
	} else {
		r->cell[4] = cell(NULL);
	}
	r->cell[5] = cell(foreign ? NULL : jstr(holder, "host"));
	if (acquired_ms(foreign ? NULL : holder, owner, &v)) {
		fmt_duration(now - v, buf, sizeof(buf));
		r->cell[6] = cell(buf);
	} else {
		r->cell[6] = cell(NULL);
	}
	json_t *lease = json_object_get(owner, "lease");
	if (json_is_object(lease) && jint(lease, "expires_at_ms", &v)) {
		if (v <= now)
			snprintf(buf, sizeof(buf), "expired");
		else
			fmt_duration(v - now, buf, sizeof(buf));
		r->cell[7] = cell(buf);
	} else {
		r->cell[7] = cell(NULL);
	}
	snprintf(buf, sizeof(buf), "%zu", nwaiters);
	r->cell[8] = cell(buf);
	r->cell[9] = cell(jstr(owner, "operation"));
}

static void table_print(const struct table *t)
{
	size_t width[NCOLS];
	for (int c = 0; c < NCOLS; c++) {
		width[c] = strlen(COLS[c]);
		for (size_t i = 0; i < t->n; i++) {
			size_t w = text_width(t->rows[i].cell[c]);
			if (w > width[c])
				width[c] = w;
		}
	}
	for (size_t i = 0; i <= t->n; i++) {
		for (int c = 0; c < NCOLS; c++) {
			const char *s = i == 0 ? COLS[c] : t->rows[i - 1].cell[c];
			if (c == NCOLS - 1) {
				fputs(s, stdout);
			} else {
				/* numbers right-aligned, like lslocks */
				bool right = c == 3 || c == 8;
				size_t pad = width[c] - text_width(s);
				if (right)
					printf("%*s%s ", (int)pad, "", s);
				else
					printf("%s%*s ", s, (int)pad, "");
			}
		}
		putchar('\n');
	}
}

static void table_free(struct table *t)
{
	for (size_t i = 0; i < t->n; i++)
		for (int c = 0; c < NCOLS; c++)
			free(t->rows[i].cell[c]);
	free(t->rows);
}

/* The held lock names in M (sorted), or -errno. */
static int list_names(const char *mnt, char ***names, size_t *count)
{
	DIR *dir = opendir(mnt);
	if (!dir)
		return -errno;
	size_t n = 0, cap = 16;
	char **v = malloc(cap * sizeof(*v));
	if (!v)
		oom();
	struct dirent *de;
	errno = 0;
	while ((de = readdir(dir))) {
		if (de->d_name[0] == '.')
			continue; /* ., .., .log, .flock: never lock names */
		if (n == cap) {
			cap *= 2;
			v = realloc(v, cap * sizeof(*v));
			if (!v)
				oom();
		}
		v[n] = strdup(de->d_name);
		if (!v[n])
			oom();
		n++;
	}
	int e = errno;
	closedir(dir);
	if (e) {
		for (size_t i = 0; i < n; i++)
			free(v[i]);
		free(v);
		return -e;
	}
	qsort(v, n, sizeof(*v), cmp_str);
	*names = v;
	*count = n;
	return 0;
}

static int cmd_status(const struct opts *o, const char *mnt)
{
	char **names = NULL;
	size_t count = 0;
	char *one[1];
	if (o->name) {
		one[0] = (char *)o->name;
		names = one;
		count = 1;
	} else {
		int rc = list_names(mnt, &names, &count);
		if (rc < 0)
			return fail(errno_status(-rc), "cannot list %s: %s", mnt, strerror(-rc));
	}
	json_t *all = json_array();
	struct table t = { 0 };
	long long now = now_ms();
	int status = 0;
	size_t shown = 0;
	for (size_t i = 0; i < count; i++) {
		int err;
		json_t *owner = read_owner(mnt, names[i], &err);
		if (!owner) {
			if (err == ENOENT) {
				/* released since the listing; or NAME not held */
				if (o->name)
					status = fail(EXIT_FAIL, "%s is not held", names[i]);
				continue;
			}
			if (err == EINVAL || err == ENAMETOOLONG)
				status = fail(EX_USAGE, "'%s' is not a valid lock name: %s",
					      names[i], strerror(err));
			else
				status = fail(errno_status(err), "%s: cannot read owner: %s",
					      names[i], err == EBADMSG ? "not JSON" : strerror(err));
			continue;
		}
		json_t *waiters = read_waiters(mnt, names[i]);
		size_t nwaiters = json_array_size(waiters);
		if (o->json) {
			json_object_set(owner, "waiters", waiters);
			json_array_append(all, owner);
		} else {
			json_t *hs = json_object_get(owner, "holders");
			if (json_is_array(hs) && json_array_size(hs) > 1) {
				for (size_t h = 0; h < json_array_size(hs); h++)
					table_add(&t, owner, json_array_get(hs, h), nwaiters, now);
			} else {
				const json_t *h = NULL;
				holders_of(owner, &h);
				table_add(&t, owner, h, nwaiters, now);
			}
		}
		shown++;
		json_decref(waiters);
		json_decref(owner);
	}
	if (o->json) {
		char *text = json_dumps(all, JSON_INDENT(2));
		if (!text)
			oom();
		puts(text);
		free(text);
	} else if (shown || !o->name) {
		table_print(&t);
	}
	json_decref(all);
	table_free(&t);
	if (names != one) {
		for (size_t i = 0; i < count; i++)
			free(names[i]);
		free(names);
	}
	if (fflush(stdout) != 0 || ferror(stdout))
		return fail(EXIT_FAIL, "writing the status: %s", strerror(errno));
	return status;
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

int main(int argc, char **argv)
{
	struct opts o;
	int rc = parse_args(argc, argv, &o);
	if (rc)
		return rc;
	if (o.help) {
		fputs(USAGE, stdout);
		return fflush(stdout) == 0 ? 0 : EXIT_FAIL;
	}
	if (o.version) {
		printf("lockctl %s\n", LOCKFS_VERSION);
		return 0;
	}
	rc = check_args(&o);
	if (rc)
		return rc;

	const char *env_slug = getenv("LOCKFS_SLUG");
	if (o.slug && (!env_slug || strcmp(env_slug, o.slug) != 0))
		return reexec_with_slug(argv, o.slug);
	/* As for mkdir: a slug in the environment binds acquire to it. */
	const char *slug = o.slug ? o.slug : env_slug && *env_slug ? env_slug : NULL;

	char *mnt = NULL;
	rc = find_mount(o.mount, &mnt);
	if (rc)
		return rc;
	save_fwd_dispositions();

	switch (o.verb) {
	case V_RUN:
		rc = cmd_run(&o, mnt);
		break;
	case V_ACQUIRE:
		rc = cmd_acquire(&o, mnt, slug);
		break;
	case V_RELEASE:
		rc = cmd_release(&o, mnt);
		break;
	case V_STATUS:
		rc = cmd_status(&o, mnt);
		break;
	case V_BREAK:
		rc = cmd_break(&o, mnt);
		break;
	default:
		rc = usage_error("no command given");
		break;
	}
	free(mnt);
	return rc;
}
