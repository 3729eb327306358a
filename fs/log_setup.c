/*
 * The audit log at start-up: its options, opening DIR/lock.log with a
 * clear word when it cannot be used, and the signals that concern it
 * (SIGHUP reopens it for logrotate).  The log itself is core/base/log.c's.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"

int lockfs_log_limits_parse(const char *max, const char *keep, const char *interval,
			    struct lockfs_log_limits *lim)
{
	char *end;
	unsigned long v;

	lim->max_bytes = LOCKFS_LOG_MAX_DEFAULT;
	lim->keep = LOCKFS_LOG_KEEP_DEFAULT;
	lim->denied_interval_s = LOCKFS_LOG_DENIED_INTERVAL_DEFAULT;
	if (max && (lockfs_log_parse_size(max, &lim->max_bytes) < 0 ||
		    (lim->max_bytes && lim->max_bytes < LOCKFS_LOG_MAX_MIN))) {
		fprintf(stderr, "lockfs: -o log_max=%s: want a size of at least 16K (e.g. 4M), "
			"or 0 for no limit\n", max);
		return -1;
	}
	if (keep) {
		errno = 0;
		v = *keep >= '0' && *keep <= '9' ? strtoul(keep, &end, 10) : 0;
		if (errno || v < 1 || v > LOCKFS_LOG_KEEP_MAX || *end) {
			fprintf(stderr, "lockfs: -o log_keep=%s: want a whole number from 1 to %d\n",
				keep, LOCKFS_LOG_KEEP_MAX);
			return -1;
		}
		lim->keep = (unsigned)v;
	}
	if (interval) {
		errno = 0;
		v = *interval >= '0' && *interval <= '9' ? strtoul(interval, &end, 10) : ULONG_MAX;
		if (errno || v > 86400 || *end) {
			fprintf(stderr, "lockfs: -o log_denied_interval=%s: want whole seconds from 0 "
				"to 86400\n", interval);
			return -1;
		}
		lim->denied_interval_s = (unsigned)v;
	}
	return 0;
}

int lockfs_log_open_audit(int dirfd, const char *dir, const struct lockfs_log_limits *lim,
			  struct lockfs_log **out)
{
	int rc = lockfs_log_open(out, dirfd, "lock.log", lim);

	if (rc == -ELOOP)
		fprintf(stderr, "lockfs: %s/lock.log is a symbolic link; the audit log is written "
			"only to a file of its own: remove the link\n", dir);
	else if (rc == -EMLINK)
		fprintf(stderr, "lockfs: %s/lock.log has other hard links, so writing it would "
			"change another file too: remove it (keep a copy elsewhere if needed)\n", dir);
	else if (rc == -EINVAL)
		fprintf(stderr, "lockfs: %s/lock.log is not a regular file: remove it\n", dir);
	else if (rc < 0)
		fprintf(stderr, "lockfs: cannot open %s/lock.log: %s\n", dir, strerror(-rc));
	return rc;
}

/* The core whose log SIGHUP reopens (NULL: none). */
static struct lockfs_core *hup_core;

static void on_sighup(int sig)
{
	(void)sig;
	if (hup_core)
		lockfs_core_log_reopen(hup_core); /* async-signal-safe */
}

void lockfs_log_signals_set(struct lockfs_core *core)
{
	struct sigaction sa = { .sa_handler = core ? on_sighup : SIG_IGN, .sa_flags = SA_RESTART };

	hup_core = core;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGHUP, &sa, NULL);
	/* A log past RLIMIT_FSIZE refuses grants with EFBIG, like any
	 * failed log write: it must not kill the lock service. */
	signal(SIGXFSZ, SIG_IGN);
}
