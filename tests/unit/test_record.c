/* Unit tests for the lock record (core/base/record.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"
#include "lockfs/record.h"
#include "../../core/base/clock.h"

#define TOKEN "0123456789abcdef0123456789abcdef"
#define CONTAINER "c0ffeefedcba9876543210fedcba9876543210fedcba9876543210fedcba9876"

/* The record's fields are char * (it owns them once parsed); tests point
 * them at literals. */
#define S(lit) ((char *)(lit))

static char *argv_full[] = { S("flock"), S("-n"), S("/tmp/x"), S("make deploy"), NULL };
static char *argv_empty[] = { NULL };

/* A record with every field set; points at static data (do not clear). */
static struct lockfs_record full_record(void)
{
	struct lockfs_record r = {
		.resource = S("deploy"),
		.has_holder = true,
		.holder = {
			.pid = 4242,
			.ns_pid = 7,
			.container = S(CONTAINER),
			.start_time = 123456789ULL,
			.uid = 1000,
			.gid = 1001,
			.user = S("alice"),
			.comm = S("make"),
			.cmdline = argv_full,
			.host = S("build-1"),
			.boot_id = S("6f1c1c9e-0b1e-4e43-9d55-3b7c3e5b2f10"),
		},
		.acquired_at_ms = 1787439952123LL,
		.operation = S("deploying \"v2\"\nline two"),
		.slug = S("job-17"),
		.fence = 7,
		.token = TOKEN,
	};
	return r;
}

static char *encode(const struct lockfs_record *r, int flags, size_t *len)
{
	char *s = lockfs_record_encode(r, flags, len);

	assert_non_null(s);
	assert_int_equal(strlen(s), *len);
	assert_true(*len > 0 && s[*len - 1] == '\n');
	return s;
}

static void assert_str_or_null_equal(const char *a, const char *b)
{
	if (!a || !b)
		assert_ptr_equal(a, b);
	else
		assert_string_equal(a, b);
}

static void assert_records_equal(const struct lockfs_record *a,
				 const struct lockfs_record *b)
{
	assert_string_equal(a->resource, b->resource);
	assert_int_equal(a->has_holder, b->has_holder);
	if (a->has_holder) {
		size_t i;

		assert_int_equal(a->holder.pid, b->holder.pid);
		assert_int_equal(a->holder.ns_pid, b->holder.ns_pid);
		assert_str_or_null_equal(a->holder.container, b->holder.container);
		assert_int_equal(a->holder.start_time, b->holder.start_time);
		assert_int_equal(a->holder.uid, b->holder.uid);
		assert_int_equal(a->holder.gid, b->holder.gid);
		assert_str_or_null_equal(a->holder.user, b->holder.user);
		assert_string_equal(a->holder.comm, b->holder.comm);
		assert_string_equal(a->holder.host, b->holder.host);
		assert_string_equal(a->holder.boot_id, b->holder.boot_id);
		assert_non_null(b->holder.cmdline);
		for (i = 0; a->holder.cmdline[i]; i++) {
			assert_non_null(b->holder.cmdline[i]);
			assert_string_equal(a->holder.cmdline[i], b->holder.cmdline[i]);
		}
		assert_null(b->holder.cmdline[i]);
	}
	assert_int_equal(a->acquired_at_ms, b->acquired_at_ms);
	assert_str_or_null_equal(a->operation, b->operation);
	assert_str_or_null_equal(a->slug, b->slug);
	assert_int_equal(a->fence, b->fence);
	assert_string_equal(a->token, b->token);
	assert_int_equal(a->bound, b->bound);
	assert_int_equal(a->lease.ttl_s, b->lease.ttl_s);
	if (a->lease.ttl_s)
		assert_int_equal(a->lease.deadline_boot_ms, b->lease.deadline_boot_ms);
}

static void round_trip(const struct lockfs_record *r, int flags)
{
	struct lockfs_record back;
	size_t len;
	char *s = encode(r, flags | LOCKFS_RECORD_WITH_TOKEN, &len);

	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_records_equal(r, &back);
	lockfs_record_clear(&back);
	free(s);
}

static void test_round_trip_all_fields(void **state)
{
	struct lockfs_record r = full_record();

	round_trip(&r, 0);
	round_trip(&r, LOCKFS_RECORD_PRETTY);
}

static void test_round_trip_null_operation_slug_user(void **state)
{
	struct lockfs_record r = full_record();

	r.operation = NULL;
	r.slug = NULL;
	r.holder.user = NULL;
	r.holder.cmdline = argv_empty;
	round_trip(&r, 0);
}

static void test_round_trip_slug_bound_with_lease(void **state)
{
	struct lockfs_record r = full_record();
	size_t len;
	char *s;

	r.bound = LOCKFS_BOUND_SLUG;
	r.lease.ttl_s = 600;
	r.lease.deadline_boot_ms = 123456789;
	r.lease.expires_at_ms = 1787439952123;
	round_trip(&r, 0);
	s = encode(&r, 0, &len);
	assert_non_null(strstr(s, "\"bound\":\"slug\""));
	assert_non_null(strstr(s, "\"lease\":{\"ttl_s\":600,\"expires_at\":\"2026-08-22T23:05:52.123Z\""));
	free(s);
}

static void test_slug_bound_without_slug_is_einval(void **state)
{
	struct lockfs_record r = full_record(), back;
	size_t len;
	char *s;

	r.bound = LOCKFS_BOUND_SLUG;
	r.slug = NULL;
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_int_equal(lockfs_record_parse(s, len, &back), -EINVAL);
	free(s);
}

