/*
 * fd-lock bookkeeping: the open file each POSIX lock owner's grant came
 * through (fdlock.h).  Owners are the engine's keys ("posix:HEX"), files
 * the mount's handles: no FUSE here.  All with the stripe mutex held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdlock.h"
#include "table.h"

void lockfs_fdlock_granted_via(struct stripe *s, const char *name, const char *owner,
			       uint64_t file)
{
	struct fdlock_via *v;

	/* One entry per (name, owner): the file of its latest grant, so that
	 * a close of any other open file of NAME does not end it. */
	for (v = s->via_files; v; v = v->next) {
		if (strcmp(v->owner, owner) == 0 && strcmp(v->name, name) == 0) {
			v->file = file;
			return;
		}
	}
	v = calloc(1, sizeof(*v));
	if (!v || !(v->name = strdup(name))) {
		free(v);
		return;
	}
	snprintf(v->owner, sizeof(v->owner), "%s", owner);
	v->file = file;
	v->next = s->via_files;
	s->via_files = v;
}

struct fdlock_via *lockfs_fdlock_take_file(struct stripe *s, const char *name, uint64_t file)
{
	struct fdlock_via *taken = NULL;

	for (struct fdlock_via **pp = &s->via_files, *v; (v = *pp);) {
		if (v->file != file || strcmp(v->name, name) != 0) {
			pp = &v->next;
			continue;
		}
		*pp = v->next;
		v->next = taken;
		taken = v;
	}
	return taken;
}

void lockfs_fdlock_free(struct fdlock_via *v)
{
	while (v) {
		struct fdlock_via *next = v->next;

		free(v->name);
		free(v);
		v = next;
	}
}

void lockfs_fdlock_free_all(struct stripe *s)
{
	lockfs_fdlock_free(s->via_files);
	s->via_files = NULL;
}
