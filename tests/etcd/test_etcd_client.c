/*
 * The etcd client's requests (include/lockfs/etcd_client.h) against a real
 * etcd on loopback: configuration, key-values and transactions, leases,
 * watches, and threads sharing one client.  What happens to connections
 * (frozen, dead or silent endpoints, failover, TLS) is test_etcd_transport.c.
 * Run through tests/fixtures/etcd_fixtures.py exec --tls, which starts
 * a plain and a TLS etcd and passes their URLs in LOCKFS_ETCD_*; without
 * them every test that needs etcd is skipped.
 *
 * Each test works under its own key prefix, so the order of tests does not
 * matter.  Waits poll with a deadline; time bounds are asserted only where
 * the bound is the behaviour (a call never waits longer than timeout_ms).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lockfs/etcd_client.h"

#include "etcd_client_test_util.h"

/* ---- without etcd ---- */

static void test_open_refuses_bad_configuration(void **state)
{
	static const char *const bad[] = {
		"", "127.0.0.1:2379", "ftp://127.0.0.1:1", "http://", "http://h:1/v3",
		"http://h:1;", "http://h:1;;http://h:2", "http://h:1; http://h:2",
	};
	struct lockfs_etcd_config cfg = { 0 };
	struct lockfs_etcd *c;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cfg.endpoints = bad[i];
		assert_int_equal(lockfs_etcd_open(&c, &cfg), -EINVAL);
		assert_null(c);
	}
	cfg.endpoints = NULL;
	assert_int_equal(lockfs_etcd_open(&c, &cfg), -EINVAL);
	cfg.endpoints = "http://127.0.0.1:1";
	cfg.cert = "/dev/null";  /* a cert without its key */
	assert_int_equal(lockfs_etcd_open(&c, &cfg), -EINVAL);
	cfg.cert = NULL;
	cfg.cacert = "/nonexistent/ca.pem";
	assert_int_equal(lockfs_etcd_open(&c, &cfg), -ENOENT);
	cfg.cacert = NULL;
	cfg.timeout_ms = -1;
	assert_int_equal(lockfs_etcd_open(&c, &cfg), -EINVAL);
}

static void test_open_keeps_endpoints_in_order(void **state)
{
	struct lockfs_etcd *c = client_for("http://10.0.0.1:2379/;https://etcd-2:2379", 0);

	assert_int_equal(lockfs_etcd_endpoint_count(c), 2);
	assert_string_equal(lockfs_etcd_endpoint(c, 0), "http://10.0.0.1:2379");
	assert_string_equal(lockfs_etcd_endpoint(c, 1), "https://etcd-2:2379");
	assert_null(lockfs_etcd_endpoint(c, 2));
	lockfs_etcd_close(c);
}

static void test_prefix_end_increments_last_byte(void **state)
{
	char end[16];

	assert_int_equal(lockfs_etcd_prefix_end("/locks/", 7, end), 7);
	assert_memory_equal(end, "/locks0", 7);
	assert_int_equal(lockfs_etcd_prefix_end("a\xff\xff", 3, end), 1);
	assert_memory_equal(end, "b", 1);
	assert_int_equal(lockfs_etcd_prefix_end("\xff", 1, end), 0);
}

static void test_outcome_unknown_errors(void **state)
{
	assert_true(lockfs_etcd_outcome_unknown(-ETIMEDOUT));
	assert_true(lockfs_etcd_outcome_unknown(-EIO));
	assert_true(lockfs_etcd_outcome_unknown(-EAGAIN));
	assert_true(lockfs_etcd_outcome_unknown(-EPROTO));
	assert_false(lockfs_etcd_outcome_unknown(0));
	assert_false(lockfs_etcd_outcome_unknown(-ENOENT));
	assert_false(lockfs_etcd_outcome_unknown(-EINVAL));
	assert_false(lockfs_etcd_outcome_unknown(-EACCES));
}

/* ---- key-values ---- */

