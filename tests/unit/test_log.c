/* Unit tests for the audit log (core/base/log.c). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../core/base/clock.h"
#include "lockfs/log.h"
#include "lockfs/utf8.h"

#define T0 1787439952123LL
#define T0_TEXT "2026-08-22T23:05:52.123Z"

/* Split LINE (modified) on single spaces into at most MAX fields.
 * Returns the number of fields. */
static int split(char *line, char **fields, int max)
{
	int n = 0;

	/* Not strtok_r: it would merge runs of spaces and hide a bad line. */
	fields[n++] = line;
	for (char *p = line; *p; p++) {
		if (*p == ' ') {
			*p = '\0';
			if (n < max)
				fields[n] = p + 1;
			n++;
		}
	}
	return n;
}

static void test_plain_line(void **state)
{
	const char *kv[] = { "pid", "4242", "fence", "7", NULL };
	char buf[LOCKFS_LOG_LINE_MAX], *f[16];
	int n = lockfs_log_format(buf, sizeof(buf), T0, "alice:4242", "deploy", kv, "acquire");

	assert_int_equal(n, (int)strlen(buf));
	assert_string_equal(buf, T0_TEXT " alice:4242 deploy pid=4242 fence=7 acquire\n");
	buf[n - 1] = '\0'; /* drop the newline */
	assert_int_equal(split(buf, f, 16), 6);
	assert_string_equal(f[0], T0_TEXT);
	assert_string_equal(f[1], "alice:4242");
	assert_string_equal(f[2], "deploy");
	assert_string_equal(f[3], "pid=4242");
	assert_string_equal(f[4], "fence=7");
	assert_string_equal(f[5], "acquire");
}

static void test_no_details(void **state)
{
	char buf[256];

	assert_true(lockfs_log_format(buf, sizeof(buf), 0, "w", "n", NULL, "release") > 0);
	assert_string_equal(buf, "1970-01-01T00:00:00.000Z w n release\n");
	assert_true(lockfs_log_format(buf, sizeof(buf), 0, "w", "n",
				      (const char *const[]){ NULL }, "release") > 0);
	assert_string_equal(buf, "1970-01-01T00:00:00.000Z w n release\n");
}

static void assert_escapes(const char *src, const char *want)
{
	char buf[256];
	int n = lockfs_log_escape(buf, sizeof(buf), src);

	assert_int_equal(n, (int)strlen(want));
	assert_string_equal(buf, want);
}

static void test_escape_whitespace_and_controls(void **state)
{
	assert_escapes("a b", "a\\x20b");
	assert_escapes("a\tb", "a\\x09b");
	assert_escapes("a\nb", "a\\x0ab");
	assert_escapes("\r", "\\x0d");
	assert_escapes("\x01\x1f", "\\x01\\x1f");
	assert_escapes("\x7f", "\\x7f");
	/* Negative control: printable ASCII passes. */
	assert_escapes("a=b:c/d.e!~", "a=b:c/d.e!~");
}

static void test_escape_backslash(void **state)
{
	assert_escapes("\\", "\\\\");
	assert_escapes("a\\x20", "a\\\\x20"); /* not confusable with an escape */
}

static void test_escape_dash_and_empty(void **state)
{
	assert_escapes("", "-");
	assert_escapes(NULL, "-");
	assert_escapes("-", "\\x2d");
	/* Only the whole field "-" is special. */
	assert_escapes("--", "--");
	assert_escapes("-x", "-x");
	assert_escapes("a-", "a-");
}

static void test_escape_utf8_passthrough(void **state)
{
	assert_escapes("caf\xc3\xa9", "caf\xc3\xa9");
	assert_escapes("\xe6\x97\xa5\xe6\x9c\xac", "\xe6\x97\xa5\xe6\x9c\xac");
	assert_escapes("\xf0\x9f\x94\x92", "\xf0\x9f\x94\x92");     /* U+1F512 */
	/* NBSP is text: it passes (so a name with it reads as it is). */
	assert_escapes("a\xc2\xa0" "b", "a\xc2\xa0" "b");
	/* Format characters that do not break or reorder a line pass. */
	assert_escapes("a\xe2\x80\x8b" "b", "a\xe2\x80\x8b" "b");   /* U+200B */
	assert_escapes("\xef\xbb\xbf", "\xef\xbb\xbf");               /* U+FEFF */
	/* The code points just past the escaped ranges. */
	assert_escapes("\xd8\x9b\xd8\x9d", "\xd8\x9b\xd8\x9d");     /* U+061B, U+061D */
	assert_escapes("\xe2\x80\xa7\xe2\x80\xaf", "\xe2\x80\xa7\xe2\x80\xaf"); /* U+2027, U+202F */
	assert_escapes("\xe2\x81\xa5\xe2\x81\xaa", "\xe2\x81\xa5\xe2\x81\xaa"); /* U+2065, U+206A */
}

