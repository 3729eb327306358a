/*
 * The engine's audit lines (audit.c): who a line names, and writing
 * `acquired`, `released`, `recovered`, `denied`, `refused` ... through
 * base/log.c.  Takes no stripe mutex; callers may hold one.
 */
#ifndef LOCKFS_LOCK_AUDIT_H
#define LOCKFS_LOCK_AUDIT_H

#include <stdint.h>
#include <sys/types.h>

#include "table.h"

/* The line that ends holder I of a record (queue.c fills it): WHO, then
 * fence=, uid=, pid= and the let-go's extras. */
struct end_line {
	char who[WHO_MAX], fence[24], uid[16], pid[16];
	const char *kv[28]; /* fence=, uid=, pid=, container=, up to 11 extras, NULL */
	int64_t since_ms;   /* the grant's time (wall clock; 0: unknown): the hold time */
};

/* "comm[pid]", or the slug when there is one, into BUF. */
void lockfs_audit_who(char *buf, size_t size, const char *slug, const char *comm, pid_t pid);
/* Decimal UID and PID into the buffers, for a line's uid= and pid= (PID
 * 0: "", logged as "-"). */
void lockfs_audit_ids(char uid[16], char pid[16], uid_t u, pid_t p);
/* Put `container=CONTAINER` at KV[N] when CONTAINER (NULL, "": none) names
 * one, then the closing NULL: KV has room for N + 3.  Returns where the
 * NULL went: lines name the container of the process they are about. */
size_t lockfs_audit_put_container(const char **kv, size_t n, const char *container);
/* Log EVENT: written now, or kept until the log takes writes again (and
 * sent to syslog meanwhile).  Never fails the request: for what happens
 * whether or not it can be logged (releases, recoveries, refusals). */
void lockfs_audit_event(struct lockfs_table *t, const char *who, const char *name,
			const char *const *kv, const char *event);
/* Log EVENT, the end of a grant made at SINCE_MS (wall clock; 0: not
 * known), as lockfs_audit_event does: the hold time goes to the metrics. */
void lockfs_audit_end(struct lockfs_table *t, const char *who, const char *name,
		      const char *const *kv, const char *event, int64_t since_ms);
/* Log a grant's `acquired` line now or not at all.  Returns 0, or the
 * -errno of the failed write (-ENOSPC, -EDQUOT, -EFBIG, -ENOMEM, or -EIO
 * for any other): then the grant must be undone. */
int lockfs_audit_acquired(struct lockfs_table *t, const char *who, const char *name,
			  const char *const *kv);
/* A refused request by the caller of uid UID (from the kernel), PID the
 * process WHO names, in CONTAINER (NULL, "": the daemon's own);
 * rate-limited per uid (lockfs_log_denied_in). */
void lockfs_audit_refusal(struct lockfs_table *t, uid_t uid, pid_t pid, const char *container,
			  const char *who, const char *name, const char *reason);
/* Log the `refused` line of burst B (a lockfs_quota_flush callback; ARG
 * is the table). */
void lockfs_audit_refused(void *arg, const struct quota_burst *b);

#endif
