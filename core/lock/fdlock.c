/*
 * fd-lock bookkeeping: the open file each POSIX lock owner's grant came
 * through (fdlock.h).  Owners are the engine's keys ("posix:HEX"), files
 * the mount's handles: no FUSE here.  All with the stripe mutex held.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "audit.h"
#include "fdlock.h"

void lockfs_fdlock_granted_via(struct stripe *s, const char *name, const char *owner, uint64_t file)
{
	struct fdlock_via *v;

	/* One entry per (name, owner): the file of its latest grant, so that
	 * a close of any other open file of NAME does not end it. */
	for (v = s->via_files; v; v = v->next) {
		if (strcmp(v->owner, owner) == 0 && strcmp(v->name, name) == 0) {
			v->file = file;
			return;
		}
	}
	v = calloc(1, sizeof(*v));
	if (!v || !(v->name = strdup(name))) {
		free(v);
		return;
	}
	snprintf(v->owner, sizeof(v->owner), "%s", owner);
	v->file = file;
	v->next = s->via_files;
	s->via_files = v;
}

struct fdlock_via *lockfs_fdlock_take_file(struct stripe *s, const char *name, uint64_t file)
{
	struct fdlock_via *taken = NULL;

	for (struct fdlock_via **pp = &s->via_files, *v; (v = *pp);) {
		if (v->file != file || strcmp(v->name, name) != 0) {
			pp = &v->next;
			continue;
		}
		*pp = v->next;
		v->next = taken;
		taken = v;
	}
	return taken;
}

void lockfs_fdlock_free(struct fdlock_via *v)
{
	while (v) {
		struct fdlock_via *next = v->next;

		free(v->name);
		free(v);
		v = next;
	}
}

void lockfs_fdlock_free_all(struct stripe *s)
{
	lockfs_fdlock_free(s->via_files);
	s->via_files = NULL;
}

bool lockfs_fdlock_holder_is(const struct lockfs_record *rec, size_t i, const char *owner,
			     uint64_t fence, const char *host)
{
	const char *its = lockfs_record_holder(rec, i)->host;

	return lockfs_record_bound_at(rec, i) == LOCKFS_BOUND_FD &&
	       (!its || !*its || strcmp(its, host) == 0) &&
	       strcmp(lockfs_record_fd_owner_at(rec, i), owner) == 0 &&
	       (fence == 0 || lockfs_record_fence_at(rec, i) == fence);
}

static struct unlock_retry *retry_find(struct stripe *s, const char *name, const char *owner,
				       uint64_t fence)
{
	for (struct unlock_retry *r = s->retries; r; r = r->next)
		if (strcmp(r->name, name) == 0 && strcmp(r->owner, owner) == 0 &&
		    r->fence == fence)
			return r;
	return NULL;
}

/* The retry pending for holder I of NAME's record REC, or NULL. */
static struct unlock_retry *retry_of(struct stripe *s, const char *name,
				     const struct lockfs_record *rec, size_t i)
{
	if (!s->retries || i >= lockfs_record_holders(rec) ||
	    lockfs_record_bound_at(rec, i) != LOCKFS_BOUND_FD)
		return NULL;
	return retry_find(s, name, lockfs_record_fd_owner_at(rec, i), lockfs_record_fence_at(rec, i));
}

/* Did a retry end grant FENCE a moment ago?  (Fences are never reused.) */
static bool retry_ended(const struct stripe *s, uint64_t fence)
{
	size_t n = s->n_retry_ended < 8 ? s->n_retry_ended : 8;

	for (size_t i = 0; fence && i < n; i++)
		if (s->retry_ended[i] == fence)
			return true;
	return false;
}

long lockfs_fdlock_holder_of(struct stripe *s, const char *name, const struct lockfs_record *rec,
			     const char *owner, const char *host)
{
	for (size_t i = 0; i < lockfs_record_holders(rec); i++) {
		if (!lockfs_fdlock_holder_is(rec, i, owner, 0, host))
			continue;
		if (!retry_of(s, name, rec, i) && !retry_ended(s, lockfs_record_fence_at(rec, i)))
			return (long)i;
	}
	return -1;
}

