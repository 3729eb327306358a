/* Unit tests for the lock-name rule (core/base/name.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "lockfs/name.h"
#include "lockfs/utf8.h"

static void test_ascii_names_are_valid(void **state)
{
	assert_int_equal(lockfs_name_check("a"), 0);
	assert_int_equal(lockfs_name_check("deploy"), 0);
	assert_int_equal(lockfs_name_check("db-migrate_2024.v2"), 0);
	assert_int_equal(lockfs_name_check("with space"), 0);
	assert_int_equal(lockfs_name_check("a.b."), 0);
	assert_int_equal(lockfs_name_check("~!@#$%^&*()+=[]{}|;:'\",<>?`"), 0);
	assert_int_equal(lockfs_name_check("back\\slash"), 0);
}

static void test_multibyte_names_are_valid(void **state)
{
	assert_int_equal(lockfs_name_check("caf\xc3\xa9"), 0);            /* café */
	assert_int_equal(lockfs_name_check("\xe6\x97\xa5\xe6\x9c\xac"), 0); /* 日本 */
	assert_int_equal(lockfs_name_check("\xf0\x9f\x94\x92"), 0);        /* 🔒 */
	assert_int_equal(lockfs_name_check("a\xc2\xa0"), 0);  /* U+00A0, first after C1 */
	assert_int_equal(lockfs_name_check("\xed\x9f\xbf"), 0); /* U+D7FF */
	assert_int_equal(lockfs_name_check("\xee\x80\x80"), 0); /* U+E000 */
	assert_int_equal(lockfs_name_check("\xef\xbf\xbd"), 0); /* U+FFFD */
	assert_int_equal(lockfs_name_check("\xf4\x8f\xbf\xbf"), 0); /* U+10FFFF */
}

static void test_250_bytes_is_valid(void **state)
{
	char name[LOCKFS_NAME_MAX + 1];

	memset(name, 'x', LOCKFS_NAME_MAX);
	name[LOCKFS_NAME_MAX] = '\0';
	assert_int_equal(lockfs_name_check(name), 0);
}

static void test_250_bytes_of_multibyte_is_valid(void **state)
{
	/* 125 two-byte characters = 250 bytes. */
	char name[LOCKFS_NAME_MAX + 1];

	for (int i = 0; i < LOCKFS_NAME_MAX; i += 2)
		memcpy(name + i, "\xc3\xa9", 2);
	name[LOCKFS_NAME_MAX] = '\0';
	assert_int_equal(lockfs_name_check(name), 0);
}

static void test_251_bytes_is_enametoolong(void **state)
{
	char name[LOCKFS_NAME_MAX + 2];

	memset(name, 'x', LOCKFS_NAME_MAX + 1);
	name[LOCKFS_NAME_MAX + 1] = '\0';
	assert_int_equal(lockfs_name_check(name), -ENAMETOOLONG);
}

static void test_length_is_checked_before_content(void **state)
{
	/* Invalid in every way, but too long wins. */
	char name[400];

	memset(name, '/', sizeof(name) - 1);
	name[0] = '.';
	name[1] = '\x01';
	name[sizeof(name) - 1] = '\0';
	assert_int_equal(lockfs_name_check(name), -ENAMETOOLONG);
}

static void test_empty_name_is_einval(void **state)
{
	assert_int_equal(lockfs_name_check(""), -EINVAL);
	assert_int_equal(lockfs_name_check(NULL), -EINVAL);
}

static void test_slash_is_einval(void **state)
{
	assert_int_equal(lockfs_name_check("/"), -EINVAL);
	assert_int_equal(lockfs_name_check("a/b"), -EINVAL);
	assert_int_equal(lockfs_name_check("ab/"), -EINVAL);
}

static void test_leading_dot_is_einval(void **state)
{
	assert_int_equal(lockfs_name_check("."), -EINVAL);
	assert_int_equal(lockfs_name_check(".."), -EINVAL);
	assert_int_equal(lockfs_name_check(".log"), -EINVAL);
	assert_int_equal(lockfs_name_check(".hidden"), -EINVAL);
	/* Negative control: a dot elsewhere is fine. */
	assert_int_equal(lockfs_name_check("a."), 0);
}

