/*
 * What the mount shows of the engine's life as it happens: M/.events'
 * lines (lock/events.c) and M/.metrics' text (lock/metrics.c).  Both are
 * fed by the audit lines (lock/audit.c), so an event is an event of the
 * log, in the log's order.
 */
#include <errno.h>

#include "engine.h"
#include "lock/events.h"
#include "lock/follow.h"
#include "lock/metrics.h"
#include "lock/table.h"

uint64_t lockfs_core_events_attach(struct lockfs_core *core)
{
	return lockfs_events_attach(core->table.events);
}

void lockfs_core_events_detach(struct lockfs_core *core)
{
	lockfs_events_detach(core->table.events);
}

ssize_t lockfs_core_events_take(struct lockfs_core *core, uint64_t *cursor, char *buf, size_t size,
				lockfs_core_event_want_fn want, void *arg)
{
	return lockfs_events_take(core->table.events, cursor, buf, size, want, arg);
}

uint64_t lockfs_core_events_wait(struct lockfs_core *core, uint64_t seen)
{
	return lockfs_events_wait(core->table.events, seen);
}

int lockfs_core_events_follow(struct lockfs_core *core, const char *old, const char *new_)
{
	return lockfs_follow_change(core->table.follow, old, new_);
}

void lockfs_core_events_shut(struct lockfs_core *core)
{
	lockfs_events_shut(core->table.events);
}

bool lockfs_core_events_shut_down(struct lockfs_core *core)
{
	return lockfs_events_is_shut(core->table.events);
}

int lockfs_core_metrics(struct lockfs_core *core, char **text, size_t *len)
{
	return lockfs_metrics_render(&core->table, text, len);
}
