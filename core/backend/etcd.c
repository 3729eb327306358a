/*
 * The etcd store behind lockfs/backend.h (issue 11): one lock namespace
 * across hosts, on etcd's own lock protocol so that `etcdctl lock` and
 * every concurrency.Mutex client interoperate (docs/etcd.md).
 *
 * Lock NAME is the key range R(NAME) = PREFIX NAME "/" ...  Each contender
 * is one key K = PREFIX NAME "/" <lease hex> "-" <seq hex> on this
 * daemon's lease; the key with the lowest create_revision holds NAME and
 * the others wait in create_revision order.  A lockfs key's value is its
 * record (JSON); an `etcdctl lock` key has an empty value and reads as a
 * foreign holder.  Fences are etcd revisions: a grant's fence is the
 * create_revision of its key (or, for a shared holder joining, the
 * revision of that write).
 *
 * Every write is one etcd txn guarded by the identity the engine read
 * (create_revision, and mod_revision where a rewrite matters), bounded by
 * the client's 1 s.  Reads answer from the mirror (etcd_mirror.c), kept by
 * the watches (etcd_interest.c); the session is etcd_session.c's, opening
 * and closing etcd_open.c's, orphans etcd_orphan.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "etcd.h"
#include "options.h"
#include "registry.h"

static struct etcd_store *to_etcd(struct lockfs_backend *be)
{
	return (struct etcd_store *)be;
}

/* The answer for a client error RC of a write: -EIO (the store cannot do
 * it now), or -ENOMEM. */
static int store_error(struct etcd_store *e, int rc)
{
	if (rc == -ENOMEM)
		return -ENOMEM;
	if (rc == -ETIMEDOUT || rc == -EIO || rc == -EAGAIN)
		lockfs_etcdbe_say_unreachable(e, rc);
	return -EIO;
}

/* ---- Keys ---- */

/* PREFIX NAME "/" into KEY and its range end into END.  -ENAMETOOLONG. */
static int name_range(struct etcd_store *e, const char *name, char key[LOCKFS_STORE_KEY_MAX],
		      char end[LOCKFS_STORE_KEY_MAX])
{
	int n = snprintf(key, LOCKFS_STORE_KEY_MAX, "%s%s/", e->prefix, name);
	size_t len;

	if (n < 0 || n >= LOCKFS_STORE_KEY_MAX - 40 || !*name || strchr(name, '/') ||
	    lockfs_etcdbe_reserved(name))
		return -ENAMETOOLONG;
	len = lockfs_etcd_prefix_end(key, (size_t)n, end);
	end[len] = '\0';
	return 0;
}

/* The key of this daemon's contender SEQ on LEASE for NAME. */
static void contender_key(struct etcd_store *e, const char *name, int64_t lease, uint64_t seq,
			  char key[LOCKFS_STORE_KEY_MAX])
{
	snprintf(key, LOCKFS_STORE_KEY_MAX, "%s%s/%016" PRIx64 "-%" PRIx64, e->prefix, name,
		 (uint64_t)lease, seq);
}

static int64_t now_ms(void)
{
	return lockfs_wall_ms();
}

/* The fence a key's record stands for: the record's own when it has one
 * (the mirror parsed it once per value: etcd_head.record_fence), else this
 * daemon's update(GRANT) revision while the key is unchanged since, else
 * the key's create_revision.  0 for a foreign key. */
static uint64_t head_fence(const struct etcd_head *h)
{
	if (h->value_empty)
		return 0;
	if (h->record_fence)
		return h->record_fence;
	if (h->grant_rev)
		return (uint64_t)h->grant_rev;
	return (uint64_t)h->create_rev;
}

/* Is what the mirror shows unconfirmed now?  The watch is down, the
 * session is not live, or the last call found etcd unreachable: a silent
 * etcd keeps the watch's connection open and says nothing, so only a call
 * that timed out tells. */
static bool unconfirmed(struct etcd_store *e)
{
	bool watching;

	pthread_mutex_lock(&e->mirror.mu);
	watching = e->mirror.watching;
	pthread_mutex_unlock(&e->mirror.mu);
	return !watching || __atomic_load_n(&e->unreachable, __ATOMIC_ACQUIRE) ||
	       lockfs_etcdbe_session_state(e, NULL) != LOCKFS_SESSION_LIVE;
}

/* Where the holder's key KEY (on LEASE, made at CREATE_REV) is, into ST:
 * for log lines, and the fields `owner` shows (lockfs_store_field). */
static void holder_fields(struct lockfs_entry_stat *st, const char *key, int64_t lease,
			  int64_t create_rev)
{
	snprintf(st->key, sizeof(st->key), "%s", key);
	st->lease = lease;
	st->fields[0] = (struct lockfs_store_field){ .name = "key", .value = LOCKFS_STORE_KEY };
	st->fields[1] = (struct lockfs_store_field){ .name = "lease", .alt_name = "etcd_lease",
						     .value = LOCKFS_STORE_HEX, .number = lease };
	st->fields[2] = (struct lockfs_store_field){ .name = "create_revision",
						     .value = LOCKFS_STORE_INT,
						     .number = create_rev };
	st->n_fields = 3;
}

