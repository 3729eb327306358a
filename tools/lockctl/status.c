/* lockctl status: the held locks as a table or as JSON. */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sysexits.h>
#include <unistd.h>

#include <jansson.h>

#include "lockctl.h"

/* ------------------------------------------------------------------ */
/* status */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Display width of UTF-8 text (one column per code point). */
static size_t text_width(const char *s)
{
	size_t w = 0;
	for (; *s; s++)
		if (((unsigned char)*s & 0xc0) != 0x80)
			w++;
	return w;
}

enum column {
	COL_NAME, COL_MODE, COL_HOLDER, COL_PID, COL_USER, COL_HOST, COL_CONTAINER, COL_AGE,
	COL_LEASE, COL_WAITERS, COL_OPERATION, NCOLS
};
static const char *const COLS[NCOLS] = {
	"NAME", "MODE", "HOLDER", "PID", "USER", "HOST", "CONTAINER", "AGE", "LEASE", "WAITERS",
	"OPERATION",
};

/* Characters of a 64-hex container id shown, as podman ps and docker ps
 * show it. */
#define SHORT_ID 12

struct row {
	char *cell[NCOLS];
};

struct table {
	struct row *rows;
	size_t n, cap;
};

/* A cell: a copy of TEXT made printable (control characters, line
 * separators and bidi controls shown as '?'), or "-". */
static char *cell(const char *text)
{
	char *s = strdup(text && *text ? text : "-");
	if (!s)
		oom();
	lockfs_ctl_printable(s);
	return s;
}

/* The CONTAINER cell of HOLDER: a 64-hex id cut to SHORT_ID characters;
 * a name (lxc, systemd-nspawn) whole; "-" for none. */
static char *container_cell(const json_t *holder)
{
	const char *id = lockfs_ctl_jstr(holder, "container");
	char buf[SHORT_ID + 1];

	if (id && strlen(id) == 64 && strspn(id, "0123456789abcdef") == 64) {
		memcpy(buf, id, SHORT_ID);
		buf[SHORT_ID] = '\0';
		return cell(buf);
	}
	return cell(id);
}

static void table_add(struct table *t, const char *mnt, const char *name,
		      const json_t *owner, const json_t *holder, size_t nwaiters, long long now)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 16;
		t->rows = realloc(t->rows, t->cap * sizeof(*t->rows));
		if (!t->rows)
			oom();
	}
	struct row *r = &t->rows[t->n++];
	bool foreign = json_is_true(json_object_get(owner, "foreign")) || !holder;
	char buf[64];
	long long v;

	r->cell[COL_NAME] = cell(lockfs_ctl_jstr(owner, "resource"));
	const char *mode = lockfs_ctl_jstr(owner, "mode");
	/* A slotted name's row is one holder of one slot: "slot K/N", and
	 * that slot's own binding, slug, lease and operation. */
	long long slot, nslots;
	bool slotted = lockfs_ctl_jint(owner, "slots", &nslots) && holder &&
		       lockfs_ctl_jint(holder, "slot", &slot);
	const json_t *per = slotted ? holder : owner;
	if (slotted) {
		snprintf(buf, sizeof(buf), "slot %lld/%lld", slot, nslots);
		r->cell[COL_MODE] = cell(buf);
	} else {
		/* Before issue 4 every lock was exclusive. */
		r->cell[COL_MODE] = cell(foreign ? NULL : mode && strcmp(mode, "shared") == 0
					 ? "SH" : "EX");
	}
	const char *bound = lockfs_ctl_jstr(per, "bound");
	const char *slug = lockfs_ctl_jstr(per, "slug");
	if (foreign) {
		r->cell[COL_HOLDER] = cell(NULL);
	} else if (bound && strcmp(bound, "slug") == 0 && slug) {
		char *s = xasprintf("slug:%s", slug);
		r->cell[COL_HOLDER] = cell(s);
		free(s);
	} else {
		/* What keeps a lock whose holder exited, or that the holder
		 * lives outside our pid namespace (holder_view.c). */
		const char *comm = lockfs_ctl_jstr(holder, "comm");
		char *note = lockfs_ctl_holder_note(mnt, name, owner, holder, true);
		char *s = xasprintf("%s%s", comm ? comm : "?", note ? note : "");
		r->cell[COL_HOLDER] = cell(s);
		free(s);
		free(note);
	}
	/* The pid as our own /proc shows that process: inside a container,
	 * its ns_pid; a holder outside our pid namespace has none here. */
	if (!foreign && lockfs_ctl_pid_here(holder, &v)) {
		snprintf(buf, sizeof(buf), "%lld", v);
		r->cell[COL_PID] = cell(buf);
	} else {
		r->cell[COL_PID] = cell(NULL);
	}
	if (foreign) {
		r->cell[COL_USER] = cell(NULL);
	} else if (lockfs_ctl_jstr(holder, "user")) {
		r->cell[COL_USER] = cell(lockfs_ctl_jstr(holder, "user"));
	} else if (lockfs_ctl_jint(holder, "uid", &v)) {
		snprintf(buf, sizeof(buf), "%lld", v);
		r->cell[COL_USER] = cell(buf);
	} else {
		r->cell[COL_USER] = cell(NULL);
	}
	r->cell[COL_HOST] = cell(foreign ? NULL : lockfs_ctl_jstr(holder, "host"));
	r->cell[COL_CONTAINER] = foreign ? cell(NULL) : container_cell(holder);
	if (lockfs_ctl_acquired_ms(foreign ? NULL : holder, owner, &v)) {
		lockfs_ctl_fmt_duration(now - v, buf, sizeof(buf));
		r->cell[COL_AGE] = cell(buf);
	} else {
		r->cell[COL_AGE] = cell(NULL);
	}
	json_t *lease = json_object_get(per, "lease");
	if (json_is_object(lease) && lockfs_ctl_jint(lease, "expires_at_ms", &v)) {
		if (v <= now)
			snprintf(buf, sizeof(buf), "expired");
		else
			lockfs_ctl_fmt_duration(v - now, buf, sizeof(buf));
		r->cell[COL_LEASE] = cell(buf);
	} else {
		r->cell[COL_LEASE] = cell(NULL);
	}
	snprintf(buf, sizeof(buf), "%zu", nwaiters);
	r->cell[COL_WAITERS] = cell(buf);
	r->cell[COL_OPERATION] = cell(lockfs_ctl_jstr(per, "operation"));
}