static void test_record_without_bound_is_process_bound(void **state)
{
	struct lockfs_record r = full_record(), back;
	size_t len;
	char *s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	char *p = strstr(s, "\"bound\":\"process\",");

	/* A record from before "bound" existed. */
	assert_non_null(p);
	for (const char *q = p + strlen("\"bound\":\"process\","); (*p++ = *q++) != '\0';)
		;
	assert_int_equal(lockfs_record_parse(s, strlen(s), &back), 0);
	assert_int_equal(back.bound, LOCKFS_BOUND_PROCESS);
	lockfs_record_clear(&back);
	free(s);
}

static void test_round_trip_no_holder(void **state)
{
	struct lockfs_record r = full_record();
	struct lockfs_record back;
	size_t len;
	char *s;

	r.has_holder = false;
	round_trip(&r, LOCKFS_RECORD_PRETTY);

	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_non_null(strstr(s, "\"holder\":null"));
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_false(back.has_holder);
	lockfs_record_clear(&back);
	free(s);
}

static void test_compact_layout_and_key_order(void **state)
{
	struct lockfs_record r = full_record();
	size_t len;
	char *s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	const char *want =
		"{\"resource\":\"deploy\",\"bound\":\"process\",\"mode\":\"exclusive\","
		"\"holder\":{\"pid\":4242,\"ns_pid\":7,\"container\":\"" CONTAINER "\","
		"\"start_time\":123456789,\"uid\":1000,\"user\":\"alice\","
		"\"gid\":1001,\"comm\":\"make\","
		"\"cmdline\":[\"flock\",\"-n\",\"/tmp/x\",\"make deploy\"],"
		"\"host\":\"build-1\","
		"\"boot_id\":\"6f1c1c9e-0b1e-4e43-9d55-3b7c3e5b2f10\"},"
		"\"acquired_at\":\"2026-08-22T23:05:52.123Z\","
		"\"acquired_at_ms\":1787439952123,"
		"\"operation\":\"deploying \\\"v2\\\"\\nline two\","
		"\"slug\":\"job-17\",\"lease\":null,\"fence\":7,"
		"\"token\":\"" TOKEN "\"}\n";

	assert_string_equal(s, want);
	free(s);
}

/* The hand-written compact encoder must say exactly what jansson would. */
static void test_compact_equals_janssons_output(void **state)
{
	static char comm[] = "we\"ird\\ \x01\x1f\x7f tab\t nl\n \xc3\xa9 \xf0\x9f\x94\x92 bad\xff\xc3";
	struct lockfs_record r = full_record();
	size_t len;
	char *ours, *theirs;
	json_t *j;

	r.holder.comm = comm;
	r.bound = LOCKFS_BOUND_SLUG;
	r.lease.ttl_s = 30;
	r.lease.deadline_boot_ms = -5;
	r.lease.expires_at_ms = 1787439952123;
	ours = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	j = json_loadb(ours, len, 0, NULL);
	assert_non_null(j);
	theirs = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
	assert_non_null(theirs);
	assert_int_equal(strlen(theirs) + 1, len);
	assert_memory_equal(ours, theirs, len - 1);
	assert_int_equal(ours[len - 1], '\n');
	free(theirs);
	json_decref(j);
	free(ours);
}

/* A holder that exited: its session and live descendants round-trip,
 * in both encoders, which agree byte for byte. */
static void test_descendants_round_trip(void **state)
{
	struct lockfs_descendant kids[2] = {
		{ .pid = 5001, .start_time = 777, .comm = "deploy.sh" },
		{ .pid = 5002, .start_time = 778, .comm = "bad\xff", .candidate = true },
	};
	struct lockfs_record r = full_record(), back;
	const int flags[] = { LOCKFS_RECORD_WITH_TOKEN,
			      LOCKFS_RECORD_WITH_TOKEN | LOCKFS_RECORD_PRETTY };
	size_t len;
	char *s, *theirs;
	json_t *j;

	r.holder_session = 4200;
	r.holder_exited = true;
	r.descendants = kids;
	r.ndescendants = 2;
	for (size_t f = 0; f < 2; f++) {
		s = encode(&r, flags[f], &len);
		assert_int_equal(lockfs_record_parse(s, len, &back), 0);
		assert_records_equal(&r, &back);
		assert_int_equal(back.holder_session, 4200);
		assert_true(back.holder_exited);
		assert_int_equal(back.ndescendants, 2);
		assert_int_equal(back.descendants[0].pid, 5001);
		assert_int_equal(back.descendants[0].start_time, 777);
		assert_string_equal(back.descendants[0].comm, "deploy.sh");
		assert_int_equal(back.descendants[1].pid, 5002);
		assert_string_equal(back.descendants[1].comm, "bad\xef\xbf\xbd");
		assert_false(back.descendants[0].candidate);
		assert_true(back.descendants[1].candidate);
		lockfs_record_clear(&back);
		free(s);
	}
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_non_null(strstr(s, "\"fence\":7,\"holder_session\":4200,\"holder_exited\":true,"
			       "\"descendants\":[{\"pid\":5001,\"start_time\":777,"
			       "\"comm\":\"deploy.sh\",\"via\":\"tree\"},"));
	j = json_loadb(s, len, 0, NULL);
	assert_non_null(j);
	theirs = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
	assert_non_null(theirs);
	assert_int_equal(strlen(theirs) + 1, len);
	assert_memory_equal(s, theirs, len - 1);
	free(theirs);
	json_decref(j);
	free(s);
	/* None of it for a live holder: no key at all. */
	r.holder_exited = false;
	r.holder_session = 0;
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN | LOCKFS_RECORD_PRETTY, &len);
	assert_null(strstr(s, "holder_exited"));
	assert_null(strstr(s, "descendants"));
	assert_null(strstr(s, "holder_session"));
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_false(back.holder_exited);
	assert_int_equal(back.holder_session, 0);
	lockfs_record_clear(&back);
	free(s);
}

