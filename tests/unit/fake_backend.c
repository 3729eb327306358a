/*
 * The in-memory store (fake_backend.h).  One mutex (fake_store.mu) guards
 * everything in the store; the backend's change queue has its own (cq_mu),
 * taken after mu when both are needed.  The record encoder and the change
 * callback run with neither held.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "fake_backend.h"

#define FAKE_HOST "fake-host"
#define STALE_MS 1000

struct fake_lock {
	struct fake_lock *next;
	char *name;
	uint64_t identity;
	uint64_t fence;      /* 0: foreign */
	char *record;        /* NULL: foreign (or another host's without one) */
	size_t len;
	int64_t mtime_ms;
	int64_t session;     /* the backend session that took it (0: none) */
	char host[LOCKFS_HOST_MAX];
	int64_t delay_until_ms; /* > 0: a lock-delay mark (no record, no fence) */
};

struct fake_place {
	struct fake_place *next;
	char *name;
	int64_t rank;
	int64_t session;
};

struct fake_host {
	struct fake_host *next;
	char host[LOCKFS_HOST_MAX];
};

struct fake_store {
	pthread_mutex_t mu;
	struct fake_lock *locks;     /* mu */
	struct fake_place *places;   /* mu */
	struct fake_host *hosts;     /* other hosts with a live session; mu */
	uint64_t last_fence;         /* mu */
	uint64_t last_identity;      /* mu */
	int64_t last_rank;           /* mu */
	int64_t last_session;        /* mu */
};

struct change {
	struct change *next;
	enum lockfs_change what;
	char *name;
};

struct fake_backend {
	struct lockfs_backend base;
	struct fake_store *fs;
	int64_t session;                 /* this backend's session id */
	/* Knobs; fs->mu. */
	int fail_err[FAKE_OP_COUNT];
	int fail_count[FAKE_OP_COUNT];
	struct lockfs_session state;
	bool unconfirmed;                /* read and stat say so */
	bool fields;                     /* read and stat name store fields */
	/* Change reporting: a queue drained by the thread. */
	pthread_mutex_t cq_mu;
	pthread_cond_t cq_cv;
	struct change *head, **tail;     /* cq_mu */
	bool stopping;                   /* cq_mu */
	bool started;
	pthread_t thread;
	lockfs_change_fn fn;
	void *fn_arg;
};

static struct fake_backend *to_fake(struct lockfs_backend *be)
{
	return (struct fake_backend *)be;
}

/* The daemon's wall clock (clock.h), which a test may move: lock times
 * and -o stale go by it, as in the dir store. */
static int64_t now_ms(void)
{
	return lockfs_wall_ms();
}

struct fake_store *fake_store_new(void)
{
	struct fake_store *fs = calloc(1, sizeof(*fs));

	if (fs)
		pthread_mutex_init(&fs->mu, NULL);
	return fs;
}

static void lock_free(struct fake_lock *l)
{
	free(l->name);
	free(l->record);
	free(l);
}

void fake_store_free(struct fake_store *fs)
{
	if (!fs)
		return;
	while (fs->locks) {
		struct fake_lock *l = fs->locks;

		fs->locks = l->next;
		lock_free(l);
	}
	while (fs->places) {
		struct fake_place *p = fs->places;

		fs->places = p->next;
		free(p->name);
		free(p);
	}
	while (fs->hosts) {
		struct fake_host *h = fs->hosts;

		fs->hosts = h->next;
		free(h);
	}
	pthread_mutex_destroy(&fs->mu);
	free(fs);
}

/* ---- Changes ---- */

static void queue_change(struct fake_backend *f, enum lockfs_change what, const char *name)
{
	struct change *c;

	if (!f->started)
		return;
	c = calloc(1, sizeof(*c));
	if (!c)
		return;
	c->what = what;
	c->name = name ? strdup(name) : NULL;
	pthread_mutex_lock(&f->cq_mu);
	*f->tail = c;
	f->tail = &c->next;
	pthread_cond_signal(&f->cq_cv);
	pthread_mutex_unlock(&f->cq_mu);
}

