/*
 * The lock engine's requests: take, inspect, annotate, renew and release a
 * lock.  See include/lockfs/core.h; the shared state and its locking rules
 * are in table.h, and what happens without a request (holder death,
 * leases, breaks, restart) is in recovery.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "lockfs/name.h"
#include "table.h"

#define CMDLINE_MAX 4096
#define DEFAULT_LEASE_S 600
/* How often the liveness thread looks at leases and holders. */
#define TICK_MS 50

int64_t lockfs_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t lockfs_boot_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct stripe *stripe_of(struct lockfs_core *core, const char *name)
{
	uint32_t h = 2166136261u; /* FNV-1a */

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 16777619u;
	return &core->stripes[h % STRIPES];
}

struct cached *cache_find(struct stripe *s, const char *name)
{
	for (struct cached *c = s->head; c; c = c->next)
		if (strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

void stripe_unlock(struct stripe *s)
{
	pthread_mutex_unlock(&s->mu);
}

static bool same_holder(const struct lockfs_record *a, const struct lockfs_record *b)
{
	return a->bound == b->bound && a->has_holder == b->has_holder &&
	       (!a->has_holder || (a->holder.pid == b->holder.pid &&
				   a->holder.start_time == b->holder.start_time));
}

/* Stop watching C's holder, if we were.  Called with the stripe mutex held. */
void cache_unwatch(struct lockfs_core *core, struct cached *c)
{
	if (c->watched)
		lockfs_liveness_unwatch(core->liveness, c->rec.holder.pid, c->rec.holder.start_time);
	c->watched = false;
}

/*
 * Watch C's holder if the lock is process-bound.  A holder of another boot,
 * or one that is gone already, marks the entry for recovery instead: only
 * a live holder keeps a lock.  Called with the stripe mutex held.
 */
void cache_watch(struct lockfs_core *core, struct cached *c, int pidfd)
{
	int rc;

	if (c->rec.bound == LOCKFS_BOUND_SLUG && c->rec.has_holder &&
	    strcmp(c->rec.holder.boot_id, core->boot_id) != 0 && c->rec.lease.ttl_s) {
		/* A boot-clock deadline of another boot means nothing here:
		 * carry the lease over by its wall-clock expiry instead. */
		int64_t left = c->rec.lease.expires_at_ms - lockfs_wall_ms();

		c->rec.lease.deadline_boot_ms = lockfs_boot_ms() + (left > 0 ? left : 0);
	}
	if (c->rec.bound != LOCKFS_BOUND_PROCESS || !c->rec.has_holder || c->watched ||
	    strcmp(c->rec.holder.boot_id, core->boot_id) != 0) {
		if (pidfd >= 0)
			close(pidfd);
		if (c->rec.bound == LOCKFS_BOUND_PROCESS && !c->watched &&
		    strcmp(c->rec.holder.boot_id, core->boot_id) != 0)
			c->holder_gone = true;
		return;
	}
	rc = pidfd >= 0 ? lockfs_liveness_watch_fd(core->liveness, c->rec.holder.pid,
						   c->rec.holder.start_time, pidfd)
			: lockfs_liveness_watch(core->liveness, c->rec.holder.pid,
						c->rec.holder.start_time);
	if (rc == 0)
		c->watched = true;
	else if (rc == -ESRCH)
		c->holder_gone = true;
	/* Any other failure (no memory, no fds) leaves the lock held and
	 * unwatched: fail closed, never release on a guess. */
}

void cache_drop(struct lockfs_core *core, struct stripe *s, const char *name)
{
	for (struct cached **pp = &s->head; *pp; pp = &(*pp)->next) {
		struct cached *c = *pp;

		if (strcmp(c->name, name) == 0) {
			*pp = c->next;
			cache_unwatch(core, c);
			lockfs_record_clear(&c->rec);
			free(c->name);
			free(c);
			return;
		}
	}
}

/* Take over REC as NAME's cached record, watching its holder (through
 * PIDFD when >= 0, which is taken over).  OURS: REC is an acquisition this
 * daemon just made, whose token it issues; otherwise REC was read from the
 * store, and only a name seen for the first time adopts its token.  Called
 * with s->mu held.  On allocation failure REC is cleared and nothing
 * cached. */
void cache_put(struct lockfs_core *core, struct stripe *s, const char *name,
	       uint64_t identity, struct lockfs_record *rec, int pidfd, bool ours)
{
	struct cached *c = cache_find(s, name);

	if (!c || ours) {
		if (c)
			cache_drop(core, s, name);
		c = calloc(1, sizeof(*c));
		if (!c || !(c->name = strdup(name))) {
			free(c);
			lockfs_record_clear(rec);
			if (pidfd >= 0)
				close(pidfd);
			return;
		}
		c->next = s->head;
		s->head = c;
		memcpy(c->issued, rec->token, sizeof(c->issued));
	} else if (!same_holder(&c->rec, rec) || strcmp(c->rec.token, rec->token) != 0) {
		/* Another acquisition under the same name: start afresh. */
		cache_unwatch(core, c);
		c->holder_gone = false;
		c->expired_logged = false;
		c->rebound = false;
		c->next_check_boot_ms = 0;
	}
	lockfs_record_clear(&c->rec);
	c->identity = identity;
	c->rec = *rec;
	memset(rec, 0, sizeof(*rec));
	cache_watch(core, c, pidfd);
}

/*
 * Find NAME's parsed record: from the cache when the store's identity still
 * matches (and FRESH is false), else read and parsed from the store and
 * cached.  Sets *C to the cache entry -- valid only while the stripe mutex
 * is held -- or to NULL with *FOREIGN set when NAME is held without a
 * record lockfs can read.  Called with s->mu held.
 * Returns 0, -ENOENT when not held, -errno.
 */
int load_locked(struct lockfs_core *core, struct stripe *s, const char *name,
		struct lockfs_entry_stat *st, bool *foreign, bool fresh, struct cached **c)
{
	struct lockfs_record rec;
	char *buf = NULL;
	size_t len = 0;
	int rc;

	*c = NULL;
	*foreign = false;
	if (!fresh) {
		*c = cache_find(s, name);
		rc = core->be->ops->stat(core->be, name, st, *c != NULL);
		if (rc < 0) {
			if (rc == -ENOENT)
				cache_drop(core, s, name);
			*c = NULL;
			return rc;
		}
		if (*c && (*c)->identity == st->identity)
			return 0;
	}
	rc = core->be->ops->read(core->be, name, &buf, &len, st);
	if (rc < 0) {
		if (rc == -ENOENT)
			cache_drop(core, s, name);
		return rc;
	}
	memset(&rec, 0, sizeof(rec));
	if (!buf || lockfs_record_parse(buf, len, &rec) < 0 ||
	    strcmp(rec.resource, name) != 0) {
		/* Held, but not by a record we can read: a foreign lock. */
		lockfs_record_clear(&rec);
		free(buf);
		cache_drop(core, s, name);
		*foreign = true;
		return 0;
	}
	free(buf);
	lockfs_fence_observe(core->fence, rec.fence);
	cache_put(core, s, name, st->identity, &rec, -1, false);
	*c = cache_find(s, name);
	return *c ? 0 : -ENOMEM;
}

void who_of(char *buf, size_t size, const char *slug, const char *comm, pid_t pid)
{
	if (slug && *slug)
		snprintf(buf, size, "%s", slug);
	else
		snprintf(buf, size, "%s[%d]", comm && *comm ? comm : "?", (int)pid);
}

void log_event(struct lockfs_core *core, const char *who, const char *name,
	       const char *const *kv, const char *event)
{
	int rc = lockfs_log_event(core->log, who, name, kv, event);

	if (rc < 0)
		fprintf(stderr, "lockfs: warning: audit log write failed: %s\n", strerror(-rc));
}

void notify_removed(struct lockfs_core *core, const char *name)
{
	if (core->removed)
		core->removed(core->removed_arg, name);
}

/* The user name of UID (cached; getpwuid may go to NSS).  Malloc'd or NULL. */
static char *user_name(struct lockfs_core *core, uid_t uid)
{
	char *name = NULL, buf[4096];
	struct passwd pw, *res = NULL;

	pthread_mutex_lock(&core->users_mu);
	for (size_t i = 0; i < core->nusers; i++) {
		if (core->users[i].uid == uid) {
			name = core->users[i].name ? strdup(core->users[i].name) : NULL;
			pthread_mutex_unlock(&core->users_mu);
			return name;
		}
	}
	pthread_mutex_unlock(&core->users_mu);

	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) == 0 && res)
		name = strdup(res->pw_name);

