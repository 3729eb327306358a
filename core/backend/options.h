/*
 * What every store kind's open() does with its -o options (options.c):
 * say in one line why it refuses them; and the etcd kind's keys.  Not a public interface: the
 * grammar fs/main.c shares with the stores, lockfs_backend_parse_seconds,
 * is in lockfs/backend.h (fs/ may include no core/ header).
 */
#ifndef LOCKFS_BACKEND_OPTIONS_H
#define LOCKFS_BACKEND_OPTIONS_H

#include "lockfs/backend.h"

/* Write the one line (printf FMT, without "lockfs: ") that says why CFG
 * cannot be opened into CFG->why, when the caller gave room for it. */
void lockfs_backend_say(const struct lockfs_backend_config *cfg, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* The -o keys the etcd kind takes, NULL-terminated (the one list: etcd.c's
 * kind and registry.c's stand-in when etcd is not built both point here). */
extern const char *const lockfs_backend_etcd_option_keys[];

#endif
