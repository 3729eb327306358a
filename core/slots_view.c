/*
 * What the mount shows of slotted names (docs/slots.md): a lookup of
 * M/.slots/NAME, its `owner` listing every holder with its slot, `ls
 * M/.slots/` and NAME's `waiters`.  Only reads: the takes, the waiters
 * and the line are slots.c's.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/backend.h"
#include "lockfs/name.h"
#include "engine.h"
#include "lock/table.h"
#include "slots_state.h"

int lockfs_core_slot_stat(struct lockfs_core *core, const char *name_given,
			  struct lockfs_lock_stat *out)
{
	char base[LOCKFS_NAME_MAX + 1], name[LOCKFS_NAME_MAX + 1];
	struct held_slots h;
	unsigned cap;
	int rc;

	if (lockfs_slots_base_of(name_given, base, &cap) < 0 || !lockfs_slots_served(core))
		return -ENOENT;
	rc = lockfs_slots_held(core, base, &h);
	if (rc < 0 && rc != -ERANGE)
		return rc;
	for (unsigned k = 0; k < h.cap; k++) {
		if (!h.held[k])
			continue;
		lockfs_slot_name(name, sizeof(name), base, k, h.cap);
		if (lockfs_core_stat(core, name, out) == 0) {
			/* The view stands for the slotted name, whichever
			 * grants hold it: one node while any slot is held. */
			out->generation = 1;
			out->identity = 1;
			return 0;
		}
	}
	return -ENOENT;
}

/* Slot K's `owner`, its holders each with "slot": K, appended to ARR;
 * its capacity into *CAP. */
static void add_holders(struct lockfs_core *core, const char *name, unsigned k,
			const struct lockfs_caller *reader, json_t *arr)
{
	char *text = NULL;
	size_t len = 0;
	json_t *o, *hs, *v;
	size_t i;

	if (lockfs_core_owner(core, name, reader, &text, &len) < 0)
		return;
	o = json_loadb(text, len, 0, NULL);
	free(text);
	if (!o)
		return;
	hs = json_object_get(o, "holders");
	json_array_foreach(hs, i, v) {
		json_t *one = json_deep_copy(v);

		if (!one)
			continue;
		json_object_set_new(one, "slot", json_integer(k));
		json_object_set(one, "lease", json_object_get(o, "lease"));
		json_object_set(one, "operation", json_object_get(o, "operation"));
		if (json_object_get(o, "token"))
			json_object_set(one, "token", json_object_get(o, "token"));
		json_array_append_new(arr, one);
	}
	json_decref(o);
}

