/*
 * Unit tests for core/lock/quota.c: per-uid caps, the total, root's exemption,
 * reservations that keep concurrent acquisitions under a cap, and bursts
 * of refusals.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../core/base/clock.h"
#include "../../core/lock/quota.h"

/* The boot clock the bursts read (base/clock.h), moved by hand: a burst's
 * quiet second and its ten-second cap pass without sleeping. */
static int64_t fake_boot_ms = 1000000;

static int64_t fake_wall(void *arg)
{
	(void)arg;
	return 1800000000000 + fake_boot_ms;
}

static int64_t fake_boot(void *arg)
{
	(void)arg;
	return fake_boot_ms;
}

static const struct lockfs_clock fake_clock = { fake_wall, fake_boot, NULL };

static int use_fake_clock(void **state)
{
	(void)state;
	lockfs_clock_override(&fake_clock);
	return 0;
}

static int use_real_clock(void **state)
{
	(void)state;
	lockfs_clock_override(NULL);
	return 0;
}

static struct quota *make(uint32_t open, uint32_t locks, uint32_t waiters, uint32_t total)
{
	struct quota_limits lim = { open, locks, waiters, total };
	struct quota *q;

	assert_int_equal(lockfs_quota_new(&q, &lim), 0);
	return q;
}

/* Take one lock of UID the way the engine does: reserve, count, unreserve. */
static int take(struct quota *q, uid_t uid, enum quota_reason *why)
{
	int rc = lockfs_quota_lock_reserve(q, uid, true, why);

	if (rc == 0) {
		lockfs_quota_locks_add(q, uid, 1);
		lockfs_quota_lock_unreserve(q, uid, true);
	}
	return rc;
}

static void test_lock_cap_per_uid_is_edquot(void **state)
{
	struct quota *q = make(10, 2, 10, 100);
	enum quota_reason why;

	assert_int_equal(take(q, 4242, &why), 0);
	assert_int_equal(take(q, 4242, &why), 0);
	assert_int_equal(take(q, 4242, &why), -EDQUOT);
	assert_int_equal(why, QUOTA_LOCKS_PER_UID);
	assert_int_equal(take(q, 4343, &why), 0); /* another uid: its own cap */
	assert_int_equal(lockfs_quota_locks_of(q, 4242), 2);
	lockfs_quota_locks_add(q, 4242, -1);
	assert_int_equal(take(q, 4242, &why), 0);
	lockfs_quota_free(q);
}

static void test_total_cap_is_enospc_and_counts_root(void **state)
{
	struct quota *q = make(10, 10, 10, 3);
	enum quota_reason why;

	assert_int_equal(take(q, 0, &why), 0);
	assert_int_equal(take(q, 4242, &why), 0);
	assert_int_equal(take(q, 4343, &why), 0);
	assert_int_equal(take(q, 4242, &why), -ENOSPC);
	assert_int_equal(why, QUOTA_LOCKS);
	assert_int_equal(take(q, 0, &why), 0); /* root: exempt, but counted */
	assert_int_equal(lockfs_quota_locks_total(q), 4);
	lockfs_quota_free(q);
}

static void test_root_is_never_refused(void **state)
{
	struct quota *q = make(1, 1, 1, 1);
	enum quota_reason why;

	for (int i = 0; i < 5; i++) {
		assert_int_equal(take(q, 0, &why), 0);
		assert_int_equal(lockfs_quota_waiter_add(q, 0), 0);
		assert_int_equal(lockfs_quota_open_add(q, 0), 0);
	}
	lockfs_quota_free(q);
}

static void test_reservations_count_against_the_cap(void **state)
{
	struct quota *q = make(10, 2, 10, 100);
	enum quota_reason why;

	/* Two acquisitions in flight at once fill the cap of 2 ... */
	assert_int_equal(lockfs_quota_lock_reserve(q, 4242, true, &why), 0);
	assert_int_equal(lockfs_quota_lock_reserve(q, 4242, true, &why), 0);
	assert_int_equal(lockfs_quota_lock_reserve(q, 4242, true, &why), -EDQUOT);
	/* ... one fails in the store: room for one again. */
	lockfs_quota_lock_unreserve(q, 4242, true);
	lockfs_quota_locks_add(q, 4242, 1);
	lockfs_quota_lock_unreserve(q, 4242, true);
	assert_int_equal(lockfs_quota_lock_reserve(q, 4242, true, &why), 0);
	lockfs_quota_free(q);
}

static void test_a_hand_off_does_not_grow_the_total(void **state)
{
	struct quota *q = make(10, 10, 10, 1);
	enum quota_reason why;

	assert_int_equal(take(q, 4242, &why), 0);
	assert_int_equal(lockfs_quota_lock_reserve(q, 4343, false, &why), 0);
	lockfs_quota_locks_add(q, 4242, -1);
	lockfs_quota_locks_add(q, 4343, 1);
	lockfs_quota_lock_unreserve(q, 4343, false);
	assert_int_equal(lockfs_quota_locks_total(q), 1);
	lockfs_quota_free(q);
}

