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
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"
#include "base/clock.h"
#include "lock/table.h"

#define CMDLINE_MAX 4096
#define DEFAULT_LEASE_S 600
/* Quota defaults (docs/quota.md says why).  A lock costs DIR up to
 * LOCK_BYTES (its record file: two pages with a 4 KiB command line) and
 * two inodes, and the daemon about 5 KiB. */
#define DEFAULT_LOCKS_PER_UID 1024
#define DEFAULT_WAITERS_PER_UID 1024
#define DEFAULT_OPEN_PER_UID 1024
#define DEFAULT_LOCKS_MAX 16384
#define DEFAULT_LOCKS_MIN 64
#define LOCK_BYTES 8192
#define LOCK_INODES 2
/* How often the liveness thread looks at leases and holders. */
#define TICK_MS 50

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

bool descendants_keep(const struct lockfs_record *rec)
{
	return rec->bound == LOCKFS_BOUND_PROCESS && rec->mode == LOCKFS_EXCLUSIVE &&
	       rec->nshares == 0 && rec->has_holder;
}

void cache_account(struct lockfs_core *core, const struct cached *c, int sign)
{
	const struct lockfs_record *r = &c->rec;

	if (!r->has_holder || !core->quota)
		return;
	quota_locks_add(core->quota, r->holder.uid, sign);
	for (size_t i = 0; i < r->nshares; i++)
		quota_locks_add(core->quota, r->shares[i].holder.uid, sign);
}

static size_t holder_bucket(pid_t pid)
{
	return (size_t)(unsigned)pid % HOLDER_BUCKETS;
}

/* C's holder is watched: C joins the index.  With its stripe mutex held. */
static void holder_index_add(struct lockfs_core *core, struct cached *c)
{
	struct cached **head = &core->holders.buckets[holder_bucket(c->rec.holder.pid)];

	pthread_mutex_lock(&core->holders.mu);
	c->hpid = c->rec.holder.pid;
	c->hstart = c->rec.holder.start_time;
	c->huid = c->rec.holder.uid;
	c->hprev = NULL;
	c->hnext = *head;
	if (*head)
		(*head)->hprev = c;
	*head = c;
	c->indexed = true;
	pthread_mutex_unlock(&core->holders.mu);
}

/* Called with core->holders.mu held. */
static void holder_unlink(struct lockfs_core *core, struct cached *c)
{
	if (!c->indexed)
		return;
	if (c->hprev)
		c->hprev->hnext = c->hnext;
	else
		core->holders.buckets[holder_bucket(c->hpid)] = c->hnext;
	if (c->hnext)
		c->hnext->hprev = c->hprev;
	c->hnext = c->hprev = NULL;
	c->indexed = false;
}

static void holder_index_del(struct lockfs_core *core, struct cached *c)
{
	pthread_mutex_lock(&core->holders.mu);
	holder_unlink(core, c);
	pthread_mutex_unlock(&core->holders.mu);
}

bool holder_uid(struct lockfs_core *core, pid_t pid, unsigned long long start, uid_t *uid)
{
	bool found = false;

	pthread_mutex_lock(&core->holders.mu);
	for (struct cached *c = core->holders.buckets[holder_bucket(pid)]; c && !found;
	     c = c->hnext) {
		if (c->hpid == pid && c->hstart == start) {
			*uid = c->huid;
			found = true;
		}
	}
	pthread_mutex_unlock(&core->holders.mu);
	return found;
}

int holder_take(struct lockfs_core *core, pid_t pid, unsigned long long start, size_t max,
		char ***names, size_t *count)
{
	char **v = malloc(max * sizeof(*v));
	size_t n = 0;
	int rc = v ? 0 : -ENOMEM;

	pthread_mutex_lock(&core->holders.mu);
	for (struct cached *c = core->holders.buckets[holder_bucket(pid)], *next;
	     c && v && n < max; c = next) {
		next = c->hnext;
		if (c->hpid != pid || c->hstart != start)
			continue;
		/* The name never changes while C lives, and C cannot be
		 * freed while it is in the index, which needs this mutex. */
		v[n] = strdup(c->name);
		if (!v[n]) {
			rc = -ENOMEM;
			break;
		}
		n++;
		holder_unlink(core, c);
	}
	pthread_mutex_unlock(&core->holders.mu);
	*names = v;
	*count = n;
	return rc;
}