	pthread_mutex_lock(&core->users_mu);
	if (core->nusers < 1024) {
		struct uid_name *n = realloc(core->users, (core->nusers + 1) * sizeof(*n));

		if (n) {
			core->users = n;
			n[core->nusers].uid = uid;
			n[core->nusers].name = name ? strdup(name) : NULL;
			core->nusers++;
		}
	}
	pthread_mutex_unlock(&core->users_mu);
	return name;
}

/* 128 random bits as hex.  getrandom(2) is asked for 32 tokens at a
 * time per thread: one syscall fewer on almost every acquisition. */
static int make_token(char out[LOCKFS_TOKEN_HEX + 1])
{
	static __thread unsigned char pool[32 * LOCKFS_TOKEN_HEX / 2];
	static __thread size_t left;
	unsigned char raw[LOCKFS_TOKEN_HEX / 2];

	if (left < sizeof(raw)) {
		size_t got = 0;

		while (got < sizeof(pool)) {
			ssize_t n = getrandom(pool + got, sizeof(pool) - got, 0);

			if (n < 0) {
				if (errno == EINTR)
					continue;
				return -errno;
			}
			got += (size_t)n;
		}
		left = sizeof(pool);
	}
	left -= sizeof(raw);
	memcpy(raw, pool + left, sizeof(raw));
	/* Used bytes never serve twice. */
	memset(pool + left, 0, sizeof(raw));
	for (size_t i = 0; i < sizeof(raw); i++) {
		out[2 * i] = "0123456789abcdef"[raw[i] >> 4];
		out[2 * i + 1] = "0123456789abcdef"[raw[i] & 15];
	}
	out[LOCKFS_TOKEN_HEX] = '\0';
	return 0;
}

/* The LOCKFS_SLUG of thread TID's process (its exec-time environment) into
 * BUF; "" when unset or unreadable.  Returns 0, or -EINVAL for a slug that
 * is too long (SLUG_MAX - 1 bytes at most), not UTF-8, or has a control
 * character: such a slug names nothing reliably. */
