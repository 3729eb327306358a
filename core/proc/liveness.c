/* Holder liveness through pidfds; see liveness.h. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lockfs/proc.h"
#include "base/clock.h"
#include "liveness.h"

#define BUCKETS 256
/* Watches kept after their last lock is gone: a process that takes locks
 * again and again (an agent, a long shell script) then costs no pidfd or
 * epoll syscalls per acquisition. */
#define IDLE_MAX 256
/* Polled watches looked at per tick (each costs a /proc read, or a
 * pidfd_open when descriptors are back): with more, each is looked at
 * every few ticks. */
#define POLL_BATCH 256
/* Events taken per epoll_wait(), and rounds of them taken before the
 * queued work goes on. */
#define EVENTS_MAX 32
#define DRAIN_ROUNDS 64

struct watch {
	struct watch *next;
	uint64_t id;    /* pid << 32 | sequence: what epoll reports */
	pid_t pid;
	unsigned long long start;
	int pidfd;      /* -1 while polled */
	unsigned refs;  /* locks that depend on this process; 0 = idle */
	bool exited;    /* reported: waiting for the last unwatch */
	/* No pidfd could be had (no descriptors, no memory): the process is
	 * looked at by pid and start time on the tick instead, and given a
	 * pidfd as soon as one can be had.  In lv->polled. */
	bool polled;
	struct watch *poll_next, *poll_prev;
};

struct lockfs_liveness {
	pthread_mutex_t mu;
	struct watch *buckets[BUCKETS]; /* protected by mu */
	struct watch *polled;            /* protected by mu: polled watches, oldest look first */
	struct watch *polled_tail;       /* protected by mu */
	int epfd;
	int wakefd;      /* eventfd: stop request, or a kick */
	bool stopping;   /* protected by mu */
	size_t idle;     /* watches with refs 0; protected by mu */
	uint32_t seq;    /* protected by mu */
	bool running;
	pthread_t thread;
	lockfs_exited_fn exited;
	lockfs_tick_fn tick;
	lockfs_work_fn work;
	struct lockfs_fds *fds; /* may be NULL: no limit */
	void *arg;
	int tick_ms;
	/* Set by the thread before each tick looks, cleared by the first
	 * lockfs_liveness_wake() after it (which then kicks): a change made
	 * after the tick looked always wakes the thread, and only the first
	 * wake pays for the eventfd write.  Atomic. */
	int ticks_idle;
};

static int pidfd_open(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* A pidfd on PID, counted as a kept descriptor.  Returns it, or -ESRCH /
 * -ENOENT (no such process), -EMFILE (the daemon may keep no more), -errno. */
static int watched_fd_open(struct lockfs_liveness *lv, pid_t pid)
{
	int fd, err;

	if (lv->fds && !lockfs_fds_take(lv->fds, LOCKFS_FD_PRIVILEGED))
		return -EMFILE;
	fd = pidfd_open(pid);
	if (fd >= 0)
		return fd;
	err = errno;
	if (lv->fds)
		lockfs_fds_give(lv->fds);
	return -err;
}

static void watched_fd_close(struct lockfs_liveness *lv, int fd)
{
	close(fd);
	if (lv->fds)
		lockfs_fds_give(lv->fds);
}

/*
 * Is (PID, START) alive, by /proc/PID/stat alone?  1: yes; 0: gone (no
 * such process, another start time, a thread, or a zombie -- a pidfd
 * fires at exit, not at reaping, and so does this); -errno: cannot tell
 * (no descriptor to read /proc with).
 */
static int proc_alive(pid_t pid, unsigned long long start)
{
	struct lockfs_proc_stat st;
	int rc = lockfs_procfs_stat(pid, 0, &st);

	if (rc == -ENOENT)
		return 0;
	if (rc < 0)
		return rc;
	/* A zombie is gone; so is another process on the pid, and a thread
	 * (exit signal -1), which is no process of ours. */
	if (st.state == 'Z' || st.state == 'X' || st.state == 'x' || st.start_time != start ||
	    !st.leader)
		return 0;
	return 1;
}

/* Called with lv->mu held. */
static struct watch **find(struct lockfs_liveness *lv, pid_t pid, unsigned long long start)
{
	struct watch **pp = &lv->buckets[(unsigned)pid % BUCKETS];

	for (; *pp; pp = &(*pp)->next)
		if ((*pp)->pid == pid && (*pp)->start == start)
			return pp;
	return pp;
}

/* Called with lv->mu held. */
static void polled_add(struct lockfs_liveness *lv, struct watch *w)
{
	w->polled = true;
	w->poll_next = NULL;
	w->poll_prev = lv->polled_tail;
	if (lv->polled_tail)
		lv->polled_tail->poll_next = w;
	else
		lv->polled = w;
	lv->polled_tail = w;
}

/* Called with lv->mu held. */
static void polled_del(struct lockfs_liveness *lv, struct watch *w)
{
	if (!w->polled)
		return;
	if (w->poll_prev)
		w->poll_prev->poll_next = w->poll_next;
	else
		lv->polled = w->poll_next;
	if (w->poll_next)
		w->poll_next->poll_prev = w->poll_prev;
	else
		lv->polled_tail = w->poll_prev;
	w->polled = false;
	w->poll_next = w->poll_prev = NULL;
}

int lockfs_liveness_new(struct lockfs_liveness **out, lockfs_exited_fn exited,
			lockfs_tick_fn tick, void *arg, int tick_ms)
{
	struct lockfs_liveness *lv = calloc(1, sizeof(*lv));
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0 };
	int rc;

	if (!lv)
		return -ENOMEM;
	pthread_mutex_init(&lv->mu, NULL);
	lv->wakefd = -1;
	lv->epfd = epoll_create1(EPOLL_CLOEXEC);
	lv->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (lv->epfd < 0 || lv->wakefd < 0 ||
	    epoll_ctl(lv->epfd, EPOLL_CTL_ADD, lv->wakefd, &ev) < 0) {
		rc = -errno;
		lockfs_liveness_free(lv);
		return rc;
	}
	lv->exited = exited;
	lv->tick = tick;
	lv->arg = arg;
	lv->tick_ms = tick_ms;
	*out = lv;
	return 0;
}