static void test_c0_controls_are_einval(void **state)
{
	char name[4] = { 'a', 0, 'b', 0 };

	for (int c = 1; c < 0x20; c++) {
		name[1] = (char)c;
		assert_int_equal(lockfs_name_check(name), -EINVAL);
	}
	name[1] = ' ';
	assert_int_equal(lockfs_name_check(name), 0);
}

static void test_del_is_einval(void **state)
{
	assert_int_equal(lockfs_name_check("a\x7f"), -EINVAL);
	assert_int_equal(lockfs_name_check("a~"), 0); /* 0x7e is fine */
}

static void test_c1_controls_are_einval(void **state)
{
	char name[4] = { '\xc2', 0, 0, 0 };

	for (int c = 0x80; c <= 0x9f; c++) {
		name[1] = (char)c;
		assert_int_equal(lockfs_name_check(name), -EINVAL);
	}
}

/* Byte sequences that must be refused, and a few that must not. */
static const struct {
	const char *bytes;
	int expect;
	const char *what;
} tricky[] = {
	{ "\x80", -EINVAL, "lone continuation byte" },
	{ "a\xbf", -EINVAL, "continuation byte after ASCII" },
	{ "\xc0\xaf", -EINVAL, "overlong '/' (2 bytes)" },
	{ "\xe0\x80\xaf", -EINVAL, "overlong '/' (3 bytes)" },
	{ "\xf0\x80\x80\xaf", -EINVAL, "overlong '/' (4 bytes)" },
	{ "\xc0\x80", -EINVAL, "overlong NUL" },
	{ "\xc1\xbf", -EINVAL, "overlong U+007F" },
	{ "\xe0\x9f\xbf", -EINVAL, "overlong U+07FF" },
	{ "\xf0\x8f\xbf\xbf", -EINVAL, "overlong U+FFFF" },
	{ "\xed\xa0\x80", -EINVAL, "surrogate U+D800" },
	{ "\xed\xbf\xbf", -EINVAL, "surrogate U+DFFF" },
	{ "\xed\xa0\xbd\xed\xb2\xa9", -EINVAL, "CESU-8 surrogate pair" },
	{ "\xf4\x90\x80\x80", -EINVAL, "U+110000" },
	{ "\xf5\x80\x80\x80", -EINVAL, "lead byte 0xF5" },
	{ "\xf8\x88\x80\x80\x80", -EINVAL, "5-byte form" },
	{ "\xfc\x84\x80\x80\x80\x80", -EINVAL, "6-byte form" },
	{ "\xfe", -EINVAL, "byte 0xFE" },
	{ "\xff", -EINVAL, "byte 0xFF" },
	{ "\xc3", -EINVAL, "truncated 2-byte at end" },
	{ "\xe6\x97", -EINVAL, "truncated 3-byte at end" },
	{ "\xf0\x9f\x94", -EINVAL, "truncated 4-byte at end" },
	{ "\xc3" "a", -EINVAL, "2-byte cut by ASCII" },
	{ "\xe6\x97" "a", -EINVAL, "3-byte cut by ASCII" },
	{ "\xe6" "\xc3\xa9", -EINVAL, "3-byte cut by a new lead" },
	{ "\xf0\x9f\x94" "x", -EINVAL, "4-byte cut by ASCII" },
	{ "\xc2\x85", -EINVAL, "NEL (C1)" },
	{ "\xc2\x9f", -EINVAL, "last C1" },
	{ "\xef\xbf\xbc", 0, "U+FFFC object replacement (So)" },
	{ "\xe0\xa0\x80", 0, "U+0800, shortest 3-byte" },
	{ "\xf0\x90\x80\x80", 0, "U+10000, shortest 4-byte" },
	{ "\xdf\xbf", 0, "U+07FF, longest 2-byte" },
};

static void test_tricky_sequences(void **state)
{
	for (size_t i = 0; i < sizeof(tricky) / sizeof(tricky[0]); i++) {
		int rc = lockfs_name_check(tricky[i].bytes);

		if (rc != tricky[i].expect)
			fail_msg("%s: got %d, want %d", tricky[i].what, rc, tricky[i].expect);
	}
}

