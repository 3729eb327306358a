/* Unit tests for the lock record (core/base/record.c): the parser and
 * every input it must refuse; the model and encoder are test_record.c. */
#include "record_test_util.h"

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
		cmocka_unit_test(test_peek_fence_reads_only_the_fence),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
