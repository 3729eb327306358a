/*
 * The directory store behind lockfs/backend.h (v2): the seed tool's
 * protocol, made safe.
 *
 * A lock NAME is held exactly while an entry DIR/NAME.lock exists (the
 * seed's `mkdir DIR/NAME.lock`).  lockfs builds the lock directory with its
 * record inside under a temporary name, then renames it into place with
 * RENAME_NOREPLACE: one indivisible step that fails with EEXIST if anyone,
 * lockfs or the seed's script, holds NAME, and that never shows a lock
 * without its record.  Release renames the lock aside first (it disappears
 * at once, whole), then clears the leftover.  Every change of a held lock
 * (update, handoff, release) is conditional on the identity the engine
 * last read: one fstatat right before it, so that a stale identity never
 * rewrites or removes a newer lock.
 *
 * The store has no line: places are a counter of this daemon (the engine's
 * FIFO queue is the whole line), and claim is the same indivisible rename.
 * Fences come from the fence file (fence.c), one counter for all names
 * that only grows, also across restarts.  Changes are reported from an
 * inotify watch on DIR (so a script's `mkdir`/`rmdir DIR/NAME.lock` is
 * seen at once), plus this daemon's own record rewrites, which happen
 * inside NAME.lock where DIR's watch does not look; this daemon's own
 * changes are told apart (CHANGE_OWN), see report_events.
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
#include <poll.h>
#include <pthread.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lockfs/record.h"
#include "base/clock.h"
#include "dir.h"
#include "fence.h"
#include "statedir.h"

#define RECORD_FILE "owner.json"
#define TMP_PREFIX ".lockfs-"
#define LOCK_SUFFIX ".lock"

/* Released lock directories kept for the next acquisition, so that
 * neither side pays for mkdir, unlink and rmdir on the hot path. */
#define POOL_MAX 64

/* Without inotify, "anything may have changed" this often (ms). */
#define POLL_MS 50

/* After a batch of DIR's events that were all this daemon's own renames,
 * the reporting thread waits this long (µs) before it listens again: a
 * busy daemon's next renames then queue without waking it (the wake-up,
 * poll and read cost about a tenth of the daemon's CPU per mkdir+rmdir
 * pair), and a change made outside is reported at most this much later. */
#define OWN_QUIET_US 1000

/* One name changed by this daemon's own write, as it goes through the
 * pipe to the reporting thread: a whole frame per write(2), so frames
 * never interleave or split (FRAME <= PIPE_BUF). */
#define FRAME 256

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

struct dir_store {
	struct lockfs_backend base;
	struct lockfs_statedir sd; /* DIR and its one-daemon lock; owned */
	int dirfd;    /* sd.dirfd: the backing directory */
	char *path;   /* its absolute path, for the identity check and messages */
	dev_t dev;    /* what DIR was when opened: while dirfd is still that */
	ino_t ino;    /*   directory at PATH, DIR is there */
	uid_t uid;    /* the daemon's: owner of every entry it makes in DIR */
	struct lockfs_fence *fence; /* the fence counter; thread-safe itself */
	uint32_t stale_s;           /* -o stale: 0 = never */
	int64_t opened_ms;          /* wall clock: the session's since_ms */
	int64_t last_rank;          /* places handed out (__atomic) */

	pthread_mutex_t pool_mu;
	char pool[POOL_MAX][64]; /* ".lockfs-free.N" entries; protected by pool_mu */
	size_t npool;            /* protected by pool_mu */
	/* Set once DIR was removed or replaced (sticky; __atomic). */
	bool vanished;
	pthread_mutex_t health_mu;
	/* The errno that WORK_* last failed with, 0 while it works; written
	 * under health_mu, read as a hint without it (__atomic). */
	int failing[WORK_KINDS];

	/* Reporting changes (start .. close).  The thread owns inotify_fd
	 * and the pipe's read end; writers use own_pipe[1] (non-blocking). */
	bool reporting;           /* the thread runs (__atomic) */
	bool own_overflow;        /* a frame did not fit the pipe (__atomic) */
	pthread_t thread;
	int inotify_fd;           /* -1: none, poll every POLL_MS */
	int own_pipe[2];
	int stop_fd;              /* eventfd: close() wants the thread gone */
	lockfs_change_fn change;
	void *change_arg;
};

static struct dir_store *to_dir(struct lockfs_backend *be)
{
	return (struct dir_store *)be;
}

static bool pool_get(struct dir_store *d, char out[64])
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

static bool pool_put(struct dir_store *d, const char *name)
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

/* ---- Is DIR there, and saying what is wrong with it ---- */

/*
 * Is DIR still the directory the daemon opened?  No once it was removed
 * (its link count is 0) or, with AT_PATH, once its path names another
 * directory (moved away and made anew) or nothing.  A path that cannot
 * be looked up for another reason (EACCES) gives no evidence: yes.
 */
static bool dir_is_there(struct dir_store *d, bool at_path)
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

static bool has_vanished(struct dir_store *d)
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
static int vanish(struct dir_store *d)
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
static int say_failed(struct dir_store *d, enum store_work work, int err)
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
static void say_works(struct dir_store *d, enum store_work work)
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
static int not_held(struct dir_store *d)
{
	return dir_is_there(d, false) ? -ENOENT : vanish(d);
}

/* ---- Entries, records and identities ---- */