int caller_slug(pid_t tid, char *buf, size_t size)
{
	int n = tid > 0 ? lockfs_proc_getenv(tid, "LOCKFS_SLUG", buf, size) : -ENOENT;

	if (n == -ENAMETOOLONG) {
		buf[0] = '\0';
		return -EINVAL;
	}
	if (n < 0) {
		buf[0] = '\0';
		return 0;
	}
	for (int i = 0; i < n; i++) {
		if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f) {
			buf[0] = '\0';
			return -EINVAL;
		}
	}
	if (!lockfs_utf8_valid(buf, (size_t)n)) {
		buf[0] = '\0';
		return -EINVAL;
	}
	return 0;
}

void who_of_caller(struct lockfs_core *core, pid_t tid, char *buf, size_t size)
{
	struct lockfs_proc p;
	char slug[SLUG_MAX];

	(void)caller_slug(tid, slug, sizeof(slug)); /* a bad slug reads as none */
	if (!*slug && lockfs_holder_resolve(core->procs, tid, &core->helpers, 0, &p) == 0)
		who_of(buf, size, NULL, p.comm, p.pid);
	else
		who_of(buf, size, slug, "?", tid);
}

/* Start LEASE anew: TTL_S from now (0 clears it).  The deadline that
 * counts is on the boot clock; the wall-clock copy is for people and is
 * fixed here, so every reading shows the same instant. */
void lease_start(struct lockfs_lease *lease, uint32_t ttl_s)
{
	lease->ttl_s = ttl_s;
	lease->deadline_boot_ms = ttl_s ? lockfs_boot_ms() + (int64_t)ttl_s * 1000 : 0;
	lease->expires_at_ms = ttl_s ? lockfs_wall_ms() + (int64_t)ttl_s * 1000 : 0;
}

int holder_fill(struct lockfs_core *core, struct lockfs_holder *h, const struct lockfs_proc *p,
		char ***cmdline)
{
	h->pid = p->pid;
	h->start_time = p->start_time;
	h->uid = p->uid;
	h->gid = p->gid;
	h->user = user_name(core, p->uid);
	h->comm = strdup(p->comm);
	h->host = strdup(core->host);
	h->boot_id = strdup(core->boot_id);
	if (cmdline && *cmdline) {
		h->cmdline = *cmdline; /* read earlier (a parked waiter) */
		*cmdline = NULL;
	} else if (lockfs_proc_cmdline(p->pid, CMDLINE_MAX, &h->cmdline) < 0) {
		h->cmdline = calloc(1, sizeof(char *));
	}
	if (!h->comm || !h->host || !h->boot_id || !h->cmdline) {
		lockfs_holder_clear(h);
		return -ENOMEM;
	}
	return 0;
}

/* Build the record for a new holder.  Returns 0 or -errno. */
int build_record(struct lockfs_core *core, const char *name,
		 const struct lockfs_proc *p, const char *slug, struct lockfs_record *rec,
		 char ***cmdline)
{
	int rc;

	memset(rec, 0, sizeof(*rec));
	rec->has_holder = true;
	rc = holder_fill(core, &rec->holder, p, cmdline);
	if (rc < 0)
		goto fail;
	rec->resource = strdup(name);
	if (slug && *slug) {
		/* Agents whose commands run in throwaway shells bind the lock
		 * to (uid, slug); a lease stands in for a process to watch. */
		rec->slug = strdup(slug);
		rec->bound = LOCKFS_BOUND_SLUG;
		lease_start(&rec->lease, core->default_lease_s);
	}
	if (!rec->resource || (slug && *slug && !rec->slug)) {
		rc = -ENOMEM;
		goto fail;
	}
	rec->acquired_at_ms = lockfs_wall_ms();
	rc = lockfs_fence_next(core->fence, &rec->fence);
	if (rc < 0)
		goto fail;
	rc = make_token(rec->token);
	if (rc < 0)
		goto fail;
	return 0;
fail:
	lockfs_record_clear(rec);
	return rc;
}

/* The mount's view of a held lock: REC is NULL for a foreign lock. */
static void fill_lock_stat(struct lockfs_lock_stat *out, const struct lockfs_record *rec,
			   const struct lockfs_entry_stat *st)
{
	if (!out)
		return;
	out->identity = st->identity;
	out->generation = rec ? rec->fence : st->identity;
	out->fence = rec ? rec->fence : 0;
	out->foreign = !rec;
	if (!rec || !rec->has_holder) {
		out->uid = st->uid;
		out->gid = st->gid;
		out->mtime_ms = st->mtime_ms;
	} else {
		out->uid = rec->holder.uid;
		out->gid = rec->holder.gid;
		out->mtime_ms = rec->acquired_at_ms;
	}
}

