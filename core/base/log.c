/*
 * The audit log's file (include/lockfs/log.h): DIR/lock.log, its rotation
 * by size, reopening it for logrotate, the lines kept in memory while it
 * cannot be written, and the per-uid limit on `denied` lines.  The line
 * itself is core/base/log_line.c's.
 *
 * Every line the daemon writes goes out under one mutex, in one write(2)
 * on an O_APPEND descriptor: lines are whole and in order, and a rotation
 * or a reopen happens between two lines, never inside one, so nothing is
 * lost, torn or written twice.  (Other programs appending to the same file
 * -- the seed tool -- append whole lines with O_APPEND too.)
 *
 * Lock order: the engine's stripe mutex, then log->mu.  Nothing here calls
 * back into the engine.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "lockfs/log.h"

/* Distinct uids with a burst open at once; past this they share one. */
#define BURSTS_MAX 4096

struct kept_line {
	struct kept_line *next;
	size_t len;
	char text[]; /* the whole line, newline included */
};

/* One uid's refusals (lockfs_log_denied). */
struct burst {
	uid_t uid;           /* of the last refusal (the shared entry: any uid) */
	bool shared;         /* the entry of every uid past BURSTS_MAX */
	int64_t until_ms;    /* boot clock: the end of the current interval */
	uint64_t count;      /* refusals since the uid's last line, not logged */
	/* The last of them, for the count line: */
	pid_t pid;
	char who[320];
	char name[256];
	char reason[64];
	char container[128];
};

struct lockfs_log {
	pthread_mutex_t mu;    /* protects everything below but reopen_asked */
	int dirfd;             /* DIR (our own dup) */
	char *name;            /* the file's name in DIR */
	int fd;                /* the file written now: O_RDWR|O_APPEND, never -1 */
	uint64_t size;         /* its size as far as we know; re-read before rotating */
	uint64_t rotations;    /* names the rotation's new file */
	struct lockfs_log_limits lim;
	struct kept_line *kept, **kept_tail; /* FIFO of lines not yet written */
	size_t kept_bytes, nkept;
	uint64_t lost;         /* lines past LOCKFS_LOG_KEPT_MAX_BYTES: syslog only */
	bool failing;          /* the last write failed (said once on stderr) */
	bool rotate_failing;   /* the last rotation failed (said once) */
	struct burst *bursts;
	size_t nbursts, cap_bursts;
	int reopen_asked;      /* set from a signal handler: __atomic only */
	/* lockfs_log_set_waker's: set before any thread uses the log */
	void (*wake)(void *arg);
	void *wake_arg;
};

/* Something for lockfs_log_tick appeared: tell whoever runs it. */
static void wake_ticker(struct lockfs_log *log)
{
	if (log->wake)
		log->wake(log->wake_arg);
}

/*
 * Open DIR/NAME for appending: made fresh (O_EXCL) when CREATE and it is
 * missing; an existing one only when it is a regular file with no other
 * link, never through a symbolic link.  Fills *ST.  Returns the fd,
 * -ELOOP (a symlink), -EMLINK (hard links), -EINVAL (not a regular file),
 * or -errno.
 */
