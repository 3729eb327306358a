/*
 * readdir on the etcd store: every held name of the prefix, by a range
 * read of its keys (keys only, in pages of LIST_PAGE keys at one
 * revision), kept for ETCD_LIST_CACHE_MS -- a daemon
 * does not watch the names nobody here needs (etcd_interest.c), so only a
 * read can list them.  A listing may thus be up to ETCD_LIST_CACHE_MS old
 * for names this daemon does not watch; a change this daemon made or
 * watched reads afresh.  When etcd cannot be read, the last listing and
 * the names watched here answer (the last known state).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "etcd.h"

void lockfs_etcdbe_list_changed(struct etcd_store *e)
{
	__atomic_add_fetch(&e->list_gen, 1, __ATOMIC_RELEASE);
}

struct name_vec {
	char **v;
	size_t n, cap;
	bool failed;
};

static int vec_add(void *arg, const char *name)
{
	struct name_vec *nv = arg;

	if (nv->n == nv->cap) {
		size_t cap = nv->cap ? nv->cap * 2 : 64;
		char **v = realloc(nv->v, cap * sizeof(*v));

		if (!v) {
			nv->failed = true;
			return 1;
		}
		nv->v = v;
		nv->cap = cap;
	}
	if (!(nv->v[nv->n] = strdup(name))) {
		nv->failed = true;
		return 1;
	}
	nv->n++;
	return 0;
}

static void vec_free(struct name_vec *nv)
{
	for (size_t i = 0; i < nv->n; i++)
		free(nv->v[i]);
	free(nv->v);
	memset(nv, 0, sizeof(*nv));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sort NV and drop repeats. */
static void vec_unique(struct name_vec *nv)
{
	size_t out = 0;

	if (nv->n == 0)
		return; /* V may be NULL: qsort() must not be handed it */
	qsort(nv->v, nv->n, sizeof(*nv->v), cmp_str);
	for (size_t i = 0; i < nv->n; i++) {
		if (out && strcmp(nv->v[out - 1], nv->v[i]) == 0)
			free(nv->v[i]);
		else
			nv->v[out++] = nv->v[i];
	}
	nv->n = out;
}

/* Is LEASE one of this daemon's lost sessions?  Its keys are not shown. */
static bool lost(struct etcd_store *e, int64_t lease)
{
	return lockfs_etcdbe_session_lost_lease(e, lease);
}

/* Keys per read of a listing: each page is a request of its own, within
 * the client's time bound (one answer of 100,000 keys took longer than
 * that here, and the listing came back empty), all pages at the first
 * one's revision: one consistent listing. */
#define LIST_PAGE 5000
/* Pages at most: a bound on the loop (LIST_PAGE * LIST_PAGES keys). */
#define LIST_PAGES 10000

/* The name whose keys are being read (a name's keys are together, sorted
 * by key; they may span two pages). */
struct name_group {
	char cur[LOCKFS_STORE_KEY_MAX];
	int64_t head_rev, head_lease;
	bool have;
};

/* The group read so far is complete: its name, unless its first key
 * (lowest create_revision) is on a lost session of this daemon. */
static int group_end(struct etcd_store *e, struct name_group *g, struct name_vec *nv)
{
	int rc = g->have && !lost(e, g->head_lease) && vec_add(nv, g->cur) ? -ENOMEM : 0;

	g->have = false;
	return rc;
}

/* The names of one page of a keys-only read of the prefix, from its kv
 * FROM on, into NV; the last group stays open in G. */
static int names_of(struct etcd_store *e, const struct lockfs_etcd_op_resp *r, size_t from,
		    struct name_group *g, struct name_vec *nv)
{
	char name[LOCKFS_STORE_KEY_MAX];

