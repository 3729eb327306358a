/*
 * Entries, records and identities in DIR (dir_internal.h): safe creation,
 * replacement and reuse of the files the dir store writes.  Nothing in DIR
 * is trusted, so no symlink is ever followed on the way to a file the
 * daemon writes, every new record is a new file (O_CREAT|O_EXCL), and a
 * kept lock directory is rewritten only after the open file was checked
 * (reuse_dir).  The store's overview is at the top of dir.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "lockfs/record.h"
#include "dir_internal.h"

/* "NAME.lock" into BUF; -ENAMETOOLONG when it does not fit NAME_MAX. */
int lockfs_dir_lock_path(char buf[NAME_MAX + 1], const char *name)
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
void lockfs_dir_tmp_name(char buf[64], const char *kind)
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
uint64_t lockfs_dir_stat_identity(const struct stat *st)
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

void lockfs_dir_fill_stat(struct lockfs_entry_stat *out, const struct stat *st)
{
	memset(out, 0, sizeof(*out));
	out->uid = st->st_uid;
	out->gid = st->st_gid;
	out->mtime_ms = (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
	out->identity = lockfs_dir_stat_identity(st);
}

/*
 * Stat the lock NAME: its record file when it has one (one syscall for the
 * usual case), else DIR/NAME.lock itself.  0, -ENOENT when not held, or
 * another -errno of the medium.
 */
int lockfs_dir_stat_lock(int dirfd, const char *lock, struct stat *st)
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
int lockfs_dir_check_identity(struct dir_store *d, const char *lock, uint64_t identity,
			      struct stat *st)
{
	int rc = lockfs_dir_stat_lock(d->dirfd, lock, st);

	if (rc == -ENOENT || rc == -ENOTDIR)
		return lockfs_dir_not_held(d);
	if (rc < 0)
		return lockfs_dir_say_failed(d, WORK_READ, -rc);
	return lockfs_dir_stat_identity(st) == identity ? 0 : -ENOENT;
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

void lockfs_dir_remove_entry(int dirfd, const char *entry)
{
	remove_tree(dirfd, entry, 16);
}

/*
 * Create FILE inside the directory DIRPATH (relative to dirfd) and write
 * RECORD to it, with the guarantees of lockfs_dir_write_record below.
 * Returns the open file (the caller closes it), or -errno with no file
 * left behind.
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
int lockfs_dir_write_record(int dirfd, const char *dirpath, const char *file,
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
int lockfs_dir_reuse_dir(struct dir_store *d, const char *tmp, const char *record,
			 size_t len, struct stat *st)
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
		rc = errno == ENOENT ? lockfs_dir_write_record(d->dirfd, tmp, RECORD_FILE, record,
							       len, st)
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

/*
 * Replace LOCK's record with JSON: a new file renamed over the old one, so
 * a reader sees the old record or the new one, whole.  The new record's
 * stat into *ST (may be NULL), taken after the rename (which set its
 * ctime) from the open file: the identity of the record written here,
 * whatever happened to the path since, and no second path walk.  0,
 * -ENOENT (the lock went meanwhile), -EIO.
 */
int lockfs_dir_replace_record(struct dir_store *d, const char *lock, const char *json,
			      size_t len, struct stat *st)
{
	char tmp[64], from[NAME_MAX * 2 + 2], to[NAME_MAX * 2 + 2];
	int fd, rc;

	lockfs_dir_tmp_name(tmp, "rec");
	fd = create_record(d->dirfd, lock, tmp, json, len);
	if (fd < 0) {
		/* NAME.lock gone, or now a file or a symlink (ELOOP under
		 * RESOLVE_NO_SYMLINKS): not the lock IDENTITY names. */
		if (fd == -ENOENT || fd == -ENOTDIR || fd == -ELOOP)
			return lockfs_dir_not_held(d);
		return lockfs_dir_say_failed(d, WORK_RECORDS, -fd);
	}
	snprintf(from, sizeof(from), "%s/%s", lock, tmp);
	snprintf(to, sizeof(to), "%s/%s", lock, RECORD_FILE);
	if (renameat(d->dirfd, from, d->dirfd, to) < 0) {
		rc = errno;
		close(fd);
		unlinkat(d->dirfd, from, 0);
		return rc == ENOENT ? lockfs_dir_not_held(d) : lockfs_dir_say_failed(d, WORK_RECORDS, rc);
	}
	lockfs_dir_say_works(d, WORK_RECORDS);
	/* The record is in place: a failed stat or close changes nothing
	 * stored, but the caller cannot know its identity (EIO, said). */
	rc = st && fstat(fd, st) < 0 ? errno : 0;
	if (close(fd) < 0 && rc == 0 && errno != EINTR)
		rc = errno;
	return rc ? lockfs_dir_say_failed(d, WORK_READ, rc) : 0;
}

/* Open DIR/LOCK/FILE without following any symlink on the way. */
int lockfs_dir_open_record(int dirfd, const char *lock, const char *file)
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

/* Is ENTRY (a name in DIR) a lock?  Its name without ".lock" into NAME. */
bool lockfs_dir_lock_entry(const char *entry, char name[NAME_MAX + 1])
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

bool lockfs_dir_is_tmp(const char *entry)
{
	return strncmp(entry, TMP_PREFIX, strlen(TMP_PREFIX)) == 0;
}
