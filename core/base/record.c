/*
 * The lock record (include/lockfs/record.h): JSON via jansson.
 *
 * Key order is part of the format people read (`cat M/NAME/owner`), so
 * objects are built in the documented order and dumped with
 * JSON_PRESERVE_ORDER.  Strings come from /proc and may be any bytes;
 * jansson refuses invalid UTF-8, so they are repaired first (each bad byte
 * becomes U+FFFD) rather than losing the whole record.
 *
 * Parsing is strict: the record comes from a backing directory anyone with
 * write access could have edited, and the engine trusts pid, start_time and
 * token from it when deciding who may release a lock.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "lockfs/record.h"
#include "lockfs/utf8.h"
#include "clock.h"

/* Most cmdline elements a parsed record may carry. */
#define RECORD_CMDLINE_MAX 4096
/* Longest container id a parsed record may carry. */
#define RECORD_CONTAINER_MAX 255

/*
 * A JSON string for S, with every byte that does not start a valid UTF-8
 * sequence replaced by U+FFFD.  Returns a new reference, or NULL when out
 * of memory.  S == NULL gives "" (callers map optional NULLs to null
 * before getting here; this is only a guard).
 */
static json_t *str_json(const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t len = strlen((const char *)p), i, o, bad = 0;
	char *fixed;
	json_t *j;

	for (i = 0; i < len;) {
		size_t n = p[i] < 0x80 ? 1 : lockfs_utf8_decode((const char *)p + i, len - i, NULL);

		if (n == 0) {
			bad++;
			i++;
		} else {
			i += n;
		}
	}
	if (bad == 0)
		return json_stringn((const char *)p, len);

	/* Each bad byte grows from 1 to 3 bytes (EF BF BD). */
	fixed = malloc(len + 2 * bad + 1);
	if (!fixed)
		return NULL;
	for (i = 0, o = 0; i < len;) {
		size_t n = p[i] < 0x80 ? 1 : lockfs_utf8_decode((const char *)p + i, len - i, NULL);

		if (n == 0) {
			memcpy(fixed + o, "\xEF\xBF\xBD", 3);
			o += 3;
			i++;
		} else {
			memcpy(fixed + o, p + i, n);
			o += n;
			i += n;
		}
	}
	j = json_stringn(fixed, o);
	free(fixed);
	return j;
}

json_t *lockfs_json_string_lossy(const char *s)
{
	return str_json(s);
}

/* A JSON string for S, or null when S is NULL.  NULL when out of memory. */
/* A fence, or null for 0 (see get_fence). */
static json_t *fence_json(uint64_t fence)
{
	return fence ? json_integer((json_int_t)fence) : json_null();
}

static json_t *opt_str_json(const char *s)
{
	return s ? str_json(s) : json_null();
}

/*
 * Add VALUE (a new reference, possibly NULL after a failed allocation) to
 * OBJ under KEY.  Returns 0, or -1 when VALUE is NULL or adding failed;
 * json_object_set_new() consumes VALUE either way.
 */
static int add(json_t *obj, const char *key, json_t *value)
{
	return value ? json_object_set_new(obj, key, value) : -1;
}

/* H as JSON; its argv as `"cmdline": null` unless SHOW_CMDLINE (privacy.md). */
static json_t *holder_json(const struct lockfs_holder *h, bool show_cmdline)
{
	json_t *o = json_object(), *argv = show_cmdline ? json_array() : json_null();
	int err = 0;

	if (!o || !argv)
		goto fail;
	for (char **a = h->cmdline; show_cmdline && a && *a; a++) {
		json_t *s = str_json(*a);

		if (!s || json_array_append_new(argv, s) < 0)
			goto fail;
	}
	err |= add(o, "pid", json_integer(h->pid));
	err |= add(o, "ns_pid", h->ns_pid > 0 ? json_integer(h->ns_pid) : json_null());
	err |= add(o, "container", opt_str_json(h->container));
	err |= add(o, "start_time", json_integer((json_int_t)h->start_time));
	err |= add(o, "uid", json_integer(h->uid));
	err |= add(o, "user", opt_str_json(h->user));
	err |= add(o, "gid", json_integer(h->gid));
	err |= add(o, "comm", str_json(h->comm));
	err |= add(o, "cmdline", argv);
	argv = NULL; /* consumed by add() */
	err |= add(o, "host", str_json(h->host));
	err |= add(o, "boot_id", str_json(h->boot_id));
	if (err)
		goto fail;
	return o;
fail:
	json_decref(argv);
	json_decref(o);
	return NULL;
}

