/*
 * The names of slots (include/lockfs/name.h, docs/slots.md): "NAME=N" as a
 * caller asks for one of N slots of NAME, and ".slotKofN:NAME", the lock
 * that slot K is stored as.  The stored form begins with '.', so no
 * caller can name it through the mount (the mount refuses dot names), yet
 * the engine treats it as any lock: its own record, holder, fence, lease
 * and recovery.  Both forms are canonical (no leading zeros, K < N), so
 * one slot has exactly one stored name.  ".slotline:NAME" is the lock
 * whose FIFO line a name's slot waiters stand in across hosts (slots.c).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "lockfs/limits.h"
#include "lockfs/name.h"

#define SLOT_PREFIX ".slot"
#define LINE_PREFIX ".slotline:"

/* Parse the canonical decimal at *P (1..max, no leading zero, or "0" when
 * ZERO_OK) and move *P past it.  0 or -EINVAL. */
static int parse_num(const char **p, unsigned max, int zero_ok, unsigned *out)
{
	const char *s = *p;
	unsigned v = 0;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	if (*s == '0') {
		if (!zero_ok)
			return -EINVAL;
		*out = 0;
		*p = s + 1;
		return 0;
	}
	while (*s >= '0' && *s <= '9') {
		v = v * 10 + (unsigned)(*s - '0');
		if (v > max)
			return -EINVAL;
		s++;
	}
	*out = v;
	*p = s;
	return 0;
}

/* Does S end in "=DIGITS"? */
static int ends_in_count(const char *s)
{
	const char *eq = strrchr(s, '=');

	if (!eq || !eq[1])
		return 0;
	for (const char *d = eq + 1; *d; d++)
		if (*d < '0' || *d > '9')
			return 0;
	return 1;
}

int lockfs_slot_base_check(const char *base)
{
	int rc = lockfs_name_check(base);

	if (rc < 0)
		return rc;
	if (strlen(base) > LOCKFS_SLOT_NAME_MAX)
		return -ENAMETOOLONG;
	return ends_in_count(base) ? -EINVAL : 0;
}

int lockfs_slot_request_parse(const char *req, char *base, size_t size, unsigned *cap)
{
	const char *eq = strrchr(req, '='), *p;
	size_t n;
	int rc;

	if (!eq)
		return -EINVAL;
	p = eq + 1;
	if (parse_num(&p, LOCKFS_SLOTS_MAX, 0, cap) < 0 || *p)
		return -EINVAL;
	n = (size_t)(eq - req);
	if (n >= size)
		return -ENAMETOOLONG;
	memcpy(base, req, n);
	base[n] = '\0';
	rc = lockfs_slot_base_check(base);
	return rc == -ENOMEM ? rc : rc < 0 && rc != -ENAMETOOLONG ? -EINVAL : rc;
}

void lockfs_slot_name(char *out, size_t size, const char *base, unsigned k, unsigned cap)
{
	snprintf(out, size, SLOT_PREFIX "%uof%u:%s", k, cap, base);
}

int lockfs_slot_name_parse(const char *name, const char **base, unsigned *k, unsigned *cap)
{
	const char *p = name;

	if (strncmp(p, SLOT_PREFIX, strlen(SLOT_PREFIX)) != 0)
		return 0;
	p += strlen(SLOT_PREFIX);
	if (parse_num(&p, LOCKFS_SLOTS_MAX - 1, 1, k) < 0 || strncmp(p, "of", 2) != 0)
		return 0;
	p += 2;
	if (parse_num(&p, LOCKFS_SLOTS_MAX, 0, cap) < 0 || *p != ':' || *k >= *cap)
		return 0;
	p++;
	if (lockfs_slot_base_check(p) < 0)
		return 0;
	*base = p;
	return 1;
}

void lockfs_slot_line_name(char *out, size_t size, const char *base)
{
	snprintf(out, size, LINE_PREFIX "%s", base);
}

int lockfs_slot_line_parse(const char *name, const char **base)
{
	if (strncmp(name, LINE_PREFIX, strlen(LINE_PREFIX)) != 0 ||
	    lockfs_slot_base_check(name + strlen(LINE_PREFIX)) < 0)
		return 0;
	*base = name + strlen(LINE_PREFIX);
	return 1;
}

int lockfs_name_check_stored(const char *name)
{
	const char *base;
	unsigned k, cap;
	int rc = lockfs_name_check(name);

	if (rc == 0 || name[0] != '.')
		return rc;
	return lockfs_slot_name_parse(name, &base, &k, &cap) ||
	       lockfs_slot_line_parse(name, &base) ? 0 : rc;
}
