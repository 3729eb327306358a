/*
 * The backing store behind the lock engine.  The engine speaks only this
 * interface, so a distributed backend can replace the directory one
 * without touching fs/.  Records are opaque bytes here (the engine encodes
 * and parses them); a backend only has to make acquisition indivisible and
 * removal conditional on the token.
 *
 * Every call returns 0 or a negative errno.  Calls may run concurrently
 * from several threads; a backend serialises what it must.
 *
 * Errors of the store are mapped here, in the backend, and nowhere else:
 * besides the answers each call documents (-EEXIST: held, -ENOENT: not
 * held) and -ENOMEM, a call returns -EIO when the store cannot do it, and
 * the backend says once on stderr what is wrong (not once per call).  The
 * engine passes what it gets straight through to the caller, so an errno
 * of the medium must never leak: an EPERM from an immutable directory
 * would read as "not yours", an ENOENT from a deleted one as "not held".
 * Only the backend knows which errno of its medium is an answer and which
 * a failure.
 */
#ifndef LOCKFS_BACKEND_V1_H
#define LOCKFS_BACKEND_V1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* What a backend knows of a held lock besides its record. */
struct lockfs_entry_stat {
	uid_t uid;          /* owner of the stored lock (foreign locks: of DIR/NAME.lock) */
	gid_t gid;
	int64_t mtime_ms;   /* when the stored lock was made */
	uint64_t identity;  /* changes whenever the stored lock or its record
			       changes: while it stays, the record read
			       with it is still what the store holds */
};

/* Called once per held lock by list(); return non-zero to stop early. */
typedef int (*lockfs_list_cb)(void *arg, const char *name);

struct lockfs_backend;

struct lockfs_backend_ops {
	/* Store RECORD under NAME if and only if NAME is not held, in one
	 * indivisible step, and fill ST.  0, -EEXIST when held, -errno. */
	int (*acquire)(struct lockfs_backend *be, const char *name,
		       const char *record, size_t len, struct lockfs_entry_stat *st);

	/* Read NAME's record into a malloc'd buffer (*RECORD, *LEN).  When the
	 * lock is held but carries no readable record (a foreign lock),
	 * returns 0 with *RECORD = NULL.  ST may be NULL.
	 * 0, -ENOENT when not held, -errno. */
	int (*read)(struct lockfs_backend *be, const char *name,
		    char **record, size_t *len, struct lockfs_entry_stat *st);

	/* Cheap existence check: fill ST (may be NULL).  LIKELY_HELD is a
	 * hint (the engine knows a record for NAME) that lets the backend
	 * look in the right place first.  0, -ENOENT, -errno. */
	int (*stat)(struct lockfs_backend *be, const char *name,
		    struct lockfs_entry_stat *st, bool likely_held);

	/* Replace NAME's record with RECORD, only while the stored lock is the
	 * one IDENTITY names, and fill ST with the new identity (ST NULL: the
	 * caller will stat() for it).
	 * 0, -ENOENT when gone or replaced, -errno. */
	int (*update)(struct lockfs_backend *be, const char *name, uint64_t identity,
		      const char *record, size_t len, struct lockfs_entry_stat *st);

	/* Remove NAME, only while the stored lock is the one IDENTITY names.
	 * 0, -ENOENT when gone or replaced, -errno. */
	int (*release)(struct lockfs_backend *be, const char *name, uint64_t identity);

	/* Call CB for every held lock, in no particular order. */
	int (*list)(struct lockfs_backend *be, lockfs_list_cb cb, void *arg);

	/* Is the store still there?  Called about every tick, so that a
	 * store gone bad is noticed (and said) without waiting for a write.
	 * 0, or -EIO (said on stderr).  May be NULL. */
	int (*check)(struct lockfs_backend *be);

	void (*destroy)(struct lockfs_backend *be);
};

struct lockfs_backend {
	const struct lockfs_backend_ops *ops;
};

/*
 * The directory backend (core/backend/dir_v1.c), compatible with the seed
 * tool: a lock is the directory DIR/NAME.lock, made by rename(2) with
 * RENAME_NOREPLACE from a temporary directory that already holds the
 * record file DIR/NAME.lock/owner.json.  The identity of a lock with a
 * record is that of the record file (inode, times, size), so one stat
 * tells whether the record is still the one read before.
 *
 * Opens DIRFD-relative paths on DIRFD (which it dups).  PATH is where
 * DIRFD was opened: once it no longer names that directory (removed, or
 * replaced by another) or the directory is deleted, every call fails with
 * -EIO for good -- a DIR made anew is never adopted -- and that is said
 * once on stderr.  Returns 0 and *OUT, or -errno (-EINVAL when the
 * filesystem lacks RENAME_NOREPLACE).
 */
int lockfs_backend_dir_open(struct lockfs_backend **out, int dirfd, const char *path)
	__attribute__((warn_unused_result));

#endif