static void test_status_names_version_member_and_leader(void **state)
{
	struct lockfs_etcd *c = client();
	struct lockfs_etcd_status st;

	assert_int_equal(lockfs_etcd_status(c, &st), 0);
	assert_true(strncmp(st.version, "3.", 2) == 0);
	assert_true(st.member_id != 0);
	assert_true(st.leader == st.member_id);  /* one member: it leads */
	assert_true(st.revision >= 1);
	lockfs_etcd_close(c);
}

static void test_values_round_trip_every_byte_and_length(void **state)
{
	struct lockfs_etcd *c = client();
	char value[256];

	for (int i = 0; i < 256; i++)
		value[i] = (char)i;
	/* Every length mod 3 (base64 padding), every byte value. */
	for (size_t len = 0; len <= 256; len += (len < 8 ? 1 : 83)) {
		struct lockfs_etcd_op op = {
			.type = LOCKFS_ETCD_PUT, .key = "/t/bytes/k", .value = value, .value_len = len,
		};
		struct lockfs_etcd_op_resp r;

		assert_int_equal(lockfs_etcd_put(c, &op, NULL), 0);
		r = get(c, "/t/bytes/k");
		assert_int_equal(r.n_kvs, 1);
		assert_int_equal(r.kvs[0].value_len, len);
		assert_non_null(r.kvs[0].value);  /* an empty value is "", not NULL */
		assert_memory_equal(r.kvs[0].value, value, len);
		assert_int_equal(r.kvs[0].value[len], '\0');
		assert_int_equal(r.kvs[0].lease, 0);
		lockfs_etcd_op_resp_free(&r);
	}
	lockfs_etcd_close(c);
}

static void test_large_value_round_trips(void **state)
{
	/* Larger than any buffer on the way, well below etcd's 1.5 MiB. */
	struct lockfs_etcd *c = client();
	size_t len = 200000;
	char *value = malloc(len);
	struct lockfs_etcd_op op = {
		.type = LOCKFS_ETCD_PUT, .key = "/t/large", .value = value, .value_len = len,
	};
	struct lockfs_etcd_op_resp r;

	assert_non_null(value);
	memset(value, 'x', len);
	assert_int_equal(lockfs_etcd_put(c, &op, NULL), 0);
	r = get(c, "/t/large");
	assert_int_equal(r.n_kvs, 1);
	assert_int_equal(r.kvs[0].value_len, len);
	assert_memory_equal(r.kvs[0].value, value, len);
	lockfs_etcd_op_resp_free(&r);
	free(value);
	lockfs_etcd_close(c);
}

static void test_create_if_absent_wins_once_and_loser_reads_holder(void **state)
{
	struct lockfs_etcd *c = client();
	struct lockfs_etcd_txn_resp won, lost;
	int64_t lease;

	assert_int_equal(lockfs_etcd_lease_grant(c, 30, 0, &lease, NULL), 0);
	assert_int_equal(create_if_absent(c, "/t/acquire/deploy", "first", lease, &won), 0);
	assert_true(won.succeeded);
	assert_int_equal(won.n_ops, 2);
	assert_int_equal(won.ops[0].type, LOCKFS_ETCD_PUT);
	assert_int_equal(won.ops[1].type, LOCKFS_ETCD_RANGE);
	/* The txn's revision is the new key's create_revision. */
	assert_int_equal(won.ops[1].n_kvs, 1);
	assert_int_equal(won.ops[1].kvs[0].create_revision, won.revision);
	assert_int_equal(won.ops[1].kvs[0].lease, lease);

	assert_int_equal(create_if_absent(c, "/t/acquire/deploy", "second", 0, &lost), 0);
	assert_false(lost.succeeded);  /* a failed compare is no error */
	assert_int_equal(lost.n_ops, 1);
	assert_int_equal(lost.ops[0].type, LOCKFS_ETCD_RANGE);
	assert_int_equal(lost.ops[0].n_kvs, 1);
	assert_string_equal(lost.ops[0].kvs[0].key, "/t/acquire/deploy");
	assert_string_equal(lost.ops[0].kvs[0].value, "first");
	assert_int_equal(lost.ops[0].kvs[0].create_revision, won.revision);
	assert_int_equal(lost.ops[0].kvs[0].lease, lease);
	assert_int_equal(lost.ops[0].kvs[0].version, 1);

	lockfs_etcd_txn_resp_free(&won);
	lockfs_etcd_txn_resp_free(&lost);
	assert_int_equal(lockfs_etcd_lease_revoke(c, lease), 0);
	lockfs_etcd_close(c);
}