static void fill_stat(struct etcd_store *e, const struct etcd_head *h, struct lockfs_entry_stat *st)
{
	memset(st, 0, sizeof(*st));
	st->uid = e->uid;
	st->gid = e->gid;
	st->unconfirmed = unconfirmed(e);
	st->delay_until_ms = h->delay_until_ms;
	if (!h->has_key) {
		/* Lock-delay with no key: held by nobody, for a while. */
		st->identity = lockfs_etcdbe_identity(0, h->delay_until_ms);
		st->mtime_ms = now_ms();
		return;
	}
	st->identity = lockfs_etcdbe_identity(h->create_rev, h->mod_rev);
	st->fence = h->delay_until_ms ? 0 : head_fence(h);
	st->mtime_ms = h->seen_ms;
	holder_fields(st, h->key, h->lease, h->create_rev);
}

/*
 * An op's own write of KEY (of NAME) at MOD_REV, into the mirror before the
 * op returns.  FIRST_RANK > 0: the txn proved no key of NAME created before
 * it lives (mirror_gone_before_locked).  OWN: its echo may be CHANGE_OWN
 * (mirror_note_own_locked, in the same critical section as the put).
 * FENCE_NULL: VALUE says "fence": null (a new grant's record), known
 * without parsing it at the next stat.
 */
static void mirror_put(struct etcd_store *e, const char *name, const char *key,
		       const char *value, size_t len, int64_t create_rev, int64_t mod_rev,
		       int64_t lease, int64_t first_rank, bool own, bool fence_null)
{
	struct lockfs_etcd_kv kv = {
		.key = (char *)key, .key_len = strlen(key), .value = (char *)value,
		.value_len = len, .create_revision = create_rev, .mod_revision = mod_rev,
		.lease = lease,
	};

	pthread_mutex_lock(&e->mirror.mu);
	(void)lockfs_etcdbe_mirror_put_locked(&e->mirror, &kv, now_ms(), NULL);
	if (fence_null)
		lockfs_etcdbe_mirror_set_fence_locked(&e->mirror, key, mod_rev, 0);
	if (first_rank > 0)
		lockfs_etcdbe_mirror_gone_before_locked(&e->mirror, name, first_rank, mod_rev);
	if (own)
		lockfs_etcdbe_mirror_note_own_locked(&e->mirror, name, key, mod_rev);
	pthread_mutex_unlock(&e->mirror.mu);	lockfs_etcdbe_list_changed(e);
}

/* An op's own delete of KEY (of NAME) at REV, as mirror_put. */
static void mirror_delete(struct etcd_store *e, const char *name, const char *key, int64_t rev,
			  bool own)
{
	pthread_mutex_lock(&e->mirror.mu);
	(void)lockfs_etcdbe_mirror_delete_locked(&e->mirror, key, rev, 0, NULL);
	if (own)
		lockfs_etcdbe_mirror_note_own_locked(&e->mirror, name, key, rev);
	pthread_mutex_unlock(&e->mirror.mu);	lockfs_etcdbe_list_changed(e);
}

/* This daemon's own write of KEY at REV, in the mirror already: when it
 * left NAME uncontended, its watch echo is only a hint (CHANGE_OWN) --
 * unless the watch brought it already. */
static void note_own(struct etcd_store *e, const char *name, const char *key, int64_t rev)
{
	pthread_mutex_lock(&e->mirror.mu);
	lockfs_etcdbe_mirror_note_own_locked(&e->mirror, name, key, rev);
	pthread_mutex_unlock(&e->mirror.mu);
}

/* KEY (of NAME, on LEASE) was just removed by this daemon's own guarded
 * delete: when it is one of its contender keys, the next acquire of NAME
 * writes it again (etcd_keys.c). */
static void own_key_freed(struct etcd_store *e, const char *name, const char *key, int64_t lease)
{
	uint64_t seq;

	if (lockfs_etcdbe_own_key_seq(e->prefix, name, key, lease, &seq))
		lockfs_etcdbe_key_free(&e->free_keys, name, lease, seq);
}

/* Session LIVE, its lease into *LEASE: 0; else -EIO (no grants). */
static int need_live(struct etcd_store *e, int64_t *lease)
{
	return lockfs_etcdbe_session_state(e, lease) == LOCKFS_SESSION_LIVE ? 0 : -EIO;
}

static bool in_delay(struct etcd_store *e, const char *name)
{
	struct etcd_head h;

	return lockfs_etcdbe_mirror_head(&e->mirror, name, false, now_ms(), &h) == 0 &&
	       h.delay_until_ms > 0;
}

/* Grant result ST for KEY written at (CREATE, MOD) with FENCE. */
static void granted_stat(struct etcd_store *e, const char *key, int64_t create_rev,
			 int64_t mod_rev, int64_t lease, uint64_t fence,
			 struct lockfs_entry_stat *st)
{
	if (!st)
		return;
	memset(st, 0, sizeof(*st));
	st->identity = lockfs_etcdbe_identity(create_rev, mod_rev);
	st->fence = fence;
	st->uid = e->uid;
	st->gid = e->gid;
	st->mtime_ms = now_ms();
	st->unconfirmed = unconfirmed(e);
	holder_fields(st, key, lease, create_rev);
}

/*
 * The acquire's put of KEY (on LEASE, value JSON) may have reached etcd
 * twice (lockfs_etcd_last_call_resent): read what KEY holds now.  1 and
 * its (*CREATE, *MOD) when it is our write -- the first copy made it (a
 * try-lock's second copy then failed its compare on that very key; a
 * queue's second copy rewrote it, moving mod but not create) --; 0 when
 * KEY is not there (nothing was written); -errno when etcd cannot say.
 */
