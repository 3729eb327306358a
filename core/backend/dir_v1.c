/*
 * The directory backend: the seed tool's protocol, made safe.
 *
 * A lock NAME is held exactly while an entry DIR/NAME.lock exists (the
 * seed's `mkdir DIR/NAME.lock`).  lockfs builds the lock directory with its
 * record inside under a temporary name, then renames it into place with
 * RENAME_NOREPLACE: one indivisible step that fails with EEXIST if anyone,
 * lockfs or the seed's script, holds NAME, and that never shows a lock
 * without its record.  Release renames the lock aside first (it disappears
 * at once, whole), then clears the leftover.
 *
 * Temporary and leftover entries start with ".lockfs-", which no lock
 * name can (names may not start with '.').
 *
 * Nothing in DIR is trusted.  Whoever owns DIR may plant anything in it: a
 * symlink, a FIFO, a hard link to a file elsewhere, a directory of another
 * user.  So no symlink is ever followed on the way to a file the daemon
 * writes, every record in a new lock directory and every updated record
 * is a new file (O_CREAT|O_EXCL), and a released lock directory is reused
 * only if, when it is taken again, it is still a directory of the daemon's
 * own that nobody else may write, holding its old record as the daemon
 * left it: a plain file of its own with one link, checked on the open file
 * before it is rewritten (reuse_dir).  Anything else is dropped, never
 * written into.
 *
 * DIR going wrong is loud.  This file is the one place where errors of
 * the store are mapped (see backend.h): an errno from DIR that is not an
 * answer about a lock (EEXIST: held, ENOENT: not held) becomes EIO, with
 * one line on stderr per condition (say_failed), so that an EPERM from
 * `chattr +i DIR` never reads as "not yours" and an ENOENT from a deleted
 * DIR never reads as "not held".  A DIR that was removed or replaced is
 * never adopted again: every request fails with EIO until a restart.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lock/backend_v1.h" /* until B2: the v1 seam */
#include "lockfs/record.h"

#define RECORD_FILE "owner.json"
#define TMP_PREFIX ".lockfs-"

/* Released lock directories kept for the next acquisition, so that
 * neither side pays for mkdir, unlink and rmdir on the hot path. */
#define POOL_MAX 64

/* The kinds of work DIR can refuse, each said once while it fails. */
enum store_work {
	WORK_ENTRIES, /* create, rename and remove entries of DIR itself */
	WORK_RECORDS, /* write records inside lock directories */
	WORK_READ,    /* read DIR and the records in it */
	WORK_KINDS
};

static const char *const work_what[WORK_KINDS] = {
	[WORK_ENTRIES] = "create or rename entries in it",
	[WORK_RECORDS] = "write lock records in it",
	[WORK_READ] = "read it",
};

struct backend_dir {
	struct lockfs_backend base;
	int dirfd;    /* the backing directory; owned */
	char *path;   /* its absolute path, for the identity check and messages */
	dev_t dev;    /* what DIR was when opened: while dirfd is still that */
	ino_t ino;    /*   directory at PATH, DIR is there */
	uid_t uid;    /* the daemon's: owner of every entry it makes in DIR */
	pthread_mutex_t pool_mu;
	char pool[POOL_MAX][64]; /* ".lockfs-free.N" entries; protected by pool_mu */
	size_t npool;            /* protected by pool_mu */
	/* What is wrong with DIR: set once DIR was removed or replaced
	 * (sticky; read without a mutex, __atomic). */
	bool vanished;
	pthread_mutex_t health_mu;
	/* The errno that WORK_* last failed with, 0 while it works; written
	 * under health_mu, read as a hint without it (__atomic). */
	int failing[WORK_KINDS];
};

static bool pool_get(struct backend_dir *d, char out[64])
{
	bool got = false;

	pthread_mutex_lock(&d->pool_mu);
	if (d->npool > 0) {
		memcpy(out, d->pool[--d->npool], 64);
		got = true;
	}
	pthread_mutex_unlock(&d->pool_mu);
	return got;
}