static void *change_thread(void *arg)
{
	struct fake_backend *f = arg;

	pthread_mutex_lock(&f->cq_mu);
	for (;;) {
		struct change *c;

		while (!f->head && !f->stopping)
			pthread_cond_wait(&f->cq_cv, &f->cq_mu);
		if (f->stopping)
			break;
		c = f->head;
		f->head = c->next;
		if (!f->head)
			f->tail = &f->head;
		pthread_mutex_unlock(&f->cq_mu);
		f->fn(f->fn_arg, c->what, c->name);
		free(c->name);
		free(c);
		pthread_mutex_lock(&f->cq_mu);
	}
	pthread_mutex_unlock(&f->cq_mu);
	return NULL;
}

/* ---- The store (fs->mu held) ---- */

static struct fake_lock *find_lock(struct fake_store *fs, const char *name)
{
	for (struct fake_lock *l = fs->locks; l; l = l->next)
		if (strcmp(l->name, name) == 0)
			return l;
	return NULL;
}

static struct fake_place *head_of(struct fake_store *fs, const char *name)
{
	struct fake_place *head = NULL;

	for (struct fake_place *p = fs->places; p; p = p->next)
		if (strcmp(p->name, name) == 0 && (!head || p->rank < head->rank))
			head = p;
	return head;
}

static struct fake_place **find_place(struct fake_store *fs, const char *name,
				      const struct lockfs_place *place)
{
	for (struct fake_place **pp = &fs->places; *pp; pp = &(*pp)->next)
		if ((*pp)->rank == place->rank && strcmp((*pp)->name, name) == 0)
			return pp;
	return NULL;
}

static int add_place(struct fake_backend *f, const char *name, struct lockfs_place *out)
{
	struct fake_place *p = calloc(1, sizeof(*p));

	if (!p || !(p->name = strdup(name))) {
		free(p);
		return -ENOMEM;
	}
	p->rank = ++f->fs->last_rank;
	p->session = f->session;
	p->next = f->fs->places;
	f->fs->places = p;
	out->rank = p->rank;
	out->seq = (uint64_t)p->rank;
	out->session = p->session;
	return -EINPROGRESS;
}

static void remove_lock(struct fake_store *fs, struct fake_lock *gone)
{
	for (struct fake_lock **lp = &fs->locks; *lp; lp = &(*lp)->next)
		if (*lp == gone) {
			*lp = gone->next;
			lock_free(gone);
			return;
		}
}

static void fill(const struct fake_lock *l, struct lockfs_entry_stat *st)
{
	if (!st)
		return;
	memset(st, 0, sizeof(*st));
	st->identity = l->identity;
	st->fence = l->fence;
	st->uid = getuid();
	st->gid = getgid();
	st->mtime_ms = l->mtime_ms;
	st->delay_until_ms = l->delay_until_ms;
}

/* Fields of a store this engine has never heard of (fake_backend_fields). */
static void fill_fields(const struct fake_lock *l, struct lockfs_entry_stat *st)
{
	snprintf(st->key, sizeof(st->key), "fake/%" PRIu64, l->identity);
	st->lease = 0x2a;
	st->fields[0] = (struct lockfs_store_field){ .name = "shelf", .value = LOCKFS_STORE_KEY };
	st->fields[1] = (struct lockfs_store_field){ .name = "lease", .alt_name = "fake_lease",
						     .value = LOCKFS_STORE_HEX, .number = 0x2a };
	st->fields[2] = (struct lockfs_store_field){ .name = "spot", .value = LOCKFS_STORE_INT,
						     .number = 7 };
	st->n_fields = 3;
}

/* An injected failure of OP due now: its -errno (fs->mu held). */
static int failing(struct fake_backend *f, enum fake_op op)
{
	if (!f->fail_err[op] || f->fail_count[op] == 0)
		return 0;
	if (f->fail_count[op] > 0)
		f->fail_count[op]--;
	return -f->fail_err[op];
}

/* Store SRC's record for NAME made with FENCE (0: an edit keeps the
 * fence).  REPLACE: the lock to rewrite (handoff, update), or NULL for a
 * new one.  A new identity either way.  0 or -ENOMEM.  SRC is encoded
 * under mu: the fake's mutex is none the engine could need, and the
 * encoder takes no engine lock (backend.h). */