/* "holder_exited" must come with its list, of proper entries. */
static void test_bad_descendants_are_einval(void **state)
{
	static const char *bad[] = {
		"\"holder_exited\":true",
		"\"holder_exited\":1,\"descendants\":[]",
		"\"holder_exited\":true,\"descendants\":{}",
		"\"holder_exited\":true,\"descendants\":[1]",
		"\"holder_exited\":true,\"descendants\":[{\"pid\":0,\"start_time\":1}]",
		"\"holder_exited\":true,\"descendants\":[{\"pid\":5,\"start_time\":-1}]",
		"\"holder_exited\":true,\"descendants\":[{\"pid\":5}]",
		"\"holder_exited\":true,\"descendants\":[{\"pid\":5,\"start_time\":1,\"comm\":3}]",
		"\"holder_session\":-1",
		"\"holder_session\":\"x\"",
	};
	struct lockfs_record r = full_record(), back;
	size_t len;
	char *s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	char *brace = strrchr(s, '}');

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char buf[4096];
		int n = snprintf(buf, sizeof(buf), "%.*s,%s}\n", (int)(brace - s), s, bad[i]);

		assert_int_equal(lockfs_record_parse(buf, (size_t)n, &back), -EINVAL);
	}
	free(s);
}

/* A shared fd lock keeps every holder, each with its own fence and open
 * file, through the store's encoding; the owner view lists them all. */
static void test_shared_fd_record_round_trip(void **state)
{
	struct lockfs_record r = full_record(), back;
	struct lockfs_share sh[2];
	size_t len;
	char *s, *pretty;

	memset(sh, 0, sizeof(sh));
	r.bound = LOCKFS_BOUND_FD;
	r.slug = NULL;
	r.mode = LOCKFS_SHARED;
	strcpy(r.fd_owner, "flock:00000000000000aa");
	sh[0].holder = r.holder;
	sh[0].holder.pid = 4343;
	sh[0].bound = LOCKFS_BOUND_FD;
	strcpy(sh[0].fd_owner, "posix:00000000000000bb");
	sh[0].fence = 8;
	sh[0].acquired_at_ms = r.acquired_at_ms + 5;
	sh[1].holder = r.holder;
	sh[1].holder.pid = 4444;
	sh[1].bound = LOCKFS_BOUND_PROCESS;
	sh[1].fence = 9;
	sh[1].acquired_at_ms = r.acquired_at_ms + 6;
	char slug2[] = "reader-2"; /* the share's own LOCKFS_SLUG, for the log */

	sh[1].slug = slug2;
	r.shares = sh;
	r.nshares = 2;
	/* The first holder left: `holder` is a later grant than the lock's. */
	r.holder_fence = 11;
	r.holder_acquired_at_ms = r.acquired_at_ms + 9;
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_int_equal(back.bound, LOCKFS_BOUND_FD);
	assert_int_equal(back.mode, LOCKFS_SHARED);
	assert_string_equal(back.fd_owner, "flock:00000000000000aa");
	assert_int_equal(back.fence, r.fence);
	assert_int_equal(lockfs_holder_fence(&back), 11);
	assert_int_equal(lockfs_holder_acquired_at(&back), r.acquired_at_ms + 9);
	assert_int_equal(back.nshares, 2);
	assert_int_equal(back.shares[0].holder.pid, 4343);
	assert_string_equal(back.shares[0].fd_owner, "posix:00000000000000bb");
	assert_int_equal(back.shares[0].fence, 8);
	assert_int_equal(back.shares[1].holder.pid, 4444);
	assert_int_equal(back.shares[1].bound, LOCKFS_BOUND_PROCESS);
	assert_string_equal(back.shares[1].fd_owner, "");
	assert_int_equal(back.shares[1].acquired_at_ms, r.acquired_at_ms + 6);
	assert_null(back.shares[0].slug);
	assert_string_equal(back.shares[1].slug, "reader-2");
	lockfs_record_clear(&back);
	{
		/* a share stored without "slug" (before it was kept) still parses */
		char *old = strdup(s), *p = strstr(old, ",\"slug\":\"reader-2\"");

		assert_non_null(p);
		memmove(p, p + strlen(",\"slug\":\"reader-2\""),
			strlen(p + strlen(",\"slug\":\"reader-2\"")) + 1);
		assert_int_equal(lockfs_record_parse(old, strlen(old), &back), 0);
		assert_null(back.shares[1].slug);
		lockfs_record_clear(&back);
		free(old);
	}
	pretty = encode(&r, LOCKFS_RECORD_PRETTY, &len);
	assert_non_null(strstr(pretty, "\"mode\": \"shared\""));
	assert_non_null(strstr(pretty, "\"pid\": 4444"));
	assert_null(strstr(pretty, "fd_owner")); /* the kernel's cookie stays inside */
	free(pretty);
	free(s);
}