static bool pool_put(struct backend_dir *d, const char *name)
{
	bool put = false;

	pthread_mutex_lock(&d->pool_mu);
	if (d->npool < POOL_MAX) {
		snprintf(d->pool[d->npool++], 64, "%s", name);
		put = true;
	}
	pthread_mutex_unlock(&d->pool_mu);
	return put;
}

static struct backend_dir *to_dir(struct lockfs_backend *be)
{
	return (struct backend_dir *)be;
}

/*
 * Is DIR still the directory the daemon opened?  No once it was removed
 * (its link count is 0) or, with AT_PATH, once its path names another
 * directory (moved away and made anew) or nothing.  A path that cannot
 * be looked up for another reason (EACCES) gives no evidence: yes.
 */
static bool dir_is_there(struct backend_dir *d, bool at_path)
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

static bool has_vanished(struct backend_dir *d)
{
	return __atomic_load_n(&d->vanished, __ATOMIC_ACQUIRE);
}

/*
 * DIR was removed or replaced: from now on every request fails with EIO.
 * A directory made anew at its path is not adopted -- the locks held in
 * the old one are gone, and the new one may already be in use by another
 * tool -- so fail closed until someone restarts the daemon.  Says so once.
 * Returns -EIO.
 */
static int vanish(struct backend_dir *d)
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
static int say_failed(struct backend_dir *d, enum store_work work, int err)
{
	if (err == ENOMEM)
		return -ENOMEM;
	if (!dir_is_there(d, true))
		return vanish(d);
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
static void say_works(struct backend_dir *d, enum store_work work)
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
static int not_held(struct backend_dir *d)
{
	return dir_is_there(d, false) ? -ENOENT : vanish(d);
}

/* "NAME.lock" into BUF; -ENAMETOOLONG when it does not fit NAME_MAX. */
static int lock_path(char buf[NAME_MAX + 1], const char *name)
{
	int n = snprintf(buf, NAME_MAX + 1, "%s.lock", name);

	return n > NAME_MAX ? -ENAMETOOLONG : 0;
}

/*
 * A fresh ".lockfs-KIND.N" name for a temporary entry.  N is a per-process
 * counter started at a random point: unique within this daemon (the only
 * one on DIR), so creating the temporary never fails with EEXIST -- which
 * would read as "held".
 */
static void tmp_name(char buf[64], const char *kind)
{
	static uint64_t counter;
	uint64_t n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);

	if (n == 0) {
		uint64_t seed = 0;

		if (getrandom(&seed, sizeof(seed), 0) == sizeof(seed))
			__atomic_fetch_add(&counter, seed >> 16, __ATOMIC_RELAXED);
	}
	snprintf(buf, 64, TMP_PREFIX "%s.%016" PRIx64, kind, n);
}

/*
 * The identity of a stored lock.  With a record, that of the record file:
 * any rewrite changes its inode or its times and size, so an unchanged
 * identity means the record read with it still stands.  Without one (a
 * foreign lock), that of DIR/NAME.lock; rename(2) sets its ctime, so a
 * lock released and taken again differs even on a reused inode number.
 */
static uint64_t stat_identity(const struct stat *st)
{
	uint64_t h = (uint64_t)st->st_ino * 0x9e3779b97f4a7c15u;

	h ^= ((uint64_t)st->st_ctim.tv_sec * 1000000000u + (uint64_t)st->st_ctim.tv_nsec);
	h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9u;
	h ^= ((uint64_t)st->st_mtim.tv_sec * 1000000000u + (uint64_t)st->st_mtim.tv_nsec);
	h = (h ^ (h >> 32)) * 0x94d049bb133111ebu;
	h ^= (uint64_t)st->st_size;
	/* The top bit says which kind: set for a record file. */
	return (h & ~(1ull << 63)) | ((uint64_t)S_ISREG(st->st_mode) << 63);
}

static bool identity_is_record(uint64_t identity)
{
	return identity >> 63;
}