static void table_print(const struct table *t)
{
	size_t width[NCOLS];
	for (int c = 0; c < NCOLS; c++) {
		width[c] = strlen(COLS[c]);
		for (size_t i = 0; i < t->n; i++) {
			size_t w = text_width(t->rows[i].cell[c]);
			if (w > width[c])
				width[c] = w;
		}
	}
	for (size_t i = 0; i <= t->n; i++) {
		for (int c = 0; c < NCOLS; c++) {
			const char *s = i == 0 ? COLS[c] : t->rows[i - 1].cell[c];
			if (c == NCOLS - 1) {
				fputs(s, stdout);
			} else {
				/* numbers right-aligned, like lslocks */
				bool right = c == COL_PID || c == COL_WAITERS;
				size_t pad = width[c] - text_width(s);
				if (right)
					printf("%*s%s ", (int)pad, "", s);
				else
					printf("%s%*s ", s, (int)pad, "");
			}
		}
		putchar('\n');
	}
}

/* Give holder object H a "pid_here": its pid as our own pid namespace
 * sees it (the table's PID), or null when it is not a process here. */
static void set_pid_here(json_t *h)
{
	long long pid;

	if (!json_is_object(h))
		return;
	json_object_set_new(h, "pid_here", lockfs_ctl_pid_here(h, &pid) ? json_integer(pid)
								  : json_null());
}

/* Every holder of OWNER gets its pid_here. */
static void set_pids_here(json_t *owner)
{
	json_t *hs = json_object_get(owner, "holders");

	set_pid_here(json_object_get(owner, "holder"));
	for (size_t i = 0; json_is_array(hs) && i < json_array_size(hs); i++)
		set_pid_here(json_array_get(hs, i));
}

static void table_free(struct table *t)
{
	for (size_t i = 0; i < t->n; i++)
		for (int c = 0; c < NCOLS; c++)
			free(t->rows[i].cell[c]);
	free(t->rows);
}

int lockfs_ctl_list_names(const char *mnt, char ***names, size_t *count)
{
	DIR *dir = opendir(mnt);
	if (!dir)
		return -errno;
	size_t n = 0, cap = 16;
	char **v = malloc(cap * sizeof(*v));
	if (!v)
		oom();
	struct dirent *de;
	errno = 0;
	while ((de = readdir(dir))) {
		if (de->d_name[0] == '.')
			continue; /* ., .., .log, .flock: never lock names */
		if (n == cap) {
			cap *= 2;
			v = realloc(v, cap * sizeof(*v));
			if (!v)
				oom();
		}
		v[n] = strdup(de->d_name);
		if (!v[n])
			oom();
		n++;
	}
	int e = errno;
	closedir(dir);
	if (e) {
		for (size_t i = 0; i < n; i++)
			free(v[i]);
		free(v);
		return -e;
	}
	qsort(v, n, sizeof(*v), cmp_str);
	*names = v;
	*count = n;
	return 0;
}

