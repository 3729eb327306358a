/*
 * The helper list and its genuine files (docs/holder.md, "Genuine
 * helpers"): a helper is skipped only when it is genuine, the very file
 * (device and inode) that its name stands for in the system directories of
 * its root.  The daemon's own root is looked up once and cached, so a
 * genuine helper costs one stat(2) of /proc/PID/exe; a miss looks again (a
 * package upgrade replaces the file), and a process in another root (a
 * container) is looked up in that root, through /proc/PID/root
 * (helper_files.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lockfs/holder.h"
#include "helper_files.h"
#include "helpers.h"
#include "procfs.h"

#define NMULTI LOCKFS_MULTICALL_COUNT

/* Most distinct files one name may be (system_dirs, plus the lockctl
 * beside the daemon). */
#define FILES_MAX 8
/* Most files tests may add per name (lockfs_helpers_trust_file). */
#define TRUSTED_MAX 4

/* The genuine files of one name. */
struct genuine_set {
	struct lockfs_file_id found[FILES_MAX];   /* looked up in the daemon's root */
	size_t nfound;
	struct lockfs_file_id trusted[TRUSTED_MAX]; /* added by lockfs_helpers_trust_file */
	size_t ntrusted;
};

struct lockfs_genuine {
	int rootfd;          /* O_PATH of the daemon's "/" */
	struct stat root;    /* its fstat: id and owner */
	char *self_dir;      /* the directory of the daemon's executable, or NULL */
	size_t nnames;       /* helpers; then NMULTI multi-call binaries */
	struct genuine_set *sets;
};

/* The lockctl that came with the daemon: beside its executable (as
 * installed) or in tools/ below it (as meson builds it), when that
 * directory is trusted as the daemon's: owned by root or by the daemon's
 * user, and writable by nobody else.  Adds what it finds to SET. */
