/*
 * An in-memory store behind lockfs/backend.h, for unit tests of the engine
 * and for the conformance suite (test_backend.c fake), which it passes:
 * indivisible acquire, a real line of places (FIFO by rank), fences from
 * one counter, identities that change with every write, changes reported
 * from a thread of its own.  Knobs let a test inject what a real store
 * does to the engine: failures, foreign locks, locks of other hosts,
 * session trouble, change events.
 *
 * The store (locks, places, fence counter) outlives a backend opened on
 * it, so "close and reopen" keeps the fences; a reopen drops the places
 * of the closed backend (they were its session's).
 */
#ifndef LOCKFS_TEST_FAKE_BACKEND_H
#define LOCKFS_TEST_FAKE_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "lockfs/backend.h"

struct fake_store;

/* Ops a failure can be injected into. */
enum fake_op {
	FAKE_OP_ACQUIRE, FAKE_OP_CLAIM, FAKE_OP_LEAVE, FAKE_OP_HANDOFF, FAKE_OP_UPDATE,
	FAKE_OP_RELEASE, FAKE_OP_ADOPT, FAKE_OP_READ, FAKE_OP_STAT, FAKE_OP_LIST,
	FAKE_OP_CHECK,
	FAKE_OP_COUNT,
	FAKE_OP_ALL_WRITES = FAKE_OP_COUNT, /* acquire .. adopt at once */
};

/* A new, empty store (NULL: no memory), and freeing it (after close). */
struct fake_store *fake_store_new(void);
void fake_store_free(struct fake_store *fs);

/* A backend on FS: host "fake-host", caps 0, state_dirfd -1.  0 or -ENOMEM. */
int fake_backend_open(struct fake_store *fs, struct lockfs_backend **out);

/* The next COUNT calls of OP (-1: every call, 0: stop failing) return
 * -ERR without changing anything. */
void fake_backend_fail(struct lockfs_backend *be, enum fake_op op, int err, int count);

/* A lock on NAME made outside lockfs (record NULL, fence 0) at MTIME_MS
 * (wall clock).  foreign_stale says 1 once it is 1 s old.  0; -EEXIST. */
int fake_backend_foreign(struct lockfs_backend *be, const char *name, int64_t mtime_ms);

/* A lock on NAME held by HOST (another daemon) with RECORD (JSON; may be
 * NULL); session(HOST) is LIVE from now on.  0; -EEXIST; -ENOMEM. */
int fake_backend_other_host(struct lockfs_backend *be, const char *name, const char *host,
			    const char *record);

/* Remove NAME's lock as another program would (reported as a change).
 * 0; -ENOENT. */
int fake_backend_remove(struct lockfs_backend *be, const char *name);

/* This daemon's session enters STATE (reported as CHANGE_SESSION).  While
 * it is not LIVE, ops that grant return -EIO; while LOST, every change of
 * a lock or place of this backend returns -ESTALE. */
void fake_backend_session(struct lockfs_backend *be, enum lockfs_session_state state);

/* After a LOST session, a new one, as etcd's after its revoke: the old
 * session's locks and places are gone, the new one is LIVE with a new
 * id (reported as CHANGE_SESSION). */
void fake_backend_new_session(struct lockfs_backend *be);

/* read and stat answer "unconfirmed" (the store cannot be reached; the
 * answer is the last state it confirmed) while UNCONFIRMED. */
void fake_backend_unconfirmed(struct lockfs_backend *be, bool unconfirmed);

/* read and stat name store fields the engine does not know while FIELDS:
 * "shelf" (the key "fake/IDENTITY"), "lease" (0x2a in hex; "fake_lease"
 * when the record has a lease of its own) and "spot" (7). */
void fake_backend_fields(struct lockfs_backend *be, bool fields);

/* NAME in lock-delay until UNTIL_MS (wall clock), as etcd's after a
 * holder's session expired: held by nobody, no record, TRY gets -EEXIST.
 * 0; -EEXIST; -ENOMEM. */
int fake_backend_delay(struct lockfs_backend *be, const char *name, int64_t until_ms);

/* Report a change through start()'s callback, as the store's watch would
 * (from the fake's own thread, after the ones queued before it). */
void fake_backend_change(struct lockfs_backend *be, enum lockfs_change what, const char *name);

#endif
