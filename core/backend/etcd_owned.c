/*
 * The keys this daemon's engine holds or waits with, or that an op is
 * writing (etcd.h: struct etcd_owned): a key is owned from before its
 * first write is sent until its own guarded delete.  Two readers ask:
 * the orphan sweep (etcd_orphan.c: an owned key is never an orphan) and
 * the watch (etcd_watch.c: an event of an owned key may be the echo of
 * this daemon's own write, come before etcd's answer to it).
 */
#include <stdlib.h>
#include <string.h>

#include "etcd.h"

static size_t bucket_of(const char *key)
{
	uint64_t h = 1469598103934665603u;

	for (; *key; key++)
		h = (h ^ (unsigned char)*key) * 1099511628211u;
	return h % ETCD_OWNED_BUCKETS;
}

void lockfs_etcdbe_owned_add(struct etcd_store *e, const char *key)
{
	struct etcd_owned *o = &e->owned;
	size_t b = bucket_of(key), len = strlen(key);
	struct etcd_owned_key *k;

	pthread_mutex_lock(&o->mu);
	for (k = o->buckets[b]; k; k = k->next)
		if (strcmp(k->key, key) == 0)
			break;
	if (k) {
		/* owned already: one entry per key string */
	} else if ((k = malloc(sizeof(*k) + len + 1)) != NULL) {
		k->granted = false;
		k->deleting = false;
		memcpy(k->key, key, len + 1);
		k->next = o->buckets[b];
		o->buckets[b] = k;
	} else {
		/* No memory: the orphan check stays off until it is freed
		 * again (never a held key deleted). */
		o->unsure++;
	}
	pthread_mutex_unlock(&o->mu);
}

void lockfs_etcdbe_owned_drop(struct etcd_store *e, const char *key)
{
	struct etcd_owned *o = &e->owned;

	pthread_mutex_lock(&o->mu);
	for (struct etcd_owned_key **pp = &o->buckets[bucket_of(key)]; *pp; pp = &(*pp)->next)
		if (strcmp((*pp)->key, key) == 0) {
			struct etcd_owned_key *k = *pp;

			/* Every life of the key ends here: a key is written
			 * again only after its own guarded delete. */
			*pp = k->next;
			free(k);
			break;
		}
	pthread_mutex_unlock(&o->mu);
}

static struct etcd_owned_key *find_locked(struct etcd_owned *o, const char *key)
{
	for (struct etcd_owned_key *k = o->buckets[bucket_of(key)]; k; k = k->next)
		if (strcmp(k->key, key) == 0)
			return k;
	return NULL;
}

void lockfs_etcdbe_owned_granted(struct etcd_store *e, const char *key)
{
	struct etcd_owned_key *k;

	pthread_mutex_lock(&e->owned.mu);
	k = find_locked(&e->owned, key);
	if (k)
		k->granted = true;
	pthread_mutex_unlock(&e->owned.mu);
}

bool lockfs_etcdbe_owned_is_granted(struct etcd_store *e, const char *key)
{
	struct etcd_owned_key *k;
	bool granted;

	pthread_mutex_lock(&e->owned.mu);
	k = find_locked(&e->owned, key);
	/* Not known (no memory at its add): as granted, so that leave keeps
	 * it (fail closed). */
	granted = k ? k->granted : e->owned.unsure > 0;
	pthread_mutex_unlock(&e->owned.mu);
	return granted;
}

void lockfs_etcdbe_owned_deleting(struct etcd_store *e, const char *key, bool on)
{
	struct etcd_owned_key *k;

	pthread_mutex_lock(&e->owned.mu);
	k = find_locked(&e->owned, key);
	if (k)
		k->deleting = on;
	pthread_mutex_unlock(&e->owned.mu);
}

bool lockfs_etcdbe_owned_echo(struct etcd_store *e, const char *key, bool deleted)
{
	struct etcd_owned_key *k;
	bool echo;

	pthread_mutex_lock(&e->owned.mu);
	k = find_locked(&e->owned, key);
	echo = k && (!deleted || k->deleting);
	pthread_mutex_unlock(&e->owned.mu);
	return echo;
}

bool lockfs_etcdbe_owned_has_locked(struct etcd_owned *o, const char *key)
{
	for (struct etcd_owned_key *k = o->buckets[bucket_of(key)]; k; k = k->next)
		if (strcmp(k->key, key) == 0)
			return true;
	return o->unsure > 0;
}
