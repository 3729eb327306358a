/*
 * The etcd store's mirror: every key under PREFIX as the one prefix watch
 * (and this daemon's own writes) last showed it, so that stat, read, list
 * and session answer at once, never waiting on the network
 * (lockfs/backend.h "Time").
 *
 * Per name, the contender keys sorted by create_revision: the first live
 * one holds the name (etcd's concurrency.Mutex, `etcdctl lock`), the
 * others wait in that order.  Events may reach the mirror twice and out of
 * order with this daemon's own writes (a write updates the mirror before
 * its op returns, the watch brings the same change later), so a change is
 * applied only when it is newer than what the mirror has for the key
 * (mod_revision), and a deleted key stays as a dead entry until the watch
 * has passed its deletion.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/record.h"
#include "base/clock.h"
#include "etcd.h"
#include "lockfs/name.h"

#define HOSTS_DIR ".hosts/"

uint64_t lockfs_etcdbe_identity(int64_t create_rev, int64_t mod_rev)
{
	uint64_t h = (uint64_t)create_rev * 0x9e3779b97f4a7c15u;

	h ^= (uint64_t)mod_rev + 0x632be59bd9b4e019u + (h << 6) + (h >> 2);
	h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9u;
	h ^= h >> 29;
	return h ? h : 1;
}

void lockfs_etcdbe_mirror_init(struct etcd_mirror *m, const char *prefix)
{
	memset(m, 0, sizeof(*m));
	pthread_mutex_init(&m->mu, NULL);
	m->prefix = prefix;
	m->prefix_len = strlen(prefix);
}

static void key_clear(struct etcd_key *k)
{
	free(k->key);
	free(k->value);
	memset(k, 0, sizeof(*k));
}

static void name_free(struct etcd_name *n)
{
	for (size_t i = 0; i < n->n; i++)
		key_clear(&n->keys[i]);
	free(n->keys);
	free(n->name);
	free(n);
}

static void mirror_clear_locked(struct etcd_mirror *m)
{
	for (size_t b = 0; b < MIRROR_BUCKETS; b++) {
		while (m->buckets[b]) {
			struct etcd_name *n = m->buckets[b];

			m->buckets[b] = n->next;
			name_free(n);
		}
	}
	while (m->hosts) {
		struct etcd_host *h = m->hosts;

		m->hosts = h->next;
		free(h->host);
		free(h);
	}
}

void lockfs_etcdbe_mirror_free(struct etcd_mirror *m)
{
	mirror_clear_locked(m);
	pthread_mutex_destroy(&m->mu);
}

void lockfs_etcdbe_names_free(struct etcd_names *ns)
{
	for (size_t i = 0; i < ns->n; i++)
		free(ns->v[i]);
	free(ns->v);
	memset(ns, 0, sizeof(*ns));
}

/* Add NAME to NS once.  -ENOMEM (then NS says "all"). */
int lockfs_etcdbe_names_add(struct etcd_names *ns, const char *name)
{
	if (!ns)
		return 0;
	for (size_t i = 0; i < ns->n; i++)
		if (strcmp(ns->v[i], name) == 0)
			return 0;
	if (ns->n == ns->cap) {
		size_t cap = ns->cap ? ns->cap * 2 : 8;
		char **v = realloc(ns->v, cap * sizeof(*v));

		if (!v) {
			ns->all = true;
			return -ENOMEM;
		}
		ns->v = v;
		ns->cap = cap;
	}
	ns->v[ns->n] = strdup(name);
	if (!ns->v[ns->n]) {
		ns->all = true;
		return -ENOMEM;
	}
	ns->n++;
	return 0;
}

int lockfs_etcdbe_mirror_classify(const struct etcd_mirror *m, const char *key, char *buf, size_t size)
{
	const char *rest, *slash;
	size_t len;

	if (strncmp(key, m->prefix, m->prefix_len) != 0)
		return 0;
	rest = key + m->prefix_len;
	if (strncmp(rest, HOSTS_DIR, strlen(HOSTS_DIR)) == 0) {
		rest += strlen(HOSTS_DIR);
		len = strlen(rest);
		if (!len || len >= size || strchr(rest, '/'))
			return 0;
		memcpy(buf, rest, len + 1);
		return 2;
	}
	/* NAME "/" SUFFIX: names hold no '/', so the first one ends it.  An
	 * empty SUFFIX too: the key is in R(NAME), so a try-lock's compare
	 * sees it, and the views must show what refuses the lock. */
	slash = strchr(rest, '/');
	if (!slash || slash == rest)
		return 0;
	len = (size_t)(slash - rest);
	if (len >= size)
		return 0;
	memcpy(buf, rest, len);
	buf[len] = '\0';
	return lockfs_etcdbe_reserved(buf) ? 0 : 1;
}

