/*
 * lockctl: wait for, hold, inspect, release and break lockfs locks.
 *
 * It talks to the mount with plain syscalls, like any user; of the
 * project it links only the name rule and its limits (lockfs/name.h,
 * lockfs/limits.h), so that it refuses exactly the names the mount would:
 *
 *   run      flock(M/.flock/NAME), fork+exec CMD, wait, unlock.  The lock
 *            belongs to the open file description, which CMD inherits (as
 *            under flock(1)): it lasts while CMD runs, however lockctl ends
 *            (even SIGKILL), and lockctl's LOCK_UN when CMD ends ends it
 *            for every process that shares it.
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
 *
 * The files: main.c (the verbs), run.c (run: several names, the fence),
 * lost.c (run: a lock lost while CMD runs), args.c (the command line), mount.c (finding
 * and reading the mount), wait.c (taking the lock: waiting, the waiting
 * line, signals), status.c (status), holder_view.c (a holder as seen from
 * here), text.c (text others chose, made safe to print), json.c (a member
 * of the JSON the mount shows).
 */
#ifndef LOCKCTL_H
#define LOCKCTL_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sysexits.h>

#include <jansson.h>

#ifndef LOCKFS_VERSION
#define LOCKFS_VERSION "unknown"
#endif

#define PROG "lockctl"
#define EXIT_FAIL 1
#define DEFAULT_MOUNT "/locks"
#define DISPLAY_PERIOD_MS 500
#define TIMER_KICK_MS 50
#define FILE_MAX (1024 * 1024) /* owner and waiters files we read */
#define LOCK_FD_MIN 10 /* the lock's descriptor, as run's CMD inherits it */
#define RESTART_WAIT_DEFAULT_S 30 /* --restart-wait, LOCKFS_RESTART_WAIT */
#define RESTART_WAIT_MAX_S 86400
#define RESTART_RETRY_MS 200 /* longest sleep between two tries in a restart */
#define RUN_NAMES_MAX 64 /* lockctl run A B C -- CMD: names in one run */
#define EX_LOST 76 /* run: a lock was lost (or broken) while CMD ran */
#define LOST_GRACE_DEFAULT_S 10 /* --lost-grace, LOCKFS_LOST_GRACE */
#define LOST_CHECK_MS 200 /* how often run looks whether its grants still stand */
/* Not an errno the mount gives: a guarded mount point with nothing on it. */
#define ERR_NOTHING_MOUNTED ENOMEDIUM

/* ------------------------------------------------------------------ */
/* messages: every file's, so static inline here */

/*
 * Make S, in place, safe to print on one line of a terminal: every control
 * character (C0, DEL, C1), line or paragraph separator (U+2028, U+2029),
 * bidirectional control (lockfs_utf8_unsafe_in_line()) and every byte that
 * is not UTF-8 becomes one '?' (text.c).
 */
void lockfs_ctl_printable(char *s);

/* Print "last deadlock: ..." from the tail of MNT/.log, if it has a
 * `deadlock` line (deadlock_view.c); nothing otherwise. */
void lockfs_ctl_last_deadlock(const char *mnt);

/* Print "lockctl: TEXT" as one line, whatever the text carried in (names,
 * reasons). */
