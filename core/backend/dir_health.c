/*
 * Is DIR there, and saying what is wrong with it (dir_internal.h): the one
 * place where the dir store's errors are mapped to EIO and said on stderr,
 * once per condition.  A leaf of the store: calls nothing of its other
 * files.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dir_internal.h"

static const char *const work_what[WORK_KINDS] = {
	[WORK_ENTRIES] = "create or rename entries in it",
	[WORK_RECORDS] = "write lock records in it",
	[WORK_READ] = "read it",
};

/*
 * Is DIR still the directory the daemon opened?  No once it was removed
 * (its link count is 0) or, with AT_PATH, once its path names another
 * directory (moved away and made anew) or nothing.  A path that cannot
 * be looked up for another reason (EACCES) gives no evidence: yes.
 */
bool lockfs_dir_is_there(struct dir_store *d, bool at_path)
{
	struct stat st;

	if (fstat(d->dirfd, &st) < 0 || st.st_nlink == 0)
		return false;
	if (!at_path)
		return true;
	if (stat(d->path, &st) < 0)
		return errno != ENOENT && errno != ENOTDIR;
	return st.st_dev == d->dev && st.st_ino == d->ino;
}

/*
 * DIR was removed or replaced: from now on every request fails with EIO.
 * A directory made anew at its path is not adopted -- the locks held in
 * the old one are gone, and the new one may already be in use by another
 * tool -- so fail closed until someone restarts the daemon.  Says so once.
 * Returns -EIO.
 */
int lockfs_dir_vanish(struct dir_store *d)
{
	if (!__atomic_exchange_n(&d->vanished, true, __ATOMIC_ACQ_REL))
		fprintf(stderr, "lockfs: backing dir %s was removed or replaced while lockfs "
			"served it: every request now fails with EIO and the locks it held are "
			"lost to this daemon; a directory made anew there is not adopted: "
			"unmount and start lockfs again (restart) to serve locks from it\n",
			d->path);
	return -EIO;
}

/*
 * WORK failed in DIR with ERR (a positive errno that is not an answer
 * about a lock).  Says what is wrong once per condition -- when WORK
 * starts failing, or fails with another errno -- never per request.
 * Returns -EIO, or -ENOMEM (the daemon's own trouble, not the store's).
 */
int lockfs_dir_say_failed(struct dir_store *d, enum store_work work, int err)
{
	if (err == ENOMEM)
		return -ENOMEM;
	if (!lockfs_dir_is_there(d, true))
		return lockfs_dir_vanish(d);
	pthread_mutex_lock(&d->health_mu);
	if (d->failing[work] != err) {
		__atomic_store_n(&d->failing[work], err, __ATOMIC_RELAXED);
		fprintf(stderr, "lockfs: backing dir %s: cannot %s (%s); requests that need it "
			"fail with EIO until it can\n", d->path, work_what[work], strerror(err));
	}
	pthread_mutex_unlock(&d->health_mu);
	return -EIO;
}

/* WORK just worked: if it was failing, say that it works again (once). */
void lockfs_dir_say_works(struct dir_store *d, enum store_work work)
{
	if (!__atomic_load_n(&d->failing[work], __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&d->health_mu);
	if (d->failing[work]) {
		__atomic_store_n(&d->failing[work], 0, __ATOMIC_RELAXED);
		fprintf(stderr, "lockfs: backing dir %s: can %s again\n", d->path,
			work_what[work]);
	}
	pthread_mutex_unlock(&d->health_mu);
}

/* ENOENT for a lock that is not (or no longer) there -- unless it is DIR
 * that is gone: then -EIO. */
int lockfs_dir_not_held(struct dir_store *d)
{
	return lockfs_dir_is_there(d, false) ? -ENOENT : lockfs_dir_vanish(d);
}