static void test_waiters_and_opens_have_their_own_caps(void **state)
{
	struct quota *q = make(2, 10, 1, 100);

	assert_int_equal(lockfs_quota_waiter_add(q, 4242), 0);
	assert_int_equal(lockfs_quota_waiter_add(q, 4242), -EDQUOT);
	lockfs_quota_waiter_sub(q, 4242);
	assert_int_equal(lockfs_quota_waiter_add(q, 4242), 0);
	assert_int_equal(lockfs_quota_open_add(q, 4242), 0);
	assert_int_equal(lockfs_quota_open_add(q, 4242), 0);
	assert_int_equal(lockfs_quota_open_add(q, 4242), -EMFILE);
	lockfs_quota_set_open_limit(q, 3);
	assert_int_equal(lockfs_quota_open_add(q, 4242), 0);
	lockfs_quota_free(q);
}

static void test_none_is_never_reached(void **state)
{
	struct quota *q = make(QUOTA_NONE, QUOTA_NONE, QUOTA_NONE, QUOTA_NONE);
	enum quota_reason why;

	for (int i = 0; i < 5000; i++)
		assert_int_equal(take(q, 4242, &why), 0);
	lockfs_quota_free(q);
}

struct emitted {
	int n;
	struct quota_burst last;
};

static void emit(void *arg, const struct quota_burst *b)
{
	struct emitted *e = arg;

	e->n++;
	e->last = *b;
}

static void test_a_burst_is_one_line_with_its_count(void **state)
{
	struct quota *q = make(1, 1, 1, 1);
	struct emitted e = { 0 };

	assert_true(lockfs_quota_refused(q, 4242, QUOTA_LOCKS_PER_UID, "x"));
	lockfs_quota_burst_who(q, 4242, QUOTA_LOCKS_PER_UID, "bash[7]", 7);
	for (int i = 0; i < 9; i++)
		assert_false(lockfs_quota_refused(q, 4242, QUOTA_LOCKS_PER_UID, "y"));
	assert_true(lockfs_quota_refused(q, 4343, QUOTA_LOCKS_PER_UID, "z")); /* another uid */
	lockfs_quota_flush(q, false, emit, &e);
	assert_int_equal(e.n, 0); /* still going */
	lockfs_quota_flush(q, true, emit, &e);
	assert_int_equal(e.n, 2);
	lockfs_quota_free(q);
}

static void test_a_burst_ends_after_a_quiet_second(void **state)
{
	struct quota *q = make(1, 5, 1, 1);
	struct emitted e = { 0 };

	lockfs_quota_refused(q, 4242, QUOTA_LOCKS_PER_UID, "x");
	lockfs_quota_burst_who(q, 4242, QUOTA_LOCKS_PER_UID, "bash[7]", 7);
	lockfs_quota_refused(q, 4242, QUOTA_LOCKS_PER_UID, "y");
	fake_boot_ms += 999;
	lockfs_quota_flush(q, false, emit, &e);
	assert_int_equal(e.n, 0); /* not quiet for a second yet */
	fake_boot_ms += 1;
	lockfs_quota_flush(q, false, emit, &e);
	assert_int_equal(e.n, 1);
	assert_int_equal(e.last.count, 2);
	assert_int_equal(e.last.uid, 4242);
	assert_int_equal(e.last.limit, 5);
	assert_string_equal(e.last.who, "bash[7]");
	assert_string_equal(e.last.name, "x");
	assert_string_equal(lockfs_quota_reason_name(e.last.reason), "locks-per-uid");
	assert_true(lockfs_quota_refused(q, 4242, QUOTA_LOCKS_PER_UID, "z")); /* a new one */
	lockfs_quota_free(q);
}

static void test_a_burst_that_never_pauses_ends_after_ten_seconds(void **state)
{
	struct quota *q = make(1, 5, 1, 1);
	struct emitted e = { 0 };

	assert_true(lockfs_quota_refused(q, 4242, QUOTA_LOCKS_PER_UID, "x"));
	for (int i = 0; i < 99; i++) {
		fake_boot_ms += 100; /* a refusal every 100 ms: never quiet */
		assert_false(lockfs_quota_refused(q, 4242, QUOTA_LOCKS_PER_UID, "y"));
		lockfs_quota_flush(q, false, emit, &e);
		assert_int_equal(e.n, 0);
	}
	fake_boot_ms += 100; /* ten seconds since the first */
	lockfs_quota_refused(q, 4242, QUOTA_LOCKS_PER_UID, "y");
	lockfs_quota_flush(q, false, emit, &e);
	assert_int_equal(e.n, 1);
	assert_int_equal(e.last.count, 101);
	assert_true(lockfs_quota_refused(q, 4242, QUOTA_LOCKS_PER_UID, "z")); /* a new one */
	lockfs_quota_free(q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lock_cap_per_uid_is_edquot),
		cmocka_unit_test(test_total_cap_is_enospc_and_counts_root),
		cmocka_unit_test(test_root_is_never_refused),
		cmocka_unit_test(test_reservations_count_against_the_cap),
		cmocka_unit_test(test_a_hand_off_does_not_grow_the_total),
		cmocka_unit_test(test_waiters_and_opens_have_their_own_caps),
		cmocka_unit_test(test_none_is_never_reached),
		cmocka_unit_test(test_a_burst_is_one_line_with_its_count),
		cmocka_unit_test_setup_teardown(test_a_burst_ends_after_a_quiet_second,
						use_fake_clock, use_real_clock),
		cmocka_unit_test_setup_teardown(test_a_burst_that_never_pauses_ends_after_ten_seconds,
						use_fake_clock, use_real_clock),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