/* issue 19 §3: a character that breaks a line, or turns it around, is
 * escaped byte by byte like a C0 control, wherever it is in the field. */
static void test_escape_c1_separators_and_bidi(void **state)
{
	/* The attack's comm: NEL and LINE SEPARATOR around a fake line. */
	assert_escapes("x\xc2\x85" "FAKE\xe2\x80\xa8Z", "x\\xc2\\x85FAKE\\xe2\\x80\\xa8Z");
	assert_escapes("\xc2\x80", "\\xc2\\x80");                     /* first C1 */
	assert_escapes("\xc2\x9b" "31m", "\\xc2\\x9b31m");              /* CSI */
	assert_escapes("\xc2\x9f", "\\xc2\\x9f");                     /* last C1 */
	assert_escapes("\xe2\x80\xa9", "\\xe2\\x80\\xa9");           /* U+2029 */
	assert_escapes("\xe2\x80\xae" "txt", "\\xe2\\x80\\xaetxt");   /* U+202E RLO */
	assert_escapes("\xe2\x80\xaa", "\\xe2\\x80\\xaa");           /* U+202A LRE */
	assert_escapes("\xe2\x80\x8e\xe2\x80\x8f",
		       "\\xe2\\x80\\x8e\\xe2\\x80\\x8f");             /* LRM, RLM */
	assert_escapes("\xe2\x81\xa6\xe2\x81\xa9",
		       "\\xe2\\x81\\xa6\\xe2\\x81\\xa9");             /* U+2066, U+2069 */
	assert_escapes("\xd8\x9c", "\\xd8\\x9c");                     /* U+061C ALM */
}

/* Bytes that are not UTF-8 (a comm the kernel cut inside a character, or
 * any bytes a process calls itself) are escaped one by one: a reader that
 * decodes the line never meets an invalid sequence, nor a stray 0x85 that
 * a Latin-1 reader would take for NEL. */
static void test_escape_invalid_utf8_bytes(void **state)
{
	assert_escapes("\xff\x80", "\\xff\\x80");
	assert_escapes("\x85", "\\x85");
	assert_escapes("ab\xc3", "ab\\xc3");                         /* cut short */
	assert_escapes("\xc3" "a", "\\xc3" "a");
	assert_escapes("\xc0\xaf", "\\xc0\\xaf");                     /* overlong '/' */
	assert_escapes("\xed\xa0\x80", "\\xed\\xa0\\x80");           /* surrogate */
	assert_escapes("\xe2\x80" "a", "\\xe2\\x80" "a");               /* U+2028 cut short */
	/* A valid character right after an invalid byte still passes. */
	assert_escapes("\xff\xc3\xa9", "\\xff\xc3\xa9");
}

/* Every character at which Python's str.splitlines() splits, once the
 * bytes are decoded as UTF-8 (invalid bytes as U+FFFD). */
static size_t count_line_breaks(const char *s, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if ((c >= 0x0a && c <= 0x0d) || (c >= 0x1c && c <= 0x1e))
			n++;
		else if (c == 0xc2 && i + 1 < len && (unsigned char)s[i + 1] == 0x85)
			n++;
		else if (c == 0xe2 && i + 2 < len && (unsigned char)s[i + 1] == 0x80 &&
			 ((unsigned char)s[i + 2] == 0xa8 || (unsigned char)s[i + 2] == 0xa9))
			n++;
	}
	return n;
}

