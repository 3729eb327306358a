/*
 * minfs: the transport floor for the lockfs benchmark.
 *
 * A minimal in-memory low-level libfuse3 filesystem: a root directory whose
 * only children are empty directories made with mkdir(2) and removed with
 * rmdir(2).  It does no work beyond a table look-up per request, so timing
 * mkdir+rmdir through it measures what any FUSE daemon pays on this machine
 * (kernel <-> daemon round trips, thread hand-offs, dentry handling).
 *
 * It uses the same settings as lockfs so the comparison is fair:
 * entry_timeout 0, attr_timeout 0, negative lookups answered with
 * fuse_reply_err(ENOENT) (no negative caching), and the multi-threaded loop
 * (fuse_session_loop_mt with a fuse_loop_cfg_create() config,
 * max_idle_threads 10).
 *
 * Built only for tools/bench/bench.sh; not installed.
 *
 * Usage: minfs [-f] [-d] [FUSE options] MOUNTPOINT
 */

#include <fuse_lowlevel.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MINFS_MAX_DIRS 4096
#define MINFS_NAME_MAX 255

struct minfs_dir {
	char name[MINFS_NAME_MAX + 1];
	fuse_ino_t ino;
	uid_t uid;
	gid_t gid;
	struct timespec mtime;
};

/*
 * The flat directory table.  A small unsorted array scanned linearly: the
 * benchmark keeps at most a handful of entries alive at once, so a scan is
 * a few dozen nanoseconds, far below one FUSE round trip.
 */
struct minfs {
	pthread_mutex_t mu;
	struct minfs_dir dirs[MINFS_MAX_DIRS]; /* protected by mu */
	size_t ndirs;                          /* protected by mu */
	fuse_ino_t next_ino;                   /* protected by mu */
	struct timespec root_mtime;            /* protected by mu */
};

static struct minfs minfs = {
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.next_ino = FUSE_ROOT_ID + 1,
};

/* Called with minfs.mu held. Returns the entry named NAME or NULL. */
static struct minfs_dir *find_name(const char *name)
{
	for (size_t i = 0; i < minfs.ndirs; i++)
		if (strcmp(minfs.dirs[i].name, name) == 0)
			return &minfs.dirs[i];
	return NULL;
}

/* Called with minfs.mu held. Returns the entry with inode INO or NULL. */
static struct minfs_dir *find_ino(fuse_ino_t ino)
{
	for (size_t i = 0; i < minfs.ndirs; i++)
		if (minfs.dirs[i].ino == ino)
			return &minfs.dirs[i];
	return NULL;
}

/* Called with minfs.mu held. */
static void root_stat(struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = FUSE_ROOT_ID;
	st->st_mode = S_IFDIR | 01777;
	st->st_nlink = 2 + minfs.ndirs;
	st->st_mtim = minfs.root_mtime;
	st->st_ctim = minfs.root_mtime;
	st->st_atim = minfs.root_mtime;
}

static void dir_stat(const struct minfs_dir *d, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = d->ino;
	st->st_mode = S_IFDIR | 0755;
	st->st_nlink = 2;
	st->st_uid = d->uid;
	st->st_gid = d->gid;
	st->st_mtim = d->mtime;
	st->st_ctim = d->mtime;
	st->st_atim = d->mtime;
}

/* Called with minfs.mu held. Fills E for D with lockfs's timeouts (0). */
static void fill_entry(const struct minfs_dir *d, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = d->ino;
	e->attr_timeout = 0.0;
	e->entry_timeout = 0.0;
	dir_stat(d, &e->attr);
}

static void minfs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	struct minfs_dir *d;

	if (parent != FUSE_ROOT_ID)
		return (void) fuse_reply_err(req, ENOENT);
	pthread_mutex_lock(&minfs.mu);
	d = find_name(name);
	if (d)
		fill_entry(d, &e);
	pthread_mutex_unlock(&minfs.mu);
	if (!d)
		return (void) fuse_reply_err(req, ENOENT);
	fuse_reply_entry(req, &e);
}

/* Called with minfs.mu held. Returns 0, or -ENOENT for an unknown INO. */
static int stat_ino(fuse_ino_t ino, struct stat *st)
{
	struct minfs_dir *d;

	if (ino == FUSE_ROOT_ID) {
		root_stat(st);
		return 0;
	}
	d = find_ino(ino);
	if (!d)
		return -ENOENT;
	dir_stat(d, st);
	return 0;
}

static void minfs_getattr(fuse_req_t req, fuse_ino_t ino,
			     struct fuse_file_info *fi)
{
	struct stat st;
	int rc;

	(void) fi;
	pthread_mutex_lock(&minfs.mu);
	rc = stat_ino(ino, &st);
	pthread_mutex_unlock(&minfs.mu);
	if (rc < 0)
		return (void) fuse_reply_err(req, -rc);
	fuse_reply_attr(req, &st, 0.0);
}

static void minfs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
			mode_t mode)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct fuse_entry_param e;
	struct minfs_dir *d;
	int err = 0;

	(void) mode;
	if (parent != FUSE_ROOT_ID)
		return (void) fuse_reply_err(req, EPERM);
	if (strlen(name) > MINFS_NAME_MAX)
		return (void) fuse_reply_err(req, ENAMETOOLONG);

	pthread_mutex_lock(&minfs.mu);
	if (find_name(name)) {
		err = EEXIST;
	} else if (minfs.ndirs == MINFS_MAX_DIRS) {
		err = ENOSPC;
	} else {
		d = &minfs.dirs[minfs.ndirs++];
		strcpy(d->name, name);
		d->ino = minfs.next_ino++;
		d->uid = ctx->uid;
		d->gid = ctx->gid;
		clock_gettime(CLOCK_REALTIME, &d->mtime);
		minfs.root_mtime = d->mtime;
		fill_entry(d, &e);
	}
	pthread_mutex_unlock(&minfs.mu);
	if (err)
		return (void) fuse_reply_err(req, err);
	fuse_reply_entry(req, &e);
}