static void test_utf8_valid_allows_controls(void **state)
{
	assert_int_equal(lockfs_utf8_valid("a\nb\x7f\xc2\x85", 6), 1);
	/* Embedded NUL is a valid code point when a length is given. */
	assert_int_equal(lockfs_utf8_valid("a\0b", 3), 1);
	assert_int_equal(lockfs_utf8_valid("", 0), 1);
	assert_int_equal(lockfs_utf8_valid("/", 1), 1);
}

static void test_utf8_valid_rejects_bad_sequences(void **state)
{
	for (size_t i = 0; i < sizeof(tricky) / sizeof(tricky[0]); i++) {
		const char *b = tricky[i].bytes;
		/* The C1 cases are valid UTF-8; only names refuse them. */
		int want = tricky[i].expect == 0 || (b[0] == '\xc2') ? 1 : 0;

		if (lockfs_utf8_valid(b, strlen(b)) != want)
			fail_msg("%s: want %d", tricky[i].what, want);
	}
}

static void test_utf8_valid_respects_length(void **state)
{
	/* A sequence cut by LEN is truncated even if the bytes go on. */
	assert_int_equal(lockfs_utf8_valid("\xc3\xa9", 1), 0);
	assert_int_equal(lockfs_utf8_valid("\xf0\x9f\x94\x92", 3), 0);
	assert_int_equal(lockfs_utf8_valid("\xf0\x9f\x94\x92", 4), 1);
}

/* ---- issue 8 §6: names that look the same ------------------------------ */

static void test_nfc_names_are_valid(void **state)
{
	assert_int_equal(lockfs_name_check("caf\xc3\xa9"), 0);          /* café, NFC */
	assert_int_equal(lockfs_name_check("\xc3\x85ngstr\xc3\xb6m"), 0); /* Ångström */
	assert_int_equal(lockfs_name_check("\xea\xb0\x80"), 0);         /* 가, precomposed */
	/* an unassigned code point is its own NFC (U+E0080) */
	assert_int_equal(lockfs_name_check("\xf3\xa0\x82\x80" "x"), 0);
}

static void test_names_not_in_nfc_are_einval(void **state)
{
	static const char *const nfd[] = {
		"cafe\xcc\x81",               /* café, NFD: e + U+0301 */
		"\xe2\x84\xab",                /* U+212B ANGSTROM SIGN -> U+00C5 */
		"\xef\xa4\x80",                /* U+F900, a CJK compatibility ideograph */
		"A\xcc\x8a\xcc\xa3",            /* marks out of canonical order */
		"\xe1\x84\x80\xe1\x85\xa1",     /* 가 as conjoining jamo */
	};

	for (size_t i = 0; i < sizeof(nfd) / sizeof(nfd[0]); i++)
		if (lockfs_name_check(nfd[i]) != -EINVAL)
			fail_msg("not NFC but accepted: case %zu", i);
}

static void test_format_characters_are_einval(void **state)
{
	static const char *const cf[] = {
		"a\xe2\x80\x8b" "b",   /* U+200B ZERO WIDTH SPACE */
		"\xe2\x80\xae" "txt",  /* U+202E RIGHT-TO-LEFT OVERRIDE */
		"\xef\xbb\xbf" "x",    /* U+FEFF BOM / ZWNBSP */
		"x\xe2\x81\xa0",       /* U+2060 WORD JOINER */
		"a\xc2\xad" "b",        /* U+00AD SOFT HYPHEN */
		"a\xe2\x80\x8d" "b",   /* U+200D ZERO WIDTH JOINER */
		"\xe2\x81\xa6" "x",    /* U+2066 LEFT-TO-RIGHT ISOLATE */
		"\xd8\x9c" "x",         /* U+061C ARABIC LETTER MARK */
		"\xf3\xa0\x81\x81" "x", /* U+E0041 TAG LATIN CAPITAL LETTER A */
	};

	for (size_t i = 0; i < sizeof(cf) / sizeof(cf[0]); i++)
		if (lockfs_name_check(cf[i]) != -EINVAL)
			fail_msg("format character accepted: case %zu", i);
}