static void test_guarded_delete_never_removes_a_newer_key(void **state)
{
	struct lockfs_etcd *c = client();
	struct lockfs_etcd_txn_resp r;
	int64_t old_rev, new_rev;
	struct lockfs_etcd_op_resp now;

	assert_int_equal(create_if_absent(c, "/t/release/k", "a", 0, &r), 0);
	old_rev = r.revision;
	lockfs_etcd_txn_resp_free(&r);
	assert_true(guarded_delete(c, "/t/release/k", old_rev));
	assert_false(exists(c, "/t/release/k"));
	/* Already gone: the late retry does nothing. */
	assert_false(guarded_delete(c, "/t/release/k", old_rev));

	assert_int_equal(create_if_absent(c, "/t/release/k", "b", 0, &r), 0);
	new_rev = r.revision;
	lockfs_etcd_txn_resp_free(&r);
	assert_true(new_rev > old_rev);
	/* A stale release must not remove the successor's key. */
	assert_false(guarded_delete(c, "/t/release/k", old_rev));
	now = get(c, "/t/release/k");
	assert_int_equal(now.n_kvs, 1);
	assert_int_equal(now.kvs[0].create_revision, new_rev);
	assert_string_equal(now.kvs[0].value, "b");
	lockfs_etcd_op_resp_free(&now);
	assert_true(guarded_delete(c, "/t/release/k", new_rev));
	lockfs_etcd_close(c);
}

static void test_compare_on_version_mod_and_lease(void **state)
{
	struct lockfs_etcd *c = client();
	int64_t lease, rev;
	struct lockfs_etcd_op get_op = { .type = LOCKFS_ETCD_RANGE, .key = "/t/cmp/k" };
	struct lockfs_etcd_txn_resp r;

	assert_int_equal(lockfs_etcd_lease_grant(c, 30, 0, &lease, NULL), 0);
	put(c, "/t/cmp/k", "v1", lease);
	rev = put(c, "/t/cmp/k", "v2", lease);
	{
		struct lockfs_etcd_compare cmps[] = {
			{ .key = "/t/cmp/k", .target = LOCKFS_ETCD_VERSION, .number = 2 },
			{ .key = "/t/cmp/k", .target = LOCKFS_ETCD_MOD, .number = rev },
			{ .key = "/t/cmp/k", .target = LOCKFS_ETCD_LEASE, .number = lease },
			{ .key = "/t/cmp/k", .target = LOCKFS_ETCD_VALUE, .value = "v2", .value_len = 2 },
			{ .key = "/t/cmp/k", .target = LOCKFS_ETCD_CREATE,
			  .result = LOCKFS_ETCD_LESS, .number = rev },
		};
		struct lockfs_etcd_txn txn = {
			.compare = cmps, .n_compare = 5, .success = &get_op, .n_success = 1,
		};

		assert_int_equal(lockfs_etcd_txn(c, &txn, &r), 0);
		assert_true(r.succeeded);
		assert_int_equal(r.n_ops, 1);
		lockfs_etcd_txn_resp_free(&r);
		/* Each compare can fail on its own. */
		for (size_t i = 0; i < 5; i++) {
			struct lockfs_etcd_compare wrong = cmps[i];

			if (wrong.target == LOCKFS_ETCD_VALUE)
				wrong.value = "v1";
			else if (wrong.target == LOCKFS_ETCD_CREATE)
				wrong.result = LOCKFS_ETCD_GREATER;
			else
				wrong.result = LOCKFS_ETCD_NOT_EQUAL;
			txn.compare = &wrong;
			txn.n_compare = 1;
			assert_int_equal(lockfs_etcd_txn(c, &txn, &r), 0);
			assert_false(r.succeeded);
			assert_int_equal(r.n_ops, 0);
			lockfs_etcd_txn_resp_free(&r);
		}
	}
	assert_int_equal(lockfs_etcd_lease_revoke(c, lease), 0);
	lockfs_etcd_close(c);
}