int lockfs_core_slot_owner(struct lockfs_core *core, const char *name_given,
			   const struct lockfs_caller *reader, char **json, size_t *len)
{
	char base[LOCKFS_NAME_MAX + 1], name[LOCKFS_NAME_MAX + 1];
	struct held_slots h;
	json_t *o, *arr;
	unsigned cap;
	char *text;
	int rc;

	if (lockfs_slots_base_of(name_given, base, &cap) < 0 || !lockfs_slots_served(core))
		return -ENOENT;
	rc = lockfs_slots_held(core, base, &h);
	if (rc < 0 && rc != -ERANGE)
		return rc;
	if (!h.n)
		return -ENOENT;
	arr = json_array();
	for (unsigned k = 0; arr && k < h.cap; k++) {
		if (!h.held[k])
			continue;
		lockfs_slot_name(name, sizeof(name), base, k, h.cap);
		add_holders(core, name, k, reader, arr);
	}
	o = arr ? json_pack("{s:s, s:i, s:i, s:o}", "resource", base, "slots", (int)h.cap,
			    "held", (int)json_array_size(arr), "holders", arr) : NULL;
	if (!o)
		return -ENOMEM;
	text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(o);
	if (!text)
		return -ENOMEM;
	/* One newline after it, as every `owner` ends. */
	*len = strlen(text) + 1;
	*json = malloc(*len + 1);
	if (*json) {
		memcpy(*json, text, *len - 1);
		(*json)[*len - 1] = '\n';
		(*json)[*len] = '\0';
	}
	free(text);
	return *json ? 0 : -ENOMEM;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int lockfs_core_slot_list(struct lockfs_core *core, char ***out, size_t *count)
{
	char **names, **bases;
	size_t n, m = 0;
	int rc;

	*out = NULL;
	*count = 0;
	if (!lockfs_slots_served(core)) {
		*out = calloc(1, sizeof(char *));
		return *out ? 0 : -ENOMEM;
	}
	rc = lockfs_table_names(&core->table, &names, &n);
	if (rc < 0)
		return rc;
	bases = calloc(n + 1, sizeof(*bases));
	for (size_t i = 0; bases && i < n; i++) {
		const char *b;
		unsigned k, cap;

		if (lockfs_slot_name_parse(names[i], &b, &k, &cap))
			bases[m++] = strdup(b);
	}
	lockfs_table_names_free(names, n);
	if (!bases)
		return -ENOMEM;
	qsort(bases, m, sizeof(*bases), cmp_names);
	/* One entry per slotted name, however many of its slots are held. */
	n = 0;
	for (size_t i = 0; i < m; i++) {
		if (!bases[i] || (n && strcmp(bases[n - 1], bases[i]) == 0)) {
			free(bases[i]);
			continue;
		}
		bases[n++] = bases[i];
	}
	bases[n] = NULL;
	*out = bases;
	*count = n;
	return 0;
}

/* Append LINE (N bytes) to *OUT (*USED of them in use).  false: no memory. */
static bool append(char **out, size_t *used, const char *line, size_t n)
{
	char *more = realloc(*out, *used + n + 1);

	if (!more)
		return false;
	memcpy(more + *used, line, n);
	*used += n;
	more[*used] = '\0';
	*out = more;
	return true;
}

/* One waiter's line from V (a holder of `owner`, or a line of `waiters`):
 * its pid, uid and host as V has them (null for a key lockfs did not
 * write), SLOTS (0: null). */
static bool append_waiter(char **out, size_t *used, json_t *v, unsigned slots)
{
	json_t *o = json_object();
	char *text;
	bool ok;

	if (!o)
		return false;
	json_object_set(o, "pid", json_object_get(v, "pid") ? json_object_get(v, "pid")
							     : json_null());
	json_object_set(o, "uid", json_object_get(v, "uid") ? json_object_get(v, "uid")
							     : json_null());
	json_object_set_new(o, "slots", slots ? json_integer(slots) : json_null());
	json_object_set(o, "host", json_object_get(v, "host") ? json_object_get(v, "host")
							       : json_null());
	text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(o);
	ok = text && append(out, used, text, strlen(text)) && append(out, used, "\n", 1);
	free(text);
	return ok;
}

/* Across hosts: every host's waiters of BASE in the line's order -- the
 * holder of ".slotline:BASE" (the head, waiting for a free slot), then
 * that lock's waiters, as its `waiters` has them (etcd's line) -- with
 * the count NAME's slots have.  Into *OUT. */
static int line_waiters(struct lockfs_core *core, const char *base, char **out, size_t *used)
{
	char line[LOCKFS_NAME_MAX + 1], *text = NULL;
	struct held_slots h;
	size_t len = 0, i;
	json_t *o, *v;
	bool ok = true;

	lockfs_slot_line_name(line, sizeof(line), base);
	(void)lockfs_slots_held(core, base, &h); /* h.cap 0 (null) if unknown */
	if (lockfs_core_owner(core, line, NULL, &text, &len) == 0) {
		o = json_loadb(text, len, 0, NULL);
		json_array_foreach(json_object_get(o, "holders"), i, v)
			ok = ok && append_waiter(out, used, v, h.cap);
		json_decref(o);
	}
	free(text);
	text = NULL;
	if (ok && lockfs_core_waiters(core, line, &text, &len) == 0)
		for (char *p = text, *nl; ok && p && *p; p = nl ? nl + 1 : NULL) {
			nl = strchr(p, '\n');
			o = json_loadb(p, nl ? (size_t)(nl - p) : strlen(p), 0, NULL);
			if (o)
				ok = append_waiter(out, used, o, h.cap);
			json_decref(o);
		}
	free(text);
	return ok ? 0 : -ENOMEM;
}

int lockfs_core_slot_waiters(struct lockfs_core *core, const char *name_given, char **text,
			     size_t *len)
{
	struct lockfs_slots *s = core->slots;
	char base[LOCKFS_NAME_MAX + 1], line[96];
	unsigned cap;
	size_t used = 0;
	char *out;
	int rc = 0;

	if (lockfs_slots_base_of(name_given, base, &cap) < 0 || !s)
		return -ENOENT;
	out = calloc(1, 1);
	if (!out)
		return -ENOMEM;
	if (lockfs_slots_across_hosts(core)) {
		rc = line_waiters(core, base, &out, &used);
	} else {
		pthread_mutex_lock(&s->mu);
		for (struct slot_waiter *x = s->waiters; x && rc == 0; x = x->next) {
			int n;

			if (strcmp(x->base, base) != 0)
				continue;
			n = snprintf(line, sizeof(line), "{\"pid\":%d,\"uid\":%u,\"slots\":%u}\n",
				     (int)x->caller.tid, (unsigned)x->caller.uid, x->cap);
			if (!append(&out, &used, line, (size_t)n))
				rc = -ENOMEM;
		}
		pthread_mutex_unlock(&s->mu);
	}
	if (rc < 0) {
		free(out);
		return rc;
	}
	*text = out;
	*len = used;
	return 0;
}