/* issue 19 §3: a name must never start a line where it is printed raw
 * (Python's splitlines(), a terminal), so the line and paragraph
 * separators (Zl, Zp) are refused like the controls, wherever they are. */
static void test_line_and_paragraph_separators_are_einval(void **state)
{
	assert_int_equal(lockfs_name_check("a\xe2\x80\xa8" "b"), -EINVAL); /* U+2028 */
	assert_int_equal(lockfs_name_check("a\xe2\x80\xa9" "b"), -EINVAL); /* U+2029 */
	assert_int_equal(lockfs_name_check("evil\xe2\x80\xa8"), -EINVAL);
	assert_int_equal(lockfs_name_check("\xe2\x80\xa9x"), -EINVAL);
	/* the forged line: NBSP for spaces after a U+2028 */
	assert_int_equal(lockfs_name_check("evil\xe2\x80\xa8" "2026\xc2\xa0root\xc2\xa0x\xc2\xa0released"),
			 -EINVAL);
	/* Negative controls: NBSP alone among letters, and the neighbours of
	 * the separators, stay names. */
	assert_int_equal(lockfs_name_check("2026\xc2\xa0root\xc2\xa0x\xc2\xa0released"), 0);
	assert_int_equal(lockfs_name_check("a\xe2\x80\xa7" "b"), 0); /* U+2027 HYPHENATION POINT */
	assert_int_equal(lockfs_name_check("a\xe2\x80\xaf" "b"), 0); /* U+202F NNBSP */
}

static void test_all_whitespace_names_are_einval(void **state)
{
	assert_int_equal(lockfs_name_check(" "), -EINVAL);
	assert_int_equal(lockfs_name_check("    "), -EINVAL);
	assert_int_equal(lockfs_name_check("\xc2\xa0"), -EINVAL);           /* U+00A0 */
	assert_int_equal(lockfs_name_check("\xe3\x80\x80"), -EINVAL);       /* U+3000 */
	assert_int_equal(lockfs_name_check(" \xe2\x80\x83 "), -EINVAL);     /* U+2003 */
	assert_int_equal(lockfs_name_check("\xe2\x80\xa8"), -EINVAL);       /* U+2028 */
}

static void test_some_whitespace_is_fine(void **state)
{
	assert_int_equal(lockfs_name_check(" a"), 0);
	assert_int_equal(lockfs_name_check("a "), 0);
	assert_int_equal(lockfs_name_check("\xc2\xa0" "a"), 0);
	/* blank-looking, but letters to Unicode (Lo), not White_Space */
	assert_int_equal(lockfs_name_check("\xe3\x85\xa4"), 0);  /* U+3164 HANGUL FILLER */
	/* a variation selector is a mark (Mn), not a format character */
	assert_int_equal(lockfs_name_check("\xe2\x9d\xa4\xef\xb8\x8f"), 0); /* ❤️ */
}

static void test_utf8_decode_gives_length_and_code_point(void **state)
{
	uint32_t cp = 0;

	assert_int_equal(lockfs_utf8_decode("a", 1, &cp), 1);
	assert_int_equal(cp, 'a');
	assert_int_equal(lockfs_utf8_decode("\xc3\xa9", 2, &cp), 2);
	assert_int_equal(cp, 0xE9);
	assert_int_equal(lockfs_utf8_decode("\xe6\x97\xa5", 3, &cp), 3);
	assert_int_equal(cp, 0x65E5);
	assert_int_equal(lockfs_utf8_decode("\xf4\x8f\xbf\xbf", 4, NULL), 4);
	assert_int_equal(lockfs_utf8_decode("\xc0\xaf", 2, &cp), 0); /* overlong '/' */
	assert_int_equal(lockfs_utf8_decode("\xed\xa0\x80", 3, &cp), 0); /* surrogate */
	assert_int_equal(lockfs_utf8_decode("\xe6\x97", 2, &cp), 0); /* truncated */
}