static void minfs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct minfs_dir *d;
	int err = 0;

	if (parent != FUSE_ROOT_ID)
		return (void) fuse_reply_err(req, ENOENT);
	pthread_mutex_lock(&minfs.mu);
	d = find_name(name);
	if (!d) {
		err = ENOENT;
	} else {
		/* Unordered table: move the last entry into the hole. */
		*d = minfs.dirs[--minfs.ndirs];
		clock_gettime(CLOCK_REALTIME, &minfs.root_mtime);
	}
	pthread_mutex_unlock(&minfs.mu);
	fuse_reply_err(req, err);
}

/*
 * Adds one entry to BUF (of SIZE bytes, USED so far). Returns the new used
 * size, or USED unchanged when the entry does not fit.
 */
static size_t add_entry(fuse_req_t req, char *buf, size_t size, size_t used,
			const char *name, fuse_ino_t ino, mode_t mode, off_t next)
{
	struct stat st;
	size_t len;

	memset(&st, 0, sizeof(st));
	st.st_ino = ino;
	st.st_mode = mode;
	len = fuse_add_direntry(req, buf + used, size - used, name, &st, next);
	if (len > size - used)
		return used;
	return used + len;
}

/*
 * Offsets: 0 -> ".", 1 -> "..", 2 + i -> table slot i.  The table is
 * unordered and compacted on rmdir, so a listing racing with rmdir may skip
 * an entry; good enough for a benchmark filesystem that is never listed
 * while it changes.
 */
static void minfs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
			  off_t off, struct fuse_file_info *fi)
{
	char *buf;
	size_t used = 0, before;

	(void) fi;
	if (ino != FUSE_ROOT_ID)
		return (void) fuse_reply_err(req, ENOTDIR);
	buf = malloc(size);
	if (!buf)
		return (void) fuse_reply_err(req, ENOMEM);

	pthread_mutex_lock(&minfs.mu);
	for (off_t i = off; i < (off_t) (2 + minfs.ndirs); i++) {
		const char *name;
		fuse_ino_t eino;

		if (i == 0) {
			name = ".";
			eino = FUSE_ROOT_ID;
		} else if (i == 1) {
			name = "..";
			eino = FUSE_ROOT_ID;
		} else {
			name = minfs.dirs[i - 2].name;
			eino = minfs.dirs[i - 2].ino;
		}
		before = used;
		used = add_entry(req, buf, size, used, name, eino, S_IFDIR,
				 i + 1);
		if (used == before)
			break;
	}
	pthread_mutex_unlock(&minfs.mu);
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static const struct fuse_lowlevel_ops minfs_ops = {
	.lookup = minfs_lookup,
	.getattr = minfs_getattr,
	.mkdir = minfs_mkdir,
	.rmdir = minfs_rmdir,
	.readdir = minfs_readdir,
};

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_session *se;
	struct fuse_cmdline_opts opts;
	struct fuse_loop_config *config;
	int ret = -1;

	clock_gettime(CLOCK_REALTIME, &minfs.root_mtime);

	if (fuse_parse_cmdline(&args, &opts) != 0)
		return 1;
	if (opts.show_help) {
		printf("usage: %s [options] <mountpoint>\n\n", argv[0]);
		fuse_cmdline_help();
		fuse_lowlevel_help();
		ret = 0;
		goto err_out1;
	} else if (opts.show_version) {
		printf("FUSE library version %s\n", fuse_pkgversion());
		fuse_lowlevel_version();
		ret = 0;
		goto err_out1;
	}

	if (opts.mountpoint == NULL) {
		printf("usage: %s [options] <mountpoint>\n", argv[0]);
		printf("       %s --help\n", argv[0]);
		ret = 1;
		goto err_out1;
	}

	se = fuse_session_new(&args, &minfs_ops, sizeof(minfs_ops), NULL);
	if (se == NULL)
		goto err_out1;

	if (fuse_set_signal_handlers(se) != 0)
		goto err_out2;

	if (fuse_session_mount(se, opts.mountpoint) != 0)
		goto err_out3;

	fuse_daemonize(opts.foreground);

	/*
	 * Same loop as lockfs: multi-threaded, max_idle_threads 10.  -s (single
	 * thread) is honoured only to explore the alternative.
	 */
	if (opts.singlethread) {
		ret = fuse_session_loop(se);
	} else {
		config = fuse_loop_cfg_create();
		if (config == NULL)
			goto err_out4;
		fuse_loop_cfg_set_clone_fd(config, opts.clone_fd);
		fuse_loop_cfg_set_idle_threads(config, 10);
		fuse_loop_cfg_set_max_threads(config, opts.max_threads);
		ret = fuse_session_loop_mt(se, config);
		fuse_loop_cfg_destroy(config);
	}

err_out4:
	fuse_session_unmount(se);
err_out3:
	fuse_remove_signal_handlers(se);
err_out2:
	fuse_session_destroy(se);
err_out1:
	free(opts.mountpoint);
	fuse_opt_free_args(&args);

	return ret ? 1 : 0;
}
