/*
 * The readers' watch lists, counted (follow.h): how many readers follow
 * every name, and per name how many follow it.  The store is told the
 * union only when it changes -- a second `lockctl watch gpu` costs nothing
 * -- and is told nothing while nobody reads.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "follow.h"
#include "store.h"

const char lockfs_follow_all[] = "";

struct followed_name {
	char *name;
	unsigned readers;
};

struct lockfs_follow {
	pthread_mutex_t mu;          /* everything below; held across the store's call */
	struct lockfs_backend *be;
	unsigned all;                /* readers that follow every name */
	struct followed_name *names; /* readers > 0 */
	size_t n, cap;
};

int lockfs_follow_new(struct lockfs_backend *be, struct lockfs_follow **out)
{
	struct lockfs_follow *f = calloc(1, sizeof(*f));

	if (!f)
		return -ENOMEM;
	pthread_mutex_init(&f->mu, NULL);
	f->be = be;
	*out = f;
	return 0;
}

void lockfs_follow_free(struct lockfs_follow *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n; i++)
		free(f->names[i].name);
	free(f->names);
	pthread_mutex_destroy(&f->mu);
	free(f);
}

static struct followed_name *find(struct lockfs_follow *f, const char *name)
{
	for (size_t i = 0; i < f->n; i++)
		if (strcmp(f->names[i].name, name) == 0)
			return &f->names[i];
	return NULL;
}

/* One reader more follows NAME: true if it is new to the set.  On no
 * memory the name is not followed (its events may be missing). */
static bool add_name(struct lockfs_follow *f, const char *name)
{
	struct followed_name *x = find(f, name);
	char *dup;

	if (x) {
		x->readers++;
		return false;
	}
	if (f->n == f->cap) {
		size_t cap = f->cap ? f->cap * 2 : 8;
		struct followed_name *v = realloc(f->names, cap * sizeof(*v));

		if (!v)
			return false;
		f->names = v;
		f->cap = cap;
	}
	if (!(dup = strdup(name)))
		return false;
	f->names[f->n++] = (struct followed_name){ .name = dup, .readers = 1 };
	return true;
}

/* One reader less follows NAME: true if nobody does any more. */
static bool remove_name(struct lockfs_follow *f, const char *name)
{
	struct followed_name *x = find(f, name);

	if (!x || --x->readers)
		return false;
	free(x->name);
	*x = f->names[--f->n];
	return true;
}

/* Count WATCH in (DELTA +1) or out (-1): did the union change? */
static bool count(struct lockfs_follow *f, const char *watch, int delta)
{
	bool changed = false;

	if (watch == LOCKFS_FOLLOW_NONE)
		return false;
	if (watch == LOCKFS_FOLLOW_ALL) {
		f->all += delta;
		return delta > 0 ? f->all == 1 : f->all == 0;
	}
	for (; *watch; watch += strlen(watch) + 1)
		changed |= delta > 0 ? add_name(f, watch) : remove_name(f, watch);
	return changed;
}

/* Tell the store the union now.  With F->mu held. */
static int tell(struct lockfs_follow *f)
{
	const char **v = f->n ? malloc(f->n * sizeof(*v)) : NULL;
	int rc;

	if (f->n && !v)
		return -ENOMEM;
	for (size_t i = 0; i < f->n; i++)
		v[i] = f->names[i].name;
	rc = lockfs_store_follow(f->be, f->all > 0, v, f->n);
	free(v);
	return rc;
}

int lockfs_follow_change(struct lockfs_follow *f, const char *old, const char *new_)
{
	bool changed;
	int rc = 0;

	if (!f || old == new_)
		return 0;
	pthread_mutex_lock(&f->mu);
	/* NEW first: a name in both lists is never out of the set between. */
	changed = count(f, new_, +1);
	changed |= count(f, old, -1);
	if (changed)
		rc = tell(f);
	pthread_mutex_unlock(&f->mu);
	return rc;
}