int lockfs_core_acquire(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller, struct lockfs_lock_stat *out)
{
	struct lockfs_entry_stat st;
	struct lockfs_record rec;
	struct lockfs_proc holder;
	char slug[SLUG_MAX], who[WHO_MAX], fence[24], pid[16];
	struct stripe *s;
	size_t len;
	char *json;
	int rc;

	rc = lockfs_name_check(name);
	if (rc < 0)
		return rc;
	/* No "is it free?" pre-check: the kernel looked NAME up just before
	 * sending MKDIR and answers EEXIST itself when it exists; the
	 * backend's indivisible step decides the rest.  But a name with
	 * queued waiters is theirs first (no barging): it can only be free
	 * here if a lock we cannot watch (the seed's) just went, so grant
	 * the queue now and say EEXIST. */
	s = stripe_of(core, name);
	pthread_mutex_lock(&s->mu);
	{
		struct lockq *q = queue_find(s, name);

		if (q && q->nactive) {
			queue_grant_locked(core, s, name);
			stripe_unlock(s);
			return -EEXIST;
		}
	}
	stripe_unlock(s);
	if (caller_slug(caller->tid, slug, sizeof(slug)) < 0) {
		const char *kv[] = { "reason", "bad-slug", NULL };

		who_of(who, sizeof(who), NULL, "?", caller->tid);
		log_event(core, who, name, kv, "denied");
		return -EINVAL;
	}
	/* With a pidfd opened before the holder's facts were read, watching
	 * it needs no second look at /proc -- unless the caller is watched
	 * already (a process that takes locks again and again), when the
	 * watch is simply shared. */
	rc = lockfs_holder_resolve(core->procs, caller->tid, &core->helpers,
				   lockfs_liveness_watches_pid(core->liveness, caller->tid)
				   ? 0 : LOCKFS_PROC_PIDFD, &holder);
	if (rc < 0) {
		if (rc == -EACCES) {
			char uid[16];
			const char *kv[] = { "uid", uid, "reason", "holder-unknown", NULL };

			snprintf(uid, sizeof(uid), "%u", (unsigned)caller->uid);
			who_of(who, sizeof(who), slug, "?", caller->tid);
			log_event(core, who, name, kv, "denied");
		}
		/* A caller gone before we could read it gets no answer anyway. */
		return rc == -ESRCH ? -EACCES : rc;
	}
	if (!holder.have_ids || *slug) {
		/* The caller itself holds: its credentials came with the request.
		 * A slug lock is bound to the uid of the process that asked,
		 * whichever process the helper rule shows as holder. */
		holder.uid = caller->uid;
		holder.gid = caller->gid;
	}
	rc = build_record(core, name, &holder, slug, &rec, NULL);
	if (rc < 0) {
		lockfs_proc_put(&holder);
		return rc;
	}
	json = lockfs_record_encode(&rec, LOCKFS_RECORD_WITH_TOKEN, &len);
	if (!json) {
		lockfs_record_clear(&rec);
		lockfs_proc_put(&holder);
		return -ENOMEM;
	}
	rc = core->be->ops->acquire(core->be, name, json, len, &st);
	free(json);
	if (rc < 0) {
		lockfs_record_clear(&rec);
		lockfs_proc_put(&holder);
		return rc;
	}

	fill_lock_stat(out, &rec, &st);
	who_of(who, sizeof(who), rec.slug, rec.holder.comm, rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, rec.fence);
	snprintf(pid, sizeof(pid), "%d", (int)rec.holder.pid);
	/* `acquired` goes out only after this hold of the stripe mutex: a
	 * release of NAME that made room for this acquisition writes its
	 * line before it lets the mutex go (release_locked), so the log
	 * never shows two holders at once.  Keep it after the mutex. */
	pthread_mutex_lock(&s->mu);
	cache_put(core, s, name, st.identity, &rec, holder.has_pidfd ? holder.pidfd : -1, true);
	stripe_unlock(s);
	lockfs_record_clear(&rec);
	{
		const char *kv[] = { "fence", fence, "pid", pid, NULL };

		log_event(core, who, name, kv, "acquired");
	}
	return 0;
}

/* Log a refused request: WHO is the caller (resolved like a holder). */
static void log_denied(struct lockfs_core *core, const char *name,
		       const struct lockfs_caller *caller, const char *reason)
{
	char who[WHO_MAX];
	const char *kv[] = { "reason", reason, NULL };

	who_of_caller(core, caller->tid, who, sizeof(who));
	log_event(core, who, name, kv, "denied");
}

/* Who holds a lock, copied out of the cache so /proc can be read without
 * the stripe mutex. */
struct holder_ref {
	bool known;            /* false: a foreign lock */
	enum lockfs_bound bound;
	pid_t pid;
	unsigned long long start;
	uid_t uid;
	char boot_id[40];
	char slug[SLUG_MAX];
};

size_t holder_count(const struct lockfs_record *rec)
{
	return rec->has_holder ? 1 + rec->nshares : 0;
}

/* Holder I of REC (0: rec->holder; I >= 1: a shared lock's other ones). */
static void holder_ref_at(struct holder_ref *h, const struct lockfs_record *rec, size_t i)
{
	const struct lockfs_holder *x;

	memset(h, 0, sizeof(*h));
	if (!rec || i >= holder_count(rec))
		return;
	x = i == 0 ? &rec->holder : &rec->shares[i - 1].holder;
	h->known = true;
	h->bound = i == 0 ? rec->bound : rec->shares[i - 1].bound;
	h->pid = x->pid;
	h->start = x->start_time;
	h->uid = x->uid;
	snprintf(h->boot_id, sizeof(h->boot_id), "%s", x->boot_id);
	snprintf(h->slug, sizeof(h->slug), "%s", i == 0 && rec->slug ? rec->slug : "");
}

static void holder_ref_of(struct holder_ref *h, const struct lockfs_record *rec)
{
	holder_ref_at(h, rec, 0);
}

/*
 * May CALLER act as the holder H?  A process-bound lock: the holder process
 * or a descendant.  A slug-bound lock: a process of the holder's uid whose
 * environment carries the slug.  0, -EPERM, -EACCES.
 */
