/*
 * A watch line read by the scanner (lockfs_etcd_line_fast) is read exactly
 * as jansson reads it (lockfs_etcd_line_json), and every line the scanner
 * does not know is left to jansson -- also for lines mangled byte by byte.
 * No etcd needed: the lines are what etcd 3.4's gateway writes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"

/* A try-lock's echo: the record under /ab-b/bench-123-x/<lease>-1. */
static const char PUT_LINE[] =
	"{\"result\":{\"header\":{\"cluster_id\":\"14841639068965178418\",\"member_id\":"
	"\"10276657743932975437\",\"revision\":\"1234567\",\"raft_term\":\"2\"},\"events\":"
	"[{\"kv\":{\"key\":\"L2FiLWIvYmVuY2gtMTIzLXgvN2U1N2EyMzNmZTVhYmQwNi0x\","
	"\"create_revision\":\"1234567\",\"mod_revision\":\"1234567\",\"version\":\"1\","
	"\"value\":\"eyJyZXNvdXJjZSI6ImJlbmNoIiwiZmVuY2UiOm51bGx9\","
	"\"lease\":\"7587883462617392661\"}}]}}";
/* A release's echo: a DELETE has only the key and its revision. */
static const char DELETE_LINE[] =
	"{\"result\":{\"header\":{\"cluster_id\":\"14841639068965178418\",\"member_id\":"
	"\"10276657743932975437\",\"revision\":\"1234568\",\"raft_term\":\"2\"},\"events\":"
	"[{\"type\":\"DELETE\",\"kv\":{\"key\":\"L2FiLWIvYmVuY2gtMTIzLXgvN2U1N2EyMzNmZTVhYmQwNi0x\","
	"\"mod_revision\":\"1234568\"}}]}}";
/* Two events of one txn (a hand-off: delete and put). */
static const char TWO_LINE[] =
	"{\"result\":{\"header\":{\"revision\":\"99\"},\"events\":[{\"type\":\"DELETE\","
	"\"kv\":{\"key\":\"L3QvYS8x\",\"mod_revision\":\"99\"}},{\"type\":\"PUT\",\"kv\":"
	"{\"key\":\"L3QvYS8y\",\"create_revision\":\"98\",\"mod_revision\":\"99\","
	"\"version\":\"2\",\"value\":\"\",\"lease\":\"-5\"}}]}}";

/* One watch of many on a WebSocket stream (the watch set): its events
 * name the watch ("watch_id" 0 is left out). */
static const char WATCH_ID_LINE[] =
	"{\"result\":{\"header\":{\"revision\":\"12\"},\"watch_id\":\"3\",\"events\":"
	"[{\"type\":\"DELETE\",\"kv\":{\"key\":\"L2IveA==\",\"mod_revision\":\"12\"}}]}}";

/* Lines only jansson reads. */
static const char *const OTHER_LINES[] = {
	"{\"result\":{\"header\":{\"revision\":\"7\"},\"created\":true}}",
	"{\"result\":{\"header\":{\"revision\":\"7\"}}}",  /* progress */
	"{\"result\":{\"header\":{\"revision\":\"7\"},\"canceled\":true,"
	"\"compact_revision\":\"5\"}}",
	"{\"error\":{\"grpc_code\":1,\"message\":\"closing\"}}",
	"{\"result\":{\"header\":{\"revision\":\"7\"},\"events\":[]}}",
	"{\"result\":{\"header\":{\"revision\":7},\"events\":[{\"kv\":{\"key\":\"YQ==\"}}]}}",
	"{\"result\":{\"header\":{\"revision\":\"7\"},\"events\":[{\"kv\":{\"key\":\"YQ\\u003d\\u003d\"}}]}}",
	"{\"result\":{\"header\":{\"revision\":\"7\"},\"events\":[{\"kv\":{\"key\":\"YQ==\"},"
	"\"prev_kv\":{\"key\":\"YQ==\"}}]}}",
	"{\"result\":{\"header\":{\"revision\":\"7\",\"revision\":\"8\"},\"events\":"
	"[{\"kv\":{\"key\":\"YQ==\"}}]}}",
	"not json",
	"",
};

static void assert_same(const struct lockfs_etcd_line *a, const struct lockfs_etcd_line *b)
{
	assert_int_equal(a->revision, b->revision);
	assert_int_equal(a->compact_revision, b->compact_revision);
	assert_int_equal(a->created, b->created);
	assert_int_equal(a->canceled, b->canceled);
	assert_int_equal(a->watch_id, b->watch_id);
	assert_int_equal(a->n_events, b->n_events);
	for (size_t i = 0; i < a->n_events; i++) {
		const struct lockfs_etcd_event *x = &a->events[i], *y = &b->events[i];

		assert_int_equal(x->type, y->type);
		assert_int_equal(x->has_prev_kv, y->has_prev_kv);
		assert_int_equal(x->kv.key_len, y->kv.key_len);
		assert_memory_equal(x->kv.key, y->kv.key, x->kv.key_len);
		assert_int_equal(x->kv.value_len, y->kv.value_len);
		assert_memory_equal(x->kv.value, y->kv.value, x->kv.value_len);
		assert_int_equal(x->kv.create_revision, y->kv.create_revision);
		assert_int_equal(x->kv.mod_revision, y->kv.mod_revision);
		assert_int_equal(x->kv.version, y->kv.version);
		assert_int_equal(x->kv.lease, y->kv.lease);
	}
}

