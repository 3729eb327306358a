/*
 * The kernel's view of lock directories and .flock files: node ids and
 * lookup counts.
 * Each acquisition of a name gets its own node (keyed by name and
 * generation): the kernel marks a directory dead once it is rmdir'ed, so a
 * lock taken again must not come back under the old inode number.
 * Kept apart from the lock state (core/), which the kernel never pins: a
 * lock can be released while the kernel still holds its inode, and the
 * node then answers for its name as it is now to what only looks, and
 * ENOENT to what would change the lock it was made for (attr.c), until it
 * is forgotten.
 *
 * The kernel forgets an inode only when its dentry goes, and an unused
 * dentry goes only under memory pressure: a node the kernel still knows
 * may stay for ever, and one uid could make them without end (look up a
 * lock held for a moment, open and close .flock/NAME for ever new NAMEs).
 * So the daemon keeps a node only while something needs it: a node with
 * an open file or listing stays; every other one ("idle") is on the LRU
 * list of the uid that last looked it up, and past IDLE_MAX idle nodes of
 * one uid the oldest is dropped here, the kernel not told (no
 * notification: see ops.c).  That is safe because every entry we give has
 * a zero entry timeout, so the kernel looks a name up again before any
 * path walk uses the node; what is left is a request the kernel sends by
 * node id alone between a lookup and its use (the open after a lookup,
 * stat's getattr), and for an unknown id that is ESTALE, on which the VFS
 * walks the path again with a fresh lookup.  Node ids are never reused, so
 * a dropped id never names anything else.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "connstate.h"
#include "fs.h"

#define BUCKETS 1024
#define UID_BUCKETS 64

struct node {
	struct node *by_name_next;
	struct node *by_id_next;
	struct node *older, *newer; /* on its uid's idle list (when idle) */
	uint64_t id;
	uint64_t generation; /* which acquisition of NAME this node shows */
	uint64_t nlookup;
	uint64_t open;       /* open files and listings of it */
	uid_t uid;           /* who looked it up last: whose idle list */
	bool idle;           /* on an idle list */
	/* Its copy in the connection's state (connstate.c), kept up to date
	 * under t->mu for a successor, or NULL. */
	struct lockfs_saved_node *saved;
	char name[];
};

/* One uid's idle nodes, oldest first. */
struct idle_list {
	struct idle_list *next;
	uid_t uid;
	size_t count;
	struct node *oldest, *newest;
};

struct inodes {
	pthread_mutex_t mu;
	size_t idle_max;                     /* per uid; fixed at creation */
	uint64_t next_id;                    /* protected by mu */
	struct node *by_name[BUCKETS];       /* protected by mu */
	struct node *by_id[BUCKETS];         /* protected by mu */
	struct idle_list *idle[UID_BUCKETS]; /* protected by mu; no empty list */
};

static unsigned name_hash(const char *s)
{
	uint32_t h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h % BUCKETS;
}

struct inodes *lockfs_inodes_new(size_t idle_per_uid)
{
	struct inodes *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	pthread_mutex_init(&t->mu, NULL);
	t->next_id = 1;
	t->idle_max = idle_per_uid ? idle_per_uid : 1;
	return t;
}

void lockfs_inodes_free(struct inodes *t)
{
	if (!t)
		return;
	for (int i = 0; i < BUCKETS; i++) {
		struct node *n = t->by_id[i];

		while (n) {
			struct node *next = n->by_id_next;

			free(n);
			n = next;
		}
	}
	for (int i = 0; i < UID_BUCKETS; i++) {
		struct idle_list *l = t->idle[i];

		while (l) {
			struct idle_list *next = l->next;

			free(l);
			l = next;
		}
	}
	pthread_mutex_destroy(&t->mu);
	free(t);
}

/* The idle list of UID, made when MAKE (NULL if none, or out of memory).
 * Called with t->mu held. */
static struct idle_list *idle_list_of(struct inodes *t, uid_t uid, bool make)
{
	struct idle_list **pp = &t->idle[uid % UID_BUCKETS];

	for (; *pp; pp = &(*pp)->next)
		if ((*pp)->uid == uid)
			return *pp;
	if (!make)
		return NULL;
	*pp = calloc(1, sizeof(**pp));
	if (*pp)
		(*pp)->uid = uid;
	return *pp;
}