/* An fd-bound record must say which open file holds it, and only it. */
static void test_fd_owner_matches_bound(void **state)
{
	struct lockfs_record r = full_record(), back;
	size_t len;
	char *s;

	r.bound = LOCKFS_BOUND_FD;
	r.slug = NULL;
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_int_equal(lockfs_record_parse(s, len, &back), -EINVAL);
	free(s);
	strcpy(r.fd_owner, "flock:1");
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	lockfs_record_clear(&back);
	free(s);
}

/* What reader READER sees of R, as a jansson object. */
static json_t *view_as(const struct lockfs_record *r, uid_t reader)
{
	size_t len;
	char *s = lockfs_record_view(r, reader, &len);
	json_t *j;

	assert_non_null(s);
	assert_int_equal(strlen(s), len);
	j = json_loadb(s, len, 0, NULL);
	assert_non_null(j);
	free(s);
	return j;
}

static bool shows_argv(const json_t *holder)
{
	return json_is_array(json_object_get(holder, "cmdline"));
}

/* issue 8 §6: the command line and the token only for the holder's uid
 * and root; everyone else sees `"cmdline": null` and no token. */
static void test_view_shows_cmdline_and_token_to_holder_uid_and_root(void **state)
{
	struct lockfs_record r = full_record(); /* holder uid 1000 */
	uid_t readers[] = { 0, 1000, 1001 };

	for (size_t i = 0; i < 3; i++) {
		json_t *j = view_as(&r, readers[i]), *h = json_object_get(j, "holder");
		bool mine = readers[i] != 1001;

		assert_int_equal(shows_argv(h), mine);
		if (!mine)
			assert_true(json_is_null(json_object_get(h, "cmdline")));
		assert_int_equal(json_object_get(j, "token") != NULL, mine);
		assert_int_equal(shows_argv(json_array_get(json_object_get(j, "holders"), 0)),
				 mine);
		assert_string_equal(json_string_value(json_object_get(h, "comm")), "make");
		json_decref(j);
	}
}

static void test_view_judges_each_shared_holder_by_its_own_uid(void **state)
{
	struct lockfs_record r = full_record();
	struct lockfs_share sh[1];
	json_t *j, *hs;

	memset(sh, 0, sizeof(sh));
	r.bound = LOCKFS_BOUND_FD;
	r.mode = LOCKFS_SHARED;
	sh[0].holder = r.holder;
	sh[0].holder.pid = 4343;
	sh[0].holder.uid = 1001;
	sh[0].bound = LOCKFS_BOUND_FD;
	sh[0].fence = 8;
	r.shares = sh;
	r.nshares = 1;
	j = view_as(&r, 1001);
	hs = json_object_get(j, "holders");
	assert_false(shows_argv(json_array_get(hs, 0))); /* uid 1000's */
	assert_true(shows_argv(json_array_get(hs, 1)));  /* its own */
	assert_null(json_object_get(j, "token"));       /* the token is holder.uid's */
	json_decref(j);
	j = view_as(&r, 0);
	hs = json_object_get(j, "holders");
	assert_true(shows_argv(json_array_get(hs, 0)) && shows_argv(json_array_get(hs, 1)));
	json_decref(j);
}

static void test_the_stored_record_keeps_every_cmdline(void **state)
{
	struct lockfs_record r = full_record();
	size_t len;
	char *s = encode(&r, LOCKFS_RECORD_PRETTY, &len);

	assert_non_null(strstr(s, "make deploy"));
	free(s);
}

static void test_pretty_is_indented_and_parses(void **state)
{
	struct lockfs_record r = full_record(), back;
	size_t len;
	char *s = encode(&r, LOCKFS_RECORD_PRETTY | LOCKFS_RECORD_WITH_TOKEN, &len);
	const char *head = "{\n  \"resource\": \"deploy\",\n  \"bound\": \"process\",\n"
		"  \"mode\": \"exclusive\",\n  \"holder\": {\n    \"pid\": 4242,";

	assert_memory_equal(s, head, strlen(head));
	assert_memory_equal(s + len - 3, "\n}\n", 3);
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	lockfs_record_clear(&back);
	free(s);
}

static void test_token_only_with_flag(void **state)
{
	struct lockfs_record r = full_record();
	size_t len;
	char *s;

	s = encode(&r, 0, &len);
	assert_null(strstr(s, "token"));
	assert_null(strstr(s, TOKEN));
	free(s);

	s = encode(&r, LOCKFS_RECORD_PRETTY, &len);
	assert_null(strstr(s, "token"));
	free(s);

	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_non_null(strstr(s, "\"token\":\"" TOKEN "\""));
	free(s);

	/* With the flag but no token known: no key. */
	r.token[0] = '\0';
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_null(strstr(s, "token"));
	free(s);
}

static void test_record_without_token_does_not_parse(void **state)
{
	struct lockfs_record r = full_record(), back;
	size_t len;
	char *s = encode(&r, 0, &len);

	assert_int_equal(lockfs_record_parse(s, len, &back), -EINVAL);
	free(s);
}

