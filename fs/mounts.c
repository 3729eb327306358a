/*
 * Reading a mount table (/proc/self/mountinfo or another task's) without
 * touching any mount: a hung FUSE mount hangs stat() and open() on it,
 * never a read of mountinfo.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mounts.h"

/* Undo the kernel's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
	char *out = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*out++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 | (s[3] - '0'));
			s += 3;
		} else {
			*out++ = *s;
		}
	}
	*out = '\0';
}

/* Split LINE (modified) into E.  Returns 0, or -EINVAL for a line that is
 * not "ID PARENT MAJ:MIN ROOT TARGET OPTS [TAGS...] - TYPE SOURCE ...". */
static int parse_line(char *line, struct lockfs_mount *e)
{
	char *fields[6], *save = NULL, *tok;
	int n = 0;

	line[strcspn(line, "\n")] = '\0';
	for (tok = strtok_r(line, " ", &save); tok && n < 6; tok = strtok_r(NULL, " ", &save))
		fields[n++] = tok;
	if (n < 6 || sscanf(fields[2], "%u:%u", &e->major, &e->minor) != 2)
		return -EINVAL;
	e->target = fields[4];
	/* Optional tags up to the lone "-". */
	while (tok && strcmp(tok, "-") != 0)
		tok = strtok_r(NULL, " ", &save);
	e->fstype = tok ? strtok_r(NULL, " ", &save) : NULL;
	e->source = e->fstype ? strtok_r(NULL, " ", &save) : NULL;
	if (!e->fstype || !e->source)
		return -EINVAL;
	unescape(e->target);
	unescape(e->fstype);
	unescape(e->source);
	return 0;
}

int lockfs_mounts_each(const char *path, lockfs_mount_fn fn, void *arg)
{
	FILE *f = fopen(path, "re");
	char *line = NULL;
	size_t cap = 0;
	int rc = 0;

	if (!f)
		return -errno;
	while (rc == 0 && getline(&line, &cap, f) >= 0) {
		struct lockfs_mount e;

		if (parse_line(line, &e) == 0)
			rc = fn(&e, arg);
	}
	free(line);
	fclose(f);
	return rc;
}

bool lockfs_mount_is_fuse(const struct lockfs_mount *e)
{
	return strcmp(e->fstype, "fuse") == 0 || strncmp(e->fstype, "fuse.", 5) == 0 ||
	       strcmp(e->fstype, "fuseblk") == 0 || strncmp(e->fstype, "fuseblk.", 8) == 0;
}

struct top {
	const char *target;
	struct lockfs_mount *out;
	char *buf;
	int count;
};

static int note_top(const struct lockfs_mount *e, void *arg)
{
	struct top *t = arg;
	size_t a = strlen(e->target) + 1, b = strlen(e->fstype) + 1, c = strlen(e->source) + 1;
	char *buf;

	if (strcmp(e->target, t->target) != 0)
		return 0;
	/* Later lines are mounted on top of earlier ones: keep the last. */
	buf = malloc(a + b + c);
	if (!buf)
		return -ENOMEM;
	free(t->buf);
	t->buf = buf;
	*t->out = *e;
	t->out->target = memcpy(buf, e->target, a);
	t->out->fstype = memcpy(buf + a, e->fstype, b);
	t->out->source = memcpy(buf + a + b, e->source, c);
	t->count++;
	return 0;
}

int lockfs_mount_top(const char *target, struct lockfs_mount *out, char **buf)
{
	struct top t = { .target = target, .out = out };
	int rc = lockfs_mounts_each("/proc/self/mountinfo", note_top, &t);

	if (rc < 0) {
		free(t.buf);
		t.buf = NULL;
		t.count = rc;
	}
	*buf = t.buf;
	return t.count;
}
