/*
 * lockctl's command line: parsing it into struct opts, and checking that
 * the options fit the verb and that NAME, the slug and the reason are what
 * the mount accepts (the daemon's own name rule and limits).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include <jansson.h>

#include "lockfs/limits.h"
#include "lockfs/name.h"

#include "lockctl.h"

/* ------------------------------------------------------------------ */
/* the command line */

const char lockfs_ctl_usage[] =
	"Usage:\n"
	"  lockctl run NAME [NAME...] [--slug S] [--timeout SECS] [--restart-wait SECS]\n"
	"              [--shared] [--lost-signal SIG] [--lost-grace SECS] -- CMD [ARG...]\n"
	"  lockctl run NAME --slots N [...] -- CMD [ARG...]\n"
	"  lockctl acquire NAME [--slug S] [--timeout SECS] [--restart-wait SECS]\n"
	"  lockctl release NAME [--slug S]\n"
	"  lockctl status [NAME] [--json]\n"
	"  lockctl break NAME --reason TEXT\n"
	"  lockctl watch [NAME...] | lockctl metrics | lockctl top\n"
	"  lockctl --help | --version\n"
	"\n"
	"Wait for, hold, inspect and release lockfs locks. Waiting is a blocking\n"
	"flock(2) on M/.flock/NAME, which the daemon serves in arrival order.\n"
	"\n"
	"Verbs:\n"
	"  run      wait for NAME, run CMD, release NAME however CMD ends, and exit\n"
	"           with CMD's status (128+N if it died of signal N). SIGINT, SIGTERM\n"
	"           and SIGHUP are passed on to CMD. CMD shares the lock's open file,\n"
	"           so the lock lasts while CMD runs even if lockctl is killed.\n"
	"           Several NAMEs are taken one by one in byte order of their names\n"
	"           (whatever order they are given in), so that runs with common\n"
	"           names never deadlock; if one cannot be taken, those taken are\n"
	"           released. CMD gets LOCKFS_FENCE: the fence of each grant, in that\n"
	"           order, separated by spaces. Should a lock be lost while CMD runs\n"
	"           (its etcd session lost, its key removed, broken), CMD and its\n"
	"           descendants get --lost-signal, then SIGKILL after --lost-grace,\n"
	"           and lockctl exits 76.\n"
	"  acquire  wait for NAME and bind it to the calling shell (the parent of\n"
	"           lockctl), or to the slug, so that it stays held after lockctl exits.\n"
	"  release  release NAME (rmdir M/NAME): the holder's tree, or the slug.\n"
	"  status   list held locks: NAME MODE HOLDER PID USER HOST AGE LEASE\n"
	"           WAITERS OPERATION; --json prints the owner records, each with a\n"
	"           \"waiters\" array. With NAME, exits 1 when NAME is not held.\n"
	"  break    take NAME away from whoever holds it (root or the mounting user);\n"
	"           the reason is logged.\n"
	"  watch    print one JSON line per lock event as it happens (acquired,\n"
	"           released, recovered, waiting, granted, broken, lost ...), of the\n"
	"           NAMEs given or of every lock, until interrupted (M/.events).\n"
	"  metrics  print the daemon's metrics, Prometheus text format (M/.metrics).\n"
	"  top      a live view of the held locks, their holders and waiters; q quits.\n"
	"\n"
	"Options:\n"
	"  --mount PATH    the lockfs mount (default: $LOCKFS_MOUNT, else /locks)\n"
	"  --slug S        bind to slug S (LOCKFS_SLUG=S): a lock taken by acquire\n"
	"                  belongs to (uid, S) under a lease, and any process of that\n"
	"                  uid with the slug may release it. Without --slug, a\n"
	"                  non-empty LOCKFS_SLUG in the environment counts, as for mkdir.\n"
	"  --timeout SECS  give up waiting after SECS (decimals allowed); 0 tries once\n"
	"  --restart-wait SECS\n"
	"                  run, acquire: while the daemon is away (a restart: \"Transport\n"
	"                  endpoint is not connected\", \"Software caused connection\n"
	"                  abort\", nothing mounted on a guarded mount point), try again\n"
	"                  for up to SECS (default $LOCKFS_RESTART_WAIT, else 30), then\n"
	"                  exit 69; 0 gives up at once\n"
	"  --shared        run: take the lock shared (many readers, no writer)\n"
	"  --slots N       run: take one of N slots of NAME (M/.slots, docs/slots.md);\n"
	"                  CMD gets its number (0 to N-1) in LOCKFS_SLOT\n"
	"  --lost-signal SIG\n"
	"                  run: the signal (TERM, SIGINT, 15...) sent to CMD and its\n"
	"                  descendants when a lock is lost (default $LOCKFS_LOST_SIGNAL,\n"
	"                  else TERM)\n"
	"  --lost-grace SECS\n"
	"                  run: SIGKILL whatever of them still runs SECS after that\n"
	"                  (default $LOCKFS_LOST_GRACE, else 10)\n"
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
	"  64   usage error (bad option, missing NAME or CMD, invalid lock name;\n"
	"       acquire without --slug whose parent is outside its pid namespace)\n"
	"  69   the mount is missing or is not a fuse.lockfs mount, or (run, acquire)\n"
	"       its daemon stayed away longer than --restart-wait\n"
	"  75   timed out waiting (also --timeout 0 when the lock is busy)\n"
	"  76   run: a lock was lost (or broken) while CMD ran, and CMD was stopped\n"
	"  77   permission refused (EPERM, EACCES): not the holder, not allowed to break\n"
	"  126  run: CMD could not be executed; 127: CMD not found\n"
	"\n"
	"See lockctl(1).\n";

