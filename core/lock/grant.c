/*
 * A grant to a waiter, the parts that do not touch the queue (grant.h):
 * the new fd holder's record, its `acquired` line, and taking back a grant
 * the log refused.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "base/clock.h"
#include "events.h"
#include "metrics.h"
#include "caller.h"
#include "fdlock.h"
#include "grant.h"
#include "queue.h"
#include "store.h"
#include "table.h"

/* The record of a new fd holder E of NAME (a copy of E's cmdline goes
 * into it: a store may ask for the record again, at the claim, and a
 * hand-off should do no /proc read). */
int lockfs_grant_fd_record(struct lockfs_table *t, const char *name, struct qentry *e,
			   struct lockfs_record *rec)
{
	char **cmdline = e->cmdline ? lockfs_argv_dup(e->cmdline) : NULL;
	int rc = lockfs_caller_record(t, name, &e->who, NULL, rec, &cmdline);

	lockfs_argv_free(cmdline);  /* (taken unless the record failed) */

	if (rc < 0)
		return rc;
	/* A slug names the holder in the log (issue 2's WHO) and in owner;
	 * the lock stays bound to the descriptor, with no lease. */
	if (e->slug && !(rec->slug = strdup(e->slug))) {
		lockfs_record_clear(rec);
		return -ENOMEM;
	}
	rec->bound = LOCKFS_BOUND_FD;
	rec->mode = e->mode;
	snprintf(rec->fd_owner, sizeof(rec->fd_owner), "%s", e->owner);
	rec->via_file = e->via_file;
	rec->ticket = e->ticket;
	return 0;
}

/* The `acquired` line of NAME's grant to H, now or not at all: 0, or the
 * -errno of the failed write (the caller takes the grant back). */
int lockfs_grant_log(struct lockfs_table *t, const char *name, const struct lockfs_holder *h,
		     const char *slug, uint64_t fence, enum lockfs_mode mode,
		     const struct qentry *e)
{
	char who[WHO_MAX], f[24], uid[16], pid[16];
	int rc;
	const char *kv[13] = { "fence", f, "uid", uid, "pid", pid, "bound", "fd",
			       "mode", mode == LOCKFS_SHARED ? "shared" : "exclusive" };

	lockfs_audit_put_container(kv, 10, h->container);
	lockfs_audit_who(who, sizeof(who), slug, h->comm, h->pid);
	snprintf(f, sizeof(f), "%" PRIu64, fence);
	lockfs_audit_ids(uid, pid, h->uid, h->pid);
	rc = lockfs_audit_acquired(t, who, name, kv);
	if (rc == 0 && e && e->w && e->w->parked) {
		int64_t waited = lockfs_wall_ms() - e->since_ms;
		char ms[24];

		snprintf(ms, sizeof(ms), "%lld", (long long)(waited > 0 ? waited : 0));
		kv[10] = "waited_ms";
		kv[11] = ms;
		kv[12] = NULL; /* container= is in the `acquired` event already */
		lockfs_metrics_granted(t->metrics, waited);
		lockfs_events_note(t->events, who, name, kv, "granted");
	}
	return rc;
}

void lockfs_grant_waiting(struct lockfs_table *t, const char *name, const struct qentry *e)
{
	char who[WHO_MAX], uid[16], pid[16];
	const char *kv[7] = { "uid", uid, "pid", pid, "mode",
			      e->mode == LOCKFS_SHARED ? "shared" : "exclusive", NULL };

	lockfs_metrics_waiting(t->metrics);
	if (!lockfs_events_watched(t->events))
		return;
	lockfs_audit_who(who, sizeof(who), e->slug, e->who.comm, e->who.pid);
	lockfs_audit_ids(uid, pid, e->uid, e->who.pid);
	lockfs_events_note(t->events, who, name, kv, "waiting");
}

/*
 * Take back NAME's grant FENCE to OWNER, just stored (identity IDENTITY,
 * record REC) but refused by the log: the store lets it go, or, if it
 * cannot, the grant is cached and retried like a release the store
 * refused (struct unlock_retry) -- held by nobody meanwhile, never by the
 * owner, who is told it failed.  With s->mu held; clears REC.
 */
void lockfs_grant_undo_locked(struct lockfs_table *t, struct stripe *s, const char *name,
			      uint64_t identity, struct lockfs_record *rec, const char *owner,
			      uint64_t fence)
{
	int rc = lockfs_store_release(t->be, name, identity);

	if (rc < 0 && rc != -ENOENT) {
		lockfs_table_put_new(t, s, name, identity, rec, -1);
		lockfs_fdlock_retry_add(t, s, name, owner, fence, rc, false, 0);
	}
	lockfs_record_clear(rec);
}
