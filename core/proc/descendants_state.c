/*
 * The state of the descendants module (descendants_state.h): the entries
 * (one per process the module knows, by pid), the roots (one per watched
 * holder) and the rootsets that tie them, with the changes both halves
 * make to them -- the tracking (descendants.c) from the process events, the
 * scan (descendants_scan.c) from /proc.  Below both, so that they call it
 * and never each other both ways.  Every function is called with d->mu
 * held.
 */
#include <errno.h>
#include <stdlib.h>

#include "descendants_state.h"

/* ---- entries ------------------------------------------------------------ */

struct entry *lockfs_desc_entry_find(struct lockfs_descendants *d, pid_t pid)
{
	for (struct entry *e = d->entries[(unsigned)pid & (d->nbuckets - 1)]; e; e = e->next)
		if (e->pid == pid)
			return e;
	return NULL;
}

/* Double the table when it is full; on failure it just stays slower. */
static void entries_grow(struct lockfs_descendants *d)
{
	size_t n = d->nbuckets * 2;
	struct entry **v = calloc(n, sizeof(*v));

	if (!v)
		return;
	for (size_t i = 0; i < d->nbuckets; i++) {
		while (d->entries[i]) {
			struct entry *e = d->entries[i];

			d->entries[i] = e->next;
			e->next = v[(unsigned)e->pid & (n - 1)];
			v[(unsigned)e->pid & (n - 1)] = e;
		}
	}
	free(d->entries);
	d->entries = v;
	d->nbuckets = n;
}

struct entry *lockfs_desc_entry_add(struct lockfs_descendants *d, pid_t pid,
				     unsigned long long start)
{
	struct entry *e = calloc(1, sizeof(*e));
	struct entry **b;

	if (!e)
		return NULL;
	if (d->nentries >= d->nbuckets)
		entries_grow(d);
	e->pid = pid;
	e->start = start;
	b = &d->entries[(unsigned)pid & (d->nbuckets - 1)];
	e->next = *b;
	*b = e;
	d->nentries++;
	return e;
}

static void entry_unlink(struct lockfs_descendants *d, struct entry *e)
{
	for (struct entry **pp = &d->entries[(unsigned)e->pid & (d->nbuckets - 1)]; *pp;
	     pp = &(*pp)->next) {
		if (*pp == e) {
			*pp = e->next;
			d->nentries--;
			return;
		}
	}
}

/* ---- roots and rootsets --------------------------------------------------- */

void lockfs_desc_root_put(struct root *r)
{
	if (!r->listed && !r->has_entry && r->holds == 0)
		free(r);
}

void lockfs_desc_set_put(struct rootset *s)
{
	if (!s || --s->refs > 0)
		return;
	for (unsigned i = 0; i < s->n; i++) {
		s->v[i].root->holds--;
		lockfs_desc_root_put(s->v[i].root);
	}
	free(s);
}

const struct member *lockfs_desc_set_find(const struct rootset *s, const struct root *r)
{
	for (unsigned i = 0; s && i < s->n; i++)
		if (s->v[i].root == r)
			return &s->v[i];
	return NULL;
}

/* A new set of the N members in V (no root twice).  NULL when out of
 * memory. */
struct rootset *lockfs_desc_set_new(const struct member *v, unsigned n)
{
	struct rootset *s = malloc(sizeof(*s) + n * sizeof(s->v[0]));

	if (!s)
		return NULL;
	s->refs = 1;
	s->n = n;
	for (unsigned i = 0; i < n; i++) {
		s->v[i] = v[i];
		v[i].root->holds++;
	}
	return s;
}

void lockfs_desc_entry_set_changed(struct entry *e)
{
	lockfs_desc_set_put(e->kids);
	e->kids = NULL;
}


/*
 * Unlist R once nothing needs to find it: no lock depends on it, and its
 * holder lives (it let go of its locks) or none of its descendants does.
 */