static void test_compare_over_a_range_holds_for_every_key_or_none(void **state)
{
	struct lockfs_etcd *c = client();
	struct lockfs_etcd_op get_op = { .type = LOCKFS_ETCD_RANGE, .key = "/t/rcmp/x" };
	struct lockfs_etcd_compare none = {
		.key = "/t/rcmp/", .range_end = "/t/rcmp0", .target = LOCKFS_ETCD_VERSION,
	};
	struct lockfs_etcd_txn txn = {
		.compare = &none, .n_compare = 1, .success = &get_op, .n_success = 1,
	};
	struct lockfs_etcd_txn_resp r;
	int64_t first;

	/* Empty range: compared as a missing key (version 0). */
	assert_int_equal(lockfs_etcd_txn(c, &txn, &r), 0);
	assert_true(r.succeeded);
	lockfs_etcd_txn_resp_free(&r);
	first = put(c, "/t/rcmp/a", "1", 0);
	assert_int_equal(lockfs_etcd_txn(c, &txn, &r), 0);
	assert_false(r.succeeded);
	lockfs_etcd_txn_resp_free(&r);
	/* Non-empty: holds only when it holds for every key in it. */
	none.target = LOCKFS_ETCD_CREATE;
	none.result = LOCKFS_ETCD_LESS;
	none.number = first + 1;
	assert_int_equal(lockfs_etcd_txn(c, &txn, &r), 0);
	assert_true(r.succeeded);
	lockfs_etcd_txn_resp_free(&r);
	put(c, "/t/rcmp/b", "2", 0);
	assert_int_equal(lockfs_etcd_txn(c, &txn, &r), 0);
	assert_false(r.succeeded);
	lockfs_etcd_txn_resp_free(&r);
	/* A key outside the range does not count. */
	none.range_end = "/t/rcmp/b";
	assert_int_equal(lockfs_etcd_txn(c, &txn, &r), 0);
	assert_true(r.succeeded);
	lockfs_etcd_txn_resp_free(&r);
	lockfs_etcd_close(c);
}

