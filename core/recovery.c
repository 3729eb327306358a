/*
 * What happens to locks without a request: a holder dies, a lease runs
 * out, an administrator breaks a lock, the daemon starts on a store that
 * already holds locks.  Runs on the liveness thread (and in
 * lockfs_core_open), never inside a FUSE request.
 *
 * The rule throughout: release only on evidence, and say which.  A dead
 * process is evidence; elapsed time alone is not (an expired lease of a
 * live holder is logged and kept).  When the evidence cannot be had, the
 * lock stays.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/name.h"
#include "table.h"

/* A lock to act on, noted under its stripe mutex and acted on after. */
struct todo {
	char *name;
	char token[LOCKFS_TOKEN_HEX + 1];
	enum { TODO_GONE, TODO_EXPIRED, TODO_SLUG } kind;
	uid_t uid;
	char slug[SLUG_MAX];
};

struct todo_list {
	struct todo *v;
	size_t n, cap;
};

static struct todo *todo_add(struct todo_list *l, const struct cached *c, int kind)
{
	struct todo *t;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 8;
		struct todo *v = realloc(l->v, cap * sizeof(*v));

		if (!v)
			return NULL;
		l->v = v;
		l->cap = cap;
	}
	t = &l->v[l->n];
	memset(t, 0, sizeof(*t));
	t->name = strdup(c->name);
	if (!t->name)
		return NULL;
	memcpy(t->token, c->rec.token, sizeof(t->token));
	t->kind = kind;
	t->uid = c->rec.holder.uid;
	snprintf(t->slug, sizeof(t->slug), "%s", c->rec.slug ? c->rec.slug : "");
	l->n++;
	return t;
}

static void todo_free(struct todo_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i].name);
	free(l->v);
}

/*
 * Recover NAME if the store still shows the acquisition TOKEN names: log
 * `recovered` with EXTRA as evidence, remove it, tell the mount, and
 * signal the holder when SIGNAL and -o break_signal ask for it.
 */
static void recover(struct lockfs_core *core, const char *name, const char *token,
		    const char *const *extra, bool signal)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	bool foreign, released = false;
	pid_t pid = 0;
	unsigned long long start = 0;

	pthread_mutex_lock(&s->mu);
	if (load_locked(core, s, name, &st, &foreign, true, &c) == 0 && c &&
	    strcmp(c->rec.token, token) == 0) {
		bool shared = c->rec.nshares > 0;

		pid = c->rec.holder.pid;
		start = c->rec.holder.start_time;
		/* A shared lock loses this holder only; the others keep it. */
		released = drop_holder_locked(core, s, c, st.identity, 0, "recovered", extra) == 0;
		if (shared)
			released = false;
	}
	stripe_unlock(s);
	if (!released)
		return;
	if (signal && core->break_signal && pid > 0)
		lockfs_liveness_signal(core->liveness, pid, start, core->break_signal);
	notify_removed(core, name);
}

