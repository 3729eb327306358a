/*
 * The files a helper's name stands for in a root (docs/holder.md, "Genuine
 * helpers"), and the lookup in a caller's own root off the request path.
 *
 * Why a bound: a request (mkdir, rmdir) is served while the kernel holds
 * the lock of the directory it names, so a walk that waits on anything the
 * caller controls wedges the mount for everyone.  A caller's root is the
 * caller's to shape: an ordinary user can make one in a user namespace
 * with a bind mount of this very mount in a system directory (the walk
 * comes back into the directory whose lock the kernel holds for this
 * request) or with a FUSE file system of its own that never answers.  So
 * that walk runs on a thread of its own, and the request waits for it at
 * most LOCKFS_FOREIGN_LOOKUP_MS; a walk that takes longer goes on alone
 * (it ends when what it waits on does) and holds one of a few places,
 * counted per uid, so that one user's stuck walks never keep the others'
 * containers from being answered.  The daemon's own root is walked in
 * place: nobody but root mounts in the daemon's mount namespace.
 *
 * Which walks are judged: found (1) and not found (0) as they were;
 * "no answer in time" and "no place left" are told apart from both, and
 * the holder rule makes them a refusal (EACCES), never a guess.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "helper_files.h"

/*
 * Where a helper's name is looked up, in a process's root: the standard
 * PATH of root on Debian.  A helper is genuine only as one of these files.
 */
static const char *const system_dirs[] = {
	"usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin",
};

int lockfs_stat_cached(int fd, const char *path, struct stat *st)
{
	struct statx sx;

	if (statx(fd, path, (*path ? 0 : AT_EMPTY_PATH) | AT_STATX_DONT_SYNC,
		  STATX_TYPE | STATX_MODE | STATX_INO | STATX_UID | STATX_GID, &sx) < 0)
		return -errno;
	memset(st, 0, sizeof(*st));
	st->st_dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	st->st_ino = (ino_t)sx.stx_ino;
	st->st_mode = sx.stx_mode;
	st->st_uid = sx.stx_uid;
	st->st_gid = sx.stx_gid;
	return 0;
}

static long sys_openat2(int dirfd, const char *path, int flags, unsigned long long resolve)
{
	struct open_how how = { .flags = (unsigned long long)flags | O_CLOEXEC,
				.resolve = resolve };

	return syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
}

/* May a file or directory ST, under a root owned by OWNER, be trusted as
 * the system's: owned by root (or OWNER) and writable by nobody else? */
static bool owned_safely(const struct stat *st, uid_t owner)
{
	return (st->st_uid == 0 || st->st_uid == owner) && !(st->st_mode & (S_IWGRP | S_IWOTH));
}

/* A root-owned directory with the sticky bit (/tmp): others may add names
 * to it but never rename or remove root's, so the safely owned directory
 * below it that the chain came through stays what it is. */
static bool sticky_root_dir(const struct stat *st)
{
	return st->st_uid == 0 && (st->st_mode & S_ISVTX);
}

/*
 * Is directory DIRFD trusted all the way up to the root ROOT: it and every
 * directory above it (through "..", so symlinks in the path that reached
 * it do not matter) safely owned?  DIRFD is left open.
 */
