/*
 * The engine's audit lines (audit.h), written through base/log.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "audit.h"
#include "events.h"
#include "metrics.h"
#include "table.h"

void lockfs_audit_who(char *buf, size_t size, const char *slug, const char *comm, pid_t pid)
{
	if (slug && *slug)
		snprintf(buf, size, "%s", slug);
	else
		snprintf(buf, size, "%s[%d]", comm && *comm ? comm : "?", (int)pid);
}

void lockfs_audit_ids(char uid[16], char pid[16], uid_t u, pid_t p)
{
	snprintf(uid, 16, "%u", (unsigned)u);
	if (p > 0)
		snprintf(pid, 16, "%d", (int)p);
	else
		pid[0] = '\0'; /* logged as "-": not known */
}

size_t lockfs_audit_put_container(const char **kv, size_t n, const char *container)
{
	if (container && *container) {
		kv[n++] = "container";
		kv[n++] = container;
	}
	kv[n] = NULL;
	return n;
}

/* Every line of a lock's life is also counted (metrics.c) and, while
 * someone reads M/.events, an event (events.c). */
static void observed(struct lockfs_table *t, const char *who, const char *name,
		     const char *const *kv, const char *event, int64_t since_ms)
{
	lockfs_metrics_event(t->metrics, kv, event, since_ms);
	lockfs_events_note(t->events, who, name, kv, event);
}

void lockfs_audit_end(struct lockfs_table *t, const char *who, const char *name,
		      const char *const *kv, const char *event, int64_t since_ms)
{
	/* A line that cannot be written now is kept and goes out later
	 * (core/base/log.c says so on stderr once): the event happens anyway. */
	(void)lockfs_log_event_or_keep(t->log, who, name, kv, event);
	observed(t, who, name, kv, event, since_ms);
}

void lockfs_audit_event(struct lockfs_table *t, const char *who, const char *name,
			const char *const *kv, const char *event)
{
	lockfs_audit_end(t, who, name, kv, event, 0);
}

int lockfs_audit_acquired(struct lockfs_table *t, const char *who, const char *name,
			  const char *const *kv)
{
	int rc = lockfs_log_event(t->log, who, name, kv, "acquired");

	if (rc == 0)
		observed(t, who, name, kv, "acquired", 0);

	/* The caller is told why it got no lock: a full log (ENOSPC, EDQUOT,
	 * EFBIG) as such; anything else the write met in DIR as EIO, so that
	 * no errno of DIR reads as an answer about the lock (an EPERM as "not
	 * yours": see backend.h). */
	if (rc < 0 && rc != -ENOSPC && rc != -EDQUOT && rc != -EFBIG && rc != -ENOMEM)
		rc = -EIO;
	return rc;
}

void lockfs_audit_refusal(struct lockfs_table *t, uid_t uid, pid_t pid, const char *container,
			  const char *who, const char *name, const char *reason)
{
	lockfs_log_denied_in(t->log, uid, pid, container, who, name, reason);
}

void lockfs_audit_refused(void *arg, const struct quota_burst *b)
{
	struct lockfs_table *t = arg;
	char uid[16], pid[16], limit[16], count[24];
	const char *kv[] = { "uid", uid, "pid", pid, "reason", lockfs_quota_reason_name(b->reason),
			     "count", count, "limit", limit, NULL };

	/* uid= is the kernel's word for the refused caller; pid= the
	 * process of the burst's first refusal. */
	lockfs_audit_ids(uid, pid, b->uid, b->pid);
	snprintf(count, sizeof(count), "%" PRIu64, b->count);
	snprintf(limit, sizeof(limit), "%u", (unsigned)b->limit);
	if (b->limit == QUOTA_NONE)
		kv[8] = NULL; /* the fd reserve has no cap of its own */
	/* Kept and written later when the log cannot take it now: the
	 * refusals happened, whatever the disk says. */
	lockfs_audit_event(t, b->who[0] ? b->who : "?", b->name, kv, "refused");
}