	for (size_t i = from; i < r->n_kvs; i++) {
		if (lockfs_etcdbe_mirror_classify(&e->mirror, r->kvs[i].key, name,
						  sizeof(name)) != 1)
			continue;
		if (!g->have || strcmp(name, g->cur) != 0) {
			if (group_end(e, g, nv) < 0)
				return -ENOMEM;
			memcpy(g->cur, name, strlen(name) + 1);
			g->have = true;
			g->head_rev = r->kvs[i].create_revision;
			g->head_lease = r->kvs[i].lease;
		} else if (r->kvs[i].create_revision < g->head_rev) {
			g->head_rev = r->kvs[i].create_revision;
			g->head_lease = r->kvs[i].lease;
		}
	}
	return 0;
}

/* Every held name of the prefix that begins with SUB ("": all) into NV,
 * LIST_PAGE keys per read; each next page starts at the last key read
 * (read twice, skipped). */
static int read_names(struct etcd_store *e, const char *sub, struct name_vec *nv)
{
	char start[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];
	struct lockfs_etcd_op op = {
		.type = LOCKFS_ETCD_RANGE, .key = start, .range_end = end, .keys_only = true,
		.limit = LIST_PAGE,
	};
	struct name_group g = { .have = false };
	size_t plen = strlen(e->prefix), slen = strlen(sub), len = plen + slen, from = 0;
	int rc = 0;

	if (len >= sizeof(start))
		return -ENAMETOOLONG;
	memcpy(start, e->prefix, plen);
	memcpy(start + plen, sub, slen + 1);
	end[lockfs_etcd_prefix_end(start, len, end)] = '\0';
	for (int page = 0; page < LIST_PAGES; page++) {
		struct lockfs_etcd_op_resp r;
		bool more;

		rc = lockfs_etcd_range(e->client, &op, &r);
		if (rc < 0)
			return rc;
		rc = names_of(e, &r, from, &g, nv);
		more = rc == 0 && r.more && r.n_kvs > from;
		if (more && r.kvs[r.n_kvs - 1].key_len >= sizeof(start))
			rc = -EIO; /* no key of ours is that long */
		if (more && rc == 0)
			memcpy(start, r.kvs[r.n_kvs - 1].key, r.kvs[r.n_kvs - 1].key_len + 1);
		if (!op.revision)
			op.revision = r.revision;
		lockfs_etcd_op_resp_free(&r);
		if (rc < 0 || !more)
			break;
		from = 1;
	}
	return rc < 0 ? rc : group_end(e, &g, nv);
}

/* Keep NV as the last listing (a copy), read at boot time AT_MS when the
 * events' count was GEN. */
static void keep(struct etcd_store *e, const struct name_vec *nv, int64_t at_ms, uint64_t gen)
{
	struct etcd_interest *in = &e->interest;
	char **copy = nv->n <= ETCD_LIST_CACHE_MAX ? calloc(nv->n + 1, sizeof(*copy)) : NULL;
	size_t n = 0;

	for (; copy && n < nv->n; n++)
		if (!(copy[n] = strdup(nv->v[n])))
			break;
	if (copy && n < nv->n) {
		while (n)
			free(copy[--n]);
		free(copy);
		copy = NULL;
	}
	if (!copy)
		return;
	pthread_mutex_lock(&in->list_mu);
	for (size_t i = 0; i < in->n_list; i++)
		free(in->list[i]);
	free(in->list);
	in->list = copy;
	in->n_list = n;
	in->list_ms = at_ms;
	in->list_gen = gen;
	pthread_mutex_unlock(&in->list_mu);
}

/* The last listing into NV when it is fresh (or, with ANY_AGE, at all).
 * True when there was one. */
static bool cached(struct etcd_store *e, struct name_vec *nv, bool any_age)
{
	struct etcd_interest *in = &e->interest;
	uint64_t gen = __atomic_load_n(&e->list_gen, __ATOMIC_ACQUIRE);
	bool ok;

	pthread_mutex_lock(&in->list_mu);
	ok = in->list && (any_age || (in->list_gen == gen &&
				      lockfs_boot_ms() - in->list_ms < ETCD_LIST_CACHE_MS));
	for (size_t i = 0; ok && i < in->n_list && !nv->failed; i++)
		vec_add(nv, in->list[i]);
	pthread_mutex_unlock(&in->list_mu);
	return ok;
}

