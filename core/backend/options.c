/*
 * The -o options of a store (lockfs/backend.h "Opening a store by name"):
 * the one line a refusal leaves for fs/main.c to print, the grammar of a
 * number of seconds, which fs/main.c's own options share, and the etcd
 * kind's -o keys.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "lockfs/limits.h"
#include "options.h"

/* The etcd kind's keys, here rather than in etcd.c: without etcd support
 * they are still known by name (fs/main.c: "needs -o backend=etcd").  Not
 * in registry.c either, which lists etcd.c's kind: etcd.c's kind names
 * this list, so the list lies below both (no circle of files). */
const char *const lockfs_backend_etcd_option_keys[] = {
	"etcd", "prefix", "host", "ttl", "lock_delay", "etcd_cacert", "etcd_cert", "etcd_key",
	"backing", NULL,
};

void lockfs_backend_say(const struct lockfs_backend_config *cfg, const char *fmt, ...)
{
	va_list ap;

	if (!cfg->why || !cfg->why_size)
		return;
	va_start(ap, fmt);
	vsnprintf(cfg->why, cfg->why_size, fmt, ap);
	va_end(ap);
}

int lockfs_backend_parse_seconds(const char *text, int64_t min, int64_t *out)
{
	char *end;
	long long v;

	/* Digits only: strtoll would take a sign or blanks. */
	if (!text || *text < '0' || *text > '9')
		return -EINVAL;
	errno = 0;
	v = strtoll(text, &end, 10);
	if (errno || *end || v < min || v > (long long)LOCKFS_LEASE_MAX_S)
		return -EINVAL;
	*out = v;
	return 0;
}