static void test_line_has_one_line_break_for_splitlines(void **state)
{
	/* issue 19's forgery: a comm with NEL and U+2028, a name that ends
	 * in U+2028 and carries a whole fake line with NBSP for spaces. */
	const char *who = "x\xc2\x85" "FAKE\xe2\x80\xa8Z[4242]";
	const char *name = "evil\xe2\x80\xa8" "2026-08-22T23:05:52.123Z\xc2\xa0root\xc2\xa0"
			   "deploy\xc2\xa0" "fence=1\xc2\xa0uid=0\xc2\xa0pid=1\xc2\xa0released";
	const char *kv[] = { "slug", "a\xe2\x80\xa9" "b\x0b\x0c\x1c\x1d\x1e", "uid", "1000",
			     "pid", "4242", NULL };
	char buf[LOCKFS_LOG_LINE_MAX];
	int n = lockfs_log_format(buf, sizeof(buf), T0, who, name, kv, "acquired");

	assert_true(n > 0);
	assert_int_equal(count_line_breaks(buf, (size_t)n), 1);
	assert_int_equal(buf[n - 1], '\n');
	/* The NBSPs stay: the name reads as it is, on its own line. */
	assert_non_null(strstr(buf, " evil\\xe2\\x80\\xa8" "2026-08-22T23:05:52.123Z\xc2\xa0root"));
}

/* The last-resort cut (lockfs_log_format_fit) never splits a character:
 * the line stays valid UTF-8. */
static void test_cut_never_splits_a_character(void **state)
{
	size_t len = 3 * 1500;
	char *big = malloc(len + 1), buf[LOCKFS_LOG_LINE_MAX];
	const char *kv[] = { "uid", "0", "pid", "1", NULL };
	int n;

	assert_non_null(big);
	for (size_t i = 0; i < len; i += 3)
		memcpy(big + i, "\xe2\x82\xac", 3); /* U+20AC, 3 bytes: 1020 is no multiple */
	big[len] = '\0';
	n = lockfs_log_format_fit(buf, T0, big, big, kv, "acquired");
	assert_true(n > 0 && n < LOCKFS_LOG_LINE_MAX);
	assert_non_null(strstr(buf, "\\..."));
	assert_int_equal(lockfs_utf8_valid(buf, (size_t)n), 1);
	free(big);
}

static void test_escape_enospc(void **state)
{
	char buf[8];

	assert_int_equal(lockfs_log_escape(buf, 4, "abcd"), -ENOSPC);
	assert_int_equal(lockfs_log_escape(buf, 5, "abcd"), 4);
	assert_int_equal(lockfs_log_escape(buf, 4, " "), -ENOSPC); /* needs 5 */
	assert_int_equal(lockfs_log_escape(buf, 5, " "), 4);
	assert_int_equal(lockfs_log_escape(buf, 1, ""), -ENOSPC);
	assert_int_equal(lockfs_log_escape(buf, 2, ""), 1);
	assert_int_equal(lockfs_log_escape(buf, 0, "a"), -ENOSPC);
}

static void test_empty_fields_in_line(void **state)
{
	const char *kv[] = { "op", "", "", "v", "dash", "-", NULL };
	char buf[256];

	assert_true(lockfs_log_format(buf, sizeof(buf), 0, "", NULL, kv, "") > 0);
	assert_string_equal(buf, "1970-01-01T00:00:00.000Z - - op=- -=v dash=\\x2d -\n");
}

static void test_escaped_fields_in_line(void **state)
{
	const char *kv[] = { "a key", "a\tvalue\n", "k=x", "v=w", NULL };
	char buf[256];

	assert_true(lockfs_log_format(buf, sizeof(buf), 0, "bob smith", "x\\y", kv, "ev") > 0);
	/* '=' is escaped in keys (so a detail splits at its first '='),
	 * not in values. */
	assert_string_equal(buf, "1970-01-01T00:00:00.000Z bob\\x20smith x\\\\y "
			    "a\\x20key=a\\x09value\\x0a k\\x3dx=v=w ev\n");
}

static void test_odd_kv_list(void **state)
{
	const char *kv[] = { "lonely", NULL };
	char buf[256];

	assert_true(lockfs_log_format(buf, sizeof(buf), 0, "w", "n", kv, "e") > 0);
	assert_string_equal(buf, "1970-01-01T00:00:00.000Z w n lonely=- e\n");
}

