/*
 * The lock engine: the one place that decides who may take, inspect,
 * annotate and release a lock.  See include/lockfs/core.h.
 *
 * Concurrency: operations on one name are serialised by that name's
 * stripe mutex (stripe->mu), which also protects the stripe's cache of
 * parsed records.  Acquisition itself needs no mutex (the backend's step
 * is indivisible); it takes the stripe only to fill the cache.  Different
 * names proceed in parallel.
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

#include "lockfs/core.h"
#include "lockfs/log.h"
#include "lockfs/name.h"
#include "lockfs/record.h"
#include "fence.h"

#define STRIPES 256
#define CMDLINE_MAX 4096
#define SLUG_MAX 256

/* A parsed record of a held lock, valid while the store's identity is. */
struct cached {
	struct cached *next;
	char *name;
	uint64_t identity;
	struct lockfs_record rec;
};

struct stripe {
	pthread_mutex_t mu;
	struct cached *head; /* protected by mu */
};

struct uid_name {
	uid_t uid;
	char *name; /* NULL when the uid has no passwd entry */
};

struct lockfs_core {
	struct lockfs_backend *be;
	struct lockfs_log *log;
	struct lockfs_fence *fence;
	struct lockfs_helpers helpers;
	const struct lockfs_proc_source *procs;
	int dirfd;              /* borrowed */
	char *log_name;
	char host[256];
	char boot_id[40];
	struct stripe stripes[STRIPES];

	pthread_mutex_t users_mu;
	struct uid_name *users; /* protected by users_mu */
	size_t nusers;
};

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct stripe *stripe_of(struct lockfs_core *core, const char *name)
{
	uint32_t h = 2166136261u; /* FNV-1a */

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 16777619u;
	return &core->stripes[h % STRIPES];
}

