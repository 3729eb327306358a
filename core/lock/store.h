/*
 * The store, as the engine reaches it (store.c): one thin wrapper per op
 * of struct lockfs_backend_ops (include/lockfs/backend.h, which says what
 * each one does and returns), as SQLite's os.c wraps its VFS.  Here, and
 * only here, live the defaults of the optional ops, the checks of what
 * the engine passes, and a point where a unit test makes the store fail.
 * Every file of core/ calls these, never be->ops->X itself.
 */
#ifndef LOCKFS_LOCK_STORE_H
#define LOCKFS_LOCK_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "lockfs/backend.h"

int lockfs_store_acquire(struct lockfs_backend *be, const char *name,
			 enum lockfs_acquire_how how, const struct lockfs_record_src *src,
			 struct lockfs_place *place, struct lockfs_entry_stat *st);
int lockfs_store_claim(struct lockfs_backend *be, const char *name,
		       const struct lockfs_place *place, const struct lockfs_record_src *src,
		       struct lockfs_entry_stat *st);
int lockfs_store_leave(struct lockfs_backend *be, const char *name,
		       const struct lockfs_place *place);
int lockfs_store_handoff(struct lockfs_backend *be, const char *name, uint64_t identity,
			 const struct lockfs_place *place, const struct lockfs_record_src *src,
			 struct lockfs_entry_stat *st);
int lockfs_store_update(struct lockfs_backend *be, const char *name, uint64_t identity,
			enum lockfs_update_how how, const struct lockfs_record_src *src,
			struct lockfs_entry_stat *st);
int lockfs_store_release(struct lockfs_backend *be, const char *name, uint64_t identity);
int lockfs_store_adopt(struct lockfs_backend *be, const char *name, uint64_t identity,
		       struct lockfs_entry_stat *st);
int lockfs_store_read(struct lockfs_backend *be, const char *name, char **record, size_t *len,
		      struct lockfs_entry_stat *st);
int lockfs_store_stat(struct lockfs_backend *be, const char *name, struct lockfs_entry_stat *st,
		      bool likely_held);
int lockfs_store_list(struct lockfs_backend *be, lockfs_list_cb cb, void *arg);
/* The held names that begin with PREFIX, as the store has them now
 * (be->ops->list_prefix, or list() filtered). */
int lockfs_store_list_prefix(struct lockfs_backend *be, const char *prefix, lockfs_list_cb cb,
			     void *arg);
/* be->ops->line; -EOPNOTSUPP for a store without one (its line is this
 * daemon's queue). */
int lockfs_store_line(struct lockfs_backend *be, const char *name, lockfs_line_cb cb, void *arg);
/* A store without a staleness policy (foreign_stale NULL): 0, never stale. */
int lockfs_store_foreign_stale(struct lockfs_backend *be, const char *name,
			       struct lockfs_entry_stat *st);
int lockfs_store_session(struct lockfs_backend *be, const char *host,
			 struct lockfs_session *out);
int lockfs_store_start(struct lockfs_backend *be, lockfs_change_fn fn, void *arg);
/* A store that hears of every change anyway (follow NULL): 0. */
int lockfs_store_follow(struct lockfs_backend *be, bool all, const char *const *names, size_t n);
/* A store that does not say (check NULL): 0, still there. */
int lockfs_store_check(struct lockfs_backend *be);
void lockfs_store_close(struct lockfs_backend *be);

/* Does BE give foreign locks up by age (a foreign_stale op and an age
 * limit, dir's -o stale)?  Else lockfs_recovery_stale_foreign need not
 * be asked. */
bool lockfs_store_stales_foreign(const struct lockfs_backend *be);

/* For unit tests only.  The ops a fault can be injected into. */
enum lockfs_store_op {
	LOCKFS_STORE_ACQUIRE, LOCKFS_STORE_CLAIM, LOCKFS_STORE_LEAVE, LOCKFS_STORE_HANDOFF,
	LOCKFS_STORE_UPDATE, LOCKFS_STORE_RELEASE, LOCKFS_STORE_ADOPT, LOCKFS_STORE_READ,
	LOCKFS_STORE_STAT, LOCKFS_STORE_LIST, LOCKFS_STORE_FOREIGN_STALE, LOCKFS_STORE_SESSION,
	LOCKFS_STORE_START, LOCKFS_STORE_CHECK,
};

/*
 * For unit tests only: before each call of op OP (on NAME: NULL for list,
 * session, start and check), FN is asked; a -errno it returns is the
 * store's answer, and the store is not called.  0: the call goes through.
 * FAULT NULL: none (the default).  Set it while no other thread calls the
 * store; FAULT must stay valid until it is replaced.
 */
struct lockfs_store_fault {
	int (*fn)(void *arg, enum lockfs_store_op op, const char *name);
	void *arg;
};
void lockfs_store_fault_set(const struct lockfs_store_fault *fault);

/* How many times the store answered EIO (it could not be reached, or
 * refused), since the daemon started: for M/.metrics. */
uint64_t lockfs_store_errors(void);

#endif