static void test_range_by_prefix_is_in_byte_order(void **state)
{
	static const char *const inside[] = {  /* in byte order */
		"/t/order/A", "/t/order/a", "/t/order/b", "/t/order/b/c", "/t/order/\xc3\xa9",
	};
	static const char *const outside[] = { "/t/order", "/t/order0", "/t/orde" };
	struct lockfs_etcd *c = client();
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = "/t/order/", .prefix = true };
	struct lockfs_etcd_op_resp r;
	int64_t first_rev = 0;

	/* Created out of order, so key order is not creation order. */
	for (size_t i = 5; i-- > 0;) {
		int64_t rev = put(c, inside[i], inside[i], 0);

		if (!first_rev)
			first_rev = rev;
	}
	for (size_t i = 0; i < 3; i++)
		put(c, outside[i], "x", 0);

	assert_int_equal(lockfs_etcd_range(c, &op, &r), 0);
	assert_int_equal(r.n_kvs, 5);
	assert_int_equal(r.count, 5);
	assert_false(r.more);
	for (size_t i = 0; i < 5; i++) {
		assert_string_equal(r.kvs[i].key, inside[i]);
		assert_string_equal(r.kvs[i].value, inside[i]);
	}
	lockfs_etcd_op_resp_free(&r);

	/* LIMIT, and the etcd Mutex's "first created" query. */
	op.limit = 1;
	op.sort_order = LOCKFS_ETCD_SORT_ASCEND;
	op.sort_target = LOCKFS_ETCD_SORT_CREATE;
	assert_int_equal(lockfs_etcd_range(c, &op, &r), 0);
	assert_int_equal(r.n_kvs, 1);
	assert_true(r.more);
	assert_int_equal(r.count, 5);
	assert_string_equal(r.kvs[0].key, inside[4]);
	assert_int_equal(r.kvs[0].create_revision, first_rev);
	lockfs_etcd_op_resp_free(&r);

	/* Keys only, and a count alone. */
	op = (struct lockfs_etcd_op){
		.type = LOCKFS_ETCD_RANGE, .key = "/t/order/", .prefix = true, .keys_only = true,
	};
	assert_int_equal(lockfs_etcd_range(c, &op, &r), 0);
	assert_int_equal(r.n_kvs, 5);
	assert_int_equal(r.kvs[0].value_len, 0);
	lockfs_etcd_op_resp_free(&r);
	op.keys_only = false;
	op.count_only = true;
	assert_int_equal(lockfs_etcd_range(c, &op, &r), 0);
	assert_int_equal(r.n_kvs, 0);
	assert_int_equal(r.count, 5);
	lockfs_etcd_op_resp_free(&r);

	/* [key, range_end) */
	op = (struct lockfs_etcd_op){
		.type = LOCKFS_ETCD_RANGE, .key = "/t/order/a", .range_end = "/t/order/b/",
	};
	assert_int_equal(lockfs_etcd_range(c, &op, &r), 0);
	assert_int_equal(r.n_kvs, 2);
	assert_string_equal(r.kvs[0].key, "/t/order/a");
	assert_string_equal(r.kvs[1].key, "/t/order/b");
	lockfs_etcd_op_resp_free(&r);

	/* Nothing there: no kvs, count 0, no error. */
	op = (struct lockfs_etcd_op){ .type = LOCKFS_ETCD_RANGE, .key = "/t/nothing/", .prefix = true };
	assert_int_equal(lockfs_etcd_range(c, &op, &r), 0);
	assert_int_equal(r.n_kvs, 0);
	assert_int_equal(r.count, 0);
	assert_null(r.kvs);
	assert_true(r.revision > 0);
	lockfs_etcd_op_resp_free(&r);

	/* Delete by prefix, with the deleted kvs. */
	op = (struct lockfs_etcd_op){
		.type = LOCKFS_ETCD_DELETE, .key = "/t/order/", .prefix = true, .prev_kv = true,
	};
	assert_int_equal(lockfs_etcd_delete(c, &op, &r), 0);
	assert_int_equal(r.count, 5);
	assert_int_equal(r.n_kvs, 5);
	lockfs_etcd_op_resp_free(&r);
	assert_true(exists(c, "/t/order0"));
	lockfs_etcd_close(c);
}

static void test_etcd_refusals_map_to_errno(void **state)
{
	struct lockfs_etcd *c = client();
	struct lockfs_etcd_op two_puts[] = {
		{ .type = LOCKFS_ETCD_PUT, .key = "/t/refuse/k", .value = "1", .value_len = 1 },
		{ .type = LOCKFS_ETCD_PUT, .key = "/t/refuse/k", .value = "2", .value_len = 1 },
	};
	struct lockfs_etcd_txn txn = { .success = two_puts, .n_success = 2 };
	struct lockfs_etcd_op future = {
		.type = LOCKFS_ETCD_RANGE, .key = "/t/refuse/k", .revision = INT64_MAX / 2,
	};
	struct lockfs_etcd_txn_resp tr;
	struct lockfs_etcd_op_resp r;
	int64_t lease;

	assert_int_equal(lockfs_etcd_txn(c, &txn, &tr), -EINVAL);  /* "duplicate key" */
	assert_int_equal(tr.n_ops, 0);
	assert_int_equal(lockfs_etcd_range(c, &future, &r), -ERANGE);
	assert_int_equal(r.n_kvs, 0);
	assert_int_equal(lockfs_etcd_lease_grant(c, 30, 0, &lease, NULL), 0);
	assert_int_equal(lockfs_etcd_lease_grant(c, 30, lease, &lease, NULL), -EEXIST);
	assert_int_equal(lease, 0);
	lockfs_etcd_close(c);
}

/* ---- leases ---- */