void lockfs_liveness_set_fds(struct lockfs_liveness *lv, struct lockfs_fds *fds)
{
	lv->fds = fds;
}

void lockfs_liveness_set_work(struct lockfs_liveness *lv, lockfs_work_fn work)
{
	lv->work = work;
}

/* Count one more watch of (PID, START) if it is watched already.
 * Returns 1 (counted), 0 (not watched), or -ESRCH (known dead). */
static int watch_more(struct lockfs_liveness *lv, pid_t pid, unsigned long long start)
{
	struct watch **pp;
	int rc = 0;

	pthread_mutex_lock(&lv->mu);
	pp = find(lv, pid, start);
	if (*pp) {
		if ((*pp)->exited) {
			rc = -ESRCH;
		} else {
			if ((*pp)->refs++ == 0)
				lv->idle--;
			rc = 1;
		}
	}
	pthread_mutex_unlock(&lv->mu);
	return rc;
}

/* Unlink and free *PP.  Called with lv->mu held. */
static void watch_drop(struct lockfs_liveness *lv, struct watch **pp)
{
	struct watch *w = *pp;

	*pp = w->next;
	if (w->refs == 0 && lv->idle > 0)
		lv->idle--;
	polled_del(lv, w);
	if (w->pidfd >= 0) {
		if (!w->exited)
			epoll_ctl(lv->epfd, EPOLL_CTL_DEL, w->pidfd, NULL);
		watched_fd_close(lv, w->pidfd);
	}
	free(w);
}

/* Give W (not polled) the pidfd FD (counted), watched through epoll.
 * Returns 0, or -errno with FD still the caller's.  With lv->mu held. */
