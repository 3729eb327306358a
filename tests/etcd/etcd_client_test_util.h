/*
 * What the etcd client's tests (test_etcd_client.c, test_etcd_transport.c)
 * share: the etcd URL from etcd_fixtures.py, clients, one-line wrappers for
 * the steps of a test, and a watch collector.  Each test program is one
 * translation unit, so these are static (inline: a program that does not
 * use one is not warned about it).
 */
#ifndef LOCKFS_TESTS_ETCD_CLIENT_TEST_UTIL_H
#define LOCKFS_TESTS_ETCD_CLIENT_TEST_UTIL_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "lockfs/etcd_client.h"

#define WAIT_MS 5000   /* the longest any awaited event may take */

static const char *etcd_url;  /* LOCKFS_ETCD_URL */

static inline int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static inline void need_etcd(void)
{
	if (!etcd_url)
		skip();
}

static inline struct lockfs_etcd *client_for(const char *endpoints, int timeout_ms)
{
	struct lockfs_etcd_config cfg = { .endpoints = endpoints, .timeout_ms = timeout_ms };
	struct lockfs_etcd *c;

	assert_int_equal(lockfs_etcd_open(&c, &cfg), 0);
	return c;
}

static inline struct lockfs_etcd *client(void)
{
	need_etcd();
	return client_for(etcd_url, 0);
}

/* ---- small wrappers: one line per step in the tests ---- */

static inline int64_t put(struct lockfs_etcd *c, const char *key, const char *value, int64_t lease)
{
	struct lockfs_etcd_op op = {
		.type = LOCKFS_ETCD_PUT, .key = key, .value = value,
		.value_len = strlen(value), .lease = lease,
	};
	struct lockfs_etcd_op_resp r;
	int64_t rev;

	assert_int_equal(lockfs_etcd_put(c, &op, &r), 0);
	rev = r.revision;
	lockfs_etcd_op_resp_free(&r);
	return rev;
}

/* KEY's kv (caller frees with lockfs_etcd_op_resp_free), or n_kvs 0. */
static inline struct lockfs_etcd_op_resp get(struct lockfs_etcd *c, const char *key)
{
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = key };
	struct lockfs_etcd_op_resp r;

	assert_int_equal(lockfs_etcd_range(c, &op, &r), 0);
	return r;
}

static inline bool exists(struct lockfs_etcd *c, const char *key)
{
	struct lockfs_etcd_op_resp r = get(c, key);
	bool found = r.n_kvs == 1;

	lockfs_etcd_op_resp_free(&r);
	return found;
}

/* The acquire-style txn: create KEY with VALUE on LEASE if absent; in
 * either branch read KEY back (the holder's kv). */
static inline int create_if_absent(struct lockfs_etcd *c, const char *key, const char *value,
			    int64_t lease, struct lockfs_etcd_txn_resp *r)
{
	struct lockfs_etcd_compare cmp = {
		.key = key, .target = LOCKFS_ETCD_CREATE, .result = LOCKFS_ETCD_EQUAL, .number = 0,
	};
	struct lockfs_etcd_op success[] = {
		{ .type = LOCKFS_ETCD_PUT, .key = key, .value = value, .value_len = strlen(value),
		  .lease = lease },
		{ .type = LOCKFS_ETCD_RANGE, .key = key },
	};
	struct lockfs_etcd_op failure[] = { { .type = LOCKFS_ETCD_RANGE, .key = key } };
	struct lockfs_etcd_txn txn = {
		.compare = &cmp, .n_compare = 1, .success = success, .n_success = 2,
		.failure = failure, .n_failure = 1,
	};

	return lockfs_etcd_txn(c, &txn, r);
}

/* The release txn: delete KEY only while its create_revision is REV.
 * Returns whether it was deleted. */