static json_t *lease_json(const struct lockfs_lease *l)
{
	char when[32];
	json_t *o = json_object();
	int err = 0;

	if (!o)
		return NULL;
	err |= add(o, "ttl_s", json_integer(l->ttl_s));
	err |= add(o, "expires_at", json_string(lockfs_format_time(l->expires_at_ms, when)));
	err |= add(o, "expires_at_ms", json_integer(l->expires_at_ms));
	err |= add(o, "deadline_boottime_ms", json_integer(l->deadline_boot_ms));
	if (err) {
		json_decref(o);
		return NULL;
	}
	return o;
}

uint64_t lockfs_holder_fence(const struct lockfs_record *r)
{
	return r->holder_fence ? r->holder_fence : r->fence;
}

int64_t lockfs_holder_acquired_at(const struct lockfs_record *r)
{
	return r->holder_fence ? r->holder_acquired_at_ms : r->acquired_at_ms;
}

size_t lockfs_record_holders(const struct lockfs_record *r)
{
	return r->has_holder ? 1 + r->nshares : 0;
}

struct lockfs_holder *lockfs_record_holder(const struct lockfs_record *r, size_t i)
{
	return (struct lockfs_holder *)(i == 0 ? &r->holder : &r->shares[i - 1].holder);
}

enum lockfs_bound lockfs_record_bound_at(const struct lockfs_record *r, size_t i)
{
	return i == 0 ? r->bound : r->shares[i - 1].bound;
}

void lockfs_record_set_bound_at(struct lockfs_record *r, size_t i, enum lockfs_bound b)
{
	if (i == 0)
		r->bound = b;
	else
		r->shares[i - 1].bound = b;
}

uint64_t lockfs_record_fence_at(const struct lockfs_record *r, size_t i)
{
	return i == 0 ? lockfs_holder_fence(r) : r->shares[i - 1].fence;
}

const char *lockfs_record_fd_owner_at(const struct lockfs_record *r, size_t i)
{
	return i == 0 ? r->fd_owner : r->shares[i - 1].fd_owner;
}

const char *lockfs_record_slug_at(const struct lockfs_record *r, size_t i)
{
	return i == 0 ? r->slug : r->shares[i - 1].slug;
}

const char *lockfs_bound_name(enum lockfs_bound b)
{
	return b == LOCKFS_BOUND_SLUG ? "slug" : b == LOCKFS_BOUND_FD ? "fd" : "process";
}

/* Whose command lines a rendering shows: everyone's (the stored record),
 * or those of one reader's uid (root sees all). */
struct audience {
	bool all;
	uid_t reader;
};

static bool shows_cmdline(const struct audience *a, const struct lockfs_holder *h)
{
	return a->all || a->reader == 0 || a->reader == h->uid;
}

/* One element of "holders": the holder's object plus its grant. */
static json_t *share_json(const struct lockfs_holder *h, enum lockfs_bound bound,
			  const char *fd_owner, uint64_t fence, int64_t at_ms, const char *slug,
			  int flags, const struct audience *a)
{
	json_t *o = holder_json(h, shows_cmdline(a, h));
	char when[32];
	int err = 0;

	if (!o)
		return NULL;
	err |= add(o, "bound", json_string(lockfs_bound_name(bound)));
	if (!(flags & LOCKFS_RECORD_PRETTY) && fd_owner[0])
		err |= add(o, "fd_owner", json_string(fd_owner));
	err |= add(o, "fence", fence_json(fence));
	err |= add(o, "acquired_at", json_string(lockfs_format_time(at_ms, when)));
	err |= add(o, "acquired_at_ms", json_integer(at_ms));
	err |= add(o, "slug", opt_str_json(slug));
	if (err) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* Every holder, `holder` first: what a reader of a shared lock needs. */
static json_t *holders_json(const struct lockfs_record *r, int flags,
			    const struct audience *who)
{
	json_t *a = json_array();

	if (!a)
		return NULL;
	if (r->has_holder &&
	    json_array_append_new(a, share_json(&r->holder, r->bound, r->fd_owner,
						lockfs_holder_fence(r),
						lockfs_holder_acquired_at(r), r->slug, flags,
						who)) < 0)
		goto fail;
	for (size_t i = 0; i < r->nshares; i++) {
		const struct lockfs_share *sh = &r->shares[i];

		if (json_array_append_new(a, share_json(&sh->holder, sh->bound, sh->fd_owner,
							sh->fence, sh->acquired_at_ms, sh->slug,
							flags, who)) < 0)
			goto fail;
	}
	return a;
fail:
	json_decref(a);
	return NULL;
}

/* The live descendants of a holder that exited, in the order kept. */
static json_t *descendants_json(const struct lockfs_record *r)
{
	json_t *a = json_array();

	if (!a)
		return NULL;
	for (size_t i = 0; i < r->ndescendants; i++) {
		const struct lockfs_descendant *d = &r->descendants[i];
		json_t *o = json_object();
		int err = 0;

		if (!o)
			goto fail;
		err |= add(o, "pid", json_integer(d->pid));
		err |= add(o, "start_time", json_integer((json_int_t)d->start_time));
		err |= add(o, "comm", str_json(d->comm));
		err |= add(o, "via", json_string(d->candidate ? "session" : "tree"));
		if (err || json_array_append_new(a, o) < 0) {
			json_decref(o);
			goto fail;
		}
	}
	return a;
fail:
	json_decref(a);
	return NULL;
}

/*
 * The compact form is written on every acquisition, so it is produced
 * directly rather than through a tree of jansson objects (a third of the
 * encoding cost was allocation).  It must equal jansson's JSON_COMPACT
 * output byte for byte: the unit tests compare the two, and the fuzzer
 * parses what this writes.
 */
struct sbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 2 > b->cap) {
		size_t cap = b->cap ? b->cap : 512;
		char *p;

