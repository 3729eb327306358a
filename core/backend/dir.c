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
 *
 * This file holds the ops; the rest of the store is in dir_open.c
 * (opening), dir_watch.c (reporting changes), dir_files.c (entries,
 * records and identities in DIR) and dir_health.c (is DIR there, and
 * saying what is wrong with it); dir_internal.h says which calls which.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "lockfs/record.h"
#include "base/clock.h"
#include "dir_internal.h"

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

/*
 * The head of every op on a lock that may be held: NAME's entry into
 * LOCK, unless DIR is known to be gone.  0, -ENOENT (no such lock can
 * exist: the name does not fit), -EIO.
 */
static int lock_of(struct dir_store *d, const char *name, char lock[NAME_MAX + 1])
{
	if (lockfs_dir_lock_path(lock, name) < 0)
		return -ENOENT;
	return lockfs_dir_has_vanished(d) ? -EIO : 0;
}

/*
 * The head of every change of a held lock: is NAME's stored lock (its
 * entry into LOCK) still the one IDENTITY names
 * (lockfs_dir_check_identity)?  0 (*ST its stat), -ENOENT, -EIO.
 */
static int held_as(struct dir_store *d, const char *name, uint64_t identity,
		   char lock[NAME_MAX + 1], struct stat *st)
{
	int rc = lock_of(d, name, lock);

	return rc < 0 ? rc : lockfs_dir_check_identity(d, lock, identity, st);
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

	if (lockfs_dir_has_vanished(d))
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
	if (pooled && lockfs_dir_reuse_dir(d, tmp, json, len, &st) < 0) {
		/* Tampered with, or DIR refuses: drop it.  A refusal shows
		 * again below, where it is said. */
		lockfs_dir_remove_entry(d->dirfd, tmp);
		pooled = false;
	}
	if (!pooled) {
		lockfs_dir_tmp_name(tmp, "new");
		if (mkdirat(d->dirfd, tmp, 0755) < 0) {
			rc = lockfs_dir_say_failed(d, WORK_ENTRIES, errno);
			goto out;
		}
		rc = lockfs_dir_write_record(d->dirfd, tmp, RECORD_FILE, json, len, &st);
		if (rc < 0) {
			lockfs_dir_remove_entry(d->dirfd, tmp);
			rc = lockfs_dir_say_failed(d, WORK_RECORDS, -rc);
			goto out;
		}
	}
	lockfs_dir_say_works(d, WORK_RECORDS);
	if (renameat2(d->dirfd, tmp, d->dirfd, lock, RENAME_NOREPLACE) < 0) {
		rc = errno == EEXIST ? -EEXIST : lockfs_dir_say_failed(d, WORK_ENTRIES, errno);
		/* Back to the pool: also when DIR refuses entries (then
		 * removing it would fail too, and it would be left behind
		 * until the next start). */
		if (!pool_put(d, tmp))
			lockfs_dir_remove_entry(d->dirfd, tmp);
		goto out;
	}
	lockfs_dir_say_works(d, WORK_ENTRIES);
	if (out) {
		lockfs_dir_fill_stat(out, &st);
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
	int rc = lockfs_dir_lock_path(lock, name);

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
	int rc = lockfs_dir_lock_path(lock, name);

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
 * The rewrite shared by update and handoff: while NAME's lock is IDENTITY,
 * store SRC's record made with FENCE (0: an edit) and fill ST with the
 * new identity; with REPORT, tell the reporting thread
 * (lockfs_dir_report_own).  0, -ENOENT, -EIO, -ENOMEM; nothing changed on
 * error.
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
	rc = lockfs_dir_replace_record(d, lock, json, len, out ? &st : NULL);
	if (rc == 0 && !grant)
		record_fence(json, len, &top);
	free(json);
	if (rc < 0)
		return rc;
	if (report)
		lockfs_dir_report_own(d, name);
	if (!out)
		return 0;
	lockfs_dir_fill_stat(out, &st);
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
	 * kept for the next acquisition, which checks it again
	 * (lockfs_dir_reuse_dir), or removed. */
	lockfs_dir_tmp_name(tomb, "free");
	if (renameat2(d->dirfd, lock, d->dirfd, tomb, RENAME_NOREPLACE) < 0)
		return errno == ENOENT ? lockfs_dir_not_held(d)
				       : lockfs_dir_say_failed(d, WORK_ENTRIES, errno);
	lockfs_dir_say_works(d, WORK_ENTRIES);
	if (!lockfs_dir_identity_is_record(identity) || !pool_put(d, tomb))
		lockfs_dir_remove_entry(d->dirfd, tomb); /* foreign leftovers never get reused */
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
		return errno == ENOENT ? -ENOENT : lockfs_dir_say_failed(d, WORK_READ, errno);
	rc = lockfs_dir_stat_lock(d->dirfd, lock, &st);
	if (rc == -ENOENT)
		return likely_held ? lockfs_dir_not_held(d) : -ENOENT;
	if (rc < 0)
		return lockfs_dir_say_failed(d, WORK_READ, -rc);
	if (out)
		lockfs_dir_fill_stat(out, &st);
	return 0;
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
	fd = lockfs_dir_open_record(d->dirfd, lock, RECORD_FILE);
	if (fd >= 0)
		usable = fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode) &&
			 fst.st_size <= LOCKFS_RECORD_MAX;
	/* Owner, group and time of the lock itself: what a foreign lock
	 * shows, and what -o stale judges it by. */
	if (fstatat(d->dirfd, lock, &dst, AT_SYMLINK_NOFOLLOW) < 0) {
		rc = errno;
		if (fd >= 0)
			close(fd);
		return rc == ENOENT ? lockfs_dir_not_held(d) : lockfs_dir_say_failed(d, WORK_READ, rc);
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

		/* The identity as lockfs_dir_stat_lock() sees it, so that
		 * release and update, which check it that way, agree.  No
		 * usable record: held all the same (fail closed). */
		if (usable)
			out->identity = lockfs_dir_stat_identity(&fst);
		else if (lockfs_dir_stat_lock(d->dirfd, lock, &ist) == 0)
			out->identity = lockfs_dir_stat_identity(&ist);
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
		lockfs_dir_fill_stat(st, &sst);
	return rc;
}

static int dir_list(struct lockfs_backend *be, lockfs_list_cb cb, void *arg)
{
	struct dir_store *d = to_dir(be);
	char name[NAME_MAX + 1];
	struct dirent *de;
	DIR *dir;
	int fd;

	/* A removed DIR still lists, as empty: that is no answer. */
	if (lockfs_dir_has_vanished(d) || !lockfs_dir_is_there(d, false))
		return lockfs_dir_vanish(d);
	fd = openat(d->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return lockfs_dir_say_failed(d, WORK_READ, errno);
	dir = fdopendir(fd);
	if (!dir) {
		int rc = lockfs_dir_say_failed(d, WORK_READ, errno);

		close(fd);
		return rc;
	}
	while ((de = readdir(dir)))
		if (lockfs_dir_lock_entry(de->d_name, name) && cb(arg, name))
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

static int dir_check(struct lockfs_backend *be)
{
	struct dir_store *d = to_dir(be);

	if (lockfs_dir_has_vanished(d))
		return -EIO;
	return lockfs_dir_is_there(d, true) ? 0 : lockfs_dir_vanish(d);
}

static void dir_close(struct lockfs_backend *be)
{
	struct dir_store *d = to_dir(be);
	char tomb[64];

	lockfs_dir_watch_stop(d);
	while (pool_get(d, tomb))
		lockfs_dir_remove_entry(d->dirfd, tomb);
	pthread_mutex_destroy(&d->pool_mu);
	pthread_mutex_destroy(&d->health_mu);
	lockfs_fence_close(d->fence);
	lockfs_statedir_close(&d->sd);
	free(d->path);
	free(d);
}

const struct lockfs_backend_ops lockfs_dir_ops = {
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
	.start = lockfs_dir_start,
	.check = dir_check,
	.close = dir_close,
};