bool lockfs_etcdbe_reserved(const char *name)
{
	const char *base;
	unsigned k, cap;

	/* Dot names are the daemons' own (".hosts/"), but for the slots'
	 * locks (".slotKofN:NAME" and ".slotline:NAME", docs/slots.md),
	 * which are locks. */
	return name[0] == '.' && !lockfs_slot_name_parse(name, &base, &k, &cap) &&
	       !lockfs_slot_line_parse(name, &base);
}

static size_t hash_name(const char *name)
{
	uint64_t h = 1469598103934665603u;

	for (; *name; name++)
		h = (h ^ (unsigned char)*name) * 1099511628211u;
	return h % MIRROR_BUCKETS;
}

static void mark_sweep(struct etcd_mirror *m, size_t b)
{
	m->to_sweep[b / 64] |= (uint64_t)1 << (b % 64);
}

static struct etcd_name *find_name(struct etcd_mirror *m, const char *name, bool create)
{
	size_t b = hash_name(name);
	struct etcd_name *n;

	for (n = m->buckets[b]; n; n = n->next)
		if (strcmp(n->name, name) == 0)
			return n;
	if (!create)
		return NULL;
	n = calloc(1, sizeof(*n));
	if (!n || !(n->name = strdup(name))) {
		free(n);
		return NULL;
	}
	n->next = m->buckets[b];
	m->buckets[b] = n;
	mark_sweep(m, b);  /* empty until a key comes */
	return n;
}

static struct etcd_key *find_key(struct etcd_name *n, const char *key)
{
	for (size_t i = 0; i < n->n; i++)
		if (strcmp(n->keys[i].key, key) == 0)
			return &n->keys[i];
	return NULL;
}

static struct etcd_key *first_live(struct etcd_name *n)
{
	for (size_t i = 0; i < n->n; i++)
		if (!n->keys[i].dead)
			return &n->keys[i];
	return NULL;
}

static bool has_dead(const struct etcd_name *n)
{
	for (size_t i = 0; i < n->n; i++)
		if (n->keys[i].dead)
			return true;
	return false;
}

/* Drop NAME when nothing is left of it. */
static void maybe_drop_name(struct etcd_mirror *m, struct etcd_name *n, int64_t now_ms)
{
	struct etcd_name **pp;

	if (n->n || n->delay_until_ms > now_ms)
		return;
	for (pp = &m->buckets[hash_name(n->name)]; *pp; pp = &(*pp)->next)
		if (*pp == n) {
			*pp = n->next;
			name_free(n);
			return;
		}
}

static int set_value(struct etcd_key *k, const struct lockfs_etcd_kv *kv)
{
	char *v = malloc(kv->value_len + 1);

	if (!v)
		return -ENOMEM;
	memcpy(v, kv->value, kv->value_len);
	v[kv->value_len] = '\0';
	free(k->value);
	k->value = v;
	k->value_len = kv->value_len;
	k->record_fence_known = false;
	return 0;
}

static int host_put(struct etcd_mirror *m, const char *host, const struct lockfs_etcd_kv *kv)
{
	struct etcd_host *h;

	for (h = m->hosts; h; h = h->next)
		if (strcmp(h->host, host) == 0)
			break;
	if (h && h->mod_rev >= kv->mod_revision)
		return 0;
	if (!h) {
		h = calloc(1, sizeof(*h));
		if (!h || !(h->host = strdup(host))) {
			free(h);
			return -ENOMEM;
		}
		h->next = m->hosts;
		m->hosts = h;
	}
	h->lease = kv->lease;
	h->mod_rev = kv->mod_revision;
	return 0;
}

static void host_delete(struct etcd_mirror *m, const char *host, int64_t rev)
{
	for (struct etcd_host **pp = &m->hosts; *pp; pp = &(*pp)->next)
		if (strcmp((*pp)->host, host) == 0) {
			struct etcd_host *h = *pp;

			if (h->mod_rev >= rev)
				return;
			*pp = h->next;
			free(h->host);
			free(h);
			return;
		}
}

