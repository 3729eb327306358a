/*
 * Other hosts' locks as events (remote.h).  The engine caches what the
 * store shows of a name once it has looked at it; a change report of
 * another host's write makes it look again (changes.c).  Comparing the
 * cached holder before and after says what happened there: a new holder
 * elsewhere (or a new fence) was acquired, a holder elsewhere that is gone
 * was released (or broken or lost there: this host cannot tell which; that
 * host's own events say).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "audit.h"
#include "events.h"
#include "remote.h"

/* C's holder, if it is on another host, into SEEN. */
static bool holder_elsewhere(struct lockfs_table *t, const struct held_lock *c,
			     struct remote_seen *seen)
{
	const struct lockfs_holder *h;

	if (!c || !c->rec.has_holder || !lockfs_table_elsewhere(t, &c->rec.holder))
		return false;
	h = &c->rec.holder;
	seen->fence = c->rec.fence;
	lockfs_audit_who(seen->who, sizeof(seen->who), c->rec.slug, h->comm, h->pid);
	snprintf(seen->host, sizeof(seen->host), "%s", h->host);
	lockfs_audit_ids(seen->uid, seen->pid, h->uid, h->pid);
	return true;
}

void lockfs_remote_before(struct lockfs_table *t, struct stripe *s, const char *name,
			  struct remote_seen *seen)
{
	memset(seen, 0, sizeof(*seen));
	seen->watched = lockfs_events_watched(t->events);
	if (seen->watched)
		seen->had = holder_elsewhere(t, lockfs_table_find(s, name), seen);
}

static void note(struct lockfs_table *t, const char *name, const struct remote_seen *h,
		 const char *event)
{
	char fence[24];
	const char *kv[] = { "fence", fence, "uid", h->uid, "pid", h->pid, "host", h->host,
			     "remote", "1", NULL };

	snprintf(fence, sizeof(fence), "%" PRIu64, h->fence);
	lockfs_events_note(t->events, h->who, name, kv, event);
}

void lockfs_remote_after(struct lockfs_table *t, struct stripe *s, const char *name,
			 const struct remote_seen *seen)
{
	struct remote_seen now = { 0 };
	bool has;

	if (!seen->watched)
		return;
	has = holder_elsewhere(t, lockfs_table_find(s, name), &now);
	if (seen->had && (!has || now.fence != seen->fence))
		note(t, name, seen, "released");
	if (has && (!seen->had || now.fence != seen->fence))
		note(t, name, &now, "acquired");
}