		while (b->len + n + 2 > cap)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

static void sb_lit(struct sbuf *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

/* A JSON string: escaped as jansson does, bad UTF-8 bytes as U+FFFD. */
static void sb_str(struct sbuf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t len = strlen((const char *)p), i = 0;

	sb_put(b, "\"", 1);
	while (i < len) {
		size_t run = i;

		/* Copy the longest stretch that needs no escape in one go. */
		while (run < len && p[run] >= 0x20 && p[run] != '"' && p[run] != '\\' &&
		       p[run] < 0x80)
			run++;
		sb_put(b, (const char *)p + i, run - i);
		i = run;
		if (i >= len)
			break;
		if (p[i] >= 0x80) {
			size_t n = lockfs_utf8_decode((const char *)p + i, len - i, NULL);

			if (n == 0) {
				sb_put(b, "\xEF\xBF\xBD", 3);
				i++;
			} else {
				sb_put(b, (const char *)p + i, n);
				i += n;
			}
			continue;
		}
		switch (p[i]) {
		case '"':  sb_put(b, "\\\"", 2); break;
		case '\\': sb_put(b, "\\\\", 2); break;
		case '\b': sb_put(b, "\\b", 2); break;
		case '\f': sb_put(b, "\\f", 2); break;
		case '\n': sb_put(b, "\\n", 2); break;
		case '\r': sb_put(b, "\\r", 2); break;
		case '\t': sb_put(b, "\\t", 2); break;
		default: {
			char u[8];

			snprintf(u, sizeof(u), "\\u%04X", p[i]);
			sb_put(b, u, 6);
		}
		}
		i++;
	}
	sb_put(b, "\"", 1);
}

static void sb_opt_str(struct sbuf *b, const char *s)
{
	if (s)
		sb_str(b, s);
	else
		sb_lit(b, "null");
}

static void sb_int(struct sbuf *b, long long v)
{
	char n[24];

	sb_put(b, n, (size_t)snprintf(n, sizeof(n), "%lld", v));
}

static char *encode_compact(const struct lockfs_record *r, int flags, size_t *len)
{
	struct sbuf b = { 0 };
	char when[32];

	sb_lit(&b, "{\"resource\":");
	sb_str(&b, r->resource);
	sb_lit(&b, ",\"bound\":\"");
	sb_lit(&b, lockfs_bound_name(r->bound));
	sb_lit(&b, "\",\"mode\":\"exclusive\"");
	if (r->fd_owner[0]) {
		sb_lit(&b, ",\"fd_owner\":");
		sb_str(&b, r->fd_owner);
	}
	sb_lit(&b, ",\"holder\":");
	if (r->has_holder) {
		const struct lockfs_holder *h = &r->holder;

		sb_lit(&b, "{\"pid\":");
		sb_int(&b, h->pid);
		sb_lit(&b, ",\"ns_pid\":");
		if (h->ns_pid > 0)
			sb_int(&b, h->ns_pid);
		else
			sb_lit(&b, "null");
		sb_lit(&b, ",\"container\":");
		sb_opt_str(&b, h->container);
		sb_lit(&b, ",\"start_time\":");
		sb_int(&b, (long long)h->start_time);
		sb_lit(&b, ",\"uid\":");
		sb_int(&b, h->uid);
		sb_lit(&b, ",\"user\":");
		sb_opt_str(&b, h->user);
		sb_lit(&b, ",\"gid\":");
		sb_int(&b, h->gid);
		sb_lit(&b, ",\"comm\":");
		sb_str(&b, h->comm);
		sb_lit(&b, ",\"cmdline\":[");
		for (char **a = h->cmdline; a && *a; a++) {
			if (a != h->cmdline)
				sb_put(&b, ",", 1);
			sb_str(&b, *a);
		}
		sb_lit(&b, "],\"host\":");
		sb_str(&b, h->host);
		sb_lit(&b, ",\"boot_id\":");
		sb_str(&b, h->boot_id);
		sb_lit(&b, "}");
	} else {
		sb_lit(&b, "null");
	}
	sb_lit(&b, ",\"acquired_at\":\"");
	sb_lit(&b, lockfs_format_time(r->acquired_at_ms, when));
	sb_lit(&b, "\",\"acquired_at_ms\":");
	sb_int(&b, r->acquired_at_ms);
	sb_lit(&b, ",\"operation\":");
	sb_opt_str(&b, r->operation);
	sb_lit(&b, ",\"slug\":");
	sb_opt_str(&b, r->slug);
	sb_lit(&b, ",\"lease\":");
	if (r->lease.ttl_s) {
		sb_lit(&b, "{\"ttl_s\":");
		sb_int(&b, r->lease.ttl_s);
		sb_lit(&b, ",\"expires_at\":\"");
		sb_lit(&b, lockfs_format_time(r->lease.expires_at_ms, when));
		sb_lit(&b, "\",\"expires_at_ms\":");
		sb_int(&b, r->lease.expires_at_ms);
		sb_lit(&b, ",\"deadline_boottime_ms\":");
		sb_int(&b, r->lease.deadline_boot_ms);
		sb_lit(&b, "}");
	} else {
		sb_lit(&b, "null");
	}
	sb_lit(&b, ",\"fence\":");
	if (r->fence)
		sb_int(&b, (long long)r->fence);
	else
		sb_lit(&b, "null"); /* the store issues it (see get_fence) */
	if (r->holder_session > 0) {
		sb_lit(&b, ",\"holder_session\":");
		sb_int(&b, r->holder_session);
	}
	if (r->holder_exited) {
		sb_lit(&b, ",\"holder_exited\":true,\"descendants\":[");
		for (size_t i = 0; i < r->ndescendants; i++) {
			const struct lockfs_descendant *d = &r->descendants[i];

			sb_lit(&b, i ? ",{\"pid\":" : "{\"pid\":");
			sb_int(&b, d->pid);
			sb_lit(&b, ",\"start_time\":");
			sb_int(&b, (long long)d->start_time);
			sb_lit(&b, ",\"comm\":");
			sb_str(&b, d->comm);
			sb_lit(&b, d->candidate ? ",\"via\":\"session\"}" : ",\"via\":\"tree\"}");
		}
		sb_lit(&b, "]");
	}
	if ((flags & LOCKFS_RECORD_WITH_TOKEN) && r->token[0] != '\0') {
		sb_lit(&b, ",\"token\":");
		sb_str(&b, r->token);
	}
	sb_lit(&b, "}\n");
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	b.p[b.len] = '\0';
	if (len)
		*len = b.len;
	return b.p;
}

/* R through jansson, showing command lines to WHO. */
static char *encode_tree(const struct lockfs_record *r, int flags, const struct audience *who,
			 size_t *len)
{
	size_t dump_flags = JSON_PRESERVE_ORDER;
	char when[32];
	json_t *o;
	char *out = NULL;
	size_t n;
	int err = 0;

	o = json_object();
	if (!o)
		return NULL;
	err |= add(o, "resource", str_json(r->resource));
	err |= add(o, "bound", json_string(lockfs_bound_name(r->bound)));
	err |= add(o, "mode", json_string(r->mode == LOCKFS_SHARED ? "shared" : "exclusive"));
	if (!(flags & LOCKFS_RECORD_PRETTY) && r->fd_owner[0])
		err |= add(o, "fd_owner", json_string(r->fd_owner));
	err |= add(o, "holder", r->has_holder ? holder_json(&r->holder,
							      shows_cmdline(who, &r->holder))
					      : json_null());
	if ((flags & LOCKFS_RECORD_PRETTY) || r->mode == LOCKFS_SHARED)
		err |= add(o, "holders", holders_json(r, flags, who));
	err |= add(o, "acquired_at",
		   json_string(lockfs_format_time(r->acquired_at_ms, when)));
	err |= add(o, "acquired_at_ms", json_integer(r->acquired_at_ms));
	err |= add(o, "operation", opt_str_json(r->operation));
	err |= add(o, "slug", opt_str_json(r->slug));
	err |= add(o, "lease", r->lease.ttl_s ? lease_json(&r->lease) : json_null());
	err |= add(o, "fence", fence_json(r->fence));
	if (r->holder_session > 0)
		err |= add(o, "holder_session", json_integer(r->holder_session));
	if (r->holder_exited) {
		err |= add(o, "holder_exited", json_true());
		err |= add(o, "descendants", descendants_json(r));
	}
	if ((flags & LOCKFS_RECORD_WITH_TOKEN) && r->token[0] != '\0')
		err |= add(o, "token", str_json(r->token));
	if (err)
		goto out;

	dump_flags |= (flags & LOCKFS_RECORD_PRETTY) ? JSON_INDENT(2) : JSON_COMPACT;
	/* json_dumpb into our own buffer, so the caller frees it with free()
	 * whatever allocator jansson was given. */
	n = json_dumpb(o, NULL, 0, dump_flags);
	if (n == 0)
		goto out;
	out = malloc(n + 2);
	if (!out)
		goto out;
	if (json_dumpb(o, out, n, dump_flags) != n) {
		free(out);
		out = NULL;
		goto out;
	}
	out[n] = '\n';
	out[n + 1] = '\0';
	if (len)
		*len = n + 1;
out:
	json_decref(o);
	return out;
}

char *lockfs_record_encode(const struct lockfs_record *r, int flags, size_t *len)
{
	static const struct audience everyone = { .all = true };

	/* Exclusive records (mkdir, and the fd lock a waiter is handed) have
	 * a fast hand-written encoder; shared ones go through jansson. */
	if (!(flags & LOCKFS_RECORD_PRETTY) && r->mode == LOCKFS_EXCLUSIVE && r->nshares == 0)
		return encode_compact(r, flags, len);
	return encode_tree(r, flags, &everyone, len);
}

char *lockfs_record_view(const struct lockfs_record *r, uid_t reader, size_t *len)
{
	struct audience who = { .all = false, .reader = reader };
	int flags = LOCKFS_RECORD_PRETTY;

	if (reader == 0 || (r->has_holder && reader == r->holder.uid))
		flags |= LOCKFS_RECORD_WITH_TOKEN;
	return encode_tree(r, flags, &who, len);
}

void lockfs_holder_clear(struct lockfs_holder *h)
{
	free(h->user);
	free(h->container);
	free(h->comm);
	free(h->host);
	free(h->boot_id);
	if (h->cmdline) {
		for (char **a = h->cmdline; *a; a++)
			free(*a);
		free(h->cmdline);
	}
	memset(h, 0, sizeof(*h));
}

void lockfs_record_clear(struct lockfs_record *r)
{
	if (!r)
		return;
	free(r->resource);
	free(r->operation);
	free(r->slug);
	lockfs_holder_clear(&r->holder);
	for (size_t i = 0; i < r->nshares; i++) {
		lockfs_holder_clear(&r->shares[i].holder);
		free(r->shares[i].slug);
	}
	free(r->shares);
	free(r->descendants);
	memset(r, 0, sizeof(*r));
}

/*
 * Parsing helpers.  Each returns 0, -EINVAL when the member is missing or
 * has the wrong type or range, or -ENOMEM.
 */

static int get_int(const json_t *o, const char *key, json_int_t min,
		   json_int_t max, json_int_t *out)
{
	json_t *v = json_object_get(o, key);
	json_int_t i;

	if (!json_is_integer(v))
		return -EINVAL;
	i = json_integer_value(v);
	if (i < min || i > max)
		return -EINVAL;
	*out = i;
	return 0;
}

/* A fence: a number >= 1, or null (0: a store that issues fences by its
 * writes, etcd, wrote the record before it knew the fence and supplies it
 * on every read). */
static int get_fence(const json_t *o, json_int_t *out)
{
	if (json_is_null(json_object_get(o, "fence"))) {
		*out = 0;
		return 0;
	}
	return get_int(o, "fence", 1, INT64_MAX, out);
}

static int dup_json_str(const json_t *v, size_t max, char **out)
{
	size_t n = json_string_length(v);

	/* JSON_ALLOW_NUL is not set, so the string holds no NUL. */
	if (n > max)
		return -EINVAL;
	*out = strndup(json_string_value(v), n);
	return *out ? 0 : -ENOMEM;
}

static int get_str(const json_t *o, const char *key, size_t max, char **out)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_string(v))
		return -EINVAL;
	return dup_json_str(v, max, out);
}