int lockfs_etcdbe_mirror_put_locked(struct etcd_mirror *m, const struct lockfs_etcd_kv *kv,
			   int64_t now_ms, struct etcd_names *changed)
{
	char name[LOCKFS_STORE_KEY_MAX];
	struct etcd_name *n;
	struct etcd_key *k;
	int kind = lockfs_etcdbe_mirror_classify(m, kv->key, name, sizeof(name));
	size_t i;

	if (kind == 2)
		return host_put(m, name, kv);
	if (kind != 1)
		return 0;
	n = find_name(m, name, true);
	if (!n)
		return -ENOMEM;
	/* A life that a txn of ours saw ended (gone_rank): a late read or
	 * event of it, never a contender again. */
	if (kv->create_revision < n->gone_rank)
		return lockfs_etcdbe_names_add(changed, name);
	k = find_key(n, kv->key);
	if (k) {
		/* Older than what the mirror has (a late event of our own
		 * write, or of a deleted key's life): nothing to change, but
		 * reported all the same. */
		if (k->mod_rev >= kv->mod_revision)
			return lockfs_etcdbe_names_add(changed, name);
		if (k->create_rev != kv->create_revision) {
			/* The key was made anew: a new contender. */
			k->create_rev = kv->create_revision;
			k->seen_ms = now_ms;
			k->grant_rev = 0;
		}
		if (set_value(k, kv) < 0)
			return -ENOMEM;
		k->mod_rev = kv->mod_revision;
		k->lease = kv->lease;
		k->dead = false;
	} else {
		struct etcd_key nk = {
			.create_rev = kv->create_revision, .mod_rev = kv->mod_revision,
			.lease = kv->lease, .seen_ms = now_ms,
		};

		nk.key = strdup(kv->key);
		if (!nk.key || set_value(&nk, kv) < 0) {
			key_clear(&nk);
			return -ENOMEM;
		}
		if (n->n == n->cap) {
			size_t cap = n->cap ? n->cap * 2 : 4;
			struct etcd_key *v = realloc(n->keys, cap * sizeof(*v));

			if (!v) {
				key_clear(&nk);
				return -ENOMEM;
			}
			n->keys = v;
			n->cap = cap;
		}
		for (i = n->n; i > 0 && n->keys[i - 1].create_rev > nk.create_rev; i--)
			n->keys[i] = n->keys[i - 1];
		n->keys[i] = nk;
		n->n++;
	}
	/* Re-sort the one that moved (a key made anew keeps its slot otherwise). */
	for (i = 1; i < n->n; i++)
		for (size_t j = i; j > 0 && n->keys[j - 1].create_rev > n->keys[j].create_rev; j--) {
			struct etcd_key t = n->keys[j];

			n->keys[j] = n->keys[j - 1];
			n->keys[j - 1] = t;
		}
	return lockfs_etcdbe_names_add(changed, name);
}

/* K of NAME was deleted at REV: it stays, dead, until the sweep (its rank
 * still orders the line), its value freed. */
static void key_gone(struct etcd_mirror *m, const char *name, struct etcd_key *k, int64_t rev)
{
	k->dead = true;
	mark_sweep(m, hash_name(name));
	k->mod_rev = rev;
	free(k->value);
	k->value = NULL;
	k->value_len = 0;
	k->record_fence_known = false;
}

int lockfs_etcdbe_mirror_delete_locked(struct etcd_mirror *m, const char *key, int64_t rev,
			      int64_t delay_until_ms, struct etcd_names *changed)
{
	char name[LOCKFS_STORE_KEY_MAX];
	struct etcd_name *n;
	struct etcd_key *k;
	int kind = lockfs_etcdbe_mirror_classify(m, key, name, sizeof(name));

	if (kind == 2) {
		host_delete(m, name, rev);
		return 0;
	}
	if (kind != 1)
		return 0;
	/* Reported even when this daemon's own delete got here first: every
	 * change of a name is reported, its own ones too. */
	if (!(n = find_name(m, name, false)) || !(k = find_key(n, key)) || k->mod_rev >= rev)
		return lockfs_etcdbe_names_add(changed, name);
	/* An expired session's head key: nobody gets NAME for a while. */
	if (delay_until_ms && first_live(n) == k && n->delay_until_ms < delay_until_ms)
		n->delay_until_ms = delay_until_ms;
	key_gone(m, name, k, rev);
	return lockfs_etcdbe_names_add(changed, name);
}