static int resent_put(struct etcd_store *e, const char *key, int64_t lease, const char *json,
		      size_t len, int64_t *create, int64_t *mod)
{
	struct lockfs_etcd_op get = { .type = LOCKFS_ETCD_RANGE, .key = key };
	struct lockfs_etcd_op_resp r;
	int rc = lockfs_etcd_range(e->client, &get, &r);

	if (rc)
		return rc;
	rc = r.n_kvs == 1 && r.kvs[0].lease == lease && r.kvs[0].value_len == len &&
	     memcmp(r.kvs[0].value, json, len) == 0;
	if (rc) {
		*create = r.kvs[0].create_revision;
		*mod = r.kvs[0].mod_revision;
	}
	lockfs_etcd_op_resp_free(&r);
	return rc;
}

/* ---- Ops ---- */

static int etcd_acquire(struct lockfs_backend *be, const char *name,
			enum lockfs_acquire_how how, const struct lockfs_record_src *src,
			struct lockfs_place *place, struct lockfs_entry_stat *st)
{
	struct etcd_store *e = to_etcd(be);
	char rkey[LOCKFS_STORE_KEY_MAX], rend[LOCKFS_STORE_KEY_MAX], key[LOCKFS_STORE_KEY_MAX];
	struct lockfs_etcd_compare none = {
		.key = rkey, .range_end = rend, .target = LOCKFS_ETCD_VERSION,
	};
	struct lockfs_etcd_op ops[2] = {
		{ .type = LOCKFS_ETCD_PUT, .key = key },
		{ .type = LOCKFS_ETCD_RANGE, .key = rkey, .range_end = rend, .limit = 1,
		  .sort_order = LOCKFS_ETCD_SORT_ASCEND, .sort_target = LOCKFS_ETCD_SORT_CREATE,
		  .keys_only = true },
	};
	struct lockfs_etcd_txn txn = { .success = ops };
	struct lockfs_etcd_txn_resp r;
	uint64_t seq;
	int64_t lease, create, mod;
	char *json = NULL;
	size_t len = 0;
	bool granted, resent;
	int rc;

	if (how != LOCKFS_ACQ_TRY && !place)
		return -EINVAL;
	rc = name_range(e, name, rkey, rend);
	if (rc)
		return rc == -ENAMETOOLONG ? -EINVAL : rc;
	/* Watched before it is written: its mirror is then complete.  A
	 * try-lock needs no read (granted, NAME holds only our key; refused,
	 * nothing was written), so it goes ahead when etcd could not be read. */
	rc = lockfs_etcdbe_look(e, name, false);
	if (rc && how != LOCKFS_ACQ_TRY)
		return rc;
	/* A release or a session's end just before: judged now (a grant
	 * here carries no proof). */
	if (lockfs_etcdbe_unjudged(e))
		lockfs_etcdbe_settle(e, name, NULL);
	rc = need_live(e, &lease);
	if (rc)
		return rc;
	if (how == LOCKFS_ACQ_TRY && in_delay(e, name))
		return -EEXIST;
	rc = src->encode(src->arg, 0, &json, &len);
	if (rc)
		return rc;
	if (!lockfs_etcdbe_key_reuse(&e->free_keys, name, lease, &seq))
		seq = __atomic_add_fetch(&e->seq, 1, __ATOMIC_RELAXED);
	contender_key(e, name, lease, seq, key);
	ops[0].value = json;
	ops[0].value_len = len;
	ops[0].lease = lease;
	switch (how) {
	case LOCKFS_ACQ_TRY:
		/* No key in R(NAME): no holder and no waiter on any host. */
		txn.compare = &none;
		txn.n_compare = 1;
		txn.n_success = 1;
		break;
	case LOCKFS_ACQ_OR_QUEUE:
		txn.n_success = 2;
		break;
	case LOCKFS_ACQ_QUEUE:
		txn.n_success = 1;
		break;
	}
	/* Owned from before it is sent: never taken for an orphan. */
	lockfs_etcdbe_owned_add(e, key);
	rc = lockfs_etcd_txn(e->client, &txn, &r);
	resent = rc == 0 && lockfs_etcd_last_call_resent();
	if (rc) {
		/* It may have been made: undo it once etcd answers. */
		if (lockfs_etcd_outcome_unknown(rc))
			lockfs_etcdbe_session_pending(e, key, lease, 0, false);
		lockfs_etcdbe_owned_drop(e, key);
		free(json);
		return store_error(e, rc);
	}
	lockfs_etcdbe_say_reachable(e);
	create = mod = r.revision;
	if (resent) {
		/* Sent twice: KEY's own create_revision is the grant and its
		 * place, not this answer's revision (docs/etcd.md). */
		int got = resent_put(e, key, lease, json, len, &create, &mod);

		if (got < 0) {
			/* Cannot tell: undo it once etcd answers. */
			lockfs_etcdbe_session_pending(e, key, lease, 0, false);
			lockfs_etcdbe_owned_drop(e, key);
			lockfs_etcd_txn_resp_free(&r);
			free(json);
			return store_error(e, got);
		}
		if (got == 1 && how == LOCKFS_ACQ_TRY)
			r.succeeded = true; /* the first copy's compare held */
	}
	if (!r.succeeded) {
		/* Refused: nothing was written, the key is free again. */
		lockfs_etcdbe_owned_drop(e, key);
		lockfs_etcdbe_key_free(&e->free_keys, name, lease, seq);
		lockfs_etcd_txn_resp_free(&r);
		free(json);
		return -EEXIST;
	}
	granted = how == LOCKFS_ACQ_TRY ||
		  (how == LOCKFS_ACQ_OR_QUEUE && r.n_ops == 2 && r.ops[1].n_kvs == 1 &&
		   strcmp(r.ops[1].kvs[0].key, key) == 0 && !in_delay(e, name));
	/* Granted: it is the first. */
	mirror_put(e, name, key, json, len, create, mod, lease, granted ? create : 0, granted,
		   true);
	free(json);
	if (granted) {
		lockfs_etcd_txn_resp_free(&r);
		lockfs_etcdbe_owned_granted(e, key);
		lockfs_etcdbe_watch_own(e, name, mod + 1);
		granted_stat(e, key, create, mod, lease, (uint64_t)create, st);
		return 0;
	}
	lockfs_etcd_txn_resp_free(&r);
	place->rank = create;
	place->seq = seq;
	place->session = lease;
	return -EINPROGRESS;
}