/* Recover a lock whose process-bound holder is gone. */
static void recover_gone(struct lockfs_core *core, const struct todo *t)
{
	struct stripe *s = stripe_of(core, t->name);
	char holder[WHO_MAX], start[24];
	const char *evidence = core->starting ? "exited-while-down" : "exited";
	struct cached *c;

	pthread_mutex_lock(&s->mu);
	c = cache_find(s, t->name);
	if (!c || strcmp(c->rec.token, t->token) != 0) {
		stripe_unlock(s);
		return;
	}
	who_of(holder, sizeof(holder), NULL, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(start, sizeof(start), "%llu", c->rec.holder.start_time);
	if (strcmp(c->rec.holder.boot_id, core->boot_id) != 0)
		evidence = "boot-changed";
	stripe_unlock(s);
	{
		const char *extra[] = { "holder", holder, "start", start, "evidence", evidence, NULL };

		recover(core, t->name, t->token, extra, false);
	}
}

/* Log `expired` for a lease that ran out while its holder lives on. */
static void log_expired(struct lockfs_core *core, const char *name, const char *token,
			const char *evidence, pid_t evidence_pid)
{
	struct stripe *s = stripe_of(core, name);
	char who[WHO_MAX], fence[24], ttl[16], pid[16];
	struct cached *c;

	pthread_mutex_lock(&s->mu);
	c = cache_find(s, name);
	if (!c || strcmp(c->rec.token, token) != 0) {
		stripe_unlock(s);
		return;
	}
	c->expired_logged = true;
	who_of(who, sizeof(who), c->rec.slug, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, c->rec.fence);
	snprintf(ttl, sizeof(ttl), "%u", c->rec.lease.ttl_s);
	snprintf(pid, sizeof(pid), "%d", (int)(evidence_pid ? evidence_pid : c->rec.holder.pid));
	stripe_unlock(s);
	{
		const char *kv[] = { "fence", fence, "ttl_s", ttl, "evidence", evidence,
				     "pid", pid, NULL };

		log_event(core, who, name, kv, "expired");
	}
}

/* A slug lock's lease ran out: recover it only if no process of its uid
 * still carries the slug.  Unknown (no /proc) keeps it. */
static void check_slug(struct lockfs_core *core, const struct todo *t, bool logged)
{
	pid_t pid = 0;
	int rc = lockfs_proc_env_exists(t->uid, "LOCKFS_SLUG", t->slug, &pid);

	if (rc == 0) {
		char uid[16];
		const char *extra[] = { "slug", t->slug, "uid", uid,
					"evidence", "lease-expired,no-process-with-slug", NULL };

		snprintf(uid, sizeof(uid), "%u", (unsigned)t->uid);
		recover(core, t->name, t->token, extra, true);
	} else if (rc == 1 && !logged) {
		log_expired(core, t->name, t->token, "process-with-slug", pid);
	}
}

static void collect(struct lockfs_core *core, struct todo_list *l, bool leases)
{
	int64_t now = lockfs_boot_ms();

	for (int i = 0; i < STRIPES; i++) {
		struct stripe *s = &core->stripes[i];

		pthread_mutex_lock(&s->mu);
		for (struct cached *c = s->head; c; c = c->next) {
			const struct lockfs_lease *lease = &c->rec.lease;

			if (c->holder_gone) {
				todo_add(l, c, TODO_GONE);
			} else if (leases && lease->ttl_s && now >= lease->deadline_boot_ms) {
				if (c->rec.bound == LOCKFS_BOUND_PROCESS && !c->expired_logged) {
					todo_add(l, c, TODO_EXPIRED);
				} else if (c->rec.bound == LOCKFS_BOUND_SLUG &&
					   now >= c->next_check_boot_ms) {
					/* /proc is scanned at most once a second per lock. */
					c->next_check_boot_ms = now + 1000;
					todo_add(l, c, TODO_SLUG);
				}
			}
		}
		stripe_unlock(s);
	}
}

static bool entry_logged(struct lockfs_core *core, const char *name)
{
	struct stripe *s = stripe_of(core, name);
	struct cached *c;
	bool logged;

	pthread_mutex_lock(&s->mu);
	c = cache_find(s, name);
	logged = c && c->expired_logged;
	stripe_unlock(s);
	return logged;
}

static void act(struct lockfs_core *core, struct todo_list *l)
{
	for (size_t i = 0; i < l->n; i++) {
		struct todo *t = &l->v[i];

		switch (t->kind) {
		case TODO_GONE:
			recover_gone(core, t);
			break;
		case TODO_EXPIRED:
			log_expired(core, t->name, t->token, "holder-alive", 0);
			break;
		case TODO_SLUG:
			check_slug(core, t, entry_logged(core, t->name));
			break;
		}
	}
}

void recovery_holder_exited(void *arg, pid_t pid, unsigned long long start)
{
	struct lockfs_core *core = arg;
	struct todo_list l = { 0 };

	for (int i = 0; i < STRIPES; i++) {
		struct stripe *s = &core->stripes[i];

		pthread_mutex_lock(&s->mu);
		for (struct cached *c = s->head; c; c = c->next) {
			if (c->rec.bound == LOCKFS_BOUND_PROCESS && c->rec.has_holder &&
			    c->rec.holder.pid == pid && c->rec.holder.start_time == start) {
				c->holder_gone = true;
				todo_add(&l, c, TODO_GONE);
			}
		}
		stripe_unlock(s);
	}
	act(core, &l);
	todo_free(&l);
}

struct name_vec {
	char **v;
	size_t n, cap;
};

static int add_name(void *arg, const char *name)
{
	struct name_vec *nv = arg;

	if (lockfs_name_check(name) < 0)
		return 0;
	if (nv->n == nv->cap) {
		size_t cap = nv->cap ? nv->cap * 2 : 16;
		char **v = realloc(nv->v, cap * sizeof(*v));

		if (!v)
			return 1;
		nv->v = v;
		nv->cap = cap;
	}
	nv->v[nv->n] = strdup(name);
	if (nv->v[nv->n])
		nv->n++;
	return 0;
}

static void name_vec_free(struct name_vec *nv)
{
	for (size_t i = 0; i < nv->n; i++)
		free(nv->v[i]);
	free(nv->v);
}

/* -o stale: recover foreign locks (the seed's, or made by hand) whose
 * mtime is older than stale_s -- the seed tool's own rule, for users who
 * mix both tools.  Locks with a lockfs record are never judged by age. */
static void recover_stale_foreign(struct lockfs_core *core)
{
	struct name_vec nv = { 0 };
	int64_t now = lockfs_wall_ms();

	if (core->be->ops->list(core->be, add_name, &nv) < 0)
		goto out;
	for (size_t i = 0; i < nv.n; i++) {
		struct stripe *s = stripe_of(core, nv.v[i]);
		struct lockfs_entry_stat st;
		struct cached *c;
		bool foreign, released = false;
		char age[24], stale[24];

		pthread_mutex_lock(&s->mu);
		if (!cache_find(s, nv.v[i]) &&
		    load_locked(core, s, nv.v[i], &st, &foreign, true, &c) == 0 && foreign &&
		    now - st.mtime_ms >= (int64_t)core->stale_s * 1000) {
			const char *kv[] = { "age_s", age, "stale_s", stale,
					     "evidence", "foreign-stale", NULL };

			snprintf(age, sizeof(age), "%" PRId64, (now - st.mtime_ms) / 1000);
			snprintf(stale, sizeof(stale), "%u", core->stale_s);
			/* Logged once it happened, under the mutex (release_locked). */
			released = core->be->ops->release(core->be, nv.v[i], st.identity) == 0;
			if (released)
				log_event(core, "?", nv.v[i], kv, "recovered");
		}
		stripe_unlock(s);
		if (released)
			notify_removed(core, nv.v[i]);
	}
out:
	name_vec_free(&nv);
}

void recovery_tick(void *arg)
{
	struct lockfs_core *core = arg;
	struct todo_list l = { 0 };

	/* A store gone bad is noticed (and said) within a tick. */
	if (core->be->ops->check)
		core->be->ops->check(core->be);
	collect(core, &l, true);
	act(core, &l);
	todo_free(&l);
	queue_tick(core);
	rebound_tick(core);
	if (core->stale_s && lockfs_wall_ms() >= core->next_stale_scan_ms) {
		core->next_stale_scan_ms = lockfs_wall_ms() + 1000;
		recover_stale_foreign(core);
	}
}

int recovery_startup_scan(struct lockfs_core *core)
{
	struct name_vec nv = { 0 };
	struct todo_list l = { 0 };
	int rc;

	core->starting = true;
	rc = core->be->ops->list(core->be, add_name, &nv);
	for (size_t i = 0; rc == 0 && i < nv.n; i++) {
		struct stripe *s = stripe_of(core, nv.v[i]);
		struct lockfs_entry_stat st;
		struct cached *c;
		bool foreign;

		/* Reading each record caches it and watches its holder; a
		 * holder that died while no daemon watched is marked gone. */
		pthread_mutex_lock(&s->mu);
		if (load_locked(core, s, nv.v[i], &st, &foreign, true, &c) == 0 && c)
			rebind_fd_locked(core, s, c, &st);
		stripe_unlock(s);
	}
	name_vec_free(&nv);
	if (rc == 0) {
		collect(core, &l, false);
		act(core, &l);
	}
	todo_free(&l);
	core->starting = false;
	return rc;
}

int lockfs_core_break(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *caller, const char *reason, size_t len)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	char by[WHO_MAX], *why;
	bool foreign;
	pid_t pid = 0;
	unsigned long long start = 0;
	int rc;

	if (len > 0 && reason[len - 1] == '\n')
		len--;
	if (len > LOCKFS_OPERATION_MAX)
		return -EFBIG;
	if (len == 0 || memchr(reason, '\0', len) || !lockfs_utf8_valid(reason, len))
		return -EINVAL;
	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	why = strndup(reason, len);
	if (!why)
		return -ENOMEM;
	who_of_caller(core, caller->tid, by, sizeof(by));

	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, true, &c);
	if (rc == 0 && c) {
		const char *extra[] = { "by", by, "reason", why, NULL };

		pid = c->rec.holder.pid;
		start = c->rec.holder.start_time;
		rc = release_locked(core, s, c, st.identity, "broken", extra);
	} else if (rc == 0) {
		const char *kv[] = { "by", by, "reason", why, NULL };

		/* Logged once it happened, under the mutex (release_locked). */
		rc = core->be->ops->release(core->be, name, st.identity);
		if (rc == 0)
			log_event(core, "?", name, kv, "broken");
	}
	stripe_unlock(s);
	free(why);
	if (rc < 0)
		return rc;
	if (core->break_signal && pid > 0)
		lockfs_liveness_signal(core->liveness, pid, start, core->break_signal);
	notify_removed(core, name);
	return 0;
}
