/* The compact encoding of an exclusive record, written by hand (see
 * record_compact.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/record.h"
#include "lockfs/utf8.h"
#include "clock.h"
#include "record_compact.h"

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

char *lockfs_record_encode_compact(const struct lockfs_record *r, int flags, size_t *len)
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
	if (LOCKFS_RECORD_ID_OK(r->via_file)) {
		sb_lit(&b, ",\"via_file\":");
		sb_int(&b, (long long)r->via_file);
	}
	if (LOCKFS_RECORD_ID_OK(r->ticket)) {
		sb_lit(&b, ",\"ticket\":");
		sb_int(&b, (long long)r->ticket);
	}
	if (LOCKFS_RECORD_ID_OK(r->handed_by)) {
		sb_lit(&b, ",\"handed_by\":");
		sb_int(&b, (long long)r->handed_by);
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