static int open_log_file(int dirfd, const char *name, bool create, struct stat *st)
{
	int fd = -1, err;

	if (create)
		fd = openat(dirfd, name, O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW |
			    O_CLOEXEC, 0644);
	/* O_NONBLOCK: a FIFO planted here must not hang the open. */
	if (fd < 0 && (!create || errno == EEXIST))
		fd = openat(dirfd, name, O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	if (fstat(fd, st) < 0) {
		err = -errno;
		close(fd);
		return err;
	}
	if (!S_ISREG(st->st_mode) || st->st_nlink != 1) {
		close(fd);
		return S_ISREG(st->st_mode) ? -EMLINK : -EINVAL;
	}
	return fd;
}

/* "NAME.I" into BUF. */
static void rotated_name(char buf[PATH_MAX], const char *name, unsigned i)
{
	snprintf(buf, PATH_MAX, "%s.%u", name, i);
}

/*
 * Open DIR/NAME again (logrotate moved it, or the daemon's file is no
 * longer DIR/NAME): a missing one is made fresh.  On failure the old file
 * stays in use, and we say so.  Returns 0 or -errno.  With log->mu held.
 */
static int reopen_locked(struct lockfs_log *log)
{
	struct stat st, old;
	int fd = open_log_file(log->dirfd, log->name, true, &st);

	if (fd < 0) {
		fprintf(stderr, "lockfs: warning: cannot reopen %s (%s); still writing the file "
			"opened before\n", log->name,
			fd == -ELOOP ? "it is a symbolic link" :
			fd == -EMLINK ? "it has other hard links" : strerror(-fd));
		return fd;
	}
	if (fstat(log->fd, &old) == 0 && old.st_dev == st.st_dev && old.st_ino == st.st_ino) {
		close(fd); /* still the same file: nothing moved */
		return 0;
	}
	close(log->fd);
	log->fd = fd;
	log->size = (uint64_t)st.st_size;
	return 0;
}

static void rotate_failed(struct lockfs_log *log, const char *what, int err)
{
	if (!log->rotate_failing)
		fprintf(stderr, "lockfs: warning: cannot rotate %s (%s: %s); it grows past "
			"log_max until it can\n", log->name, what, strerror(err));
	log->rotate_failing = true;
}

/*
 * Make room for N more bytes: when the file would pass max_bytes, it
 * becomes NAME.1 (NAME.1 becomes NAME.2 ..., the oldest goes) and a fresh
 * NAME takes its place.  The new file is made first and swapped in with
 * RENAME_EXCHANGE, so DIR/NAME never goes missing.  With log->mu held.
 * Returns 0 or -errno (the old file then stays in use).
 */
static int rotate_locked(struct lockfs_log *log, size_t n)
{
	char tmp[64], from[PATH_MAX], to[PATH_MAX];
	struct stat st, cur;
	int nfd, err;

	if (fstat(log->fd, &st) < 0)
		return -errno;
	log->size = (uint64_t)st.st_size; /* other writers count too */
	if (log->size == 0 || log->size + n <= log->lim.max_bytes)
		return 0;
	/* Our file was moved away (logrotate, before its SIGHUP): it is no
	 * longer ours to rotate; start the new DIR/NAME instead. */
	if (fstatat(log->dirfd, log->name, &cur, AT_SYMLINK_NOFOLLOW) < 0 ||
	    cur.st_dev != st.st_dev || cur.st_ino != st.st_ino)
		return reopen_locked(log);

	snprintf(tmp, sizeof(tmp), ".lockfs-log.%ld.%" PRIu64, (long)getpid(), ++log->rotations);
	nfd = openat(log->dirfd, tmp, O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW |
		     O_CLOEXEC, 0644);
	if (nfd < 0) {
		err = errno;
		rotate_failed(log, "new file", err);
		return -err;
	}
	for (unsigned i = log->lim.keep; i > 1; i--) {
		rotated_name(from, log->name, i - 1);
		rotated_name(to, log->name, i);
		if (renameat(log->dirfd, from, log->dirfd, to) < 0 && errno != ENOENT) {
			err = errno;
			goto fail;
		}
	}
	rotated_name(to, log->name, 1);
	if (renameat2(log->dirfd, tmp, log->dirfd, log->name, RENAME_EXCHANGE) == 0) {
		/* DIR/NAME is the new file now; TMP holds the old one. */
		if (renameat(log->dirfd, tmp, log->dirfd, to) < 0)
			fprintf(stderr, "lockfs: warning: rotating %s: the old lines stay in %s (%s)\n",
				log->name, tmp, strerror(errno));
	} else if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
		/* No exchange on this file system: move the old file aside,
		 * then the new one in (DIR/NAME is missing for a moment). */
		if (renameat(log->dirfd, log->name, log->dirfd, to) < 0 ||
		    renameat(log->dirfd, tmp, log->dirfd, log->name) < 0) {
			err = errno;
			goto fail;
		}
	} else {
		err = errno;
		goto fail;
	}
	close(log->fd);
	log->fd = nfd;
	log->size = 0;
	log->rotate_failing = false;
	return 0;
fail:
	unlinkat(log->dirfd, tmp, 0);
	close(nfd);
	rotate_failed(log, "rename", err);
	return -err;
}