void lockfs_etcdbe_mirror_gone_before_locked(struct etcd_mirror *m, const char *name,
					     int64_t rank, int64_t rev)
{
	struct etcd_name *n = find_name(m, name, true);

	/* Remembered for the keys the mirror does not have yet: a read or a
	 * watch event issued before REV may still bring one (put_locked). */
	if (n && n->gone_rank < rank)
		n->gone_rank = rank;
	for (size_t j = 0; n && j < n->n; j++) {
		struct etcd_key *k = &n->keys[j];

		if (k->dead || k->create_rev >= rank || k->mod_rev >= rev)
			continue;
		key_gone(m, name, k, rev);
	}
}

bool lockfs_etcdbe_mirror_alone_locked(struct etcd_mirror *m, const char *name, const char *key)
{
	struct etcd_name *n = find_name(m, name, false);

	for (size_t i = 0; n && i < n->n; i++)
		if (!n->keys[i].dead && strcmp(n->keys[i].key, key) != 0)
			return false;
	return true;
}

void lockfs_etcdbe_mirror_note_own_locked(struct etcd_mirror *m, const char *name,
					  const char *key, int64_t rev)
{
	struct etcd_name *n = find_name(m, name, false);

	if (!lockfs_etcdbe_mirror_alone_locked(m, name, key))
		return;  /* someone else is in NAME's line */
	/* Delivered already (NAME gone from the mirror: its last key's
	 * delete came and was swept), or not to be remembered. */
	if (!n || rev < n->next_rev || m->n_own_revs == MIRROR_OWN_REVS)
		return;
	m->own_ms[m->n_own_revs] = lockfs_wall_ms();
	m->own_revs[m->n_own_revs++] = rev;
}

int lockfs_etcdbe_mirror_lease_locked(struct etcd_mirror *m, const char *key, int64_t *lease)
{
	char name[LOCKFS_STORE_KEY_MAX];
	struct etcd_name *n;
	struct etcd_key *k;

	switch (lockfs_etcdbe_mirror_classify(m, key, name, sizeof(name))) {
	case 2:
		for (struct etcd_host *h = m->hosts; h; h = h->next)
			if (strcmp(h->host, name) == 0) {
				*lease = h->lease;
				return 0;
			}
		return -ENOENT;
	case 1:
		n = find_name(m, name, false);
		k = n ? find_key(n, key) : NULL;
		if (!k || k->dead)
			return -ENOENT;
		*lease = k->lease;
		return 0;
	default:
		return -ENOENT;
	}
}

bool lockfs_etcdbe_mirror_is_own_locked(struct etcd_mirror *m, int64_t rev)
{
	for (size_t i = 0; i < m->n_own_revs; i++)
		if (m->own_revs[i] == rev) {
			/* One event per revision and name; a revision's other
			 * events (none for one own write) need not match. */
			m->n_own_revs--;
			m->own_revs[i] = m->own_revs[m->n_own_revs];
			m->own_ms[i] = m->own_ms[m->n_own_revs];
			return true;
		}
	return false;
}

void lockfs_etcdbe_mirror_sweep_locked(struct etcd_mirror *m)
{
	int64_t now = lockfs_wall_ms();
	size_t kept = 0;

	/* An own revision not delivered for a while will not be: its name
	 * stopped being watched. */
	for (size_t i = 0; i < m->n_own_revs; i++)
		if (now - m->own_ms[i] < MIRROR_OWN_MS) {
			m->own_ms[kept] = m->own_ms[i];
			m->own_revs[kept++] = m->own_revs[i];
		}
	m->n_own_revs = kept;

	/* Only the marked buckets: the others hold no dead key and no
	 * empty name.  A bucket stays marked while one is left in it. */
	for (size_t b = 0; b < MIRROR_BUCKETS; b++) {
		struct etcd_name *n, *next;
		bool left = false;

		if (!(m->to_sweep[b / 64] >> (b % 64) & 1))
			continue;
		for (n = m->buckets[b]; n; n = next) {
			size_t j = 0;

			next = n->next;
			for (size_t i = 0; i < n->n; i++) {
				if (n->keys[i].dead && n->keys[i].mod_rev < n->next_rev)
					key_clear(&n->keys[i]);
				else
					n->keys[j++] = n->keys[i];
			}
			n->n = j;
			maybe_drop_name(m, n, now);
		}
		for (n = m->buckets[b]; n && !left; n = n->next)
			left = !n->n || has_dead(n);
		if (!left)
			m->to_sweep[b / 64] &= ~((uint64_t)1 << (b % 64));
	}
}