/* A string or null (*OUT = NULL); a missing key is an error. */
static int get_opt_str(const json_t *o, const char *key, size_t max, char **out)
{
	json_t *v = json_object_get(o, key);

	if (json_is_null(v)) {
		*out = NULL;
		return 0;
	}
	if (!json_is_string(v))
		return -EINVAL;
	return dup_json_str(v, max, out);
}

static int parse_cmdline(const json_t *v, char ***out)
{
	size_t n, i;
	char **argv;

	if (!json_is_array(v))
		return -EINVAL;
	n = json_array_size(v);
	if (n > RECORD_CMDLINE_MAX)
		return -EINVAL;
	/* Every element is checked before anything is allocated, so a
	 * failure leaves nothing half-built. */
	for (i = 0; i < n; i++)
		if (!json_is_string(json_array_get(v, i)))
			return -EINVAL;
	argv = calloc(n + 1, sizeof(*argv));
	if (!argv)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		if (dup_json_str(json_array_get(v, i), SIZE_MAX, &argv[i]) < 0) {
			while (i > 0)
				free(argv[--i]);
			free(argv);
			return -ENOMEM;
		}
	}
	*out = argv;
	return 0;
}

static int parse_holder(const json_t *o, struct lockfs_holder *h)
{
	json_int_t v;
	int rc;

	if (!json_is_object(o))
		return -EINVAL;
	if ((rc = get_int(o, "pid", 1, INT32_MAX, &v)) < 0)
		return rc;
	h->pid = (pid_t)v;
	/* ns_pid and container came later: a record without them (or with
	 * null) knows neither. */
	if (json_object_get(o, "ns_pid") && !json_is_null(json_object_get(o, "ns_pid"))) {
		if ((rc = get_int(o, "ns_pid", 1, INT32_MAX, &v)) < 0)
			return rc;
		h->ns_pid = (pid_t)v;
	}
	if (json_object_get(o, "container") &&
	    (rc = get_opt_str(o, "container", RECORD_CONTAINER_MAX, &h->container)) < 0)
		return rc;
	if ((rc = get_int(o, "start_time", 0, INT64_MAX, &v)) < 0)
		return rc;
	h->start_time = (unsigned long long)v;
	if ((rc = get_int(o, "uid", 0, UINT32_MAX, &v)) < 0)
		return rc;
	h->uid = (uid_t)v;
	if ((rc = get_int(o, "gid", 0, UINT32_MAX, &v)) < 0)
		return rc;
	h->gid = (gid_t)v;
	if ((rc = get_opt_str(o, "user", SIZE_MAX, &h->user)) < 0)
		return rc;
	if ((rc = get_str(o, "comm", SIZE_MAX, &h->comm)) < 0)
		return rc;
	if ((rc = parse_cmdline(json_object_get(o, "cmdline"), &h->cmdline)) < 0)
		return rc;
	if ((rc = get_str(o, "host", SIZE_MAX, &h->host)) < 0)
		return rc;
	return get_str(o, "boot_id", SIZE_MAX, &h->boot_id);
}