static void fill_stat(struct lockfs_entry_stat *out, const struct stat *st)
{
	if (!out)
		return;
	out->uid = st->st_uid;
	out->gid = st->st_gid;
	out->mtime_ms = (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
	out->identity = stat_identity(st);
}

/*
 * Stat the lock NAME: its record file when it has one (one syscall for the
 * usual case), else DIR/NAME.lock itself.  0, -ENOENT when not held.
 */
static int stat_lock(int dirfd, const char *lock, struct stat *st)
{
	char path[NAME_MAX * 2 + 2];

	snprintf(path, sizeof(path), "%s/" RECORD_FILE, lock);
	if (fstatat(dirfd, path, st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st->st_mode) &&
	    st->st_size <= LOCKFS_RECORD_MAX)
		return 0;
	if (fstatat(dirfd, lock, st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	/* Held without a regular record file: foreign.  Mark the identity
	 * apart from any record's. */
	st->st_size = -1;
	return 0;
}

static int write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * Remove DIR/ENTRY and everything below it, never following a symlink: a
 * foreign "lock" may be a link to anywhere, or hold anything, and only
 * what lies in DIR may go.  Our own lock directories hold just the
 * record, so that is tried before a directory scan.  DEPTH bounds the
 * recursion against a pathological tree.
 */
static void remove_tree(int dirfd, const char *entry, int depth)
{
	int fd = openat(dirfd, entry, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0) {
		/* Not a directory (a file, a symlink): remove just the name. */
		if (errno != ENOENT)
			unlinkat(dirfd, entry, 0);
		return;
	}
	unlinkat(fd, RECORD_FILE, 0);
	if (unlinkat(dirfd, entry, AT_REMOVEDIR) < 0 && errno == ENOTEMPTY && depth > 0) {
		int scan = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		DIR *d = scan >= 0 ? fdopendir(scan) : NULL;
		struct dirent *de;

		if (d) {
			while ((de = readdir(d)))
				if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
					remove_tree(fd, de->d_name, depth - 1);
			closedir(d);
		} else if (scan >= 0) {
			close(scan);
		}
		unlinkat(dirfd, entry, AT_REMOVEDIR);
	}
	close(fd);
}

static void remove_entry(int dirfd, const char *entry)
{
	remove_tree(dirfd, entry, 16);
}

/*
 * Create FILE inside the directory DIRPATH (relative to dirfd), write
 * RECORD to it and its stat into *ST (may be NULL).  The file is always
 * new (O_EXCL) and no symlink is followed on the way: whatever was
 * planted in DIR -- a symlink, a FIFO, a hard link to a file elsewhere --
 * the daemon's write lands in a file of its own with one link, never
 * anywhere else.  Returns 0 or -errno (-EEXIST when FILE exists).
 */
static int write_record(int dirfd, const char *dirpath, const char *file,
			const char *record, size_t len, struct stat *st)
{
	char path[NAME_MAX * 2 + 2];
	struct open_how how = {
		.flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		.mode = 0600,
		.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH,
	};
	int fd, rc;

	snprintf(path, sizeof(path), "%s/%s", dirpath, file);
	fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	if (fd < 0)
		return -errno;
	rc = write_all(fd, record, len);
	if (rc == 0 && st && fstat(fd, st) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	return rc;
}

/* Is ST something the daemon made: a directory (IS_DIR) or a plain file
 * with one link, of its own user, that neither group nor others may write? */
static bool ours(const struct backend_dir *d, const struct stat *st, bool is_dir)
{
	return (is_dir ? S_ISDIR(st->st_mode) : S_ISREG(st->st_mode) && st->st_nlink == 1) &&
	       st->st_uid == d->uid && !(st->st_mode & (S_IWGRP | S_IWOTH));
}

/*
 * Put RECORD into the kept directory TMP, if it still is what the daemon
 * kept: a directory of its own that nobody else may write, holding the old
 * record as the daemon left it -- a plain file of its own with one link --
 * which is then rewritten.  Another user's directory, a symlink, or
 * anything else under the record's name (a symlink, a FIFO or other
 * special file, a hard link, another user's file) means it was tampered
 * with since its release.  The directory gets its times set to now: to the
 * seed's --stale rule a lock is as old as its directory's mtime.  Returns
 * 0 or -errno; the caller drops TMP on failure.
 *
 * Why rewrite the old record rather than create a new file: unlinking it
 * and creating another cost about a third more of the backing protocol's
 * time per pair (an inode freed and allocated on every acquisition).
 * What makes the rewrite safe is checked on the open file itself, so it
 * holds whatever happens in DIR meanwhile: no write of ours ever lands in
 * a file with another link, or in anything but a plain file of the
 * daemon's own.  It is looked at before it is opened as well, because
 * opening a planted FIFO or device may have effects of its own.
 */
static int reuse_dir(struct backend_dir *d, const char *tmp, const char *record, size_t len,
		     struct stat *st)
{
	char path[NAME_MAX * 2 + 2];
	struct open_how how = {
		.flags = O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
		.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH,
	};
	struct stat dst, pre, fst;
	int fd, rc;

	if (fstatat(d->dirfd, tmp, &dst, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!ours(d, &dst, true))
		return -EPERM;
	snprintf(path, sizeof(path), "%s/" RECORD_FILE, tmp);
	if (fstatat(d->dirfd, path, &pre, AT_SYMLINK_NOFOLLOW) < 0) {
		/* No old record (removed by hand): a new one, as in a new
		 * directory. */
		rc = errno == ENOENT ? write_record(d->dirfd, tmp, RECORD_FILE, record, len, st)
				     : -errno;
		goto times;
	}
	if (!ours(d, &pre, false))
		return -EPERM;
	fd = (int)syscall(SYS_openat2, d->dirfd, path, &how, sizeof(how));
	if (fd < 0)
		return -errno;
	if (fstat(fd, &fst) < 0 || fst.st_dev != pre.st_dev || fst.st_ino != pre.st_ino ||
	    !ours(d, &fst, false)) {
		close(fd);
		return -EPERM;
	}
	rc = ftruncate(fd, 0) < 0 ? -errno : write_all(fd, record, len);
	if (rc == 0 && fstat(fd, st) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
times:
	if (rc == 0 && utimensat(d->dirfd, tmp, NULL, AT_SYMLINK_NOFOLLOW) < 0)
		rc = -errno;
	return rc;
}

static int dir_acquire(struct lockfs_backend *be, const char *name,
		       const char *record, size_t len, struct lockfs_entry_stat *out)
{
	struct backend_dir *d = to_dir(be);
	char lock[NAME_MAX + 1], tmp[64];
	struct stat st;
	bool pooled;
	int rc = lock_path(lock, name);

	if (rc < 0)
		return rc;
	if (has_vanished(d))
		return -EIO;
	/* A pooled directory (a released lock's) or a new one.  The record's
	 * identity is known before the rename: moving its directory changes
	 * nothing about the file. */
	pooled = pool_get(d, tmp);
	if (pooled && reuse_dir(d, tmp, record, len, &st) < 0) {
		/* Tampered with, or DIR refuses: drop it.  A refusal shows
		 * again below, where it is said. */
		remove_entry(d->dirfd, tmp);
		pooled = false;
	}
	if (!pooled) {
		tmp_name(tmp, "new");
		if (mkdirat(d->dirfd, tmp, 0755) < 0)
			return say_failed(d, WORK_ENTRIES, errno);
		rc = write_record(d->dirfd, tmp, RECORD_FILE, record, len, &st);
		if (rc < 0) {
			remove_entry(d->dirfd, tmp);
			return say_failed(d, WORK_RECORDS, -rc);
		}
	}
	say_works(d, WORK_RECORDS);
	if (renameat2(d->dirfd, tmp, d->dirfd, lock, RENAME_NOREPLACE) < 0) {
		rc = errno == EEXIST ? -EEXIST : say_failed(d, WORK_ENTRIES, errno);
		/* Back to the pool: also when DIR refuses entries (then
		 * removing it would fail too, and it would be left behind
		 * until the next start). */
		if (!pool_put(d, tmp))
			remove_entry(d->dirfd, tmp);
		return rc;
	}
	say_works(d, WORK_ENTRIES);
	fill_stat(out, &st);
	return 0;
}

static int dir_stat(struct lockfs_backend *be, const char *name,
		    struct lockfs_entry_stat *out, bool likely_held)
{
	struct backend_dir *d = to_dir(be);
	char lock[NAME_MAX + 1];
	struct stat st;
	int rc = lock_path(lock, name);

	if (rc < 0)
		return -ENOENT;
	if (has_vanished(d))
		return -EIO;
	/* A name lockfs knows no record for is most often free: one stat of
	 * NAME.lock says so (the lookup before every mkdir), where looking
	 * for its record first would take two.  Such an ENOENT is not
	 * checked against DIR being gone (the next write, or the tick's
	 * check within TICK_MS, finds that out): it is the hot path. */
	if (!likely_held && fstatat(d->dirfd, lock, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? -ENOENT : say_failed(d, WORK_READ, errno);
	rc = stat_lock(d->dirfd, lock, &st);
	if (rc == -ENOENT)
		return likely_held ? not_held(d) : -ENOENT;
	if (rc < 0)
		return say_failed(d, WORK_READ, -rc);
	fill_stat(out, &st);
	return 0;
}

/* Open DIR/LOCK/owner.json without following any symlink on the way. */
static int open_record(int dirfd, const char *lock, const char *file)
{
	char path[NAME_MAX * 2 + 2];
	struct open_how how = {
		/* O_NONBLOCK: a FIFO planted as the record must not hang us. */
		.flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK,
		.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH,
	};
	int fd;

	snprintf(path, sizeof(path), "%s/%s", lock, file);
	fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	return fd < 0 ? -errno : fd;
}

static int dir_read(struct lockfs_backend *be, const char *name,
		    char **record, size_t *len, struct lockfs_entry_stat *out)
{
	struct backend_dir *d = to_dir(be);
	char lock[NAME_MAX + 1];
	struct stat fst, dst;
	bool usable = false;
	char *buf = NULL;
	ssize_t n;
	int fd, rc = lock_path(lock, name);

	*record = NULL;
	*len = 0;
	if (rc < 0)
		return -ENOENT;
	if (has_vanished(d))
		return -EIO;
	fd = open_record(d->dirfd, lock, RECORD_FILE);
	if (fd >= 0)
		usable = fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode) &&
			 fst.st_size <= LOCKFS_RECORD_MAX;
	/* Owner, group and time of the lock itself: what a foreign lock
	 * shows, and what -o stale judges it by. */
	if (fstatat(d->dirfd, lock, &dst, AT_SYMLINK_NOFOLLOW) < 0) {
		rc = errno;
		if (fd >= 0)
			close(fd);
		return rc == ENOENT ? not_held(d) : say_failed(d, WORK_READ, rc);
	}
	if (usable) {
		buf = malloc((size_t)fst.st_size + 1);
		n = buf ? pread(fd, buf, (size_t)fst.st_size + 1, 0) : -1;
		if (!buf || n < 0 || n > fst.st_size) {
			/* changing under us, or no memory: foreign this time */
			free(buf);
			buf = NULL;
			usable = false;
		} else {
			buf[n] = '\0';
			*len = (size_t)n;
		}
	}
	if (fd >= 0)
		close(fd);
	if (out) {
		struct stat ist;

		/* The identity as stat_lock() sees it, so that release and
		 * update, which check it that way, agree.  No usable record:
		 * held all the same (fail closed). */
		if (usable)
			out->identity = stat_identity(&fst);
		else if (stat_lock(d->dirfd, lock, &ist) == 0)
			out->identity = stat_identity(&ist);
		else
			out->identity = 0;
		out->uid = dst.st_uid;
		out->gid = dst.st_gid;
		out->mtime_ms = (int64_t)dst.st_mtim.tv_sec * 1000 + dst.st_mtim.tv_nsec / 1000000;
	}
	*record = buf;
	return 0;
}

static int dir_update(struct lockfs_backend *be, const char *name, uint64_t identity,
		      const char *record, size_t len, struct lockfs_entry_stat *out)
{
	struct backend_dir *d = to_dir(be);
	char lock[NAME_MAX + 1], tmp[64], from[NAME_MAX * 2 + 2], to[NAME_MAX * 2 + 2];
	int rc = lock_path(lock, name);

	if (rc < 0)
		return -ENOENT;
	if (has_vanished(d))
		return -EIO;
	/* IDENTITY was proved by the caller's stat or read just before, under
	 * its serialisation of NAME (as for release: a second stat here is
	 * no more atomic with the rename than that one). */
	(void)identity;
	/* The new record goes into a new file, renamed over the old one: a
	 * held lock's record is never rewritten in place (a reader sees the
	 * old record or the new one, whole). */
	tmp_name(tmp, "rec");
	rc = write_record(d->dirfd, lock, tmp, record, len, NULL);
	if (rc < 0) {
		/* NAME.lock gone, or now a file or a symlink (ELOOP under
		 * RESOLVE_NO_SYMLINKS): not the lock IDENTITY names. */
		if (rc == -ENOENT || rc == -ENOTDIR || rc == -ELOOP)
			return not_held(d);
		return say_failed(d, WORK_RECORDS, -rc);
	}
	snprintf(from, sizeof(from), "%s/%s", lock, tmp);
	snprintf(to, sizeof(to), "%s/%s", lock, RECORD_FILE);
	if (renameat(d->dirfd, from, d->dirfd, to) < 0) {
		rc = errno;
		unlinkat(d->dirfd, from, 0);
		return rc == ENOENT ? not_held(d) : say_failed(d, WORK_RECORDS, rc);
	}
	say_works(d, WORK_RECORDS);
	/* rename(2) changed the file's ctime: take the identity afresh
	 * (unless the caller will, later). */
	return out ? dir_stat(be, name, out, true) : 0;
}

static int dir_release(struct lockfs_backend *be, const char *name, uint64_t identity)
{
	struct backend_dir *d = to_dir(be);
	char lock[NAME_MAX + 1], tomb[64];
	bool record = false;
	int rc = lock_path(lock, name);

	if (rc < 0)
		return -ENOENT;
	if (has_vanished(d))
		return -EIO;
	/* IDENTITY was proved by the caller's stat or read just before,
	 * under its serialisation of NAME (a second stat here would be no
	 * more atomic with the rename than that one).  It also tells whether
	 * this is a lock with our record (reusable) or a foreign one. */
	record = identity_is_record(identity);
	/* Take the whole lock out of sight in one step: a crash afterwards
	 * leaves a ".lockfs-" leftover that the next start sweeps, never a
	 * record-less NAME.lock that would read as held.  The directory is
	 * kept for the next acquisition, which checks it again (reuse_dir();
	 * nothing of that on the release path, which the `released` line
	 * waits for), or removed. */
	tmp_name(tomb, "free");
	if (renameat2(d->dirfd, lock, d->dirfd, tomb, RENAME_NOREPLACE) < 0)
		return errno == ENOENT ? not_held(d) : say_failed(d, WORK_ENTRIES, errno);
	say_works(d, WORK_ENTRIES);
	if (!record || !pool_put(d, tomb))
		remove_entry(d->dirfd, tomb); /* foreign leftovers never get reused */
	return 0;
}

static int dir_list(struct lockfs_backend *be, lockfs_list_cb cb, void *arg)
{
	struct backend_dir *d = to_dir(be);
	struct dirent *de;
	DIR *dir;
	int fd, rc = 0;

	/* A removed DIR still lists, as empty: that is no answer. */
	if (has_vanished(d) || !dir_is_there(d, false))
		return vanish(d);
	fd = openat(d->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return say_failed(d, WORK_READ, errno);
	dir = fdopendir(fd);
	if (!dir) {
		rc = say_failed(d, WORK_READ, errno);
		close(fd);
		return rc;
	}
	while ((de = readdir(dir))) {
		size_t n = strlen(de->d_name);
		char name[NAME_MAX + 1];

		if (n <= 5 || strcmp(de->d_name + n - 5, ".lock") != 0)
			continue;
		memcpy(name, de->d_name, n - 5);
		name[n - 5] = '\0';
		if (cb(arg, name))
			break;
	}
	closedir(dir);
	return rc;
}

static void dir_destroy(struct lockfs_backend *be)
{
	struct backend_dir *d = to_dir(be);
	char tomb[64];

	while (pool_get(d, tomb))
		remove_entry(d->dirfd, tomb);
	pthread_mutex_destroy(&d->pool_mu);
	pthread_mutex_destroy(&d->health_mu);

	close(d->dirfd);
	free(d->path);
	free(d);
}

static int dir_check(struct lockfs_backend *be)
{
	struct backend_dir *d = to_dir(be);

	if (has_vanished(d))
		return -EIO;
	return dir_is_there(d, true) ? 0 : vanish(d);
}

static const struct lockfs_backend_ops dir_ops = {
	.acquire = dir_acquire,
	.read = dir_read,
	.stat = dir_stat,
	.update = dir_update,
	.release = dir_release,
	.list = dir_list,
	.check = dir_check,
	.destroy = dir_destroy,
};

/* Remove temporaries a killed daemon left behind. */
static void sweep_leftovers(int dirfd)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	DIR *dir;

	if (fd < 0)
		return;
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return;
	}
	while ((de = readdir(dir)))
		if (strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0)
			remove_entry(dirfd, de->d_name);
	closedir(dir);
}

/* Does this filesystem do RENAME_NOREPLACE?  Without it there is no
 * indivisible acquisition, so refuse to run rather than race. */
static int probe_noreplace(int dirfd)
{
	char a[64], b[64];
	int rc = 0;

	tmp_name(a, "probe");
	tmp_name(b, "probe");
	if (mkdirat(dirfd, a, 0700) < 0)
		return -errno;
	if (mkdirat(dirfd, b, 0700) < 0) {
		rc = -errno;
		unlinkat(dirfd, a, AT_REMOVEDIR);
		return rc;
	}
	if (renameat2(dirfd, a, dirfd, b, RENAME_NOREPLACE) == 0)
		rc = -EINVAL; /* it replaced: the flag was ignored */
	else if (errno != EEXIST)
		rc = errno == ENOSYS ? -EINVAL : -errno;
	unlinkat(dirfd, a, AT_REMOVEDIR);
	unlinkat(dirfd, b, AT_REMOVEDIR);
	return rc;
}

int lockfs_backend_dir_open(struct lockfs_backend **out, int dirfd, const char *path)
{
	struct backend_dir *d;
	struct stat st;
	int rc;

	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	pthread_mutex_init(&d->pool_mu, NULL);
	pthread_mutex_init(&d->health_mu, NULL);
	d->uid = geteuid();
	/* Absolute: the daemon changes its directory when it detaches. */
	d->path = realpath(path, NULL);
	if (!d->path)
		d->path = strdup(path);
	d->dirfd = d->path ? fcntl(dirfd, F_DUPFD_CLOEXEC, 3) : -1;
	if (d->dirfd < 0 || fstat(d->dirfd, &st) < 0) {
		rc = d->path ? -errno : -ENOMEM;
		goto fail;
	}
	d->dev = st.st_dev;
	d->ino = st.st_ino;
	rc = probe_noreplace(d->dirfd);
	if (rc < 0)
		goto fail;
	sweep_leftovers(d->dirfd);
	d->base.ops = &dir_ops;
	*out = &d->base;
	return 0;
fail:
	if (d->dirfd >= 0)
		close(d->dirfd);
	pthread_mutex_destroy(&d->pool_mu);
	pthread_mutex_destroy(&d->health_mu);
	free(d->path);
	free(d);
	return rc;
}