/*
 * Write SRC's record with fence RANK into KEY (of NAME) while KEY is the
 * one made at RANK, unwritten since, and with HEAD_CHECK the first of the
 * line (every key of R(NAME) created at RANK or later).  A place written
 * since was written by this daemon only (a claim whose answer was lost, a
 * queue put resent): it is written again, guarded by that write's mod, so
 * a late copy of an earlier claim never overwrites a later grant.  PROOF
 * (with HEAD_CHECK; may be NULL): one more compare, that the key ahead
 * went in a release (etcd_judge.c).  One txn (two then) on C.  0 (ST
 * filled); -EEXIST: behind another, or PROOF failed; -ENOENT: gone.
 */
static int grant_place(struct etcd_store *e, struct lockfs_etcd *c, const char *name,
		       const char *key, int64_t rank, int64_t lease, bool head_check,
		       const struct lockfs_etcd_compare *proof,
		       const struct lockfs_record_src *src, struct lockfs_entry_stat *st)
{
	char rkey[LOCKFS_STORE_KEY_MAX], rend[LOCKFS_STORE_KEY_MAX];
	struct lockfs_etcd_compare cmps[4] = {
		{ .key = key, .target = LOCKFS_ETCD_CREATE, .number = rank },
		{ .key = key, .target = LOCKFS_ETCD_MOD, .number = rank },
		{ .key = rkey, .range_end = rend, .target = LOCKFS_ETCD_CREATE,
		  .result = LOCKFS_ETCD_GREATER, .number = rank - 1 },
	};
	struct lockfs_etcd_op put = { .type = LOCKFS_ETCD_PUT, .key = key, .lease = lease };
	struct lockfs_etcd_op get = { .type = LOCKFS_ETCD_RANGE, .key = key, .keys_only = true };
	struct lockfs_etcd_txn txn = { .compare = cmps,
				       .n_compare = !head_check ? 2 : proof ? 4 : 3,
				       .success = &put, .n_success = 1,
				       .failure = &get, .n_failure = 1 };
	struct lockfs_etcd_txn_resp r;
	char *json = NULL;
	size_t len = 0;
	int rc = name_range(e, name, rkey, rend);

	if (rc)
		return -ENOENT;
	if (proof)
		cmps[3] = *proof;
	rc = src->encode(src->arg, (uint64_t)rank, &json, &len);
	if (rc)
		return rc;
	put.value = json;
	put.value_len = len;
	for (int round = 0;; round++) {
		rc = lockfs_etcd_txn(c, &txn, &r);
		if (rc) {
			free(json);
			/* Maybe applied: claimed again at the next tick, or left. */
			if (lockfs_etcd_outcome_unknown(rc))
				lockfs_etcdbe_recheck_later(e, name);
			return rc == -ENOENT ? -ENOENT : store_error(e, rc);
		}
		if (r.succeeded)
			break;
		bool there = r.n_ops == 1 && r.ops[0].n_kvs == 1 &&
			     r.ops[0].kvs[0].create_revision == rank;
		int64_t mod = there ? r.ops[0].kvs[0].mod_revision : 0;

		lockfs_etcd_txn_resp_free(&r);
		if (there && mod != cmps[1].number && round == 0) {
			cmps[1].number = mod;
			continue;
		}
		free(json);
		if (there && mod != cmps[1].number) {
			lockfs_etcdbe_recheck_later(e, name);
			return -EIO;  /* written again meanwhile: the next try tells */
		}
		return there && head_check ? -EEXIST : -ENOENT;
	}
	/* Ours is the first: the claim's compare said so, or the hand-off's
	 * delete read it (no key made since is older).  No read or event of
	 * an older key may put it back ahead (gone_rank). */
	mirror_put(e, name, key, json, len, rank, r.revision, lease, rank, true, false);
	lockfs_etcdbe_owned_granted(e, key);
	granted_stat(e, key, rank, r.revision, lease, (uint64_t)rank, st);
	lockfs_etcd_txn_resp_free(&r);
	free(json);
	return 0;
}

static int etcd_claim(struct lockfs_backend *be, const char *name,
		      const struct lockfs_place *place, const struct lockfs_record_src *src,
		      struct lockfs_entry_stat *st)
{
	struct etcd_store *e = to_etcd(be);
	char key[LOCKFS_STORE_KEY_MAX], host_key[LOCKFS_STORE_KEY_MAX];
	struct lockfs_etcd_compare proof;
	int64_t lease;
	int rc, proved;