static void test_lease_grant_keepalive_revoke_removes_keys(void **state)
{
	struct lockfs_etcd *c = client();
	struct lockfs_etcd_lease_info info;
	int64_t lease, ttl;
	struct lockfs_etcd_txn_resp r;

	assert_int_equal(lockfs_etcd_lease_grant(c, 20, 0, &lease, &ttl), 0);
	assert_true(lease > 0);
	assert_int_equal(ttl, 20);
	assert_int_equal(create_if_absent(c, "/t/lease/k", "held", lease, &r), 0);
	assert_true(r.succeeded);
	lockfs_etcd_txn_resp_free(&r);

	assert_int_equal(lockfs_etcd_lease_keepalive(c, lease, &ttl), 0);
	assert_int_equal(ttl, 20);
	assert_int_equal(lockfs_etcd_lease_timetolive(c, lease, true, &info), 0);
	assert_int_equal(info.granted_ttl, 20);
	assert_true(info.ttl > 0 && info.ttl <= 20);
	assert_int_equal(info.n_keys, 1);
	assert_string_equal(info.keys[0], "/t/lease/k");
	assert_null(info.keys[1]);
	lockfs_etcd_lease_info_free(&info);

	assert_int_equal(lockfs_etcd_lease_revoke(c, lease), 0);
	assert_false(exists(c, "/t/lease/k"));
	/* Gone: every lease call says ENOENT. */
	assert_int_equal(lockfs_etcd_lease_keepalive(c, lease, &ttl), -ENOENT);
	assert_int_equal(ttl, 0);
	assert_int_equal(lockfs_etcd_lease_revoke(c, lease), -ENOENT);
	assert_int_equal(lockfs_etcd_lease_timetolive(c, lease, false, &info), -ENOENT);
	lockfs_etcd_close(c);
}

static void test_lease_expiry_removes_keys_and_refuses_new_ones(void **state)
{
	struct lockfs_etcd *c = client();
	int64_t lease, ttl, deadline;
	struct lockfs_etcd_txn_resp r;
	struct lockfs_etcd_op op = {
		.type = LOCKFS_ETCD_PUT, .key = "/t/expiry/late", .value = "x", .value_len = 1,
	};

	/* The fixture's --election-timeout 100 lets etcd keep a TTL of 1. */
	assert_int_equal(lockfs_etcd_lease_grant(c, 1, 0, &lease, &ttl), 0);
	assert_int_equal(ttl, 1);
	put(c, "/t/expiry/k", "x", lease);
	deadline = now_ms() + WAIT_MS;
	while (exists(c, "/t/expiry/k") && now_ms() < deadline)
		sleep_ms(20);
	assert_false(exists(c, "/t/expiry/k"));
	assert_int_equal(lockfs_etcd_lease_keepalive(c, lease, &ttl), -ENOENT);
	/* Attaching a key to the lost lease fails, and creates nothing. */
	op.lease = lease;
	assert_int_equal(lockfs_etcd_put(c, &op, NULL), -ENOENT);
	assert_int_equal(create_if_absent(c, "/t/expiry/late", "x", lease, &r), -ENOENT);
	assert_false(exists(c, "/t/expiry/late"));
	lockfs_etcd_close(c);
}

/* ---- watch ---- */

static void test_watch_delivers_put_and_delete_in_order(void **state)
{
	struct lockfs_etcd *c = client();
	struct collector col;
	struct lockfs_etcd_watch *w;
	struct lockfs_etcd_op del = { .type = LOCKFS_ETCD_DELETE, .key = "/t/watch/a" };
	int64_t r1, r2, r3;

	collector_init(&col);
	w = watch(c, "/t/watch/", 0, &col);
	r1 = put(c, "/t/watch/a", "one", 0);
	put(c, "/t/watchx", "outside the prefix", 0);
	r2 = put(c, "/t/watch/a", "two", 0);
	assert_int_equal(lockfs_etcd_delete(c, &del, NULL), 0);
	r3 = r2 + 1;
	assert_true(await(&col, 3));
	lockfs_etcd_watch_close(w);

	assert_int_equal(col.n, 3);
	assert_int_equal(col.ev[0].type, LOCKFS_ETCD_EVENT_PUT);
	assert_string_equal(col.ev[0].value, "one");
	assert_int_equal(col.ev[0].mod_revision, r1);
	assert_false(col.ev[0].has_prev);
	assert_int_equal(col.ev[1].type, LOCKFS_ETCD_EVENT_PUT);
	assert_string_equal(col.ev[1].value, "two");
	assert_true(col.ev[1].has_prev);
	assert_string_equal(col.ev[1].prev_value, "one");
	assert_int_equal(col.ev[2].type, LOCKFS_ETCD_EVENT_DELETE);
	assert_string_equal(col.ev[2].key, "/t/watch/a");
	assert_int_equal(col.ev[2].mod_revision, r3);
	assert_true(col.ev[2].has_prev);
	assert_string_equal(col.ev[2].prev_value, "two");
	assert_int_equal(col.next_revision, r3 + 1);
	assert_false(col.ended);  /* closed by us: no ENDED */
	collector_destroy(&col);
	lockfs_etcd_close(c);
}