static int holder_check(struct lockfs_core *core, const struct holder_ref *h,
			const struct lockfs_caller *caller)
{
	int rc;

	if (!h->known)
		return -EPERM; /* nobody can prove they hold a foreign lock */
	if (h->bound == LOCKFS_BOUND_SLUG) {
		char slug[SLUG_MAX];

		if (caller->tid <= 0)
			return -EACCES;
		if (caller_slug(caller->tid, slug, sizeof(slug)) < 0)
			return -EPERM;
		return caller->uid == h->uid && *slug && strcmp(slug, h->slug) == 0 ? 0 : -EPERM;
	}
	if (strcmp(h->boot_id, core->boot_id) != 0)
		return -EPERM; /* held by a process of an earlier boot */
	rc = lockfs_holder_may_release(core->procs, caller->tid, h->pid, h->start,
				       lockfs_liveness_alive(core->liveness, h->pid, h->start));
	/* A descendant that runs as another user (not root) does not act
	 * for the holder: a root holder's child dropping to uid 4242 gets
	 * EPERM, while `sudo rmdir` in a user's holder shell still works. */
	if (rc == 0 && caller->uid != h->uid && caller->uid != 0)
		rc = -EPERM;
	return rc == -ESRCH ? -EPERM : rc;
}

/* holder_check() on the cached entry C (NULL: foreign). */
int holder_check_entry(struct lockfs_core *core, const struct cached *c,
		       const struct lockfs_caller *caller)
{
	struct holder_ref h;

	holder_ref_of(&h, c ? &c->rec : NULL);
	return holder_check(core, &h, caller);
}

int release_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
			  uint64_t identity, const char *event, const char *const *extra)
{
	char who[WHO_MAX], fence[24], pid[16];
	const char *kv[16] = { "fence", fence, "pid", pid };
	char *name = strdup(c->name);
	int n = 4, rc;

	if (!name)
		return -ENOMEM;
	who_of(who, sizeof(who), c->rec.slug, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, lockfs_holder_fence(&c->rec));
	snprintf(pid, sizeof(pid), "%d", (int)c->rec.holder.pid);
	for (; extra && *extra && n < 14; extra++)
		kv[n++] = *extra;
	kv[n] = NULL;
	/* Someone waits: the lock goes straight to them, the store never
	 * shows it free in between.  The lock never leaves DIR, so EVENT is
	 * logged after the waiter has its answer (still before its
	 * `acquired`). */
	if (queue_handoff_locked(core, s, c, identity, who, kv, event)) {
		free(name);
		return 0;
	}
	rc = core->be->ops->release(core->be, name, identity);
	if (rc < 0 && rc != -ENOENT) {
		/* The store refused (EIO, said by the backend): the lock is
		 * still held, so it stays cached and its holder watched, and
		 * nothing is logged.  A recovery is tried again at the next
		 * tick (holder_gone stays set); an rmdir gets the error. */
		free(name);
		return rc;
	}
	/* The line is written only for a release that happened (-ENOENT:
	 * someone removed the lock behind our back; nothing of ours to
	 * log), and before the stripe mutex is let go: NAME may be free in
	 * the store already, but nobody can be granted it through this
	 * daemon until then -- a hand-off or a grant to the queue runs under
	 * this mutex, and an acquisition logs its `acquired` only after it
	 * has taken this mutex (lockfs_core_acquire) -- so the log never
	 * shows two holders at once.  (A seed script's mkdir is not logged
	 * at all.) */
	if (rc == 0 && event)
		log_event(core, who, name, kv, event);
	cache_drop(core, s, name);
	queue_grant_locked(core, s, name);
	free(name);
	return rc;
}

int drop_holder_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
		       uint64_t identity, size_t i, const char *event,
		       const char *const *extra)
{
	struct lockfs_record *r = &c->rec;
	struct lockfs_entry_stat st = { .identity = identity };
	const struct lockfs_holder *h;
	char who[WHO_MAX], fence[24], pid[16];
	const char *kv[16] = { "fence", fence, "pid", pid };
	int n = 4, rc;

	if (holder_count(r) <= 1)
		return release_locked(core, s, c, identity, event, extra);
	h = i == 0 ? &r->holder : &r->shares[i - 1].holder;
	who_of(who, sizeof(who), i == 0 ? r->slug : r->shares[i - 1].slug, h->comm, h->pid);
	snprintf(fence, sizeof(fence), "%" PRIu64,
		 i == 0 ? lockfs_holder_fence(r) : r->shares[i - 1].fence);
	snprintf(pid, sizeof(pid), "%d", (int)h->pid);
	for (; extra && *extra && n < 14; extra++)
		kv[n++] = *extra;
	kv[n] = NULL;
	if (i == 0) {
		/* The next holder moves up; the lock (its fence, its time)
		 * stays what it was. */
		cache_unwatch(core, c);
		lockfs_holder_clear(&r->holder);
		r->holder = r->shares[0].holder;
		r->holder_fence = r->shares[0].fence;
		r->holder_acquired_at_ms = r->shares[0].acquired_at_ms;
		r->bound = r->shares[0].bound;
		memcpy(r->fd_owner, r->shares[0].fd_owner, sizeof(r->fd_owner));
		free(r->slug);
		r->slug = r->shares[0].slug;
		c->holder_gone = false;
		i = 1;
	} else {
		lockfs_holder_clear(&r->shares[i - 1].holder);
		free(r->shares[i - 1].slug);
	}
	memmove(&r->shares[i - 1], &r->shares[i], (r->nshares - i) * sizeof(*r->shares));
	if (--r->nshares == 0) {
		free(r->shares);
		r->shares = NULL;
	}
	rc = persist_locked(core, s, c, &st);
	if (rc == 0) {
		/* Logged once the store no longer lists this holder, under
		 * the stripe mutex (see release_locked). */
		if (event)
			log_event(core, who, c->name, kv, event);
		cache_watch(core, c, -1);
		queue_grant_locked(core, s, c->name);
	}
	return rc;
}