static void random_field(char *dst, size_t max)
{
	size_t n = (size_t)rand() % max;

	for (size_t i = 0; i < n; i++) {
		/* Bias towards the bytes that matter: space, newline, '\\', '-'. */
		static const char special[] = " \n\t\\-=\x7f\r";
		int r = rand() % 4;

		dst[i] = r == 0 ? special[rand() % (sizeof(special) - 1)]
			        : (char)(1 + rand() % 255);
	}
	dst[n] = '\0';
	if (rand() % 20 == 0)
		strcpy(dst, "-");
}

static void test_split_count_invariant(void **state)
{
	char who[64], name[64], event[16], keys[3][16], vals[3][64];
	char buf[LOCKFS_LOG_LINE_MAX], *f[16];

	srand(12345);
	for (int iter = 0; iter < 1000; iter++) {
		const char *kv[7];
		int nkv = rand() % 4, n;

		random_field(who, sizeof(who));
		random_field(name, sizeof(name));
		random_field(event, sizeof(event));
		for (int i = 0; i < nkv; i++) {
			random_field(keys[i], sizeof(keys[i]));
			random_field(vals[i], sizeof(vals[i]));
			kv[2 * i] = keys[i];
			kv[2 * i + 1] = vals[i];
		}
		kv[2 * nkv] = NULL;

		n = lockfs_log_format(buf, sizeof(buf), T0, who, name, kv, event);
		assert_true(n > 0);
		assert_int_equal(buf[n - 1], '\n');
		assert_null(memchr(buf, '\n', (size_t)n - 1));
		assert_null(memchr(buf, '\0', (size_t)n));
		buf[n - 1] = '\0';
		assert_int_equal(split(buf, f, 16), 3 + nkv + 1);
		for (int i = 0; i < 3 + nkv + 1; i++) {
			assert_true(f[i][0] != '\0'); /* empty is always "-" */
			for (const char *p = f[i]; *p; p++)
				assert_true((unsigned char)*p > 0x20 && *p != 0x7f);
		}
		for (int i = 0; i < nkv; i++) {
			/* Key and value split at the first '='. */
			char *eq = strchr(f[3 + i], '=');

			assert_non_null(eq);
			assert_true(eq > f[3 + i]);
			assert_true(eq[1] != '\0');
		}
	}
}

static void test_format_enospc(void **state)
{
	char buf[LOCKFS_LOG_LINE_MAX];
	int n = lockfs_log_format(buf, sizeof(buf), 0, "w", "n", NULL, "e");

	/* Exactly enough (line + NUL) works, one byte less does not. */
	assert_true(n > 0);
	assert_int_equal(lockfs_log_format(buf, (size_t)n + 1, 0, "w", "n", NULL, "e"), n);
	assert_int_equal(lockfs_log_format(buf, (size_t)n, 0, "w", "n", NULL, "e"), -ENOSPC);
	assert_int_equal(lockfs_log_format(buf, 10, 0, "w", "n", NULL, "e"), -ENOSPC);
	assert_int_equal(lockfs_log_format(buf, 0, 0, "w", "n", NULL, "e"), -ENOSPC);
}

/* Read all of DIR/NAME into a malloc'd NUL-terminated string. */
static char *slurp(const char *dir, const char *name)
{
	char path[4096];
	FILE *f;
	char *s = calloc(1, 1 << 16);
	size_t n;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "r");
	assert_non_null(f);
	assert_non_null(s);
	n = fread(s, 1, (1 << 16) - 1, f);
	s[n] = '\0';
	fclose(f);
	return s;
}

static void cleanup_dir(char *dir, const char *name)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	unlink(path);
	rmdir(dir);
}