/*
 * A token is exactly LOCKFS_TOKEN_HEX lower-case hex digits.  Upper case is
 * refused: lockfs only ever writes lower case, and the engine compares
 * tokens as strings, so accepting "ABC..." would make two spellings of one
 * token compare unequal.
 */
static int parse_token(const json_t *o, char token[LOCKFS_TOKEN_HEX + 1])
{
	json_t *v = json_object_get(o, "token");
	const char *s;

	if (!json_is_string(v) || json_string_length(v) != LOCKFS_TOKEN_HEX)
		return -EINVAL;
	s = json_string_value(v);
	for (size_t i = 0; i < LOCKFS_TOKEN_HEX; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return -EINVAL;
	memcpy(token, s, LOCKFS_TOKEN_HEX);
	token[LOCKFS_TOKEN_HEX] = '\0';
	return 0;
}

static int parse_bound(const json_t *v, enum lockfs_bound *out)
{
	const char *b = json_string_value(v);

	if (!b)
		return -EINVAL;
	if (strcmp(b, "process") == 0)
		*out = LOCKFS_BOUND_PROCESS;
	else if (strcmp(b, "slug") == 0)
		*out = LOCKFS_BOUND_SLUG;
	else if (strcmp(b, "fd") == 0)
		*out = LOCKFS_BOUND_FD;
	else
		return -EINVAL;
	return 0;
}

/* An optional "fd_owner": a string shorter than LOCKFS_FD_OWNER_MAX. */
static int parse_fd_owner(const json_t *o, char out[LOCKFS_FD_OWNER_MAX])
{
	json_t *v = json_object_get(o, "fd_owner");

	out[0] = '\0';
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v) || json_string_length(v) == 0 ||
	    json_string_length(v) >= LOCKFS_FD_OWNER_MAX)
		return -EINVAL;
	memcpy(out, json_string_value(v), json_string_length(v) + 1);
	return 0;
}

