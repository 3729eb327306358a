/* The store's ops behind one wrapper each; see store.h. */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "store.h"

/* The unit tests' fault, if any (store.h).  Read on every call: a relaxed
 * load, since it is set before the calls it affects start. */
static const struct lockfs_store_fault *fault;

void lockfs_store_fault_set(const struct lockfs_store_fault *f)
{
	__atomic_store_n(&fault, f, __ATOMIC_RELEASE);
}

/* The injected answer to OP on NAME: a -errno, or 0 (go on). */
static int injected(enum lockfs_store_op op, const char *name)
{
	const struct lockfs_store_fault *f = __atomic_load_n(&fault, __ATOMIC_ACQUIRE);
	int rc;

	if (!f)
		return 0;
	rc = f->fn(f->arg, op, name);
	assert(rc <= 0);
	return rc;
}

/* -EIO answers of the store (metrics.c's lockfs_store_errors_total):
 * one relaxed add on a failure, nothing on success. */
static uint64_t store_errors;

static int counted(int rc)
{
	if (rc == -EIO)
		__atomic_add_fetch(&store_errors, 1, __ATOMIC_RELAXED);
	return rc;
}

uint64_t lockfs_store_errors(void)
{
	return __atomic_load_n(&store_errors, __ATOMIC_RELAXED);
}

/* What every call needs: an open store that has the op. */
#define HAS_OP(be, op) ((be) && (be)->ops && (be)->ops->op)

int lockfs_store_acquire(struct lockfs_backend *be, const char *name,
			 enum lockfs_acquire_how how, const struct lockfs_record_src *src,
			 struct lockfs_place *place, struct lockfs_entry_stat *st)
{
	int rc = injected(LOCKFS_STORE_ACQUIRE, name);

	/* Only TRY takes no place in line. */
	assert(HAS_OP(be, acquire) && name && src && (place || how == LOCKFS_ACQ_TRY));
	return counted(rc ? rc : be->ops->acquire(be, name, how, src, place, st));
}

int lockfs_store_claim(struct lockfs_backend *be, const char *name,
		       const struct lockfs_place *place, const struct lockfs_record_src *src,
		       struct lockfs_entry_stat *st)
{
	int rc = injected(LOCKFS_STORE_CLAIM, name);

	assert(HAS_OP(be, claim) && name && place && src);
	return counted(rc ? rc : be->ops->claim(be, name, place, src, st));
}

int lockfs_store_leave(struct lockfs_backend *be, const char *name,
		       const struct lockfs_place *place)
{
	int rc = injected(LOCKFS_STORE_LEAVE, name);

	assert(HAS_OP(be, leave) && name && place);
	return counted(rc ? rc : be->ops->leave(be, name, place));
}

int lockfs_store_handoff(struct lockfs_backend *be, const char *name, uint64_t identity,
			 const struct lockfs_place *place, const struct lockfs_record_src *src,
			 struct lockfs_entry_stat *st)
{
	int rc = injected(LOCKFS_STORE_HANDOFF, name);

	assert(HAS_OP(be, handoff) && name && place && src);
	return counted(rc ? rc : be->ops->handoff(be, name, identity, place, src, st));
}

int lockfs_store_update(struct lockfs_backend *be, const char *name, uint64_t identity,
			enum lockfs_update_how how, const struct lockfs_record_src *src,
			struct lockfs_entry_stat *st)
{
	int rc = injected(LOCKFS_STORE_UPDATE, name);

	assert(HAS_OP(be, update) && name && src);
	return counted(rc ? rc : be->ops->update(be, name, identity, how, src, st));
}

int lockfs_store_release(struct lockfs_backend *be, const char *name, uint64_t identity)
{
	int rc = injected(LOCKFS_STORE_RELEASE, name);

	assert(HAS_OP(be, release) && name);
	return counted(rc ? rc : be->ops->release(be, name, identity));
}

int lockfs_store_adopt(struct lockfs_backend *be, const char *name, uint64_t identity,
		       struct lockfs_entry_stat *st)
{
	int rc = injected(LOCKFS_STORE_ADOPT, name);

