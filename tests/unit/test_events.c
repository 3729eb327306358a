/*
 * Unit tests for core/lock/events.c: nothing kept while nobody reads, whole
 * JSON lines in order, the filter by name, a reader that fell behind told
 * how many it lost, a buffer too small for a line, and shutting the ring.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include <cmocka.h>

#include "../../core/lock/events.h"

static void note(struct lockfs_events *ev, const char *name, const char *event)
{
	const char *kv[] = { "fence", "7", "uid", "1000", "pid", "42", "reason", "a \"b\"\n",
			     NULL };

	lockfs_events_note(ev, "sh[42]", name, kv, event);
}

static void test_nothing_is_kept_while_nobody_reads(void **state)
{
	struct lockfs_events *ev;
	uint64_t cur;
	char buf[4096];

	(void)state;
	assert_int_equal(lockfs_events_new(&ev), 0);
	assert_false(lockfs_events_watched(ev));
	note(ev, "x", "acquired");
	assert_int_equal(lockfs_events_head(ev), 0);
	cur = lockfs_events_attach(ev);
	assert_true(lockfs_events_watched(ev));
	assert_int_equal(lockfs_events_take(ev, &cur, buf, sizeof(buf), NULL, NULL), 0);
	lockfs_events_detach(ev);
	lockfs_events_free(ev);
}

static void test_lines_are_json_in_order(void **state)
{
	struct lockfs_events *ev;
	uint64_t cur;
	char buf[4096];
	ssize_t n;

	(void)state;
	assert_int_equal(lockfs_events_new(&ev), 0);
	cur = lockfs_events_attach(ev);
	note(ev, "x", "acquired");
	note(ev, "x", "released");
	n = lockfs_events_take(ev, &cur, buf, sizeof(buf), NULL, NULL);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_non_null(strstr(buf, "\"event\":\"acquired\",\"name\":\"x\",\"who\":\"sh[42]\","
				    "\"fence\":7,\"uid\":1000,\"pid\":42,"
				    "\"reason\":\"a \\\"b\\\"\\u000a\"}\n"));
	assert_true(strstr(buf, "acquired") < strstr(buf, "released"));
	assert_int_equal(cur, 2);
	lockfs_events_detach(ev);
	lockfs_events_free(ev);
}

static bool only_y(void *arg, const char *name)
{
	(void)arg;
	return strcmp(name, "y") == 0;
}

static void test_a_filter_skips_other_names(void **state)
{
	struct lockfs_events *ev;
	uint64_t cur;
	char buf[4096];
	ssize_t n;

	(void)state;
	assert_int_equal(lockfs_events_new(&ev), 0);
	cur = lockfs_events_attach(ev);
	note(ev, "x", "acquired");
	assert_int_equal(lockfs_events_take(ev, &cur, buf, sizeof(buf), only_y, NULL), 0);
	assert_int_equal(cur, 1); /* skipped, not kept for later */
	note(ev, "y", "acquired");
	n = lockfs_events_take(ev, &cur, buf, sizeof(buf), only_y, NULL);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_non_null(strstr(buf, "\"name\":\"y\""));
	assert_null(strstr(buf, "\"name\":\"x\""));
	lockfs_events_detach(ev);
	lockfs_events_free(ev);
}

static void test_a_reader_behind_is_told_how_many_it_lost(void **state)
{
	struct lockfs_events *ev;
	uint64_t cur;
	static char buf[1 << 20];
	ssize_t n;

	(void)state;
	assert_int_equal(lockfs_events_new(&ev), 0);
	cur = lockfs_events_attach(ev);
	for (int i = 0; i < LOCKFS_EVENTS_RING + 10; i++)
		note(ev, "x", "acquired");
	n = lockfs_events_take(ev, &cur, buf, sizeof(buf) - 1, NULL, NULL);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_memory_equal(buf, "{\"event\":\"overrun\",\"lost\":10}\n", 30);
	assert_int_equal(cur, LOCKFS_EVENTS_RING + 10);
	lockfs_events_detach(ev);
	lockfs_events_free(ev);
}

static void test_a_buffer_too_small_for_a_line_is_eoverflow(void **state)
{
	struct lockfs_events *ev;
	uint64_t cur;
	char buf[16];

	(void)state;
	assert_int_equal(lockfs_events_new(&ev), 0);
	cur = lockfs_events_attach(ev);
	note(ev, "x", "acquired");
	assert_int_equal(lockfs_events_take(ev, &cur, buf, sizeof(buf), NULL, NULL), -EOVERFLOW);
	assert_int_equal(cur, 0); /* still there for a bigger read */
	lockfs_events_detach(ev);
	lockfs_events_free(ev);
}

static void test_shut_ends_every_wait(void **state)
{
	struct lockfs_events *ev;

	(void)state;
	assert_int_equal(lockfs_events_new(&ev), 0);
	lockfs_events_shut(ev);
	assert_int_equal(lockfs_events_wait(ev, 0), 0); /* returns at once */
	assert_true(lockfs_events_is_shut(ev));
	lockfs_events_free(ev);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nothing_is_kept_while_nobody_reads),
		cmocka_unit_test(test_lines_are_json_in_order),
		cmocka_unit_test(test_a_filter_skips_other_names),
		cmocka_unit_test(test_a_reader_behind_is_told_how_many_it_lost),
		cmocka_unit_test(test_a_buffer_too_small_for_a_line_is_eoverflow),
		cmocka_unit_test(test_shut_ends_every_wait),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
