/*
 * The engine floor's own header: struct lockfs_core, which the files at
 * core/'s top level share.  engine.c makes, starts and closes it; the
 * others answer requests on it.  Private to that floor: include/lockfs/
 * core.h declares the struct opaque, and neither the floors below
 * (core/lock/, core/proc/ ...) nor fs/ include this file.
 */
#ifndef LOCKFS_CORE_ENGINE_H
#define LOCKFS_CORE_ENGINE_H

#include <stdbool.h>

#include "lockfs/core.h"
#include "lock/table.h"
#include "proc/fds.h"
#include "lockfs/procevents.h"

/* The engine: the table its floors share, and what only requests and
 * opening need. */
struct lockfs_core {
	struct lockfs_table table;
	struct lockfs_procevents *procevents; /* NULL: descendants found by scans */
	struct lockfs_fds fds;  /* descriptors kept for callers (fds.h); its own mutex */
	bool open_cap_given;    /* -o max_open_per_uid was set; read-only */
	/* The wait-for graph of parked fd-lock waits (lock/deadlock.h); its
	 * own mutexes. */
	struct lockfs_deadlock *deadlock;
	/* Slots' flock waiters and fd grants (slots.c); its own mutex. */
	struct lockfs_slots *slots;
};

/* Holder I of C (NAME's), OWNER's fd lock read with IDENTITY, lets go
 * (fdlocks.c; S's mutex held).  A grant is released, logged `released`;
 * OWNER's place that the store shows at the head of its line
 * (lockfs_table_place_only) is withdrawn with no line, and is 0 whatever
 * the store said.  A refused one is retried by the engine (asked at
 * ASKED_MS).  0 or -errno. */
int lockfs_core_fd_let_go_locked(struct lockfs_table *t, struct stripe *s, const char *name,
				 struct held_lock *c, uint64_t identity, size_t i, const char *owner,
				 int64_t asked_ms);

#endif
