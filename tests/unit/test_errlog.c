/* Unit tests for the daemon's message stream (fs/errlog.c): every complete
 * line written to it reaches the sink once, whole, with its priority. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include <cmocka.h>

#include "service.h"

#define MAX_LINES 16

struct seen {
	int n;
	int prio[MAX_LINES];
	char *line[MAX_LINES];
};

static void record(int prio, const char *line, void *arg)
{
	struct seen *s = arg;

	assert_true(s->n < MAX_LINES);
	s->prio[s->n] = prio;
	s->line[s->n] = strdup(line);
	s->n++;
}

static void forget(struct seen *s)
{
	for (int i = 0; i < s->n; i++)
		free(s->line[i]);
}

static void test_each_line_once_without_newline(void **state)
{
	struct seen s = { 0 };
	FILE *f = lockfs_errlog_stream(record, &s);

	(void)state;
	assert_non_null(f);
	fprintf(f, "lockfs: first\nlockfs: second\n");
	assert_int_equal(s.n, 2);
	assert_string_equal(s.line[0], "lockfs: first");
	assert_string_equal(s.line[1], "lockfs: second");
	fclose(f);
	assert_int_equal(s.n, 2);
	forget(&s);
}

static void test_partial_writes_make_one_line(void **state)
{
	struct seen s = { 0 };
	FILE *f = lockfs_errlog_stream(record, &s);

	(void)state;
	fprintf(f, "lockfs: warning: ");
	fflush(f);
	assert_int_equal(s.n, 0);
	fprintf(f, "audit log write failed: %s", "No space left on device");
	fflush(f);
	assert_int_equal(s.n, 0);
	fputc('\n', f);
	assert_int_equal(s.n, 1);
	assert_string_equal(s.line[0], "lockfs: warning: audit log write failed: No space left on device");
	assert_int_equal(s.prio[0], LOG_WARNING);
	fclose(f);
	forget(&s);
}

static void test_unfinished_line_is_sent_at_close(void **state)
{
	struct seen s = { 0 };
	FILE *f = lockfs_errlog_stream(record, &s);

	(void)state;
	fprintf(f, "fuse: no newline");
	fclose(f);
	assert_int_equal(s.n, 1);
	assert_string_equal(s.line[0], "fuse: no newline");
	assert_int_equal(s.prio[0], LOG_ERR);
	forget(&s);
}

static void test_empty_lines_are_dropped(void **state)
{
	struct seen s = { 0 };
	FILE *f = lockfs_errlog_stream(record, &s);

	(void)state;
	fprintf(f, "\n\nx\n\n");
	fclose(f);
	assert_int_equal(s.n, 1);
	assert_string_equal(s.line[0], "x");
	forget(&s);
}

static void test_long_line_in_pieces_nothing_lost(void **state)
{
	struct seen s = { 0 };
	FILE *f = lockfs_errlog_stream(record, &s);
	size_t len = 5000, got = 0;
	char *big = malloc(len + 1);

	(void)state;
	for (size_t i = 0; i < len; i++)
		big[i] = (char)('a' + i % 26);
	big[len] = '\0';
	fprintf(f, "%s\n", big);
	fclose(f);
	assert_true(s.n >= 2);
	for (int i = 0; i < s.n; i++) {
		assert_memory_equal(s.line[i], big + got, strlen(s.line[i]));
		got += strlen(s.line[i]);
	}
	assert_int_equal(got, len);
	free(big);
	forget(&s);
}

static void test_priority_from_the_text(void **state)
{
	(void)state;
	assert_int_equal(lockfs_errlog_priority("lockfs: warning: x"), LOG_WARNING);
	assert_int_equal(lockfs_errlog_priority("warning: x"), LOG_WARNING);
	assert_int_equal(lockfs_errlog_priority("lockfs: notice: serving /locks"), LOG_NOTICE);
	assert_int_equal(lockfs_errlog_priority("lockfs: info: x"), LOG_INFO);
	assert_int_equal(lockfs_errlog_priority("lockfs: backing dir /x: No such file"), LOG_ERR);
	assert_int_equal(lockfs_errlog_priority("fuse: unknown option"), LOG_ERR);
	/* "warning" elsewhere in the text is no priority. */
	assert_int_equal(lockfs_errlog_priority("lockfs: a warning: x"), LOG_ERR);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_each_line_once_without_newline),
		cmocka_unit_test(test_partial_writes_make_one_line),
		cmocka_unit_test(test_unfinished_line_is_sent_at_close),
		cmocka_unit_test(test_empty_lines_are_dropped),
		cmocka_unit_test(test_long_line_in_pieces_nothing_lost),
		cmocka_unit_test(test_priority_from_the_text),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
