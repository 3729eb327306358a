/*
 * The kernel's view of lock directories: node ids and lookup counts.
 * Each acquisition of a name gets its own node (keyed by name and
 * generation): the kernel marks a directory dead once it is rmdir'ed, so a
 * lock taken again must not come back under the old inode number.
 * Kept apart from the lock state (core/), which the kernel never pins: a
 * lock can be released while the kernel still holds its inode, and the
 * node then simply answers ENOENT until it is forgotten.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"

#define BUCKETS 1024

struct node {
	struct node *by_name_next;
	struct node *by_id_next;
	uint64_t id;
	uint64_t generation; /* which acquisition of NAME this node shows */
	uint64_t nlookup;
	char name[];
};

struct inodes {
	pthread_mutex_t mu;
	uint64_t next_id;               /* protected by mu */
	struct node *by_name[BUCKETS];  /* protected by mu */
	struct node *by_id[BUCKETS];    /* protected by mu */
};

static unsigned name_hash(const char *s)
{
	uint32_t h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h % BUCKETS;
}

struct inodes *lockfs_inodes_new(void)
{
	struct inodes *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	pthread_mutex_init(&t->mu, NULL);
	t->next_id = 1;
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
	pthread_mutex_destroy(&t->mu);
	free(t);
}

uint64_t lockfs_inodes_ref(struct inodes *t, const char *name, uint64_t generation)
{
	unsigned h = name_hash(name);
	struct node *n;
	uint64_t id = 0;
	size_t len;

	pthread_mutex_lock(&t->mu);
	for (n = t->by_name[h]; n; n = n->by_name_next)
		if (n->generation == generation && strcmp(n->name, name) == 0)
			break;
	if (!n) {
		len = strlen(name);
		n = calloc(1, sizeof(*n) + len + 1);
		if (!n)
			goto out;
		memcpy(n->name, name, len + 1);
		n->id = t->next_id++;
		n->generation = generation;
		n->by_name_next = t->by_name[h];
		t->by_name[h] = n;
		n->by_id_next = t->by_id[n->id % BUCKETS];
		t->by_id[n->id % BUCKETS] = n;
	}
	n->nlookup++;
	id = n->id;
out:
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
	int rc = -ENOENT;

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

void lockfs_inodes_forget(struct inodes *t, uint64_t id, uint64_t count)
{
	struct node *n, **pp;

	pthread_mutex_lock(&t->mu);
	n = find_id(t, id);
	if (!n)
		goto out;
	n->nlookup = count >= n->nlookup ? 0 : n->nlookup - count;
	if (n->nlookup > 0)
		goto out;
	for (pp = &t->by_id[id % BUCKETS]; *pp != n; pp = &(*pp)->by_id_next)
		;
	*pp = n->by_id_next;
	for (pp = &t->by_name[name_hash(n->name)]; *pp != n; pp = &(*pp)->by_name_next)
		;
	*pp = n->by_name_next;
	free(n);
out:
	pthread_mutex_unlock(&t->mu);
}
