/*
 * The event ring (events.h).  Each event is one JSON line, formatted when
 * it happens (under the caller's stripe mutex: the lines come out in the
 * order the audit log has them) and kept in a ring of LOCKFS_EVENTS_RING
 * slots numbered by a 64-bit sequence.  Readers hold only a cursor (a
 * sequence number): a reader that falls behind loses the oldest events,
 * and is told how many, but never slows the engine down.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "events.h"
#include "lockfs/utf8.h"

struct slot {
	uint64_t seq;  /* which event the slot holds now */
	char *name;    /* its lock name ("" for none) */
	char *line;    /* the JSON line, newline included; NULL: lost (no memory) */
	size_t len;
};

struct lockfs_events {
	pthread_mutex_t mu;    /* protects everything below but readers */
	pthread_cond_t cond;   /* signalled when head moves or the ring shuts */
	int readers;           /* attached readers: __atomic, read without mu */
	uint64_t head;         /* the next event's sequence number */
	bool shut;
	struct slot slots[LOCKFS_EVENTS_RING];
};

int lockfs_events_new(struct lockfs_events **out)
{
	struct lockfs_events *ev = calloc(1, sizeof(*ev));

	if (!ev)
		return -ENOMEM;
	pthread_mutex_init(&ev->mu, NULL);
	pthread_cond_init(&ev->cond, NULL);
	*out = ev;
	return 0;
}

static void slot_clear(struct slot *s)
{
	free(s->name);
	free(s->line);
	s->name = s->line = NULL;
	s->len = 0;
}

void lockfs_events_free(struct lockfs_events *ev)
{
	if (!ev)
		return;
	for (size_t i = 0; i < LOCKFS_EVENTS_RING; i++)
		slot_clear(&ev->slots[i]);
	pthread_cond_destroy(&ev->cond);
	pthread_mutex_destroy(&ev->mu);
	free(ev);
}

uint64_t lockfs_events_attach(struct lockfs_events *ev)
{
	uint64_t head;

	pthread_mutex_lock(&ev->mu);
	__atomic_add_fetch(&ev->readers, 1, __ATOMIC_SEQ_CST);
	head = ev->head;
	pthread_mutex_unlock(&ev->mu);
	return head;
}

void lockfs_events_detach(struct lockfs_events *ev)
{
	__atomic_sub_fetch(&ev->readers, 1, __ATOMIC_SEQ_CST);
}

bool lockfs_events_watched(struct lockfs_events *ev)
{
	return ev && __atomic_load_n(&ev->readers, __ATOMIC_RELAXED) > 0;
}

/* A growing text; on failure (no memory) OK turns false and stays so. */
struct text {
	char *s;
	size_t len, cap;
	bool ok;
};

static void put(struct text *t, const char *s, size_t n)
{
	if (!t->ok)
		return;
	if (t->len + n + 1 > t->cap) {
		size_t cap = (t->len + n + 1) * 2;
		char *p = realloc(t->s, cap);

		if (!p) {
			t->ok = false;
			return;
		}
		t->s = p;
		t->cap = cap;
	}
	memcpy(t->s + t->len, s, n);
	t->len += n;
	t->s[t->len] = '\0';
}

static void puts_(struct text *t, const char *s)
{
	put(t, s, strlen(s));
}

/* S as a JSON string: quotes, backslashes and controls escaped; a byte
 * that does not begin valid UTF-8 (a `comm` cut inside a character)
 * becomes U+FFFD, so that every line is valid JSON. */
static void put_string(struct text *t, const char *s)
{
	size_t n = s ? strlen(s) : 0;
	char esc[8];

	put(t, "\"", 1);
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)s[i];
		size_t len;

		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			put(t, esc, 2);
			i++;
		} else if (c < 0x20 || c == 0x7f) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			put(t, esc, 6);
			i++;
		} else if (c < 0x80) {
			put(t, s + i, 1);
			i++;
		} else if ((len = lockfs_utf8_decode(s + i, n - i, NULL)) > 0) {
			put(t, s + i, len);
			i += len;
		} else {
			put(t, "\\ufffd", 6);
			i++;
		}
	}
	put(t, "\"", 1);
}

/* A decimal number that fits a JSON integer exactly (at most 15 digits,
 * no leading zero)? */
static bool is_number(const char *v)
{
	size_t n = strspn(v, "0123456789");

	return n > 0 && n <= 15 && v[n] == '\0' && (v[0] != '0' || n == 1);
}