	assert(HAS_OP(be, adopt) && name);
	return counted(rc ? rc : be->ops->adopt(be, name, identity, st));
}

int lockfs_store_read(struct lockfs_backend *be, const char *name, char **record, size_t *len,
		      struct lockfs_entry_stat *st)
{
	int rc = injected(LOCKFS_STORE_READ, name);

	assert(HAS_OP(be, read) && name && record && len);
	return counted(rc ? rc : be->ops->read(be, name, record, len, st));
}

int lockfs_store_stat(struct lockfs_backend *be, const char *name, struct lockfs_entry_stat *st,
		      bool likely_held)
{
	int rc = injected(LOCKFS_STORE_STAT, name);

	assert(HAS_OP(be, stat) && name);
	return counted(rc ? rc : be->ops->stat(be, name, st, likely_held));
}

int lockfs_store_list(struct lockfs_backend *be, lockfs_list_cb cb, void *arg)
{
	int rc = injected(LOCKFS_STORE_LIST, NULL);

	assert(HAS_OP(be, list) && cb);
	return counted(rc ? rc : be->ops->list(be, cb, arg));
}

struct prefixed {
	const char *prefix;
	lockfs_list_cb cb;
	void *arg;
};

static int if_prefixed(void *arg, const char *name)
{
	const struct prefixed *p = arg;

	return strncmp(name, p->prefix, strlen(p->prefix)) == 0 ? p->cb(p->arg, name) : 0;
}

int lockfs_store_list_prefix(struct lockfs_backend *be, const char *prefix, lockfs_list_cb cb,
			     void *arg)
{
	int rc = injected(LOCKFS_STORE_LIST, NULL);
	struct prefixed p = { prefix, cb, arg };

	assert(HAS_OP(be, list) && cb && prefix);
	if (rc)
		return counted(rc);
	if (HAS_OP(be, list_prefix))
		return counted(be->ops->list_prefix(be, prefix, cb, arg));
	return counted(be->ops->list(be, if_prefixed, &p));
}

int lockfs_store_line(struct lockfs_backend *be, const char *name, lockfs_line_cb cb, void *arg)
{
	if (!HAS_OP(be, line))
		return -EOPNOTSUPP;
	return be->ops->line(be, name, cb, arg);
}

int lockfs_store_foreign_stale(struct lockfs_backend *be, const char *name,
			       struct lockfs_entry_stat *st)
{
	int rc = injected(LOCKFS_STORE_FOREIGN_STALE, name);

	assert(be && be->ops && name && st);
	if (rc)
		return rc;
	return be->ops->foreign_stale ? be->ops->foreign_stale(be, name, st) : 0;
}

int lockfs_store_session(struct lockfs_backend *be, const char *host,
			 struct lockfs_session *out)
{
	int rc = injected(LOCKFS_STORE_SESSION, NULL);

	assert(HAS_OP(be, session) && out);
	return rc ? rc : be->ops->session(be, host, out);
}

int lockfs_store_start(struct lockfs_backend *be, lockfs_change_fn fn, void *arg)
{
	int rc = injected(LOCKFS_STORE_START, NULL);

	assert(HAS_OP(be, start) && fn);
	return rc ? rc : be->ops->start(be, fn, arg);
}

int lockfs_store_follow(struct lockfs_backend *be, bool all, const char *const *names, size_t n)
{
	assert(be && be->ops && (names || !n));
	return be->ops->follow ? counted(be->ops->follow(be, all, names, n)) : 0;
}

int lockfs_store_check(struct lockfs_backend *be)
{
	int rc = injected(LOCKFS_STORE_CHECK, NULL);

	assert(be && be->ops);
	if (rc)
		return rc;
	return be->ops->check ? be->ops->check(be) : 0;
}

void lockfs_store_close(struct lockfs_backend *be)
{
	assert(HAS_OP(be, close));
	be->ops->close(be);
}

bool lockfs_store_stales_foreign(const struct lockfs_backend *be)
{
	return be->ops->foreign_stale && be->stale_s;
}
