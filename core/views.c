/*
 * What the mount shows of the locks, each a view under the stripe mutex
 * (lockfs_table_view): a lock's `owner` JSON (with what a store adds: its
 * key, lease and session), `operation`, `lease`, `waiters` (one JSON
 * object per queued waiter) and `bind`; and the names a listing of M/ or
 * M/.flock/ shows.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/name.h"
#include "base/clock.h"
#include "engine.h"
#include "lock/caller.h"
#include "lock/queue.h"
#include "lock/recovery.h"
#include "lock/store.h"
#include "lock/table.h"

/* What the store says of where it keeps NAME's holder (its fields, in
 * their order: etcd's key, lease in 16 hex digits, create_revision), and
 * that the answer is from the last state it confirmed: added to an
 * `owner` object O.  Nothing for dir (no fields, always confirmed).  A
 * field the record fills already (a slug's own `lease`) keeps the
 * record's, and the store's goes under its other name (`etcd_lease`). */
static void add_store_fields(json_t *o, const struct lockfs_entry_stat *st)
{
	if (st->unconfirmed)
		json_object_set_new(o, "state", json_string("unconfirmed"));
	for (size_t i = 0; i < st->n_fields && i < LOCKFS_STORE_FIELDS_MAX; i++) {
		const struct lockfs_store_field *f = &st->fields[i];
		json_t *had = json_object_get(o, f->name);
		char hex[24];
		json_t *v;

		switch (f->value) {
		case LOCKFS_STORE_KEY:
			v = json_string(st->key);
			break;
		case LOCKFS_STORE_HEX:
			snprintf(hex, sizeof(hex), "%016" PRIx64, (uint64_t)f->number);
			v = json_string(hex);
			break;
		default:
			v = json_integer(f->number);
			break;
		}
		json_object_set_new(o, f->alt_name && had && !json_is_null(had) ? f->alt_name :
				    f->name, v);
	}
}

/* O as `owner` text: indented, one newline after it.  NULL: no memory. */
static char *owner_text(json_t *o, size_t *len)
{
	char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);

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

/* The `owner` view of NAME in lock-delay (etcd: its holder's session
 * expired): held by nobody until then. */
static char *delay_json(const char *name, const struct lockfs_entry_stat *st, size_t *len)
{
	char when[32];
	json_t *o = json_object();
	char *s;

	if (!o)
		return NULL;
	json_object_set_new(o, "resource", json_string(name));
	json_object_set_new(o, "holder", json_null());
	json_object_set_new(o, "lock_delay_until",
			    json_string(lockfs_format_time(st->delay_until_ms, when)));
	json_object_set_new(o, "foreign", json_false());
	if (st->unconfirmed)
		json_object_set_new(o, "state", json_string("unconfirmed"));
	s = owner_text(o, len);
	json_decref(o);
	return s;
}

/* The `owner` view of a lock held without a record lockfs can read. */
static char *foreign_json(const char *name, const struct lockfs_entry_stat *st, size_t *len)
{
	char when[32];
	json_t *o;
	char *s;

	if (st->delay_until_ms > 0)
		return delay_json(name, st, len);
	o = json_object();
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
	add_store_fields(o, st);
	s = owner_text(o, len);
	json_decref(o);
	return s;
}

/*
 * TEXT (C's `owner` view, malloc'd, *LEN) with what a store with sessions
 * adds: "session" ("live" | "uncertain") for this host's locks, and the
 * store fields (add_store_fields).  TEXT as it is for dir.  NULL: no
 * memory (TEXT freed).
 */
static char *with_store_fields(struct lockfs_table *t, const struct held_lock *c,
			       const struct lockfs_entry_stat *st, char *text, size_t *len)
{
	struct lockfs_session sess;
	json_t *o;
	char *s;

	if (!text || (!(t->be->caps & LOCKFS_BE_SESSIONS) && !st->unconfirmed && !st->key[0]))
		return text;
	o = json_loadb(text, *len, 0, NULL);
	free(text);
	if (!o)
		return NULL;
	if ((t->be->caps & LOCKFS_BE_SESSIONS) && c->rec.has_holder &&
	    !lockfs_table_elsewhere(t, &c->rec.holder) &&
	    lockfs_store_session(t->be, NULL, &sess) == 0)
		json_object_set_new(o, "session", json_string(
			sess.state == LOCKFS_SESSION_LIVE ? "live" : "uncertain"));
	add_store_fields(o, st);
	s = owner_text(o, len);
	json_decref(o);
	return s;
}