int lockfs_etcdbe_mirror_load(struct etcd_mirror *m, const struct lockfs_etcd_kv *kvs, size_t n,
		     int64_t rev, int64_t now_ms)
{
	struct etcd_mirror fresh;
	int rc = 0;

	/* Build the fresh view apart, then move over what this daemon wrote
	 * after REV (its own writes reach the mirror before their events). */
	lockfs_etcdbe_mirror_init(&fresh, m->prefix);
	for (size_t i = 0; i < n && !rc; i++)
		rc = lockfs_etcdbe_mirror_put_locked(&fresh, &kvs[i], now_ms, NULL);
	if (rc) {
		lockfs_etcdbe_mirror_free(&fresh);
		return rc;
	}
	pthread_mutex_lock(&m->mu);
	for (size_t b = 0; b < MIRROR_BUCKETS && !rc; b++)
		for (struct etcd_name *on = m->buckets[b]; on && !rc; on = on->next) {
			for (size_t i = 0; i < on->n && !rc; i++) {
				struct etcd_key *k = &on->keys[i];
				struct lockfs_etcd_kv kv = {
					.key = k->key, .key_len = strlen(k->key),
					.value = k->value ? k->value : (char *)"",
					.value_len = k->value_len, .create_revision = k->create_rev,
					.mod_revision = k->mod_rev, .lease = k->lease,
				};

				if (k->mod_rev <= rev)
					continue;
				if (k->dead)
					rc = lockfs_etcdbe_mirror_delete_locked(&fresh, k->key, k->mod_rev, 0, NULL);
				else
					rc = lockfs_etcdbe_mirror_put_locked(&fresh, &kv, k->seen_ms, NULL);
			}
			/* Lock-delay lives only in memory: keep it. */
			if (on->delay_until_ms > now_ms) {
				struct etcd_name *fn = find_name(&fresh, on->name, true);

				if (fn)
					fn->delay_until_ms = on->delay_until_ms;
			}
			/* So do the lives our txns saw ended. */
			if (on->gone_rank) {
				struct etcd_name *fn = find_name(&fresh, on->name, true);

				if (fn)
					lockfs_etcdbe_mirror_gone_before_locked(&fresh, on->name,
										on->gone_rank, rev + 1);
			}
		}
	if (!rc) {
		/* Keep when each key was first seen. */
		for (size_t b = 0; b < MIRROR_BUCKETS; b++)
			for (struct etcd_name *fn = fresh.buckets[b]; fn; fn = fn->next) {
				struct etcd_name *on = find_name(m, fn->name, false);

				for (size_t i = 0; on && i < fn->n; i++) {
					struct etcd_key *ok = find_key(on, fn->keys[i].key);

					if (ok && ok->create_rev == fn->keys[i].create_rev) {
						fn->keys[i].seen_ms = ok->seen_ms;
						fn->keys[i].grant_rev = ok->grant_rev;
					}
				}
			}
		mirror_clear_locked(m);
		memcpy(m->buckets, fresh.buckets, sizeof(m->buckets));
		m->hosts = fresh.hosts;
		memset(fresh.buckets, 0, sizeof(fresh.buckets));
		memset(m->to_sweep, 0xff, sizeof(m->to_sweep));  /* look at all once */
		fresh.hosts = NULL;
		for (size_t b = 0; b < MIRROR_BUCKETS; b++)
			for (struct etcd_name *fn = m->buckets[b]; fn; fn = fn->next)
				if (fn->next_rev < rev + 1)
					fn->next_rev = rev + 1;
	}
	pthread_mutex_unlock(&m->mu);
	lockfs_etcdbe_mirror_free(&fresh);
	return rc;
}

