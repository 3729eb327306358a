/*
 * The slots' state (slots.c), shared with their views (slots_view.c):
 * the waiters, the fd grants, and what both read of a slotted name.
 * Nothing outside those two files includes it.
 */
#ifndef LOCKFS_CORE_SLOTS_STATE_H
#define LOCKFS_CORE_SLOTS_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "lockfs/core.h"
#include "lockfs/limits.h"

/* A flock waiter for one of CAP slots of BASE, parked in arrival order. */
struct slot_waiter {
	struct slot_waiter *next;
	struct lockfs_wait *w;
	struct lockfs_caller caller;
	/* Its holder-to-be, read when it parked: a grant reads no /proc. */
	struct lockfs_fd_asker *asker;
	char owner[LOCKFS_FD_OWNER_MAX];
	uint64_t via_file;
	unsigned cap;
	char base[LOCKFS_NAME_MAX + 1];
	/* On a store with a line: its request for ".slotline:BASE", parked
	 * in that lock's queue until LINE.done sets AT_HEAD (1: the line
	 * lock is its own, so it is next for a slot; -errno: the line
	 * failed it).  Atomic: DONE runs under an engine mutex, never mu. */
	struct lockfs_wait line;
	bool in_line;
	int at_head;
	pthread_cond_t *wake;    /* the waker's: DONE signals it */
};

/* An fd grant: OWNER holds slot K of BASE (CAP slots). */
struct slot_grant {
	struct slot_grant *next;
	char owner[LOCKFS_FD_OWNER_MAX];
	uint64_t via_file;
	unsigned k, cap;
	char base[LOCKFS_NAME_MAX + 1];
};

struct lockfs_slots {
	pthread_mutex_t mu;
	pthread_cond_t cv;             /* the waker: a waiter came, or stop */
	struct slot_waiter *waiters;   /* arrival order; protected by mu */
	struct slot_grant *grants;     /* protected by mu */
	pthread_t waker;
	bool waker_on, stop;           /* protected by mu */
	bool kicked;                   /* atomic: a slot's lock changed since
					  the waker last looked */
};

/* The slots of BASE held now: HELD[K] set for each, CAP the count they
 * were taken with (0: none held), N how many.  0, -errno, or -ERANGE when
 * they disagree (two first takers on two etcd hosts at one moment, or a
 * store edited by hand: CAP is then the largest). */
struct held_slots {
	unsigned cap, n;
	unsigned char held[LOCKFS_SLOTS_MAX];
};

/* Does this store serve slots (LOCKFS_BE_SLOTS)? */
bool lockfs_slots_served(struct lockfs_core *core);
/* Do the waiters stand in one line across daemons (".slotline:NAME")?  A
 * store of several daemons (etcd); with dir this daemon's list is all. */
bool lockfs_slots_across_hosts(struct lockfs_core *core);
/* NAME as a caller gives it ("NAME" or "NAME=N") into BASE; *CAP 0 when
 * no N was given.  0, -EINVAL, -ENAMETOOLONG. */
int lockfs_slots_base_of(const char *name, char base[LOCKFS_NAME_MAX + 1], unsigned *cap);
/* BASE's slots held now, read from the store at this moment, into *H. */
int lockfs_slots_held(struct lockfs_core *core, const char *base, struct held_slots *h);

#endif