static int grant(struct fake_backend *f, const char *name, uint64_t fence,
		 const struct lockfs_record_src *src, struct fake_lock *replace,
		 struct lockfs_entry_stat *st)
{
	struct fake_lock *l = replace;
	char *json = NULL;
	size_t len = 0;
	int rc;

	rc = src->encode(src->arg, fence, &json, &len);
	if (rc < 0)
		return rc;
	if (!l) {
		l = calloc(1, sizeof(*l));
		if (!l || !(l->name = strdup(name))) {
			free(l);
			free(json);
			return -ENOMEM;
		}
		l->next = f->fs->locks;
		f->fs->locks = l;
		l->mtime_ms = now_ms();
		snprintf(l->host, sizeof(l->host), "%s", f->base.host);
	}
	free(l->record);
	l->record = json;
	l->len = len;
	if (fence)
		l->fence = fence;
	l->session = f->session;
	l->identity = ++f->fs->last_identity;
	fill(l, st);
	return 0;
}

/* ---- The ops ---- */

#define ENTER(f, op) do { \
		pthread_mutex_lock(&(f)->fs->mu); \
		int inj_ = failing((f), (op)); \
		if (inj_) { \
			pthread_mutex_unlock(&(f)->fs->mu); \
			return inj_; \
		} \
	} while (0)
#define LEAVE(f, rc) do { pthread_mutex_unlock(&(f)->fs->mu); return (rc); } while (0)

static bool may_grant(const struct fake_backend *f)
{
	return f->state.state == LOCKFS_SESSION_LIVE;
}

static int fake_acquire(struct lockfs_backend *be, const char *name,
			enum lockfs_acquire_how how, const struct lockfs_record_src *src,
			struct lockfs_place *place, struct lockfs_entry_stat *st)
{
	struct fake_backend *f = to_fake(be);
	int rc;

	if (how != LOCKFS_ACQ_TRY && !place)
		return -EINVAL;
	ENTER(f, FAKE_OP_ACQUIRE);
	if (!may_grant(f))
		LEAVE(f, -EIO);
	if (how == LOCKFS_ACQ_QUEUE)
		LEAVE(f, add_place(f, name, place));
	if (find_lock(f->fs, name) || head_of(f->fs, name))
		LEAVE(f, how == LOCKFS_ACQ_OR_QUEUE ? add_place(f, name, place) : -EEXIST);
	rc = grant(f, name, ++f->fs->last_fence, src, NULL, st);
	pthread_mutex_unlock(&f->fs->mu);
	if (rc == 0)
		queue_change(f, LOCKFS_CHANGE_NAME, name);
	return rc;
}

static int fake_claim(struct lockfs_backend *be, const char *name,
		      const struct lockfs_place *place, const struct lockfs_record_src *src,
		      struct lockfs_entry_stat *st)
{
	struct fake_backend *f = to_fake(be);
	struct fake_place **pp, *p;
	int rc;

	ENTER(f, FAKE_OP_CLAIM);
	if (!may_grant(f))
		LEAVE(f, f->state.state == LOCKFS_SESSION_LOST ? -ESTALE : -EIO);
	pp = find_place(f->fs, name, place);
	if (!pp)
		LEAVE(f, -ENOENT);
	if (find_lock(f->fs, name) || head_of(f->fs, name) != *pp)
		LEAVE(f, -EEXIST);
	rc = grant(f, name, ++f->fs->last_fence, src, NULL, st);
	if (rc == 0) {
		p = *pp;
		*pp = p->next;
		free(p->name);
		free(p);
	}
	pthread_mutex_unlock(&f->fs->mu);
	if (rc == 0)
		queue_change(f, LOCKFS_CHANGE_NAME, name);
	return rc;
}

static int fake_leave(struct lockfs_backend *be, const char *name,
		      const struct lockfs_place *place)
{
	struct fake_backend *f = to_fake(be);
	struct fake_place **pp, *p;
	bool was_head;

	ENTER(f, FAKE_OP_LEAVE);
	pp = find_place(f->fs, name, place);
	if (!pp)
		LEAVE(f, 0);
	p = *pp;
	was_head = head_of(f->fs, name) == p;
	*pp = p->next;
	free(p->name);
	free(p);
	pthread_mutex_unlock(&f->fs->mu);
	if (was_head)
		queue_change(f, LOCKFS_CHANGE_NAME, name);
	return 0;
}

