/*
 * lockfs: named mutual-exclusion locks as directories.
 *
 *   lockfs [-f] [-o backend=dir] [-o backing=DIR] [-o fence_file=PATH]
 *          [-o stale=SECONDS] [-o helpers=a:b:c]
 *          [-o lease=SECONDS] [-o break_signal=SIG] [-o container_root=own|host]
 *          [-o descendants=connector|scan]
 *          [-o log_max=SIZE] [-o log_keep=N] [-o log_denied_interval=SECONDS]
 *          [-o max_open_per_uid=N] [-o max_locks_per_uid=N]
 *          [-o max_waiters_per_uid=N] [-o max_locks=N]
 *          [FUSE options] [SOURCE] MOUNTPOINT
 *   lockfs --guard MOUNTPOINT
 *   lockfs --stop MOUNTPOINT
 *   lockfs --upgrade MOUNTPOINT
 *
 * SOURCE is what mount(8) passes through mount.fuse3 (`mount -t fuse.lockfs
 * lockfs /locks`); it is ignored.
 *
 * Opens the store that -o backend= names (lockfs/backend.h: the dir
 * backend checks the backing directory and takes it for this daemon)
 * before mounting, so a misconfigured lock is a one-line error at second
 * zero, never a silent no-op mutex.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemonize.h"
#include "events_file.h"
#include "fs.h"
#include "guard.h"
#include "connstate.h"
#include "keeper.h"
#include "keepconn.h"
#include "lifecycle.h"
#include "loop.h"
#include "resume.h"
#include "stop.h"
#include "stopcmd.h"
#include "takeover.h"
#include "service.h"
#include "lockfs/backend.h"
#include "lockfs/core.h"

/* The store kind without -o backend=. */
#define KIND_DEFAULT "dir"

/* -o KEY=VALUE options that belong to a store, in the order given. */
struct store_options {
	struct lockfs_backend_option *v; /* key and value malloc'd */
	size_t n;
};

struct options {
	char *backend;
	struct store_options store;
	char *helpers;
	char *lease;
	char *break_signal;
	char *container_root;
	char *metrics_names;
	char *descendants;
	char *max_open_per_uid;
	char *max_locks_per_uid;
	char *max_waiters_per_uid;
	char *max_locks;
	char *log_max;
	char *log_keep;
	char *log_denied_interval;
	char *keeper;
	int show_help;
	/* The positional arguments: [SOURCE] MOUNTPOINT. */
	char *positional[2];
	int n_positional;
};