/* Where a view puts its text. */
struct text_out {
	char **text;
	size_t *len;
	const struct lockfs_reader *reader;
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

static int view_owner(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
		      void *arg)
{
	struct text_out *o = arg;

	/* For this reader: the token and command lines only for their own
	 * uid and root -- root in a container: for its own container's
	 * holders (privacy.md). */
	if (!c)
		*o->text = foreign_json(name, st, o->len);
	else {
		if (c->rec.holder_exited)
			/* the ones alive now */
			lockfs_recovery_descendants_refresh(&o->core->table, c, NULL);
		*o->text = with_store_fields(&o->core->table, c, st,
					     lockfs_record_view_for(&c->rec, o->reader, o->len),
					     o->len);
	}
	return *o->text ? 0 : -ENOMEM;
}

int lockfs_core_owner(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *reader, char **json, size_t *len)
{
	char scope[LOCKFS_CONTAINER_MAX];
	struct lockfs_reader who;
	struct text_out o = { json, len, &who, core };

	lockfs_caller_reader(&core->table, reader, &who, scope);

	return lockfs_table_view(&core->table, name, view_owner, &o);
}

static int view_operation(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
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
	struct text_out o = { text, len, NULL, core };

	return lockfs_table_view(&core->table, name, view_operation, &o);
}

static int view_lease(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
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
	struct text_out o = { text, len, NULL, core };

	return lockfs_table_view(&core->table, name, view_lease, &o);
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
	struct lockfs_table *t = &core->table;
	struct name_list l = { 0 };

	return list_done(&l, lockfs_store_list(t->be, collect_name, &l), names, count);
}

int lockfs_core_list_flock(struct lockfs_core *core, char ***names, size_t *count)
{
	struct lockfs_table *t = &core->table;
	struct name_list l = { 0 };
	int rc = lockfs_store_list(t->be, collect_name, &l);

	/* Held names, and names that only have waiters (behind nothing we
	 * could read yet, or in between). */
	for (int i = 0; rc == 0 && !l.err && i < STRIPES; i++) {
		struct stripe *s = &t->stripes[i];

		pthread_mutex_lock(&s->mu);
		for (struct lockq *q = s->queues; q && !l.err; q = q->next)
			if (q->nactive)
				collect_name(&l, q->name);
		pthread_mutex_unlock(&s->mu);
	}
	return list_done(&l, rc, names, count);
}

/* Where a view of the queue puts its text. */
struct queue_text {
	char **text;
	size_t *len;
	struct lockfs_table *t;
	struct stripe *s;
};

/* The text being built for `waiters`: one line per waiter. */
struct waiter_lines {
	char *buf;
	size_t used, cap;
};

/* Append O (taken) as one line.  0; -ENOMEM. */
static int lines_add(struct waiter_lines *l, json_t *o)
{
	char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	size_t n;

	json_decref(o);
	if (!line)
		return -ENOMEM;
	n = strlen(line);
	if (l->used + n + 2 > l->cap) {
		size_t cap = l->cap ? l->cap : 64;
		char *b;

		while (l->used + n + 2 > cap)
			cap *= 2;
		b = realloc(l->buf, cap);
		if (!b) {
			free(line);
			return -ENOMEM;
		}
		l->buf = b;
		l->cap = cap;
	}
	memcpy(l->buf + l->used, line, n);
	l->used += n;
	l->buf[l->used++] = '\n';
	l->buf[l->used] = '\0';
	free(line);
	return 0;
}

/* A waiter of this daemon's queue; HOST (NULL: left out) is this host. */
static json_t *local_waiter(const struct qentry *e, const char *host)
{
	char when[32];
	/* comm is any bytes (prctl): "o" takes the lossy string. */
	json_t *o = json_pack("{s:i, s:o, s:o, s:o, s:i, s:s, s:s, s:s}",
			      "pid", (int)e->who.pid,
			      "ns_pid", e->who.ns_pid > 0 ? json_integer(e->who.ns_pid) : json_null(),
			      "container", e->who.container[0]
					   ? lockfs_json_string_lossy(e->who.container) : json_null(),
			      "comm", lockfs_json_string_lossy(e->who.comm),
			      "uid", (int)e->uid,
			      "mode", e->mode == LOCKFS_SHARED ? "shared" : "exclusive",
			      "kind", strncmp(e->owner, "posix:", 6) == 0 ? "posix" : "flock",
			      "since", lockfs_format_time(e->since_ms, when));

	if (o && host && json_object_set_new(o, "host", json_string(host)) < 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* A waiter known only by its record in the store (another host's, or a
 * client other than lockfs: then every field is null). */
static json_t *stored_waiter(const struct lockfs_line_entry *le)
{
	json_t *rec = le->record_len ? json_loadb(le->record, le->record_len, 0, NULL) : NULL;
	json_t *h = json_object_get(rec, "holder");
	const char *owner = json_string_value(json_object_get(rec, "fd_owner"));
	const char *mode = json_string_value(json_object_get(rec, "mode"));
	json_t *o;

#define FIELD(obj, key) json_incref(json_object_get((obj), (key)) ? json_object_get((obj), (key)) \
								 : json_null())
	o = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
		      "pid", FIELD(h, "pid"), "ns_pid", FIELD(h, "ns_pid"),
		      "container", FIELD(h, "container"), "comm", FIELD(h, "comm"),
		      "uid", FIELD(h, "uid"),
		      "mode", mode ? json_string(mode) : json_null(),
		      "kind", !owner ? json_null()
				     : json_string(strncmp(owner, "posix:", 6) == 0 ? "posix" : "flock"),
		      "since", FIELD(rec, "acquired_at"), "host", FIELD(h, "host"));
#undef FIELD
	json_decref(rec);
	return o;
}

/* Building `waiters` from the store's line (struct lockfs_line_entry). */
struct line_view {
	struct waiter_lines *lines;
	struct lockq *q;
	const char *host;
	int64_t *ranks; /* the store's places seen, N of them */
	size_t n, cap;
};

static int line_entry(void *arg, const struct lockfs_line_entry *le)
{
	struct line_view *v = arg;
	const struct qentry *mine = NULL;

	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 16;
		int64_t *r = realloc(v->ranks, cap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		v->ranks = r;
		v->cap = cap;
	}
	v->ranks[v->n++] = le->rank;
	for (const struct qentry *e = v->q ? v->q->head : NULL; e && !mine; e = e->next)
		if (e->place.rank == le->rank)
			mine = e;
	/* A place kept for an interrupted waiter: nobody waits there. */
	if (mine && !mine->w)
		return 0;
	/* One of ours: what the daemon knows of it beats its record. */
	return lines_add(v->lines, mine ? local_waiter(mine, v->host) : stored_waiter(le));
}

static bool ranks_have(const struct line_view *v, int64_t rank)
{
	for (size_t i = 0; i < v->n; i++)
		if (v->ranks[i] == rank)
			return true;
	return false;
}

/* Every waiter of NAME: on a store with its own line across hosts (etcd),
 * the store's line in its order, each with its host, then this daemon's
 * waiters that have no place in it yet (etcd did not answer when they
 * came); else this daemon's queue, in order. */
static int view_waiters(struct lockfs_table *t, struct stripe *s, const char *name, char **text,
			size_t *len)
{
	struct waiter_lines l = { 0 };
	struct line_view v = { .lines = &l, .q = lockfs_queue_find(s, name), .host = t->host };
	int rc = lockfs_store_line(t->be, name, line_entry, &v);

	if (rc == -EOPNOTSUPP)
		v.host = NULL; /* one host: no host field */
	else if (rc < 0 && rc != -ENOMEM)
		v.n = 0; /* etcd cannot say now: this daemon's waiters, as it knows them */
	for (struct qentry *e = v.q ? v.q->head : NULL; e && rc != -ENOMEM; e = e->next) {
		if (!e->w || (e->place.rank && ranks_have(&v, e->place.rank)))
			continue;
		rc = lines_add(&l, local_waiter(e, v.host));
	}
	free(v.ranks);
	if (rc == -ENOMEM) {
		free(l.buf);
		return rc;
	}
	if (!l.buf && !(l.buf = calloc(1, 1)))
		return -ENOMEM;
	*text = l.buf;
	*len = l.used;
	return 0;
}

static int view_waiters_of(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
			   void *arg)
{
	struct queue_text *o = arg;

	return view_waiters(o->t, o->s, name, o->text, o->len);
}

int lockfs_core_waiters(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct lockfs_table *t = &core->table;
	struct queue_text o = { text, len, t, lockfs_table_stripe(t, name) };

	return lockfs_table_view(t, name, view_waiters_of, &o);
}

static int view_binding(const char *name, struct held_lock *c, const struct lockfs_entry_stat *st,
			void *arg)
{
	struct queue_text *o = arg;
	const char *b = c ? lockfs_bound_name(c->rec.bound) : "foreign";

	*o->len = strlen(b) + 1;
	*o->text = malloc(*o->len + 1);
	if (!*o->text)
		return -ENOMEM;
	snprintf(*o->text, *o->len + 1, "%s\n", b);
	return 0;
}

int lockfs_core_binding(struct lockfs_core *core, const char *name, char **text, size_t *len)
{
	struct queue_text o = { .text = text, .len = len };

	return lockfs_table_view(&core->table, name, view_binding, &o);
}