/* NAME's lock if it is IDENTITY's, and the answer when it is not. */
static struct fake_lock *guarded(struct fake_backend *f, const char *name, uint64_t identity,
				 int *rc)
{
	struct fake_lock *l = find_lock(f->fs, name);

	*rc = 0;
	if (!l || l->identity != identity) {
		*rc = -ENOENT;
		return NULL;
	}
	if (l->session == f->session && f->state.state == LOCKFS_SESSION_LOST) {
		*rc = -ESTALE;
		return NULL;
	}
	return l;
}

static int fake_handoff(struct lockfs_backend *be, const char *name, uint64_t identity,
			const struct lockfs_place *place, const struct lockfs_record_src *src,
			struct lockfs_entry_stat *st)
{
	struct fake_backend *f = to_fake(be);
	struct fake_place **pp, *p;
	struct fake_lock *l;
	int rc;

	ENTER(f, FAKE_OP_HANDOFF);
	l = guarded(f, name, identity, &rc);
	if (!l)
		LEAVE(f, rc);
	if (!may_grant(f))
		LEAVE(f, -EIO); /* no grant while the session is in doubt */
	pp = find_place(f->fs, name, place);
	if (!pp)
		LEAVE(f, -ENOENT);
	if (head_of(f->fs, name) != *pp) {
		/* Someone ahead of PLACE is next: the old grant ends. */
		remove_lock(f->fs, l);
		pthread_mutex_unlock(&f->fs->mu);
		queue_change(f, LOCKFS_CHANGE_NAME, name);
		return 1;
	}
	rc = grant(f, name, ++f->fs->last_fence, src, l, st);
	if (rc == 0) {
		p = *pp;
		*pp = p->next;
		free(p->name);
		free(p);
	}
	pthread_mutex_unlock(&f->fs->mu);
	if (rc == 0)
		queue_change(f, LOCKFS_CHANGE_NAME, name);
	return rc;
}

static int fake_update(struct lockfs_backend *be, const char *name, uint64_t identity,
		       enum lockfs_update_how how, const struct lockfs_record_src *src,
		       struct lockfs_entry_stat *st)
{
	struct fake_backend *f = to_fake(be);
	struct fake_lock *l;
	int rc;

	ENTER(f, FAKE_OP_UPDATE);
	l = guarded(f, name, identity, &rc);
	if (!l)
		LEAVE(f, rc);
	if (how == LOCKFS_UPD_GRANT && !may_grant(f))
		LEAVE(f, -EIO);
	if (how == LOCKFS_UPD_GRANT && head_of(f->fs, name))
		LEAVE(f, -EAGAIN);
	rc = grant(f, name, how == LOCKFS_UPD_GRANT ? ++f->fs->last_fence : 0, src, l, st);
	pthread_mutex_unlock(&f->fs->mu);
	if (rc == 0)
		queue_change(f, LOCKFS_CHANGE_NAME, name);
	return rc;
}

static int fake_release(struct lockfs_backend *be, const char *name, uint64_t identity)
{
	struct fake_backend *f = to_fake(be);
	struct fake_lock *l;
	int rc;

	ENTER(f, FAKE_OP_RELEASE);
	l = guarded(f, name, identity, &rc);
	if (!l)
		LEAVE(f, rc);
	remove_lock(f->fs, l);
	pthread_mutex_unlock(&f->fs->mu);
	queue_change(f, LOCKFS_CHANGE_NAME, name);
	return 0;
}

static int fake_adopt(struct lockfs_backend *be, const char *name, uint64_t identity,
		      struct lockfs_entry_stat *st)
{
	struct fake_backend *f = to_fake(be);
	struct fake_lock *l;
	int rc;

	ENTER(f, FAKE_OP_ADOPT);
	l = guarded(f, name, identity, &rc);
	if (!l)
		LEAVE(f, rc);
	l->session = f->session; /* same identity, place and fence */
	fill(l, st);
	LEAVE(f, 0);
}