/* The JSON line of one event into T. */
static void format_event(struct text *t, const char *who, const char *name,
			 const char *const *kv, const char *event)
{
	char time[32], ms[24];
	int64_t now = lockfs_wall_ms();

	lockfs_format_time(now, time);
	snprintf(ms, sizeof(ms), "%lld", (long long)now);
	puts_(t, "{\"time\":");
	put_string(t, time);
	puts_(t, ",\"time_ms\":");
	puts_(t, ms);
	puts_(t, ",\"event\":");
	put_string(t, event);
	puts_(t, ",\"name\":");
	put_string(t, name ? name : "");
	puts_(t, ",\"who\":");
	put_string(t, who ? who : "");
	for (; kv && kv[0] && kv[1]; kv += 2) {
		/* Keys the line already has are not written twice. */
		if (!strcmp(kv[0], "time") || !strcmp(kv[0], "time_ms") || !strcmp(kv[0], "event") ||
		    !strcmp(kv[0], "name") || !strcmp(kv[0], "who"))
			continue;
		puts_(t, ",");
		put_string(t, kv[0]);
		puts_(t, ":");
		if (is_number(kv[1]))
			puts_(t, kv[1]);
		else
			put_string(t, kv[1]);
	}
	puts_(t, "}\n");
}

void lockfs_events_note(struct lockfs_events *ev, const char *who, const char *name,
			const char *const *kv, const char *event)
{
	struct text t = { .ok = true };
	char *copy;
	struct slot *s;

	if (!lockfs_events_watched(ev))
		return;
	format_event(&t, who, name, kv, event);
	copy = strdup(name ? name : "");
	pthread_mutex_lock(&ev->mu);
	s = &ev->slots[ev->head % LOCKFS_EVENTS_RING];
	slot_clear(s);
	s->seq = ev->head++;
	if (t.ok && copy) {
		s->line = t.s;
		s->len = t.len;
		s->name = copy;
		t.s = copy = NULL;
	}
	pthread_cond_broadcast(&ev->cond);
	pthread_mutex_unlock(&ev->mu);
	free(t.s);
	free(copy);
}

/* The `overrun` line for *LOST events into BUF at *USED, if it fits:
 * then *LOST is 0 and true is returned. */
static bool put_overrun(char *buf, size_t size, size_t *used, uint64_t *lost)
{
	char line[64];
	int n = snprintf(line, sizeof(line), "{\"event\":\"overrun\",\"lost\":%llu}\n",
			 (unsigned long long)*lost);

	if ((size_t)n > size - *used)
		return false;
	memcpy(buf + *used, line, (size_t)n);
	*used += (size_t)n;
	*lost = 0;
	return true;
}

ssize_t lockfs_events_take(struct lockfs_events *ev, uint64_t *cursor, char *buf, size_t size,
			   lockfs_events_want_fn want, void *arg)
{
	size_t used = 0;
	uint64_t lost = 0;
	bool too_small = false;

	pthread_mutex_lock(&ev->mu);
	if (ev->head - *cursor > LOCKFS_EVENTS_RING) {
		lost = ev->head - LOCKFS_EVENTS_RING - *cursor;
		*cursor = ev->head - LOCKFS_EVENTS_RING;
	}
	for (; *cursor < ev->head; (*cursor)++) {
		struct slot *s = &ev->slots[*cursor % LOCKFS_EVENTS_RING];

		if (!s->line) {
			lost++; /* not kept: no memory when it happened */
			continue;
		}
		if (want && !want(arg, s->name))
			continue;
		if (lost && !put_overrun(buf, size, &used, &lost)) {
			too_small = used == 0;
			break;
		}
		if (s->len > size - used) {
			too_small = used == 0;
			break;
		}
		memcpy(buf + used, s->line, s->len);
		used += s->len;
	}
	if (lost)
		(void)put_overrun(buf, size, &used, &lost); /* a full buffer: rare, and only a count */
	pthread_mutex_unlock(&ev->mu);
	return too_small ? -EOVERFLOW : (ssize_t)used;
}

uint64_t lockfs_events_head(struct lockfs_events *ev)
{
	uint64_t head;

	pthread_mutex_lock(&ev->mu);
	head = ev->head;
	pthread_mutex_unlock(&ev->mu);
	return head;
}

uint64_t lockfs_events_wait(struct lockfs_events *ev, uint64_t seen)
{
	uint64_t head;

	pthread_mutex_lock(&ev->mu);
	while (ev->head <= seen && !ev->shut)
		pthread_cond_wait(&ev->cond, &ev->mu);
	head = ev->head;
	pthread_mutex_unlock(&ev->mu);
	return head;
}

void lockfs_events_shut(struct lockfs_events *ev)
{
	pthread_mutex_lock(&ev->mu);
	ev->shut = true;
	pthread_cond_broadcast(&ev->cond);
	pthread_mutex_unlock(&ev->mu);
}

bool lockfs_events_is_shut(struct lockfs_events *ev)
{
	bool shut;

	pthread_mutex_lock(&ev->mu);
	shut = ev->shut;
	pthread_mutex_unlock(&ev->mu);
	return shut;
}