/* Called with s->mu held. */
static struct cached *cache_find(struct stripe *s, const char *name)
{
	for (struct cached *c = s->head; c; c = c->next)
		if (strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

/* Called with s->mu held. */
static void cache_drop(struct stripe *s, const char *name)
{
	for (struct cached **pp = &s->head; *pp; pp = &(*pp)->next) {
		struct cached *c = *pp;

		if (strcmp(c->name, name) == 0) {
			*pp = c->next;
			lockfs_record_clear(&c->rec);
			free(c->name);
			free(c);
			return;
		}
	}
}

/* Take over REC as NAME's cached record.  Called with s->mu held.
 * On allocation failure REC is cleared and nothing is cached. */
static void cache_put(struct stripe *s, const char *name, uint64_t identity,
		      struct lockfs_record *rec)
{
	struct cached *c = cache_find(s, name);

	if (!c) {
		c = calloc(1, sizeof(*c));
		if (!c || !(c->name = strdup(name))) {
			free(c);
			lockfs_record_clear(rec);
			return;
		}
		c->next = s->head;
		s->head = c;
	} else {
		lockfs_record_clear(&c->rec);
	}
	c->identity = identity;
	c->rec = *rec;
	memset(rec, 0, sizeof(*rec));
}

/*
 * Find NAME's parsed record: from the cache when the store's identity still
 * matches (and FRESH is false), else read and parsed from the store and
 * cached.  Sets *C to the cache entry -- valid only while the stripe mutex
 * is held -- or to NULL with *FOREIGN set when NAME is held without a
 * record lockfs can read.  Called with s->mu held.
 * Returns 0, -ENOENT when not held, -errno.
 */
static int load_locked(struct lockfs_core *core, struct stripe *s, const char *name,
		       struct lockfs_entry_stat *st, bool *foreign, bool fresh,
		       struct cached **c)
{
	struct lockfs_record rec;
	char *buf = NULL;
	size_t len = 0;
	int rc;

	*c = NULL;
	*foreign = false;
	if (!fresh) {
		rc = core->be->ops->stat(core->be, name, st);
		if (rc < 0) {
			if (rc == -ENOENT)
				cache_drop(s, name);
			return rc;
		}
		*c = cache_find(s, name);
		if (*c && (*c)->identity == st->identity)
			return 0;
	}
	rc = core->be->ops->read(core->be, name, &buf, &len, st);
	if (rc < 0) {
		if (rc == -ENOENT)
			cache_drop(s, name);
		return rc;
	}
	if (!buf || lockfs_record_parse(buf, len, &rec) < 0 ||
	    strcmp(rec.resource, name) != 0) {
		/* Held, but not by a record we can read: a foreign lock. */
		if (buf)
			lockfs_record_clear(&rec);
		free(buf);
		cache_drop(s, name);
		*foreign = true;
		return 0;
	}
	free(buf);
	lockfs_fence_observe(core->fence, rec.fence);
	cache_put(s, name, st->identity, &rec);
	*c = cache_find(s, name);
	return *c ? 0 : -ENOMEM;
}

/* "comm[pid]" or the slug: who an event is about. */
static void who_of(char *buf, size_t size, const char *slug, const char *comm, pid_t pid)
{
	if (slug && *slug)
		snprintf(buf, size, "%s", slug);
	else
		snprintf(buf, size, "%s[%d]", comm && *comm ? comm : "?", (int)pid);
}

static void log_event(struct lockfs_core *core, const char *who, const char *name,
		      const char *const *kv, const char *event)
{
	int rc = lockfs_log_event(core->log, who, name, kv, event);

	if (rc < 0)
		fprintf(stderr, "lockfs: warning: audit log write failed: %s\n", strerror(-rc));
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

static int make_token(char out[LOCKFS_TOKEN_HEX + 1])
{
	unsigned char raw[LOCKFS_TOKEN_HEX / 2];
	size_t got = 0;

	while (got < sizeof(raw)) {
		ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		got += (size_t)n;
	}
	for (size_t i = 0; i < sizeof(raw); i++)
		snprintf(out + 2 * i, 3, "%02x", raw[i]);
	return 0;
}

/* The caller's LOCKFS_SLUG (its process's exec-time environment) into BUF;
 * "" when unset or unreadable. */
static void caller_slug(pid_t tid, char *buf, size_t size)
{
	if (lockfs_proc_getenv(tid, "LOCKFS_SLUG", buf, size) < 0)
		buf[0] = '\0';
}

/* Build the record for a new holder.  Returns 0 or -errno. */
static int build_record(struct lockfs_core *core, const char *name,
			const struct lockfs_proc *p, const char *slug,
			struct lockfs_record *rec)
{
	struct lockfs_holder *h = &rec->holder;
	int rc;

	memset(rec, 0, sizeof(*rec));
	rec->has_holder = true;
	h->pid = p->pid;
	h->start_time = p->start_time;
	h->uid = p->uid;
	h->gid = p->gid;
	h->user = user_name(core, p->uid);
	rec->resource = strdup(name);
	h->comm = strdup(p->comm);
	h->host = strdup(core->host);
	h->boot_id = strdup(core->boot_id);
	if (lockfs_proc_cmdline(p->pid, CMDLINE_MAX, &h->cmdline) < 0)
		h->cmdline = calloc(1, sizeof(char *));
	if (slug && *slug)
		rec->slug = strdup(slug);
	if (!rec->resource || !h->comm || !h->host || !h->boot_id || !h->cmdline ||
	    (slug && *slug && !rec->slug)) {
		rc = -ENOMEM;
		goto fail;
	}
	rec->acquired_at_ms = now_ms();
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
	char slug[SLUG_MAX], who[SLUG_MAX + 32], fence[24], pid[16];
	struct stripe *s;
	size_t len;
	char *json;
	int rc;

	rc = lockfs_name_check(name);
	if (rc < 0)
		return rc;
	/* No "is it free?" pre-check: the kernel looked NAME up just before
	 * sending MKDIR and answers EEXIST itself when it exists; the
	 * backend's indivisible step decides the rest. */
	rc = lockfs_holder_resolve(core->procs, caller->tid, &core->helpers, &holder);
	if (rc < 0) {
		if (rc == -EACCES) {
			char uid[16];
			const char *kv[] = { "uid", uid, "reason", "holder-unknown", NULL };

			snprintf(uid, sizeof(uid), "%u", (unsigned)caller->uid);
			caller_slug(caller->tid, slug, sizeof(slug));
			who_of(who, sizeof(who), slug, "?", caller->tid);
			log_event(core, who, name, kv, "denied");
		}
		/* A caller gone before we could read it gets no answer anyway. */
		return rc == -ESRCH ? -EACCES : rc;
	}
	if (!holder.have_ids) {
		/* The caller itself holds: its credentials came with the request. */
		holder.uid = caller->uid;
		holder.gid = caller->gid;
	}
	caller_slug(caller->tid, slug, sizeof(slug));
	rc = build_record(core, name, &holder, slug, &rec);
	if (rc < 0)
		return rc;
	json = lockfs_record_encode(&rec, LOCKFS_RECORD_WITH_TOKEN, &len);
	if (!json) {
		lockfs_record_clear(&rec);
		return -ENOMEM;
	}
	rc = core->be->ops->acquire(core->be, name, json, len);
	free(json);
	if (rc < 0) {
		lockfs_record_clear(&rec);
		return rc;
	}

	s = stripe_of(core, name);
	pthread_mutex_lock(&s->mu);
	rc = core->be->ops->stat(core->be, name, &st);
	if (rc == 0) {
		fill_lock_stat(out, &rec, &st);
		who_of(who, sizeof(who), rec.slug, rec.holder.comm, rec.holder.pid);
		snprintf(fence, sizeof(fence), "%" PRIu64, rec.fence);
		snprintf(pid, sizeof(pid), "%d", (int)rec.holder.pid);
		cache_put(s, name, st.identity, &rec);
	}
	pthread_mutex_unlock(&s->mu);
	lockfs_record_clear(&rec);
	if (rc < 0)
		return rc; /* vanished at once: only an outside hand does that */
	{
		const char *kv[] = { "fence", fence, "pid", pid, NULL };

		log_event(core, who, name, kv, "acquired");
	}
	return 0;
}

/* Log a refused release: WHO is the caller (resolved like a holder). */
static void log_denied(struct lockfs_core *core, const char *name,
		       const struct lockfs_caller *caller, const char *reason)
{
	struct lockfs_proc p;
	char slug[SLUG_MAX], who[SLUG_MAX + 32];
	const char *kv[] = { "reason", reason, NULL };

	caller_slug(caller->tid, slug, sizeof(slug));
	if (lockfs_holder_resolve(core->procs, caller->tid, &core->helpers, &p) == 0)
		who_of(who, sizeof(who), slug, p.comm, p.pid);
	else
		who_of(who, sizeof(who), slug, "?", caller->tid);
	log_event(core, who, name, kv, "denied");
}

/* May CALLER act as the holder of REC (NULL: a foreign lock)?
 * 0, -EPERM, -EACCES, -ESRCH. */
static int holder_check(struct lockfs_core *core, const struct lockfs_record *rec,
			const struct lockfs_caller *caller)
{
	if (!rec || !rec->has_holder)
		return -EPERM; /* nobody can prove they hold a foreign lock */
	if (strcmp(rec->holder.boot_id, core->boot_id) != 0)
		return -EPERM; /* held by a process of an earlier boot */
	return lockfs_holder_may_release(core->procs, caller->tid, rec->holder.pid,
					 rec->holder.start_time);
}

int lockfs_core_release(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	char who[SLUG_MAX + 32], fence[24], pid[16], issued[LOCKFS_TOKEN_HEX + 1] = "";
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	c = cache_find(s, name);
	if (c)
		memcpy(issued, c->rec.token, sizeof(issued));
	/* Fresh from the store: release only what the record there says. */
	rc = load_locked(core, s, name, &st, &foreign, true, &c);
	if (rc < 0)
		goto out;
	if (c && issued[0] && strcmp(issued, c->rec.token) != 0) {
		/* The record is not the one we issued: someone rewrote the
		 * store behind our back.  Fail closed: keep it, say so. */
		pthread_mutex_unlock(&s->mu);
		log_denied(core, name, caller, "token-mismatch");
		return -EPERM;
	}
	rc = holder_check(core, c ? &c->rec : NULL, caller);
	if (rc < 0) {
		pthread_mutex_unlock(&s->mu);
		log_denied(core, name, caller, foreign ? "foreign-lock" :
			   rc == -EPERM ? "not-holder" : "caller-unknown");
		return rc == -ESRCH ? -EPERM : rc;
	}
	who_of(who, sizeof(who), c->rec.slug, c->rec.holder.comm, c->rec.holder.pid);
	snprintf(fence, sizeof(fence), "%" PRIu64, c->rec.fence);
	snprintf(pid, sizeof(pid), "%d", (int)c->rec.holder.pid);
	{
		/* Logged before the lock leaves the store, so the log never
		 * shows two holders at once. */
		const char *kv[] = { "fence", fence, "pid", pid, NULL };

		log_event(core, who, name, kv, "released");
	}
	rc = core->be->ops->release(core->be, name, st.identity);
	cache_drop(s, name);
out:
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int lockfs_core_stat(struct lockfs_core *core, const char *name, struct lockfs_lock_stat *out)
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
		fill_lock_stat(out, c ? &c->rec : NULL, &st);
	pthread_mutex_unlock(&s->mu);
	return rc;
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

int lockfs_core_owner(struct lockfs_core *core, const char *name, uid_t reader,
		      char **json, size_t *len)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	bool foreign;
	int rc, flags = LOCKFS_RECORD_PRETTY;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	if (rc == 0 && !c) {
		*json = foreign_json(name, &st, len);
	} else if (rc == 0) {
		if (reader == 0 || (c->rec.has_holder && reader == c->rec.holder.uid))
			flags |= LOCKFS_RECORD_WITH_TOKEN;
		*json = lockfs_record_encode(&c->rec, flags, len);
	}
	pthread_mutex_unlock(&s->mu);
	if (rc < 0)
		return rc;
	return *json ? 0 : -ENOMEM;
}

int lockfs_core_operation(struct lockfs_core *core, const char *name, char **text, size_t *len)
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
	if (rc == 0 && c && c->rec.operation) {
		size_t n = strlen(c->rec.operation);

		*text = malloc(n + 2);
		if (*text) {
			memcpy(*text, c->rec.operation, n);
			(*text)[n] = '\n';
			(*text)[n + 1] = '\0';
			*len = n + 1;
		}
	} else if (rc == 0) {
		*text = strdup("");
		*len = 0;
	}
	pthread_mutex_unlock(&s->mu);
	if (rc < 0)
		return rc;
	return *text ? 0 : -ENOMEM;
}

int lockfs_core_check_holder(struct lockfs_core *core, const char *name,
			     const struct lockfs_caller *caller)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct lockfs_record copy = { 0 };
	struct cached *c;
	bool foreign;
	int rc;

	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, false, &c);
	if (rc == 0 && c) {
		/* Only the identity is needed; /proc is read without the mutex. */
		copy.has_holder = c->rec.has_holder;
		copy.holder.pid = c->rec.holder.pid;
		copy.holder.start_time = c->rec.holder.start_time;
		copy.holder.boot_id = strdup(c->rec.holder.boot_id);
		if (!copy.holder.boot_id)
			rc = -ENOMEM;
	}
	pthread_mutex_unlock(&s->mu);
	if (rc == 0)
		rc = holder_check(core, c ? &copy : NULL, caller);
	free(copy.holder.boot_id);
	return rc == -ESRCH ? -EPERM : rc;
}