static int watch_attach(struct lockfs_liveness *lv, struct watch *w, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = w->id };

	if (epoll_ctl(lv->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		return -errno;
	w->pidfd = fd;
	return 0;
}

/*
 * Watch (PID, START) for one lock, through FD (a counted pidfd, taken
 * over) or, when FD is -1, by polling.  Returns 0 or -ESRCH (known dead).
 */
static int watch_add(struct lockfs_liveness *lv, pid_t pid, unsigned long long start, int fd)
{
	struct watch **pp, *w;
	int rc;

	w = calloc(1, sizeof(*w));
	pthread_mutex_lock(&lv->mu);
	pp = find(lv, pid, start);
	if (*pp || !w) {
		/* Watched already (another lock, another thread, or idle):
		 * share it. */
		rc = !*pp ? -ENOMEM : (*pp)->exited ? -ESRCH : 0;
		if (rc == 0 && (*pp)->refs++ == 0)
			lv->idle--;
		pthread_mutex_unlock(&lv->mu);
		if (fd >= 0)
			watched_fd_close(lv, fd);
		free(w);
		return rc;
	}
	w->pid = pid;
	w->start = start;
	w->pidfd = -1;
	w->refs = 1;
	w->id = (uint64_t)(uint32_t)pid << 32 | ++lv->seq;
	if (fd >= 0 && watch_attach(lv, w, fd) < 0) {
		watched_fd_close(lv, fd);
		fd = -1;
	}
	if (fd < 0)
		polled_add(lv, w);
	*pp = w;
	pthread_mutex_unlock(&lv->mu);
	return 0;
}

int lockfs_liveness_watch_fd(struct lockfs_liveness *lv, pid_t pid, unsigned long long start,
			     int fd)
{
	/* Counted from here on; past what the daemon may keep, the process
	 * is polled instead. */
	if (lv->fds && !lockfs_fds_take(lv->fds, LOCKFS_FD_PRIVILEGED)) {
		close(fd);
		fd = -1;
	}
	return watch_add(lv, pid, start, fd);
}

int lockfs_liveness_watch(struct lockfs_liveness *lv, pid_t pid, unsigned long long start)
{
	unsigned long long now_start;
	int fd, rc = watch_more(lv, pid, start);

	if (rc != 0)
		return rc < 0 ? rc : 0;
	fd = watched_fd_open(lv, pid);
	if (fd == -ESRCH || fd == -ENOENT)
		return -ESRCH;
	if (fd >= 0) {
		/* The pidfd names whatever process has PID now; it is ours
		 * only if that process started when the holder did.  Checked
		 * after opening, so a later reuse of the pid cannot slip in
		 * between. */
		rc = lockfs_procfs_start_time(pid, &now_start);
		if (rc == 0 && now_start == start)
			return watch_add(lv, pid, start, fd);
		watched_fd_close(lv, fd);
		if (rc == 0 || rc == -ENOENT)
			return -ESRCH;
		/* Cannot tell (no descriptor for /proc): poll, which tells
		 * once it can. */
	} else if (proc_alive(pid, start) == 0) {
		return -ESRCH;
	}
	/* No pidfd right now: never forget the holder, poll it. */
	return watch_add(lv, pid, start, -1);
}

void lockfs_liveness_unwatch(struct lockfs_liveness *lv, pid_t pid, unsigned long long start)
{
	struct watch **pp, *w;

	pthread_mutex_lock(&lv->mu);
	pp = find(lv, pid, start);
	w = *pp;
	if (w && w->refs > 0 && --w->refs == 0) {
		/* Idle watches keep a descriptor for nobody: none when
		 * descriptors run short. */
		if (w->exited || w->polled || lv->idle >= IDLE_MAX ||
		    (lv->fds && lockfs_fds_left(lv->fds) < 2 * IDLE_MAX))
			watch_drop(lv, pp);
		else
			lv->idle++; /* keep it for this process's next lock */
	}
	pthread_mutex_unlock(&lv->mu);
}

bool lockfs_liveness_watches_pid(struct lockfs_liveness *lv, pid_t pid)
{
	bool found = false;

	pthread_mutex_lock(&lv->mu);
	for (struct watch *w = lv->buckets[(unsigned)pid % BUCKETS]; w && !found; w = w->next)
		found = w->pid == pid && !w->exited;
	pthread_mutex_unlock(&lv->mu);
	return found;
}

bool lockfs_liveness_alive(struct lockfs_liveness *lv, pid_t pid, unsigned long long start)
{
	struct pollfd pfd = { .events = POLLIN };
	struct watch **pp;

	pthread_mutex_lock(&lv->mu);
	pp = find(lv, pid, start);
	pfd.fd = *pp && !(*pp)->exited ? (*pp)->pidfd : -1; /* -1: polled, unknown */
	/* poll() under the mutex keeps the pidfd from being closed under us;
	 * a zero timeout never blocks. */
	if (pfd.fd >= 0 && poll(&pfd, 1, 0) < 0)
		pfd.revents = POLLIN;
	pthread_mutex_unlock(&lv->mu);
	return pfd.fd >= 0 && !(pfd.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL));
}

int lockfs_liveness_signal(struct lockfs_liveness *lv, pid_t pid, unsigned long long start, int sig)
{
	struct watch **pp;
	unsigned long long now_start;
	int fd, rc;

	pthread_mutex_lock(&lv->mu);
	pp = find(lv, pid, start);
	fd = *pp && (*pp)->pidfd >= 0 ? fcntl((*pp)->pidfd, F_DUPFD_CLOEXEC, 0) : -1;
	pthread_mutex_unlock(&lv->mu);
	if (fd < 0) {
		fd = pidfd_open(pid);
		if (fd < 0)
			return -ESRCH;
		rc = lockfs_procfs_start_time(pid, &now_start);
		if (rc < 0 || now_start != start) {
			close(fd);
			return -ESRCH;
		}
	}
	rc = (int)syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
	rc = rc < 0 ? -errno : 0;
	close(fd);
	return rc;
}

