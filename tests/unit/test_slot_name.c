/* Unit tests for the names of slots (core/base/name_slot.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "lockfs/limits.h"
#include "lockfs/name.h"

static void test_request_splits_at_the_last_equals(void **state)
{
	char base[LOCKFS_NAME_MAX + 1];
	unsigned cap = 0;

	assert_int_equal(lockfs_slot_request_parse("gpu=2", base, sizeof(base), &cap), 0);
	assert_string_equal(base, "gpu");
	assert_int_equal(cap, 2);
	assert_int_equal(lockfs_slot_request_parse("a=b=256", base, sizeof(base), &cap), 0);
	assert_string_equal(base, "a=b");
	assert_int_equal(cap, 256);
}

static void test_bad_requests_are_einval(void **state)
{
	char base[LOCKFS_NAME_MAX + 1];
	unsigned cap;
	const char *bad[] = { "gpu", "gpu=", "gpu=0", "gpu=02", "gpu=257", "gpu=2x", "=2",
			      ".gpu=2", "a=1=2", "gpu=-1", "gpu= 2" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(lockfs_slot_request_parse(bad[i], base, sizeof(base), &cap),
				 -EINVAL);
}

static void test_long_slotted_names(void **state)
{
	char req[LOCKFS_NAME_MAX + 8], base[LOCKFS_NAME_MAX + 1];
	unsigned cap;

	memset(req, 'x', LOCKFS_SLOT_NAME_MAX);
	strcpy(req + LOCKFS_SLOT_NAME_MAX, "=256");
	assert_int_equal(lockfs_slot_request_parse(req, base, sizeof(base), &cap), 0);
	memset(req, 'x', LOCKFS_SLOT_NAME_MAX + 1);
	strcpy(req + LOCKFS_SLOT_NAME_MAX + 1, "=2");
	assert_int_equal(lockfs_slot_request_parse(req, base, sizeof(base), &cap), -ENAMETOOLONG);
}

static void test_stored_names_round_trip(void **state)
{
	char name[LOCKFS_NAME_MAX + 1], longest[LOCKFS_SLOT_NAME_MAX + 1];
	const char *base;
	unsigned k, cap;

	lockfs_slot_name(name, sizeof(name), "gpu", 1, 2);
	assert_string_equal(name, ".slot1of2:gpu");
	assert_int_equal(lockfs_slot_name_parse(name, &base, &k, &cap), 1);
	assert_string_equal(base, "gpu");
	assert_int_equal(k, 1);
	assert_int_equal(cap, 2);
	assert_int_equal(lockfs_name_check_stored(name), 0);
	/* The longest slotted name's last slot still fits a lock name. */
	memset(longest, 'y', LOCKFS_SLOT_NAME_MAX);
	longest[LOCKFS_SLOT_NAME_MAX] = '\0';
	lockfs_slot_name(name, sizeof(name), longest, LOCKFS_SLOTS_MAX - 1, LOCKFS_SLOTS_MAX);
	assert_int_equal(strlen(name), LOCKFS_NAME_MAX);
	assert_int_equal(lockfs_name_check_stored(name), 0);
}

static void test_line_names_round_trip(void **state)
{
	char name[LOCKFS_NAME_MAX + 1], longest[LOCKFS_SLOT_NAME_MAX + 1];
	const char *base;

	(void)state;
	lockfs_slot_line_name(name, sizeof(name), "gpu");
	assert_string_equal(name, ".slotline:gpu");
	assert_int_equal(lockfs_slot_line_parse(name, &base), 1);
	assert_string_equal(base, "gpu");
	assert_int_equal(lockfs_name_check_stored(name), 0);
	memset(longest, 'y', LOCKFS_SLOT_NAME_MAX);
	longest[LOCKFS_SLOT_NAME_MAX] = '\0';
	lockfs_slot_line_name(name, sizeof(name), longest);
	assert_int_equal(lockfs_name_check_stored(name), 0);
	for (const char *const *bad = (const char *const[]){ ".slotline:", ".slotline:a=1",
			".slotline:.x", ".slotlinegpu", NULL }; *bad; bad++) {
		assert_int_equal(lockfs_slot_line_parse(*bad, &base), 0);
		assert_int_equal(lockfs_name_check_stored(*bad), -EINVAL);
	}
}

static void test_other_dot_names_stay_invalid(void **state)
{
	const char *base;
	unsigned k, cap;
	const char *bad[] = { ".slot2of2:gpu", ".slot0of0:gpu", ".slot01of2:gpu", ".slot0of2gpu",
			      ".slot0of2:", ".slot0of2:.x", ".slot0of257:gpu", ".lockfs", ".x",
			      ".slot0of2:a=1" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(lockfs_slot_name_parse(bad[i], &base, &k, &cap), 0);
		assert_int_equal(lockfs_name_check_stored(bad[i]), -EINVAL);
	}
	/* Valid lock names are valid stored names, unchanged. */
	assert_int_equal(lockfs_name_check_stored("gpu=2"), 0);
	assert_int_equal(lockfs_name_check_stored("a\x01"), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_request_splits_at_the_last_equals),
		cmocka_unit_test(test_bad_requests_are_einval),
		cmocka_unit_test(test_long_slotted_names),
		cmocka_unit_test(test_stored_names_round_trip),
		cmocka_unit_test(test_line_names_round_trip),
		cmocka_unit_test(test_other_dot_names_stay_invalid),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
