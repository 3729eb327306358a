/*
 * What a lock's holder may write into its lock, each under the rmdir rule
 * (lockfs_caller_may_act: the holder or a descendant): its operation
 * text, its lease (and a renewal: `touch M/NAME`), and its binding
 * (`M/NAME/bind`: an fd lock kept by a process or a slug).  Also the
 * rule itself for fs/'s access checks (lockfs_core_check_holder).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"
#include "engine.h"
#include "lock/audit.h"
#include "lock/caller.h"
#include "lock/fdlock.h"
#include "lock/table.h"

int lockfs_core_check_holder(struct lockfs_core *core, const char *name,
			     const struct lockfs_caller *caller)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct lockfs_holder_ref h;
	struct held_lock *c;
	bool foreign;
	int rc;

	if (lockfs_name_check_stored(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc == 0)
		lockfs_caller_ref_at(&h, c ? &c->rec : NULL, 0);
	lockfs_table_unlock(s);
	return rc == 0 ? lockfs_caller_check(t, &h, caller) : rc;
}

/*
 * Run EDIT on NAME's fresh cache entry if CALLER may act as its holder,
 * then write the record back.  EDIT returns 0 or -errno and may leave the
 * record unchanged by returning 1 (nothing to write).
 */
static int edit_as_holder(struct lockfs_core *core, const char *name,
			  const struct lockfs_caller *caller,
			  int (*edit)(struct lockfs_core *, struct held_lock *, void *), void *arg)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	int rc;

	if (lockfs_name_check_stored(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc == 0)
		rc = lockfs_caller_may_act(t, c, caller);
	if (rc == 0)
		rc = edit(core, c, arg);
	if (rc == 0)
		rc = lockfs_table_persist(t, s, c, &st);
	lockfs_table_unlock(s);
	return rc == 1 ? 0 : rc;
}

struct text_arg {
	const char *text;
	size_t len;
};

static int edit_operation(struct lockfs_core *core, struct held_lock *c, void *arg)
{
	struct text_arg *t = arg;
	char *op = t->len ? strndup(t->text, t->len) : NULL;

	if (t->len && !op)
		return -ENOMEM;
	free(c->rec.operation);
	c->rec.operation = op;
	return 0;
}

int lockfs_core_set_operation(struct lockfs_core *core, const char *name,
			      const struct lockfs_caller *caller, const char *text, size_t len)
{
	struct text_arg t = { text, len };

	if (t.len > 0 && text[t.len - 1] == '\n')
		t.len--;
	if (t.len > LOCKFS_OPERATION_MAX)
		return -EFBIG;
	if (memchr(text, '\0', t.len) || !lockfs_utf8_valid(text, t.len))
		return -EINVAL;
	return edit_as_holder(core, name, caller, edit_operation, &t);
}

static int edit_lease(struct lockfs_core *core, struct held_lock *c, void *arg)
{
	uint32_t ttl = *(uint32_t *)arg;

	if (ttl == 0 && c->rec.bound == LOCKFS_BOUND_SLUG)
		return -EINVAL; /* a slug lock's lease is its only liveness */
	lockfs_lease_start(&c->rec.lease, ttl);
	c->expired_logged = false;
	c->next_check_boot_ms = 0;
	return 0;
}

int lockfs_core_set_lease(struct lockfs_core *core, const char *name,
			  const struct lockfs_caller *caller, const char *text, size_t len)
{
	char buf[24], *end;
	unsigned long long v;

	while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' '))
		len--;
	if (len == 0 || len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, text, len);
	buf[len] = '\0';
	if (buf[0] < '0' || buf[0] > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(buf, &end, 10);
	if (errno || *end || v > LOCKFS_LEASE_MAX_S)
		return -EINVAL;
	{
		uint32_t ttl = (uint32_t)v;

		return edit_as_holder(core, name, caller, edit_lease, &ttl);
	}
}

static int edit_renew(struct lockfs_core *core, struct held_lock *c, void *arg)
{
	if (!c->rec.lease.ttl_s)
		return 1; /* nothing to renew: touching is still allowed */
	return edit_lease(core, c, &c->rec.lease.ttl_s);
}

int lockfs_core_renew(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *caller)
{
	return edit_as_holder(core, name, caller, edit_renew, NULL);
}

