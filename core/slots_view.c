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

int lockfs_core_slot_waiters(struct lockfs_core *core, const char *name_given, char **text,
			     size_t *len)
{
	struct lockfs_slots *s = core->slots;
	char base[LOCKFS_NAME_MAX + 1], line[96];
	unsigned cap;
	size_t size = 1, used = 0;
	char *out;

	if (lockfs_slots_base_of(name_given, base, &cap) < 0 || !s)
		return -ENOENT;
	out = malloc(size);
	if (!out)
		return -ENOMEM;
	pthread_mutex_lock(&s->mu);
	for (struct slot_waiter *x = s->waiters; x; x = x->next) {
		int n;
		char *more;

		if (strcmp(x->base, base) != 0)
			continue;
		n = snprintf(line, sizeof(line), "{\"pid\":%d,\"uid\":%u,\"slots\":%u}\n",
			     (int)x->caller.tid, (unsigned)x->caller.uid, x->cap);
		more = realloc(out, size + (size_t)n);
		if (!more)
			break;
		out = more;
		memcpy(out + used, line, (size_t)n);
		used += (size_t)n;
		size += (size_t)n;
	}
	pthread_mutex_unlock(&s->mu);
	out[used] = '\0';
	*text = out;
	*len = used;
	return 0;
}