static bool dir_chain_trusted(int dirfd, const struct stat *root, uid_t owner)
{
	int fd = openat(dirfd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	bool ok = false;

	for (int depth = 0; fd >= 0 && depth < 64; depth++) {
		struct stat st;
		int up;

		if (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode) ||
		    !(owned_safely(&st, owner) || sticky_root_dir(&st)))
			break;
		if (st.st_dev == root->st_dev && st.st_ino == root->st_ino) {
			ok = true;
			break;
		}
		up = openat(fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
		close(fd);
		fd = up;
	}
	if (fd >= 0)
		close(fd);
	return ok;
}

size_t lockfs_file_ids_add(struct lockfs_file_id *set, size_t n, size_t max, dev_t dev,
			   ino_t ino)
{
	for (size_t i = 0; i < n; i++)
		if (set[i].dev == dev && set[i].ino == ino)
			return n;
	if (n < max) {
		set[n].dev = dev;
		set[n].ino = ino;
		n++;
	}
	return n;
}

bool lockfs_helper_file_trusted(int fd, int dirfd, const struct stat *root, uid_t owner,
				struct stat *st)
{
	return fstat(fd, st) == 0 && S_ISREG(st->st_mode) && (st->st_mode & 0111) &&
	       owned_safely(st, owner) && dir_chain_trusted(dirfd, root, owner);
}

/* Symlinks are followed as that root sees them (RESOLVE_IN_ROOT). */
size_t lockfs_helper_files_find(int rootfd, const struct stat *root, const char *name,
				struct lockfs_file_id *out, size_t max, const struct stat *want)
{
	size_t n = 0;

	for (size_t i = 0; i < sizeof(system_dirs) / sizeof(system_dirs[0]) && n < max; i++) {
		char path[PATH_MAX];
		struct stat st;
		int dirfd, fd;

		if ((size_t)snprintf(path, sizeof(path), "%s/%s", system_dirs[i], name) >=
		    sizeof(path))
			continue;
		fd = (int)sys_openat2(rootfd, path, O_PATH, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
		if (fd < 0)
			continue;
		/* Cheap first: only a file with the right id is worth the
		 * walk up its directories. */
		if (fstat(fd, &st) < 0 ||
		    (want && (st.st_dev != want->st_dev || st.st_ino != want->st_ino))) {
			close(fd);
			continue;
		}
		dirfd = (int)sys_openat2(rootfd, system_dirs[i], O_PATH | O_DIRECTORY,
					 RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
		if (dirfd >= 0 && lockfs_helper_file_trusted(fd, dirfd, root, root->st_uid, &st))
			n = lockfs_file_ids_add(out, n, max, st.st_dev, st.st_ino);
		if (dirfd >= 0)
			close(dirfd);
		close(fd);
		if (want && n)
			break;
	}
	return n;
}

/* ---- the walk in a caller's root, off the request path ---------------- */

/*
 * One walk.  Two references: the request's (dropped when it has its
 * answer or gives up) and the walking thread's (dropped when the walk
 * ends); the last one frees it.  Everything below is protected by
 * walks_mu, but the fields the walker reads, which are set before it
 * starts and never change.
 */
struct walk {
	int rootfd;              /* the walker's own copy, closed at the end */
	struct stat root, want;
	char name[NAME_MAX + 1];
	uid_t uid;
	int refs;
	bool done;
	bool found;
	pthread_cond_t ended;    /* signalled when done */
};

static pthread_mutex_t walks_mu = PTHREAD_MUTEX_INITIALIZER;
/* Walks under way (protected by walks_mu): in all, and per uid for the
 * uids that have any (at most LOCKFS_FOREIGN_LOOKUPS_MAX of them). */
static unsigned walks_running;
static struct {
	uid_t uid;
	unsigned running;
} walks_by_uid[LOCKFS_FOREIGN_LOOKUPS_MAX];

/* Found walks, so that a container's helpers are walked once, not on
 * every request: (the root, the file) pairs whose file is genuine there.
 * Direct-mapped; protected by walks_mu.  Safe to keep: the same file in
 * the same root is the same answer (a name given to another file is
 * another inode), and a file only the root's owner may place there. */
#define FOUND_SLOTS 64
static struct {
	struct lockfs_file_id root, file;
	char name[16];
	bool used;
} found_cache[FOUND_SLOTS];

static size_t found_slot(const struct stat *root, const struct stat *file)
{
	unsigned long long h = (unsigned long long)root->st_ino * 31u + file->st_ino;

	h ^= (unsigned long long)file->st_dev * 131u + root->st_dev;
	return (size_t)(h % FOUND_SLOTS);
}

static bool found_cached(const struct stat *root, const struct stat *file, const char *name)
{
	size_t i = found_slot(root, file);

	return found_cache[i].used && found_cache[i].root.dev == root->st_dev &&
	       found_cache[i].root.ino == root->st_ino && found_cache[i].file.dev == file->st_dev &&
	       found_cache[i].file.ino == file->st_ino && strcmp(found_cache[i].name, name) == 0;
}

static void found_remember(const struct stat *root, const struct stat *file, const char *name)
{
	size_t i = found_slot(root, file);

	if (strlen(name) >= sizeof(found_cache[i].name))
		return;
	found_cache[i].root = (struct lockfs_file_id){ root->st_dev, root->st_ino };
	found_cache[i].file = (struct lockfs_file_id){ file->st_dev, file->st_ino };
	strcpy(found_cache[i].name, name);
	found_cache[i].used = true;
}

/* UID's count of walks under way, or NULL when there is no room for it.
 * Under walks_mu. */
static unsigned *uid_running(uid_t uid)
{
	unsigned *free_slot = NULL;

	for (size_t i = 0; i < LOCKFS_FOREIGN_LOOKUPS_MAX; i++) {
		if (walks_by_uid[i].running && walks_by_uid[i].uid == uid)
			return &walks_by_uid[i].running;
		if (!walks_by_uid[i].running && !free_slot) {
			free_slot = &walks_by_uid[i].running;
			walks_by_uid[i].uid = uid;
		}
	}
	return free_slot;
}

/* Drop one reference of W.  Under walks_mu. */
static void walk_put_locked(struct walk *w)
{
	if (--w->refs > 0)
		return;
	close(w->rootfd);
	pthread_cond_destroy(&w->ended);
	free(w);
}

static void *walk_main(void *arg)
{
	struct walk *w = arg;
	struct lockfs_file_id id;
	bool found = lockfs_helper_files_find(w->rootfd, &w->root, w->name, &id, 1, &w->want) == 1;

	pthread_mutex_lock(&walks_mu);
	w->found = found;
	w->done = true;
	if (found)
		found_remember(&w->root, &w->want, w->name);
	walks_running--;
	(*uid_running(w->uid))--;
	pthread_cond_signal(&w->ended);
	walk_put_locked(w);
	pthread_mutex_unlock(&walks_mu);
	return NULL;
}

/* Start W's walker, detached, with every signal blocked (the daemon's
 * signals go to its main thread).  0 or -errno. */
static int walk_start(struct walk *w)
{
	pthread_attr_t attr;
	sigset_t all, old;
	pthread_t t;
	int rc;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = pthread_create(&t, &attr, walk_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (rc == 0)
		pthread_setname_np(t, "lockfs-rootwalk");
	return -rc;
}

int lockfs_helper_files_find_foreign(int rootfd, const struct stat *root, const char *name,
				     const struct stat *want, uid_t uid)
{
	pthread_condattr_t ca;
	struct timespec until;
	struct walk *w;
	unsigned *mine;
	int rc;

	if (strlen(name) > NAME_MAX)
		return 0;
	pthread_mutex_lock(&walks_mu);
	if (found_cached(root, want, name)) {
		pthread_mutex_unlock(&walks_mu);
		return 1;
	}
	mine = uid_running(uid);
	if (walks_running >= LOCKFS_FOREIGN_LOOKUPS_MAX || !mine ||
	    *mine >= LOCKFS_FOREIGN_LOOKUPS_PER_UID) {
		pthread_mutex_unlock(&walks_mu);
		return -EBUSY;
	}
	walks_running++;
	(*mine)++;
	pthread_mutex_unlock(&walks_mu);

	w = calloc(1, sizeof(*w));
	rc = w ? 0 : -ENOMEM;
	if (w) {
		w->rootfd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
		rc = w->rootfd >= 0 ? 0 : -errno;
	}
	if (rc == 0) {
		w->root = *root;
		w->want = *want;
		strcpy(w->name, name);
		w->uid = uid;
		w->refs = 2;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&w->ended, &ca);
		pthread_condattr_destroy(&ca);
		rc = walk_start(w);
		if (rc < 0) {
			pthread_cond_destroy(&w->ended);
			close(w->rootfd);
		}
	}
	if (rc < 0) {
		free(w);
		pthread_mutex_lock(&walks_mu);
		walks_running--;
		(*uid_running(uid))--;
		pthread_mutex_unlock(&walks_mu);
		return rc;
	}

	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_nsec += LOCKFS_FOREIGN_LOOKUP_MS * 1000000L;
	until.tv_sec += until.tv_nsec / 1000000000L;
	until.tv_nsec %= 1000000000L;
	pthread_mutex_lock(&walks_mu);
	while (!w->done && pthread_cond_timedwait(&w->ended, &walks_mu, &until) != ETIMEDOUT)
		;
	rc = w->done ? (w->found ? 1 : 0) : -ETIMEDOUT;
	walk_put_locked(w);
	pthread_mutex_unlock(&walks_mu);
	return rc;
}