/* "NAME.lock" into BUF; -ENAMETOOLONG when it does not fit NAME_MAX. */
static int lock_path(char buf[NAME_MAX + 1], const char *name)
{
	int n = snprintf(buf, NAME_MAX + 1, "%s" LOCK_SUFFIX, name);

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
 * Never 0 (the top bit or a low bit is set; see below).
 */
static uint64_t stat_identity(const struct stat *st)
{
	uint64_t h = (uint64_t)st->st_ino * 0x9e3779b97f4a7c15u;

	h ^= ((uint64_t)st->st_ctim.tv_sec * 1000000000u + (uint64_t)st->st_ctim.tv_nsec);
	h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9u;
	h ^= ((uint64_t)st->st_mtim.tv_sec * 1000000000u + (uint64_t)st->st_mtim.tv_nsec);
	h = (h ^ (h >> 32)) * 0x94d049bb133111ebu;
	h ^= (uint64_t)st->st_size;
	h &= ~(1ull << 63);
	if (h == 0)
		h = 1;
	/* The top bit says which kind: set for a record file. */
	return h | ((uint64_t)S_ISREG(st->st_mode) << 63);
}

static bool identity_is_record(uint64_t identity)
{
	return identity >> 63;
}

static void fill_stat(struct lockfs_entry_stat *out, const struct stat *st)
{
	memset(out, 0, sizeof(*out));
	out->uid = st->st_uid;
	out->gid = st->st_gid;
	out->mtime_ms = (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
	out->identity = stat_identity(st);
}

/*
 * Stat the lock NAME: its record file when it has one (one syscall for the
 * usual case), else DIR/NAME.lock itself.  0, -ENOENT when not held, or
 * another -errno of the medium.
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

/*
 * Is NAME's stored lock (LOCK in DIR) still the one IDENTITY names?  The
 * one fstatat that makes every change conditional: a stale identity never
 * rewrites or removes a newer lock.  0 (*ST its stat); -ENOENT: gone or
 * replaced; -EIO.
 */
static int check_identity(struct dir_store *d, const char *lock, uint64_t identity,
			  struct stat *st)
{
	int rc = stat_lock(d->dirfd, lock, st);

	if (rc == -ENOENT || rc == -ENOTDIR)
		return not_held(d);
	if (rc < 0)
		return say_failed(d, WORK_READ, -rc);
	return stat_identity(st) == identity ? 0 : -ENOENT;
}

/*
 * The head of every op on a lock that may be held: NAME's entry into
 * LOCK, unless DIR is known to be gone.  0, -ENOENT (no such lock can
 * exist: the name does not fit), -EIO.
 */
static int lock_of(struct dir_store *d, const char *name, char lock[NAME_MAX + 1])
{
	if (lock_path(lock, name) < 0)
		return -ENOENT;
	return has_vanished(d) ? -EIO : 0;
}

/*
 * The head of every change of a held lock: is NAME's stored lock (its
 * entry into LOCK) still the one IDENTITY names (check_identity)?  0 (*ST
 * its stat), -ENOENT, -EIO.
 */
static int held_as(struct dir_store *d, const char *name, uint64_t identity,
		   char lock[NAME_MAX + 1], struct stat *st)
{
	int rc = lock_of(d, name, lock);

	return rc < 0 ? rc : check_identity(d, lock, identity, st);
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
		DIR *dir = scan >= 0 ? fdopendir(scan) : NULL;
		struct dirent *de;

		if (dir) {
			while ((de = readdir(dir)))
				if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
					remove_tree(fd, de->d_name, depth - 1);
			closedir(dir);
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
 * Create FILE inside the directory DIRPATH (relative to dirfd) and write
 * RECORD to it, with the guarantees of write_record below.  Returns the
 * open file (the caller closes it), or -errno with no file left behind.
 */
static int create_record(int dirfd, const char *dirpath, const char *file,
			 const char *record, size_t len)
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
	if (rc < 0) {
		close(fd);
		unlinkat(dirfd, path, 0);
		return rc;
	}
	return fd;
}

/*
 * Create FILE inside the directory DIRPATH (relative to dirfd), write
 * RECORD to it and its stat into *ST (may be NULL).  The file is always
 * new (O_EXCL) and no symlink is followed on the way: whatever was
 * planted in DIR -- a symlink, a FIFO, a hard link to a file elsewhere --
 * the daemon's write lands in a file of its own with one link, never
 * anywhere else.  A failed write leaves no file.  Returns 0 or -errno
 * (-EEXIST when FILE exists).
 */
static int write_record(int dirfd, const char *dirpath, const char *file,
			const char *record, size_t len, struct stat *st)
{
	char path[NAME_MAX * 2 + 2];
	int fd = create_record(dirfd, dirpath, file, record, len);
	int rc = 0;

	if (fd < 0)
		return fd;
	if (st && fstat(fd, st) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc < 0) {
		snprintf(path, sizeof(path), "%s/%s", dirpath, file);
		unlinkat(dirfd, path, 0);
	}
	return rc;
}

/* Is ST something the daemon made: a directory (IS_DIR) or a plain file
 * with one link, of its own user, that neither group nor others may write? */
static bool ours(const struct dir_store *d, const struct stat *st, bool is_dir)
{
	return (is_dir ? S_ISDIR(st->st_mode) : S_ISREG(st->st_mode) && st->st_nlink == 1) &&
	       st->st_uid == d->uid && !(st->st_mode & (S_IWGRP | S_IWOTH));
}

/*
 * Put RECORD into the kept directory TMP, if it still is what the daemon
 * kept: a directory of its own that nobody else may write, holding the old
 * record as the daemon left it -- a plain file of its own with one link --
 * which is then rewritten.  Anything else means it was tampered with since
 * its release.  The directory gets its times set to now: to the seed's
 * --stale rule a lock is as old as its directory's mtime.  Returns 0 or
 * -errno; the caller drops TMP on failure.
 *
 * Why rewrite the old record rather than create a new file: unlinking it
 * and creating another cost about a third more of the backing protocol's
 * time per pair.  What makes the rewrite safe is checked on the open file
 * itself, so it holds whatever happens in DIR meanwhile; the open cannot
 * block or take a terminal (O_NONBLOCK, O_NOCTTY), and a device node, the
 * one thing whose open alone may act, can only be planted by root, who
 * needs no trick to change DIR.  The record is overwritten from its start
 * and cut only when the old one was longer: truncating to 0 first would
 * free the file's page and allocate it again (a tenth of the daemon's CPU
 * per pair on tmpfs).  Nobody reads it meanwhile: TMP is not a lock yet.
 */
static int reuse_dir(struct dir_store *d, const char *tmp, const char *record, size_t len,
		     struct stat *st)
{
	char path[NAME_MAX * 2 + 2];
	struct open_how how = {
		.flags = O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
		.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH,
	};
	struct stat dst, fst;
	int fd, rc;

	if (fstatat(d->dirfd, tmp, &dst, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!ours(d, &dst, true))
		return -EPERM;
	snprintf(path, sizeof(path), "%s/" RECORD_FILE, tmp);
	fd = (int)syscall(SYS_openat2, d->dirfd, path, &how, sizeof(how));
	if (fd < 0) {
		/* No old record (removed by hand): a new one, as in a new
		 * directory. */
		rc = errno == ENOENT ? write_record(d->dirfd, tmp, RECORD_FILE, record, len, st)
				     : -errno;
		goto times;
	}
	if (fstat(fd, &fst) < 0 || !ours(d, &fst, false)) {
		close(fd);
		return -EPERM;
	}
	rc = write_all(fd, record, len);
	if (rc == 0 && fst.st_size > (off_t)len && ftruncate(fd, (off_t)len) < 0)
		rc = -errno;
	if (rc == 0 && fstat(fd, st) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
times:
	if (rc == 0 && utimensat(d->dirfd, tmp, NULL, AT_SYMLINK_NOFOLLOW) < 0)
		rc = -errno;
	return rc;
}

/* The largest "fence" in RECORD: its own, its holder's and its shares'
 * (what the fence counter must stay above).  0 when it has none. */
static uint64_t record_fence(const char *record, size_t len, uint64_t *top)
{
	json_t *root = json_loadb(record, len, 0, NULL);
	json_t *shares, *e;
	uint64_t max = 0;
	size_t i;

	*top = 0;
	if (!json_is_object(root)) {
		json_decref(root);
		return 0;
	}
#define SEE(obj) do { \
		json_t *f_ = json_object_get((obj), "fence"); \
		if (json_is_integer(f_) && json_integer_value(f_) > 0 && \
		    (uint64_t)json_integer_value(f_) > max) \
			max = (uint64_t)json_integer_value(f_); \
	} while (0)
	SEE(root);
	*top = max;
	SEE(json_object_get(root, "holder"));
	shares = json_object_get(root, "shares");
	json_array_foreach(shares, i, e)
		SEE(e);
#undef SEE
	json_decref(root);
	return max;
}

/* SRC's record for a write that makes fence FENCE (0: an edit).  Its
 * bytes in *JSON (malloc'd), *LEN.  0 or -ENOMEM. */
static int encode(const struct lockfs_record_src *src, uint64_t fence, char **json,
		  size_t *len)
{
	*json = NULL;
	*len = 0;
	return src->encode(src->arg, fence, json, len);
}

/* The next fence, or -EIO (the counter said why on stderr). */
static int next_fence(struct dir_store *d, uint64_t *fence)
{
	int rc = lockfs_fence_next(d->fence, fence);

	return rc == -ENOMEM ? rc : rc < 0 ? -EIO : 0;
}

/* Tell the reporting thread that this daemon changed NAME's record inside
 * NAME.lock, where DIR's watch does not look.  Never blocks: a full pipe
 * turns into one CHANGE_ALL. */
static void report_own(struct dir_store *d, const char *name)
{
	char frame[FRAME] = { 0 };

	if (!__atomic_load_n(&d->reporting, __ATOMIC_ACQUIRE))
		return;
	snprintf(frame, sizeof(frame), "%s", name);
	if (write(d->own_pipe[1], frame, FRAME) != FRAME)
		__atomic_store_n(&d->own_overflow, true, __ATOMIC_RELEASE);
}

/* ---- The ops ---- */

/*
 * Take NAME (LOCK in DIR) for SRC's record in one step: fence, record in a
 * pooled or new ".lockfs-" directory, rename into place unless NAME.lock
 * exists.  0 (ST filled), -EEXIST (nothing left behind), -EIO, -ENOMEM.
 */
static int take(struct dir_store *d, const char *lock, const struct lockfs_record_src *src,
		struct lockfs_entry_stat *out)
{
	char tmp[64], *json;
	uint64_t fence;
	struct stat st;
	size_t len;
	bool pooled;
	int rc;

	if (has_vanished(d))
		return -EIO;
	rc = next_fence(d, &fence);
	if (rc < 0)
		return rc;
	rc = encode(src, fence, &json, &len);
	if (rc < 0)
		return rc;
	/* A pooled directory (a released lock's) or a new one.  The record's
	 * identity is known before the rename: moving its directory changes
	 * nothing about the file. */
	pooled = pool_get(d, tmp);
	if (pooled && reuse_dir(d, tmp, json, len, &st) < 0) {
		/* Tampered with, or DIR refuses: drop it.  A refusal shows
		 * again below, where it is said. */
		remove_entry(d->dirfd, tmp);
		pooled = false;
	}
	if (!pooled) {
		tmp_name(tmp, "new");
		if (mkdirat(d->dirfd, tmp, 0755) < 0) {
			rc = say_failed(d, WORK_ENTRIES, errno);
			goto out;
		}
		rc = write_record(d->dirfd, tmp, RECORD_FILE, json, len, &st);
		if (rc < 0) {
			remove_entry(d->dirfd, tmp);
			rc = say_failed(d, WORK_RECORDS, -rc);
			goto out;
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
		goto out;
	}
	say_works(d, WORK_ENTRIES);
	if (out) {
		fill_stat(out, &st);
		out->fence = fence;
	}
	rc = 0;
out:
	free(json);
	return rc;
}

static void take_place(struct dir_store *d, struct lockfs_place *place)
{
	place->rank = __atomic_add_fetch(&d->last_rank, 1, __ATOMIC_RELAXED);
	place->seq = (uint64_t)place->rank;
	place->session = 0;
}

static int dir_acquire(struct lockfs_backend *be, const char *name,
		       enum lockfs_acquire_how how, const struct lockfs_record_src *src,
		       struct lockfs_place *place, struct lockfs_entry_stat *st)
{
	struct dir_store *d = to_dir(be);
	char lock[NAME_MAX + 1];
	int rc = lock_path(lock, name);

	if (rc < 0)
		return rc;
	if (how != LOCKFS_ACQ_TRY && !place)
		return -EINVAL;
	/* DIR has no line: a place is this daemon's counter, nothing is
	 * written, and the engine's queue is the whole line. */
	if (how == LOCKFS_ACQ_QUEUE) {
		take_place(d, place);
		return -EINPROGRESS;
	}
	rc = take(d, lock, src, st);
	if (rc == -EEXIST && how == LOCKFS_ACQ_OR_QUEUE) {
		take_place(d, place);
		return -EINPROGRESS;
	}
	return rc;
}

/* The engine claims only for the head of its own queue, and DIR has no
 * other line: the same indivisible take as TRY. */
static int dir_claim(struct lockfs_backend *be, const char *name,
		     const struct lockfs_place *place, const struct lockfs_record_src *src,
		     struct lockfs_entry_stat *st)
{
	struct dir_store *d = to_dir(be);
	char lock[NAME_MAX + 1];
	int rc = lock_path(lock, name);

	if (rc < 0)
		return rc;
	return take(d, lock, src, st);
}

static int dir_leave(struct lockfs_backend *be, const char *name,
		     const struct lockfs_place *place)
{
	return 0; /* a place is nothing in DIR */
}

/*
 * Replace LOCK's record with JSON: a new file renamed over the old one, so
 * a reader sees the old record or the new one, whole.  The new record's
 * stat into *ST (may be NULL), taken after the rename (which set its
 * ctime) from the open file: the identity of the record written here,
 * whatever happened to the path since, and no second path walk.  0,
 * -ENOENT (the lock went meanwhile), -EIO.
 */
static int replace_record(struct dir_store *d, const char *lock, const char *json,
			  size_t len, struct stat *st)
{
	char tmp[64], from[NAME_MAX * 2 + 2], to[NAME_MAX * 2 + 2];
	int fd, rc;

	tmp_name(tmp, "rec");
	fd = create_record(d->dirfd, lock, tmp, json, len);
	if (fd < 0) {
		/* NAME.lock gone, or now a file or a symlink (ELOOP under
		 * RESOLVE_NO_SYMLINKS): not the lock IDENTITY names. */
		if (fd == -ENOENT || fd == -ENOTDIR || fd == -ELOOP)
			return not_held(d);
		return say_failed(d, WORK_RECORDS, -fd);
	}
	snprintf(from, sizeof(from), "%s/%s", lock, tmp);
	snprintf(to, sizeof(to), "%s/%s", lock, RECORD_FILE);
	if (renameat(d->dirfd, from, d->dirfd, to) < 0) {
		rc = errno;
		close(fd);
		unlinkat(d->dirfd, from, 0);
		return rc == ENOENT ? not_held(d) : say_failed(d, WORK_RECORDS, rc);
	}
	say_works(d, WORK_RECORDS);
	/* The record is in place: a failed stat or close changes nothing
	 * stored, but the caller cannot know its identity (EIO, said). */
	rc = st && fstat(fd, st) < 0 ? errno : 0;
	if (close(fd) < 0 && rc == 0 && errno != EINTR)
		rc = errno;
	return rc ? say_failed(d, WORK_READ, rc) : 0;
}

/*
 * The rewrite shared by update and handoff: while NAME's lock is IDENTITY,
 * store SRC's record made with FENCE (0: an edit) and fill ST with the
 * new identity; with REPORT, tell the reporting thread (report_own).  0,
 * -ENOENT, -EIO, -ENOMEM; nothing changed on error.
 */
static int rewrite(struct dir_store *d, const char *name, uint64_t identity, bool grant,
		   bool report, const struct lockfs_record_src *src,
		   struct lockfs_entry_stat *out)
{
	char lock[NAME_MAX + 1], *json = NULL;
	uint64_t fence = 0, top = 0;
	struct stat st;
	size_t len;
	int rc = held_as(d, name, identity, lock, &st);

	if (rc < 0)
		return rc;
	if (grant && (rc = next_fence(d, &fence)) < 0)
		return rc;
	rc = encode(src, fence, &json, &len);
	if (rc < 0)
		return rc;
	rc = replace_record(d, lock, json, len, out ? &st : NULL);
	if (rc == 0 && !grant)
		record_fence(json, len, &top);
	free(json);
	if (rc < 0)
		return rc;
	if (report)
		report_own(d, name);
	if (!out)
		return 0;
	fill_stat(out, &st);
	out->fence = grant ? fence : top;
	return 0;
}

/* DIR has no line of its own: the place is the engine's next, and the
 * lock never leaves NAME.lock, so nobody can take it in between.
 * Not reported (backend.h allows it for a change of our own): the engine
 * answers NAME's queue in this very call, so the report would only wake
 * the reporting thread -- a context switch between the old holder's
 * LOCK_UN and the waiter's answer (~18 us of its ~160 us, more in the
 * tail) -- for a queue try that finds the lock held. */
static int dir_handoff(struct lockfs_backend *be, const char *name, uint64_t identity,
		       const struct lockfs_place *place, const struct lockfs_record_src *src,
		       struct lockfs_entry_stat *st)
{
	return rewrite(to_dir(be), name, identity, true, false, src, st);
}

/* GRANT never gets -EAGAIN: nobody waits for NAME in DIR. */
static int dir_update(struct lockfs_backend *be, const char *name, uint64_t identity,
		      enum lockfs_update_how how, const struct lockfs_record_src *src,
		      struct lockfs_entry_stat *st)
{
	return rewrite(to_dir(be), name, identity, how == LOCKFS_UPD_GRANT, true, src, st);
}

static int dir_release(struct lockfs_backend *be, const char *name, uint64_t identity)
{
	struct dir_store *d = to_dir(be);
	char lock[NAME_MAX + 1], tomb[64];
	struct stat st;
	int rc = held_as(d, name, identity, lock, &st);

	if (rc < 0)
		return rc;
	/* Take the whole lock out of sight in one step: a crash afterwards
	 * leaves a ".lockfs-" leftover that the next start sweeps, never a
	 * record-less NAME.lock that would read as held.  The directory is
	 * kept for the next acquisition, which checks it again (reuse_dir),
	 * or removed. */
	tmp_name(tomb, "free");
	if (renameat2(d->dirfd, lock, d->dirfd, tomb, RENAME_NOREPLACE) < 0)
		return errno == ENOENT ? not_held(d) : say_failed(d, WORK_ENTRIES, errno);
	say_works(d, WORK_ENTRIES);
	if (!identity_is_record(identity) || !pool_put(d, tomb))
		remove_entry(d->dirfd, tomb); /* foreign leftovers never get reused */
	return 0;
}

static int dir_stat(struct lockfs_backend *be, const char *name,
		    struct lockfs_entry_stat *out, bool likely_held)
{
	struct dir_store *d = to_dir(be);
	char lock[NAME_MAX + 1];
	struct stat st;
	int rc = lock_of(d, name, lock);

	if (rc < 0)
		return rc;
	/* A name lockfs knows no record for is most often free: one stat of
	 * NAME.lock says so (the lookup before every mkdir), where looking
	 * for its record first would take two.  Such an ENOENT is not
	 * checked against DIR being gone (the next write, or check() within
	 * a tick, finds that out): it is the hot path. */
	if (!likely_held && fstatat(d->dirfd, lock, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? -ENOENT : say_failed(d, WORK_READ, errno);
	rc = stat_lock(d->dirfd, lock, &st);
	if (rc == -ENOENT)
		return likely_held ? not_held(d) : -ENOENT;
	if (rc < 0)
		return say_failed(d, WORK_READ, -rc);
	if (out)
		fill_stat(out, &st);
	return 0;
}

/* Open DIR/LOCK/FILE without following any symlink on the way. */
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
	struct dir_store *d = to_dir(be);
	char lock[NAME_MAX + 1];
	struct stat fst, dst;
	bool usable = false;
	char *buf = NULL;
	ssize_t n;
	int fd, rc = lock_of(d, name, lock);

	*record = NULL;
	*len = 0;
	if (rc < 0)
		return rc;
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
	if (buf) {
		uint64_t top, max = record_fence(buf, *len, &top);

		/* A record from before a lost fence file still keeps the
		 * counter above it. */
		if (max)
			lockfs_fence_observe(d->fence, max);
		if (out) {
			memset(out, 0, sizeof(*out));
			out->fence = top;
		}
	} else if (out) {
		memset(out, 0, sizeof(*out));
	}
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

/* There is one host and no session: the lock stays as it is. */
static int dir_adopt(struct lockfs_backend *be, const char *name, uint64_t identity,
		     struct lockfs_entry_stat *st)
{
	struct dir_store *d = to_dir(be);
	char lock[NAME_MAX + 1];
	struct stat sst;
	int rc = held_as(d, name, identity, lock, &sst);

	if (rc == 0 && st)
		fill_stat(st, &sst);
	return rc;
}

/* Is ENTRY (a name in DIR) a lock?  Its name without ".lock" into NAME. */
static bool lock_entry(const char *entry, char name[NAME_MAX + 1])
{
	size_t n = strlen(entry);

	if (n <= strlen(LOCK_SUFFIX) || n > NAME_MAX ||
	    strcmp(entry + n - strlen(LOCK_SUFFIX), LOCK_SUFFIX) != 0 ||
	    strncmp(entry, TMP_PREFIX, strlen(TMP_PREFIX)) == 0)
		return false;
	memcpy(name, entry, n - strlen(LOCK_SUFFIX));
	name[n - strlen(LOCK_SUFFIX)] = '\0';
	return true;
}

static int dir_list(struct lockfs_backend *be, lockfs_list_cb cb, void *arg)
{
	struct dir_store *d = to_dir(be);
	char name[NAME_MAX + 1];
	struct dirent *de;
	DIR *dir;
	int fd;

	/* A removed DIR still lists, as empty: that is no answer. */
	if (has_vanished(d) || !dir_is_there(d, false))
		return vanish(d);
	fd = openat(d->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return say_failed(d, WORK_READ, errno);
	dir = fdopendir(fd);
	if (!dir) {
		int rc = say_failed(d, WORK_READ, errno);

		close(fd);
		return rc;
	}
	while ((de = readdir(dir)))
		if (lock_entry(de->d_name, name) && cb(arg, name))
			break;
	closedir(dir);
	return 0;
}

/* -o stale: a foreign lock (the seed's, or made by hand: no record lockfs
 * wrote, or one that does not read as lockfs's -- garbage, truncated)
 * whose mtime is at least stale_s old -- the seed tool's own rule.  Locks
 * with a lockfs record (one with a fence) are never judged by age. */
static int dir_foreign_stale(struct lockfs_backend *be, const char *name,
			     struct lockfs_entry_stat *out)
{
	struct dir_store *d = to_dir(be);
	struct lockfs_entry_stat es;
	char *buf = NULL;
	size_t len;
	uint64_t top = 0;

	if (!d->stale_s || dir_read(be, name, &buf, &len, &es) < 0)
		return 0;
	if (buf)
		record_fence(buf, len, &top);
	free(buf);
	if (top || !es.identity || lockfs_wall_ms() - es.mtime_ms < (int64_t)d->stale_s * 1000)
		return 0;
	if (out)
		*out = es;
	return 1;
}

static int dir_session(struct lockfs_backend *be, const char *host, struct lockfs_session *out)
{
	struct dir_store *d = to_dir(be);

	/* One host, and no session that could end: the store is this
	 * machine's directory. */
	if (host && strcmp(host, d->base.host) != 0)
		return -ENOENT;
	out->state = LOCKFS_SESSION_LIVE;
	out->since_ms = d->opened_ms;
	out->id = 0;
	return 0;
}

/* ---- Reporting changes ---- */

/*
 * This daemon's own acquisitions and releases are renames between a
 * ".lockfs-" entry and NAME.lock (take, dir_release), which DIR's watch
 * sees as IN_MOVED_FROM and IN_MOVED_TO with one cookie.  ".lockfs-" names
 * are this daemon's alone (no lock name may start with '.'; the seed's
 * script never makes one), so such a pair is reported as CHANGE_OWN: the
 * engine made and cached it and need not wake up for it.  Everything else
 * -- a script's mkdir, rmdir or mv of NAME.lock, and a pair that does not
 * come together -- is CHANGE_NAME, as it always was.
 */
struct move_from {
	uint32_t cookie;
	bool pending;                /* an IN_MOVED_FROM awaits its IN_MOVED_TO */
	bool own;                    /* ... of a ".lockfs-" entry (else of NAME.lock) */
	char name[NAME_MAX + 1];     /* NAME, when of NAME.lock */
	bool others;                 /* a change not our own was reported */
};

static bool is_tmp(const char *entry)
{
	return strncmp(entry, TMP_PREFIX, strlen(TMP_PREFIX)) == 0;
}

/* The IN_MOVED_FROM held in *MF came without its pair: report it plainly. */
static void flush_move(struct dir_store *d, struct move_from *mf)
{
	if (mf->pending && !mf->own) {
		d->change(d->change_arg, LOCKFS_CHANGE_NAME, mf->name);
		mf->others = true;
	}
	mf->pending = false;
}

static void report_events(struct dir_store *d, const char *buf, ssize_t n,
			  struct move_from *mf)
{
	char name[NAME_MAX + 1];

	for (const char *p = buf; p < buf + n;) {
		const struct inotify_event *ev = (const struct inotify_event *)p;
		bool lock;

		p += sizeof(*ev) + ev->len;
		if (ev->mask & (IN_Q_OVERFLOW | IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) {
			flush_move(d, mf);
			d->change(d->change_arg, LOCKFS_CHANGE_ALL, NULL);
			mf->others = true;
			continue;
		}
		if (!ev->len)
			continue;
		lock = lock_entry(ev->name, name);
		if ((ev->mask & IN_MOVED_TO) && mf->pending && mf->cookie == ev->cookie) {
			/* The second half of one rename. */
			if (mf->own && lock)          /* .lockfs-X -> NAME.lock: take */
				d->change(d->change_arg, LOCKFS_CHANGE_OWN, name);
			else if (!mf->own && is_tmp(ev->name)) /* NAME.lock -> .lockfs-X */
				d->change(d->change_arg, LOCKFS_CHANGE_OWN, mf->name);
			else {
				flush_move(d, mf);
				if (lock)
					d->change(d->change_arg, LOCKFS_CHANGE_NAME, name);
				mf->others = true;
			}
			mf->pending = false;
			continue;
		}
		flush_move(d, mf);
		if ((ev->mask & IN_MOVED_FROM) && (lock || is_tmp(ev->name))) {
			mf->pending = true;
			mf->cookie = ev->cookie;
			mf->own = !lock;
			if (lock)
				memcpy(mf->name, name, sizeof(mf->name));
		} else if (lock) {
			d->change(d->change_arg, LOCKFS_CHANGE_NAME, name);
			mf->others = true;
		}
	}
}

/* Read and report DIR's events until none are queued (a rename's two
 * halves may straddle two reads); then an unpaired half is plain.
 * Returns true when all of them were this daemon's own renames. */
static bool drain_inotify(struct dir_store *d, char *buf, size_t size)
{
	struct move_from mf = { .pending = false, .others = false };
	bool any = false;
	ssize_t got;

	while ((got = read(d->inotify_fd, buf, size)) > 0) {
		any = true;
		report_events(d, buf, got, &mf);
		if (!mf.pending)
			break; /* nothing straddles: no read just to hear EAGAIN */
	}
	flush_move(d, &mf);
	return any && !mf.others;
}

/* The reporting thread: DIR's inotify events and this daemon's own
 * rewrites, to the engine's callback, one at a time. */
static void *report_thread(void *arg)
{
	struct dir_store *d = arg;
	char buf[16 * FRAME] __attribute__((aligned(__alignof__(struct inotify_event))));

	for (;;) {
		struct pollfd pfd[3] = {
			{ .fd = d->stop_fd, .events = POLLIN },
			{ .fd = d->own_pipe[0], .events = POLLIN },
			{ .fd = d->inotify_fd, .events = POLLIN },
		};
		int n = poll(pfd, d->inotify_fd >= 0 ? 3 : 2, d->inotify_fd >= 0 ? -1 : POLL_MS);
		ssize_t got;

		if (n < 0 && errno != EINTR)
			break;
		if (pfd[0].revents)
			break;
		if (n == 0) {
			d->change(d->change_arg, LOCKFS_CHANGE_ALL, NULL);
			continue;
		}
		if (d->inotify_fd >= 0 && pfd[2].revents && drain_inotify(d, buf, sizeof(buf))) {
			struct timespec quiet = { 0, OWN_QUIET_US * 1000L };

			(void)nanosleep(&quiet, NULL);
		}
		/* Whole frames only: every write is one FRAME (<= PIPE_BUF).
		 * They are this daemon's own rewrites inside NAME.lock. */
		if (pfd[1].revents && (got = read(d->own_pipe[0], buf, sizeof(buf))) > 0)
			for (ssize_t i = 0; i + FRAME <= got; i += FRAME) {
				buf[i + FRAME - 1] = '\0';
				d->change(d->change_arg, LOCKFS_CHANGE_OWN, buf + i);
			}
		if (__atomic_exchange_n(&d->own_overflow, false, __ATOMIC_ACQ_REL))
			d->change(d->change_arg, LOCKFS_CHANGE_ALL, NULL);
	}
	return NULL;
}

/* inotify on DIR, or -1 after one line on stderr (the user's inotify
 * limits): then the thread says "anything may have changed" every
 * POLL_MS, today's poll. */
static int watch_dir(struct dir_store *d)
{
	const uint32_t mask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
			      IN_ONLYDIR | IN_DELETE_SELF | IN_MOVE_SELF;
	char self[64];
	int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);

	/* DIR by its descriptor: the directory the daemon opened, whatever
	 * its path names now. */
	snprintf(self, sizeof(self), "/proc/self/fd/%d", d->dirfd);
	if (fd >= 0 && inotify_add_watch(fd, self, mask) < 0 &&
	    inotify_add_watch(fd, d->path, mask) < 0) {
		int err = errno;

		close(fd);
		fd = -1;
		errno = err;
	}
	if (fd < 0)
		fprintf(stderr, "lockfs: warning: backing dir %s: cannot watch it with inotify "
			"(%s); changes made outside lockfs are seen within %d ms instead of at "
			"once (raise fs.inotify.max_user_instances or max_user_watches)\n",
			d->path, strerror(errno), POLL_MS);
	return fd;
}

static int dir_start(struct lockfs_backend *be, lockfs_change_fn fn, void *arg)
{
	struct dir_store *d = to_dir(be);
	int rc;

	if (__atomic_load_n(&d->reporting, __ATOMIC_ACQUIRE) || !fn)
		return -EINVAL;
	d->change = fn;
	d->change_arg = arg;
	d->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (d->stop_fd < 0)
		return -errno;
	if (pipe2(d->own_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		rc = -errno;
		goto fail;
	}
	d->inotify_fd = watch_dir(d);
	rc = -pthread_create(&d->thread, NULL, report_thread, d);
	if (rc < 0)
		goto fail;
	pthread_setname_np(d->thread, "lockfs-dirwatch");
	__atomic_store_n(&d->reporting, true, __ATOMIC_RELEASE);
	return 0;
fail:
	if (d->inotify_fd >= 0)
		close(d->inotify_fd);
	if (d->own_pipe[0] >= 0) {
		close(d->own_pipe[0]);
		close(d->own_pipe[1]);
	}
	close(d->stop_fd);
	d->inotify_fd = d->own_pipe[0] = d->own_pipe[1] = d->stop_fd = -1;
	return rc;
}

static int dir_check(struct lockfs_backend *be)
{
	struct dir_store *d = to_dir(be);

	if (has_vanished(d))
		return -EIO;
	return dir_is_there(d, true) ? 0 : vanish(d);
}

static void dir_close(struct lockfs_backend *be)
{
	struct dir_store *d = to_dir(be);
	char tomb[64];

	if (__atomic_exchange_n(&d->reporting, false, __ATOMIC_ACQ_REL)) {
		uint64_t one = 1;

		if (write(d->stop_fd, &one, sizeof(one)) != sizeof(one))
			fprintf(stderr, "lockfs: cannot stop the backing dir watch: %s\n",
				strerror(errno));
		pthread_join(d->thread, NULL);
		if (d->inotify_fd >= 0)
			close(d->inotify_fd);
		close(d->own_pipe[0]);
		close(d->own_pipe[1]);
		close(d->stop_fd);
	}
	while (pool_get(d, tomb))
		remove_entry(d->dirfd, tomb);
	pthread_mutex_destroy(&d->pool_mu);
	pthread_mutex_destroy(&d->health_mu);
	lockfs_fence_close(d->fence);
	lockfs_statedir_close(&d->sd);
	free(d->path);
	free(d);
}

static const struct lockfs_backend_ops dir_ops = {
	.acquire = dir_acquire,
	.claim = dir_claim,
	.leave = dir_leave,
	.handoff = dir_handoff,
	.update = dir_update,
	.release = dir_release,
	.adopt = dir_adopt,
	.read = dir_read,
	.stat = dir_stat,
	.list = dir_list,
	.foreign_stale = dir_foreign_stale,
	.session = dir_session,
	.start = dir_start,
	.check = dir_check,
	.close = dir_close,
};

/* ---- Opening ---- */

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

/* The fence file: the option, else the persistent default, else (no
 * /var/lib to write) DIR/.fence with a warning.  Relative paths are
 * DIR's. */
static const char *fence_path(const char *opt, const char *dir)
{
	int fd;

	if (opt)
		return opt;
	if (mkdir(LOCKFS_DIR_DEFAULT_FENCE_DIR, 0755) < 0 && errno != EEXIST)
		goto fallback;
	fd = open(LOCKFS_DIR_DEFAULT_FENCE_FILE, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		goto fallback;
	close(fd);
	return LOCKFS_DIR_DEFAULT_FENCE_FILE;
fallback:
	fprintf(stderr, "lockfs: warning: cannot use " LOCKFS_DIR_DEFAULT_FENCE_FILE " (%s); "
		"keeping fences in %s/.fence, which must survive reboots\n", strerror(errno), dir);
	return ".fence";
}

/* "SECONDS" (1..10 years) into *OUT, as fs/main.c's parse_seconds. */
static int parse_seconds(const char *text, uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = text && *text >= '0' && *text <= '9' ? strtoul(text, &end, 10) : 0;
	if (!text || errno || *end || v == 0 || v > LOCKFS_LEASE_MAX_S)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

static void say(const struct lockfs_backend_config *cfg, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void say(const struct lockfs_backend_config *cfg, const char *fmt, ...)
{
	va_list ap;

	if (!cfg->why || !cfg->why_size)
		return;
	va_start(ap, fmt);
	vsnprintf(cfg->why, cfg->why_size, fmt, ap);
	va_end(ap);
}

static const char *gethost(char buf[LOCKFS_HOST_MAX])
{
	if (gethostname(buf, LOCKFS_HOST_MAX - 1) < 0)
		snprintf(buf, LOCKFS_HOST_MAX, "localhost");
	buf[LOCKFS_HOST_MAX - 1] = '\0';
	return buf;
}

static int dir_open(const struct lockfs_backend_config *cfg, struct lockfs_backend **out)
{
	const char *backing = LOCKFS_DIR_DEFAULT_BACKING, *fence_opt = NULL;
	struct dir_store *d;
	struct stat st;
	int rc;

	d = calloc(1, sizeof(*d));
	if (!d) {
		say(cfg, "out of memory");
		return -ENOMEM;
	}
	d->inotify_fd = d->own_pipe[0] = d->own_pipe[1] = d->stop_fd = -1;
	for (size_t i = 0; i < cfg->n_options; i++) {
		const struct lockfs_backend_option *o = &cfg->options[i];

		if (strcmp(o->key, "backing") == 0) {
			backing = o->value;
		} else if (strcmp(o->key, "fence_file") == 0) {
			fence_opt = o->value;
		} else if (strcmp(o->key, "stale") == 0) {
			if (parse_seconds(o->value, &d->stale_s) < 0) {
				say(cfg, "-o stale=%s: want a whole number of seconds > 0",
				    o->value ? o->value : "");
				free(d);
				return -EINVAL;
			}
		} else {
			say(cfg, "-o %s: not an option of the dir backend", o->key);
			free(d);
			return -EINVAL;
		}
	}
	/* The default is created also when spelled out (fstab's
	 * backing=/run/lockfs at boot, before anything made it). */
	rc = lockfs_statedir_open(&d->sd, backing,
				  strcmp(backing, LOCKFS_DIR_DEFAULT_BACKING) == 0,
				  cfg->takeover, cfg->takeover_arg, cfg->why, cfg->why_size);
	if (rc < 0) {
		free(d);
		return rc;
	}
	pthread_mutex_init(&d->pool_mu, NULL);
	pthread_mutex_init(&d->health_mu, NULL);
	d->dirfd = d->sd.dirfd;
	d->uid = geteuid();
	d->opened_ms = lockfs_wall_ms();
	/* Absolute: the daemon changes its directory when it detaches. */
	d->path = realpath(backing, NULL);
	if (!d->path)
		d->path = strdup(backing);
	if (!d->path || fstat(d->dirfd, &st) < 0) {
		rc = d->path ? -errno : -ENOMEM;
		say(cfg, "backing dir %s: %s", backing, strerror(-rc));
		goto fail;
	}
	d->dev = st.st_dev;
	d->ino = st.st_ino;
	rc = probe_noreplace(d->dirfd);
	if (rc < 0) {
		say(cfg, "backing dir %s: %s", backing, rc == -EINVAL ?
		    "filesystem lacks rename(RENAME_NOREPLACE), so acquisition could not be "
		    "atomic" : strerror(-rc));
		goto fail;
	}
	sweep_leftovers(d->dirfd);
	fence_opt = fence_path(fence_opt, backing);
	rc = lockfs_fence_open(&d->fence, d->dirfd, fence_opt);
	if (rc < 0) {
		say(cfg, "cannot start the lock engine on %s: %s", backing,
		    rc == -EINVAL ? "bad helpers= list or fence file" :
		    rc == -EMLINK ? "the fence file is a symlink, a FIFO, another user's or has "
		    "other hard links (it is rewritten in place): remove it, or name another "
		    "with -o fence_file=" : strerror(-rc));
		goto fail;
	}
	d->base.ops = &dir_ops;
	d->base.kind = &lockfs_backend_dir_kind;
	d->base.caps = 0;
	d->base.stale_s = d->stale_s;
	gethost(d->base.host);
	d->base.state_dirfd = d->dirfd;
	/* As given, as today's messages and fsname= show it. */
	d->base.state_path = d->sd.path;
	d->base.source = d->sd.path;
	d->base.statedir = &d->sd;
	*out = &d->base;
	return 0;
fail:
	pthread_mutex_destroy(&d->pool_mu);
	pthread_mutex_destroy(&d->health_mu);
	lockfs_statedir_close(&d->sd);
	free(d->path);
	free(d);
	return rc;
}

static const char *const dir_option_keys[] = { "backing", "fence_file", "stale", NULL };

const struct lockfs_backend_kind lockfs_backend_dir_kind = {
	.name = "dir",
	.option_keys = dir_option_keys,
	.help =
	"    -o backing=DIR        backing directory (default " LOCKFS_DIR_DEFAULT_BACKING ")\n"
	"    -o fence_file=PATH    fence counter (default " LOCKFS_DIR_DEFAULT_FENCE_FILE ")\n"
	"    -o stale=SECONDS      recover foreign locks older than this (default never)\n",
	.open = dir_open,
};