/* TEXT is taken by the scanner and read as jansson reads it. */
static void assert_fast(const char *text)
{
	struct lockfs_etcd_line f, j;

	assert_int_equal(lockfs_etcd_line_fast(text, strlen(text), &f), 1);
	assert_int_equal(lockfs_etcd_line_json(text, strlen(text), &j), 0);
	assert_same(&f, &j);
	lockfs_etcd_events_free(f.events, f.n_events);
	lockfs_etcd_events_free(j.events, j.n_events);
}

static void test_a_put_echo_reads_as_jansson_reads_it(void **state)
{
	struct lockfs_etcd_line l;

	(void)state;
	assert_fast(PUT_LINE);
	assert_int_equal(lockfs_etcd_line_fast(PUT_LINE, strlen(PUT_LINE), &l), 1);
	assert_int_equal(l.revision, 1234567);
	assert_int_equal(l.n_events, 1);
	assert_int_equal(l.events[0].type, LOCKFS_ETCD_EVENT_PUT);
	assert_string_equal(l.events[0].kv.key, "/ab-b/bench-123-x/7e57a233fe5abd06-1");
	assert_string_equal(l.events[0].kv.value, "{\"resource\":\"bench\",\"fence\":null}");
	assert_int_equal(l.events[0].kv.lease, 7587883462617392661LL);
	lockfs_etcd_events_free(l.events, l.n_events);
}

static void test_a_delete_and_a_two_event_line_read_as_jansson_reads_them(void **state)
{
	(void)state;
	assert_fast(DELETE_LINE);
	assert_fast(TWO_LINE);
}

static void test_a_line_of_one_watch_of_many_names_it(void **state)
{
	struct lockfs_etcd_line l;

	(void)state;
	assert_fast(WATCH_ID_LINE);
	assert_int_equal(lockfs_etcd_line_fast(WATCH_ID_LINE, strlen(WATCH_ID_LINE), &l), 1);
	assert_int_equal(l.watch_id, 3);
	lockfs_etcd_events_free(l.events, l.n_events);
	assert_int_equal(lockfs_etcd_line_fast(PUT_LINE, strlen(PUT_LINE), &l), 1);
	assert_int_equal(l.watch_id, 0);
	lockfs_etcd_events_free(l.events, l.n_events);
}

static void test_every_other_line_is_left_to_jansson(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(OTHER_LINES) / sizeof(OTHER_LINES[0]); i++) {
		struct lockfs_etcd_line l;

		assert_int_equal(lockfs_etcd_line_fast(OTHER_LINES[i], strlen(OTHER_LINES[i]), &l),
				 0);
		assert_null(l.events);
		assert_int_equal(l.n_events, 0);
	}
}

/* Mangle LINE one byte at a time (replaced, dropped, doubled), many times
 * over: whenever the scanner still takes it, jansson reads it the same. */
static void mangle(const char *line, unsigned seed)
{
	static const char bytes[] = "{}[]\":,\\ 0123456789-eE.+=AZaz/tnul\x01\x7f\xc3\xa9";
	size_t len = strlen(line);
	char *buf = malloc(len + 2);
	unsigned taken = 0;

	assert_non_null(buf);
	srand(seed);
	for (int round = 0; round < 20000; round++) {
		size_t at = (size_t)rand() % len, n = len;
		char c = bytes[(size_t)rand() % (sizeof(bytes) - 1)];
		struct lockfs_etcd_line f, j;

		memcpy(buf, line, len + 1);
		switch (rand() % 3) {
		case 0:
			buf[at] = c;
			break;
		case 1:
			memmove(buf + at, buf + at + 1, len - at);
			n--;
			break;
		default:
			memmove(buf + at + 1, buf + at, len - at + 1);
			buf[at] = c;
			n++;
		}
		if (lockfs_etcd_line_fast(buf, n, &f) != 1)
			continue;
		taken++;
		assert_int_equal(lockfs_etcd_line_json(buf, n, &j), 0);
		assert_same(&f, &j);
		lockfs_etcd_events_free(f.events, f.n_events);
		lockfs_etcd_events_free(j.events, j.n_events);
	}
	/* Some mangled lines stay valid (a digit for a digit, a blank). */
	assert_true(taken > 0);
	free(buf);
}

static void test_a_mangled_line_is_read_as_jansson_reads_it_or_left_to_it(void **state)
{
	(void)state;
	mangle(PUT_LINE, 1);
	mangle(DELETE_LINE, 2);
	mangle(TWO_LINE, 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_a_put_echo_reads_as_jansson_reads_it),
		cmocka_unit_test(test_a_delete_and_a_two_event_line_read_as_jansson_reads_them),
		cmocka_unit_test(test_a_line_of_one_watch_of_many_names_it),
		cmocka_unit_test(test_every_other_line_is_left_to_jansson),
		cmocka_unit_test(test_a_mangled_line_is_read_as_jansson_reads_it_or_left_to_it),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