struct held_filter {
	struct etcd_store *e;
	struct name_vec *nv;
};

/* A name the mirror shows held, unless its head is on a lost session of
 * this daemon (stat and read do not show it either). */
static int add_held(void *arg, const char *name)
{
	struct held_filter *f = arg;
	struct etcd_head h;

	if (lockfs_etcdbe_mirror_head(&f->e->mirror, name, false, lockfs_wall_ms(), &h) == 0 &&
	    h.has_key && !h.delay_until_ms && lost(f->e, h.lease))
		return 0;
	return vec_add(f->nv, name);
}

/* A read of the prefix failed (RC): NV becomes the last known state, the
 * last listing (the names watched here are added by answer()).  0. */
static int last_known(struct etcd_store *e, struct name_vec *nv, int rc)
{
	if (rc != -ENOMEM)
		lockfs_etcdbe_say_unreachable(e, rc);
	vec_free(nv);
	(void)cached(e, nv, true);
	return 0;
}

/* CB for the names of NV that begin with PREFIX ("": all), with the names
 * in lock-delay (held by nobody, known only here) and what the watched
 * names show now; NV is freed.  RC: the read's outcome so far. */
static int answer(struct etcd_store *e, struct name_vec *nv, int rc, const char *prefix,
		  lockfs_list_cb cb, void *arg)
{
	struct held_filter f = { .e = e, .nv = nv };
	size_t plen = strlen(prefix);

	if (rc == 0)
		rc = lockfs_etcdbe_mirror_list(&e->mirror, lockfs_wall_ms(), add_held, &f);
	if (rc == 0 && nv->failed)
		rc = -ENOMEM;
	if (rc == 0) {
		vec_unique(nv);
		for (size_t i = 0; i < nv->n; i++)
			if (strncmp(nv->v[i], prefix, plen) == 0 && cb(arg, nv->v[i]))
				break;
	}
	vec_free(nv);
	return rc;
}

int lockfs_etcdbe_list(struct etcd_store *e, lockfs_list_cb cb, void *arg)
{
	struct name_vec nv = { 0 };
	int rc = 0;

	if (!cached(e, &nv, false)) {
		uint64_t gen = __atomic_load_n(&e->list_gen, __ATOMIC_ACQUIRE);
		int64_t at = lockfs_boot_ms();

		vec_free(&nv);
		rc = __atomic_load_n(&e->unreachable, __ATOMIC_ACQUIRE) ? -EIO :
		     read_names(e, "", &nv);
		if (rc == 0)
			keep(e, &nv, at, gen);
		else
			rc = last_known(e, &nv, rc);
	}
	return answer(e, &nv, rc, "", cb, arg);
}

int lockfs_etcdbe_list_op(struct lockfs_backend *be, lockfs_list_cb cb, void *arg)
{
	int rc = lockfs_etcdbe_list((struct etcd_store *)be, cb, arg);

	return rc == -ENOMEM ? -ENOMEM : rc ? -EIO : 0;
}

/* The names of PREFIX read now (slots.c: a slotted name's slots, which a
 * listing up to ETCD_LIST_CACHE_MS old could miss or show still held),
 * with what the mirror shows of the watched ones, as lockfs_etcdbe_list
 * does; when etcd cannot be read, that listing's last known state. */
int lockfs_etcdbe_list_prefix(struct lockfs_backend *be, const char *prefix, lockfs_list_cb cb,
			      void *arg)
{
	struct etcd_store *e = (struct etcd_store *)be;
	struct name_vec nv = { 0 };
	int rc = __atomic_load_n(&e->unreachable, __ATOMIC_ACQUIRE) ? -EIO
		 : read_names(e, prefix, &nv);

	if (rc < 0)
		rc = last_known(e, &nv, rc);
	rc = answer(e, &nv, rc, prefix, cb, arg);
	return rc == -ENOMEM ? -ENOMEM : rc ? -EIO : 0;
}