/* A lock of this backend's session while it is LOST: not its any more,
 * and shown to nobody here (as etcd's mirror hides keys on a lost lease). */
static bool lost_here(const struct fake_backend *f, const struct fake_lock *l)
{
	return l->session == f->session && f->state.state == LOCKFS_SESSION_LOST;
}

static int fake_read(struct lockfs_backend *be, const char *name, char **record, size_t *len,
		     struct lockfs_entry_stat *st)
{
	struct fake_backend *f = to_fake(be);
	struct fake_lock *l;

	*record = NULL;
	*len = 0;
	ENTER(f, FAKE_OP_READ);
	l = find_lock(f->fs, name);
	if (!l || lost_here(f, l))
		LEAVE(f, -ENOENT);
	if (l->record) {
		*record = malloc(l->len + 1);
		if (!*record)
			LEAVE(f, -ENOMEM);
		memcpy(*record, l->record, l->len);
		(*record)[l->len] = '\0';
		*len = l->len;
	}
	fill(l, st);
	if (st) {
		st->unconfirmed = f->unconfirmed;
		if (f->fields)
			fill_fields(l, st);
	}
	LEAVE(f, 0);
}

static int fake_stat(struct lockfs_backend *be, const char *name, struct lockfs_entry_stat *st,
		     bool likely_held)
{
	struct fake_backend *f = to_fake(be);
	struct fake_lock *l;

	ENTER(f, FAKE_OP_STAT);
	l = find_lock(f->fs, name);
	if (!l || lost_here(f, l))
		LEAVE(f, -ENOENT);
	fill(l, st);
	if (st) {
		st->fence = 0; /* as dir: stat gives no fence */
		st->unconfirmed = f->unconfirmed;
		if (f->fields)
			fill_fields(l, st);
	}
	LEAVE(f, 0);
}

static int fake_list(struct lockfs_backend *be, lockfs_list_cb cb, void *arg)
{
	struct fake_backend *f = to_fake(be);
	char **names = NULL;
	size_t n = 0;

	ENTER(f, FAKE_OP_LIST);
	for (struct fake_lock *l = f->fs->locks; l; l = l->next) {
		char **more = realloc(names, (n + 1) * sizeof(*names));

		if (!more || !(more[n] = strdup(l->name))) {
			names = more ? more : names;
			while (n)
				free(names[--n]);
			free(names);
			LEAVE(f, -ENOMEM);
		}
		names = more;
		n++;
	}
	pthread_mutex_unlock(&f->fs->mu);
	/* The callback runs without mu: it may do anything but call us. */
	for (size_t i = 0, stop = 0; i < n; i++) {
		if (!stop)
			stop = cb(arg, names[i]);
		free(names[i]);
	}
	free(names);
	return 0;
}

static int fake_foreign_stale(struct lockfs_backend *be, const char *name,
			      struct lockfs_entry_stat *st)
{
	struct fake_backend *f = to_fake(be);
	struct fake_lock *l;
	int stale;

	pthread_mutex_lock(&f->fs->mu);
	l = find_lock(f->fs, name);
	stale = l && !l->record && !l->fence && now_ms() - l->mtime_ms >= STALE_MS;
	if (stale)
		fill(l, st);
	LEAVE(f, stale);
}

static int fake_session(struct lockfs_backend *be, const char *host, struct lockfs_session *out)
{
	struct fake_backend *f = to_fake(be);
	int rc = -ENOENT;

	pthread_mutex_lock(&f->fs->mu);
	if (!host || strcmp(host, f->base.host) == 0) {
		*out = f->state;
		rc = 0;
	} else {
		for (struct fake_host *h = f->fs->hosts; h; h = h->next)
			if (strcmp(h->host, host) == 0) {
				*out = (struct lockfs_session){ LOCKFS_SESSION_LIVE, 0, 0 };
				rc = 0;
			}
	}
	LEAVE(f, rc);
}

static int fake_start(struct lockfs_backend *be, lockfs_change_fn fn, void *arg)
{
	struct fake_backend *f = to_fake(be);
	int rc;

	if (f->started || !fn)
		return -EINVAL;
	f->fn = fn;
	f->fn_arg = arg;
	rc = pthread_create(&f->thread, NULL, change_thread, f);
	if (rc)
		return -rc;
	f->started = true;
	return 0;
}

