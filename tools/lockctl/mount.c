/*
 * Finding the lockfs mount (--mount, $LOCKFS_MOUNT, /locks) and reading
 * it: the owner and waiters files, and what they say about a holder.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "lockctl.h"

/* ------------------------------------------------------------------ */
/* the mount */

/* Undo the kernel's octal escapes (\040 for space, ...) in place. */
static void unescape_mountinfo(char *s)
{
	char *w = s;
	for (char *r = s; *r;) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] >= '0' && r[2] <= '7' &&
		    r[3] >= '0' && r[3] <= '7') {
			*w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
			r += 4;
		} else {
			*w++ = *r++;
		}
	}
	*w = '\0';
}

/*
 * The file system type of the topmost mount whose mount point is exactly
 * PATH (already canonical), from /proc/self/mountinfo: a malloc'd string,
 * or NULL when PATH is no mount point.  *ERR is set when mountinfo itself
 * cannot be read.
 */
static char *mount_fstype(const char *path, int *err)
{
	*err = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f) {
		*err = errno;
		return NULL;
	}
	char *line = NULL, *found = NULL;
	size_t cap = 0;
	while (getline(&line, &cap, f) > 0) {
		line[strcspn(line, "\n")] = '\0';
		char *sep = strstr(line, " - ");
		if (!sep)
			continue;
		*sep = '\0';
		/* 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw */
		char *save = NULL, *field = strtok_r(line, " ", &save);
		for (int k = 0; field && k < 4; k++)
			field = strtok_r(NULL, " ", &save);
		if (!field)
			continue;
		unescape_mountinfo(field);
		if (strcmp(field, path) != 0)
			continue;
		char *type = sep + 3;
		type[strcspn(type, " ")] = '\0';
		free(found);
		found = strdup(type);
		if (!found)
			oom();
	}
	free(line);
	fclose(f);
	return found;
}

/*
 * Resolve the mount (--mount, $LOCKFS_MOUNT, /locks) and check that it is
 * a fuse.lockfs mount.  Sets *OUT (malloc'd canonical path) and returns 0;
 * returns -E, saying nothing, when its daemon is away (lockctl.h); or
 * prints why and returns EX_UNAVAILABLE.
 */
int lockfs_ctl_find_mount(const char *opt_mount, char **out)
{
	const char *m = opt_mount;
	const char *how = "--mount";
	if (!m) {
		m = getenv("LOCKFS_MOUNT");
		how = "LOCKFS_MOUNT";
		if (!m || !*m) {
			m = DEFAULT_MOUNT;
			how = "the default";
		}
	}
	char *real = realpath(m, NULL);
	if (!real) {
		int e = errno;
		if (lockfs_ctl_is_conn_error(e))
			return -e; /* a dead mount, until it is detached */
		return fail(EX_UNAVAILABLE, "lockfs mount %s (%s): %s", m, how, strerror(e));
	}
	int err;
	char *type = mount_fstype(real, &err);
	if (err) {
		free(real);
		return fail(EX_UNAVAILABLE, "cannot read /proc/self/mountinfo: %s", strerror(err));
	}
	if ((!type || strcmp(type, "fuse.lockfs") != 0) && lockfs_ctl_is_guarded(real)) {
		free(type);
		free(real);
		return -ERR_NOTHING_MOUNTED;
	}
	if (!type || strcmp(type, "fuse.lockfs") != 0) {
		int rc;
		if (!type)
			rc = fail(EX_UNAVAILABLE, "%s is not a lockfs mount (not a mount point);"
				  " give the mount with --mount PATH or LOCKFS_MOUNT", real);
		else
			rc = fail(EX_UNAVAILABLE, "%s is not a lockfs mount (type %s, not fuse.lockfs);"
				  " give the mount with --mount PATH or LOCKFS_MOUNT", real, type);
		free(type);
		free(real);
		return rc;
	}
	free(type);
	*out = real;
	return 0;
}

int lockfs_ctl_find_mount_now(const char *opt_mount, char **out)
{
	int rc = lockfs_ctl_find_mount(opt_mount, out);
	if (rc >= 0)
		return rc;
	const char *m = opt_mount ? opt_mount : getenv("LOCKFS_MOUNT");
	if (!m || !*m)
		m = DEFAULT_MOUNT;
	return fail(EX_UNAVAILABLE, "lockfs mount %s: %s", m, lockfs_ctl_down_reason(-rc));
}

/* ------------------------------------------------------------------ */
/* reading the mount */

/*
 * Read all of PATH (at most FILE_MAX bytes) into a malloc'd NUL-terminated
 * buffer.  Returns 0, or -errno.
 */