static inline bool guarded_delete(struct lockfs_etcd *c, const char *key, int64_t rev)
{
	struct lockfs_etcd_compare cmp = {
		.key = key, .target = LOCKFS_ETCD_CREATE, .result = LOCKFS_ETCD_EQUAL, .number = rev,
	};
	struct lockfs_etcd_op del = { .type = LOCKFS_ETCD_DELETE, .key = key, .prev_kv = true };
	struct lockfs_etcd_txn txn = { .compare = &cmp, .n_compare = 1, .success = &del, .n_success = 1 };
	struct lockfs_etcd_txn_resp r;
	bool deleted;

	assert_int_equal(lockfs_etcd_txn(c, &txn, &r), 0);
	deleted = r.succeeded;
	if (deleted) {
		assert_int_equal(r.n_ops, 1);
		assert_int_equal(r.ops[0].count, 1);
		assert_int_equal(r.ops[0].n_kvs, 1);
		assert_int_equal(r.ops[0].kvs[0].create_revision, rev);
	} else {
		assert_int_equal(r.n_ops, 0);
	}
	lockfs_etcd_txn_resp_free(&r);
	return deleted;
}

struct seen_event {
	enum lockfs_etcd_event_type type;
	char key[64];
	char value[64];
	int64_t mod_revision;
	bool has_prev;
	char prev_value[64];
};

/* What a watch delivered; protected by mu. */
struct collector {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	struct seen_event ev[64];
	size_t n;
	int created;
	int progress;
	bool ended;
	struct lockfs_etcd_watch_msg end; /* the ENDED message (events NULL) */
	int64_t next_revision;            /* of the last message */
};

static inline void collect(void *arg, const struct lockfs_etcd_watch_msg *msg)
{
	struct collector *col = arg;

	pthread_mutex_lock(&col->mu);
	col->next_revision = msg->next_revision;
	switch (msg->kind) {
	case LOCKFS_ETCD_WATCH_CREATED:
		col->created++;
		break;
	case LOCKFS_ETCD_WATCH_PROGRESS:
		col->progress++;
		break;
	case LOCKFS_ETCD_WATCH_ENDED:
		assert_false(col->ended);  /* the last message, once */
		col->ended = true;
		col->end = *msg;
		break;
	case LOCKFS_ETCD_WATCH_EVENTS:
		assert_true(msg->n_events > 0);
		for (size_t i = 0; i < msg->n_events && col->n < 64; i++) {
			const struct lockfs_etcd_event *e = &msg->events[i];
			struct seen_event *s = &col->ev[col->n++];

			s->type = e->type;
			snprintf(s->key, sizeof(s->key), "%s", e->kv.key);
			snprintf(s->value, sizeof(s->value), "%s", e->kv.value);
			s->mod_revision = e->kv.mod_revision;
			s->has_prev = e->has_prev_kv;
			if (e->has_prev_kv)
				snprintf(s->prev_value, sizeof(s->prev_value), "%s", e->prev_kv.value);
		}
		break;
	}
	pthread_cond_broadcast(&col->cond);
	pthread_mutex_unlock(&col->mu);
}

static inline void collector_init(struct collector *col)
{
	memset(col, 0, sizeof(*col));
	pthread_mutex_init(&col->mu, NULL);
	pthread_cond_init(&col->cond, NULL);
}

static inline void collector_destroy(struct collector *col)
{
	pthread_mutex_destroy(&col->mu);
	pthread_cond_destroy(&col->cond);
}

/* Wait until N events arrived (or, N < 0, until the watch ended). */
static inline bool await(struct collector *col, int n)
{
	int64_t deadline = now_ms() + WAIT_MS;
	bool done;

	pthread_mutex_lock(&col->mu);
	for (;;) {
		done = n < 0 ? col->ended : col->n >= (size_t)n;
		if (done || now_ms() >= deadline)
			break;
		pthread_mutex_unlock(&col->mu);
		sleep_ms(5);
		pthread_mutex_lock(&col->mu);
	}
	pthread_mutex_unlock(&col->mu);
	return done;
}

static inline struct lockfs_etcd_watch *watch(struct lockfs_etcd *c, const char *prefix, int64_t from,
				       struct collector *col)
{
	struct lockfs_etcd_watch_req req = {
		.key = prefix, .prefix = true, .start_revision = from, .prev_kv = true,
	};
	struct lockfs_etcd_watch *w;

	assert_int_equal(lockfs_etcd_watch_open(&w, c, &req, collect, col), 0);
	/* CREATED was delivered before open returned. */
	pthread_mutex_lock(&col->mu);
	assert_int_equal(col->created, 1);
	pthread_mutex_unlock(&col->mu);
	return w;
}

#endif
