/*
 * The event ring (events.c): what happened to locks, one JSON line per
 * event, kept in a bounded ring in memory for the readers of M/.events
 * (fs/events_file.c) and `lockctl watch`.  Nothing is formatted or kept
 * while nobody reads: lockfs_events_note costs one atomic load then.
 *
 * Lock order: any stripe mutex, then the ring's own mutex (a leaf: nothing
 * here calls anything that takes a mutex but the ring's).
 */
#ifndef LOCKFS_LOCK_EVENTS_H
#define LOCKFS_LOCK_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct lockfs_events;

/* Events kept for readers; a reader further behind is told how many it
 * lost (an `overrun` line). */
#define LOCKFS_EVENTS_RING 4096

/* A new empty ring: 0, or -ENOMEM. */
int lockfs_events_new(struct lockfs_events **out);
/* Free EV (NULL: nothing).  No reader may be attached. */
void lockfs_events_free(struct lockfs_events *ev);

/* One reader more: events are kept from now on.  Returns its cursor, the
 * sequence number of the next event. */
uint64_t lockfs_events_attach(struct lockfs_events *ev);
/* One reader less (every attach is matched by one detach). */
void lockfs_events_detach(struct lockfs_events *ev);

/* Does anyone read?  One atomic load: the uncontended path's only cost. */
bool lockfs_events_watched(struct lockfs_events *ev);

/*
 * Keep event EVENT of lock NAME ("" or NULL: not a lock's) by WHO, with
 * the audit line's details KV (key, value, ..., NULL; may be NULL), as a
 * JSON object on one line; nothing when nobody reads.  Values that are
 * decimal numbers become JSON numbers.  Never fails the caller: an event
 * that cannot be kept (no memory) is counted as lost for every reader.
 */
void lockfs_events_note(struct lockfs_events *ev, const char *who, const char *name,
			const char *const *kv, const char *event);

/* Does the reader want events of NAME?  ARG is lockfs_events_take's. */
typedef bool (*lockfs_events_want_fn)(void *arg, const char *name);

/*
 * Copy the events from *CURSOR on into BUF (SIZE bytes), whole lines only,
 * skipping those WANT (NULL: all) refuses; *CURSOR moves past what was
 * copied or skipped.  A reader that fell more than LOCKFS_EVENTS_RING
 * behind first gets `{"event":"overrun","lost":N}`.  Returns the bytes
 * copied: 0 when no event is there yet (or SIZE is too small for the
 * next line: then -EOVERFLOW).
 */
ssize_t lockfs_events_take(struct lockfs_events *ev, uint64_t *cursor, char *buf, size_t size,
			   lockfs_events_want_fn want, void *arg);

/* The sequence number the next event gets. */
uint64_t lockfs_events_head(struct lockfs_events *ev);
/*
 * Wait until the head passes SEEN (an event numbered SEEN is kept) or the
 * ring is shut (lockfs_events_shut).  Returns the head then.  No timeout:
 * the engine's timers read base/clock.c's clocks, and nothing here needs one.
 */
uint64_t lockfs_events_wait(struct lockfs_events *ev, uint64_t seen);
/* Wake every waiter, now and later: the daemon stops. */
void lockfs_events_shut(struct lockfs_events *ev);
/* Shut? */
bool lockfs_events_is_shut(struct lockfs_events *ev);

#endif