/* K's record fence, parsed at most once per value (with MIRROR_MU held). */
static uint64_t record_fence(struct etcd_key *k)
{
	if (!k->record_fence_known) {
		uint64_t fence;

		k->record_fence = k->value_len &&
				  lockfs_record_peek_fence(k->value, k->value_len, &fence) == 0 ?
				  fence : 0;
		k->record_fence_known = true;
	}
	return k->record_fence;
}

static int fill_head(struct etcd_key *k, bool want_value, struct etcd_head *h)
{
	snprintf(h->key, sizeof(h->key), "%s", k->key);
	h->has_key = true;
	h->create_rev = k->create_rev;
	h->mod_rev = k->mod_rev;
	h->lease = k->lease;
	h->seen_ms = k->seen_ms;
	h->grant_rev = k->grant_rev == k->mod_rev ? k->grant_rev : 0;
	h->value_empty = k->value_len == 0;
	h->record_fence = record_fence(k);
	if (want_value && k->value_len) {
		h->value = malloc(k->value_len + 1);
		if (!h->value)
			return -ENOMEM;
		memcpy(h->value, k->value, k->value_len + 1);
		h->value_len = k->value_len;
	}
	return 0;
}

int lockfs_etcdbe_mirror_head(struct etcd_mirror *m, const char *name, bool want_value, int64_t now_ms,
		     struct etcd_head *h)
{
	struct etcd_name *n;
	struct etcd_key *k;
	int rc = -ENOENT;

	memset(h, 0, sizeof(*h));
	pthread_mutex_lock(&m->mu);
	n = find_name(m, name, false);
	if (n) {
		if (n->delay_until_ms > now_ms) {
			h->held = true;
			h->delay_until_ms = n->delay_until_ms;
			rc = 0;
		}
		k = first_live(n);
		if (k) {
			h->held = true;
			rc = fill_head(k, want_value && !h->delay_until_ms, h);
		}
	}
	pthread_mutex_unlock(&m->mu);
	return rc;
}

int lockfs_etcdbe_mirror_find_identity(struct etcd_mirror *m, const char *name, uint64_t identity,
			      bool want_value, struct etcd_head *h)
{
	struct etcd_name *n;
	int rc = -ENOENT;

	memset(h, 0, sizeof(*h));
	pthread_mutex_lock(&m->mu);
	n = find_name(m, name, false);
	for (size_t i = 0; n && i < n->n; i++) {
		struct etcd_key *k = &n->keys[i];

		if (!k->dead && lockfs_etcdbe_identity(k->create_rev, k->mod_rev) == identity) {
			h->held = true;
			rc = fill_head(k, want_value, h);
			break;
		}
	}
	pthread_mutex_unlock(&m->mu);
	return rc;
}

int lockfs_etcdbe_mirror_is_head(struct etcd_mirror *m, const char *name, const char *key)
{
	struct etcd_name *n;
	struct etcd_key *k;
	int rc = -ENOENT;

	pthread_mutex_lock(&m->mu);
	n = find_name(m, name, false);
	k = n ? find_key(n, key) : NULL;
	if (k && !k->dead)
		rc = first_live(n) == k ? 1 : 0;
	pthread_mutex_unlock(&m->mu);
	return rc;
}

void lockfs_etcdbe_mirror_set_grant(struct etcd_mirror *m, const char *key, int64_t rev,
			   int64_t grant_rev)
{
	char name[LOCKFS_STORE_KEY_MAX];
	struct etcd_name *n;
	struct etcd_key *k;

	pthread_mutex_lock(&m->mu);
	if (lockfs_etcdbe_mirror_classify(m, key, name, sizeof(name)) == 1 &&
	    (n = find_name(m, name, false)) && (k = find_key(n, key)) && k->mod_rev == rev)
		k->grant_rev = grant_rev;
	pthread_mutex_unlock(&m->mu);
}

void lockfs_etcdbe_mirror_set_fence_locked(struct etcd_mirror *m, const char *key, int64_t rev,
					   uint64_t record_fence)
{
	char name[LOCKFS_STORE_KEY_MAX];
	struct etcd_name *n;
	struct etcd_key *k;

	if (lockfs_etcdbe_mirror_classify(m, key, name, sizeof(name)) == 1 &&
	    (n = find_name(m, name, false)) && (k = find_key(n, key)) && k->mod_rev == rev) {
		k->record_fence = record_fence;
		k->record_fence_known = true;
	}
}