static int read_whole(const char *path, char **buf, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t cap = 4096, n = 0;
	char *b = malloc(cap);
	if (!b)
		oom();
	for (;;) {
		if (n + 1 >= cap) {
			if (cap >= FILE_MAX) {
				free(b);
				close(fd);
				return -EFBIG;
			}
			cap *= 2;
			char *nb = realloc(b, cap);
			if (!nb)
				oom();
			b = nb;
		}
		ssize_t r = read(fd, b + n, cap - 1 - n);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			int e = errno;
			free(b);
			close(fd);
			return -e;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	b[n] = '\0';
	*buf = b;
	if (len)
		*len = n;
	return 0;
}

/* M/NAME/owner as a JSON object; NULL with *ERR = errno (EBADMSG: not JSON). */
json_t *lockfs_ctl_read_owner(const char *mnt, const char *name, int *err)
{
	char *path = xasprintf("%s/%s/owner", mnt, name);
	char *text;
	size_t len;
	int rc = read_whole(path, &text, &len);
	free(path);
	if (rc < 0) {
		*err = -rc;
		return NULL;
	}
	json_t *j = json_loadb(text, len, 0, NULL);
	free(text);
	if (!j || !json_is_object(j)) {
		json_decref(j);
		*err = EBADMSG;
		return NULL;
	}
	*err = 0;
	return j;
}

/*
 * M/NAME/waiters as a JSON array (one object per line, queue order).  A
 * missing file (a daemon without waiters) or a lock released meanwhile
 * gives an empty array; lines that are not JSON objects are skipped.
 */
json_t *lockfs_ctl_read_waiters(const char *mnt, const char *name)
{
	json_t *arr = json_array();
	if (!arr)
		oom();
	char *path = xasprintf("%s/%s/waiters", mnt, name);
	char *text;
	int rc = read_whole(path, &text, NULL);
	free(path);
	if (rc < 0)
		return arr;
	char *save = NULL;
	for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		json_t *w = json_loads(l, 0, NULL);
		if (w && json_is_object(w))
			json_array_append_new(arr, w);
		else
			json_decref(w);
	}
	free(text);
	return arr;
}

long long lockfs_ctl_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "2026-11-29T16:58:14.933Z" -> Unix ms; false if it is not that shape. */
static bool parse_rfc3339_ms(const char *s, long long *ms)
{
	struct tm tm;
	int frac = 0, used = 0;
	memset(&tm, 0, sizeof(tm));
	if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &tm.tm_year, &tm.tm_mon,
			 &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &frac, &used) != 7 ||
	    s[used] != '\0')
		return false;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	time_t t = timegm(&tm);
	if (t == (time_t)-1)
		return false;
	*ms = (long long)t * 1000 + frac;
	return true;
}

/* When a holder (or the record, as fallback) acquired the lock, Unix ms. */
bool lockfs_ctl_acquired_ms(const json_t *holder, const json_t *owner, long long *ms)
{
	if (holder && (lockfs_ctl_jint(holder, "acquired_at_ms", ms) ||
		       parse_rfc3339_ms(lockfs_ctl_jstr(holder, "acquired_at"), ms)))
		return true;
	return lockfs_ctl_jint(owner, "acquired_at_ms", ms) ||
	       parse_rfc3339_ms(lockfs_ctl_jstr(owner, "acquired_at"), ms);
}

/* A duration for people: 42s, 3m05s, 2h07m, 3d04h. */
void lockfs_ctl_fmt_duration(long long ms, char *buf, size_t size)
{
	if (ms < 0)
		ms = 0;
	long long s = ms / 1000;
	if (s < 60)
		snprintf(buf, size, "%llds", s);
	else if (s < 3600)
		snprintf(buf, size, "%lldm%02llds", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, size, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
	else
		snprintf(buf, size, "%lldd%02lldh", s / 86400, (s % 86400) / 3600);
}

/* The holder objects of OWNER: "holders" if present, else [holder]. */
size_t lockfs_ctl_holders_of(const json_t *owner, const json_t **first)
{
	json_t *hs = json_object_get(owner, "holders");
	if (json_is_array(hs) && json_array_size(hs) > 0) {
		*first = json_array_get(hs, 0);
		return json_array_size(hs);
	}
	json_t *h = json_object_get(owner, "holder");
	*first = json_is_object(h) ? h : NULL;
	return *first ? 1 : 0;
}

/*
 * Who holds the lock, for one line: "bash[1234] for 12s", "slug agent-7
 * for 3m05s", "a foreign lock for 5s", "bash[12] and 2 more (shared) ...",
 * "bash (exited; kept by sleep[40]) for 1m02s".  Pids as lockctl's own pid
 * namespace sees them (holder_view.c).  Malloc'd.
 */
char *lockfs_ctl_describe_holder(const char *mnt, const char *name, const json_t *owner)
{
	const json_t *h = NULL;
	size_t n = lockfs_ctl_holders_of(owner, &h);
	long long at;
	char age[32] = "";
	if (lockfs_ctl_acquired_ms(h, owner, &at)) {
		char d[24];
		lockfs_ctl_fmt_duration(lockfs_ctl_now_ms() - at, d, sizeof(d));
		snprintf(age, sizeof(age), " for %s", d);
	}
	const char *bound = lockfs_ctl_jstr(owner, "bound");
	const char *slug = lockfs_ctl_jstr(owner, "slug");
	if (json_is_true(json_object_get(owner, "foreign")) || !h)
		return xasprintf("held by a foreign lock (no lockfs record)%s", age);
	if (bound && strcmp(bound, "slug") == 0 && slug)
		return xasprintf("held by slug %s%s", slug, age);
	const char *comm = lockfs_ctl_jstr(h, "comm");
	char who[160];
	long long pid;
	char *note = lockfs_ctl_holder_note(mnt, name, owner, h, false);
	if (lockfs_ctl_pid_here(h, &pid))
		snprintf(who, sizeof(who), "%s[%lld]%s%s", comm ? comm : "?", pid,
			 note ? " " : "", note ? note : "");
	else
		snprintf(who, sizeof(who), "%s%s%s", comm ? comm : "?", note ? " " : "",
			 note ? note : "");
	free(note);
	if (n > 1)
		return xasprintf("held shared by %s and %zu more%s", who, n - 1, age);
	return xasprintf("held by %s%s", who, age);
}