int lockfs_core_set_operation(struct lockfs_core *core, const char *name,
			      const struct lockfs_caller *caller,
			      const char *text, size_t len)
{
	struct stripe *s = stripe_of(core, name);
	struct lockfs_entry_stat st;
	struct cached *c;
	char *json = NULL, *old;
	bool foreign;
	size_t jlen;
	int rc;

	if (len > 0 && text[len - 1] == '\n')
		len--;
	if (len > LOCKFS_OPERATION_MAX)
		return -EFBIG;
	if (memchr(text, '\0', len) || !lockfs_utf8_valid(text, len))
		return -EINVAL;
	if (lockfs_name_check(name) < 0)
		return -ENOENT;
	pthread_mutex_lock(&s->mu);
	rc = load_locked(core, s, name, &st, &foreign, true, &c);
	if (rc < 0)
		goto out;
	rc = holder_check(core, c ? &c->rec : NULL, caller);
	if (rc < 0)
		goto out;
	old = c->rec.operation;
	c->rec.operation = len ? strndup(text, len) : NULL;
	if (len && !c->rec.operation) {
		c->rec.operation = old;
		rc = -ENOMEM;
		goto out;
	}
	json = lockfs_record_encode(&c->rec, LOCKFS_RECORD_WITH_TOKEN, &jlen);
	if (!json) {
		rc = -ENOMEM;
	} else {
		rc = core->be->ops->update(core->be, name, st.identity, json, jlen);
		if (rc == 0)
			rc = core->be->ops->stat(core->be, name, &st);
	}
	if (rc == 0) {
		c->identity = st.identity;
		free(old);
	} else {
		free(c->rec.operation);
		c->rec.operation = old;
		cache_drop(s, name);
	}
out:
	pthread_mutex_unlock(&s->mu);
	free(json);
	return rc == -ESRCH ? -EPERM : rc;
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

int lockfs_core_list(struct lockfs_core *core, char ***names, size_t *count)
{
	struct name_list l = { 0 };
	int rc = core->be->ops->list(core->be, collect_name, &l);

	if (rc == 0)
		rc = l.err;
	if (rc == 0 && !l.names && !(l.names = calloc(1, sizeof(char *))))
		rc = -ENOMEM;
	if (rc < 0) {
		lockfs_names_free(l.names);
		return rc;
	}
	qsort(l.names, l.count, sizeof(char *), cmp_names);
	*names = l.names;
	*count = l.count;
	return 0;
}

int lockfs_core_log_open_ro(struct lockfs_core *core)
{
	int fd = openat(core->dirfd, core->log_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	return fd < 0 ? -errno : fd;
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
	core->be = cfg->backend;
	*out = core;
	return 0;
fail:
	lockfs_core_close(core);
	return rc;
}

void lockfs_core_close(struct lockfs_core *core)
{
	if (!core)
		return;
	for (int i = 0; i < STRIPES; i++) {
		while (core->stripes[i].head)
			cache_drop(&core->stripes[i], core->stripes[i].head->name);
		pthread_mutex_destroy(&core->stripes[i].mu);
	}
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
