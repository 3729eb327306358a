/* Unit tests for the lock record (core/base/record.c): the model, its
 * encoder and the per-reader views; the parser is test_record_parse.c. */
#include <stdbool.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"
#include "../../core/base/clock.h"

#include "record_test_util.h"

static char *argv_empty[] = { NULL };

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

/* The kernel's numbers an fd lock needs after a daemon resumed the same
 * FUSE connection -- the open file an fcntl grant came through, the
 * request that was granted -- round-trip through the store's encodings,
 * and stay out of what people read. */
static void test_via_file_and_ticket_round_trip_and_stay_inside(void **state)
{
	struct lockfs_record r = full_record(), back;
	struct lockfs_share sh[1];
	size_t len;
	char *s, *pretty;

	(void)state;
	r.bound = LOCKFS_BOUND_FD;
	r.slug = NULL;
	strcpy(r.fd_owner, "posix:00000000000000aa");
	r.via_file = 0x7f00deadbeef;
	r.ticket = 4242;
	r.handed_by = 4141;
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len); /* exclusive: the compact encoder */
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_int_equal(back.via_file, 0x7f00deadbeef);
	assert_int_equal(back.ticket, 4242);
	assert_int_equal(back.handed_by, 4141);
	lockfs_record_clear(&back);
	free(s);
	memset(sh, 0, sizeof(sh));
	sh[0].holder = r.holder;
	sh[0].bound = LOCKFS_BOUND_FD;
	strcpy(sh[0].fd_owner, "posix:00000000000000bb");
	sh[0].via_file = 99;
	sh[0].fence = 8;
	r.mode = LOCKFS_SHARED;
	r.shares = sh;
	r.nshares = 1;
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len); /* shared: jansson */
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_int_equal(back.via_file, 0x7f00deadbeef);
	assert_int_equal(back.ticket, 4242);
	assert_int_equal(back.shares[0].via_file, 99);
	lockfs_record_clear(&back);
	free(s);
	pretty = encode(&r, LOCKFS_RECORD_PRETTY, &len);
	assert_null(strstr(pretty, "via_file"));
	assert_null(strstr(pretty, "ticket"));
	assert_null(strstr(pretty, "handed_by"));
	free(pretty);
	/* A record without them (written before they were kept) has none. */
	r.via_file = r.ticket = r.handed_by = 0;
	r.nshares = 0;
	r.shares = NULL;
	r.mode = LOCKFS_EXCLUSIVE;
	s = encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	assert_null(strstr(s, "via_file"));
	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_int_equal(back.via_file, 0);
	assert_int_equal(back.ticket, 0);
	lockfs_record_clear(&back);
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

/* What READER sees of R, as a jansson object (lockfs_record_view_for). */
static json_t *view_for(const struct lockfs_record *r, const struct lockfs_reader *reader)
{
	size_t len;
	char *s = lockfs_record_view_for(r, reader, &len);
	json_t *j;

	assert_non_null(s);
	j = json_loadb(s, len, 0, NULL);
	assert_non_null(j);
	free(s);
	return j;
}

/* issue 22 §2: root in a container is root over its own container's
 * holders only: their command lines and token, no other's -- not even
 * uid 0's, which is its own uid too without a user namespace. */
static void test_view_of_root_in_a_container_is_its_own_containers(void **state)
{
	struct lockfs_record r = full_record(); /* holder in CONTAINER, uid 1000 */
	struct lockfs_reader mine = { .uid = 0, .container = CONTAINER, .host = "build-1",
				      .boot_id = "6f1c1c9e-0b1e-4e43-9d55-3b7c3e5b2f10" };
	struct lockfs_reader other = mine, elsewhere = mine;
	json_t *j;

	other.container = "pidns:4026532198";
	elsewhere.host = "build-2"; /* the same id on another host is not this one */
	j = view_for(&r, &mine);
	assert_true(shows_argv(json_object_get(j, "holder")) && json_object_get(j, "token"));
	json_decref(j);
	for (int i = 0; i < 2; i++) {
		j = view_for(&r, i ? &elsewhere : &other);
		assert_false(shows_argv(json_object_get(j, "holder")));
		assert_null(json_object_get(j, "token"));
		json_decref(j);
	}
	/* the host's root holder, read by root in a container */
	r.holder.container = NULL; /* static data: nothing to free */
	r.holder.uid = 0;
	j = view_for(&r, &mine);
	assert_false(shows_argv(json_object_get(j, "holder")));
	assert_null(json_object_get(j, "token"));
	json_decref(j);
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
		cmocka_unit_test(test_via_file_and_ticket_round_trip_and_stay_inside),
		cmocka_unit_test(test_token_only_with_flag),
		cmocka_unit_test(test_view_shows_cmdline_and_token_to_holder_uid_and_root),
		cmocka_unit_test(test_view_judges_each_shared_holder_by_its_own_uid),
		cmocka_unit_test(test_view_of_root_in_a_container_is_its_own_containers),
		cmocka_unit_test(test_the_stored_record_keeps_every_cmdline),
		cmocka_unit_test(test_record_without_token_does_not_parse),
		cmocka_unit_test(test_invalid_utf8_is_replaced),
		cmocka_unit_test(test_format_time),
		cmocka_unit_test(test_holder_accessors_index_the_shares),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