/* When collect() must look at C next (boot ms): now (0) for a dead
 * holder's lock not queued yet, a process-bound lock not watched, or a
 * lock kept for its dead holder's descendants (each tick counts them);
 * else the earlier of its lease's deadline and, for an fd lock rebound at
 * startup, its next look for the old descriptor; INT64_MAX for never. */
static int64_t entry_due(const struct cached *c)
{
	const struct lockfs_lease *l = &c->rec.lease;
	int64_t due = INT64_MAX;

	if (c->queued)
		return INT64_MAX; /* recovery.c has it */
	if (c->holder_gone ||
	    (c->rec.bound == LOCKFS_BOUND_PROCESS && c->rec.has_holder && !c->watched) ||
	    (c->rec.holder_exited && descendants_keep(&c->rec)))
		return 0;
	if (l->ttl_s && c->rec.bound == LOCKFS_BOUND_PROCESS && !c->expired_logged)
		due = l->deadline_boot_ms;
	else if (l->ttl_s && c->rec.bound == LOCKFS_BOUND_SLUG)
		due = l->deadline_boot_ms > c->next_check_boot_ms ? l->deadline_boot_ms
								  : c->next_check_boot_ms;
	if (c->rebound && c->next_rebound_boot_ms < due)
		due = c->next_rebound_boot_ms;
	return due;
}

void stripe_note_due(struct stripe *s, const struct cached *c)
{
	int64_t due = entry_due(c);

	if (due < s->due_boot_ms)
		s->due_boot_ms = due;
}

void stripe_set_due(struct stripe *s)
{
	int64_t due = INT64_MAX;

	for (struct cached *c = s->head; c; c = c->next) {
		int64_t d = entry_due(c);

		if (d < due)
			due = d;
	}
	s->due_boot_ms = due;
}

/* Stop watching C's holder, if we were.  Called with the stripe mutex held. */
void cache_unwatch(struct lockfs_core *core, struct cached *c)
{
	if (c->watched) {
		holder_index_del(core, c);
		lockfs_liveness_unwatch(core->liveness, c->rec.holder.pid, c->rec.holder.start_time);
	}
	if (c->desc_watched)
		lockfs_descendants_unwatch(core->descendants, c->rec.holder.pid,
					   c->rec.holder.start_time);
	c->watched = false;
	c->desc_watched = false;
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
		stripe_note_due(stripe_of(core, c->name), c);
		return;
	}
	rc = pidfd >= 0 ? lockfs_liveness_watch_fd(core->liveness, c->rec.holder.pid,
						   c->rec.holder.start_time, pidfd)
			: lockfs_liveness_watch(core->liveness, c->rec.holder.pid,
						c->rec.holder.start_time);
	if (rc == 0) {
		c->watched = true;
		holder_index_add(core, c);
		/* From now on what it starts keeps its lock after it exits.  At
		 * daemon start, what it started before is found by a scan; so
		 * it is when an earlier watch failed (the tick's re-watch), as
		 * its forks since then were not told.  No memory: a scan looks
		 * when it exits. */
		if (descendants_keep(&c->rec))
			c->desc_watched = lockfs_descendants_watch(core->descendants,
								   c->rec.holder.pid,
								   c->rec.holder.start_time,
								   c->rec.holder_session,
								   core->starting ||
								   c->watch_failed) == 0;
		c->watch_failed = false;
	} else if (rc == -ESRCH) {
		c->holder_gone = true;
	} else {
		c->watch_failed = true;
	}
	/* Any other failure (no memory: a holder without a pidfd is polled,
	 * see liveness.h) leaves the lock held and unwatched, and the tick
	 * tries again: fail closed, never release on a guess. */
	stripe_note_due(stripe_of(core, c->name), c);
}