/* A polled process to look at, copied out from under the mutex. */
struct poll_look {
	pid_t pid;
	unsigned long long start;
	int fd;     /* a pidfd to give it (counted), or -1 */
	bool gone;
};

/*
 * Look at up to POLL_BATCH polled processes: give each a pidfd if one can
 * be had now, else read /proc.  Report the ones that are gone.  Looked at
 * oldest first, and moved to the back: every one gets its turn.
 */
static void poll_watches(struct lockfs_liveness *lv)
{
	struct poll_look look[POLL_BATCH];
	size_t n = 0;

	pthread_mutex_lock(&lv->mu);
	for (struct watch *w = lv->polled; w && n < POLL_BATCH; w = w->poll_next)
		look[n++] = (struct poll_look){ .pid = w->pid, .start = w->start, .fd = -1 };
	for (size_t i = 0; i < n && lv->polled; i++) {
		struct watch *w = lv->polled;

		polled_del(lv, w);
		polled_add(lv, w);
	}
	pthread_mutex_unlock(&lv->mu);

	for (size_t i = 0; i < n; i++) {
		struct poll_look *l = &look[i];
		unsigned long long now_start;
		int rc, fd = watched_fd_open(lv, l->pid);

		if (fd == -ESRCH || fd == -ENOENT) {
			l->gone = true;
		} else if (fd >= 0) {
			/* As in lockfs_liveness_watch: checked after opening. */
			rc = lockfs_procfs_start_time(l->pid, &now_start);
			if (rc == 0 && now_start == l->start) {
				l->fd = fd;
			} else {
				watched_fd_close(lv, fd);
				l->gone = rc == 0 || rc == -ENOENT;
			}
		} else {
			l->gone = proc_alive(l->pid, l->start) == 0;
		}
	}

	for (size_t i = 0; i < n; i++) {
		struct poll_look *l = &look[i];
		struct watch **pp, *w;
		bool report = false;

		pthread_mutex_lock(&lv->mu);
		pp = find(lv, l->pid, l->start);
		w = *pp;
		if (w && w->polled && !w->exited) {
			if (w->refs == 0) {
				watch_drop(lv, pp); /* idle: nobody waits for it */
			} else if (l->fd >= 0) {
				polled_del(lv, w);
				if (watch_attach(lv, w, l->fd) == 0)
					l->fd = -1;
				else
					polled_add(lv, w);
			} else if (l->gone) {
				polled_del(lv, w);
				w->exited = true;
				report = true;
			}
		}
		pthread_mutex_unlock(&lv->mu);
		if (l->fd >= 0)
			watched_fd_close(lv, l->fd);
		if (report)
			lv->exited(lv->arg, l->pid, l->start);
	}
}

/* Poll watches exist: the tick must go on looking at them. */
static bool polling(struct lockfs_liveness *lv)
{
	bool any;

	pthread_mutex_lock(&lv->mu);
	any = lv->polled != NULL;
	pthread_mutex_unlock(&lv->mu);
	return any;
}

