/*
 * The state of the descendants module, shared by its two halves: the
 * tracking (descendants.c: events, the interface) and the /proc scan
 * (descendants_scan.c); the entries, roots and rootsets are kept by
 * descendants_state.c, below both.  All of it is protected by d->mu, held
 * by every function below.  Internal to core/proc.
 */
#ifndef LOCKFS_PROC_DESCENDANTS_STATE_H
#define LOCKFS_PROC_DESCENDANTS_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/descendants.h"

#define ROOT_BUCKETS 256

struct root {
	struct root *next;        /* bucket chain while listed */
	pid_t pid;
	unsigned long long start;
	pid_t sid;                /* the holder's session: where a scan looks */
	uint64_t since_ns;        /* watched since (CLOCK_MONOTONIC): earlier forks are not its */
	unsigned refs;            /* locks that depend on it */
	unsigned holds;           /* rootsets that name it */
	size_t live;              /* live processes counted for it */
	uint64_t version;         /* changes whenever the set does */
	bool dead;                /* its holder exited */
	bool listed;
	bool has_entry;           /* an entry's `root` points here */
	bool scan_pending;        /* count what a scan finds (daemon start) */
};

/* The roots a process counts for, shared by siblings (never changed once
 * made).  A "candidate" was only found by a scan in the holder's session:
 * it keeps the lock, but it is no proof of descent, so it may not act for
 * the holder. */
struct rootset {
	unsigned refs;
	unsigned n;
	struct member {
		struct root *root;
		bool candidate;
	} v[];
};

struct entry {
	struct entry *next;       /* bucket chain */
	pid_t pid;
	unsigned long long start; /* 0 until known */
	struct rootset *set;      /* the roots it counts for; NULL: none */
	struct root *root;        /* the listed root this process holds for, or NULL */
	struct rootset *kids;     /* cache: what its children count for */
	bool suspect;             /* its leader exited; other threads may live on */
};

struct lockfs_descendants {
	pthread_mutex_t mu;
	struct lockfs_event_source events;
	bool has_events;
	struct lockfs_desc_procs procs;
	struct root *roots[ROOT_BUCKETS];
	struct entry **entries;
	size_t nbuckets, nentries;
	size_t nsuspects;
	size_t ndead;             /* listed roots whose holder exited */
	bool scan_pending;        /* some root has scan_pending */
	bool lost;                /* events were lost: scan before answering */
	/* lockfs_descendants_observe's: set before use, then read-only */
	void (*observer)(void *ctx, const struct lockfs_proc_event *ev);
	void *observer_ctx;
	int64_t next_check_ms;
	pid_t self;               /* our own pid, during a scan: never counted */
};

static inline bool lockfs_desc_proc_alive(const struct lockfs_desc_proc *p)
{
	/* A zombie leader with live threads is a live process. */
	return !p->zombie || p->threads > 1;
}

/* Has a process now in session SID left R's holder's session?  Only
 * when both are known (/proc shows 0 for a session led from outside our
 * pid namespace): an unknown session keeps counting. */
static inline bool lockfs_desc_left_session(const struct root *r, pid_t sid)
{
	return r->sid > 0 && sid > 0 && sid != r->sid;
}

/* Most roots one process counts for: nested locks, each held by a
 * descendant of the last.  More are not counted (a scan finds them). */
#define SET_MAX 64

/* descendants_state.c: the entries, roots and rootsets, and their changes. */

/* Free R once nothing names it (unlisted, no entry, no rootset). */
void lockfs_desc_root_put(struct root *r);
/* Drop a reference to S (NULL: nothing), freeing it with the last. */
void lockfs_desc_set_put(struct rootset *s);
/* A new set of the N members in V (no root twice), one reference.  NULL
 * when out of memory. */
struct rootset *lockfs_desc_set_new(const struct member *v, unsigned n);
/* E's set changed: forget the cached set of its children. */
void lockfs_desc_entry_set_changed(struct entry *e);
/* Unlist R once nothing needs to find it: no lock depends on it, and its
 * holder lives or none of its descendants does. */
void lockfs_desc_root_maybe_unlist(struct lockfs_descendants *d, struct root *r);
/* R's holder exited. */
void lockfs_desc_root_mark_dead(struct lockfs_descendants *d, struct root *r);
/* The entry of PID, or NULL. */
struct entry *lockfs_desc_entry_find(struct lockfs_descendants *d, pid_t pid);
/* A new entry for (PID, START) (START 0: not known yet), or NULL (no memory). */
struct entry *lockfs_desc_entry_add(struct lockfs_descendants *d, pid_t pid,
				    unsigned long long start);
/* R's member in S, or NULL. */
const struct member *lockfs_desc_set_find(const struct rootset *s, const struct root *r);
/* Make E count for R too (CANDIDATE: found only by a scan of the session).
 * 0 or -ENOMEM. */
int lockfs_desc_entry_join(struct entry *e, struct root *r, bool candidate);
/* Forget E: it exited, or counts for nothing any more. */
void lockfs_desc_entry_drop(struct lockfs_descendants *d, struct entry *e);
/* E now runs in session SID: it stops counting for the roots whose
 * holder's session it left. */
void lockfs_desc_entry_leave_session(struct lockfs_descendants *d, struct entry *e,
				     pid_t sid);

/*
 * Look at /proc: forget tracked processes that are gone or left their
 * holder's session, learn missing start times, and count for each listed
 * root that ONLY names (NULL: those with scan_pending, or every dead one
 * when DEAD) what descends from it.  0, or -errno when /proc cannot be
 * listed (nothing is forgotten then).  descendants_scan.c.
 */
int lockfs_desc_scan(struct lockfs_descendants *d, struct root *only, bool dead);

#endif