/* Take N off its idle list; the list goes when empty.  Called with t->mu held. */
static void idle_del(struct inodes *t, struct node *n)
{
	struct idle_list *l, **pp;

	if (!n->idle)
		return;
	n->idle = false;
	l = idle_list_of(t, n->uid, false);
	if (!l)
		return;
	if (n->older)
		n->older->newer = n->newer;
	else
		l->oldest = n->newer;
	if (n->newer)
		n->newer->older = n->older;
	else
		l->newest = n->older;
	n->older = n->newer = NULL;
	if (--l->count > 0)
		return;
	for (pp = &t->idle[l->uid % UID_BUCKETS]; *pp != l; pp = &(*pp)->next)
		;
	*pp = l->next;
	free(l);
}

/* Out of both tables and freed.  Called with t->mu held. */
static void node_drop(struct inodes *t, struct node *n)
{
	struct node **pp;

	idle_del(t, n);
	for (pp = &t->by_id[n->id % BUCKETS]; *pp != n; pp = &(*pp)->by_id_next)
		;
	*pp = n->by_id_next;
	for (pp = &t->by_name[name_hash(n->name)]; *pp != n; pp = &(*pp)->by_name_next)
		;
	*pp = n->by_name_next;
	lockfs_connstate_node_put(n->saved);
	free(n);
}

/* N (not open) is the newest idle node of its uid; that uid's oldest go
 * past idle_max.  Out of memory for the list: N stays, unlisted, until the
 * kernel forgets it.  Called with t->mu held. */
static void idle_add(struct inodes *t, struct node *n)
{
	struct idle_list *l = idle_list_of(t, n->uid, true);

	if (!l)
		return;
	n->idle = true;
	n->older = l->newest;
	n->newer = NULL;
	if (l->newest)
		l->newest->newer = n;
	else
		l->oldest = n;
	l->newest = n;
	l->count++;
	/* idle_max >= 1: the oldest is never N, and L keeps N. */
	while (l->count > t->idle_max)
		node_drop(t, l->oldest);
}

/* Called with t->mu held. */
static struct node *find_name(struct inodes *t, const char *name, uint64_t generation)
{
	for (struct node *n = t->by_name[name_hash(name)]; n; n = n->by_name_next)
		if (n->generation == generation && strcmp(n->name, name) == 0)
			return n;
	return NULL;
}

/* One more lookup of N by UID.  Called with t->mu held. */
static uint64_t node_ref(struct inodes *t, struct node *n, uid_t uid)
{
	n->nlookup++;
	if (n->saved) {
		n->saved->nlookup = n->nlookup;
		n->saved->uid = uid;
	}
	if (n->open == 0) {
		idle_del(t, n);
		n->uid = uid;
		idle_add(t, n); /* newest: the last to go */
	} else {
		n->uid = uid;
	}
	return n->id;
}

uint64_t lockfs_inodes_ref(struct inodes *t, const char *name, uint64_t generation, uid_t uid)
{
	unsigned h = name_hash(name);
	struct node *n;
	uint64_t id = 0;
	size_t len;

	pthread_mutex_lock(&t->mu);
	n = find_name(t, name, generation);
	if (!n) {
		len = strlen(name);
		n = calloc(1, sizeof(*n) + len + 1);
		if (!n)
			goto out;
		memcpy(n->name, name, len + 1);
		n->id = t->next_id++;
		lockfs_connstate_set_next_node(t->next_id);
		n->generation = generation;
		n->uid = uid;
		n->saved = lockfs_connstate_node_get();
		if (n->saved) {
			n->saved->generation = generation;
			n->saved->nlookup = 0;
			memcpy(n->saved->name, name, len + 1);
			__atomic_store_n(&n->saved->id, n->id, __ATOMIC_RELEASE);
		}
		n->by_name_next = t->by_name[h];
		t->by_name[h] = n;
		n->by_id_next = t->by_id[n->id % BUCKETS];
		t->by_id[n->id % BUCKETS] = n;
	}
	id = node_ref(t, n, uid);
out:
	pthread_mutex_unlock(&t->mu);
	return id;
}