void cache_drop(struct lockfs_core *core, struct stripe *s, const char *name)
{
	for (struct cached **pp = &s->head; *pp; pp = &(*pp)->next) {
		struct cached *c = *pp;

		if (strcmp(c->name, name) == 0) {
			*pp = c->next;
			cache_unwatch(core, c);
			cache_account(core, c, -1);
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
		c->queued = false; /* a todo for the old one finds its token gone */
		c->rebound = false;
		c->next_rebound_boot_ms = 0;
		c->unlogged = false;
		c->next_check_boot_ms = 0;
		c->watch_failed = false;
		c->desc_version = 0;
		c->next_persist_boot_ms = 0;
	}
	cache_account(core, c, -1);
	lockfs_record_clear(&c->rec);
	c->identity = identity;
	c->rec = *rec;
	memset(rec, 0, sizeof(*rec));
	cache_account(core, c, 1);
	for (size_t i = 0; i < c->rec.nshares; i++)
		if (c->rec.shares[i].bound == LOCKFS_BOUND_PROCESS)
			s->process_shares = true;
	cache_watch(core, c, pidfd); /* and notes when the tick must look at it */
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

void ids_of(char uid[16], char pid[16], uid_t u, pid_t p)
{
	snprintf(uid, 16, "%u", (unsigned)u);
	if (p > 0)
		snprintf(pid, 16, "%d", (int)p);
	else
		pid[0] = '\0'; /* logged as "-": not known */
}

void log_event(struct lockfs_core *core, const char *who, const char *name,
	       const char *const *kv, const char *event)
{
	/* A line that cannot be written now is kept and goes out later
	 * (core/base/log.c says so on stderr once): the event happens anyway. */
	(void)lockfs_log_event_or_keep(core->log, who, name, kv, event);
}

int log_acquired(struct lockfs_core *core, const char *who, const char *name,
		 const char *const *kv)
{
	int rc = lockfs_log_event(core->log, who, name, kv, "acquired");

	/* The caller is told why it got no lock: a full log (ENOSPC, EDQUOT,
	 * EFBIG) as such; anything else the write met in DIR as EIO, so that
	 * no errno of DIR reads as an answer about the lock (an EPERM as "not
	 * yours": see backend.h). */
	if (rc < 0 && rc != -ENOSPC && rc != -EDQUOT && rc != -EFBIG && rc != -ENOMEM)
		rc = -EIO;
	return rc;
}

void log_refusal(struct lockfs_core *core, const struct lockfs_caller *caller, pid_t pid,
		 const char *who, const char *name, const char *reason)
{
	lockfs_log_denied(core->log, caller->uid, pid, who, name, reason);
}

void quota_refuse(struct lockfs_core *core, uid_t uid, enum quota_reason reason,
		  const char *name, const char *who, pid_t pid)
{
	char buf[WHO_MAX];

	if (!quota_refused(core->quota, uid, reason, name))
		return;
	if (!who) {
		pid = who_of_caller(core, pid, buf, sizeof(buf));
		who = buf;
	}
	quota_burst_who(core->quota, uid, reason, who, pid);
}

void log_refused(void *arg, const struct quota_burst *b)
{
	struct lockfs_core *core = arg;
	char uid[16], pid[16], limit[16], count[24];
	const char *kv[] = { "uid", uid, "pid", pid, "reason", quota_reason_name(b->reason),
			     "count", count, "limit", limit, NULL };

	/* uid= is the kernel's word for the refused caller; pid= the
	 * process of the burst's first refusal. */
	ids_of(uid, pid, b->uid, b->pid);
	snprintf(count, sizeof(count), "%" PRIu64, b->count);
	snprintf(limit, sizeof(limit), "%u", (unsigned)b->limit);
	if (b->limit == QUOTA_NONE)
		kv[8] = NULL; /* the fd reserve has no cap of its own */
	/* Kept and written later when the log cannot take it now: the
	 * refusals happened, whatever the disk says. */
	log_event(core, b->who[0] ? b->who : "?", b->name, kv, "refused");
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
 * is too long (LOCKFS_SLUG_MAX - 1 bytes at most), not UTF-8, or has a control
 * character: such a slug names nothing reliably. */
int caller_slug(const struct lockfs_proc_source *src, pid_t tid, char *buf, size_t size)
{
	int n = tid > 0 ? lockfs_procs_getenv(src, tid, "LOCKFS_SLUG", buf, size) : -ENOENT;

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

pid_t who_of_caller(struct lockfs_core *core, pid_t tid, char *buf, size_t size)
{
	struct lockfs_proc p;
	char slug[LOCKFS_SLUG_MAX];
	bool resolved;

	(void)caller_slug(core->procs, tid, slug, sizeof(slug)); /* a bad slug reads as none */
	/* Resolved even behind a slug: the line's pid= is the process's,
	 * whatever name its environment gives it. */
	resolved = tid > 0 && lockfs_holder_resolve(core->procs, tid, LOCKFS_UID_UNKNOWN,
						    &core->helpers, 0, &p) == 0;
	if (resolved && !*slug)
		who_of(buf, size, NULL, p.comm, p.pid);
	else
		who_of(buf, size, slug, "?", tid);
	return resolved ? p.pid : tid;
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
	h->ns_pid = p->ns_pid;
	if (p->container[0])
		h->container = strdup(p->container);
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
	} else if (lockfs_procs_cmdline(core->procs, p->pid, CMDLINE_MAX, &h->cmdline) < 0) {
		h->cmdline = calloc(1, sizeof(char *));
	}
	if (!h->comm || !h->host || !h->boot_id || !h->cmdline ||
	    (p->container[0] && !h->container)) {
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
	rec->holder_session = p->sid;
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

/*
 * Take back NAME's acquisition (store identity IDENTITY) whose `acquired`
 * line could not be written (ERR): no lock is held that the log does not
 * show.  If the store refuses, it stays held by its holder, watched like
 * any other (fail closed), and we say so; its end is not logged either
 * (the log never showed this holder).  With s->mu held.
 */
static void undo_acquire_locked(struct lockfs_core *core, struct stripe *s, const char *name,
				uint64_t identity, int err)
{
	int rc = core->be->ops->release(core->be, name, identity);

	if (rc < 0 && rc != -ENOENT) {
		struct cached *c = cache_find(s, name);

		if (c)
			c->unlogged = true;
		fprintf(stderr, "lockfs: %s: the log refused its acquisition (%s), and taking it "
			"back failed (%s): it stays with its holder until that exits\n",
			name, strerror(-err), strerror(-rc));
		return;
	}
	cache_drop(core, s, name);
	/* A waiter that came meanwhile is tried now (and told the same). */
	queue_grant_locked(core, s, name);
}

int lockfs_core_acquire(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller, struct lockfs_lock_stat *out)
{
	struct lockfs_entry_stat st;
	struct lockfs_record rec;
	struct lockfs_proc holder;
	char slug[LOCKFS_SLUG_MAX], who[WHO_MAX], fence[24], uid[16], pid[16];
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
	if (caller_slug(core->procs, caller->tid, slug, sizeof(slug)) < 0) {
		who_of(who, sizeof(who), NULL, "?", caller->tid);
		log_refusal(core, caller, caller->tid, who, name, "bad-slug");
		return -EINVAL;
	}
	/* With a pidfd opened before the holder's facts were read, watching
	 * it needs no second look at /proc -- unless the caller is watched
	 * already (a process that takes locks again and again), when the
	 * watch is simply shared. */
	rc = lockfs_holder_resolve(core->procs, caller->tid, caller->uid, &core->helpers,
				   LOCKFS_PROC_NS |
				   (lockfs_liveness_watches_pid(core->liveness, caller->tid)
				    ? 0 : LOCKFS_PROC_PIDFD), &holder);
	/* A helper that stops the walk at a uid boundary (`setpriv --reuid=U
	 * mkdir`) would hold the lock only until it exits, at once: nobody
	 * believable holds it.  A slug lock is (uid, slug)'s, not a process's. */
	if (rc == 0 && holder.at_uid_boundary && !*slug) {
		lockfs_proc_put(&holder);
		rc = -EACCES;
	}
	if (rc < 0) {
		if (rc == -EACCES) {
			who_of(who, sizeof(who), slug, "?", caller->tid);
			log_refusal(core, caller, caller->tid, who, name, "holder-unknown");
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
	/* Room for one more lock of the uid it will count against, kept
	 * until the cache counts it (or the store refuses). */
	{
		enum quota_reason why;

		rc = quota_lock_reserve(core->quota, holder.uid, true, &why);
		if (rc < 0) {
			who_of(who, sizeof(who), slug, holder.comm, holder.pid);
			quota_refuse(core, holder.uid, why, name, who, holder.pid);
			lockfs_proc_put(&holder);
			return rc;
		}
	}
	rc = build_record(core, name, &holder, slug, &rec, NULL);
	if (rc < 0)
		goto unreserve;
	json = lockfs_record_encode(&rec, LOCKFS_RECORD_WITH_TOKEN, &len);
	if (!json) {
		lockfs_record_clear(&rec);
		rc = -ENOMEM;
		goto unreserve;
	}
	rc = core->be->ops->acquire(core->be, name, json, len, &st);
	free(json);
	if (rc < 0) {
		lockfs_record_clear(&rec);
		goto unreserve;
	}

	fill_lock_stat(out, &rec, &st);
	who_of(who, sizeof(who), rec.slug, rec.holder.comm, rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, rec.fence);
	ids_of(uid, pid, rec.holder.uid, rec.holder.pid);
	/* The line under the stripe mutex: nothing can end this
	 * acquisition before its `acquired` is written, or see it if that
	 * write fails and it is taken back.  And only after taking it: a
	 * release of NAME that made room for this acquisition writes its
	 * line before it lets the mutex go (release_locked), so the log
	 * never shows two holders at once. */
	pthread_mutex_lock(&s->mu);
	cache_put(core, s, name, st.identity, &rec, holder.has_pidfd ? holder.pidfd : -1, true);
	{
		const char *kv[] = { "fence", fence, "uid", uid, "pid", pid, NULL };

		rc = log_acquired(core, who, name, kv);
	}
	if (rc < 0)
		undo_acquire_locked(core, s, name, st.identity, rc);
	stripe_unlock(s);
	quota_lock_unreserve(core->quota, holder.uid, true);
	lockfs_record_clear(&rec);
	return rc;
unreserve:
	quota_lock_unreserve(core->quota, holder.uid, true);
	lockfs_proc_put(&holder);
	return rc;
}

/* Log a refused request: WHO is the caller (resolved like a holder). */
static void log_denied(struct lockfs_core *core, const char *name,
		       const struct lockfs_caller *caller, const char *reason)
{
	char who[WHO_MAX];
	pid_t pid = who_of_caller(core, caller->tid, who, sizeof(who));

	log_refusal(core, caller, pid, who, name, reason);
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
	char slug[LOCKFS_SLUG_MAX];
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
		char slug[LOCKFS_SLUG_MAX];

		if (caller->tid <= 0)
			return -EACCES;
		if (caller_slug(core->procs, caller->tid, slug, sizeof(slug)) < 0)
			return -EPERM;
		return caller->uid == h->uid && *slug && strcmp(slug, h->slug) == 0 ? 0 : -EPERM;
	}
	if (strcmp(h->boot_id, core->boot_id) != 0)
		return -EPERM; /* held by a process of an earlier boot */
	rc = lockfs_holder_may_release(core->procs, caller->tid, h->pid, h->start,
				       lockfs_liveness_alive(core->liveness, h->pid, h->start));
	if (rc == -EPERM && h->bound == LOCKFS_BOUND_PROCESS) {
		/* A process the holder started while it held the lock acts for
		 * it wherever it was re-parented, also once the holder exited. */
		struct lockfs_proc me;

		if (core->procs->read_tid(core->procs->ctx, caller->tid, 0, &me) == 0 &&
		    lockfs_descendants_acts_for(core->descendants, h->pid, h->start, me.pid,
						me.start_time))
			rc = 0;
	}
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
	char who[WHO_MAX], fence[24], uid[16], pid[16];
	const char *kv[16] = { "fence", fence, "uid", uid, "pid", pid };
	char *name = strdup(c->name);
	int n = 6, rc;

	if (!name)
		return -ENOMEM;
	if (c->unlogged)
		event = NULL; /* its `acquired` is not in the log either */
	who_of(who, sizeof(who), c->rec.slug, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, lockfs_holder_fence(&c->rec));
	ids_of(uid, pid, c->rec.holder.uid, c->rec.holder.pid);
	for (; extra && *extra && n < 14; extra++)
		kv[n++] = *extra;
	kv[n] = NULL;
	/* Someone waits: the lock goes straight to them, the store never
	 * shows it free in between.  EVENT is logged there, then the
	 * waiter's `acquired`, both before the waiter has its answer. */
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
	char who[WHO_MAX], fence[24], uid[16], pid[16];
	const char *kv[16] = { "fence", fence, "uid", uid, "pid", pid };
	int n = 6, rc;

	if (holder_count(r) <= 1)
		return release_locked(core, s, c, identity, event, extra);
	h = i == 0 ? &r->holder : &r->shares[i - 1].holder;
	quota_locks_add(core->quota, h->uid, -1); /* before it leaves the record */
	who_of(who, sizeof(who), i == 0 ? r->slug : r->shares[i - 1].slug, h->comm, h->pid);
	snprintf(fence, sizeof(fence), "%" PRIu64,
		 i == 0 ? lockfs_holder_fence(r) : r->shares[i - 1].fence);
	ids_of(uid, pid, h->uid, h->pid);
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
		 * refused (struct unlock_retry): nothing was logged for it
		 * then, so this is its `released` -- unless it is a grant the
		 * log refused, which never showed in the log at all. */
		rc = drop_holder_locked(core, s, c, st.identity, i,
					release_event_locked(s, name, &c->rec, i), NULL);
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
	struct lockfs_core *core;
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

	/* For this reader: the token and command lines only for their own
	 * uid and root (privacy.md). */
	if (!c)
		*o->text = foreign_json(name, st, o->len);
	else {
		if (c->rec.holder_exited)
			descendants_refresh(o->core, c, NULL); /* the ones alive now */
		*o->text = lockfs_record_view(&c->rec, o->reader, o->len);
	}
	return *o->text ? 0 : -ENOMEM;
}

int lockfs_core_owner(struct lockfs_core *core, const char *name, uid_t reader,
		      char **json, size_t *len)
{
	struct text_out o = { json, len, reader, core };

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
	struct text_out o = { text, len, 0, core };

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
	struct text_out o = { text, len, 0, core };

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
 * unwatched until someone happens to look.  What the engine knows about
 * the acquisition beyond its record (a queued todo, a logged expiry, a
 * rebinding, the descendants list last written) stays too, and the
 * holder's descendants stay counted across the reload (an extra watch,
 * so that forks seen so far are not forgotten).  A lock gone from the
 * store is just dropped.  With s->mu held; C is freed.
 */
static void restore_locked(struct lockfs_core *core, struct stripe *s, struct cached *c, int rc)
{
	struct cached kept = *c; /* its flags, ids and token: no pointer of it is used */
	char *name = strdup(c->name);
	struct lockfs_entry_stat st;
	bool foreign, desc_held;

	desc_held = c->desc_watched &&
		    lockfs_descendants_watch(core->descendants, c->rec.holder.pid,
					     c->rec.holder.start_time, c->rec.holder_session,
					     false) == 0;
	cache_drop(core, s, c->name);
	if (name && rc != -ENOENT &&
	    load_locked(core, s, name, &st, &foreign, true, &c) == 0 && c) {
		memcpy(c->issued, kept.issued, sizeof(c->issued));
		if (strcmp(c->rec.token, kept.rec.token) == 0) {
			c->expired_logged = kept.expired_logged;
			c->rebound = kept.rebound;
			c->queued = kept.queued;
			c->desc_version = kept.desc_version;
			c->next_persist_boot_ms = kept.next_persist_boot_ms;
			c->next_check_boot_ms = kept.next_check_boot_ms;
			c->next_rebound_boot_ms = kept.next_rebound_boot_ms;
			c->unlogged = kept.unlogged;
		}
	}
	if (desc_held)
		lockfs_descendants_unwatch(core->descendants, kept.rec.holder.pid,
					   kept.rec.holder.start_time);
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
	if (rc == 0) {
		c->identity = st->identity;
		stripe_note_due(s, c); /* a lease may have been set or renewed */
	} else {
		restore_locked(core, s, c, rc);
	}
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
	if (errno || *end || v > LOCKFS_LEASE_MAX_S)
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
	return lockfs_log_open_ro(core->log);
}

void lockfs_core_log_reopen(struct lockfs_core *core)
{
	lockfs_log_request_reopen(core->log);
}

/* The descendants tracker, fed by the process-event connector unless
 * SCAN_ONLY or the kernel refuses it (then scans answer, and we say so
 * once).  0 or -errno. */
static int descendants_open(struct lockfs_core *core, bool scan_only)
{
	struct lockfs_event_source events;
	char why[160];

	if (!scan_only) {
		if (lockfs_procevents_open(&core->procevents, why, sizeof(why)) == 0)
			events = lockfs_procevents_source(core->procevents);
		else
			fprintf(stderr, "lockfs: warning: no process events (%s); a holder's "
				"descendants are found by scanning /proc for its session, which "
				"misses those that left it (docs/holder.md)\n", why);
	}
	return lockfs_descendants_new(&core->descendants, core->procevents ? &events : NULL, NULL);
}

/* A cap from the configuration: 0 is DEFAULT, LOCKFS_NO_LIMIT none. */
static uint32_t cap_of(uint32_t given, uint32_t dflt)
{
	return given == LOCKFS_NO_LIMIT ? QUOTA_NONE : given ? given : dflt;
}

/*
 * The default of -o max_locks: DEFAULT_LOCKS_MAX, but never more than a
 * quarter of DIR's file system at the largest cost of a lock, in bytes
 * and in inodes -- so that a small tmpfs (a /run of 10 % of a small
 * machine's memory) cannot be filled by locks either.
 */
static uint32_t default_max_locks(int dirfd)
{
	struct statvfs sv;
	uint64_t n = DEFAULT_LOCKS_MAX;

	if (dirfd >= 0 && fstatvfs(dirfd, &sv) == 0) {
		uint64_t by_bytes = (uint64_t)sv.f_blocks * sv.f_frsize / 4 / LOCK_BYTES;
		uint64_t by_inodes = (uint64_t)sv.f_files / 4 / LOCK_INODES;

		if (sv.f_blocks && by_bytes < n)
			n = by_bytes;
		if (sv.f_files && by_inodes < n) /* 0: no inode limit (btrfs) */
			n = by_inodes;
	}
	return n < DEFAULT_LOCKS_MIN ? DEFAULT_LOCKS_MIN : (uint32_t)n;
}

/* Make core->quota with CFG's caps.  The open-file cap's default depends
 * on the descriptor limit, known at lockfs_core_start.  0 or -ENOMEM. */
static int quota_open_limits(struct lockfs_core *core, const struct lockfs_core_config *cfg)
{
	struct quota_limits lim = {
		.open_per_uid = cap_of(cfg->max_open_per_uid, DEFAULT_OPEN_PER_UID),
		.locks_per_uid = cap_of(cfg->max_locks_per_uid, DEFAULT_LOCKS_PER_UID),
		.waiters_per_uid = cap_of(cfg->max_waiters_per_uid, DEFAULT_WAITERS_PER_UID),
		.locks = cfg->max_locks ? cap_of(cfg->max_locks, 0) : default_max_locks(cfg->dirfd),
	};

	core->open_cap_given = cfg->max_open_per_uid != 0;
	return quota_new(&core->quota, &lim);
}

int lockfs_core_handle_open(struct lockfs_core *core, const struct lockfs_caller *caller,
			    bool keeps_fd, const char *name)
{
	if (quota_open_add(core->quota, caller->uid) < 0) {
		quota_refuse(core, caller->uid, QUOTA_OPEN_PER_UID, name, NULL, caller->tid);
		return -EMFILE;
	}
	if (keeps_fd && !lockfs_fds_take(&core->fds, caller->uid == 0 ? LOCKFS_FD_PRIVILEGED
								    : LOCKFS_FD_CALLER)) {
		quota_open_sub(core->quota, caller->uid);
		quota_refuse(core, caller->uid, QUOTA_FD_RESERVE, name, NULL, caller->tid);
		return -EMFILE;
	}
	return 0;
}

void lockfs_core_handle_close(struct lockfs_core *core, uid_t uid, bool keeps_fd)
{
	quota_open_sub(core->quota, uid);
	if (keeps_fd)
		lockfs_fds_give(&core->fds);
}

void lockfs_core_set_mount_dev(struct lockfs_core *core, dev_t dev)
{
	core->mount_dev = dev;
}

int lockfs_core_open(struct lockfs_core **out, const struct lockfs_core_config *cfg)
{
	struct lockfs_core *core = calloc(1, sizeof(*core));
	int rc;

	if (!core) {
		lockfs_log_close(cfg->log);
		return -ENOMEM;
	}
	for (int i = 0; i < STRIPES; i++)
		pthread_mutex_init(&core->stripes[i].mu, NULL);
	pthread_mutex_init(&core->users_mu, NULL);
	pthread_mutex_init(&core->holders.mu, NULL);
	for (int i = 0; i < STRIPES; i++)
		core->stripes[i].due_boot_ms = INT64_MAX;
	lockfs_fds_init(&core->fds);
	core->dirfd = cfg->dirfd;
	core->procs = cfg->procs ? cfg->procs : &lockfs_proc_real;
	core->default_lease_s = cfg->lease_s ? cfg->lease_s : DEFAULT_LEASE_S;
	core->stale_s = cfg->stale_s;
	core->break_signal = cfg->break_signal;
	core->log = cfg->log;
	if (!core->log) {
		rc = -EINVAL;
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
	rc = quota_open_limits(core, cfg);
	if (rc < 0)
		goto fail;
	rc = recovery_init(core);
	if (rc < 0)
		goto fail;
	rc = lockfs_liveness_new(&core->liveness, recovery_holder_exited, recovery_tick,
				 core, TICK_MS);
	if (rc < 0)
		goto fail;
	rc = descendants_open(core, cfg->descendants_scan);
	if (rc < 0)
		goto fail;
	lockfs_liveness_set_fds(core->liveness, &core->fds);
	lockfs_liveness_set_work(core->liveness, recovery_work);
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
	/* The mount is made: what is open now is the daemon's own. */
	lockfs_fds_start(&core->fds);
	if (!core->open_cap_given) {
		long room = lockfs_fds_callers_max(&core->fds) / 4;

		quota_set_open_limit(core->quota, room < DEFAULT_OPEN_PER_UID ?
				     (uint32_t)(room > 0 ? room : 1) : DEFAULT_OPEN_PER_UID);
	}
	return lockfs_liveness_run(core->liveness);
}

void lockfs_core_stop(struct lockfs_core *core)
{
	if (!core)
		return;
	lockfs_liveness_stop(core->liveness);
	/* Releases the store refused get one last try before the daemon
	 * goes; what is left stays in DIR (see queue_free_all). */
	queue_retry_all(core);
	quota_flush(core->quota, true, log_refused, core);
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
	lockfs_descendants_free(core->descendants);
	lockfs_procevents_close(core->procevents);
	recovery_fini(core);
	quota_free(core->quota);
	pthread_mutex_destroy(&core->holders.mu);
	for (size_t i = 0; i < core->nusers; i++)
		free(core->users[i].name);
	free(core->users);
	pthread_mutex_destroy(&core->users_mu);
	if (core->be)
		core->be->ops->destroy(core->be);
	{
		size_t left = lockfs_log_close(core->log);

		if (left)
			fprintf(stderr, "lockfs: warning: %zu audit log line(s) could not be written "
				"to the log before exit; they went to syslog\n", left);
	}
	lockfs_fence_close(core->fence);
	lockfs_helpers_free(&core->helpers);
	free(core);
}
