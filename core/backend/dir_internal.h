/*
 * The dir store's files, for one another (not for the rest of lockfs,
 * which sees only dir.h and lockfs/backend.h).  The store's overview is
 * at the top of dir.c.  Calls point down this list, never up:
 *
 *   dir_open.c    opening: options, DIR taken, probe, sweep, fence file
 *   dir.c         the store's ops (lockfs_dir_ops)
 *   dir_watch.c   reporting changes: inotify on DIR, own rewrites
 *   dir_files.c   entries, records and identities: safe creation,
 *                 replacement and reuse of files in DIR
 *   dir_health.c  is DIR there, and saying what is wrong with it
 */
#ifndef LOCKFS_BACKEND_DIR_INTERNAL_H
#define LOCKFS_BACKEND_DIR_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "lockfs/backend.h"
#include "fence.h"
#include "statedir.h"

#define RECORD_FILE "owner.json"
#define TMP_PREFIX ".lockfs-"
#define LOCK_SUFFIX ".lock"

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
	int inotify_fd;           /* -1: none, poll every POLL_MS (dir_watch.c) */
	int own_pipe[2];
	int stop_fd;              /* eventfd: close() wants the thread gone */
	lockfs_change_fn change;
	void *change_arg;
};

static inline struct dir_store *to_dir(struct lockfs_backend *be)
{
	return (struct dir_store *)be;
}

/* Was DIR removed or replaced (lockfs_dir_vanish)?  Sticky. */
static inline bool lockfs_dir_has_vanished(struct dir_store *d)
{
	return __atomic_load_n(&d->vanished, __ATOMIC_ACQUIRE);
}

/* Does IDENTITY (lockfs_dir_stat_identity) name a lock with a record
 * file, rather than a foreign one? */
static inline bool lockfs_dir_identity_is_record(uint64_t identity)
{
	return identity >> 63;
}

/* ---- dir.c ---- */

extern const struct lockfs_backend_ops lockfs_dir_ops;

/* ---- dir_watch.c ---- */

/* The ops' start: run the reporting thread.  0 or -errno. */
int lockfs_dir_start(struct lockfs_backend *be, lockfs_change_fn fn, void *arg);
/* Stop the reporting thread, if it runs, and close what it used. */
void lockfs_dir_watch_stop(struct dir_store *d);
/* This daemon rewrote NAME's record: tell the reporting thread. */
void lockfs_dir_report_own(struct dir_store *d, const char *name);

/* ---- dir_files.c (each says what it returns where it is defined) ---- */

int lockfs_dir_lock_path(char buf[NAME_MAX + 1], const char *name);
bool lockfs_dir_lock_entry(const char *entry, char name[NAME_MAX + 1]);
bool lockfs_dir_is_tmp(const char *entry);
void lockfs_dir_tmp_name(char buf[64], const char *kind);
uint64_t lockfs_dir_stat_identity(const struct stat *st);
void lockfs_dir_fill_stat(struct lockfs_entry_stat *out, const struct stat *st);
int lockfs_dir_stat_lock(int dirfd, const char *lock, struct stat *st);
int lockfs_dir_check_identity(struct dir_store *d, const char *lock, uint64_t identity,
			      struct stat *st);
void lockfs_dir_remove_entry(int dirfd, const char *entry);
int lockfs_dir_write_record(int dirfd, const char *dirpath, const char *file,
			    const char *record, size_t len, struct stat *st);
int lockfs_dir_reuse_dir(struct dir_store *d, const char *tmp, const char *record,
			 size_t len, struct stat *st);
int lockfs_dir_replace_record(struct dir_store *d, const char *lock, const char *json,
			      size_t len, struct stat *st);
int lockfs_dir_open_record(int dirfd, const char *lock, const char *file);

/* ---- dir_health.c ---- */

bool lockfs_dir_is_there(struct dir_store *d, bool at_path);
int lockfs_dir_vanish(struct dir_store *d);
int lockfs_dir_say_failed(struct dir_store *d, enum store_work work, int err);
void lockfs_dir_say_works(struct dir_store *d, enum store_work work);
int lockfs_dir_not_held(struct dir_store *d);

#endif
