/*
 * One line of the watch stream, read into a struct lockfs_etcd_line: with
 * jansson (any line etcd may send), or first by a scanner that knows only
 * the line that comes for every write -- events and nothing else.
 *
 * Why two: every write under the prefix, this daemon's own included, comes
 * back as one such line, and jansson took 16 µs to load one of a try-lock
 * (840 bytes, warm; more in the daemon), building a tree of allocated
 * objects and strings to be read once.  The watch thread does that work
 * right when the write's own answer reaches the thread that waits for it,
 * on the CPUs etcd needs.  The scanner reads such a line in place.  It takes
 * a line only if it is exactly
 *   {"result":{"header":{...},"events":[{"type":"DELETE","kv":{...}},...]}}
 * (keys in any order, "type" optional), every string without a backslash,
 * every number a decimal string; anything else -- "created", "canceled",
 * "compact_revision", "prev_kv", an error, a progress notification, an
 * escape -- is left to jansson, which decides as it always did.  Both give
 * the same result for a line the scanner takes (tests/unit/test_watch_line.c
 * compares them, mutations included).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- jansson ---- */

static int parse_events(const json_t *arr, struct lockfs_etcd_event **out, size_t *n)
{
	size_t count = json_array_size(arr);
	struct lockfs_etcd_event *ev;

	*out = NULL;
	*n = 0;
	if (!json_is_array(arr))
		return -EPROTO;
	ev = calloc(count ? count : 1, sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	for (size_t i = 0; i < count; i++) {
		const json_t *e = json_array_get(arr, i);
		const json_t *type = json_object_get(e, "type");
		const json_t *prev = json_object_get(e, "prev_kv");

		/* PUT is the enum's zero, so it is never written out. */
		const char *t = json_is_string(type) ? json_string_value(type) : NULL;
		int rc = 0;

		if (!type || json_is_null(type) || (t && !strcmp(t, "PUT")))
			ev[i].type = LOCKFS_ETCD_EVENT_PUT;
		else if (t && !strcmp(t, "DELETE"))
			ev[i].type = LOCKFS_ETCD_EVENT_DELETE;
		else
			rc = -EPROTO;
		if (!rc)
			rc = lockfs_etcd_parse_kv(json_object_get(e, "kv"), &ev[i].kv);
		if (!rc && prev) {
			rc = lockfs_etcd_parse_kv(prev, &ev[i].prev_kv);
			ev[i].has_prev_kv = !rc;
		}
		if (rc) {
			lockfs_etcd_events_free(ev, i + 1);
			return rc;
		}
	}
	*out = ev;
	*n = count;
	return 0;
}

int lockfs_etcd_line_json(const char *text, size_t len, struct lockfs_etcd_line *l)
{
	json_t *j = json_loadb(text, len, 0, NULL);
	const json_t *r = json_object_get(j, "result");
	int rc;

	memset(l, 0, sizeof(*l));
	if (!json_is_object(r)) {
		/* {"error":{"grpc_code":1,"message":"grpc: the client
		 * connection is closing",...}} when etcd stops. */
		rc = json_is_object(json_object_get(j, "error")) ? -ECONNRESET : -EPROTO;
		json_decref(j);
		return rc;
	}
	rc = lockfs_etcd_get_int64(json_object_get(r, "header"), "revision", &l->revision);
	if (!rc)
		rc = lockfs_etcd_get_int64(r, "compact_revision", &l->compact_revision);
	if (!rc && json_object_get(r, "events"))
		rc = parse_events(json_object_get(r, "events"), &l->events, &l->n_events);
	if (!rc)
		rc = lockfs_etcd_get_int64(r, "watch_id", &l->watch_id);
	l->created = lockfs_etcd_get_bool(r, "created");
	l->canceled = lockfs_etcd_get_bool(r, "canceled");
	json_decref(j);
	if (rc)
		memset(l, 0, sizeof(*l));
	return rc;
}

/* ---- the scanner ---- */

struct scan {
	const char *p, *end;
};

static void skip_ws(struct scan *s)
{
	while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r' || *s->p == '\n'))
		s->p++;
}

/* C at the cursor (after blanks): consumed, true. */
static bool eat(struct scan *s, char c)
{
	skip_ws(s);
	if (s->p < s->end && *s->p == c) {
		s->p++;
		return true;
	}
	return false;
}

/* A string without escapes or control characters: its bytes in place. */
static bool string(struct scan *s, const char **str, size_t *len)
{
	const char *q;

	if (!eat(s, '"'))
		return false;
	/* ASCII only: jansson checks UTF-8, and what etcd writes here is
	 * base64, digits and words. */
	for (q = s->p; q < s->end && *q != '"'; q++)
		if (*q == '\\' || (unsigned char)*q < 0x20 || (unsigned char)*q >= 0x80)
			return false;
	if (q == s->end)
		return false;
	*str = s->p;
	*len = (size_t)(q - s->p);
	s->p = q + 1;
	return true;
}

static bool is(const char *str, size_t len, const char *word)
{
	return strlen(word) == len && memcmp(str, word, len) == 0;
}

/* A decimal string, as etcd's gateway writes an int64: "-"? digits,
 * within range. */
static bool decimal(struct scan *s, int64_t *v)
{
	const char *str;
	size_t len, i = 0;
	bool neg;
	uint64_t u = 0;

	if (!string(s, &str, &len) || len == 0 || len > 20)
		return false;
	neg = str[0] == '-';
	if (neg && len == 1)
		return false;
	for (i = neg; i < len; i++) {
		if (str[i] < '0' || str[i] > '9')
			return false;
		if (u > (UINT64_MAX - 9) / 10)
			return false;
		u = u * 10 + (uint64_t)(str[i] - '0');
	}
	if (neg ? u > (uint64_t)INT64_MAX + 1 : u > (uint64_t)INT64_MAX)
		return false;
	*v = neg ? (int64_t)(0 - u) : (int64_t)u;
	return true;
}

/* "header": an object of strings (cluster_id and member_id are uint64);
 * its "revision", a decimal. */
static bool header(struct scan *s, int64_t *revision)
{
	bool seen = false;

	if (!eat(s, '{'))
		return false;
	if (eat(s, '}'))
		return true;
	do {
		const char *k, *v;
		size_t kl, vl;

		if (!string(s, &k, &kl) || !eat(s, ':'))
			return false;
		if (is(k, kl, "revision")) {
			if (seen || !decimal(s, revision))
				return false;  /* twice: jansson keeps the last, not ours to guess */
			seen = true;
		} else if (!string(s, &v, &vl)) {
			return false;
		}
	} while (eat(s, ','));
	return eat(s, '}');
}

/* A kv object into KV (missing fields: zero, empty; each at most once). */
static bool kv(struct scan *s, struct lockfs_etcd_kv *kv)
{
	const char *key = "", *value = "";
	size_t key_len = 0, value_len = 0;
	unsigned seen = 0;

	memset(kv, 0, sizeof(*kv));
	if (!eat(s, '{'))
		return false;
	if (!eat(s, '}')) {
		do {
			const char *k;
			size_t kl;
			unsigned bit;
			bool ok;

			if (!string(s, &k, &kl) || !eat(s, ':'))
				return false;
			if (is(k, kl, "key")) {
				bit = 1;
				ok = string(s, &key, &key_len);
			} else if (is(k, kl, "value")) {
				bit = 2;
				ok = string(s, &value, &value_len);
			} else if (is(k, kl, "create_revision")) {
				bit = 4;
				ok = decimal(s, &kv->create_revision);
			} else if (is(k, kl, "mod_revision")) {
				bit = 8;
				ok = decimal(s, &kv->mod_revision);
			} else if (is(k, kl, "version")) {
				bit = 16;
				ok = decimal(s, &kv->version);
			} else if (is(k, kl, "lease")) {
				bit = 32;
				ok = decimal(s, &kv->lease);
			} else {
				return false;
			}
			if (!ok || (seen & bit))
				return false;
			seen |= bit;
		} while (eat(s, ','));
		if (!eat(s, '}'))
			return false;
	}
	if (lockfs_etcd_b64_decode(key, key_len, &kv->key, &kv->key_len) < 0)
		return false;
	if (lockfs_etcd_b64_decode(value, value_len, &kv->value, &kv->value_len) < 0) {
		lockfs_etcd_kv_clear(kv);
		return false;
	}
	return true;
}

/* One event object into EV. */
static bool event(struct scan *s, struct lockfs_etcd_event *ev)
{
	bool have_type = false, have_kv = false, ok = true;

	memset(ev, 0, sizeof(*ev));
	if (!eat(s, '{'))
		return false;
	do {
		const char *k, *t;
		size_t kl, tl;

		if (!string(s, &k, &kl) || !eat(s, ':')) {
			ok = false;
		} else if (is(k, kl, "type") && !have_type) {
			have_type = true;
			if (!string(s, &t, &tl))
				ok = false;
			else if (is(t, tl, "PUT"))
				ev->type = LOCKFS_ETCD_EVENT_PUT;
			else if (is(t, tl, "DELETE"))
				ev->type = LOCKFS_ETCD_EVENT_DELETE;
			else
				ok = false;
		} else if (is(k, kl, "kv") && !have_kv) {
			ok = kv(s, &ev->kv);
			have_kv = ok;
		} else {
			ok = false;  /* prev_kv, or anything new */
		}
	} while (ok && eat(s, ','));
	if (ok && have_kv && eat(s, '}'))
		return true;
	lockfs_etcd_kv_clear(&ev->kv);
	return false;
}

/* "events": a non-empty array of events. */
static bool events(struct scan *s, struct lockfs_etcd_line *l)
{
	size_t cap = 4;

	if (!eat(s, '['))
		return false;
	l->events = calloc(cap, sizeof(*l->events));
	if (!l->events)
		return false;
	do {
		if (l->n_events == cap) {
			struct lockfs_etcd_event *v = realloc(l->events, 2 * cap * sizeof(*v));

			if (!v)
				return false;
			l->events = v;
			cap *= 2;
		}
		if (!event(s, &l->events[l->n_events]))
			return false;
		l->n_events++;
	} while (eat(s, ','));
	return eat(s, ']');
}

int lockfs_etcd_line_fast(const char *text, size_t len, struct lockfs_etcd_line *l)
{
	struct scan s = { text, text + len };
	bool have_header = false, have_events = false, ok = true;
	const char *k;
	size_t kl;

	memset(l, 0, sizeof(*l));
	if (!eat(&s, '{') || !string(&s, &k, &kl) || !is(k, kl, "result") || !eat(&s, ':') ||
	    !eat(&s, '{'))
		return 0;
	do {
		if (!string(&s, &k, &kl) || !eat(&s, ':')) {
			ok = false;
		} else if (is(k, kl, "header") && !have_header) {
			have_header = true;
			ok = header(&s, &l->revision);
		} else if (is(k, kl, "watch_id")) {
			ok = decimal(&s, &l->watch_id);
		} else if (is(k, kl, "events") && !have_events) {
			have_events = true;
			ok = events(&s, l);
		} else {
			ok = false;  /* created, canceled, compact_revision, ... */
		}
	} while (ok && eat(&s, ','));
	ok = ok && have_events && l->n_events > 0 && eat(&s, '}') && eat(&s, '}');
	skip_ws(&s);
	if (ok && s.p == s.end)
		return 1;
	lockfs_etcd_events_free(l->events, l->n_events);
	memset(l, 0, sizeof(*l));
	return 0;
}

void lockfs_etcd_events_free(struct lockfs_etcd_event *ev, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		lockfs_etcd_kv_clear(&ev[i].kv);
		lockfs_etcd_kv_clear(&ev[i].prev_kv);
	}
	free(ev);
}