/* "holders" of a shared record: element 0 repeats `holder`; the rest
 * are the other holders. */
static int parse_shares(const json_t *o, struct lockfs_record *r)
{
	json_t *a = json_object_get(o, "holders");
	size_t n;
	json_int_t v, v2;
	int rc;

	if (!a)
		return 0;
	if (!json_is_array(a) || json_array_size(a) < 1 || !r->has_holder ||
	    json_array_size(a) > LOCKFS_SHARED_MAX)
		return -EINVAL;
	n = json_array_size(a) - 1;
	/* holders[0] is `holder`: only its own grant is new here. */
	if (json_is_object(json_array_get(a, 0))) {
		const json_t *first = json_array_get(a, 0);

		if (get_int(first, "fence", 1, INT64_MAX, &v) == 0 &&
		    get_int(first, "acquired_at_ms", INT64_MIN, INT64_MAX, &v2) == 0) {
			r->holder_fence = (uint64_t)v;
			r->holder_acquired_at_ms = v2;
		}
	}
	if (n == 0)
		return 0;
	r->shares = calloc(n, sizeof(*r->shares));
	if (!r->shares)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const json_t *e = json_array_get(a, i + 1);
		struct lockfs_share *sh = &r->shares[i];

		r->nshares = i + 1; /* cleared by the caller on failure */
		if ((rc = parse_holder(e, &sh->holder)) < 0)
			return rc;
		if ((rc = parse_bound(json_object_get(e, "bound"), &sh->bound)) < 0)
			return rc;
		if (sh->bound == LOCKFS_BOUND_SLUG)
			return -EINVAL;
		if ((rc = parse_fd_owner(e, sh->fd_owner)) < 0)
			return rc;
		if ((sh->bound == LOCKFS_BOUND_FD) != (sh->fd_owner[0] != '\0'))
			return -EINVAL;
		if ((rc = get_fence(e, &v)) < 0)
			return rc;
		sh->fence = (uint64_t)v;
		if ((rc = get_int(e, "acquired_at_ms", INT64_MIN, INT64_MAX, &v)) < 0)
			return rc;
		sh->acquired_at_ms = v;
		/* Optional: shares stored before it was kept have none. */
		if (json_object_get(e, "slug") &&
		    (rc = get_opt_str(e, "slug", SIZE_MAX, &sh->slug)) < 0)
			return rc;
	}
	return 0;
}