int lockfs_etcdbe_mirror_list(struct etcd_mirror *m, int64_t now_ms, lockfs_list_cb cb, void *arg)
{
	struct etcd_names held = { 0 };
	int rc = 0;

	pthread_mutex_lock(&m->mu);
	for (size_t b = 0; b < MIRROR_BUCKETS && !rc; b++)
		for (struct etcd_name *n = m->buckets[b]; n && !rc; n = n->next)
			if (first_live(n) || n->delay_until_ms > now_ms)
				rc = lockfs_etcdbe_names_add(&held, n->name);
	pthread_mutex_unlock(&m->mu);
	for (size_t i = 0; !rc && i < held.n; i++)
		if (cb(arg, held.v[i]))
			break;
	lockfs_etcdbe_names_free(&held);
	return rc;
}

int lockfs_etcdbe_mirror_host(struct etcd_mirror *m, const char *host, int64_t *lease)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&m->mu);
	for (struct etcd_host *h = m->hosts; h; h = h->next)
		if (strcmp(h->host, host) == 0) {
			*lease = h->lease;
			rc = 0;
			break;
		}
	pthread_mutex_unlock(&m->mu);
	return rc;
}

void lockfs_etcdbe_mirror_delays_over(struct etcd_mirror *m, int64_t now_ms, struct etcd_names *over)
{
	pthread_mutex_lock(&m->mu);
	for (size_t b = 0; b < MIRROR_BUCKETS; b++) {
		struct etcd_name *n = m->buckets[b], *next;

		for (; n; n = next) {
			next = n->next;
			if (n->delay_until_ms && n->delay_until_ms <= now_ms) {
				n->delay_until_ms = 0;
				lockfs_etcdbe_names_add(over, n->name);
				maybe_drop_name(m, n, now_ms);
			}
		}
	}
	pthread_mutex_unlock(&m->mu);
}

int lockfs_etcdbe_mirror_load_name(struct etcd_mirror *m, const char *name,
				   const struct lockfs_etcd_kv *kvs, size_t n, int64_t rev,
				   int64_t now_ms)
{
	struct etcd_name *nm;
	int rc = 0;

	pthread_mutex_lock(&m->mu);
	nm = find_name(m, name, true);
	if (!nm) {
		pthread_mutex_unlock(&m->mu);
		return -ENOMEM;
	}
	/* A key the read does not show, and that nothing changed after REV,
	 * was gone at REV. */
	for (size_t i = 0; i < nm->n; i++) {
		struct etcd_key *k = &nm->keys[i];
		bool shown = false;

		for (size_t j = 0; j < n && !shown; j++)
			shown = strcmp(kvs[j].key, k->key) == 0;
		if (!shown && !k->dead && k->mod_rev <= rev)
			key_gone(m, name, k, rev);
	}
	for (size_t j = 0; j < n && !rc; j++)
		rc = lockfs_etcdbe_mirror_put_locked(m, &kvs[j], now_ms, NULL);
	if (nm->next_rev < rev + 1)
		nm->next_rev = rev + 1;
	mark_sweep(m, hash_name(name));
	pthread_mutex_unlock(&m->mu);
	return rc;
}

int lockfs_etcdbe_mirror_load_hosts(struct etcd_mirror *m, const struct lockfs_etcd_kv *kvs,
				    size_t n, int64_t rev)
{
	char host[LOCKFS_STORE_KEY_MAX];
	int rc = 0;

	pthread_mutex_lock(&m->mu);
	for (struct etcd_host **pp = &m->hosts; *pp;) {
		struct etcd_host *h = *pp;
		bool shown = false;

		for (size_t j = 0; j < n && !shown; j++)
			shown = lockfs_etcdbe_mirror_classify(m, kvs[j].key, host, sizeof(host)) == 2 &&
				strcmp(host, h->host) == 0;
		if (!shown && h->mod_rev <= rev) {
			*pp = h->next;
			free(h->host);
			free(h);
		} else {
			pp = &h->next;
		}
	}
	for (size_t j = 0; j < n && !rc; j++)
		rc = lockfs_etcdbe_mirror_put_locked(m, &kvs[j], 0, NULL);
	pthread_mutex_unlock(&m->mu);
	return rc;
}

