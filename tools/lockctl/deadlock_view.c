/*
 * lockctl status: the last deadlock the daemon answered, from the tail of
 * M/.log (its `deadlock` line, docs/log.md).  Read like any file: the
 * line's fields are unescaped, then made printable.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lockctl.h"

/* How much of the log's end is searched: a deadlock further back is old
 * news, and status must stay quick on a big log. */
#define TAIL_BYTES (64 * 1024)

/* One field of a log line decoded in place: \xHH and \\ (log.md,
 * "Escaping"); "-" alone is the empty field. */
static void unescape(char *s)
{
	char *out = s;

	if (strcmp(s, "-") == 0) {
		*s = '\0';
		return;
	}
	for (char *p = s; *p; p++) {
		unsigned v;

		if (p[0] == '\\' && p[1] == '\\') {
			*out++ = '\\';
			p++;
		} else if (p[0] == '\\' && p[1] == 'x' && sscanf(p + 2, "%2x", &v) == 1 &&
			   p[2] && p[3]) {
			*out++ = (char)v;
			p += 3;
		} else {
			*out++ = *p;
		}
	}
	*out = '\0';
}

/* The value of KEY among the N details of FIELDS (decoded), or NULL. */
static const char *detail(char **fields, size_t n, const char *key)
{
	size_t klen = strlen(key);

	for (size_t i = 0; i < n; i++)
		if (strncmp(fields[i], key, klen) == 0 && fields[i][klen] == '=')
			return fields[i] + klen + 1;
	return NULL;
}

/* The last `deadlock` line of TEXT (LEN bytes, whole lines), cut in place
 * into its space-separated fields; the count, 0 when there is none. */
static size_t last_deadlock(char *text, size_t len, char **fields, size_t max)
{
	static const char tail[] = " deadlock";
	char *line = NULL;
	size_t n = 0;

	for (char *end = text + len; end > text;) {
		char *start = end - 1;

		while (start > text && start[-1] != '\n')
			start--;
		if ((size_t)(end - start) > sizeof(tail) &&
		    memcmp(end - (sizeof(tail) - 1), tail, sizeof(tail) - 1) == 0) {
			*end = '\0';
			line = start;
			break;
		}
		end = start > text ? start - 1 : text;
	}
	if (!line)
		return 0;
	for (char *save = NULL, *f = strtok_r(line, " ", &save); f && n < max;
	     f = strtok_r(NULL, " ", &save))
		fields[n++] = f;
	return n;
}

void lockfs_ctl_last_deadlock(const char *mnt)
{
	char *path = xasprintf("%s/.log", mnt), *text, *fields[128], key[32];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	ssize_t got;
	size_t len = 0, n;
	off_t from;

	free(path);
	if (fd < 0)
		return; /* no log to read: nothing to say */
	if (fstat(fd, &st) < 0) {
		close(fd);
		return;
	}
	from = st.st_size > TAIL_BYTES ? st.st_size - TAIL_BYTES : 0;
	text = malloc(TAIL_BYTES + 1);
	if (!text)
		oom();
	while (len < TAIL_BYTES &&
	       (got = pread(fd, text + len, TAIL_BYTES - len, from + (off_t)len)) > 0)
		len += (size_t)got;
	close(fd);
	/* Whole lines only: the part of a line before the tail, and a line
	 * being written, are not read. */
	while (len && text[len - 1] != '\n')
		len--;
	if (len)
		len--; /* the last newline */
	text[len] = '\0';
	if (from > 0) {
		char *nl = memchr(text, '\n', len);
		size_t skip = nl ? (size_t)(nl + 1 - text) : len;

		memmove(text, text + skip, len - skip + 1);
		len -= skip;
	}
	n = last_deadlock(text, len, fields, sizeof(fields) / sizeof(fields[0]));
	if (n < 5) {
		free(text);
		return;
	}
	for (size_t i = 1; i < n - 1; i++)
		unescape(fields[i]);
	/* TIMESTAMP WHO NAME details... deadlock */
	char **details = fields + 3;
	size_t nd = n - 4;
	const char *cycle = detail(details, nd, "cycle");
	char *out = xasprintf("last deadlock: %s %s got EDEADLK:", fields[0], fields[1]);

	for (int i = 1; i <= 16; i++) {
		const char *pid, *wait, *held;
		char *more;

		snprintf(key, sizeof(key), "pid%d", i);
		pid = detail(details, nd, key);
		snprintf(key, sizeof(key), "wait%d", i);
		wait = detail(details, nd, key);
		snprintf(key, sizeof(key), "heldby%d", i);
		held = detail(details, nd, key);
		if (!pid || !wait)
			break;
		more = xasprintf("%s%s pid %s waits for %s (held by %s)", out, i > 1 ? "," : "",
				 pid, wait, held ? held : "?");
		free(out);
		out = more;
	}
	if (cycle && atoi(cycle) > 16) {
		char *more = xasprintf("%s, ... (%s in all)", out, cycle);

		free(out);
		out = more;
	}
	lockfs_ctl_printable(out);
	printf("%s\n", out);
	free(out);
	free(text);
}
