/*
 * The lock record as JSON, through jansson (include/lockfs/record.h):
 * what `owner` shows each reader, shared records, the lease, and the
 * choice of encoder (an exclusive record's compact form is
 * record_compact.c's, which must match this one byte for byte).
 *
 * Key order is part of the format people read (`cat M/NAME/owner`), so
 * objects are built in the documented order and dumped with
 * JSON_PRESERVE_ORDER.  Strings come from /proc and may be any bytes;
 * jansson refuses invalid UTF-8, so they are repaired first (each bad byte
 * becomes U+FFFD) rather than losing the whole record.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lockfs/record.h"
#include "lockfs/utf8.h"
#include "clock.h"
#include "record_compact.h"

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

/* A fence, or null for 0 (see get_fence in record_parse.c). */
static json_t *fence_json(uint64_t fence)
{
	return fence ? json_integer((json_int_t)fence) : json_null();
}

/* A JSON string for S, or null when S is NULL.  NULL when out of memory. */
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

/* Whose command lines a rendering shows: everyone's (the stored record),
 * or those a reader may see (root: those it is root over). */
struct audience {
	bool all;
	const struct lockfs_reader *reader;
};

bool lockfs_reader_root_over(const struct lockfs_reader *r, const struct lockfs_holder *h)
{
	if (!r->container)
		return true;
	/* A pid namespace's number means nothing on another host or in
	 * another boot; a runtime's id is compared the same way. */
	return h->container && strcmp(h->container, r->container) == 0 && h->host && r->host &&
	       strcmp(h->host, r->host) == 0 && h->boot_id && r->boot_id &&
	       strcmp(h->boot_id, r->boot_id) == 0;
}

/* The holder's own user (not root, which in a container is no proof of
 * being the holder's: uid 0 is every container's root without a user
 * namespace), or root over it. */
static bool reader_is_for(const struct lockfs_reader *r, const struct lockfs_holder *h)
{
	return r->uid == 0 ? lockfs_reader_root_over(r, h) : r->uid == h->uid;
}

static bool shows_cmdline(const struct audience *a, const struct lockfs_holder *h)
{
	return a->all || reader_is_for(a->reader, h);
}

/* One element of "holders": the holder's object plus its grant. */
static json_t *share_json(const struct lockfs_holder *h, enum lockfs_bound bound,
			  const char *fd_owner, uint64_t via_file, uint64_t fence, int64_t at_ms,
			  const char *slug, int flags, const struct audience *a)
{
	json_t *o = holder_json(h, shows_cmdline(a, h));
	char when[32];
	int err = 0;

	if (!o)
		return NULL;
	err |= add(o, "bound", json_string(lockfs_bound_name(bound)));
	if (!(flags & LOCKFS_RECORD_PRETTY) && fd_owner[0])
		err |= add(o, "fd_owner", json_string(fd_owner));
	if (!(flags & LOCKFS_RECORD_PRETTY) && LOCKFS_RECORD_ID_OK(via_file))
		err |= add(o, "via_file", json_integer((json_int_t)via_file));
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
	    json_array_append_new(a, share_json(&r->holder, r->bound, r->fd_owner, r->via_file,
						lockfs_holder_fence(r),
						lockfs_holder_acquired_at(r), r->slug, flags,
						who)) < 0)
		goto fail;
	for (size_t i = 0; i < r->nshares; i++) {
		const struct lockfs_share *sh = &r->shares[i];

		if (json_array_append_new(a, share_json(&sh->holder, sh->bound, sh->fd_owner,
							sh->via_file, sh->fence, sh->acquired_at_ms, sh->slug,
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
	/* The kernel's numbers stay inside, as fd_owner does. */
	if (!(flags & LOCKFS_RECORD_PRETTY) && LOCKFS_RECORD_ID_OK(r->via_file))
		err |= add(o, "via_file", json_integer((json_int_t)r->via_file));
	if (!(flags & LOCKFS_RECORD_PRETTY) && LOCKFS_RECORD_ID_OK(r->ticket))
		err |= add(o, "ticket", json_integer((json_int_t)r->ticket));
	if (!(flags & LOCKFS_RECORD_PRETTY) && LOCKFS_RECORD_ID_OK(r->handed_by))
		err |= add(o, "handed_by", json_integer((json_int_t)r->handed_by));
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
		return lockfs_record_encode_compact(r, flags, len);
	return encode_tree(r, flags, &everyone, len);
}

char *lockfs_record_view_for(const struct lockfs_record *r, const struct lockfs_reader *reader,
			     size_t *len)
{
	struct audience who = { .all = false, .reader = reader };
	int flags = LOCKFS_RECORD_PRETTY;

	/* A record without a holder: its token is for root outside containers. */
	if (r->has_holder ? reader_is_for(reader, &r->holder)
			  : reader->uid == 0 && !reader->container)
		flags |= LOCKFS_RECORD_WITH_TOKEN;
	return encode_tree(r, flags, &who, len);
}

char *lockfs_record_view(const struct lockfs_record *r, uid_t reader, size_t *len)
{
	const struct lockfs_reader whole = { .uid = reader };

	return lockfs_record_view_for(r, &whole, len);
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