/*
 * Write TEXT (N bytes, one whole line) in one write(2).  A short write is
 * completed, or, if the rest cannot be written, taken back with
 * ftruncate(2): the file never keeps part of a line.  Returns 0 or the
 * -errno of the failed write.  With log->mu held.
 */
static int write_line(struct lockfs_log *log, const char *text, size_t n)
{
	size_t done = 0;
	ssize_t w = 0;
	struct stat st;
	int err;

	while (done < n) {
		w = write(log->fd, text + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		done += (size_t)w;
	}
	if (done == n) {
		log->size += n;
		return 0;
	}
	err = w < 0 ? errno : ENOSPC;
	if (done > 0 && fstat(log->fd, &st) == 0 && (uint64_t)st.st_size >= done &&
	    ftruncate(log->fd, st.st_size - (off_t)done) < 0)
		fprintf(stderr, "lockfs: warning: %s ends in a part of a line (%s)\n",
			log->name, strerror(errno));
	return -err;
}

/* Write one line now: a reopen asked for first, then a rotation if it
 * is due (a failed one does not stop the line).  With log->mu held. */
static int put_locked(struct lockfs_log *log, const char *text, size_t n)
{
	if (__atomic_exchange_n(&log->reopen_asked, 0, __ATOMIC_ACQ_REL))
		reopen_locked(log);
	if (log->lim.max_bytes && log->size + n > log->lim.max_bytes)
		rotate_locked(log, n);
	return write_line(log, text, n);
}

/* The log cannot be written (ERR): say so once, on stderr. */
static void fail_locked(struct lockfs_log *log, int err)
{
	if (!log->failing)
		fprintf(stderr, "lockfs: warning: cannot write %s (%s): acquisitions are refused "
			"with that error; other lines are kept in memory and sent to syslog until "
			"it can be written\n", log->name, strerror(-err));
	log->failing = true;
}

/*
 * Write the kept lines, in order, then the count of lost ones.  Returns 0
 * when none is left, else the -errno that stopped it.  With log->mu held.
 */
static int flush_locked(struct lockfs_log *log)
{
	int rc;

	while (log->kept) {
		struct kept_line *k = log->kept;

		rc = put_locked(log, k->text, k->len);
		if (rc < 0)
			return rc;
		log->kept = k->next;
		if (!log->kept)
			log->kept_tail = &log->kept;
		log->kept_bytes -= k->len;
		log->nkept--;
		free(k);
	}
	if (log->lost) {
		char line[LOCKFS_LOG_LINE_MAX], count[24], uid[16], pid[16];
		const char *kv[] = { "uid", uid, "pid", pid, "count", count, NULL };
		int n;

		snprintf(count, sizeof(count), "%" PRIu64, log->lost);
		snprintf(uid, sizeof(uid), "%u", (unsigned)geteuid());
		snprintf(pid, sizeof(pid), "%d", (int)getpid());
		n = lockfs_log_format_fit(line, lockfs_wall_ms(), "lockfs", "", kv, "lost");
		rc = put_locked(log, line, (size_t)n);
		if (rc < 0)
			return rc;
		log->lost = 0;
	}
	if (log->failing)
		fprintf(stderr, "lockfs: %s can be written again; the lines kept meanwhile are "
			"in it\n", log->name);
	log->failing = false;
	return 0;
}

/* TEXT could not be written (ERR): keep it for later, in order, and send
 * it to syslog meanwhile.  With log->mu held. */
static void keep_locked(struct lockfs_log *log, const char *text, size_t n, int err)
{
	struct kept_line *k;

	fail_locked(log, err);
	syslog(LOG_DAEMON | LOG_WARNING, "%s (not written yet: %s): %.*s", log->name,
	       strerror(-err), (int)(n - 1), text);
	/* Once a line is lost, later ones are too: what is kept stays a
	 * prefix of what happened, and the `lost` line comes after it. */
	if (log->lost || log->kept_bytes + n > LOCKFS_LOG_KEPT_MAX_BYTES ||
	    !(k = malloc(sizeof(*k) + n))) {
		log->lost++;
		wake_ticker(log);
		return;
	}
	k->next = NULL;
	k->len = n;
	memcpy(k->text, text, n);
	*log->kept_tail = k;
	log->kept_tail = &k->next;
	log->kept_bytes += n;
	log->nkept++;
	wake_ticker(log); /* the tick writes it once the file takes writes */
}

/* Write TEXT after the kept lines; if that cannot be done, keep it too.
 * Returns 0 or the -errno that kept it.  With log->mu held. */
static int emit_or_keep_locked(struct lockfs_log *log, const char *text, size_t n)
{
	int rc = flush_locked(log);

	if (rc == 0)
		rc = put_locked(log, text, n);
	if (rc < 0)
		keep_locked(log, text, n, rc);
	return rc;
}

int lockfs_log_event(struct lockfs_log *log, const char *who, const char *name,
		     const char *const *kv, const char *event)
{
	char line[LOCKFS_LOG_LINE_MAX];
	int n, rc;

	if (!log)
		return -EBADF;
	n = lockfs_log_format_fit(line, lockfs_wall_ms(), who, name, kv, event);
	pthread_mutex_lock(&log->mu);
	/* The kept lines first: a line that is written is never ahead of
	 * one that happened before it. */
	rc = flush_locked(log);
	if (rc == 0)
		rc = put_locked(log, line, (size_t)n);
	if (rc < 0)
		fail_locked(log, rc);
	pthread_mutex_unlock(&log->mu);
	return rc;
}

int lockfs_log_event_or_keep(struct lockfs_log *log, const char *who, const char *name,
			     const char *const *kv, const char *event)
{
	char line[LOCKFS_LOG_LINE_MAX];
	int n, rc;

	if (!log)
		return -EBADF;
	n = lockfs_log_format_fit(line, lockfs_wall_ms(), who, name, kv, event);
	pthread_mutex_lock(&log->mu);
	rc = emit_or_keep_locked(log, line, (size_t)n);
	pthread_mutex_unlock(&log->mu);
	return rc;
}

/* Write a `denied` line (COUNT > 0: the count line of a burst).  With
 * log->mu held. */
static void denied_locked(struct lockfs_log *log, uid_t uid, pid_t pid, const char *container,
			  const char *who, const char *name, const char *reason, uint64_t count)
{
	char line[LOCKFS_LOG_LINE_MAX], u[16], p[16], c[24];
	const char *kv[11] = { "uid", u, "pid", p };
	size_t k = 4;
	int n;

	if (container && *container) {
		kv[k++] = "container";
		kv[k++] = container;
	}
	kv[k++] = "reason";
	kv[k++] = reason;
	if (count) {
		kv[k++] = "count";
		kv[k++] = c;
	}
	kv[k] = NULL;

	snprintf(u, sizeof(u), "%u", (unsigned)uid);
	if (pid > 0)
		snprintf(p, sizeof(p), "%d", (int)pid);
	else
		p[0] = '\0'; /* written as "-": unknown */
	snprintf(c, sizeof(c), "%" PRIu64, count);
	n = lockfs_log_format_fit(line, lockfs_wall_ms(), who, name, kv, "denied");
	emit_or_keep_locked(log, line, (size_t)n);
}

static void burst_note(struct burst *b, uid_t uid, pid_t pid, const char *container,
		       const char *who, const char *name, const char *reason)
{
	b->uid = uid;
	b->pid = pid;
	snprintf(b->container, sizeof(b->container), "%s", container ? container : "");
	snprintf(b->who, sizeof(b->who), "%s", who ? who : "");
	snprintf(b->name, sizeof(b->name), "%s", name ? name : "");
	snprintf(b->reason, sizeof(b->reason), "%s", reason ? reason : "");
}

static void burst_flush_locked(struct lockfs_log *log, struct burst *b)
{
	denied_locked(log, b->uid, b->pid, b->container, b->who, b->name, b->reason, b->count);
	b->count = 0;
}

/* UID's burst entry, made when missing (until_ms 0); past BURSTS_MAX
 * uids, the entry they share.  NULL when out of memory.  With log->mu
 * held. */
static struct burst *burst_get(struct lockfs_log *log, uid_t uid)
{
	struct burst *b, *shared = NULL;

	for (size_t i = 0; i < log->nbursts; i++) {
		b = &log->bursts[i];
		if (b->shared)
			shared = b;
		else if (b->uid == uid)
			return b;
	}
	if (log->nbursts >= BURSTS_MAX && shared)
		return shared;
	if (log->nbursts == log->cap_bursts) {
		size_t cap = log->cap_bursts ? log->cap_bursts * 2 : 8;

		b = realloc(log->bursts, cap * sizeof(*b));
		if (!b)
			return NULL;
		log->bursts = b;
		log->cap_bursts = cap;
	}
	b = &log->bursts[log->nbursts++];
	memset(b, 0, sizeof(*b));
	b->uid = uid;
	b->shared = log->nbursts > BURSTS_MAX;
	return b;
}

void lockfs_log_denied(struct lockfs_log *log, uid_t uid, pid_t pid, const char *who,
		       const char *name, const char *reason)
{
	lockfs_log_denied_in(log, uid, pid, NULL, who, name, reason);
}

void lockfs_log_denied_in(struct lockfs_log *log, uid_t uid, pid_t pid, const char *container,
			  const char *who, const char *name, const char *reason)
{
	int64_t now = lockfs_boot_ms();
	struct burst *b;

	if (!log)
		return;
	pthread_mutex_lock(&log->mu);
	b = log->lim.denied_interval_s ? burst_get(log, uid) : NULL;
	if (b && now < b->until_ms) {
		/* Inside the uid's interval: counted, written by the tick. */
		b->count++;
		burst_note(b, uid, pid, container, who, name, reason);
	} else if (b && b->count) {
		/* The interval ended before the tick wrote its count: the
		 * burst goes on, and this refusal opens its next interval. */
		burst_flush_locked(log, b);
		b->count = 1;
		burst_note(b, uid, pid, container, who, name, reason);
		b->until_ms = now + (int64_t)log->lim.denied_interval_s * 1000;
	} else {
		/* The first refusal of a burst: at once. */
		denied_locked(log, uid, pid, container, who, name, reason, 0);
		if (b) {
			b->until_ms = now + (int64_t)log->lim.denied_interval_s * 1000;
			wake_ticker(log); /* the tick ends the burst */
		}
	}
	pthread_mutex_unlock(&log->mu);
}

void lockfs_log_request_reopen(struct lockfs_log *log)
{
	if (!log)
		return;
	__atomic_store_n(&log->reopen_asked, 1, __ATOMIC_RELEASE);
	wake_ticker(log); /* async-signal-safe: see lockfs_log_set_waker */
}

void lockfs_log_set_waker(struct lockfs_log *log, void (*wake)(void *arg), void *arg)
{
	if (!log)
		return;
	log->wake = wake;
	log->wake_arg = arg;
}

bool lockfs_log_idle(struct lockfs_log *log)
{
	bool idle;

	if (!log)
		return true;
	pthread_mutex_lock(&log->mu);
	idle = !log->kept && !log->lost && !log->nbursts &&
	       !__atomic_load_n(&log->reopen_asked, __ATOMIC_ACQUIRE);
	pthread_mutex_unlock(&log->mu);
	return idle;
}

void lockfs_log_tick(struct lockfs_log *log)
{
	int64_t now = lockfs_boot_ms();

	if (!log)
		return;
	pthread_mutex_lock(&log->mu);
	if (__atomic_exchange_n(&log->reopen_asked, 0, __ATOMIC_ACQ_REL))
		reopen_locked(log);
	if (log->kept || log->lost)
		flush_locked(log);
	for (size_t i = 0; i < log->nbursts;) {
		struct burst *b = &log->bursts[i];

		if (now < b->until_ms) {
			i++;
		} else if (b->count) {
			/* The burst goes on: its count now, the next one at the
			 * end of the next interval. */
			burst_flush_locked(log, b);
			b->until_ms = now + (int64_t)log->lim.denied_interval_s * 1000;
			i++;
		} else {
			/* A quiet interval ends the burst. */
			*b = log->bursts[--log->nbursts];
		}
	}
	pthread_mutex_unlock(&log->mu);
}

int lockfs_log_open_ro(struct lockfs_log *log)
{
	int fd;

	if (!log)
		return -EBADF;
	pthread_mutex_lock(&log->mu);
	if (__atomic_exchange_n(&log->reopen_asked, 0, __ATOMIC_ACQ_REL))
		reopen_locked(log);
	/* A dup of the file being written, whatever its name now.  It is
	 * only ever read (pread), so its O_RDWR does not matter. */
	fd = fcntl(log->fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		fd = -errno;
	pthread_mutex_unlock(&log->mu);
	return fd;
}

int lockfs_log_open(struct lockfs_log **out, int dirfd, const char *name,
		    const struct lockfs_log_limits *limits)
{
	static const struct lockfs_log_limits defaults = {
		.max_bytes = LOCKFS_LOG_MAX_DEFAULT,
		.keep = LOCKFS_LOG_KEEP_DEFAULT,
		.denied_interval_s = LOCKFS_LOG_DENIED_INTERVAL_DEFAULT,
	};
	struct lockfs_log *log;
	struct stat st;
	int rc;

	if (!limits)
		limits = &defaults;
	if (limits->keep < 1 || limits->keep > LOCKFS_LOG_KEEP_MAX ||
	    (limits->max_bytes && limits->max_bytes < LOCKFS_LOG_MAX_MIN))
		return -EINVAL;
	log = calloc(1, sizeof(*log));
	if (!log)
		return -ENOMEM;
	log->lim = *limits;
	log->kept_tail = &log->kept;
	log->fd = -1;
	log->dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
	if (log->dirfd < 0) {
		rc = -errno;
		goto fail;
	}
	log->name = strdup(name);
	if (!log->name) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = open_log_file(log->dirfd, log->name, true, &st);
	if (rc < 0)
		goto fail;
	log->fd = rc;
	log->size = (uint64_t)st.st_size;
	pthread_mutex_init(&log->mu, NULL);
	*out = log;
	return 0;
fail:
	if (log->dirfd >= 0)
		close(log->dirfd);
	free(log->name);
	free(log);
	return rc;
}

size_t lockfs_log_close(struct lockfs_log *log)
{
	size_t left;

	if (!log)
		return 0;
	pthread_mutex_lock(&log->mu);
	/* Refusals counted but not yet written are written now. */
	for (size_t i = 0; i < log->nbursts; i++)
		if (log->bursts[i].count)
			burst_flush_locked(log, &log->bursts[i]);
	flush_locked(log);
	left = log->nkept + log->lost;
	while (log->kept) {
		struct kept_line *k = log->kept;

		log->kept = k->next;
		free(k);
	}
	pthread_mutex_unlock(&log->mu);
	pthread_mutex_destroy(&log->mu);
	free(log->bursts);
	close(log->fd);
	close(log->dirfd);
	free(log->name);
	free(log);
	return left;
}