/* The optional "holder_session", "holder_exited" and "descendants".
 * Records written before they existed have none: session unknown, holder
 * not known to have exited. */
static int parse_descendants(const json_t *o, struct lockfs_record *r)
{
	json_t *v = json_object_get(o, "holder_session"), *a;
	json_int_t n;
	int rc;

	if (v && (rc = get_int(o, "holder_session", 0, INT32_MAX, &n)) < 0)
		return rc;
	r->holder_session = v ? (pid_t)n : 0;
	v = json_object_get(o, "holder_exited");
	if (!v || json_is_false(v))
		return 0;
	if (!json_is_true(v))
		return -EINVAL;
	a = json_object_get(o, "descendants");
	if (!json_is_array(a) || json_array_size(a) > LOCKFS_DESCENDANTS_MAX)
		return -EINVAL;
	r->holder_exited = true;
	if (json_array_size(a) == 0)
		return 0;
	r->descendants = calloc(json_array_size(a), sizeof(*r->descendants));
	if (!r->descendants)
		return -ENOMEM;
	for (size_t i = 0; i < json_array_size(a); i++) {
		const json_t *e = json_array_get(a, i), *comm, *via;
		struct lockfs_descendant *d = &r->descendants[i];

		if (!json_is_object(e))
			return -EINVAL;
		if ((rc = get_int(e, "pid", 1, INT32_MAX, &n)) < 0)
			return rc;
		d->pid = (pid_t)n;
		if ((rc = get_int(e, "start_time", 0, INT64_MAX, &n)) < 0)
			return rc;
		d->start_time = (unsigned long long)n;
		/* Informative only: cut to what a comm can be. */
		comm = json_object_get(e, "comm");
		if (comm && !json_is_string(comm))
			return -EINVAL;
		if (comm)
			snprintf(d->comm, sizeof(d->comm), "%s", json_string_value(comm));
		/* Anything but a known proof counts as a mere candidate. */
		via = json_object_get(e, "via");
		d->candidate = !json_is_string(via) || strcmp(json_string_value(via), "tree") != 0;
		r->ndescendants = i + 1;
	}
	return 0;
}

