/* Slots (slots.c): what engine.c calls to make and end the slots' state.
 * The requests' entry points are in include/lockfs/core.h. */
#ifndef LOCKFS_CORE_SLOTS_H
#define LOCKFS_CORE_SLOTS_H

struct lockfs_core;

/* 0, -ENOMEM. */
int lockfs_core_slots_new(struct lockfs_core *core);
/* Stop the waker thread (idempotent). */
void lockfs_core_slots_stop(struct lockfs_core *core);
/* Stop, then free every waiter and grant record (none is answered: the
 * mount answers its parked requests itself at shutdown). */
void lockfs_core_slots_free(struct lockfs_core *core);

#endif