static void test_real_file(void **state)
{
	char dir[] = "/tmp/lockfs-test-log-XXXXXX";
	const char *kv[] = { "fence", "1", NULL };
	struct lockfs_log *log;
	struct stat st;
	char *text, *line, *save = NULL;
	static const char *const events[] = { "acquire", "release", "acquire" };
	int dirfd, i = 0;

	assert_non_null(mkdtemp(dir));
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dirfd >= 0);
	assert_int_equal(lockfs_log_open(&log, dirfd, "lock.log", NULL), 0);
	assert_int_equal(fstatat(dirfd, "lock.log", &st, 0), 0);
	assert_int_equal(st.st_mode & 07777, 0644 & ~umask(umask(0)));
	for (i = 0; i < 3; i++)
		assert_int_equal(lockfs_log_event(log, "alice:1", "deploy", kv, events[i]), 0);
	lockfs_log_close(log);

	/* Reopening appends rather than truncating. */
	assert_int_equal(lockfs_log_open(&log, dirfd, "lock.log", NULL), 0);
	assert_int_equal(lockfs_log_event(log, "bob:2", "db", NULL, "steal"), 0);
	lockfs_log_close(log);

	text = slurp(dir, "lock.log");
	assert_int_equal(text[strlen(text) - 1], '\n');
	i = 0;
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), i++) {
		const char *want = i < 3 ? events[i] : "steal";
		size_t ll = strlen(line), wl = strlen(want);
		char *f[8];

		assert_true(ll > wl && line[ll - wl - 1] == ' ');
		assert_string_equal(line + ll - wl, want);
		/* Timestamps look like 2026-08-22T23:05:52.123Z. */
		assert_int_equal(split(line, f, 8), i < 3 ? 5 : 4);
		assert_int_equal(strlen(f[0]), 24);
		assert_int_equal(f[0][10], 'T');
		assert_int_equal(f[0][23], 'Z');
	}
	assert_int_equal(i, 4);
	free(text);
	cleanup_dir(dir, "lock.log");
	close(dirfd);
}

/* The log reads the engine's clocks (core/base/clock.c), which a test
 * replaces: its lines carry the wall clock's time, and a burst of refusals
 * ends by the boot clock. */
static int64_t fake_wall_ms = 1000000000000; /* 2001-09-09T01:46:40.000Z */
static int64_t fake_boot_ms = 5000;

static int64_t fake_wall(void *arg)
{
	(void)arg;
	return fake_wall_ms;
}

static int64_t fake_boot(void *arg)
{
	(void)arg;
	return fake_boot_ms;
}

static int count_in(const char *text, const char *what)
{
	int n = 0;

	for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

static void test_log_reads_the_replaceable_clocks(void **state)
{
	char dir[] = "/tmp/lockfs-test-log-XXXXXX";
	static const struct lockfs_clock clock = { fake_wall, fake_boot, NULL };
	const struct lockfs_log_limits lim = { .keep = 1, .denied_interval_s = 10 };
	struct lockfs_log *log;
	char *text;
	int dirfd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dirfd >= 0);
	lockfs_clock_override(&clock);
	assert_int_equal(lockfs_log_open(&log, dirfd, "lock.log", &lim), 0);
	assert_int_equal(lockfs_log_event(log, "alice:1", "deploy", NULL, "acquired"), 0);
	lockfs_log_denied(log, 1000, 1, "bob:2", "deploy", "not-holder");
	lockfs_log_denied(log, 1000, 1, "bob:2", "deploy", "not-holder"); /* same burst */
	fake_boot_ms += 11000;                                            /* the burst is over */
	lockfs_log_tick(log);
	lockfs_log_denied(log, 1000, 1, "bob:2", "deploy", "not-holder");
	lockfs_log_close(log);
	lockfs_clock_override(NULL);

	text = slurp(dir, "lock.log");
	assert_int_equal(strncmp(text, "2001-09-09T01:46:40.000Z ", 25), 0);
	/* the first of the burst, its count line at the tick, a new burst's first */
	assert_int_equal(count_in(text, " denied\n"), 3);
	assert_int_equal(count_in(text, "2001-09-09T01:46:40.000Z "), 4);
	free(text);
	cleanup_dir(dir, "lock.log");
	close(dirfd);
}

static void test_open_error(void **state)
{
	struct lockfs_log *log = NULL;

	char dir[] = "/tmp/lockfs-test-log-XXXXXX";
	int dirfd;

	assert_non_null(mkdtemp(dir));
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dirfd >= 0);
	assert_int_equal(lockfs_log_open(&log, dirfd, "missing/lock.log", NULL), -ENOENT);
	assert_null(log);
	close(dirfd);
	rmdir(dir);
	assert_int_equal(lockfs_log_open(&log, -1, "relative.log", NULL), -EBADF);
}