static int parse_object(const json_t *o, struct lockfs_record *r)
{
	json_t *holder, *lease, *bound, *mode;
	json_int_t v;
	int rc;

	if (!json_is_object(o))
		return -EINVAL;
	if ((rc = get_str(o, "resource", SIZE_MAX, &r->resource)) < 0)
		return rc;
	/* Records written before "bound" existed were all process-bound. */
	bound = json_object_get(o, "bound");
	if (!bound)
		r->bound = LOCKFS_BOUND_PROCESS;
	else if ((rc = parse_bound(bound, &r->bound)) < 0)
		return rc;
	/* ... and before "mode", all exclusive. */
	mode = json_object_get(o, "mode");
	if (mode && (!json_is_string(mode) ||
		     (strcmp(json_string_value(mode), "exclusive") != 0 &&
		      strcmp(json_string_value(mode), "shared") != 0)))
		return -EINVAL;
	r->mode = mode && strcmp(json_string_value(mode), "shared") == 0 ? LOCKFS_SHARED
									 : LOCKFS_EXCLUSIVE;
	if ((rc = parse_fd_owner(o, r->fd_owner)) < 0)
		return rc;
	if ((r->bound == LOCKFS_BOUND_FD) != (r->fd_owner[0] != '\0'))
		return -EINVAL;
	if (r->bound == LOCKFS_BOUND_SLUG && !json_is_string(json_object_get(o, "slug")))
		return -EINVAL;
	holder = json_object_get(o, "holder");
	if (!holder)
		return -EINVAL;
	if (!json_is_null(holder)) {
		r->has_holder = true;
		if ((rc = parse_holder(holder, &r->holder)) < 0)
			return rc;
	}
	/* The human-readable copy must be there, but the milliseconds are
	 * what counts. */
	if (!json_is_string(json_object_get(o, "acquired_at")))
		return -EINVAL;
	if ((rc = get_int(o, "acquired_at_ms", INT64_MIN, INT64_MAX, &v)) < 0)
		return rc;
	r->acquired_at_ms = v;
	if ((rc = get_opt_str(o, "operation", LOCKFS_OPERATION_MAX, &r->operation)) < 0)
		return rc;
	if ((rc = get_opt_str(o, "slug", SIZE_MAX, &r->slug)) < 0)
		return rc;
	lease = json_object_get(o, "lease");
	if (json_is_object(lease)) {
		if ((rc = get_int(lease, "ttl_s", 1, UINT32_MAX, &v)) < 0)
			return rc;
		r->lease.ttl_s = (uint32_t)v;
		if ((rc = get_int(lease, "deadline_boottime_ms", INT64_MIN, INT64_MAX, &v)) < 0)
			return rc;
		r->lease.deadline_boot_ms = v;
		if ((rc = get_int(lease, "expires_at_ms", INT64_MIN, INT64_MAX, &v)) < 0)
			return rc;
		r->lease.expires_at_ms = v;
	} else if (!json_is_null(lease)) {
		return -EINVAL;
	}
	if ((rc = get_fence(o, &v)) < 0)
		return rc;
	r->fence = (uint64_t)v;
	if (r->mode == LOCKFS_SHARED && (rc = parse_shares(o, r)) < 0)
		return rc;
	if ((rc = parse_descendants(o, r)) < 0)
		return rc;
	/* Unknown keys are ignored, for the same forward compatibility. */
	return parse_token(o, r->token);
}

int lockfs_record_parse(const char *buf, size_t len, struct lockfs_record *out)
{
	json_error_t jerr;
	json_t *root;
	int rc;

	memset(out, 0, sizeof(*out));
	/* Size first: never hand an attacker-sized buffer to the parser. */
	if (len > LOCKFS_RECORD_MAX)
		return -EFBIG;
	if (!buf)
		return -EINVAL;
	/* Without JSON_DECODE_ANY the top level must be an object or array;
	 * without JSON_ALLOW_NUL "\u0000" is refused, so strings stay C
	 * strings; trailing garbage after the value is refused. */
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return json_error_code(&jerr) == json_error_out_of_memory ? -ENOMEM : -EINVAL;
	rc = parse_object(root, out);
	json_decref(root);
	if (rc < 0)
		lockfs_record_clear(out);
	return rc;
}

int lockfs_record_peek_fence(const char *buf, size_t len, uint64_t *fence)
{
	json_error_t jerr;
	json_int_t v;
	json_t *root;
	int rc;

	if (len > LOCKFS_RECORD_MAX)
		return -EFBIG;
	if (!buf)
		return -EINVAL;
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return json_error_code(&jerr) == json_error_out_of_memory ? -ENOMEM : -EINVAL;
	rc = json_is_object(root) ? get_int(root, "fence", 1, INT64_MAX, &v) : -EINVAL;
	json_decref(root);
	if (rc == 0)
		*fence = (uint64_t)v;
	return rc;
}

char *lockfs_lease_encode(const struct lockfs_lease *lease, size_t *len)
{
	json_t *o = lease->ttl_s ? lease_json(lease) : json_null();
	char *s, *out;
	size_t n;

	if (!o)
		return NULL;
	s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_ENCODE_ANY);
	json_decref(o);
	if (!s)
		return NULL;
	n = strlen(s);
	out = malloc(n + 2);
	if (out) {
		memcpy(out, s, n);
		out[n] = '\n';
		out[n + 1] = '\0';
		*len = n + 1;
	}
	free(s);
	return out;
}