int lockfs_core_release(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	/* Release only what the record in the store says: the cached copy
	 * counts only while the record file's identity (inode, times, size)
	 * is unchanged, else it is read and parsed again. */
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	if (rc < 0)
		goto out;
	if (c && strcmp(c->issued, c->rec.token) != 0) {
		/* The record is not the one we issued: someone rewrote the
		 * store behind our back.  Fail closed: keep it, say so. */
		stripe_unlock(s);
		log_denied(core, name, caller, "token-mismatch");
		return -EPERM;
	}
	/* A shared lock: the caller lets go of the first share it holds. */
	{
		size_t i = 0, n = c ? holder_count(&c->rec) : 0;
		struct holder_ref h;

		rc = -EPERM;
		do {
			holder_ref_at(&h, c ? &c->rec : NULL, i);
			rc = holder_check(core, &h, caller);
		} while (rc == -EPERM && ++i < n);
		if (rc < 0) {
			stripe_unlock(s);
			log_denied(core, name, caller, foreign ? "foreign-lock" :
				   rc == -EPERM ? "not-holder" : "caller-unknown");
			return rc;
		}
		/* Also a grant whose descriptor let go while the store
		 * refused (retry_pending_locked): nothing was logged for it
		 * then, so this is its `released`. */
		rc = drop_holder_locked(core, s, c, st.identity, i, "released", NULL);
	}
out:
	stripe_unlock(s);
	return rc;
}

/*
 * Run VIEW on NAME's record (C is NULL for a foreign lock) with the stripe
 * mutex held: the shape of every read-only request.  Returns VIEW's
 * result, -ENOENT when not held, -errno.
 */
int with_record(struct lockfs_core *core, const char *name,
		int (*view)(const char *name, struct cached *c,
			    const struct lockfs_entry_stat *st, void *arg),
		void *arg)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	if (rc == 0)
		rc = view(name, c, &st, arg);
	stripe_unlock(s);
	return rc;
}

static int view_stat(const char *name, struct cached *c, const struct lockfs_entry_stat *st,
		     void *arg)
{
	fill_lock_stat(arg, c ? &c->rec : NULL, st);
	return 0;
}

int lockfs_core_stat(struct lockfs_core *core, const char *name, struct lockfs_lock_stat *out)
{
	return with_record(core, name, view_stat, out);
}

/* The `owner` view of a lock held without a record lockfs can read. */
static char *foreign_json(const char *name, const struct lockfs_entry_stat *st, size_t *len)
{
	char when[32];
	json_t *o = json_object();
	char *s;

	if (!o)
		return NULL;
	json_object_set_new(o, "resource", json_string(name));
	json_object_set_new(o, "holder", json_null());
	json_object_set_new(o, "acquired_at", json_string(lockfs_format_time(st->mtime_ms, when)));
	json_object_set_new(o, "acquired_at_ms", json_integer(st->mtime_ms));
	json_object_set_new(o, "operation", json_null());
	json_object_set_new(o, "slug", json_null());
	json_object_set_new(o, "lease", json_null());
	json_object_set_new(o, "fence", json_null());
	json_object_set_new(o, "foreign", json_true());
	s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(o);
	if (s) {
		size_t n = strlen(s);
		char *t = realloc(s, n + 2);

		if (!t) {
			free(s);
			return NULL;
		}
		t[n] = '\n';
		t[n + 1] = '\0';
		*len = n + 1;
		s = t;
	}
	return s;
}

/* Where a view puts its text. */
struct text_out {
	char **text;
	size_t *len;
	uid_t reader;
};

/* Copy TEXT (may be NULL) plus a newline into a malloc'd *OUT. */
static int line_of(const char *text, char **out, size_t *len)
{
	size_t n = text ? strlen(text) : 0;

	*out = malloc(n + 2);
	if (!*out)
		return -ENOMEM;
	memcpy(*out, text, n);
	(*out)[n] = '\n';
	(*out)[n + 1] = '\0';
	*len = n + 1;
	return 0;
}

static int view_owner(const char *name, struct cached *c, const struct lockfs_entry_stat *st,
		      void *arg)
{
	struct text_out *o = arg;
	int flags = LOCKFS_RECORD_PRETTY;

	if (!c) {
		*o->text = foreign_json(name, st, o->len);
	} else {
		if (o->reader == 0 || (c->rec.has_holder && o->reader == c->rec.holder.uid))
			flags |= LOCKFS_RECORD_WITH_TOKEN;
		*o->text = lockfs_record_encode(&c->rec, flags, o->len);
	}
	return *o->text ? 0 : -ENOMEM;
}

int lockfs_core_owner(struct lockfs_core *core, const char *name, uid_t reader,
		      char **json, size_t *len)
{
	struct text_out o = { json, len, reader };

	return with_record(core, name, view_owner, &o);
}

static int view_operation(const char *name, struct cached *c, const struct lockfs_entry_stat *st,
			  void *arg)
{
	struct text_out *o = arg;

	if (c && c->rec.operation)
		return line_of(c->rec.operation, o->text, o->len);
	*o->text = strdup("");
	*o->len = 0;
	return *o->text ? 0 : -ENOMEM;
}