int lockfs_ctl_usage_error(const char *what)
{
	return fail(EX_USAGE, "%s (see lockctl --help)", what);
}

/*
 * Seconds: a decimal number, 0 to LOCKFS_LEASE_MAX_S (ten years, the
 * daemon's lease limit).  Returns true and sets *OUT
 * when TEXT is one.
 */
static bool parse_seconds(const char *text, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(text, &end);
	if (errno || end == text || *end || !isfinite(v) || v < 0 || v > (double)LOCKFS_LEASE_MAX_S)
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
	{ "status", V_STATUS }, { "break", V_BREAK }, { "watch", V_WATCH },
	{ "metrics", V_METRICS }, { "top", V_TOP },
};

/*
 * Parse ARGV into O.  Options may come anywhere before "--"; the first
 * word is the verb, the second NAME.  Returns 0, or EX_USAGE after
 * printing why.
 */
int lockfs_ctl_parse_args(int argc, char **argv, struct opts *o)
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
				"slug", "timeout", "restart-wait", "poll", "stale", "mount",
				"reason", "lost-signal", "lost-grace", "slots",
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
						int rc = lockfs_ctl_usage_error(m);
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
				} else if (strcmp(key, "slots") == 0) {
					char *end;
					unsigned long n = strtoul(val, &end, 10);
					if (!*val || *end || val[0] < '1' || val[0] > '9' ||
					    n > LOCKFS_SLOTS_MAX)
						return fail(EX_USAGE, "--slots %s: want a number of"
							    " slots, 1 to %d", val, LOCKFS_SLOTS_MAX);
					o->slots = (unsigned)n;
				} else if (strcmp(key, "lost-signal") == 0) {
					if (!lockfs_ctl_parse_signal(val, &o->lost_signal))
						return fail(EX_USAGE, "--lost-signal %s: want a signal"
							    " name (TERM, SIGINT) or number", val);
					o->has_lost_signal = true;
				} else if (!parse_seconds(val, &secs)) {
					return fail(EX_USAGE, "--%s %s: want a number of seconds, 0 to %.0f"
						    " (see lockctl --help)", key, val, (double)LOCKFS_LEASE_MAX_S);
				} else if (strcmp(key, "timeout") == 0) {
					o->timeout = secs;
					o->has_timeout = true;
				} else if (strcmp(key, "restart-wait") == 0) {
					if (secs > RESTART_WAIT_MAX_S)
						return fail(EX_USAGE, "--restart-wait %s: want a number"
							    " of seconds, 0 to %d", val,
							    RESTART_WAIT_MAX_S);
					o->restart_wait = secs;
					o->has_restart_wait = true;
				} else if (strcmp(key, "lost-grace") == 0) {
					o->lost_grace = secs;
					o->has_lost_grace = true;
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
			o->names[o->nnames++] = a;
		} else if (o->verb == V_RUN) {
			/* run takes several names; a word that is no lock name is
			 * most likely a command put before the --. */
			if (o->nnames == RUN_NAMES_MAX)
				return fail(EX_USAGE, "run: more than %d names", RUN_NAMES_MAX);
			o->names[o->nnames++] = a;
		} else if (o->verb == V_WATCH) {
			/* more names: main.c hands watch every word after the verb */
		} else {
			return fail(EX_USAGE, "unexpected argument '%s' (see lockctl --help)", a);
		}
		npos++;
	}
	return 0;
}

