/*
 * What the record tests (test_record.c: the model, its encoder and views;
 * test_record_parse.c: the parser and what it rejects) share: a record
 * with every field set, the encoder checked on the way, and a round trip
 * through the parser compared field by field.
 */
#ifndef LOCKFS_TESTS_RECORD_TEST_UTIL_H
#define LOCKFS_TESTS_RECORD_TEST_UTIL_H

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

#include "lockfs/record.h"


#define TOKEN "0123456789abcdef0123456789abcdef"
#define CONTAINER "c0ffeefedcba9876543210fedcba9876543210fedcba9876543210fedcba9876"

/* The record's fields are char * (it owns them once parsed); tests point
 * them at literals. */
#define S(lit) ((char *)(lit))

static char *argv_full[] = { S("flock"), S("-n"), S("/tmp/x"), S("make deploy"), NULL };

/* A record with every field set; points at static data (do not clear). */
static inline struct lockfs_record full_record(void)
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

static inline char *encode(const struct lockfs_record *r, int flags, size_t *len)
{
	char *s = lockfs_record_encode(r, flags, len);

	assert_non_null(s);
	assert_int_equal(strlen(s), *len);
	assert_true(*len > 0 && s[*len - 1] == '\n');
	return s;
}

static inline void assert_str_or_null_equal(const char *a, const char *b)
{
	if (!a || !b)
		assert_ptr_equal(a, b);
	else
		assert_string_equal(a, b);
}

static inline void assert_records_equal(const struct lockfs_record *a,
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

static inline void round_trip(const struct lockfs_record *r, int flags)
{
	struct lockfs_record back;
	size_t len;
	char *s = encode(r, flags | LOCKFS_RECORD_WITH_TOKEN, &len);

	assert_int_equal(lockfs_record_parse(s, len, &back), 0);
	assert_records_equal(r, &back);
	lockfs_record_clear(&back);
	free(s);
}

#endif