int lockfs_core_operation(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct text_out o = { text, len, 0 };

	return with_record(core, name, view_operation, &o);
}

static int view_lease(const char *name, struct cached *c, const struct lockfs_entry_stat *st,
		      void *arg)
{
	struct text_out *o = arg;

	if (!c || !c->rec.lease.ttl_s)
		return line_of("null", o->text, o->len);
	*o->text = lockfs_lease_encode(&c->rec.lease, o->len);
	return *o->text ? 0 : -ENOMEM;
}

int lockfs_core_lease(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct text_out o = { text, len, 0 };

	return with_record(core, name, view_lease, &o);
}

int lockfs_core_check_holder(struct lockfs_core *core, const char *name,
			     const struct lockfs_caller *caller)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct holder_ref h;
	struct cached *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	if (rc == 0)
		holder_ref_of(&h, c ? &c->rec : NULL);
	stripe_unlock(s);
	return rc == 0 ? holder_check(core, &h, caller) : rc;
}

/*
 * The store refused C's edited record (RC): it still holds the record as
 * it was before the edit.  Read that back into the cache -- keeping the
 * token this daemon issued, and watching its holders again -- so that a
 * lock whose change failed stays held and watched as it was, never
 * unwatched until someone happens to look.  A lock gone from the store is
 * just dropped.  With s->mu held; C is freed.
 */
static void restore_locked(struct lockfs_core *core, struct stripe *s, struct cached *c, int rc)
{
	char issued[sizeof(c->issued)], *name = strdup(c->name);
	bool expired_logged = c->expired_logged, rebound = c->rebound;
	struct lockfs_entry_stat st;
	bool foreign;

	memcpy(issued, c->issued, sizeof(issued));
	cache_drop(core, s, c->name);
	if (name && rc != -ENOENT &&
	    load_locked(core, s, name, &st, &foreign, true, &c) == 0 && c) {
		memcpy(c->issued, issued, sizeof(issued));
		c->expired_logged = expired_logged;
		c->rebound = rebound;
	}
	free(name);
}

/* Write C's record back to the store and follow its new identity.  Called
 * with the stripe mutex held.  0 or -errno (then C is gone: the entry is
 * read back from the store as it was, see restore_locked). */
int persist_locked(struct lockfs_core *core, struct stripe *s, struct cached *c,
		   struct lockfs_entry_stat *st)
{
	size_t len;
	char *json = lockfs_record_encode(&c->rec, LOCKFS_RECORD_WITH_TOKEN, &len);
	int rc;

	if (!json)
		return -ENOMEM;
	rc = core->be->ops->update(core->be, c->name, st->identity, json, len, st);
	free(json);
	if (rc == 0)
		c->identity = st->identity;
	else
		restore_locked(core, s, c, rc);
	return rc;
}

/*
 * Run EDIT on NAME's fresh cache entry if CALLER may act as its holder,
 * then write the record back.  EDIT returns 0 or -errno and may leave the
 * record unchanged by returning 1 (nothing to write).
 */
static int edit_as_holder(struct lockfs_core *core, const char *name,
			  const struct lockfs_caller *caller,
			  int (*edit)(struct lockfs_core *, struct cached *, void *), void *arg)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	if (rc == 0)
		rc = holder_check_entry(core, c, caller);
	if (rc == 0)
		rc = edit(core, c, arg);
	if (rc == 0)
		rc = persist_locked(core, s, c, &st);
	stripe_unlock(s);
	return rc == 1 ? 0 : rc;
}

struct text_arg {
	const char *text;
	size_t len;
};

static int edit_operation(struct lockfs_core *core, struct cached *c, void *arg)
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
			      const struct lockfs_caller *caller,
			      const char *text, size_t len)
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

static int edit_lease(struct lockfs_core *core, struct cached *c, void *arg)
{
	uint32_t ttl = *(uint32_t *)arg;

	if (ttl == 0 && c->rec.bound == LOCKFS_BOUND_SLUG)
		return -EINVAL; /* a slug lock's lease is its only liveness */
	lease_start(&c->rec.lease, ttl);
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
	if (errno || *end || v > 10 * 365 * 24 * 3600ull)
		return -EINVAL;
	{
		uint32_t ttl = (uint32_t)v;

		return edit_as_holder(core, name, caller, edit_lease, &ttl);
	}
}

static int edit_renew(struct lockfs_core *core, struct cached *c, void *arg)
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

struct name_list {
	char **names;
	size_t count, cap;
	int err;
};