static int fake_check(struct lockfs_backend *be)
{
	struct fake_backend *f = to_fake(be);

	ENTER(f, FAKE_OP_CHECK);
	LEAVE(f, 0);
}

static void fake_close(struct lockfs_backend *be)
{
	struct fake_backend *f = to_fake(be);

	if (f->started) {
		pthread_mutex_lock(&f->cq_mu);
		f->stopping = true;
		pthread_cond_signal(&f->cq_cv);
		pthread_mutex_unlock(&f->cq_mu);
		pthread_join(f->thread, NULL);
	}
	while (f->head) {
		struct change *c = f->head;

		f->head = c->next;
		free(c->name);
		free(c);
	}
	pthread_mutex_destroy(&f->cq_mu);
	pthread_cond_destroy(&f->cq_cv);
	free(f);
}

static const struct lockfs_backend_ops fake_ops = {
	.acquire = fake_acquire,
	.claim = fake_claim,
	.leave = fake_leave,
	.handoff = fake_handoff,
	.update = fake_update,
	.release = fake_release,
	.adopt = fake_adopt,
	.read = fake_read,
	.stat = fake_stat,
	.list = fake_list,
	.foreign_stale = fake_foreign_stale,
	.session = fake_session,
	.start = fake_start,
	.check = fake_check,
	.close = fake_close,
};

int fake_backend_open(struct fake_store *fs, struct lockfs_backend **out)
{
	struct fake_backend *f = calloc(1, sizeof(*f));

	if (!f)
		return -ENOMEM;
	f->fs = fs;
	pthread_mutex_init(&f->cq_mu, NULL);
	pthread_cond_init(&f->cq_cv, NULL);
	f->tail = &f->head;
	f->base.ops = &fake_ops;
	f->base.state_dirfd = -1;
	f->base.state_path = "(fake)";
	f->base.source = "fake";
	snprintf(f->base.host, sizeof(f->base.host), FAKE_HOST);
	f->state = (struct lockfs_session){ LOCKFS_SESSION_LIVE, now_ms(), 0 };
	pthread_mutex_lock(&fs->mu);
	f->session = ++fs->last_session;
	f->state.id = f->session;
	/* The places of an earlier backend were its session's: gone. */
	for (struct fake_place **pp = &fs->places; *pp;) {
		struct fake_place *p = *pp;

		if (p->session != f->session) {
			*pp = p->next;
			free(p->name);
			free(p);
		} else {
			pp = &p->next;
		}
	}
	pthread_mutex_unlock(&fs->mu);
	*out = &f->base;
	return 0;
}

/* ---- Knobs ---- */

void fake_backend_fail(struct lockfs_backend *be, enum fake_op op, int err, int count)
{
	struct fake_backend *f = to_fake(be);

	pthread_mutex_lock(&f->fs->mu);
	for (int o = 0; o < FAKE_OP_COUNT; o++)
		if (o == (int)op || (op == FAKE_OP_ALL_WRITES && o <= FAKE_OP_ADOPT)) {
			f->fail_err[o] = err;
			f->fail_count[o] = err ? count : 0;
		}
	pthread_mutex_unlock(&f->fs->mu);
}

/* A lock of nobody's session on NAME: RECORD (copied, may be NULL). */
static int plant(struct fake_backend *f, const char *name, const char *host,
		 const char *record, int64_t mtime_ms)
{
	struct fake_lock *l;

	pthread_mutex_lock(&f->fs->mu);
	if (find_lock(f->fs, name))
		LEAVE(f, -EEXIST);
	l = calloc(1, sizeof(*l));
	if (!l || !(l->name = strdup(name)) || (record && !(l->record = strdup(record)))) {
		if (l)
			free(l->name);
		free(l);
		LEAVE(f, -ENOMEM);
	}
	l->len = record ? strlen(record) : 0;
	l->mtime_ms = mtime_ms;
	l->identity = ++f->fs->last_identity;
	snprintf(l->host, sizeof(l->host), "%s", host);
	l->next = f->fs->locks;
	f->fs->locks = l;
	pthread_mutex_unlock(&f->fs->mu);
	queue_change(f, LOCKFS_CHANGE_NAME, name);
	return 0;
}