/* Append ".slots/NAME" for every slotted NAME with a slot held (M/.slots,
 * docs/slots.md; a daemon without slots has none) to *NAMES: their owner
 * and waiters are read under that path like a lock's. */
static void add_slotted(const char *mnt, char ***names, size_t *count)
{
	char *dir = xasprintf("%s/.slots", mnt);
	char **slotted;
	size_t n;
	if (lockfs_ctl_list_names(dir, &slotted, &n) == 0) {
		*names = realloc(*names, (*count + n + 1) * sizeof(**names));
		if (!*names)
			oom();
		for (size_t i = 0; i < n; i++) {
			(*names)[(*count)++] = xasprintf(".slots/%s", slotted[i]);
			free(slotted[i]);
		}
		free(slotted);
	}
	free(dir);
}

int lockfs_ctl_status(const struct opts *o, const char *mnt)
{
	char **names = NULL;
	size_t count = 0;
	char *one[1];
	if (o->name) {
		one[0] = (char *)o->name;
		names = one;
		count = 1;
	} else {
		int rc = lockfs_ctl_list_names(mnt, &names, &count);
		if (rc < 0)
			return fail(errno_status(-rc), "cannot list %s: %s", mnt, strerror(-rc));
		add_slotted(mnt, &names, &count);
	}
	json_t *all = json_array();
	struct table t = { 0 };
	long long now = lockfs_ctl_now_ms();
	int status = 0;
	size_t shown = 0;
	for (size_t i = 0; i < count; i++) {
		int err;
		json_t *owner = lockfs_ctl_read_owner(mnt, names[i], &err);
		if (!owner) {
			if (err == ENOENT) {
				/* released since the listing; or NAME not held */
				if (o->name)
					status = fail(EXIT_FAIL, "%s is not held", names[i]);
				continue;
			}
			if (err == EINVAL || err == ENAMETOOLONG)
				status = fail(EX_USAGE, "'%s' is not a valid lock name: %s",
					      names[i], strerror(err));
			else
				status = fail(errno_status(err), "%s: cannot read owner: %s",
					      names[i], err == EBADMSG ? "not JSON" : strerror(err));
			continue;
		}
		json_t *waiters = lockfs_ctl_read_waiters(mnt, names[i]);
		size_t nwaiters = json_array_size(waiters);
		if (o->json) {
			set_pids_here(owner);
			json_object_set(owner, "waiters", waiters);
			json_array_append(all, owner);
		} else {
			json_t *hs = json_object_get(owner, "holders");
			/* A slotted name: one row per slot holder, however many. */
			if (json_is_array(hs) && (json_array_size(hs) > 1 ||
						  json_object_get(owner, "slots"))) {
				for (size_t h = 0; h < json_array_size(hs); h++)
					table_add(&t, mnt, names[i], owner, json_array_get(hs, h), nwaiters,
					  now);
			} else {
				const json_t *h = NULL;
				lockfs_ctl_holders_of(owner, &h);
				table_add(&t, mnt, names[i], owner, h, nwaiters, now);
			}
		}
		shown++;
		json_decref(waiters);
		json_decref(owner);
	}
	if (o->json) {
		/* ASCII only: JSON escapes C0 itself, and \uXXXX for the rest
		 * keeps C1, U+2028 and bidi controls off a terminal too; a
		 * program that parses the output gets the same strings. */
		char *text = json_dumps(all, JSON_INDENT(2) | JSON_ENSURE_ASCII);
		if (!text)
			oom();
		puts(text);
		free(text);
	} else if (shown || !o->name) {
		table_print(&t);
		if (!o->name)
			lockfs_ctl_last_deadlock(mnt);
	}
	json_decref(all);
	table_free(&t);
	if (names != one) {
		for (size_t i = 0; i < count; i++)
			free(names[i]);
		free(names);
	}
	if (fflush(stdout) != 0 || ferror(stdout))
		return fail(EXIT_FAIL, "writing the status: %s", strerror(errno));
	return status;
}
