/*
 * The engine's counters and histograms, and M/.metrics' text (metrics.c):
 * Prometheus' text exposition format, version 0.0.4.  The counters are
 * relaxed atomic adds (the uncontended mkdir+rmdir pays two); the gauges
 * (locks held, waiters) are counted from the table when the text is
 * rendered.  Nothing secret: counts, times and the lock names an
 * administrator listed with -o metrics_names, no holder, uid or pid.
 */
#ifndef LOCKFS_LOCK_METRICS_H
#define LOCKFS_LOCK_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

struct lockfs_metrics;

/* New counters, with the per-name series for NAMES (':'-separated lock
 * names; NULL or "": none).  0, -ENOMEM, or -EINVAL (a name that is no
 * lock name). */
int lockfs_metrics_new(struct lockfs_metrics **out, const char *names);
void lockfs_metrics_free(struct lockfs_metrics *m);

/* Count audit event EVENT (its line's details KV): acquisitions, ends,
 * recoveries by evidence.  SINCE_MS (wall clock; 0: unknown) is when the
 * grant an end ends was made: the hold-time histogram. */
void lockfs_metrics_event(struct lockfs_metrics *m, const char *const *kv, const char *event,
			  int64_t since_ms);
/* A request parked to wait for a lock (contention). */
void lockfs_metrics_waiting(struct lockfs_metrics *m);
/* A mkdir refused EEXIST by the daemon, or a LOCK_NB / F_SETLK refused,
 * because the lock is held (contention).  A mkdir of a name the kernel
 * already knows to exist is refused by the kernel and never comes here. */
void lockfs_metrics_busy(struct lockfs_metrics *m);
/* A waiter granted after waiting WAITED_MS. */
void lockfs_metrics_granted(struct lockfs_metrics *m, int64_t waited_ms);

/* M/.metrics' text for table T, in *TEXT (malloc'd, *LEN bytes).  Takes
 * each stripe mutex in turn: call with none held.  0 or -ENOMEM. */
int lockfs_metrics_render(struct lockfs_table *t, char **text, size_t *len);

#endif