	if (lockfs_etcdbe_session_lost_lease(e, place->session))
		return -ESTALE;
	rc = need_live(e, &lease);
	if (rc)
		return rc;
	if (place->session != lease)
		return -ENOENT;
	if (in_delay(e, name))
		return -EEXIST;
	contender_key(e, name, place->session, place->seq, key);
	/* One txn: "ours, and the first" and the record.  Head-ness cannot be
	 * lost once held: no key can be made ahead of an existing one.  The
	 * key ahead just went on another host, not judged yet: the txn also
	 * proves that a release; failing, ask, then wait or claim again. */
	proved = lockfs_etcdbe_release_proof(e, name, host_key, &proof);
	if (proved < 0)
		return proved;
	rc = grant_place(e, e->client, name, key, place->rank, lease, true,
			 proved ? &proof : NULL, src, st);
	if (rc == 0 && proved)
		lockfs_etcdbe_proved(e, name, proof.number);
	if (rc == -EEXIST && proved) {
		lockfs_etcdbe_settle(e, name, NULL);
		if (lockfs_etcdbe_release_proof(e, name, host_key, &proof) != 0)
			return -EEXIST;  /* in lock-delay (or judged again) */
		rc = grant_place(e, e->client, name, key, place->rank, lease, true, NULL, src, st);
	}
	if (rc == -ENOENT)
		lockfs_etcdbe_owned_drop(e, key);  /* gone: the engine takes a new place */
	return rc;
}

static int etcd_leave(struct lockfs_backend *be, const char *name,
		      const struct lockfs_place *place)
{
	struct etcd_store *e = to_etcd(be);
	char key[LOCKFS_STORE_KEY_MAX];
	/* Its own life (made at RANK), never written since: a granted place
	 * keeps its record.  Never granted by us, a write since was a claim
	 * whose answer was lost; nobody here holds it: it goes too. */
	struct lockfs_etcd_compare cmps[2] = {
		{ .key = key, .target = LOCKFS_ETCD_CREATE, .number = place->rank },
		{ .key = key, .target = LOCKFS_ETCD_MOD, .number = place->rank },
	};
	struct lockfs_etcd_op del = { .type = LOCKFS_ETCD_DELETE, .key = key, .prev_kv = true };
	struct lockfs_etcd_txn txn = { .compare = cmps, .n_compare = 2, .success = &del,
				       .n_success = 1 };
	struct lockfs_etcd_txn_resp r;
	bool granted;
	int rc;

	contender_key(e, name, place->session, place->seq, key);
	granted = lockfs_etcdbe_owned_is_granted(e, key);
	if (!granted)
		txn.n_compare = 1;
	rc = lockfs_etcd_txn(e->client, &txn, &r);
	if (rc) {
		/* Completed once etcd answers. */
		lockfs_etcdbe_session_pending(e, key, place->session, place->rank, granted);
		if (!granted)
			lockfs_etcdbe_owned_drop(e, key);
		return store_error(e, rc);
	}
	if (r.succeeded) {
		if (r.n_ops == 1 && r.ops[0].n_kvs == 1 &&
		    r.ops[0].kvs[0].mod_revision != place->rank)
			fprintf(stderr, "lockfs: etcd: %s (create_revision %" PRId64 "): a claim "
				"etcd applied whose answer was lost, left by its waiter: deleted at "
				"revision %" PRId64 "\n", key, place->rank, r.revision);
		mirror_delete(e, name, key, r.revision, false);
		lockfs_etcdbe_key_free(&e->free_keys, name, place->session, place->seq);
	}
	if (!granted)
		lockfs_etcdbe_owned_drop(e, key);
	lockfs_etcd_txn_resp_free(&r);
	return 0;
}

static int etcd_handoff(struct lockfs_backend *be, const char *name, uint64_t identity,
			const struct lockfs_place *place, const struct lockfs_record_src *src,
			struct lockfs_entry_stat *st)
{
	struct etcd_store *e = to_etcd(be);
	char rkey[LOCKFS_STORE_KEY_MAX], rend[LOCKFS_STORE_KEY_MAX], key[LOCKFS_STORE_KEY_MAX];
	struct etcd_head old;
	struct lockfs_etcd_compare cmps[2] = {
		{ .key = old.key, .target = LOCKFS_ETCD_CREATE },
		{ .key = old.key, .target = LOCKFS_ETCD_MOD },
	};
	struct lockfs_etcd_op ops[2] = {
		{ .type = LOCKFS_ETCD_DELETE, .key = old.key },
		{ .type = LOCKFS_ETCD_RANGE, .key = rkey, .range_end = rend, .limit = 1,
		  .sort_order = LOCKFS_ETCD_SORT_ASCEND, .sort_target = LOCKFS_ETCD_SORT_CREATE,
		  .keys_only = true },
	};
	struct lockfs_etcd_txn txn = { .compare = cmps, .n_compare = 2, .success = ops,
				       .n_success = 2 };
	struct lockfs_etcd_txn_resp r;
	int64_t lease, deleted, began = lockfs_boot_ms();
	bool next_is_place;
	int rc;