#define OPT(t, p) { t, offsetof(struct options, p), 1 }
static const struct fuse_opt option_spec[] = {
	OPT("backend=%s", backend),
	OPT("helpers=%s", helpers),
	OPT("lease=%s", lease),
	OPT("break_signal=%s", break_signal),
	OPT("container_root=%s", container_root),
	OPT("metrics_names=%s", metrics_names),
	OPT("descendants=%s", descendants),
	OPT("max_open_per_uid=%s", max_open_per_uid),
	OPT("max_locks_per_uid=%s", max_locks_per_uid),
	OPT("max_waiters_per_uid=%s", max_waiters_per_uid),
	OPT("max_locks=%s", max_locks),
	OPT("log_max=%s", log_max),
	OPT("log_keep=%s", log_keep),
	OPT("log_denied_interval=%s", log_denied_interval),
	OPT("keeper=%s", keeper),
	/* mount(8)'s own options, which reach us from fstab through
	 * mount.fuse3 (it drops only some of them): they mean nothing here. */
	FUSE_OPT_KEY("nofail", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("_netdev", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("defaults", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("auto", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("noauto", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("user", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("nouser", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("users", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("owner", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("group", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("comment=", FUSE_OPT_KEY_DISCARD),
	/* mount.fuse3 adds these unless told nodev/nosuid: there are no device
	 * or set-uid files here, so keep libfuse's nodev,nosuid either way. */
	FUSE_OPT_KEY("dev", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("suid", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_END
};

/* Is KEY (LEN bytes) in the NULL-terminated KEYS? */
static bool key_in(const char *const *keys, const char *key, size_t len)
{
	for (size_t i = 0; keys && keys[i]; i++)
		if (strlen(keys[i]) == len && strncmp(keys[i], key, len) == 0)
			return true;
	return false;
}

/* Is OPT ("KEY=VALUE" or "KEY") an option of some store kind?  Then it is
 * kept in O->store: which kind takes it is known once all are parsed.
 * 1: kept; 0: not a store's; -1: out of memory. */
static int keep_store_option(struct options *o, const char *opt)
{
	const char *eq = strchr(opt, '=');
	size_t len = eq ? (size_t)(eq - opt) : strlen(opt);
	bool known = false;
	struct lockfs_backend_option *v;

	for (size_t i = 0; !known && lockfs_backend_kinds[i]; i++)
		known = key_in(lockfs_backend_kinds[i]->option_keys, opt, len);
	if (!known)
		return 0;
	v = realloc(o->store.v, (o->store.n + 1) * sizeof(*v));
	if (!v)
		return -1;
	o->store.v = v;
	v = &v[o->store.n];
	v->key = strndup(opt, len);
	v->value = eq ? strdup(eq + 1) : NULL;
	if (!v->key || (eq && !v->value)) {
		free((char *)v->key);
		free((char *)v->value);
		return -1;
	}
	o->store.n++;
	return 1;
}

/*
 * fuse_opt_parse's callback for what option_spec does not name: keeps the
 * stores' options (keep_store_option), collects the positional arguments
 * (put back once we know which is the mount point) and drops fstab's x-*
 * and X-* options (x-systemd.*, x-mount.*), which are for mount(8) and
 * systemd.  Everything else goes on to libfuse.
 */
static int other_arg(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct options *o = data;

	(void)outargs;
	if (key == FUSE_OPT_KEY_OPT) {
		int kept = keep_store_option(o, arg);

		if (kept != 0)
			return kept > 0 ? 0 : -1;
		return strncmp(arg, "x-", 2) == 0 || strncmp(arg, "X-", 2) == 0 ? 0 : 1;
	}
	if (key != FUSE_OPT_KEY_NONOPT)
		return 1;
	if (o->n_positional < 2) {
		o->positional[o->n_positional] = strdup(arg);
		if (!o->positional[o->n_positional])
			return -1;
	}
	o->n_positional++;
	return 0;
}

/*
 * Sort out [SOURCE] MOUNTPOINT: hand MOUNTPOINT back to libfuse.  SOURCE
 * means nothing: mount(8) wants one, and canonicalises it against its
 * working directory (a file "lockfs" there turns "lockfs" into a path), so
 * it cannot name the backing dir reliably (see warn_source).
 * Returns 0, or -1 after one line on stderr.
 */
static int take_positional(struct options *o, struct fuse_args *args)
{
	if (o->n_positional > 2) {
		fprintf(stderr, "lockfs: too many arguments: want [SOURCE] MOUNTPOINT\n");
		return -1;
	}
	if (o->n_positional > 0 &&
	    fuse_opt_add_arg(args, o->positional[o->n_positional - 1]) == -1)
		return -1;
	return 0;
}

/* Only a SOURCE that is another directory than the store's gets a
 * warning, in case it was meant as the backing dir. */
static void warn_source(const struct options *o, const struct lockfs_backend *be)
{
	const char *source = o->n_positional == 2 ? o->positional[0] : NULL;
	struct stat st;

	if (source && source[0] == '/' && strcmp(source, be->source) != 0 &&
	    stat(source, &st) == 0 && S_ISDIR(st.st_mode))
		fprintf(stderr, "lockfs: warning: source %s is ignored; the backing dir is %s "
			"(-o backing=DIR)\n", source, be->source);
}

static void usage(const char *prog)
{
	printf("usage: %s [-f] [-o OPTION[,OPTION...]] [SOURCE] MOUNTPOINT\n"
	       "       %s --guard MOUNTPOINT   make MOUNTPOINT immutable while nothing is\n"
	       "                               mounted on it, so mkdir there fails (root)\n"
	       "       %s --stop MOUNTPOINT    stop the daemon serving MOUNTPOINT and wait\n"
	       "                               until it has exited and unmounted (exit 0;\n"
	       "                               3: none serves it; 1: it did not stop)\n"
	       "       %s --upgrade MOUNTPOINT hand the mount over to the binary now at the\n"
	       "                               daemon's path; clients see nothing (exit 0)\n"
	       "(SOURCE, which mount(8) passes, is ignored: write lockfs)\n\n"
	       "lockfs options:\n"
	       "    -o backend=NAME       the store that holds the locks (default "
	       KIND_DEFAULT "; built:",
	       prog, prog, prog, prog);
	for (size_t i = 0; lockfs_backend_kinds[i]; i++)
		printf(" %s", lockfs_backend_kinds[i]->name);
	printf(")\n"
	       "    -o helpers=A:B:...    programs skipped when resolving a holder\n"
	       "                          (default " LOCKFS_DEFAULT_HELPERS ")\n"
	       "    -o lease=SECONDS      lease of slug-bound locks (default 600)\n"
	       "    -o break_signal=SIG   signal a holder whose lock is broken or recovered\n"
	       "    -o metrics_names=A:B    lock names with series of their own in M/.metrics\n"
	       "    -o container_root=WHAT  root in another pid namespace is root over the\n"
	       "                          locks of its own container (own, the default)\n"
	       "                          or over every lock (host)\n"
	       "    -o descendants=HOW    how a dead holder's descendants are found:\n"
	       "                          connector (default; scan when unavailable) or scan\n"
	       "    -o max_open_per_uid=N files and directories of M one uid may hold open\n"
	       "                          (default 1024, or a quarter of the descriptors the\n"
	       "                          daemon may keep for callers if fewer; EMFILE past it)\n"
	       "    -o max_locks_per_uid=N  locks one uid may hold (default 1024; EDQUOT)\n"
	       "    -o max_waiters_per_uid=N  flock/fcntl requests one uid may have waiting\n"
	       "                          (default 1024; EDQUOT)\n"
	       "    -o max_locks=N        locks in all (default 16384, or what a quarter of\n"
	       "                          DIR's file system holds if fewer; ENOSPC)\n"
	       "                          root is exempt from all four; 0 = no limit\n"
	       "    -o log_max=SIZE       rotate DIR/lock.log before it passes SIZE (K, M, G\n"
	       "                          suffixes; 0 = never; default 4M, at least 16K)\n"
	       "    -o log_keep=N         rotated logs kept: lock.log.1 .. lock.log.N (default 4)\n"
	       "    -o log_denied_interval=SECONDS\n"
	       "                          at most one `denied` line per uid per SECONDS\n"
	       "                          during a burst (default 10; 0 = log every one)\n"
	       "    -o keeper=on|off      keep the mount across a crash or an upgrade of the\n"
	       "                          daemon (default on: a keeper process, or systemd's\n"
	       "                          descriptor store; Linux 6.9)\n"
	       "    -o allow_other        let other users and containers use the mount\n"
	       "    -o auto_unmount       unmount when the daemon dies (unattended use)\n\n");
	for (size_t i = 0; lockfs_backend_kinds[i]; i++)
		printf("options of -o backend=%s%s:\n%s\n", lockfs_backend_kinds[i]->name,
		       strcmp(lockfs_backend_kinds[i]->name, KIND_DEFAULT) == 0 ? " (the default)"
										   : "",
		       lockfs_backend_kinds[i]->help);
}

/*
 * The holder rule reads /proc by the pids FUSE reports, which are pids of
 * our own pid namespace.  Under a /proc of another namespace (unshare -p
 * without a proc of its own) those pids would name strangers: then every
 * caller counts as one we cannot see (EACCES, fail closed), and we say so.
 * Returns true when /proc is ours; false after one line on stderr.
 */
static bool proc_is_ours(void)
{
	char self[32];
	ssize_t n = readlink("/proc/self", self, sizeof(self) - 1);

	if (n >= 0) {
		self[n] = '\0';
		if (strtol(self, NULL, 10) == (long)getpid())
			return true;
	}
	fprintf(stderr, "lockfs: warning: /proc is not of this pid namespace; every caller is "
		"refused (EACCES) until the daemon runs with its own proc (unshare --mount-proc)\n");
	return false;
}

/* OPT's "SECONDS" (1..10 years) into *OUT; one line on stderr when it is
 * not. */
static int seconds_option(const char *opt, const char *text, uint32_t *out)
{
	int64_t v;

	if (lockfs_backend_parse_seconds(text, 1, &v) < 0) {
		fprintf(stderr, "lockfs: -o %s=%s: want a whole number of seconds > 0\n",
			opt, text ? text : "");
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

/* A cap "N" (0 = none: LOCKFS_NO_LIMIT) into *OUT; one line on stderr
 * when it is not a whole number up to 2^31. */
static int parse_cap(const char *opt, const char *text, uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = *text >= '0' && *text <= '9' ? strtoul(text, &end, 10) : ULONG_MAX;
	if (v == ULONG_MAX || errno || *end || v > 0x80000000ul) {
		fprintf(stderr, "lockfs: -o %s=%s: want a whole number (0 = no limit)\n", opt, text);
		return -1;
	}
	*out = v == 0 ? LOCKFS_NO_LIMIT : (uint32_t)v;
	return 0;
}

/*
 * Every open M/.log and every watched holder costs the daemon a
 * descriptor: use all the hard limit allows (the soft one is often 1024).
 * Callers never get the last of them (see core/proc/fds.h).
 */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		fprintf(stderr, "lockfs: warning: cannot raise the descriptor limit to %llu: %s\n",
			(unsigned long long)rl.rlim_max, strerror(errno));
}

/* "TERM", "SIGTERM" or "15" into *OUT; one line on stderr when unknown. */
static int parse_signal(const char *text, int *out)
{
	const char *name = strncmp(text, "SIG", 3) == 0 ? text + 3 : text;
	char *end;
	long v = strtol(text, &end, 10);

	if (*text && !*end && v > 0 && v < NSIG) {
		*out = (int)v;
		return 0;
	}
	for (int sig = 1; sig < NSIG; sig++) {
		const char *abbrev = sigabbrev_np(sig);

		if (abbrev && strcmp(abbrev, name) == 0) {
			*out = sig;
			return 0;
		}
	}
	fprintf(stderr, "lockfs: -o break_signal=%s: unknown signal\n", text);
	return -1;
}

/* Does ARGV ask for help or the version (fuse_parse_cmdline's -h, -V)? */
static bool asks_for_help(int argc, char *argv[])
{
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0 ||
		    strcmp(argv[i], "-V") == 0 || strcmp(argv[i], "--version") == 0)
			return true;
	return false;
}

/* lockfs_loop_on_resent_done's hook: the engine's hold on waiters ends. */
static void resent_done(void *core)
{
	lockfs_core_resume_done(core);
}

/* lockfs_takeover_fn for the store's one-daemon lock (takeover.c). */
static int takeover(void *arg, int lockfd, int dirfd, const char *path)
{
	(void)arg;
	return lockfs_takeover(lockfd, dirfd, path);
}

/*
 * The store kind -o backend= names, checked against the options given
 * for a store (O->store): each must be one of that kind's.  The kind, or
 * NULL after one line on stderr.
 */
static const struct lockfs_backend_kind *store_kind(const struct options *o)
{
	const char *name = o->backend ? o->backend : KIND_DEFAULT;
	const struct lockfs_backend_kind *kind = lockfs_backend_kind(name);
	/* Its keys (the registry's table) are known even when it is not built. */
	const struct lockfs_backend_kind *etcd = lockfs_backend_kind("etcd");

	if (!kind) {
		char built[256] = "";

		for (size_t i = 0; lockfs_backend_kinds[i]; i++)
			snprintf(built + strlen(built), sizeof(built) - strlen(built), "%s%s",
				 i ? ", " : "", lockfs_backend_kinds[i]->name);
		fprintf(stderr, "lockfs: -o backend=%s: unknown (built: %s)\n", name, built);
		return NULL;
	}
	for (size_t i = 0; i < o->store.n; i++) {
		const char *key = o->store.v[i].key;

		if (key_in(kind->option_keys, key, strlen(key)))
			continue;
		if (etcd && key_in(etcd->option_keys, key, strlen(key)))
			fprintf(stderr, "lockfs: -o %s needs -o backend=etcd (the store is %s)\n",
				key, kind->name);
		else
			fprintf(stderr, "lockfs: -o %s is not an option of -o backend=%s\n",
				key, kind->name);
		return NULL;
	}
	return kind;
}

/*
 * Open the store of KIND with the options meant for it (O->store).  0 and
 * *BE, or -1 after one line on stderr: the store's own refusal.
 */
static int open_store(const struct lockfs_backend_kind *kind, const struct options *o,
		      struct lockfs_backend **be)
{
	char why[1024] = "", boot_id[40] = "";
	struct lockfs_backend_config cfg = {
		.options = o->store.v, .n_options = o->store.n, .boot_id = boot_id,
		.takeover = takeover, .why = why, .why_size = sizeof(why),
	};

	if (lockfs_procfs_boot_id(boot_id) < 0)
		boot_id[0] = '\0';
	if (kind->open(&cfg, be) < 0) {
		fprintf(stderr, "lockfs: %s\n", *why ? why : "cannot open the store");
		return -1;
	}
	return 0;
}

static void store_options_free(struct store_options *so)
{
	for (size_t i = 0; i < so->n; i++) {
		free((char *)so->v[i].key);
		free((char *)so->v[i].value);
	}
	free(so->v);
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts opts = { 0 };
	struct options o = { 0 };
	struct lockfs_fs fs = { 0 };
	const struct lockfs_backend_kind *kind = NULL;
	struct lockfs_backend *be = NULL;
	struct lockfs_core_config cfg = { 0 };
	struct fuse_loop_config *loop_cfg = NULL;
	struct lockfs_log_limits log_limits;
	char *fsname = NULL, *mnt_abs = NULL;
	bool served = false;  /* daemon-started is in the log */
	bool start_failed = false; /* the threads could not start */
	struct lockfs_resume resume;
	int resuming = 0;          /* 1: this process takes a live connection over */
	bool keep_conn = false;    /* a keeper (or systemd) holds the connection */
	int rc, ret = 1;

	if (argc >= 2 && strcmp(argv[1], "--guard") == 0)
		return lockfs_guard_main(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "--stop") == 0)
		return lockfs_stop_main(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "--upgrade") == 0)
		return lockfs_upgrade_main(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "--keeper") == 0)
		return lockfs_keeper_main(argc, argv);
	pthread_mutex_init(&fs.parked_mu, NULL);
	pthread_mutex_init(&fs.handles_mu, NULL);
	lockfs_errlog_start();
	if (fuse_opt_parse(&args, &o, option_spec, other_arg) == -1 ||
	    take_positional(&o, &args) < 0)
		goto out_args;
	/* Before libfuse looks at the mount point, so that a wrong store is
	 * the one line said; not for --help (which lists every kind). */
	if (!asks_for_help(argc, argv) && !(kind = store_kind(&o)))
		goto out_args;
	if (fuse_parse_cmdline(&args, &opts) != 0)
		goto out_args;
	if (opts.show_help) {
		usage(argv[0]);
		fuse_cmdline_help();
		fuse_lowlevel_help();
		ret = 0;
		goto out_args;
	}
	if (opts.show_version) {
		printf("lockfs version %s\n", LOCKFS_VERSION);
		fuse_lowlevel_version();
		ret = 0;
		goto out_args;
	}
	if (!opts.mountpoint) {
		fprintf(stderr, "lockfs: no mountpoint given (see %s --help)\n", argv[0]);
		goto out_args;
	}
	umask(022);
	if ((o.lease && seconds_option("lease", o.lease, &cfg.lease_s) < 0) ||
	    (o.break_signal && parse_signal(o.break_signal, &cfg.break_signal) < 0) ||
	    (o.max_open_per_uid &&
	     parse_cap("max_open_per_uid", o.max_open_per_uid, &cfg.max_open_per_uid) < 0) ||
	    (o.max_locks_per_uid &&
	     parse_cap("max_locks_per_uid", o.max_locks_per_uid, &cfg.max_locks_per_uid) < 0) ||
	    (o.max_waiters_per_uid &&
	     parse_cap("max_waiters_per_uid", o.max_waiters_per_uid, &cfg.max_waiters_per_uid) < 0) ||
	    (o.max_locks && parse_cap("max_locks", o.max_locks, &cfg.max_locks) < 0) ||
	    lockfs_log_limits_parse(o.log_max, o.log_keep, o.log_denied_interval, &log_limits) < 0)
		goto out_args;
	if (o.descendants && strcmp(o.descendants, "connector") != 0 &&
	    strcmp(o.descendants, "scan") != 0) {
		fprintf(stderr, "lockfs: -o descendants=%s: want connector or scan\n", o.descendants);
		goto out_args;
	}
	cfg.descendants_scan = o.descendants && strcmp(o.descendants, "scan") == 0;
	if (o.container_root && strcmp(o.container_root, "own") != 0 &&
	    strcmp(o.container_root, "host") != 0) {
		fprintf(stderr, "lockfs: -o container_root=%s: want own or host\n",
			o.container_root);
		goto out_args;
	}
	cfg.container_root_host = o.container_root && strcmp(o.container_root, "host") == 0;
	cfg.metrics_names = o.metrics_names;
	if (o.keeper && strcmp(o.keeper, "on") != 0 && strcmp(o.keeper, "off") != 0) {
		fprintf(stderr, "lockfs: -o keeper=%s: want on or off\n", o.keeper);
		goto out_args;
	}
	/* Started by a keeper (or systemd) to take a live connection over:
	 * in the foreground; under a keeper, detached already (its messages
	 * then go where a detached daemon's go). */
	resuming = lockfs_resume_take(&resume);
	if (resuming < 0)
		goto out_args;
	raise_fd_limit();

	fs.proc_foreign = !proc_is_ours();
	/* Detach before the store opens: its threads (etcd's keepalive and
	 * watch) and the session it registers must be the serving process's.
	 * `lockfs` returns only once the child has recorded its pid and
	 * serves, or failed and said why (daemonize.c). */
	if (!opts.foreground && !resuming) {
		rc = lockfs_daemonize();
		if (rc < 0) {
			fprintf(stderr, "lockfs: cannot detach: %s\n", strerror(-rc));
			goto out_args;
		}
	}
	/* The store's checks and its one-daemon lock (dir: DIR/.lockfs).  A
	 * successor that cannot have it, or whose mount another daemon has
	 * replaced meanwhile, lets the connection go (keeper.c). */
	if (open_store(kind, &o, &be) < 0) {
		ret = resuming ? LOCKFS_EXIT_SUPERSEDED : ret;
		goto out_args;
	}
	if (resuming && !lockfs_resume_still_mounted()) {
		lockfs_backend_close(be);
		ret = LOCKFS_EXIT_SUPERSEDED;
		goto out_args;
	}
	if (!opts.foreground || (resuming && !resume.from_systemd))
		lockfs_errlog_store_open(be->state_dirfd);
	warn_source(&o, be);
	/* The audit log lives in this host's state directory. */
	if (lockfs_log_open_audit(be->state_dirfd, be->state_path, &log_limits, &cfg.log) < 0) {
		lockfs_backend_close(be);
		goto out_args;
	}
	/* Before the engine logs what it recovers: a predecessor that did not
	 * stop cleanly comes first in the log. */
	if (resuming)
		lockfs_lifecycle_resumed(cfg.log, be, resume.prev, resume.cause);
	else
		lockfs_lifecycle_predecessor(cfg.log, be);
	cfg.backend = be;
	cfg.helpers = o.helpers;
	/* Taking a live connection over: fd locks stay bound to the same
	 * open files (fh ids, connstate.c), a resent request gets the answer
	 * its predecessor could not give, and resent waiters keep their
	 * places (docs/recovery.md). */
	cfg.resuming = resuming > 0;
	rc = lockfs_core_open(&fs.core, &cfg);
	if (rc < 0) {
		fprintf(stderr, "lockfs: cannot start the lock engine on %s: %s\n",
			be->source, rc == -EINVAL ? "bad helpers= list" : strerror(-rc));
		lockfs_backend_close(be);
		goto out_args;
	}
	/* The engine owns the store from here (lockfs_core_close closes it). */
	fs.inodes = lockfs_inodes_new(LOCKFS_IDLE_NODES_PER_UID);
	if (!fs.inodes) {
		fprintf(stderr, "lockfs: out of memory\n");
		goto out_inodes;
	}
	fs.mount_uid = getuid();
	fs.mount_gid = getgid();
	clock_gettime(CLOCK_REALTIME, &fs.mounted_at);

	/* Show as fuse.lockfs in /proc/mounts, with the backing dir as source. */
	if (fuse_opt_add_arg(&args, "-osubtype=lockfs") == -1 ||
	    fuse_opt_add_opt_escaped(&fsname, be->source) == -1)
		goto out_inodes;
	{
		char *opt = malloc(strlen(fsname) + 16);

		if (!opt)
			goto out_inodes;
		sprintf(opt, "-ofsname=%s", fsname);
		rc = fuse_opt_add_arg(&args, opt);
		free(opt);
		if (rc == -1)
			goto out_inodes;
	}

	fs.se = fuse_session_new(&args, &lockfs_ops, sizeof(lockfs_ops), &fs);
	if (!fs.se)
		goto out_inodes;
	lockfs_log_signals_set(fs.core);
	if (fuse_set_signal_handlers(fs.se) != 0)
		goto out_session;
	if (lockfs_stop_install(fs.se, be) < 0) {
		fprintf(stderr, "lockfs: cannot set signal handlers: %s\n", strerror(errno));
		goto out_signals;
	}
	if (resuming) {
		/* The mount is ours and alive, served by nobody yet: the
		 * mount point must not be looked at (it would wait for us). */
		mnt_abs = strdup(lockfs_connstate_mountpoint());
		if (!mnt_abs || lockfs_resume_attach(fs.se, &resume) < 0)
			goto out_signals;
		keep_conn = true;
		served = true;
		goto mounted;
	}
	/* Nothing may touch the mount point before a dead mount of ours is
	 * gone from it: a hung one would hang us. */
	if (lockfs_clear_dead_mount(be->state_dirfd, be->state_path, opts.mountpoint) < 0)
		goto out_signals;
	lockfs_guard_before_mount(opts.mountpoint);
	/* Resolved before mounting: afterwards a lookup of the mount point
	 * would be a request to ourselves, with nobody serving yet. */
	mnt_abs = realpath(opts.mountpoint, NULL);
	/* Before the mount, not after: once the mount shows, whoever waits
	 * for it (a script, the tests) may look at DIR, and the log must not
	 * grow under it then.  A start that fails from here on says so with
	 * its own daemon-stopped line. */
	lockfs_lifecycle_started(cfg.log, be, mnt_abs ? mnt_abs : opts.mountpoint);
	served = true;
	if (fuse_session_mount(fs.se, opts.mountpoint) != 0) {
		lockfs_lifecycle_failed(cfg.log, mnt_abs ? mnt_abs : opts.mountpoint, "mount-failed");
		goto out_signals;
	}
	{
		/* Tells descriptors of this mount from an earlier mount's (fd
		 * locks rebound at a restart); unknown, all count as earlier. */
		dev_t dev = 0;

		if (mnt_abs && lockfs_mount_dev(mnt_abs, &dev) == 0)
			lockfs_core_set_mount_dev(fs.core, dev);
		/* The detached daemon's connection outlives it (keeper.c). */
		keep_conn = lockfs_keeper_wanted(o.keeper, &opts, argc, argv) &&
			    lockfs_keeper_setup(fs.se, mnt_abs, (uint64_t)dev, argv,
						be->state_dirfd) == 0;
	}
mounted:
	if (keep_conn)
		lockfs_keeper_kept();
	/* A successor serves the same mount: its device is the kept one.  Its
	 * engine keeps fd locks bound to their open files (cfg.resuming), so
	 * nothing is rebound to a process that this device would end. */
	if (resuming && lockfs_connstate_mount_dev())
		lockfs_core_set_mount_dev(fs.core, (dev_t)lockfs_connstate_mount_dev());
	if (!opts.foreground || (resuming && !resume.from_systemd)) {
		lockfs_daemonize_leave_cwd();
		if (lockfs_errlog_detach(be->state_dirfd) == 0)
			fprintf(stderr, "lockfs: notice: serving %s (backing dir %s)\n",
				opts.mountpoint, be->source);
	}
	/* In the store's one-daemon lock file before `lockfs` returns
	 * (lockfs_daemonize_done below): the pid is the child's. */
	lockfs_backend_record_pid(be);
	/* Threads start after the fork that detaching makes: the engine's
	 * and the store's (its change reports start with the engine's). */
	if (lockfs_core_start(fs.core) < 0 || lockfs_stop_start() < 0 ||
	    lockfs_events_file_start(&fs) < 0) {
		int err = errno ? errno : EIO;

		fprintf(stderr, "lockfs: cannot start threads: %s\n", strerror(err));
		lockfs_daemonize_done(err);
		start_failed = true;
		goto out_unmount;
	}

	lockfs_notify_ready(opts.mountpoint, be->source);
	lockfs_daemonize_done(0);
	/* A successor rebuilds its tables and has the kernel resend what
	 * its predecessor read but did not answer, before it reads. */
	if (keep_conn)
		lockfs_keeper_serving(&fs, resuming ? &resume : NULL);
	else
		signal(SIGUSR2, SIG_IGN); /* nobody to hand over to */
	/* The engine hands no lock to a waiter until every resent request is
	 * back (each waiter then takes its old place): the loop tells it. */
	if (resuming)
		lockfs_loop_on_resent_done(resent_done, fs.core);
	if (opts.singlethread) {
		rc = fuse_session_loop(fs.se);
	} else if (!opts.clone_fd && opts.max_idle_threads > 100000) {
		/* Ours: one hot reader (fs/loop.c).  libfuse's for the
		 * options only it has. */
		rc = lockfs_loop_run(fs.se, opts.max_threads <= 100000 ? opts.max_threads : 0);
	} else {
		loop_cfg = fuse_loop_cfg_create();
		if (!loop_cfg) {
			rc = -ENOMEM;
		} else {
			fuse_loop_cfg_set_clone_fd(loop_cfg, opts.clone_fd);
			/* libfuse 3.14 leaves these at UINT_MAX when not given,
			 * then complains about its own default: pass only
			 * values the user set. */
			if (opts.max_idle_threads <= 100000)
				fuse_loop_cfg_set_idle_threads(loop_cfg, opts.max_idle_threads);
			if (opts.max_threads <= 100000)
				fuse_loop_cfg_set_max_threads(loop_cfg, opts.max_threads);
			rc = fuse_session_loop_mt(fs.se, loop_cfg);
			fuse_loop_cfg_destroy(loop_cfg);
		}
	}
	/* `lockfs --upgrade`: nothing is answered, released or unmounted;
	 * the next process takes the connection over (keeper.c). */
	if (keep_conn && lockfs_stop_handover())
		lockfs_keeper_hand_over();
	/* A signal or an unmount both end the loop; either is a clean exit. */
	ret = rc < 0 && rc != -EINTR ? 1 : 0;
	lockfs_notify_stopping();
out_unmount:
	lockfs_stop_loop_ended();
	/* A clean stop: the keeper leaves with us. */
	if (keep_conn)
		lockfs_keeper_stopped(be->state_dirfd);
	/* No thread of ours ever waits in the kernel on this mount (we send
	 * no notifications: ops.c), so none of these steps can hang, and the
	 * unmount or our exit ends every request still waiting. */
	lockfs_core_stop(fs.core);
	/* Nothing grants any more: tell the waiters the service is gone. */
	lockfs_flock_shutdown(&fs);
	lockfs_events_file_shutdown(&fs); /* and the readers of M/.events */
	fuse_session_unmount(fs.se);
	if (resuming) /* libfuse knows no mount point of a taken-over session */
		lockfs_resume_unmount(mnt_abs);
	if (served && start_failed)
		lockfs_lifecycle_failed(cfg.log, mnt_abs ? mnt_abs : opts.mountpoint, "start-failed");
	else if (served)
		lockfs_lifecycle_stopped(cfg.log, mnt_abs ? mnt_abs : opts.mountpoint,
					 lockfs_stop_signal());
out_signals:
	fuse_remove_signal_handlers(fs.se);
out_session:
	fuse_session_destroy(fs.se);
	lockfs_handles_free_all(&fs);
out_inodes:
	lockfs_log_signals_set(NULL);
	free(fsname);
	lockfs_inodes_free(fs.inodes);
	lockfs_core_close(fs.core);
out_args:
	free(mnt_abs);
	free(opts.mountpoint);
	free(o.backend);
	store_options_free(&o.store);
	free(o.helpers);
	free(o.lease);
	free(o.break_signal);
	free(o.container_root);
	free(o.metrics_names);
	free(o.positional[0]);
	free(o.positional[1]);
	free(o.descendants);
	free(o.max_open_per_uid);
	free(o.max_locks_per_uid);
	free(o.max_waiters_per_uid);
	free(o.max_locks);
	free(o.log_max);
	free(o.log_keep);
	free(o.log_denied_interval);
	free(o.keeper);
	fuse_opt_free_args(&args);
	return ret;
}