static void find_beside_daemon(struct lockfs_genuine *g, struct genuine_set *set)
{
	static const char *const where[] = { ".", "tools" };

	for (size_t i = 0; g->self_dir && i < sizeof(where) / sizeof(where[0]); i++) {
		char path[PATH_MAX];
		struct stat st;
		int dirfd, fd;

		if ((size_t)snprintf(path, sizeof(path), "%s/%s", g->self_dir, where[i]) >=
		    sizeof(path))
			continue;
		dirfd = open(path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (dirfd < 0)
			continue;
		fd = openat(dirfd, "lockctl", O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0 && lockfs_helper_file_trusted(fd, dirfd, &g->root, geteuid(), &st))
			set->nfound = lockfs_file_ids_add(set->found, set->nfound, FILES_MAX,
							  st.st_dev, st.st_ino);
		if (fd >= 0)
			close(fd);
		close(dirfd);
	}
}

/* Name I of the set (a helper, or a multi-call binary). */
static const char *set_name(const struct lockfs_helpers *h, size_t i)
{
	return i < h->genuine->nnames ? h->names[i]
				       : lockfs_multicall_names[i - h->genuine->nnames];
}

/* Look set I's files up in the daemon's root, into *SET (its found
 * files only).  Reads only what never changes after parse (rootfd, root,
 * self_dir, the names), so it needs no lock. */
static void lookup_set(const struct lockfs_helpers *h, size_t i, struct genuine_set *set)
{
	struct lockfs_genuine *g = h->genuine;
	const char *name = set_name(h, i);

	set->nfound = g->rootfd >= 0 ? lockfs_helper_files_find(g->rootfd, &g->root, name,
								set->found, FILES_MAX, NULL) : 0;
	if (strcmp(name, "lockctl") == 0)
		find_beside_daemon(g, set);
}

/* The index of NAME's set, or -1. */
static long set_index(const struct lockfs_helpers *h, const char *name)
{
	size_t total = h->genuine ? h->genuine->nnames + NMULTI : 0;

	for (size_t i = 0; i < total; i++)
		if (strcmp(set_name(h, i), name) == 0)
			return (long)i;
	return -1;
}

static bool in_set(const struct genuine_set *set, const struct stat *st)
{
	for (size_t i = 0; i < set->nfound; i++)
		if (set->found[i].dev == st->st_dev && set->found[i].ino == st->st_ino)
			return true;
	for (size_t i = 0; i < set->ntrusted; i++)
		if (set->trusted[i].dev == st->st_dev && set->trusted[i].ino == st->st_ino)
			return true;
	return false;
}

/*
 * Is process P, of uid UID, running the genuine file of helper P->exe (for
 * an applet, of its multi-call binary)?  *EXE gets the file's stat.  The
 * daemon's cached files first (one stat); on a miss, the files are looked
 * up again in P's root: the daemon's (and the cache refreshed) or another
 * (a container's, a user's chroot), off the request path within a bound
 * (helper_files.c says why).  Nothing here asks a file system for fresh
 * attributes: P's executable and root may be on a FUSE file system of the
 * caller's that never answers.
 * Returns 1 (genuine), 0 (not), or -EACCES: P's root did not answer in
 * time, so nobody can say.
 */
int lockfs_helpers_genuine(const struct lockfs_proc_source *src, struct lockfs_helpers *h,
			   const struct lockfs_proc *p, uid_t uid, struct stat *exe)
{
	const char *name = p->multicall[0] ? p->multicall : p->exe;
	long i = set_index(h, name);
	struct stat root;
	int ok, rootfd;

	if (i < 0 || !src->exe_stat || src->exe_stat(src->ctx, p->pid, exe) < 0)
		return 0;
	pthread_mutex_lock(&h->mu);
	ok = in_set(&h->genuine->sets[i], exe);
	pthread_mutex_unlock(&h->mu);
	if (ok || !src->open_root)
		return ok;
	rootfd = src->open_root(src->ctx, p->pid);
	if (rootfd < 0)
		return 0;
	if (lockfs_stat_cached(rootfd, "", &root) == 0) {
		if (root.st_dev == h->genuine->root.st_dev &&
		    root.st_ino == h->genuine->root.st_ino) {
			/* Look again (an upgrade replaces the file), outside
			 * the lock: the other helpers' checks need not wait.
			 * This walks the daemon's own mount namespace, where
			 * only root mounts, whatever namespace P is in. */
			struct genuine_set fresh;
			struct genuine_set *set = &h->genuine->sets[i];

			lookup_set(h, (size_t)i, &fresh);
			pthread_mutex_lock(&h->mu);
			memcpy(set->found, fresh.found, sizeof(set->found));
			set->nfound = fresh.nfound;
			ok = in_set(set, exe);
			pthread_mutex_unlock(&h->mu);
		} else {
			ok = lockfs_helper_files_find_foreign(rootfd, &root, name, exe, uid);
			if (ok < 0)
				ok = -EACCES;
		}
	}
	close(rootfd);
	return ok;
}

void lockfs_helpers_free(struct lockfs_helpers *h)
{
	if (!h || !h->names)
		return;
	for (char **n = h->names; *n; n++)
		free(*n);
	free(h->names);
	h->names = NULL;
	if (h->genuine) {
		if (h->genuine->rootfd >= 0)
			close(h->genuine->rootfd);
		free(h->genuine->self_dir);
		free(h->genuine->sets);
		free(h->genuine);
		h->genuine = NULL;
	}
	pthread_mutex_destroy(&h->mu);
}

/* The directory of the daemon's executable, malloc'd, or NULL. */
static char *self_dir(void)
{
	char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
	char *slash;

	if (n <= 0)
		return NULL;
	path[n] = '\0';
	slash = strrchr(path, '/');
	if (!slash || strstr(path, " (deleted)"))
		return NULL;
	*slash = '\0';
	return strdup(*path ? path : "/");
}

/* Find the genuine files of every name of H (just parsed).  0 or -ENOMEM. */
static int genuine_init(struct lockfs_helpers *h, size_t count)
{
	struct lockfs_genuine *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	g->nnames = count;
	g->sets = calloc(count + NMULTI, sizeof(*g->sets));
	if (!g->sets) {
		free(g);
		return -ENOMEM;
	}
	g->rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (g->rootfd >= 0 && fstat(g->rootfd, &g->root) < 0) {
		close(g->rootfd);
		g->rootfd = -1;
	}
	g->self_dir = self_dir();
	h->genuine = g;
	for (size_t i = 0; i < count + NMULTI; i++)
		lookup_set(h, i, &g->sets[i]); /* nobody else sees H yet */
	return 0;
}

int lockfs_helpers_parse(struct lockfs_helpers *h, const char *list)
{
	memset(h, 0, sizeof(*h));
	if (!list)
		list = LOCKFS_DEFAULT_HELPERS;
	size_t count = 0;
	if (*list) {
		count = 1;
		for (const char *p = list; *p; p++)
			count += *p == ':';
	}
	char **names = calloc(count + 1, sizeof(*names));
	if (!names)
		return -ENOMEM;
	pthread_mutex_init(&h->mu, NULL);
	h->names = names;
	const char *p = list;
	for (size_t i = 0; i < count; i++) {
		const char *end = strchrnul(p, ':');
		size_t len = (size_t)(end - p);
		if (len == 0 || memchr(p, '/', len)) {
			lockfs_helpers_free(h);
			return -EINVAL;
		}
		names[i] = strndup(p, len);
		if (!names[i]) {
			lockfs_helpers_free(h);
			return -ENOMEM;
		}
		p = *end ? end + 1 : end;
	}
	if (genuine_init(h, count) < 0) {
		lockfs_helpers_free(h);
		return -ENOMEM;
	}
	return 0;
}

bool lockfs_helpers_contains(const struct lockfs_helpers *h, const char *exe)
{
	if (!h || !h->names || !exe || !*exe)
		return false;
	for (char **n = h->names; *n; n++)
		if (strcmp(*n, exe) == 0)
			return true;
	return false;
}

int lockfs_helpers_trust_file(struct lockfs_helpers *h, const char *name, dev_t dev,
			      ino_t ino)
{
	long i = set_index(h, name);
	struct genuine_set *set;
	int rc = 0;

	if (i < 0)
		return -ENOENT;
	pthread_mutex_lock(&h->mu);
	set = &h->genuine->sets[i];
	if (set->ntrusted == TRUSTED_MAX)
		rc = -ENOSPC;
	else
		set->ntrusted = lockfs_file_ids_add(set->trusted, set->ntrusted, TRUSTED_MAX, dev,
						     ino);
	pthread_mutex_unlock(&h->mu);
	return rc;
}