	if (name_range(e, name, rkey, rend) < 0 ||
	    lockfs_etcdbe_mirror_find_identity(&e->mirror, name, identity, false, &old) < 0)
		return -ENOENT;
	if (lockfs_etcdbe_session_lost_lease(e, old.lease))
		return -ESTALE;
	rc = need_live(e, &lease);
	if (rc)
		return rc;
	cmps[0].number = old.create_rev;
	cmps[1].number = old.mod_rev;
	rc = lockfs_etcd_txn(e->client, &txn, &r);
	if (rc)
		return store_error(e, rc);
	if (!r.succeeded) {
		lockfs_etcd_txn_resp_free(&r);
		return -ENOENT;
	}
	mirror_delete(e, name, old.key, r.revision, false);
	lockfs_etcdbe_owned_drop(e, old.key);
	own_key_freed(e, name, old.key, old.lease);
	deleted = r.revision;
	contender_key(e, name, place->session, place->seq, key);
	next_is_place = r.n_ops == 2 && r.ops[1].n_kvs == 1 &&
			strcmp(r.ops[1].kvs[0].key, key) == 0;
	lockfs_etcd_txn_resp_free(&r);
	/* Someone else's key ahead (another host's, foreign): PLACE waits. */
	if (!next_is_place || place->session != lease)
		return 1;
	/* A second call, within the op's bound only; else PLACE stays in
	 * line and the release's report brings the engine back to claim. */
	if (lockfs_boot_ms() - began > LOCKFS_ETCD_TIMEOUT_MS - SHORT_TIMEOUT_MS)
		return 1;
	rc = grant_place(e, e->client_short, name, key, place->rank, lease, false, NULL, src, st);
	/* Granted: the delete's echo is ours (else it brings the engine back). */
	if (rc == 0)
		note_own(e, name, key, deleted);
	return rc == -ENOENT || rc == -EIO ? 1 : rc;
}

static int etcd_update(struct lockfs_backend *be, const char *name, uint64_t identity,
		       enum lockfs_update_how how, const struct lockfs_record_src *src,
		       struct lockfs_entry_stat *st)
{
	struct etcd_store *e = to_etcd(be);
	char rkey[LOCKFS_STORE_KEY_MAX], rend[LOCKFS_STORE_KEY_MAX];
	struct etcd_head h;
	struct lockfs_etcd_compare cmps[3] = {
		{ .key = h.key, .target = LOCKFS_ETCD_CREATE },
		{ .key = h.key, .target = LOCKFS_ETCD_MOD },
		/* GRANT: no key after the holder's: nobody waits, on any host. */
		{ .key = rkey, .range_end = rend, .target = LOCKFS_ETCD_CREATE,
		  .result = LOCKFS_ETCD_LESS },
	};
	struct lockfs_etcd_op put = { .type = LOCKFS_ETCD_PUT, .key = h.key };
	struct lockfs_etcd_op get = { .type = LOCKFS_ETCD_RANGE, .key = h.key, .keys_only = true };
	struct lockfs_etcd_txn txn = { .compare = cmps, .success = &put, .n_success = 1,
				       .failure = &get, .n_failure = 1 };
	struct lockfs_etcd_txn_resp r;
	struct lockfs_entry_stat tmp;
	char *json = NULL;
	size_t len = 0;
	int rc;

	if (name_range(e, name, rkey, rend) < 0 ||
	    lockfs_etcdbe_mirror_find_identity(&e->mirror, name, identity, false, &h) < 0)
		return -ENOENT;
	if (lockfs_etcdbe_session_lost_lease(e, h.lease))
		return -ESTALE;
	if (how == LOCKFS_UPD_GRANT) {
		rc = need_live(e, NULL);
		if (rc)
			return rc;
	}
	cmps[0].number = h.create_rev;
	cmps[1].number = h.mod_rev;
	cmps[2].number = h.create_rev + 1;
	txn.n_compare = how == LOCKFS_UPD_GRANT ? 3 : 2;
	rc = src->encode(src->arg, 0, &json, &len);
	if (rc)
		return rc;
	put.value = json;
	put.value_len = len;
	put.lease = h.lease;  /* a put without it would detach the key */
	rc = lockfs_etcd_txn(e->client, &txn, &r);
	if (rc) {
		free(json);
		return store_error(e, rc);
	}
	if (!r.succeeded && lockfs_etcd_last_call_resent()) {
		/* Sent twice: the second copy's compare on mod failed on the
		 * first copy's own write.  KEY holding our record, made at
		 * the same revision, is this update done. */
		int64_t create = 0, mod = 0;
		int got = resent_put(e, h.key, h.lease, json, len, &create, &mod);

		if (got == 1 && create == h.create_rev && mod != h.mod_rev) {
			lockfs_etcd_txn_resp_free(&r);
			r = (struct lockfs_etcd_txn_resp){ .revision = mod, .succeeded = true };
		}
	}
	if (!r.succeeded) {
		bool there = r.n_ops == 1 && r.ops[0].n_kvs == 1 &&
			     r.ops[0].kvs[0].create_revision == h.create_rev &&
			     r.ops[0].kvs[0].mod_revision == h.mod_rev;

		lockfs_etcd_txn_resp_free(&r);
		free(json);
		return how == LOCKFS_UPD_GRANT && there ? -EAGAIN : -ENOENT;
	}
	mirror_put(e, name, h.key, json, len, h.create_rev, r.revision, h.lease, 0, true, false);
	if (how == LOCKFS_UPD_GRANT)
		lockfs_etcdbe_mirror_set_grant(&e->mirror, h.key, r.revision, r.revision);
	if (!st)
		st = &tmp;
	granted_stat(e, h.key, h.create_rev, r.revision, h.lease, 0, st);
	if (how == LOCKFS_UPD_GRANT) {
		st->fence = (uint64_t)r.revision;
	} else {
		struct etcd_head now;

		st->fence = lockfs_etcdbe_mirror_find_identity(&e->mirror, name, st->identity, false,
						      &now) == 0 ?
			    head_fence(&now) : (uint64_t)h.create_rev;
	}
	lockfs_etcd_txn_resp_free(&r);
	free(json);
	return 0;
}