/* Check that O's options fit its verb.  Returns 0 or EX_USAGE. */
int lockfs_ctl_check_args(const struct opts *o)
{
	enum verb v = o->verb;
	if (v == V_NONE)
		return lockfs_ctl_usage_error("no command given");
	const char *w = o->verb_word;
	if (v != V_STATUS && v != V_WATCH && v != V_METRICS && v != V_TOP && !o->name)
		return fail(EX_USAGE, "%s: NAME is missing (see lockctl --help)", w);
	for (int i = 0; i < o->nnames; i++) {
		/* The daemon's own rule (include/lockfs/name.h), so that a name
		 * the mount would refuse is refused here, before the mount is
		 * touched, with the same reasons. */
		const char *name = o->names[i];
		int e = lockfs_name_check(name);
		if (e == -ENOMEM)
			oom();
		if (e == -ENAMETOOLONG)
			return fail(EX_USAGE, "'%s' is not a valid lock name: longer than %d bytes",
				    name, LOCKFS_NAME_MAX);
		if (e && v == V_RUN && i > 0)
			return fail(EX_USAGE, "'%s' is not a valid lock name; is it part of CMD?"
				    " put the command after -- (lockctl run NAME... -- CMD...)",
				    name);
		if (e)
			return fail(EX_USAGE, "'%s' is not a valid lock name (1 to %d bytes of UTF-8"
				    " in Unicode NFC, no '/', no control or format character, not"
				    " starting with '.', not only whitespace; see lockctl --help)",
				    name, LOCKFS_NAME_MAX);
		/* Twice in one run would wait for itself (two open files of one
		 * name): refused, not merged, as a script's mistake. */
		for (int j = 0; j < i; j++)
			if (strcmp(o->names[j], name) == 0)
				return fail(EX_USAGE, "run: '%s' is given twice", name);
	}
	if (o->seen_double_dash && v != V_RUN)
		return fail(EX_USAGE, "%s takes no command after -- (see lockctl --help)", w);
	if (v == V_RUN && (!o->seen_double_dash || o->ncmd == 0))
		return lockfs_ctl_usage_error("run: CMD is missing (lockctl run NAME -- CMD...)");
	if (o->slug && !(v == V_RUN || v == V_ACQUIRE || v == V_RELEASE))
		return fail(EX_USAGE, "%s does not take --slug", w);
	/* LOCKFS_SLUG_MAX counts the NUL. */
	if (o->slug && (o->slug[0] == '\0' || strlen(o->slug) > LOCKFS_SLUG_MAX - 1))
		return fail(EX_USAGE, "--slug: want 1 to %d bytes", LOCKFS_SLUG_MAX - 1);
	if (o->has_timeout && !(v == V_RUN || v == V_ACQUIRE))
		return fail(EX_USAGE, "%s does not take --timeout", w);
	if (o->has_restart_wait && !(v == V_RUN || v == V_ACQUIRE))
		return fail(EX_USAGE, "%s does not take --restart-wait", w);
	if ((o->seen_poll || o->seen_stale) && !(v == V_RUN || v == V_ACQUIRE || v == V_RELEASE))
		return fail(EX_USAGE, "%s does not take --poll or --stale", w);
	if ((o->has_lost_signal || o->has_lost_grace) && v != V_RUN)
		return fail(EX_USAGE, "%s does not take --lost-signal or --lost-grace (only run"
			    " does)", w);
	if (o->slots && (v != V_RUN || o->nnames != 1 || o->shared))
		return fail(EX_USAGE, "--slots: only run takes it, with one NAME and without"
			    " --shared");
	if (o->slots && lockfs_slot_base_check(o->name) < 0)
		return fail(EX_USAGE, "--slots: '%s' cannot have slots (at most %d bytes, and not"
			    " ending in =DIGITS; see docs/slots.md)", o->name, LOCKFS_SLOT_NAME_MAX);
	if (o->shared && v != V_RUN)
		return fail(EX_USAGE, "%s does not take --shared (only run does)", w);
	if (o->json && v != V_STATUS)
		return fail(EX_USAGE, "%s does not take --json (only status does)", w);
	if (o->reason && v != V_BREAK)
		return fail(EX_USAGE, "%s does not take --reason (only break does)", w);
	if (v == V_BREAK) {
		if (!o->reason)
			return lockfs_ctl_usage_error("break: --reason TEXT is required");
		size_t n = strlen(o->reason);
		if (n == 0 || n > LOCKFS_REASON_MAX)
			return fail(EX_USAGE, "--reason: want 1 to %d bytes", LOCKFS_REASON_MAX);
	}
	return 0;
}
