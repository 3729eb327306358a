/*
 * Opening the dir store (dir_internal.h): its options, DIR checked and
 * taken (statedir.c), RENAME_NOREPLACE probed, a killed daemon's
 * leftovers swept, the fence file opened; and the kind "dir" itself.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/clock.h"
#include "dir.h"
#include "dir_internal.h"
#include "options.h"
#include "registry.h"

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
			lockfs_dir_remove_entry(dirfd, de->d_name);
	closedir(dir);
}

/* Does this filesystem do RENAME_NOREPLACE?  Without it there is no
 * indivisible acquisition, so refuse to run rather than race. */
static int probe_noreplace(int dirfd)
{
	char a[64], b[64];
	int rc = 0;

	lockfs_dir_tmp_name(a, "probe");
	lockfs_dir_tmp_name(b, "probe");
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
		lockfs_backend_say(cfg, "out of memory");
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
			int64_t stale;

			if (lockfs_backend_parse_seconds(o->value, 1, &stale) < 0) {
				lockfs_backend_say(cfg, "-o stale=%s: want a whole number of seconds > 0",
				    o->value ? o->value : "");
				free(d);
				return -EINVAL;
			}
			d->stale_s = (uint32_t)stale;
		} else {
			lockfs_backend_say(cfg, "-o %s: not an option of the dir backend", o->key);
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
		lockfs_backend_say(cfg, "backing dir %s: %s", backing, strerror(-rc));
		goto fail;
	}
	d->dev = st.st_dev;
	d->ino = st.st_ino;
	rc = probe_noreplace(d->dirfd);
	if (rc < 0) {
		lockfs_backend_say(cfg, "backing dir %s: %s", backing, rc == -EINVAL ?
		    "filesystem lacks rename(RENAME_NOREPLACE), so acquisition could not be "
		    "atomic" : strerror(-rc));
		goto fail;
	}
	sweep_leftovers(d->dirfd);
	fence_opt = fence_path(fence_opt, backing);
	rc = lockfs_fence_open(&d->fence, d->dirfd, fence_opt);
	if (rc < 0) {
		lockfs_backend_say(cfg, "cannot start the lock engine on %s: %s", backing,
		    rc == -EINVAL ? "bad helpers= list or fence file" :
		    rc == -EMLINK ? "the fence file is a symlink, a FIFO, another user's or has "
		    "other hard links (it is rewritten in place): remove it, or name another "
		    "with -o fence_file=" : strerror(-rc));
		goto fail;
	}
	d->base.ops = &lockfs_dir_ops;
	d->base.kind = &lockfs_backend_dir_kind;
	d->base.caps = LOCKFS_BE_SLOTS;
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