__attribute__((format(printf, 1, 2)))
static inline void warnmsg(const char *fmt, ...)
{
	va_list ap;
	char buf[2048];
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	/* One line whatever the message quotes (a holder's comm, a name):
	 * line ends read as spaces, the rest as lockfs_ctl_printable() says. */
	for (char *p = buf; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	lockfs_ctl_printable(buf);
	fprintf(stderr, "%s: %s\n", PROG, buf);
}

/* Print one error line; return STATUS, for `return fail(...)`. */
__attribute__((format(printf, 2, 3)))
static inline int fail(int status, const char *fmt, ...)
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
static inline void oom(void)
{
	fputs(PROG ": out of memory\n", stderr);
	exit(EXIT_FAIL);
}

/* A malloc'd string; exits on out of memory. */
__attribute__((format(printf, 1, 2)))
static inline char *xasprintf(const char *fmt, ...)
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

/* The exit status for errno E from the mount. */
static inline int errno_status(int e)
{
	if (e == EPERM || e == EACCES)
		return EX_NOPERM;
	if (e == ENOTCONN || e == ECONNABORTED || e == ERR_NOTHING_MOUNTED)
		return EX_UNAVAILABLE;
	return EXIT_FAIL;
}

/* ------------------------------------------------------------------ */
/* the command line (args.c) */

enum verb { V_NONE, V_RUN, V_ACQUIRE, V_RELEASE, V_STATUS, V_BREAK, V_WATCH, V_METRICS, V_TOP };

struct opts {
	enum verb verb;
	const char *verb_word;
	const char *name;      /* NAME, or NULL */
	const char *slug;      /* --slug */
	const char *mount;     /* --mount */
	const char *reason;    /* --reason */
	double timeout;        /* --timeout, when has_timeout */
	bool has_timeout;
	double restart_wait;   /* --restart-wait, when has_restart_wait */
	bool has_restart_wait;
	bool shared, json, help, version;
	bool seen_poll, seen_stale, seen_double_dash;
	char **cmd;            /* after "--" */
	int ncmd;
	/* run: every NAME given (names[0] is NAME), in command-line order;
	 * run takes them sorted (lockfs_ctl_run).  Points into argv. */
	const char *names[RUN_NAMES_MAX];
	int nnames;
	int lost_signal;       /* --lost-signal, when has_lost_signal */
	bool has_lost_signal;
	double lost_grace;     /* --lost-grace, when has_lost_grace */
	bool has_lost_grace;
	unsigned slots;        /* run --slots N (1..LOCKFS_SLOTS_MAX); 0: a lock */
};

/* The --help text. */
extern const char lockfs_ctl_usage[];

/* Print WHAT as a usage error; returns EX_USAGE. */
int lockfs_ctl_usage_error(const char *what);

/*
 * Parse ARGV into O.  Options may come anywhere before "--"; the first
 * word is the verb, the second NAME.  Returns 0, or EX_USAGE after
 * printing why.
 */
int lockfs_ctl_parse_args(int argc, char **argv, struct opts *o);

/* Check that O's options fit its verb, and NAME, the slug and the reason
 * what the mount accepts.  Returns 0 or EX_USAGE after printing why. */
int lockfs_ctl_check_args(const struct opts *o);

/* ------------------------------------------------------------------ */
/* the mount and reading it (mount.c) */

/*
 * Find the lockfs mount: OPT_MOUNT, else $LOCKFS_MOUNT, else /locks; it
 * must be a fuse.lockfs mount.  Returns 0 with *OUT malloc'd; or, saying
 * nothing, -E when its daemon is away for now (E is ENOTCONN or
 * ECONNABORTED: a dead mount; ERR_NOTHING_MOUNTED: a guarded mount point
 * with nothing on it); or an exit status after saying why.
 */
int lockfs_ctl_find_mount(const char *opt_mount, char **out);
/* The same, but a daemon that is away is said in one line (exit 69). */
int lockfs_ctl_find_mount_now(const char *opt_mount, char **out);

/* ------------------------------------------------------------------ */
/* riding out a daemon restart (outage.c) */

/* Does errno E from the mount mean that its daemon's connection is gone? */
bool lockfs_ctl_is_conn_error(int e);
/* Is PATH a guarded mount point (lockfs --guard: immutable)? */
bool lockfs_ctl_is_guarded(const char *path);
/* Why the daemon is away, for a message: E from lockfs_ctl_find_mount(). */
const char *lockfs_ctl_down_reason(int e);
/* How long run and acquire ride out a daemon that is away: --restart-wait,
 * else LOCKFS_RESTART_WAIT, else RESTART_WAIT_DEFAULT_S.  Returns 0, or
 * EX_USAGE after saying why. */
int lockfs_ctl_restart_wait(const struct opts *o, double *secs);
/* Sleep until the mount table changes, a signal comes, or MAX_MS pass
 * (MAX_MS 0: only start watching, so that no change is missed later). */
void lockfs_ctl_wait_mount_change(int max_ms);

/* The held lock names in M (sorted; status.c), or -errno. */
int lockfs_ctl_list_names(const char *mnt, char ***names, size_t *count);

/* ------------------------------------------------------------------ */
/* watching (watch.c, top.c) */

/* Open M/.events; with NNAMES names, watching only those.  fd or -errno. */
int lockfs_ctl_events_open(const char *mnt, char *const *names, int nnames);
/* lockctl watch [NAME...]: M/.events to standard output.  Exit status. */
int lockfs_ctl_watch(const char *mnt, char *const *names, int nnames);
/* lockctl metrics: M/.metrics to standard output.  Exit status. */
int lockfs_ctl_metrics(const char *mnt);
/* lockctl top: the live view.  Exit status. */
int lockfs_ctl_top(const char *mnt);

/* M/NAME/owner as a JSON object; NULL with *ERR = errno (EBADMSG: not JSON). */
json_t *lockfs_ctl_read_owner(const char *mnt, const char *name, int *err);
/* M/NAME/waiters as a JSON array, one object per line in queue order
 * (empty when the file is missing; lines not JSON objects skipped). */
json_t *lockfs_ctl_read_waiters(const char *mnt, const char *name);
/* O's string member KEY, or NULL (json.c). */
const char *lockfs_ctl_jstr(const json_t *o, const char *key);
/* O's integer member KEY into *V: true when it is one. */
bool lockfs_ctl_jint(const json_t *o, const char *key, long long *v);
/* Wall-clock milliseconds since the epoch. */
long long lockfs_ctl_now_ms(void);
/* When HOLDER (or else OWNER) acquired: true with *MS set. */
bool lockfs_ctl_acquired_ms(const json_t *holder, const json_t *owner, long long *ms);
/* MS as a duration for people into BUF: 42s, 3m05s, 2h07m, 3d04h. */
void lockfs_ctl_fmt_duration(long long ms, char *buf, size_t size);
/* How many holders OWNER has ("holders" if present, else [holder]);
 * *FIRST the first. */
size_t lockfs_ctl_holders_of(const json_t *owner, const json_t **first);
/* A one-line description of OWNER's holder, for lock NAME of MNT: malloc'd. */
char *lockfs_ctl_describe_holder(const char *mnt, const char *name, const json_t *owner);

/* ------------------------------------------------------------------ */
/* a holder as seen from here (holder_view.c) */

/* Holder object H's pid in lockctl's own pid namespace: its ns_pid or pid,
 * whichever our /proc shows with H's start time.  False when neither: H
 * exited, or lives outside our pid namespace (the daemon's pid is then
 * nobody's here, or a stranger's). */
bool lockfs_ctl_pid_here(const json_t *h, long long *pid);
/*
 * What to say besides holder H's name, for lock NAME of MNT, or NULL when
 * nothing: "(exited; kept by sleep[12708])" when the holder exited and
 * processes it started keep the lock; for an fd lock whose opener is not
 * here, who still has M/.flock/NAME open ("(opener gone; fd open in
 * sleep[4567])") or that it is unknown; "(outside this pid namespace)".
 * BRIEF: the same without blanks, for a table column ("(exited,kept:
 * sleep[12708])", "(gone,fd:sleep[4567])", "(gone,fd:unknown)",
 * "(outside)").  Malloc'd.
 */
char *lockfs_ctl_holder_note(const char *mnt, const char *name, const json_t *owner,
			     const json_t *h, bool brief);

/* ------------------------------------------------------------------ */
/* taking the lock (wait.c) */

/* One lock run holds for CMD. */
struct run_lock {
	const char *name;
	int fd;                /* M/.flock/NAME, holding the lock */
	long long fence;       /* of our grant, from owner; 0 when unknown */
};


/* Remember the signal dispositions lockctl inherited (for run's CMD). */
void lockfs_ctl_save_signals(void);
/* Open M/.flock/NAME.  Returns the fd; or -1 with *DOWN set, saying
 * nothing, when the daemon is away (as lockfs_ctl_find_mount() says, with
 * OPT_MOUNT); or -(exit status) after saying why. */
int lockfs_ctl_open_flock(const char *opt_mount, const char *mnt, const char *name, int *down);
/* A one-line description of who holds NAME now (for errors): malloc'd. */
char *lockfs_ctl_holder_now(const char *mnt, const char *name);
/*
 * Open M/.flock/NAME and take the lock with flock(2) OP (LOCK_EX or
 * LOCK_SH), waiting in the daemon's queue; O's timeout decides for how
 * long (0: try once).  While the daemon is away (a restart: the connection
 * is gone, or nothing is mounted yet) it tries again, on the mount found
 * anew, for up to RESTART_WAIT seconds at a time.  *MNT is the mount (it
 * may be replaced).  Returns 0 with the lock held through *FD, or an exit
 * status after saying why, with no lock and no place in line.
 */
int lockfs_ctl_take_lock(const struct opts *o, char **mnt, double restart_wait, int op,
			 int *fd);
/* Give up FD's lock, if any, and close it. */
void lockfs_ctl_unlock_close(int fd);
/*
 * Fork and exec CMD with the signal dispositions and mask lockctl
 * inherited, with the descriptors of LOCKS[NLOCKS] kept open in it, and
 * pass SIGINT, SIGTERM and SIGHUP on to CMD from then on.  Returns its pid,
 * or -errno when fork failed.  The child does not return: 127 when CMD is
 * not found, 126 when it cannot run.
 */
pid_t lockfs_ctl_spawn(char **cmd, const struct run_lock *locks, size_t nlocks);

/* ------------------------------------------------------------------ */
/* run: several names, the fence, a lost lock (run.c, lost.c) */

/* lockctl run NAME... -- CMD.  Returns the exit status. */
int lockfs_ctl_run(const struct opts *o, char **mnt, double restart_wait);

/* The fence of our grant of NAME (the holder that is lockctl or an
 * ancestor of it, bound to an fd): 0 when owner shows none. */
long long lockfs_ctl_grant_fence(const char *mnt, const char *name);

/* How run stops CMD once a lock is lost: --lost-signal and --lost-grace,
 * else LOCKFS_LOST_SIGNAL and LOCKFS_LOST_GRACE, else SIGTERM and
 * LOST_GRACE_DEFAULT_S.  Returns 0, or EX_USAGE after saying why. */
int lockfs_ctl_lost_policy(const struct opts *o, int *sig, double *grace);
/* A signal name (TERM, SIGTERM) or number: true with *SIG set. */
bool lockfs_ctl_parse_signal(const char *text, int *sig);

/*
 * Wait for CMD (PID) to end while watching LOCKS[N] on MNT: should one of
 * them no longer show our grant (lost with the store session, removed in
 * the store, broken), send SIG to CMD and its descendants, and SIGKILL to
 * whatever of them still runs GRACE seconds later.  *ST is CMD's wait
 * status; returns the index of the first lock lost, or -1 when none was;
 * or -2 when waitpid failed (errno set).
 */
int lockfs_ctl_supervise(pid_t pid, const char *mnt, const struct run_lock *locks, size_t n,
			 int sig, double grace, int *st);

/* ------------------------------------------------------------------ */
/* status (status.c) */

/* lockctl status [NAME] [--json].  Returns the exit status. */
int lockfs_ctl_status(const struct opts *o, const char *mnt);

#endif