/* The set the log escapes and lockctl shows as '?': with C0, every code
 * point at which Python's str.splitlines() splits, and the bidi controls. */
static void test_utf8_unsafe_in_line_is_controls_separators_and_bidi(void **state)
{
	static const uint32_t unsafe[] = {
		0x00, 0x0a, 0x0b, 0x0c, 0x0d, 0x1c, 0x1d, 0x1e, 0x1f, 0x7f,
		0x80, 0x85, 0x9b, 0x9f, 0x2028, 0x2029, 0x061c, 0x200e, 0x200f,
		0x202a, 0x202b, 0x202c, 0x202d, 0x202e, 0x2066, 0x2067, 0x2068, 0x2069,
	};
	static const uint32_t safe[] = {
		0x20, 'a', 0x7e, 0xa0, 0xe9, 0x061b, 0x061d, 0x200b, 0x200d, 0x2027,
		0x202f, 0x2065, 0x206a, 0xfeff, 0x1f512, 0x10ffff,
	};

	for (size_t i = 0; i < sizeof(unsafe) / sizeof(unsafe[0]); i++)
		if (!lockfs_utf8_unsafe_in_line(unsafe[i]))
			fail_msg("U+%04X passes", (unsigned)unsafe[i]);
	for (size_t i = 0; i < sizeof(safe) / sizeof(safe[0]); i++)
		if (lockfs_utf8_unsafe_in_line(safe[i]))
			fail_msg("U+%04X is refused", (unsigned)safe[i]);
}

/* A write(2) may end inside a character that the next write completes. */
static void test_utf8_cut_short_is_only_an_unfinished_last_character(void **state)
{
	assert_true(lockfs_utf8_cut_short("caf\xc3", 4));
	assert_true(lockfs_utf8_cut_short("\xe6\x97", 2));
	assert_true(lockfs_utf8_cut_short("ab\xf0\x9f\x94", 5));
	assert_false(lockfs_utf8_cut_short("caf\xc3\xa9", 5)); /* complete */
	assert_false(lockfs_utf8_cut_short("abc", 3));
	assert_false(lockfs_utf8_cut_short("", 0));
	assert_false(lockfs_utf8_cut_short("\xff\xc3", 2));       /* bad before the cut */
	assert_false(lockfs_utf8_cut_short("a\x80", 2));           /* a stray continuation */
	assert_false(lockfs_utf8_cut_short("a\xc3\x28", 3));      /* not a continuation */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ascii_names_are_valid),
		cmocka_unit_test(test_multibyte_names_are_valid),
		cmocka_unit_test(test_250_bytes_is_valid),
		cmocka_unit_test(test_250_bytes_of_multibyte_is_valid),
		cmocka_unit_test(test_251_bytes_is_enametoolong),
		cmocka_unit_test(test_length_is_checked_before_content),
		cmocka_unit_test(test_empty_name_is_einval),
		cmocka_unit_test(test_slash_is_einval),
		cmocka_unit_test(test_leading_dot_is_einval),
		cmocka_unit_test(test_c0_controls_are_einval),
		cmocka_unit_test(test_del_is_einval),
		cmocka_unit_test(test_c1_controls_are_einval),
		cmocka_unit_test(test_tricky_sequences),
		cmocka_unit_test(test_utf8_valid_allows_controls),
		cmocka_unit_test(test_utf8_valid_rejects_bad_sequences),
		cmocka_unit_test(test_utf8_valid_respects_length),
		cmocka_unit_test(test_utf8_decode_gives_length_and_code_point),
		cmocka_unit_test(test_utf8_unsafe_in_line_is_controls_separators_and_bidi),
		cmocka_unit_test(test_utf8_cut_short_is_only_an_unfinished_last_character),
		cmocka_unit_test(test_nfc_names_are_valid),
		cmocka_unit_test(test_names_not_in_nfc_are_einval),
		cmocka_unit_test(test_format_characters_are_einval),
		cmocka_unit_test(test_line_and_paragraph_separators_are_einval),
		cmocka_unit_test(test_all_whitespace_names_are_einval),
		cmocka_unit_test(test_some_whitespace_is_fine),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