static void test_watch_from_a_revision_replays_history_and_resumes_without_gaps(void **state)
{
	struct lockfs_etcd *c = client();
	struct collector col;
	struct lockfs_etcd_watch *w;
	int64_t r1, r2, r3, resume;

	r1 = put(c, "/t/resume/k", "1", 0);
	r2 = put(c, "/t/resume/k", "2", 0);
	r3 = put(c, "/t/resume/k", "3", 0);
	assert_true(r1 < r2 && r2 < r3);

	collector_init(&col);
	w = watch(c, "/t/resume/", r2, &col);
	assert_true(await(&col, 2));
	lockfs_etcd_watch_close(w);
	assert_int_equal(col.n, 2);
	assert_string_equal(col.ev[0].value, "2");
	assert_string_equal(col.ev[1].value, "3");
	resume = col.next_revision;
	assert_int_equal(resume, r3 + 1);
	collector_destroy(&col);

	/* Changes while no watch runs, then a new watch from next_revision:
	 * exactly the missed events, none twice. */
	put(c, "/t/resume/k", "4", 0);
	put(c, "/t/resume/k", "5", 0);
	collector_init(&col);
	w = watch(c, "/t/resume/", resume, &col);
	assert_true(await(&col, 2));
	put(c, "/t/resume/k", "6", 0);
	assert_true(await(&col, 3));
	lockfs_etcd_watch_close(w);
	assert_int_equal(col.n, 3);
	assert_string_equal(col.ev[0].value, "4");
	assert_string_equal(col.ev[1].value, "5");
	assert_string_equal(col.ev[2].value, "6");
	collector_destroy(&col);
	lockfs_etcd_close(c);
}

static void test_watch_progress_notifications_do_not_advance_the_resume_point(void **state)
{
	struct lockfs_etcd *c = client();
	struct lockfs_etcd_watch_req req = {
		.key = "/t/progress/", .prefix = true, .progress_notify = true,
	};
	struct collector col;
	struct lockfs_etcd_watch *w;
	int64_t created_next, deadline = now_ms() + WAIT_MS;
	bool seen = false;

	collector_init(&col);
	assert_int_equal(lockfs_etcd_watch_open(&w, c, &req, collect, &col), 0);
	pthread_mutex_lock(&col.mu);
	created_next = col.next_revision;
	pthread_mutex_unlock(&col.mu);
	put(c, "/t/elsewhere", "moves the store's revision on", 0);
	/* The fixture's etcd notifies every 200 ms. */
	while (!seen && now_ms() < deadline) {
		sleep_ms(20);
		pthread_mutex_lock(&col.mu);
		seen = col.progress > 0;
		pthread_mutex_unlock(&col.mu);
	}
	lockfs_etcd_watch_close(w);
	assert_true(seen);
	assert_int_equal(col.n, 0);
	assert_int_equal(col.next_revision, created_next);
	collector_destroy(&col);
	lockfs_etcd_close(c);
}