static void test_oversize_event_drops_details(void **state)
{
	char dir[] = "/tmp/lockfs-test-log-XXXXXX";
	char *big = malloc(LOCKFS_LOG_LINE_MAX * 2), *text, *f[8];
	const char *kv[] = { "operation", big, NULL };
	struct lockfs_log *log;
	int dirfd;

	assert_non_null(big);
	memset(big, 'x', LOCKFS_LOG_LINE_MAX * 2 - 1);
	big[LOCKFS_LOG_LINE_MAX * 2 - 1] = '\0';
	assert_non_null(mkdtemp(dir));
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dirfd >= 0);
	assert_int_equal(lockfs_log_open(&log, dirfd, "lock.log", NULL), 0);

	/* 1: a long detail is dropped whole, the rest stays. */
	assert_int_equal(lockfs_log_event(log, "w", "n", kv, "set-operation"), 0);
	/* 2: a long WHO (escapes quadruple it) is cut with the marker. */
	memset(big, ' ', LOCKFS_LOG_LINE_MAX * 2 - 1);
	assert_int_equal(lockfs_log_event(log, big, "n", NULL, "acquire"), 0);
	lockfs_log_close(log);

	text = slurp(dir, "lock.log");
	{
		char *l1 = text, *l2 = strchr(text, '\n') + 1;

		assert_true(strlen(text) < 2 * LOCKFS_LOG_LINE_MAX);
		assert_int_equal(l2[strlen(l2) - 1], '\n');
		assert_true(strlen(l2) < LOCKFS_LOG_LINE_MAX);
		l2[-1] = '\0';
		l2[strlen(l2) - 1] = '\0';
		assert_int_equal(split(l1, f, 8), 5);
		assert_string_equal(f[1], "w");
		assert_string_equal(f[3], "details=dropped");
		assert_string_equal(f[4], "set-operation");
		assert_int_equal(split(l2, f, 8), 5);
		assert_string_equal(f[1] + strlen(f[1]) - 4, "\\...");
		assert_memory_equal(f[1], "\\x20\\x20", 8); /* cut between escapes */
		assert_int_equal((strlen(f[1]) - 4) % 4, 0);
		assert_string_equal(f[2], "n");
		assert_string_equal(f[4], "acquire");
	}
	free(text);
	free(big);
	cleanup_dir(dir, "lock.log");
	close(dirfd);
}

static void test_parse_size(void **state)
{
	uint64_t v = 0;

	assert_int_equal(lockfs_log_parse_size("0", &v), 0);
	assert_int_equal(v, 0);
	assert_int_equal(lockfs_log_parse_size("20000", &v), 0);
	assert_int_equal(v, 20000);
	assert_int_equal(lockfs_log_parse_size("16K", &v), 0);
	assert_int_equal(v, 16384);
	assert_int_equal(lockfs_log_parse_size("4m", &v), 0);
	assert_int_equal(v, 4u << 20);
	assert_int_equal(lockfs_log_parse_size("1G", &v), 0);
	assert_int_equal(v, 1u << 30);
	for (const char *const *bad = (const char *const[]){ "", "K", "-1", " 1", "1 K", "1KB",
							     "1T", "x", "99999999999999999999",
							     "17179869184G", NULL }; *bad; bad++)
		assert_int_equal(lockfs_log_parse_size(*bad, &v), -EINVAL);
	assert_int_equal(lockfs_log_parse_size(NULL, &v), -EINVAL);
}

static void test_fit_keeps_uid_and_pid(void **state)
{
	char *big = malloc(LOCKFS_LOG_LINE_MAX * 2), buf[LOCKFS_LOG_LINE_MAX], *f[16];
	const char *kv[] = { "fence", "7", "uid", "1002", "pid", "4711", "reason", big, NULL };
	int n;

	assert_non_null(big);
	memset(big, ' ', LOCKFS_LOG_LINE_MAX);
	big[LOCKFS_LOG_LINE_MAX] = '\0';
	n = lockfs_log_format_fit(buf, T0, "w", "n", kv, "broken");
	assert_true(n > 0 && n < LOCKFS_LOG_LINE_MAX);
	buf[n - 1] = '\0';
	assert_int_equal(split(buf, f, 16), 7);
	assert_string_equal(f[3], "uid=1002");
	assert_string_equal(f[4], "pid=4711");
	assert_string_equal(f[5], "details=dropped");
	/* Still too long after that: WHO is cut, uid= and pid= stay. */
	n = lockfs_log_format_fit(buf, T0, big, big, kv, "broken");
	assert_true(n > 0 && n < LOCKFS_LOG_LINE_MAX);
	buf[n - 1] = '\0';
	assert_int_equal(split(buf, f, 16), 7);
	assert_string_equal(f[1] + strlen(f[1]) - 4, "\\...");
	assert_string_equal(f[3], "uid=1002");
	assert_string_equal(f[4], "pid=4711");
	assert_string_equal(f[6], "broken");
	free(big);
}