void lockfs_fdlock_retry_done(struct stripe *s, struct unlock_retry **pp)
{
	struct unlock_retry *r = *pp;

	s->retry_ended[s->n_retry_ended++ % 8] = r->fence;
	*pp = r->next;
	free(r->name);
	free(r);
}

/* R's holder, for its `released` line when the store applied the refused
 * release itself: from C, NAME's cached record as the failed release left
 * it (read back from the store, or the mirror while etcd is away). */
static void note_holder(struct unlock_retry *r, const struct held_lock *c)
{
	for (size_t i = 0; c && i < lockfs_record_holders(&c->rec); i++) {
		const struct lockfs_holder *hd = lockfs_record_holder(&c->rec, i);

		if (lockfs_record_fence_at(&c->rec, i) != r->fence)
			continue;
		lockfs_audit_who(r->who, sizeof(r->who), i == 0 ? c->rec.slug : NULL, hd->comm,
				 hd->pid);
		r->uid = hd->uid;
		r->pid = hd->pid;
		return;
	}
}

/* What is wrong with the store was said by the backend, once: nothing is
 * said per release.  Out of memory, the lock stays until a restart. */
struct unlock_retry *lockfs_fdlock_retry_add(struct lockfs_table *t, struct stripe *s,
					     const char *name, const char *owner,
					     uint64_t fence, int err, bool logged, int64_t asked_ms)
{
	struct unlock_retry *r;

	/* Asked again (a second refused rmdir of one grant): one retry,
	 * one `released` line; none for a grant a retry ended already. */
	for (r = s->retries; r; r = r->next)
		if (r->fence == fence && strcmp(r->owner, owner) == 0 && strcmp(r->name, name) == 0)
			return r;
	if (retry_ended(s, fence))
		return NULL;
	r = calloc(1, sizeof(*r));
	if (!r || !(r->name = strdup(name))) {
		free(r);
		fprintf(stderr, "lockfs: %s: releasing %s failed (%s); kept until the daemon "
			"restarts (out of memory)\n", name, owner, strerror(-err));
		return NULL;
	}
	snprintf(r->owner, sizeof(r->owner), "%s", owner);
	/* When the owner let go: its critical section ended then, whenever
	 * the store takes the release (the `released` line's asked=). */
	lockfs_format_time(asked_ms ? asked_ms : lockfs_wall_ms(), r->asked);
	r->fence = fence;
	r->logged = logged;
	note_holder(r, lockfs_table_find(s, name));
	r->next = s->retries;
	s->retries = r;
	lockfs_table_wake(t); /* the tick tries it again */
	return r;
}

void lockfs_fdlock_retry_forget(struct stripe *s, const char *name, uint64_t fence)
{
	for (struct unlock_retry **pp = &s->retries, *r; (r = *pp);) {
		if (r->fence == fence && strcmp(r->name, name) == 0) {
			*pp = r->next;
			free(r->name);
			free(r);
		} else {
			pp = &r->next;
		}
	}
}

bool lockfs_fdlock_retry_pending(struct stripe *s, const char *name,
				 const struct lockfs_record *rec, size_t i)
{
	return retry_of(s, name, rec, i) != NULL;
}

const char *lockfs_fdlock_release_event(struct stripe *s, const char *name,
					const struct lockfs_record *rec, size_t i)
{
	struct unlock_retry *r = retry_of(s, name, rec, i);

	return r && !r->logged ? NULL : "released";
}

void lockfs_fdlock_free_retries(struct stripe *s)
{
	/* Retries not done by now are lost: the lock stays in DIR and the
	 * next start rebinds it to its holder process (fail closed). */
	while (s->retries) {
		struct unlock_retry *r = s->retries;

		s->retries = r->next;
		free(r->name);
		free(r);
	}
}