int fake_backend_foreign(struct lockfs_backend *be, const char *name, int64_t mtime_ms)
{
	return plant(to_fake(be), name, "", NULL, mtime_ms);
}

int fake_backend_other_host(struct lockfs_backend *be, const char *name, const char *host,
			    const char *record)
{
	struct fake_backend *f = to_fake(be);
	struct fake_host *h;
	bool known = false;

	pthread_mutex_lock(&f->fs->mu);
	for (h = f->fs->hosts; h; h = h->next)
		known |= strcmp(h->host, host) == 0;
	if (!known) {
		h = calloc(1, sizeof(*h));
		if (!h)
			LEAVE(f, -ENOMEM);
		snprintf(h->host, sizeof(h->host), "%s", host);
		h->next = f->fs->hosts;
		f->fs->hosts = h;
	}
	pthread_mutex_unlock(&f->fs->mu);
	return plant(f, name, host, record, now_ms());
}

int fake_backend_remove(struct lockfs_backend *be, const char *name)
{
	struct fake_backend *f = to_fake(be);
	struct fake_lock *l;

	pthread_mutex_lock(&f->fs->mu);
	l = find_lock(f->fs, name);
	if (!l)
		LEAVE(f, -ENOENT);
	remove_lock(f->fs, l);
	pthread_mutex_unlock(&f->fs->mu);
	queue_change(f, LOCKFS_CHANGE_NAME, name);
	return 0;
}

void fake_backend_session(struct lockfs_backend *be, enum lockfs_session_state state)
{
	struct fake_backend *f = to_fake(be);

	pthread_mutex_lock(&f->fs->mu);
	f->state.state = state;
	f->state.since_ms = now_ms();
	pthread_mutex_unlock(&f->fs->mu);
	queue_change(f, LOCKFS_CHANGE_SESSION, NULL);
}

void fake_backend_change(struct lockfs_backend *be, enum lockfs_change what, const char *name)
{
	queue_change(to_fake(be), what, name);
}

void fake_backend_new_session(struct lockfs_backend *be)
{
	struct fake_backend *f = to_fake(be);
	int64_t old = f->session;

	pthread_mutex_lock(&f->fs->mu);
	/* The old session's revoke: its locks and places go with it. */
	for (struct fake_lock *l = f->fs->locks, *next; l; l = next) {
		next = l->next;
		if (l->session == old)
			remove_lock(f->fs, l);
	}
	for (struct fake_place **pp = &f->fs->places; *pp;) {
		struct fake_place *p = *pp;

		if (p->session == old) {
			*pp = p->next;
			free(p->name);
			free(p);
		} else {
			pp = &p->next;
		}
	}
	f->session = ++f->fs->last_session;
	f->state = (struct lockfs_session){ LOCKFS_SESSION_LIVE, now_ms(), f->session };
	pthread_mutex_unlock(&f->fs->mu);
	queue_change(f, LOCKFS_CHANGE_SESSION, NULL);
}

void fake_backend_unconfirmed(struct lockfs_backend *be, bool unconfirmed)
{
	struct fake_backend *f = to_fake(be);

	pthread_mutex_lock(&f->fs->mu);
	f->unconfirmed = unconfirmed;
	pthread_mutex_unlock(&f->fs->mu);
}

void fake_backend_fields(struct lockfs_backend *be, bool fields)
{
	struct fake_backend *f = to_fake(be);

	pthread_mutex_lock(&f->fs->mu);
	f->fields = fields;
	pthread_mutex_unlock(&f->fs->mu);
}

int fake_backend_delay(struct lockfs_backend *be, const char *name, int64_t until_ms)
{
	struct fake_backend *f = to_fake(be);
	int rc = plant(f, name, "", NULL, now_ms());
	struct fake_lock *l;

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&f->fs->mu);
	l = find_lock(f->fs, name);
	if (l)
		l->delay_until_ms = until_ms;
	pthread_mutex_unlock(&f->fs->mu);
	return 0;
}
