/*
 * Other hosts' locks as events (remote.h).  The engine caches what the
 * store shows of a name once it has looked at it; a change report of
 * another host's write makes it look again (changes.c), and so does any
 * request of a name.  The cache (table.c) calls here as an entry held
 * elsewhere comes in or gets a new fence (acquired there) and as one goes
 * or is replaced (released there -- or broken or lost there: this host
 * cannot tell which; that host's own events say).  Judged in the cache,
 * not around one path that loads it, so that a lookup or a waiter's grant
 * that looks first cannot swallow the event.
 */
#include <inttypes.h>
#include <stdio.h>

#include "audit.h"
#include "events.h"
#include "remote.h"

void lockfs_remote_note(struct lockfs_table *t, const struct held_lock *c, const char *event)
{
	const struct lockfs_holder *h = &c->rec.holder;
	char who[WHO_MAX], uid[16], pid[16], fence[24];
	const char *kv[] = { "fence", fence, "uid", uid, "pid", pid, "host", h->host,
			     "remote", "1", NULL };

	if (!lockfs_events_watched(t->events))
		return;
	snprintf(fence, sizeof(fence), "%" PRIu64, c->rec.fence);
	lockfs_audit_who(who, sizeof(who), c->rec.slug, h->comm, h->pid);
	lockfs_audit_ids(uid, pid, h->uid, h->pid);
	lockfs_events_note(t->events, who, c->name, kv, event);
}