static int etcd_release(struct lockfs_backend *be, const char *name, uint64_t identity)
{
	struct etcd_store *e = to_etcd(be);
	struct etcd_head h;
	/* Guarded by create_revision: a late or retried release never
	 * removes a successor's key.  The identity's mod is checked against
	 * the mirror above. */
	struct lockfs_etcd_compare cmp = { .key = h.key, .target = LOCKFS_ETCD_CREATE };
	struct lockfs_etcd_op del = { .type = LOCKFS_ETCD_DELETE, .key = h.key };
	struct lockfs_etcd_txn txn = { .compare = &cmp, .n_compare = 1, .success = &del,
				       .n_success = 1 };
	struct lockfs_etcd_txn_resp r;
	int64_t began = lockfs_boot_ms();
	bool resent = false;
	int rc;

	if (lockfs_etcdbe_mirror_find_identity(&e->mirror, name, identity, false, &h) < 0)
		return -ENOENT;
	if (lockfs_etcdbe_session_lost_lease(e, h.lease))
		return -ESTALE;
	cmp.number = h.create_rev;
	/* Its echo may come before the answer (etcd_watch.c). */
	lockfs_etcdbe_owned_deleting(e, h.key, true);
	/* Guarded by create_revision, harmless to send again: tried in short
	 * calls until the op's bound, riding out a leader election; EIO means
	 * etcd stayed unavailable for the whole bound (docs/etcd.md). */
	for (;;) {
		int64_t tried_at = lockfs_boot_ms();

		rc = lockfs_etcd_txn_resendable(e->client_short, &txn, &r);
		resent = resent || lockfs_etcd_last_call_resent();
		if (rc == 0 || !lockfs_etcd_outcome_unknown(rc) ||
		    lockfs_boot_ms() - began > LOCKFS_ETCD_TIMEOUT_MS - SHORT_TIMEOUT_MS)
			break;
		resent = true;
		/* Failed at once (refused, "no leader"): give an election a
		 * moment rather than spinning. */
		if (lockfs_boot_ms() - tried_at < RELEASE_RETRY_GAP_MS)
			nanosleep(&(struct timespec){ .tv_nsec = RELEASE_RETRY_GAP_MS * 1000000L },
				  NULL);
	}
	if (rc) {
		lockfs_etcdbe_owned_deleting(e, h.key, false);
		return store_error(e, rc);
	}
	lockfs_etcdbe_say_reachable(e);
	/* The key gone: removed by a first copy of this delete, by the
	 * session's end, or behind our back (docs/etcd.md, "Failures"). */
	rc = r.succeeded ? 0 : lockfs_etcdbe_release_missed(e, h.lease, resent);
	r.succeeded = rc == 0;
	lockfs_etcdbe_owned_drop(e, h.key);  /* deleted, or gone already */
	if (r.succeeded) {
		mirror_delete(e, name, h.key, r.revision, true);
		own_key_freed(e, name, h.key, h.lease);
	}
	lockfs_etcd_txn_resp_free(&r);
	return rc;
}

static int etcd_adopt(struct lockfs_backend *be, const char *name, uint64_t identity,
		      struct lockfs_entry_stat *st)
{
	struct etcd_store *e = to_etcd(be);
	struct etcd_head h;
	struct lockfs_etcd_compare cmps[2] = {
		{ .key = h.key, .target = LOCKFS_ETCD_CREATE },
		{ .key = h.key, .target = LOCKFS_ETCD_LEASE },
	};
	struct lockfs_etcd_op put = { .type = LOCKFS_ETCD_PUT, .key = h.key };
	struct lockfs_etcd_txn txn = { .compare = cmps, .n_compare = 2, .success = &put,
				       .n_success = 1 };
	struct lockfs_etcd_txn_resp r;
	int64_t lease;
	int rc;

	if (lockfs_etcdbe_mirror_find_identity(&e->mirror, name, identity, true, &h) < 0)
		return -ENOENT;
	rc = need_live(e, &lease);
	if (rc) {
		e->adopt_failed = true;
		free(h.value);
		return rc;
	}
	if (h.lease == lease) {
		/* Ours already. */
		lockfs_etcdbe_owned_add(e, h.key);
		lockfs_etcdbe_owned_granted(e, h.key);
		if (st)
			fill_stat(e, &h, st);
		free(h.value);
		return 0;
	}
	/* Moved to this daemon's lease with create_revision (its place and
	 * fence) kept: the lock is never free in between. */
	cmps[0].number = h.create_rev;
	cmps[1].number = h.lease;
	put.value = h.value ? h.value : "";
	put.value_len = h.value_len;
	put.lease = lease;
	rc = lockfs_etcd_txn(e->client, &txn, &r);
	if (rc) {
		/* Not moved (or, unknown, moved: then start() keeping the old
		 * lease costs nothing). */
		e->adopt_failed = true;
		free(h.value);
		return store_error(e, rc);
	}
	if (!r.succeeded) {
		/* Gone (the earlier session expired) or changed: never
		 * re-created. */
		lockfs_etcd_txn_resp_free(&r);
		free(h.value);
		return -ENOENT;
	}
	lockfs_etcdbe_owned_add(e, h.key);
	lockfs_etcdbe_owned_granted(e, h.key);
	mirror_put(e, name, h.key, h.value ? h.value : "", h.value_len, h.create_rev, r.revision,
		   lease, 0, true, false);
	if (st) {
		struct etcd_head now;

		if (lockfs_etcdbe_mirror_find_identity(&e->mirror, name,
					      lockfs_etcdbe_identity(h.create_rev, r.revision), false,
					      &now) == 0)
			fill_stat(e, &now, st);
		else
			granted_stat(e, h.key, h.create_rev, r.revision, lease,
				     head_fence(&h), st);
	}
	lockfs_etcd_txn_resp_free(&r);
	free(h.value);
	return 0;
}

