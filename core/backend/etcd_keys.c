/*
 * Contender keys this daemon may write again (etcd.h: struct etcd_keys).
 *
 * Why: etcd keeps every key ever made in its in-memory index until a
 * compaction, and most deployments never compact (auto-compaction is off
 * by default).  A range read or compare over R(NAME) -- the try-lock's
 * "no key in R(NAME)" -- walks every key ever made under NAME, deleted or
 * not.  A fresh key per acquire made the try-lock of a lock taken N times
 * cost O(N) in etcd: ~0.5 µs per earlier acquire on this machine, 2 ms
 * more per pair after 4,000 (docs/performance.md).  etcd's own
 * concurrency.Mutex does not have this: its key is the session's lease,
 * the same for every acquire of a session.
 *
 * So a key whose life this daemon ended itself -- its release or leave
 * deleted it (guarded by its create_revision), or its try-lock was
 * refused (nothing was written) -- is remembered for its name and used
 * again by the next acquire of that name on the same lease.  Nothing else
 * ever writes such a key (its lease is in its name), and nothing of ours
 * will touch its old life again: every later op on a key is guarded by
 * its create_revision, which the new life does not share.  A key whose
 * outcome is unknown (the session's pending undo may still delete it) is
 * never offered: it simply is not remembered.  Forgetting is always safe;
 * it only costs a fresh key.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "etcd.h"

/* FNV-1a of NAME, for the bucket. */
static size_t bucket_of(const char *name)
{
	uint64_t h = 1469598103934665603ULL;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 1099511628211ULL;
	return (size_t)(h % ETCD_KEYS_BUCKETS);
}

void lockfs_etcdbe_keys_init(struct etcd_keys *k)
{
	memset(k, 0, sizeof(*k));
	pthread_mutex_init(&k->mu, NULL);
	k->ready = true;
}

void lockfs_etcdbe_keys_destroy(struct etcd_keys *k)
{
	if (!k->ready)
		return;
	for (size_t b = 0; b < ETCD_KEYS_BUCKETS; b++) {
		struct etcd_free_key *f = k->buckets[b];

		while (f) {
			struct etcd_free_key *next = f->next;

			free(f);
			f = next;
		}
	}
	pthread_mutex_destroy(&k->mu);
	k->ready = false;
}

/* The entry of NAME in bucket B and the link that points at it, or NULL. */
static struct etcd_free_key **find_link(struct etcd_keys *k, size_t b, const char *name)
{
	struct etcd_free_key **link = &k->buckets[b];

	while (*link && strcmp((*link)->name, name) != 0)
		link = &(*link)->next;
	return *link ? link : NULL;
}

void lockfs_etcdbe_key_free(struct etcd_keys *k, const char *name, int64_t lease, uint64_t seq)
{
	size_t b = bucket_of(name), len = strlen(name);
	struct etcd_free_key **link, *f;

	pthread_mutex_lock(&k->mu);
	link = find_link(k, b, name);
	if (link) {
		/* One key per name is all an uncontended name needs. */
		(*link)->lease = lease;
		(*link)->seq = seq;
	} else if (k->count < ETCD_KEYS_MAX && (f = malloc(sizeof(*f) + len + 1)) != NULL) {
		f->lease = lease;
		f->seq = seq;
		memcpy(f->name, name, len + 1);
		f->next = k->buckets[b];
		k->buckets[b] = f;
		k->count++;
	}
	pthread_mutex_unlock(&k->mu);
}

bool lockfs_etcdbe_key_reuse(struct etcd_keys *k, const char *name, int64_t lease, uint64_t *seq)
{
	size_t b = bucket_of(name);
	struct etcd_free_key **link, *f = NULL;

	pthread_mutex_lock(&k->mu);
	link = find_link(k, b, name);
	if (link) {
		f = *link;
		*link = f->next;
		k->count--;
	}
	pthread_mutex_unlock(&k->mu);
	if (!f)
		return false;
	/* A key of an earlier lease is nobody's to write: that session ended. */
	bool ok = f->lease == lease;

	if (ok)
		*seq = f->seq;
	free(f);
	return ok;
}

bool lockfs_etcdbe_own_key_seq(const char *prefix, const char *name, const char *key,
			       int64_t lease, uint64_t *seq)
{
	size_t pl = strlen(prefix), nl = strlen(name);
	const char *p;
	char *end;
	unsigned long long lease_part, seq_part;

	if (strncmp(key, prefix, pl) != 0 || strncmp(key + pl, name, nl) != 0 ||
	    key[pl + nl] != '/')
		return false;
	p = key + pl + nl + 1;
	/* <lease, 16 hex digits> "-" <seq hex>, as contender_key makes it */
	if (strlen(p) < 18 || p[16] != '-')
		return false;
	errno = 0;
	lease_part = strtoull(p, &end, 16);
	if (errno || end != p + 16 || (int64_t)lease_part != lease)
		return false;
	seq_part = strtoull(p + 17, &end, 16);
	if (errno || *end || end == p + 17)
		return false;
	*seq = seq_part;
	return true;
}
