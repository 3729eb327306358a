/*
 * Unit tests for core/lock/follow.c: the store hears the union of what the
 * readers of M/.events follow, and only when it changes -- a second reader
 * of the same names, or of every name, costs it no call; the last one to
 * close takes the names (or every name) out; a reader that changes its
 * names never leaves a name it keeps out of the set in between.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../core/lock/follow.h"

/* What the fake store was told last, and how many times. */
struct told {
	unsigned calls;
	bool all;
	char names[256];  /* sorted, comma-separated */
};
static struct told told;

static int cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int fake_follow(struct lockfs_backend *be, bool all, const char *const *names, size_t n)
{
	const char *v[16];

	(void)be;
	assert_true(n <= 16);
	if (n)
		memcpy(v, names, n * sizeof(*v));
	qsort(v, n, sizeof(*v), cmp);
	told.calls++;
	told.all = all;
	told.names[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		if (i)
			strcat(told.names, ",");
		strcat(told.names, v[i]);
	}
	return 0;
}

static const struct lockfs_backend_ops fake_ops = { .follow = fake_follow };
static struct lockfs_backend fake_be = { .ops = &fake_ops };

static int setup(void **state)
{
	struct lockfs_follow *f;

	memset(&told, 0, sizeof(told));
	assert_int_equal(lockfs_follow_new(&fake_be, &f), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	lockfs_follow_free(*state);
	return 0;
}

static void test_names_are_told_when_the_union_changes(void **state)
{
	struct lockfs_follow *f = *state;

	assert_int_equal(lockfs_follow_change(f, LOCKFS_FOLLOW_NONE, "gpu\0seat\0"), 0);
	assert_int_equal(told.calls, 1);
	assert_false(told.all);
	assert_string_equal(told.names, "gpu,seat");
	/* A second reader of gpu: nothing new. */
	assert_int_equal(lockfs_follow_change(f, LOCKFS_FOLLOW_NONE, "gpu\0"), 0);
	assert_int_equal(told.calls, 1);
	/* The first closes: seat goes, gpu stays (the other reads it). */
	assert_int_equal(lockfs_follow_change(f, "gpu\0seat\0", LOCKFS_FOLLOW_NONE), 0);
	assert_int_equal(told.calls, 2);
	assert_string_equal(told.names, "gpu");
	assert_int_equal(lockfs_follow_change(f, "gpu\0", LOCKFS_FOLLOW_NONE), 0);
	assert_int_equal(told.calls, 3);
	assert_false(told.all);
	assert_string_equal(told.names, "");
	/* Not following before nor after: nothing. */
	assert_int_equal(lockfs_follow_change(f, LOCKFS_FOLLOW_NONE, LOCKFS_FOLLOW_NONE), 0);
	assert_int_equal(told.calls, 3);
}

static void test_every_name_is_told_once_and_ends_with_the_last_reader(void **state)
{
	struct lockfs_follow *f = *state;

	lockfs_follow_change(f, LOCKFS_FOLLOW_NONE, LOCKFS_FOLLOW_ALL);
	assert_int_equal(told.calls, 1);
	assert_true(told.all);
	lockfs_follow_change(f, LOCKFS_FOLLOW_NONE, LOCKFS_FOLLOW_ALL);
	lockfs_follow_change(f, LOCKFS_FOLLOW_ALL, LOCKFS_FOLLOW_NONE);
	assert_int_equal(told.calls, 1);
	/* A reader of a name meanwhile: the names are told with ALL. */
	lockfs_follow_change(f, LOCKFS_FOLLOW_NONE, "gpu\0");
	assert_int_equal(told.calls, 2);
	assert_true(told.all);
	assert_string_equal(told.names, "gpu");
	lockfs_follow_change(f, LOCKFS_FOLLOW_ALL, LOCKFS_FOLLOW_NONE);
	assert_int_equal(told.calls, 3);
	assert_false(told.all);
	assert_string_equal(told.names, "gpu");
}

static void test_a_reader_that_changes_its_names_keeps_the_ones_in_both(void **state)
{
	struct lockfs_follow *f = *state;

	lockfs_follow_change(f, LOCKFS_FOLLOW_NONE, "a\0b\0");
	/* `lockctl watch` on a file that followed every name writes names. */
	lockfs_follow_change(f, "a\0b\0", "b\0c\0");
	assert_int_equal(told.calls, 2);
	assert_string_equal(told.names, "b,c");
	lockfs_follow_change(f, "b\0c\0", LOCKFS_FOLLOW_ALL);
	assert_int_equal(told.calls, 3);
	assert_true(told.all);
	assert_string_equal(told.names, "");
	lockfs_follow_change(f, LOCKFS_FOLLOW_ALL, "b\0c\0");
	assert_false(told.all);
	assert_string_equal(told.names, "b,c");
	/* The same list again: no call. */
	lockfs_follow_change(f, "b\0c\0", "c\0b\0");
	assert_int_equal(told.calls, 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_names_are_told_when_the_union_changes, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			test_every_name_is_told_once_and_ends_with_the_last_reader, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_reader_that_changes_its_names_keeps_the_ones_in_both, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