static void *liveness_thread(void *arg)
{
	struct lockfs_liveness *lv = arg;
	/* Ticks are the engine's time (core/base/clock.c, which a test may
	 * replace): epoll_wait() sleeps for what is left of a tick by that
	 * clock, and a tick runs once that clock says so.  INT64_MAX: the
	 * last tick found nothing to tick for; sleep until a wake. */
	int64_t next_tick = lockfs_boot_ms() + lv->tick_ms;
	bool more = false;
	int rounds = 0, idle_ticks = 0;

	for (;;) {
		struct epoll_event evs[EVENTS_MAX];
		int64_t wait = more || rounds ? 0 : next_tick - lockfs_boot_ms();
		int n = epoll_wait(lv->epfd, evs, EVENTS_MAX,
				   next_tick == INT64_MAX && !more && !rounds ? -1
				   : wait < 0 ? 0 : wait > INT32_MAX ? INT32_MAX : (int)wait);

		if (n < 0 && errno != EINTR)
			break;
		for (int i = 0; i < n; i++) {
			uint64_t id = evs[i].data.u64;
			struct watch **pp, *w;
			pid_t pid;
			unsigned long long start;

			if (!id) {
				uint64_t count;
				bool stop;

				/* A stop request, a kick (lockfs_liveness_kick)
				 * or a wake: the work callback below runs either
				 * way, and a sleeping tick looks again. */
				if (read(lv->wakefd, &count, sizeof(count)) < 0) {
					/* EAGAIN: another round took it */
				}
				pthread_mutex_lock(&lv->mu);
				stop = lv->stopping;
				pthread_mutex_unlock(&lv->mu);
				if (stop)
					return NULL;
				if (next_tick == INT64_MAX) {
					next_tick = lockfs_boot_ms();
					idle_ticks = 0;
				}
				continue;
			}
			/* Found by id under the mutex: an unwatch may have freed
			 * the watch since epoll_wait() returned. */
			pthread_mutex_lock(&lv->mu);
			pp = &lv->buckets[(unsigned)(id >> 32) % BUCKETS];
			while (*pp && (*pp)->id != id)
				pp = &(*pp)->next;
			w = *pp;
			if (!w || w->exited || w->pidfd < 0) {
				pthread_mutex_unlock(&lv->mu);
				continue;
			}
			if (w->refs == 0) {
				/* Idle: no lock depends on it; just forget it. */
				watch_drop(lv, pp);
				pthread_mutex_unlock(&lv->mu);
				continue;
			}
			/* The watch stays (with its refs) until the engine has
			 * dropped every lock of this process; it just stops
			 * reporting. */
			epoll_ctl(lv->epfd, EPOLL_CTL_DEL, w->pidfd, NULL);
			w->exited = true;
			pid = w->pid;
			start = w->start;
			pthread_mutex_unlock(&lv->mu);
			lv->exited(lv->arg, pid, start);
		}
		/* Every death that is ready is noted before any work: a death
		 * behind hundreds of others' (a process group killed at once)
		 * must not wait for their recoveries.  Noting one is cheap. */
		if (n == EVENTS_MAX && ++rounds < DRAIN_ROUNDS)
			continue;
		rounds = 0;
		if (lockfs_boot_ms() >= next_tick) {
			bool again;

			/* Armed before anything is looked at: whatever changes
			 * after its look wakes the thread (lockfs_liveness_wake). */
			__atomic_store_n(&lv->ticks_idle, 1, __ATOMIC_SEQ_CST);
			poll_watches(lv);
			again = lv->tick ? lv->tick(lv->arg) : false;
			again = again || polling(lv);
			idle_ticks = again ? 0 : idle_ticks + 1;
			again = again || idle_ticks < LOCKFS_LIVENESS_IDLE_TICKS;
			if (again)
				__atomic_store_n(&lv->ticks_idle, 0, __ATOMIC_SEQ_CST);
			next_tick = again ? lockfs_boot_ms() + lv->tick_ms : INT64_MAX;
		}
		/* A bounded slice of queued work; while some is left, the
		 * next round only looks for events and comes straight back. */
		more = lv->work && lv->work(lv->arg);
	}
	return NULL;
}

int lockfs_liveness_run(struct lockfs_liveness *lv)
{
	int rc = pthread_create(&lv->thread, NULL, liveness_thread, lv);

	if (rc)
		return -rc;
	pthread_setname_np(lv->thread, "lockfs-liveness");
	lv->running = true;
	return 0;
}

void lockfs_liveness_kick(struct lockfs_liveness *lv)
{
	uint64_t one = 1;

	if (write(lv->wakefd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is full, so a wake-up is pending anyway */
	}
}

void lockfs_liveness_wake(struct lockfs_liveness *lv)
{
	if (lv && __atomic_load_n(&lv->ticks_idle, __ATOMIC_SEQ_CST) &&
	    __atomic_exchange_n(&lv->ticks_idle, 0, __ATOMIC_SEQ_CST))
		lockfs_liveness_kick(lv);
}

void lockfs_liveness_stop(struct lockfs_liveness *lv)
{
	uint64_t one = 1;

	if (!lv || !lv->running)
		return;
	pthread_mutex_lock(&lv->mu);
	lv->stopping = true;
	pthread_mutex_unlock(&lv->mu);
	if (write(lv->wakefd, &one, sizeof(one)) < 0) {
		/* cannot happen with a fresh eventfd; join anyway */
	}
	pthread_join(lv->thread, NULL);
	lv->running = false;
}

void lockfs_liveness_free(struct lockfs_liveness *lv)
{
	if (!lv)
		return;
	lockfs_liveness_stop(lv);
	for (int i = 0; i < BUCKETS; i++) {
		while (lv->buckets[i]) {
			struct watch *w = lv->buckets[i];

			lv->buckets[i] = w->next;
			if (w->pidfd >= 0)
				watched_fd_close(lv, w->pidfd);
			free(w);
		}
	}
	if (lv->epfd >= 0)
		close(lv->epfd);
	if (lv->wakefd >= 0)
		close(lv->wakefd);
	pthread_mutex_destroy(&lv->mu);
	free(lv);
}