uint64_t lockfs_inodes_ref_open(struct inodes *t, const char *name, uint64_t generation, uid_t uid)
{
	struct node *n;
	uint64_t id = 0;

	pthread_mutex_lock(&t->mu);
	n = find_name(t, name, generation);
	if (n && n->open > 0)
		id = node_ref(t, n, uid);
	pthread_mutex_unlock(&t->mu);
	return id;
}

/* Called with t->mu held. */
static struct node *find_id(struct inodes *t, uint64_t id)
{
	for (struct node *n = t->by_id[id % BUCKETS]; n; n = n->by_id_next)
		if (n->id == id)
			return n;
	return NULL;
}

int lockfs_inodes_name(struct inodes *t, uint64_t id, char *buf, uint64_t *generation)
{
	struct node *n;
	int rc = -ESTALE;

	pthread_mutex_lock(&t->mu);
	n = find_id(t, id);
	if (n) {
		strncpy(buf, n->name, NAME_MAX);
		buf[NAME_MAX] = '\0';
		*generation = n->generation;
		rc = 0;
	}
	pthread_mutex_unlock(&t->mu);
	return rc;
}

int lockfs_inodes_open(struct inodes *t, uint64_t id)
{
	struct node *n;
	int rc = -ESTALE;

	pthread_mutex_lock(&t->mu);
	n = find_id(t, id);
	if (n) {
		idle_del(t, n);
		n->open++;
		rc = 0;
	}
	pthread_mutex_unlock(&t->mu);
	return rc;
}

void lockfs_inodes_close(struct inodes *t, uint64_t id)
{
	struct node *n;

	pthread_mutex_lock(&t->mu);
	n = find_id(t, id);
	if (n && n->open > 0 && --n->open == 0) {
		if (n->nlookup == 0)
			node_drop(t, n); /* forgotten while open */
		else
			idle_add(t, n);
	}
	pthread_mutex_unlock(&t->mu);
}

void lockfs_inodes_forget(struct inodes *t, uint64_t id, uint64_t count)
{
	struct node *n;

	pthread_mutex_lock(&t->mu);
	n = find_id(t, id);
	if (!n)
		goto out; /* dropped while idle: the kernel learns nothing of it */
	n->nlookup = count >= n->nlookup ? 0 : n->nlookup - count;
	if (n->saved)
		n->saved->nlookup = n->nlookup;
	if (n->nlookup == 0 && n->open == 0)
		node_drop(t, n);
out:
	pthread_mutex_unlock(&t->mu);
}

/* One saved node made again (lockfs_inodes_restore).  Called with t->mu held. */
static int restore_one(struct lockfs_saved_node *saved, void *arg)
{
	struct inodes *t = arg;
	size_t len = strnlen(saved->name, NAME_MAX);
	struct node *n;

	if (find_id(t, saved->id))
		return 0;
	n = calloc(1, sizeof(*n) + len + 1);
	if (!n)
		return 0; /* unknown to us: ESTALE, and the kernel looks it up again */
	memcpy(n->name, saved->name, len);
	n->name[len] = '\0';
	n->id = saved->id;
	n->generation = saved->generation;
	n->nlookup = saved->nlookup;
	n->uid = saved->uid;
	n->saved = saved;
	n->by_name_next = t->by_name[name_hash(n->name)];
	t->by_name[name_hash(n->name)] = n;
	n->by_id_next = t->by_id[n->id % BUCKETS];
	t->by_id[n->id % BUCKETS] = n;
	if (n->id >= t->next_id)
		t->next_id = n->id + 1;
	/* Kept while the kernel knows it; one with no lookup left stays
	 * for the open files that lockfs_handles_restore counts again. */
	if (n->nlookup > 0)
		idle_add(t, n);
	return 0;
}

void lockfs_inodes_restore(struct inodes *t)
{
	pthread_mutex_lock(&t->mu);
	if (lockfs_connstate_next_node() > t->next_id)
		t->next_id = lockfs_connstate_next_node();
	lockfs_connstate_each_node(restore_one, t);
	lockfs_connstate_set_next_node(t->next_id);
	pthread_mutex_unlock(&t->mu);
}