static void test_invalid_utf8_is_replaced(void **state)
{
	struct lockfs_record r = full_record(), back;
	char *argv_bad[] = { S("ok"), S("x\xffy"), S("\xc3"), NULL };
	size_t len;
	char *s;

	r.holder.comm = S("bad\xff\xfe\xc0\xafz");
	r.holder.cmdline = argv_bad;
	r.operation = S("\xed\xa0\x80"); /* surrogate: three bad bytes */
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_true(lockfs_utf8_valid(s, len));
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_string_equal(back.holder.comm,
			    "bad\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdz");
	assert_string_equal(back.holder.cmdline[0], "ok");
	assert_string_equal(back.holder.cmdline[1], "x\xef\xbf\xbdy");
	assert_string_equal(back.holder.cmdline[2], "\xef\xbf\xbd");
	assert_string_equal(back.operation, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
	/* Valid multibyte text next to the bad bytes survives. */
	lockfs_record_clear(&back);
	free(s);

	r.holder.comm = S("caf\xc3\xa9\xff");
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_string_equal(back.holder.comm, "caf\xc3\xa9\xef\xbf\xbd");
	lockfs_record_clear(&back);
	free(s);
}

/* --- rejections ---------------------------------------------------------- */

/*
 * A valid record as a jansson object, so that tests can break one field at
 * a time and see the parser refuse it.
 */
static json_t *valid_json(void)
{
	struct lockfs_record r = full_record();
	size_t len;
	char *s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	json_t *j = json_loadb(s, len, 0, NULL);

	assert_non_null(j);
	free(s);
	return j;
}

static int parse_json(json_t *j)
{
	struct lockfs_record out;
	char *s = json_dumps(j, JSON_COMPACT);
	int rc;

	assert_non_null(s);
	rc = lockfs_record_parse(s, strlen(s), &out);
	if (rc == 0)
		lockfs_record_clear(&out);
	else
		/* *OUT is left cleared on failure. */
		assert_null(out.resource);
	free(s);
	json_decref(j);
	return rc;
}

static int parse_str(const char *s)
{
	struct lockfs_record out;
	int rc = lockfs_record_parse(s, strlen(s), &out);

	if (rc == 0)
		lockfs_record_clear(&out);
	return rc;
}

static void test_valid_json_control_parses(void **state)
{
	/* Negative control for the tests below: untouched, it parses. */
	assert_int_equal(parse_json(valid_json()), 0);
}

/* Replace TOP[.SUB]KEY with VALUE (consumed); VALUE NULL deletes the key. */
static json_t *with(const char *holder_key, const char *key, json_t *value)
{
	json_t *j = valid_json();
	json_t *o = holder_key ? json_object_get(j, holder_key) : j;

	if (value)
		json_object_set_new(o, key, value);
	else
		json_object_del(o, key);
	return j;
}

static const char *const top_keys[] = {
	"resource", "holder", "acquired_at", "acquired_at_ms", "operation",
	"slug", "lease", "fence", "token",
};
static const char *const holder_keys[] = {
	"pid", "start_time", "uid", "user", "gid", "comm", "cmdline", "host", "boot_id",
};  /* ns_pid and container may be missing: see test_record_from_before_ns_fields */

static void test_missing_fields_are_einval(void **state)
{
	for (size_t i = 0; i < sizeof(top_keys) / sizeof(top_keys[0]); i++)
		if (parse_json(with(NULL, top_keys[i], NULL)) != -EINVAL)
			fail_msg("missing %s accepted", top_keys[i]);
	for (size_t i = 0; i < sizeof(holder_keys) / sizeof(holder_keys[0]); i++)
		if (parse_json(with("holder", holder_keys[i], NULL)) != -EINVAL)
			fail_msg("missing holder.%s accepted", holder_keys[i]);
}

/* Which JSON types each field accepts (besides what the value check says). */
enum { T_STR = 1, T_INT = 2, T_NULL = 4, T_OBJ = 8, T_ARR = 16 };

static const struct {
	const char *holder_key; /* "holder" or NULL for top level */
	const char *key;
	int ok;
} field_types[] = {
	{ NULL, "resource", T_STR },
	{ NULL, "holder", T_NULL | T_OBJ },
	{ NULL, "acquired_at", T_STR },
	{ NULL, "acquired_at_ms", T_INT },
	{ NULL, "operation", T_STR | T_NULL },
	{ NULL, "slug", T_STR | T_NULL },
	{ NULL, "lease", T_NULL | T_OBJ },
	{ NULL, "fence", T_INT | T_NULL }, /* null: the store issues it (etcd) */
	{ NULL, "token", T_STR },
	{ "holder", "pid", T_INT },
	{ "holder", "ns_pid", T_INT | T_NULL },
	{ "holder", "container", T_STR | T_NULL },
	{ "holder", "start_time", T_INT },
	{ "holder", "uid", T_INT },
	{ "holder", "user", T_STR | T_NULL },
	{ "holder", "gid", T_INT },
	{ "holder", "comm", T_STR },
	{ "holder", "cmdline", T_ARR },
	{ "holder", "host", T_STR },
	{ "holder", "boot_id", T_STR },
};

static void test_wrong_types_are_einval(void **state)
{
	for (size_t i = 0; i < sizeof(field_types) / sizeof(field_types[0]); i++) {
		const char *hk = field_types[i].holder_key, *k = field_types[i].key;
		int ok = field_types[i].ok;
		struct { int type; json_t *(*make)(void); } kinds[] = {
			{ T_STR, NULL }, { T_INT, NULL }, { T_NULL, json_null },
			{ T_OBJ, json_object }, { T_ARR, json_array }, { 0, json_true },
			{ 0, NULL },
		};

		for (size_t t = 0; t < sizeof(kinds) / sizeof(kinds[0]); t++) {
			json_t *v;

			if (kinds[t].type & ok)
				continue;
			if (kinds[t].type == T_STR)
				v = json_string("x");
			else if (kinds[t].type == T_INT)
				v = json_integer(5);
			else if (kinds[t].make)
				v = kinds[t].make();
			else
				v = json_real(5.0);
			if (parse_json(with(hk, k, v)) != -EINVAL)
				fail_msg("%s%s%s: wrong type %zu accepted",
					 hk ? hk : "", hk ? "." : "", k, t);
		}
	}
}

static void test_cmdline_elements_must_be_strings(void **state)
{
	json_t *a = json_pack("[s, i]", "ok", 3);

	assert_int_equal(parse_json(with("holder", "cmdline", a)), -EINVAL);
	a = json_pack("[s, n]", "ok");
	assert_int_equal(parse_json(with("holder", "cmdline", a)), -EINVAL);
}

static void test_cmdline_limit(void **state)
{
	json_t *a = json_array();

	for (int i = 0; i < 4096; i++)
		json_array_append_new(a, json_string("a"));
	assert_int_equal(parse_json(with("holder", "cmdline", json_incref(a))), 0);
	json_array_append_new(a, json_string("a"));
	assert_int_equal(parse_json(with("holder", "cmdline", a)), -EINVAL);
}

static void test_value_ranges(void **state)
{
	assert_int_equal(parse_json(with(NULL, "fence", json_integer(0))), -EINVAL);
	assert_int_equal(parse_json(with(NULL, "fence", json_integer(-1))), -EINVAL);
	assert_int_equal(parse_json(with(NULL, "fence", json_integer(1))), 0);
	assert_int_equal(parse_json(with("holder", "pid", json_integer(0))), -EINVAL);
	assert_int_equal(parse_json(with("holder", "pid", json_integer(-5))), -EINVAL);
	assert_int_equal(parse_json(with("holder", "pid", json_integer(1LL << 40))), -EINVAL);
	assert_int_equal(parse_json(with("holder", "start_time", json_integer(-1))), -EINVAL);
	assert_int_equal(parse_json(with("holder", "start_time", json_integer(0))), 0);
	assert_int_equal(parse_json(with("holder", "uid", json_integer(-1))), -EINVAL);
	assert_int_equal(parse_json(with("holder", "gid", json_integer(1LL << 32))), -EINVAL);
	assert_int_equal(parse_json(with("holder", "uid", json_integer(0))), 0);
	assert_int_equal(parse_json(with("holder", "ns_pid", json_integer(0))), -EINVAL);
	assert_int_equal(parse_json(with("holder", "ns_pid", json_integer(1))), 0);
}

/* Records written before ns_pid and container existed (or naming
 * neither) parse, and know neither. */
static void test_record_from_before_ns_fields(void **state)
{
	struct lockfs_record r = full_record(), back;
	json_t *j = valid_json(), *h = json_object_get(j, "holder");
	char *s;

	assert_int_equal(json_object_del(h, "ns_pid"), 0);
	assert_int_equal(json_object_del(h, "container"), 0);
	s = json_dumps(j, JSON_COMPACT);
	assert_int_equal(lockfs_record_parse(s, strlen(s), &back), 0);
	assert_int_equal(back.holder.ns_pid, 0);
	assert_null(back.holder.container);
	lockfs_record_clear(&back);
	free(s);
	json_decref(j);

	r.holder.ns_pid = 0;
	r.holder.container = NULL;
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &(size_t){ 0 });
	assert_non_null(strstr(s, "\"ns_pid\":null,\"container\":null,"));
	free(s);
	round_trip(&r, 0);
}

