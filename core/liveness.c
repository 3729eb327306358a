/* Holder liveness through pidfds; see liveness.h. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lockfs/holder.h"
#include "liveness.h"

#define BUCKETS 256
/* Watches kept after their last lock is gone: a process that takes locks
 * again and again (an agent, a long shell script) then costs no pidfd or
 * epoll syscalls per acquisition. */
#define IDLE_MAX 256

struct watch {
	struct watch *next;
	uint64_t id;    /* pid << 32 | sequence: what epoll reports */
	pid_t pid;
	unsigned long long start;
	int pidfd;
	unsigned refs;  /* locks that depend on this process; 0 = idle */
	bool exited;    /* reported: waiting for the last unwatch */
};

struct lockfs_liveness {
	pthread_mutex_t mu;
	struct watch *buckets[BUCKETS]; /* protected by mu */
	int epfd;
	int wakefd;      /* eventfd: stop request */
	bool stopping;   /* protected by mu */
	size_t idle;     /* watches with refs 0; protected by mu */
	uint32_t seq;    /* protected by mu */
	bool running;
	pthread_t thread;
	lockfs_exited_fn exited;
	lockfs_tick_fn tick;
	void *arg;
	int tick_ms;
};

static int pidfd_open(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
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
	if (!w->exited)
		epoll_ctl(lv->epfd, EPOLL_CTL_DEL, w->pidfd, NULL);
	close(w->pidfd);
	free(w);
}

int lockfs_liveness_watch_fd(struct lockfs_liveness *lv, pid_t pid, unsigned long long start,
			     int fd)
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct watch **pp, *w;
	int rc;

	w = calloc(1, sizeof(*w));
	if (!w) {
		close(fd);
		return -ENOMEM;
	}
	w->pid = pid;
	w->start = start;
	w->pidfd = fd;
	w->refs = 1;

	pthread_mutex_lock(&lv->mu);
	pp = find(lv, pid, start);
	if (*pp) {
		/* Watched already (another lock, another thread, or idle):
		 * share it. */
		rc = (*pp)->exited ? -ESRCH : 0;
		if (rc == 0 && (*pp)->refs++ == 0)
			lv->idle--;
		pthread_mutex_unlock(&lv->mu);
		close(fd);
		free(w);
		return rc;
	}
	w->id = (uint64_t)(uint32_t)pid << 32 | ++lv->seq;
	ev.data.u64 = w->id;
	if (epoll_ctl(lv->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		rc = -errno;
		pthread_mutex_unlock(&lv->mu);
		close(fd);
		free(w);
		return rc;
	}
	*pp = w;
	pthread_mutex_unlock(&lv->mu);
	return 0;
}

int lockfs_liveness_watch(struct lockfs_liveness *lv, pid_t pid, unsigned long long start)
{
	unsigned long long now_start;
	int fd, rc = watch_more(lv, pid, start);

	if (rc != 0)
		return rc < 0 ? rc : 0;
	fd = pidfd_open(pid);
	if (fd < 0)
		return errno == ESRCH || errno == ENOENT ? -ESRCH : -errno;
	/* The pidfd names whatever process has PID now; it is ours only if
	 * that process started when the holder did.  Checked after opening,
	 * so a later reuse of the pid cannot slip in between. */
	rc = lockfs_proc_start_time(pid, &now_start);
	if (rc < 0 || now_start != start) {
		close(fd);
		return rc < 0 && rc != -ENOENT ? rc : -ESRCH;
	}
	return lockfs_liveness_watch_fd(lv, pid, start, fd);
}

void lockfs_liveness_unwatch(struct lockfs_liveness *lv, pid_t pid, unsigned long long start)
{
	struct watch **pp, *w;

	pthread_mutex_lock(&lv->mu);
	pp = find(lv, pid, start);
	w = *pp;
	if (w && w->refs > 0 && --w->refs == 0) {
		if (w->exited || lv->idle >= IDLE_MAX)
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
	pfd.fd = *pp && !(*pp)->exited ? (*pp)->pidfd : -1;
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
	fd = *pp ? fcntl((*pp)->pidfd, F_DUPFD_CLOEXEC, 0) : -1;
	pthread_mutex_unlock(&lv->mu);
	if (fd < 0) {
		fd = pidfd_open(pid);
		if (fd < 0)
			return -ESRCH;
		rc = lockfs_proc_start_time(pid, &now_start);
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

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *liveness_thread(void *arg)
{
	struct lockfs_liveness *lv = arg;
	int64_t next_tick = mono_ms() + lv->tick_ms;

	for (;;) {
		struct epoll_event evs[32];
		int64_t wait = next_tick - mono_ms();
		int n = epoll_wait(lv->epfd, evs, 32, wait < 0 ? 0 : (int)wait);

		if (n < 0 && errno != EINTR)
			break;
		for (int i = 0; i < n; i++) {
			uint64_t id = evs[i].data.u64;
			struct watch **pp, *w;
			pid_t pid;
			unsigned long long start;

			if (!id) {
				bool stop;

				pthread_mutex_lock(&lv->mu);
				stop = lv->stopping;
				pthread_mutex_unlock(&lv->mu);
				if (stop)
					return NULL;
				continue;
			}
			/* Found by id under the mutex: an unwatch may have freed
			 * the watch since epoll_wait() returned. */
			pthread_mutex_lock(&lv->mu);
			pp = &lv->buckets[(unsigned)(id >> 32) % BUCKETS];
			while (*pp && (*pp)->id != id)
				pp = &(*pp)->next;
			w = *pp;
			if (!w || w->exited) {
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
		if (mono_ms() >= next_tick) {
			if (lv->tick)
				lv->tick(lv->arg);
			next_tick = mono_ms() + lv->tick_ms;
		}
	}
	return NULL;
}

int lockfs_liveness_run(struct lockfs_liveness *lv)
{
	int rc = pthread_create(&lv->thread, NULL, liveness_thread, lv);

	if (rc)
		return -rc;
	lv->running = true;
	return 0;
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
			close(w->pidfd);
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