int lockfs_core_bind(struct lockfs_core *core, const char *name, const struct lockfs_caller *caller,
		     const char *text, size_t len)
{
	struct lockfs_table *t = &core->table;
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	char slug[LOCKFS_SLUG_MAX], who[WHO_MAX], fence[24], uid[16], pid[16];
	struct lockfs_proc writer;
	struct held_lock *c;
	bool foreign, to_slug;
	int rc;

	if (len > 0 && text[len - 1] == '\n')
		len--;
	to_slug = len == 4 && memcmp(text, "slug", 4) == 0;
	if (lockfs_name_check_stored(name) < 0)
		return -ENOENT;
	slug[0] = '\0';
	if (to_slug && lockfs_caller_slug(t->procs, caller->tid, slug, sizeof(slug)) < 0)
		slug[0] = '\0';
	/* The writer as a holder (genuine helpers of its own uid skipped),
	 * resolved outside the mutex: `lockctl acquire` writes for the shell
	 * that ran it. */
	if (lockfs_holder_resolve(t->procs, caller->tid, caller->uid, &t->helpers, 0,
				  &writer) < 0)
		writer.pid = 0;

	pthread_mutex_lock(&s->mu);
	rc = lockfs_table_load(t, s, name, &st, &foreign, &c);
	if (rc < 0)
		goto out;
	if (!c || !lockfs_table_issued_here(c)) {
		rc = -EPERM;
		goto out;
	}
	/* "The resolved holder ... may write": the writer that resolves to
	 * the holder itself (it asked for the fd lock through a genuine
	 * helper such as lockctl, which never leads across a uid boundary
	 * but through sudo); any other descendant by the rmdir rule.  Anyone
	 * else: EPERM, whatever they wrote. */
	if (!(writer.pid > 0 && writer.pid == c->rec.holder.pid &&
	      writer.start_time == c->rec.holder.start_time &&
	      strcmp(c->rec.holder.boot_id, t->boot_id) == 0))
		rc = lockfs_caller_may_act(t, c, caller);
	/* A grant its descriptor let go (the store is yet to take it) is
	 * nobody's to keep; nor is a waiter's place at the head of the
	 * store's line, which no grant made the writer's. */
	if (rc == 0 && (lockfs_fdlock_retry_pending(s, name, &c->rec, 0) ||
			lockfs_table_place_only(t, c)))
		rc = -EPERM;
	if (rc < 0)
		goto out;
	if ((!to_slug && !(len == 7 && memcmp(text, "process", 7) == 0)) ||
	    (to_slug && !*slug) || c->rec.bound != LOCKFS_BOUND_FD ||
	    c->rec.mode != LOCKFS_EXCLUSIVE || c->rec.nshares) {
		rc = -EINVAL;
		goto out;
	}
	/* A writer named like a helper that binds the lock to itself is a
	 * lockctl that was not skipped: one past a uid boundary (`setpriv
	 * --reuid=U lockctl acquire`, run by root) or a copy that is not the
	 * genuine one (holder.md).  It exits at once, and with it a
	 * process-bound lock: EACCES, as mkdir gets, rather than no lock.
	 * A slug lock is the writer's uid's to keep. */
	if (!to_slug && writer.pid == c->rec.holder.pid &&
	    lockfs_helpers_contains(&t->helpers, writer.exe)) {
		rc = -EACCES;
		goto out;
	}
	c->rec.fd_owner[0] = '\0';
	c->rec.via_file = 0;
	if (to_slug) {
		char *dup = strdup(slug);

		if (!dup) {
			rc = -ENOMEM;
			goto out;
		}
		free(c->rec.slug);
		c->rec.slug = dup;
		c->rec.bound = LOCKFS_BOUND_SLUG;
		/* A slug lock belongs to the uid that asked for it, and counts
		 * against it from now on. */
		lockfs_table_account(t, c, -1);
		c->rec.holder.uid = caller->uid;
		c->rec.holder.gid = caller->gid;
		lockfs_table_account(t, c, 1);
		lockfs_lease_start(&c->rec.lease, t->default_lease_s);
	} else {
		c->rec.bound = LOCKFS_BOUND_PROCESS;
	}
	lockfs_audit_who(who, sizeof(who), c->rec.slug, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, c->rec.fence);
	lockfs_audit_ids(uid, pid, c->rec.holder.uid, c->rec.holder.pid);
	rc = lockfs_table_persist(t, s, c, &st);
	if (rc == 0) {
		const char *kv[] = { "fence", fence, "uid", uid, "pid", pid,
				     "bound", to_slug ? "slug" : "process", NULL };

		lockfs_audit_event(t, who, name, kv, "bound");
		lockfs_table_watch(t, c, -1);
	}
out:
	lockfs_table_unlock(s);
	return rc;
}