/* A fresh 0700 directory and an fd on it. */
static int temp_dir(char *dir)
{
	int fd;

	assert_non_null(mkdtemp(dir));
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	return fd;
}

static void rm_rf(const char *dir)
{
	char cmd[4200];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

static int count_lines(const char *dir, const char *name)
{
	char *text = slurp(dir, name);
	int n = 0;

	for (char *p = text; *p; p++)
		n += *p == '\n';
	assert_true(text[0] == '\0' || text[strlen(text) - 1] == '\n');
	free(text);
	return n;
}

static void test_rotation_keeps_keep_files_within_max(void **state)
{
	char dir[] = "/tmp/lockfs-test-log-XXXXXX";
	const struct lockfs_log_limits lim = { .max_bytes = LOCKFS_LOG_MAX_MIN, .keep = 2 };
	const char *kv[] = { "fence", "1", "uid", "0", "pid", "1", NULL };
	struct lockfs_log *log;
	struct stat st;
	int dirfd = temp_dir(dir), total = 0;

	assert_int_equal(lockfs_log_open(&log, dirfd, "lock.log", &lim), 0);
	for (int i = 0; i < 1000; i++)
		assert_int_equal(lockfs_log_event(log, "w", "n", kv, "acquired"), 0);
	assert_int_equal(lockfs_log_close(log), 0);
	for (const char *const *n = (const char *const[]){ "lock.log", "lock.log.1", "lock.log.2",
							   NULL }; *n; n++) {
		assert_int_equal(fstatat(dirfd, *n, &st, AT_SYMLINK_NOFOLLOW), 0);
		assert_true(S_ISREG(st.st_mode) && st.st_size <= (off_t)LOCKFS_LOG_MAX_MIN);
		total += count_lines(dir, *n);
	}
	assert_int_equal(fstatat(dirfd, "lock.log.3", &st, 0), -1);
	assert_true(total > 100 && total < 1000); /* the oldest went */
	close(dirfd);
	rm_rf(dir);
}

static void test_open_refuses_links(void **state)
{
	char dir[] = "/tmp/lockfs-test-log-XXXXXX";
	struct lockfs_log *log = NULL;
	int dirfd = temp_dir(dir), fd;

	assert_int_equal(symlinkat("target", dirfd, "sym.log"), 0);
	assert_int_equal(lockfs_log_open(&log, dirfd, "sym.log", NULL), -ELOOP);
	fd = openat(dirfd, "one.log", O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(linkat(dirfd, "one.log", dirfd, "two.log", 0), 0);
	assert_int_equal(lockfs_log_open(&log, dirfd, "two.log", NULL), -EMLINK);
	assert_int_equal(mkfifoat(dirfd, "fifo.log", 0600), 0);
	assert_int_equal(lockfs_log_open(&log, dirfd, "fifo.log", NULL), -EINVAL);
	assert_null(log);
	close(dirfd);
	rm_rf(dir);
}

/* Lines that cannot be written are kept, in order, and written once the
 * file takes writes; a grant's line (lockfs_log_event) is not kept. */
static void test_kept_lines_come_out_in_order(void **state)
{
	char dir[] = "/tmp/lockfs-test-log-XXXXXX", *text, *p;
	struct lockfs_log *log;
	struct rlimit old, lim;
	struct stat st;
	int dirfd = temp_dir(dir);

	assert_int_equal(lockfs_log_open(&log, dirfd, "lock.log", NULL), 0);
	assert_int_equal(lockfs_log_event(log, "w", "first", NULL, "acquired"), 0);
	assert_int_equal(fstatat(dirfd, "lock.log", &st, 0), 0);
	/* Past RLIMIT_FSIZE a write fails with EFBIG (SIGXFSZ ignored). */
	signal(SIGXFSZ, SIG_IGN);
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim.rlim_cur = (rlim_t)st.st_size + 10; /* part of a line fits */
	lim.rlim_max = old.rlim_max;
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	assert_int_equal(lockfs_log_event_or_keep(log, "w", "a", NULL, "released"), -EFBIG);
	assert_int_equal(lockfs_log_event(log, "w", "grant", NULL, "acquired"), -EFBIG);
	assert_int_equal(lockfs_log_event_or_keep(log, "w", "b", NULL, "released"), -EFBIG);
	lockfs_log_tick(log); /* still refused: nothing changes */
	assert_int_equal(fstatat(dirfd, "lock.log", &st, 0), 0);
	assert_int_equal(st.st_size, lim.rlim_cur - 10); /* the cut part was taken back */
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	lockfs_log_tick(log);
	assert_int_equal(lockfs_log_close(log), 0);
	text = slurp(dir, "lock.log");
	p = strstr(text, " first acquired\n");
	assert_non_null(p);
	p = strstr(p, " a released\n");
	assert_non_null(p);
	assert_non_null(strstr(p, " b released\n"));
	assert_null(strstr(text, "grant"));
	assert_int_equal(count_lines(dir, "lock.log"), 3);
	free(text);
	close(dirfd);
	rm_rf(dir);
}

static void test_open_ro_follows_the_file_being_written(void **state)
{
	char dir[] = "/tmp/lockfs-test-log-XXXXXX", buf[256];
	struct lockfs_log *log;
	int dirfd = temp_dir(dir), fd;
	ssize_t n;

	assert_int_equal(lockfs_log_open(&log, dirfd, "lock.log", NULL), 0);
	assert_int_equal(renameat(dirfd, "lock.log", dirfd, "moved"), 0);
	assert_int_equal(lockfs_log_event(log, "w", "one", NULL, "acquired"), 0);
	fd = lockfs_log_open_ro(log);
	assert_true(fd >= 0);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_non_null(strstr(buf, " one acquired\n"));
	close(fd);
	lockfs_log_request_reopen(log); /* what SIGHUP does */
	assert_int_equal(lockfs_log_event(log, "w", "two", NULL, "acquired"), 0);
	assert_int_equal(count_lines(dir, "lock.log"), 1);
	assert_int_equal(count_lines(dir, "moved"), 1);
	fd = lockfs_log_open_ro(log);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_non_null(strstr(buf, " two acquired\n"));
	close(fd);
	lockfs_log_close(log);
	close(dirfd);
	rm_rf(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain_line),
		cmocka_unit_test(test_no_details),
		cmocka_unit_test(test_escape_whitespace_and_controls),
		cmocka_unit_test(test_escape_backslash),
		cmocka_unit_test(test_escape_dash_and_empty),
		cmocka_unit_test(test_escape_utf8_passthrough),
		cmocka_unit_test(test_escape_c1_separators_and_bidi),
		cmocka_unit_test(test_escape_invalid_utf8_bytes),
		cmocka_unit_test(test_line_has_one_line_break_for_splitlines),
		cmocka_unit_test(test_cut_never_splits_a_character),
		cmocka_unit_test(test_escape_enospc),
		cmocka_unit_test(test_empty_fields_in_line),
		cmocka_unit_test(test_escaped_fields_in_line),
		cmocka_unit_test(test_odd_kv_list),
		cmocka_unit_test(test_split_count_invariant),
		cmocka_unit_test(test_format_enospc),
		cmocka_unit_test(test_real_file),
		cmocka_unit_test(test_open_error),
		cmocka_unit_test(test_oversize_event_drops_details),
		cmocka_unit_test(test_parse_size),
		cmocka_unit_test(test_fit_keeps_uid_and_pid),
		cmocka_unit_test(test_rotation_keeps_keep_files_within_max),
		cmocka_unit_test(test_open_refuses_links),
		cmocka_unit_test(test_log_reads_the_replaceable_clocks),
		cmocka_unit_test(test_kept_lines_come_out_in_order),
		cmocka_unit_test(test_open_ro_follows_the_file_being_written),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