static int collect_name(void *arg, const char *name)
{
	struct name_list *l = arg;

	if (lockfs_name_check(name) < 0)
		return 0; /* DIR/x.lock whose x no mount could name */
	if (l->count + 2 > l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		char **n = realloc(l->names, cap * sizeof(*n));

		if (!n) {
			l->err = -ENOMEM;
			return 1;
		}
		l->names = n;
		l->cap = cap;
	}
	l->names[l->count] = strdup(name);
	if (!l->names[l->count]) {
		l->err = -ENOMEM;
		return 1;
	}
	l->names[++l->count] = NULL;
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void lockfs_names_free(char **names)
{
	if (!names)
		return;
	for (char **p = names; *p; p++)
		free(*p);
	free(names);
}

/* Hand L's names out sorted and without repeats (or free them on RC < 0). */
static int list_done(struct name_list *l, int rc, char ***names, size_t *count)
{
	size_t out = 0;

	if (rc == 0)
		rc = l->err;
	if (rc == 0 && !l->names && !(l->names = calloc(1, sizeof(char *))))
		rc = -ENOMEM;
	if (rc < 0) {
		lockfs_names_free(l->names);
		return rc;
	}
	qsort(l->names, l->count, sizeof(char *), cmp_names);
	for (size_t i = 0; i < l->count; i++) {
		if (out > 0 && strcmp(l->names[out - 1], l->names[i]) == 0)
			free(l->names[i]);
		else
			l->names[out++] = l->names[i];
	}
	l->names[out] = NULL;
	*names = l->names;
	*count = out;
	return 0;
}

int lockfs_core_list(struct lockfs_core *core, char ***names, size_t *count)
{
	struct name_list l = { 0 };

	return list_done(&l, core->be->ops->list(core->be, collect_name, &l), names, count);
}

int lockfs_core_list_flock(struct lockfs_core *core, char ***names, size_t *count)
{
	struct name_list l = { 0 };
	int rc = core->be->ops->list(core->be, collect_name, &l);

	/* Held names, and names that only have waiters (behind nothing we
	 * could read yet, or in between). */
	for (int i = 0; rc == 0 && !l.err && i < STRIPES; i++) {
		struct stripe *s = &core->stripes[i];

		pthread_mutex_lock(&s->mu);
		for (struct lockq *q = s->queues; q && !l.err; q = q->next)
			if (q->nactive)
				collect_name(&l, q->name);
		pthread_mutex_unlock(&s->mu);
	}
	return list_done(&l, rc, names, count);
}

int lockfs_core_log_open_ro(struct lockfs_core *core)
{
	/* O_NONBLOCK: a FIFO planted as the log must not hang the reader. */
	int fd = openat(core->dirfd, core->log_name,
			O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);

	return fd < 0 ? -errno : fd;
}

void lockfs_core_set_removed(struct lockfs_core *core, lockfs_removed_fn fn, void *arg)
{
	core->removed = fn;
	core->removed_arg = arg;
}

void lockfs_core_set_mount_dev(struct lockfs_core *core, dev_t dev)
{
	core->mount_dev = dev;
}

int lockfs_core_open(struct lockfs_core **out, const struct lockfs_core_config *cfg)
{
	struct lockfs_core *core = calloc(1, sizeof(*core));
	int rc;

	if (!core)
		return -ENOMEM;
	for (int i = 0; i < STRIPES; i++)
		pthread_mutex_init(&core->stripes[i].mu, NULL);
	pthread_mutex_init(&core->users_mu, NULL);
	core->dirfd = cfg->dirfd;
	core->procs = cfg->procs ? cfg->procs : &lockfs_proc_real;
	core->default_lease_s = cfg->lease_s ? cfg->lease_s : DEFAULT_LEASE_S;
	core->stale_s = cfg->stale_s;
	core->break_signal = cfg->break_signal;
	core->log_name = strdup(cfg->log_name ? cfg->log_name : "lock.log");
	if (!core->log_name) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = lockfs_helpers_parse(&core->helpers, cfg->helpers ? cfg->helpers : LOCKFS_DEFAULT_HELPERS);
	if (rc < 0)
		goto fail;
	if (gethostname(core->host, sizeof(core->host) - 1) < 0)
		strcpy(core->host, "localhost");
	rc = lockfs_boot_id(core->boot_id);
	if (rc < 0)
		goto fail;
	rc = lockfs_fence_open(&core->fence, cfg->dirfd, cfg->fence_path ? cfg->fence_path : ".fence");
	if (rc < 0)
		goto fail;
	rc = lockfs_log_open(&core->log, cfg->dirfd, core->log_name);
	if (rc < 0)
		goto fail;
	rc = lockfs_liveness_new(&core->liveness, recovery_holder_exited, recovery_tick,
				 core, TICK_MS);
	if (rc < 0)
		goto fail;
	core->be = cfg->backend;
	rc = recovery_startup_scan(core);
	if (rc < 0) {
		core->be = NULL; /* the caller still owns it on failure */
		goto fail;
	}
	*out = core;
	return 0;
fail:
	lockfs_core_close(core);
	return rc;
}

int lockfs_core_start(struct lockfs_core *core)
{
	return lockfs_liveness_run(core->liveness);
}

void lockfs_core_stop(struct lockfs_core *core)
{
	if (!core)
		return;
	lockfs_liveness_stop(core->liveness);
	/* Releases the store refused get one last try while the mount can
	 * still be told; what is left stays in DIR (see queue_free_all). */
	queue_retry_all(core);
}

void lockfs_core_close(struct lockfs_core *core)
{
	if (!core)
		return;
	/* The thread first: it calls into everything below. */
	lockfs_liveness_stop(core->liveness);
	for (int i = 0; i < STRIPES; i++) {
		while (core->stripes[i].head) {
			struct cached *c = core->stripes[i].head;

			cache_drop(core, &core->stripes[i], c->name);
		}
		queue_free_all(&core->stripes[i]);
		pthread_mutex_destroy(&core->stripes[i].mu);
	}
	lockfs_liveness_free(core->liveness);
	for (size_t i = 0; i < core->nusers; i++)
		free(core->users[i].name);
	free(core->users);
	pthread_mutex_destroy(&core->users_mu);
	if (core->be)
		core->be->ops->destroy(core->be);
	lockfs_log_close(core->log);
	lockfs_fence_close(core->fence);
	lockfs_helpers_free(&core->helpers);
	free(core->log_name);
	free(core);
}