static void test_operation_limit(void **state)
{
	char op[LOCKFS_OPERATION_MAX + 2];

	memset(op, 'o', sizeof(op) - 1);
	op[LOCKFS_OPERATION_MAX] = '\0';
	assert_int_equal(parse_json(with(NULL, "operation", json_string(op))), 0);
	op[LOCKFS_OPERATION_MAX] = 'o';
	op[LOCKFS_OPERATION_MAX + 1] = '\0';
	assert_int_equal(parse_json(with(NULL, "operation", json_string(op))), -EINVAL);
}

/*
 * Tokens: exactly 32 digits of 0-9a-f.  Upper case is refused (lockfs
 * writes lower case only and tokens are compared as strings).
 */
static void test_bad_tokens(void **state)
{
	static const char *const bad[] = {
		"0123456789abcdef0123456789abcde",   /* 31 */
		"0123456789abcdef0123456789abcdef0", /* 33 */
		"0123456789abcdef0123456789abcdeg",  /* non-hex */
		"0123456789ABCDEF0123456789ABCDEF",  /* upper case */
		"0123456789abcdef 123456789abcdef",
		"",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (parse_json(with(NULL, "token", json_string(bad[i]))) != -EINVAL)
			fail_msg("token \"%s\" accepted", bad[i]);
	assert_int_equal(parse_json(with(NULL, "token",
					 json_string("ffffffffffffffffffffffffffffffff"))), 0);
}

static void test_duplicate_keys_are_einval(void **state)
{
	struct lockfs_record r = full_record();
	size_t len;
	char *s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	char dup[2048];
	struct lockfs_record out;

	assert_true(len + 16 < sizeof(dup));
	/* Insert a second "fence" right after the opening brace. */
	snprintf(dup, sizeof(dup), "{\"fence\":9,%s", s + 1);
	assert_int_equal(lockfs_record_parse(dup, strlen(dup), &out), -EINVAL);
	/* ... and a second "pid" in the holder. */
	snprintf(dup, sizeof(dup), "%s", s);
	memcpy(strstr(dup, "\"uid\""), "\"pid\"", 5);
	assert_int_equal(lockfs_record_parse(dup, strlen(dup), &out), -EINVAL);
	/* Negative control: the untouched copy parses. */
	assert_int_equal(lockfs_record_parse(s, len, &out), 0);
	lockfs_record_clear(&out);
	free(s);
}

static void test_not_an_object_is_einval(void **state)
{
	assert_int_equal(parse_str("[]"), -EINVAL);
	assert_int_equal(parse_str("\"x\""), -EINVAL);
	assert_int_equal(parse_str("7"), -EINVAL);
	assert_int_equal(parse_str("null"), -EINVAL);
	assert_int_equal(parse_str("{}"), -EINVAL);
	assert_int_equal(parse_str(""), -EINVAL);
	assert_int_equal(parse_str("\n"), -EINVAL);
	assert_int_equal(parse_str("\xff\xfe"), -EINVAL);
}

static void test_trailing_garbage_is_einval(void **state)
{
	struct lockfs_record r = full_record(), out;
	size_t len;
	char *s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	char *more = malloc(len + 3);

	assert_non_null(more);
	memcpy(more, s, len);
	memcpy(more + len, "{}", 3);
	assert_int_equal(lockfs_record_parse(more, len + 2, &out), -EINVAL);
	free(more);
	free(s);
}

static void test_embedded_nul_is_einval(void **state)
{
	assert_int_equal(parse_json(with(NULL, "resource", json_stringn("a\0b", 3))), -EINVAL);
}

static void test_oversize_is_efbig(void **state)
{
	struct lockfs_record out;
	size_t n = LOCKFS_RECORD_MAX + 1;
	char *big = malloc(n);

	/* Even a well-formed record is refused by size alone. */
	assert_non_null(big);
	memset(big, ' ', n);
	big[0] = '{';
	big[n - 1] = '}';
	assert_int_equal(lockfs_record_parse(big, n, &out), -EFBIG);
	free(big);
}

static void test_exactly_max_is_not_efbig(void **state)
{
	struct lockfs_record r = full_record(), out;
	size_t len, n = LOCKFS_RECORD_MAX;
	char *s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	char *big = malloc(n);

	/* Pad a valid record with trailing whitespace up to the limit. */
	assert_non_null(big);
	memset(big, ' ', n);
	memcpy(big, s, len);
	assert_int_equal(lockfs_record_parse(big, n, &out), 0);
	lockfs_record_clear(&out);
	free(big);
	free(s);
}

/*
 * Every prefix of a valid record must be refused without crashing.  The
 * only prefix that may parse is the record minus its final newline: JSON
 * does not care about trailing whitespace, and the parser accepts records
 * with or without it.
 */
static void prefixes(int flags)
{
	struct lockfs_record r = full_record(), out;
	size_t len;
	char *s = encode(&r, flags | LOCKFS_RECORD_WITH_TOKEN, &len);

	for (size_t n = 0; n <= len; n++) {
		/* A heap copy of exactly N bytes, so ASan catches over-reads. */
		char *p = malloc(n ? n : 1);
		int rc;

		assert_non_null(p);
		memcpy(p, s, n);
		rc = lockfs_record_parse(p, n, &out);
		if (n >= len - 1) {
			assert_int_equal(rc, 0);
			lockfs_record_clear(&out);
		} else if (rc != -EINVAL) {
			fail_msg("prefix of %zu/%zu bytes gave %d", n, len, rc);
		}
		free(p);
	}
	free(s);
}

static void test_every_prefix_fails(void **state)
{
	prefixes(0);
	prefixes(LOCKFS_RECORD_PRETTY);
}

static void test_format_time(void **state)
{
	char buf[32];

	assert_string_equal(lockfs_format_time(0, buf), "1970-01-01T00:00:00.000Z");
	assert_ptr_equal(lockfs_format_time(0, buf), buf);
	/* date -u -d @1787439952.123 */
	assert_string_equal(lockfs_format_time(1787439952123LL, buf),
			    "2026-08-22T23:05:52.123Z");
	assert_string_equal(lockfs_format_time(999, buf), "1970-01-01T00:00:00.999Z");
	assert_string_equal(lockfs_format_time(951782400000LL, buf),
			    "2000-02-29T00:00:00.000Z");
	/* Before the epoch the fraction still counts forward. */
	assert_string_equal(lockfs_format_time(-1, buf), "1969-12-31T23:59:59.999Z");
	/* The same second twice (the per-thread cache), then the next one. */
	assert_string_equal(lockfs_format_time(1787439952001LL, buf),
			    "2026-08-22T23:05:52.001Z");
	assert_string_equal(lockfs_format_time(1787439952999LL, buf),
			    "2026-08-22T23:05:52.999Z");
	assert_string_equal(lockfs_format_time(1787439953000LL, buf),
			    "2026-08-22T23:05:53.000Z");
	assert_string_equal(lockfs_format_time(1787439952050LL, buf),
			    "2026-08-22T23:05:52.050Z");
}

/* Holder I of a shared record: 0 is the first holder, I >= 1 the shares. */
static void test_holder_accessors_index_the_shares(void **state)
{
	struct lockfs_share shares[2];
	struct lockfs_record r;
	char slug[] = "agent";

	(void)state;
	memset(&r, 0, sizeof(r));
	memset(shares, 0, sizeof(shares));
	r.has_holder = true;
	r.holder.pid = 10;
	r.bound = LOCKFS_BOUND_SLUG;
	r.slug = slug;
	r.fence = 7;
	snprintf(r.fd_owner, sizeof(r.fd_owner), "flock:1");
	shares[0].holder.pid = 11;
	shares[0].bound = LOCKFS_BOUND_FD;
	shares[0].fence = 8;
	snprintf(shares[0].fd_owner, sizeof(shares[0].fd_owner), "flock:2");
	shares[1].holder.pid = 12;
	shares[1].bound = LOCKFS_BOUND_PROCESS;
	shares[1].fence = 9;
	r.shares = shares;
	r.nshares = 2;

	assert_int_equal(lockfs_record_holders(&r), 3);
	assert_int_equal(lockfs_record_holder(&r, 0)->pid, 10);
	assert_int_equal(lockfs_record_holder(&r, 2)->pid, 12);
	assert_int_equal(lockfs_record_bound_at(&r, 1), LOCKFS_BOUND_FD);
	assert_int_equal(lockfs_record_fence_at(&r, 0), 7);
	assert_int_equal(lockfs_record_fence_at(&r, 2), 9);
	assert_string_equal(lockfs_record_fd_owner_at(&r, 1), "flock:2");
	assert_string_equal(lockfs_record_slug_at(&r, 0), "agent");
	assert_null(lockfs_record_slug_at(&r, 1));
	lockfs_record_set_bound_at(&r, 1, LOCKFS_BOUND_PROCESS);
	assert_int_equal(shares[0].bound, LOCKFS_BOUND_PROCESS);
	r.has_holder = false;
	assert_int_equal(lockfs_record_holders(&r), 0);
}

/* A backend's read needs only the fence: peeked, nothing else checked. */
static void test_peek_fence_reads_only_the_fence(void **state)
{
	const char *ok = "{\"resource\": \"x\", \"fence\": 42}";
	const char *none = "{\"resource\": \"x\"}";
	const char *zero = "{\"fence\": 0}";
	uint64_t f = 0;

	(void)state;
	assert_int_equal(lockfs_record_peek_fence(ok, strlen(ok), &f), 0);
	assert_int_equal(f, 42);
	assert_int_equal(lockfs_record_peek_fence(none, strlen(none), &f), -EINVAL);
	assert_int_equal(lockfs_record_peek_fence(zero, strlen(zero), &f), -EINVAL);
	assert_int_equal(lockfs_record_peek_fence("[1]", 3, &f), -EINVAL);
	assert_int_equal(lockfs_record_peek_fence("{", 1, &f), -EINVAL);
	assert_int_equal(lockfs_record_peek_fence(ok, LOCKFS_RECORD_MAX + 1, &f), -EFBIG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip_all_fields),
		cmocka_unit_test(test_round_trip_null_operation_slug_user),
		cmocka_unit_test(test_round_trip_slug_bound_with_lease),
		cmocka_unit_test(test_slug_bound_without_slug_is_einval),
		cmocka_unit_test(test_record_without_bound_is_process_bound),
		cmocka_unit_test(test_round_trip_no_holder),
		cmocka_unit_test(test_compact_layout_and_key_order),
		cmocka_unit_test(test_pretty_is_indented_and_parses),
		cmocka_unit_test(test_compact_equals_janssons_output),
		cmocka_unit_test(test_shared_fd_record_round_trip),
		cmocka_unit_test(test_descendants_round_trip),
		cmocka_unit_test(test_bad_descendants_are_einval),
		cmocka_unit_test(test_fd_owner_matches_bound),
		cmocka_unit_test(test_token_only_with_flag),
		cmocka_unit_test(test_view_shows_cmdline_and_token_to_holder_uid_and_root),
		cmocka_unit_test(test_view_judges_each_shared_holder_by_its_own_uid),
		cmocka_unit_test(test_the_stored_record_keeps_every_cmdline),
		cmocka_unit_test(test_record_without_token_does_not_parse),
		cmocka_unit_test(test_invalid_utf8_is_replaced),
		cmocka_unit_test(test_valid_json_control_parses),
		cmocka_unit_test(test_missing_fields_are_einval),
		cmocka_unit_test(test_wrong_types_are_einval),
		cmocka_unit_test(test_cmdline_elements_must_be_strings),
		cmocka_unit_test(test_cmdline_limit),
		cmocka_unit_test(test_value_ranges),
		cmocka_unit_test(test_record_from_before_ns_fields),
		cmocka_unit_test(test_operation_limit),
		cmocka_unit_test(test_bad_tokens),
		cmocka_unit_test(test_duplicate_keys_are_einval),
		cmocka_unit_test(test_not_an_object_is_einval),
		cmocka_unit_test(test_trailing_garbage_is_einval),
		cmocka_unit_test(test_embedded_nul_is_einval),
		cmocka_unit_test(test_oversize_is_efbig),
		cmocka_unit_test(test_exactly_max_is_not_efbig),
		cmocka_unit_test(test_every_prefix_fails),
		cmocka_unit_test(test_format_time),
		cmocka_unit_test(test_holder_accessors_index_the_shares),
		cmocka_unit_test(test_peek_fence_reads_only_the_fence),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