void lockfs_etcdbe_mirror_set_next_locked(struct etcd_mirror *m, const char *name, int64_t next_rev)
{
	struct etcd_name *n = find_name(m, name, false);

	if (n && n->next_rev < next_rev)
		n->next_rev = next_rev;
}

void lockfs_etcdbe_mirror_forget_locked(struct etcd_mirror *m, const char *name)
{
	struct etcd_name **pp;

	for (pp = &m->buckets[hash_name(name)]; *pp; pp = &(*pp)->next)
		if (strcmp((*pp)->name, name) == 0) {
			struct etcd_name *n = *pp;

			*pp = n->next;
			name_free(n);
			return;
		}
}

bool lockfs_etcdbe_mirror_wanted_locked(struct etcd_mirror *m, const char *name, int64_t now_ms,
					bool (*ours)(void *arg, int64_t lease), void *arg)
{
	struct etcd_name *n = find_name(m, name, false);

	if (!n)
		return false;
	if (n->delay_until_ms > now_ms)
		return true;
	for (size_t i = 0; i < n->n; i++)
		if (!n->keys[i].dead && ours(arg, n->keys[i].lease))
			return true;
	return false;
}

int64_t lockfs_etcdbe_mirror_ahead_locked(struct etcd_mirror *m, const char *name, int64_t now_ms,
					   bool (*ours)(void *arg, int64_t lease), void *arg,
					   char *buf, size_t size)
{
	struct etcd_name *n = find_name(m, name, false);
	struct etcd_key *before = NULL;

	if (!n || n->delay_until_ms > now_ms)
		return 0;
	for (size_t i = 0; i < n->n; i++) {
		struct etcd_key *k = &n->keys[i];

		if (k->dead)
			continue;
		if (ours(arg, k->lease)) {
			/* This daemon's first key: the one ahead of it, if
			 * any (none: it heads NAME, or is about to). */
			if (!before || strlen(before->key) >= size)
				return 0;
			strcpy(buf, before->key);
			return n->next_rev;
		}
		before = k;
	}
	return 0;
}

bool lockfs_etcdbe_mirror_heads_locked(struct etcd_mirror *m, const char *name, int64_t now_ms,
				       bool (*ours)(void *arg, int64_t lease), void *arg)
{
	struct etcd_name *n = find_name(m, name, false);
	struct etcd_key *k = n ? first_live(n) : NULL;

	return k && n->delay_until_ms <= now_ms && ours(arg, k->lease);
}

void lockfs_etcdbe_mirror_set_delay_locked(struct etcd_mirror *m, const char *name,
					   int64_t until_ms)
{
	struct etcd_name *n = find_name(m, name, true);

	if (n && n->delay_until_ms < until_ms)
		n->delay_until_ms = until_ms;
}

void lockfs_etcdbe_mirror_set_delay(struct etcd_mirror *m, const char *name, int64_t until_ms)
{
	pthread_mutex_lock(&m->mu);
	lockfs_etcdbe_mirror_set_delay_locked(m, name, until_ms);
	pthread_mutex_unlock(&m->mu);
}

bool lockfs_etcdbe_mirror_delayed_locked(struct etcd_mirror *m, const char *name, int64_t now_ms)
{
	struct etcd_name *n = find_name(m, name, false);

	return n && n->delay_until_ms > now_ms;
}

int lockfs_etcdbe_mirror_each(struct etcd_mirror *m, lockfs_list_cb cb, void *arg)
{
	struct etcd_names all = { 0 };
	int rc = 0;

	pthread_mutex_lock(&m->mu);
	for (size_t b = 0; b < MIRROR_BUCKETS && !rc; b++)
		for (struct etcd_name *n = m->buckets[b]; n && !rc; n = n->next)
			rc = lockfs_etcdbe_names_add(&all, n->name);
	pthread_mutex_unlock(&m->mu);
	for (size_t i = 0; !rc && i < all.n; i++)
		if (cb(arg, all.v[i]))
			break;
	lockfs_etcdbe_names_free(&all);
	return rc;
}

int lockfs_etcdbe_mirror_host_of(struct etcd_mirror *m, int64_t lease, char *buf, size_t size)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&m->mu);
	for (struct etcd_host *h = m->hosts; h; h = h->next)
		if (h->lease == lease) {
			snprintf(buf, size, "%s", h->host);
			rc = 0;
			break;
		}
	pthread_mutex_unlock(&m->mu);
	return rc;
}
