/* Slots (slots.c): what engine.c calls to make and end the slots' state.
 * The requests' entry points are in include/lockfs/core.h. */
#ifndef LOCKFS_CORE_SLOTS_H
#define LOCKFS_CORE_SLOTS_H

struct lockfs_core;

/* 0, -ENOMEM. */
int lockfs_core_slots_new(struct lockfs_core *core);
/* The store reports NAME changed (lockfs_table.changed): a slot's lock
 * wakes the waker, which tries the waiters at once.  Any thread, no mutex
 * held. */
struct lockfs_table;
void lockfs_core_slots_changed(struct lockfs_table *t, const char *name);
/* Stop the waker thread (idempotent). */
void lockfs_core_slots_stop(struct lockfs_core *core);
/* Stop, then free every waiter and grant record (none is answered: the
 * mount answers its parked requests itself at shutdown). */
void lockfs_core_slots_free(struct lockfs_core *core);

#endif