static void test_compaction_ends_an_old_watch_with_resync(void **state)
{
	struct lockfs_etcd *c = client();
	struct collector col;
	struct lockfs_etcd_watch *w;
	struct lockfs_etcd_op old = { .type = LOCKFS_ETCD_RANGE, .key = "/t/compact/k" };
	struct lockfs_etcd_op_resp r;
	int64_t r1, r2;

	r1 = put(c, "/t/compact/k", "1", 0);
	r2 = put(c, "/t/compact/k", "2", 0);
	assert_int_equal(lockfs_etcd_compact(c, r2), 0);
	assert_int_equal(lockfs_etcd_compact(c, r2), -ERANGE);  /* compacted already */
	old.revision = r1;
	assert_int_equal(lockfs_etcd_range(c, &old, &r), -ERANGE);

	collector_init(&col);
	w = watch(c, "/t/compact/", r1, &col);
	assert_true(await(&col, -1));
	assert_int_equal(col.end.kind, LOCKFS_ETCD_WATCH_ENDED);
	assert_int_equal(col.end.error, -ERANGE);
	assert_true(col.end.resync);
	assert_int_equal(col.end.compact_revision, r2);
	assert_int_equal(col.n, 0);
	lockfs_etcd_watch_close(w);
	collector_destroy(&col);
	lockfs_etcd_close(c);
}

/* ---- threads ---- */

struct worker {
	struct lockfs_etcd *c;
	int id;
	int failures;
};

static void *pairs(void *arg)
{
	struct worker *wk = arg;
	char key[64];

	snprintf(key, sizeof(key), "/t/threads/%d", wk->id);
	for (int i = 0; i < 40; i++) {
		struct lockfs_etcd_txn_resp r;

		if (create_if_absent(wk->c, key, "x", 0, &r) || !r.succeeded ||
		    !guarded_delete(wk->c, key, r.revision))
			wk->failures++;
		lockfs_etcd_txn_resp_free(&r);
	}
	return NULL;
}

static void test_threads_share_one_client(void **state)
{
	struct lockfs_etcd *c = client();
	struct worker wk[8];
	pthread_t t[8];

	for (int i = 0; i < 8; i++) {
		wk[i] = (struct worker){ .c = c, .id = i };
		assert_int_equal(pthread_create(&t[i], NULL, pairs, &wk[i]), 0);
	}
	for (int i = 0; i < 8; i++) {
		assert_int_equal(pthread_join(t[i], NULL), 0);
		assert_int_equal(wk[i].failures, 0);
	}
	lockfs_etcd_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_refuses_bad_configuration),
		cmocka_unit_test(test_open_keeps_endpoints_in_order),
		cmocka_unit_test(test_prefix_end_increments_last_byte),
		cmocka_unit_test(test_outcome_unknown_errors),
		cmocka_unit_test(test_status_names_version_member_and_leader),
		cmocka_unit_test(test_values_round_trip_every_byte_and_length),
		cmocka_unit_test(test_large_value_round_trips),
		cmocka_unit_test(test_create_if_absent_wins_once_and_loser_reads_holder),
		cmocka_unit_test(test_guarded_delete_never_removes_a_newer_key),
		cmocka_unit_test(test_compare_on_version_mod_and_lease),
		cmocka_unit_test(test_compare_over_a_range_holds_for_every_key_or_none),
		cmocka_unit_test(test_range_by_prefix_is_in_byte_order),
		cmocka_unit_test(test_etcd_refusals_map_to_errno),
		cmocka_unit_test(test_lease_grant_keepalive_revoke_removes_keys),
		cmocka_unit_test(test_lease_expiry_removes_keys_and_refuses_new_ones),
		cmocka_unit_test(test_watch_delivers_put_and_delete_in_order),
		cmocka_unit_test(test_watch_from_a_revision_replays_history_and_resumes_without_gaps),
		cmocka_unit_test(test_watch_progress_notifications_do_not_advance_the_resume_point),
		cmocka_unit_test(test_compaction_ends_an_old_watch_with_resync),
		cmocka_unit_test(test_threads_share_one_client),
	};

	signal(SIGPIPE, SIG_IGN);  /* a proxy that died must fail a test, not kill us */
	etcd_url = getenv("LOCKFS_ETCD_URL");
	if (!etcd_url)
		fprintf(stderr, "LOCKFS_ETCD_URL is not set: the tests that need etcd are skipped "
			"(run through tests/fixtures/etcd_fixtures.py exec --tls)\n");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