/*
 * NAME's head as read() and stat() show it, into *H (with a malloc'd copy
 * of its record in H->value when WANT_VALUE) and ST (may be NULL).  0;
 * -ENOENT: not held, or held by a key on a lost lease of this daemon --
 * not its any more.
 */
static int shown_head(struct etcd_store *e, const char *name, bool want_value,
		      struct etcd_head *h, struct lockfs_entry_stat *st)
{
	/* A name not watched here is read first (exact), then watched for
	 * a while (etcd_interest.c).  When etcd cannot be read, the mirror
	 * answers as it can: reads never fail for want of etcd. */
	int rc = lockfs_etcdbe_look(e, name, true);

	/* Exact: a delete not judged yet is judged now (one read), unless a
	 * waiter here heads NAME -- its claim judges it, and this may be the
	 * engine's own look on the way to that claim. */
	if (rc == 0 && lockfs_etcdbe_unjudged(e) && !lockfs_etcdbe_heads_here(e, name))
		lockfs_etcdbe_settle(e, name, NULL);
	if (rc == 0 || rc == -EIO)
		rc = lockfs_etcdbe_mirror_head(&e->mirror, name, want_value, now_ms(), h);
	if (rc)
		return rc;
	if (h->has_key && !h->delay_until_ms && lockfs_etcdbe_session_lost_lease(e, h->lease)) {
		free(h->value);
		return -ENOENT;
	}
	if (st)
		fill_stat(e, h, st);
	return 0;
}

static int etcd_read(struct lockfs_backend *be, const char *name, char **record, size_t *len,
		     struct lockfs_entry_stat *st)
{
	struct etcd_head h;
	int rc;

	*record = NULL;
	*len = 0;
	rc = shown_head(to_etcd(be), name, true, &h, st);
	if (rc)
		return rc;
	*record = h.value;
	*len = h.value ? h.value_len : 0;
	return 0;
}

static int etcd_stat(struct lockfs_backend *be, const char *name,
		     struct lockfs_entry_stat *st, bool likely_held)
{
	struct etcd_head h;
	/* No copy of the record: the stat needs only its fence. */
	int rc = shown_head(to_etcd(be), name, false, &h, st);

	if (rc == 0)
		free(h.value);
	return rc;
}

static void etcd_close(struct lockfs_backend *be)
{
	lockfs_etcdbe_close(to_etcd(be));
}

/* No foreign_stale (a holder ends by its lease), no check (the session watches). */
static const struct lockfs_backend_ops etcd_ops = {
	.acquire = etcd_acquire,
	.claim = etcd_claim,
	.leave = etcd_leave,
	.handoff = etcd_handoff,
	.update = etcd_update,
	.release = etcd_release,
	.adopt = etcd_adopt,
	.read = etcd_read,
	.stat = etcd_stat,
	.list = lockfs_etcdbe_list_op,
	.list_prefix = lockfs_etcdbe_list_prefix,
	.line = lockfs_etcdbe_line,
	.follow = lockfs_etcdbe_follow,
	.session = lockfs_etcdbe_session_op,
	.start = lockfs_etcdbe_start_op,
	.close = etcd_close,
};

/* ---- Open and close (etcd_open.c) ---- */

static int etcd_open(const struct lockfs_backend_config *cfg, struct lockfs_backend **out)
{
	struct etcd_store *e;
	int rc = lockfs_etcdbe_open(cfg, &e);

	if (rc)
		return rc;
	e->base.ops = &etcd_ops;
	e->base.kind = &lockfs_backend_etcd_kind;
	e->base.caps = LOCKFS_BE_SESSIONS | LOCKFS_BE_RETRY_RELEASES | LOCKFS_BE_SLOTS;
	*out = &e->base;
	return 0;
}

const struct lockfs_backend_kind lockfs_backend_etcd_kind = {
	.name = "etcd",
	.option_keys = lockfs_backend_etcd_option_keys,
	.help =
	"    -o etcd=URL[;URL...]  etcd client URLs (backend=etcd; required)\n"
	"    -o prefix=PREFIX      key prefix of the lock namespace (default /lockfs/)\n"
	"    -o host=NAME          this daemon's name, unique per prefix (default: host name)\n"
	"    -o ttl=SECONDS        session lease (default 10, at least 2)\n"
	"    -o lock_delay=SECONDS nobody gets a lock whose holder's session expired, for\n"
	"                          this long (default 5)\n"
	"    -o etcd_cacert=FILE,etcd_cert=FILE,etcd_key=FILE  TLS for https:// URLs\n"
	"    -o backing=DIR        this host's audit log and pid lock (default "
	LOCKFS_BACKEND_DEFAULT_BACKING ")\n",
	.open = etcd_open,
};
