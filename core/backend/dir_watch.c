/*
 * Reporting the dir store's changes (dir_internal.h): a thread that reads
 * DIR's inotify events and this daemon's own record rewrites, and hands
 * them to the engine's callback one at a time.  Without inotify it says
 * "anything may have changed" every POLL_MS.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "dir_internal.h"

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

/* Tell the reporting thread that this daemon changed NAME's record inside
 * NAME.lock, where DIR's watch does not look.  Never blocks: a full pipe
 * turns into one CHANGE_ALL. */
void lockfs_dir_report_own(struct dir_store *d, const char *name)
{
	char frame[FRAME] = { 0 };

	if (!__atomic_load_n(&d->reporting, __ATOMIC_ACQUIRE))
		return;
	snprintf(frame, sizeof(frame), "%s", name);
	if (write(d->own_pipe[1], frame, FRAME) != FRAME)
		__atomic_store_n(&d->own_overflow, true, __ATOMIC_RELEASE);
}

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
		lock = lockfs_dir_lock_entry(ev->name, name);
		if ((ev->mask & IN_MOVED_TO) && mf->pending && mf->cookie == ev->cookie) {
			/* The second half of one rename. */
			if (mf->own && lock)          /* .lockfs-X -> NAME.lock: take */
				d->change(d->change_arg, LOCKFS_CHANGE_OWN, name);
			else if (!mf->own && lockfs_dir_is_tmp(ev->name)) /* NAME.lock -> .lockfs-X */
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
		if ((ev->mask & IN_MOVED_FROM) && (lock || lockfs_dir_is_tmp(ev->name))) {
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

int lockfs_dir_start(struct lockfs_backend *be, lockfs_change_fn fn, void *arg)
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

void lockfs_dir_watch_stop(struct dir_store *d)
{
	uint64_t one = 1;

	if (!__atomic_exchange_n(&d->reporting, false, __ATOMIC_ACQ_REL))
		return;
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