void lockfs_desc_root_maybe_unlist(struct lockfs_descendants *d, struct root *r)
{
	struct root **pp;

	if (!r->listed || r->refs > 0 || (r->dead && r->live > 0))
		return;
	for (pp = &d->roots[(unsigned)r->pid % ROOT_BUCKETS]; *pp; pp = &(*pp)->next) {
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	}
	r->listed = false;
	if (r->dead)
		d->ndead--;
	if (r->has_entry) {
		struct entry *e = lockfs_desc_entry_find(d, r->pid);

		if (e && e->root == r) {
			e->root = NULL;
			lockfs_desc_entry_set_changed(e);
			r->has_entry = false;
			if (!e->set)
				lockfs_desc_entry_drop(d, e); /* nothing else made it interesting */
		}
	}
	lockfs_desc_root_put(r);
}

void lockfs_desc_root_mark_dead(struct lockfs_descendants *d, struct root *r)
{
	if (!r->dead && r->listed)
		d->ndead++;
	r->dead = true;
	r->version++;
}

/* Count E for R too: as a proven descendant, or as a CANDIDATE.  A proven
 * one stays proven; a candidate can be proven later. */
int lockfs_desc_entry_join(struct entry *e, struct root *r, bool candidate)
{
	const struct member *had = lockfs_desc_set_find(e->set, r);
	struct member v[SET_MAX];
	struct rootset *s;
	unsigned n = 0;

	if (had && (!had->candidate || candidate))
		return 0;
	for (unsigned i = 0; e->set && i < e->set->n && n < SET_MAX - 1; i++)
		if (e->set->v[i].root->listed && e->set->v[i].root != r)
			v[n++] = e->set->v[i];
	v[n++] = (struct member){ r, candidate };
	s = lockfs_desc_set_new(v, n);
	if (!s)
		return -ENOMEM;
	/* Every listed root it counted for is in the new set; the unlisted
	 * ones no longer matter. */
	lockfs_desc_set_put(e->set);
	e->set = s;
	lockfs_desc_entry_set_changed(e);
	if (!had)
		r->live++;
	r->version++;
	return 0;
}

/* Forget E: it is gone, or no root needs it.  Uncounts it everywhere. */
void lockfs_desc_entry_drop(struct lockfs_descendants *d, struct entry *e)
{
	struct rootset *s = e->set;

	entry_unlink(d, e);
	if (e->suspect)
		d->nsuspects--;
	if (e->root) {
		struct root *r = e->root;

		/* The holder's own process is gone: the root stays listed
		 * (its locks point to it) until its descendants are gone. */
		r->has_entry = false;
		e->root = NULL;
		lockfs_desc_root_mark_dead(d, r);
		lockfs_desc_root_maybe_unlist(d, r);
	}
	e->set = NULL;
	for (unsigned i = 0; s && i < s->n; i++) {
		struct root *r = s->v[i].root;

		if (r->live > 0)
			r->live--;
		r->version++;
		lockfs_desc_root_maybe_unlist(d, r); /* cannot free it: S still holds it */
	}
	lockfs_desc_set_put(s);
	lockfs_desc_set_put(e->kids);
	free(e);
}

/*
 * E is now in session SID: it no longer counts for the roots of another
 * known session (SID 0: it started a session of its own, so for none).
 * A descendant that leaves the holder's session is how a daemon is started
 * that does not keep its starter's lock (docs/holder.md).  Out of memory:
 * it keeps counting (a lock kept too long, never one lost).
 */
void lockfs_desc_entry_leave_session(struct lockfs_descendants *d, struct entry *e,
				     pid_t sid)
{
	struct rootset *old = e->set, *s = NULL;
	struct member v[SET_MAX];
	unsigned n = 0;

	if (!old)
		return;
	for (unsigned i = 0; i < old->n && n < SET_MAX; i++) {
		const struct root *r = old->v[i].root;

		if (sid > 0 && (r->sid <= 0 || r->sid == sid))
			v[n++] = old->v[i];
	}
	if (n == old->n)
		return;
	if (n == 0 && !e->root) {
		lockfs_desc_entry_drop(d, e); /* nothing else made it interesting */
		return;
	}
	if (n > 0 && !(s = lockfs_desc_set_new(v, n)))
		return;
	e->set = s;
	lockfs_desc_entry_set_changed(e);
	for (unsigned i = 0; i < old->n; i++) {
		struct root *r = old->v[i].root;

		if (lockfs_desc_set_find(s, r))
			continue;
		if (r->live > 0)
			r->live--;
		r->version++;
		lockfs_desc_root_maybe_unlist(d, r); /* cannot free it: OLD still holds it */
	}
	lockfs_desc_set_put(old);
}
