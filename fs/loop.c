/*
 * The request loop: one hot reader, more threads only when a request
 * takes long.
 *
 * libfuse 3.14's multi-threaded loop keeps several threads waiting in
 * read(/dev/fuse), and the kernel hands each request to the one that has
 * waited longest, so the requests of one client (LOOKUP, MKDIR, LOOKUP,
 * RMDIR) go to a different thread each, every one on a cold cache: the
 * single-threaded loop used 15-17 % less CPU per mkdir+rmdir pair
 * (docs/performance.md, issue 10).  But one thread alone would stall the
 * mount behind one slow request (a /proc read of a stuck process, a slow
 * store).
 *
 * Here one thread at a time holds the reader's role: it reads a request,
 * processes it and reads the next, staying hot.  The others wait in user
 * space, the most recently used on top.  A watchdog looks every
 * HANDOFF_US while requests come: when the reader has been processing
 * the same request since its last look, the role passes to a waiting
 * thread (or a new one, up to the maximum), which reads the next request
 * meanwhile; the slow thread then waits its turn.  So a request waits
 * behind a slow one for at most about two HANDOFF_US, and nothing waits
 * for ever while a thread is left.  When no request came for IDLE_TICKS
 * looks the watchdog sleeps until the next one (an idle daemon wakes for
 * nothing).
 *
 * Ending: as libfuse's loop.  The calling thread waits on a semaphore,
 * which a signal interrupts (fs/stop.c kicks it); an unmount or a read
 * error ends the reader, which posts it.  The threads that take requests
 * block every signal, and one that waits in read() is cancelled (the
 * only point where cancelling is enabled, as in libfuse).
 */
#include <errno.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "connstate.h"
#include "loop.h"

#define HANDOFF_US 1000
#define IDLE_TICKS 200
#define DEFAULT_THREADS 10

struct loop;

struct worker {
	struct loop *loop;
	pthread_t thread;
	pthread_cond_t turn;     /* signalled when given the reader's role */
	struct worker *next;     /* on the waiting stack; protected by loop->mu */
	bool waiting;            /* on the stack; protected by loop->mu */
	struct fuse_buf buf;     /* this thread's own */
	/* Written by the thread itself, read by the watchdog (atomics). */
	uint64_t taken;          /* requests read */
	int processing;          /* between a read and the end of its processing */
};

struct loop {
	struct fuse_session *se;
	pthread_mutex_t mu;
	/* Protected by mu: */
	struct worker *reader;   /* holds the role (reading or processing) */
	struct worker *waiting;  /* threads without the role, latest first */
	struct worker **all;     /* every thread started, for the end */
	unsigned nall, max;
	bool exit;
	int error;               /* the read error that ended the loop */
	pthread_cond_t wd_wake;  /* the watchdog's, when it sleeps */
	/* Set by the watchdog under mu, read by the reader without it. */
	int wd_asleep;
	sem_t finish;
};

static void *worker_main(void *arg);

/* Start one more thread (with every signal blocked).  Under L->mu.
 * Returns it, or NULL at the maximum or when it cannot be started. */
static struct worker *worker_start(struct loop *l)
{
	struct worker *w, **all;
	sigset_t all_sigs, old;
	int rc;

	if (l->nall >= l->max)
		return NULL;
	all = realloc(l->all, (l->nall + 1) * sizeof(*all));
	if (!all)
		return NULL;
	l->all = all;
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->loop = l;
	pthread_cond_init(&w->turn, NULL);
	sigfillset(&all_sigs);
	pthread_sigmask(SIG_BLOCK, &all_sigs, &old);
	rc = pthread_create(&w->thread, NULL, worker_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc) {
		pthread_cond_destroy(&w->turn);
		free(w);
		return NULL;
	}
	pthread_setname_np(w->thread, "lockfs-request");
	l->all[l->nall++] = w;
	return w;
}

/* Give the reader's role to a waiting thread, or to a new one.  Under
 * L->mu.  Returns false when no thread is left to take it. */
static bool hand_off(struct loop *l)
{
	struct worker *w = l->waiting;

	if (w) {
		l->waiting = w->next;
		w->waiting = false;
		l->reader = w;
		pthread_cond_signal(&w->turn);
		return true;
	}
	w = worker_start(l);
	if (w)
		l->reader = w; /* it finds the role its own when it starts */
	return w != NULL;
}

/* The loop ends: every thread is told, the waiting one woken, the caller
 * posted.  Under L->mu. */
static void end_locked(struct loop *l)
{
	if (l->exit)
		return;
	l->exit = true;
	for (struct worker *w = l->waiting; w; w = w->next)
		pthread_cond_signal(&w->turn);
	pthread_cond_signal(&l->wd_wake);
	sem_post(&l->finish);
}

/* What libfuse 3.14 reads a request into (fuse_session_new: its largest
 * request, FUSE_MAX_MAX_PAGES pages of data, and FUSE_BUFFER_HEADER_SIZE),
 * which is also what it told the kernel at INIT. */
static size_t request_buf_size(void)
{
	return 256 * (size_t)sysconf(_SC_PAGESIZE) + 0x1000;
}

/*
 * Read one request into W's buffer, as fuse_session_receive_buf does, but
 * with the end of the connection told apart from a failure: besides ENODEV
 * (unmounted), the kernel answers ECONNABORTED to a read that was taking a
 * request when an unmount tore the connection down (fuse_dev_do_read, "must
 * not put request on fpq->io queue after having been shut down"), which
 * happens when many requests are in flight at the unmount (a thousand
 * killed flock waiters' RELEASE and INTERRUPT requests).  Both end the loop
 * as an unmount does; only other errors are the loop's error.  Returns the
 * request's size, 0 at the end, -EINTR to read again, or -errno.
 */
static int read_request(struct loop *l, struct worker *w)
{
	ssize_t n;

	if (!w->buf.mem) {
		w->buf.mem = malloc(request_buf_size());
		if (!w->buf.mem)
			return -ENOMEM;
	}
	n = read(fuse_session_fd(l->se), w->buf.mem, request_buf_size());
	if (fuse_session_exited(l->se))
		return 0;
	if (n < 0) {
		int err = errno;

		/* ENOENT: the request was interrupted before it was read. */
		if (err == EINTR || err == EAGAIN || err == ENOENT)
			return -EINTR;
		if (err == ENODEV || err == ECONNABORTED) {
			fuse_session_exit(l->se);
			return 0;
		}
		fprintf(stderr, "lockfs: reading /dev/fuse: %s\n", strerror(err));
		return -err;
	}
	if ((size_t)n < sizeof(struct fuse_in_header)) {
		fprintf(stderr, "lockfs: short read on /dev/fuse (%zd bytes)\n", n);
		return -EIO;
	}
	w->buf.size = (size_t)n;
	w->buf.flags = 0;
	return (int)n;
}

/* The unique of the request this thread processes (lockfs_loop_request_unique):
 * libfuse 3.14's fuse_req_t does not show it. */
static __thread uint64_t request_unique;

uint64_t lockfs_loop_request_unique(void)
{
	return request_unique;
}

/* The kernel's mark of a resent request (FUSE_UNIQUE_RESEND, Linux >= 6.9;
 * newer than libfuse 3.14's headers). */
#define UNIQUE_RESEND (1ULL << 63)

/* lockfs_loop_on_resent_done's state, all atomics: set before the loop
 * reads, then read and changed by every loop thread. */
static struct {
	void (*done)(void *arg);
	void *arg;
	int armed;       /* DONE not called yet */
	int fresh_seen;  /* a request that is not resent has been read */
	int busy;        /* resent requests read and not yet processed */
} resent;

void lockfs_loop_on_resent_done(void (*done)(void *arg), void *arg)
{
	resent.done = done;
	resent.arg = arg;
	__atomic_store_n(&resent.armed, 1, __ATOMIC_SEQ_CST);
}

/* Call DONE if every resent request is in and processed, once. */
static void resent_check(void)
{
	if (__atomic_load_n(&resent.fresh_seen, __ATOMIC_SEQ_CST) &&
	    __atomic_load_n(&resent.busy, __ATOMIC_SEQ_CST) == 0 &&
	    __atomic_exchange_n(&resent.armed, 0, __ATOMIC_SEQ_CST))
		resent.done(resent.arg);
}

/* The request in BUF was just read (true: it is a resent one).  Before it
 * is processed, and before another thread may read: a resent request is
 * counted busy before any later request can be seen. */
static bool resent_read(const struct fuse_buf *buf)
{
	const struct fuse_in_header *in = buf->mem;

	if (!__atomic_load_n(&resent.armed, __ATOMIC_SEQ_CST))
		return false;
	if (in->unique & UNIQUE_RESEND) {
		__atomic_add_fetch(&resent.busy, 1, __ATOMIC_SEQ_CST);
		return true;
	}
	/* The kernel reads interrupts and forgets out of their own queues,
	 * ahead of the resent requests. */
	if (in->opcode != FUSE_FORGET && in->opcode != FUSE_BATCH_FORGET &&
	    in->opcode != FUSE_INTERRUPT) {
		__atomic_store_n(&resent.fresh_seen, 1, __ATOMIC_SEQ_CST);
		resent_check();
	}
	return false;
}

static void resent_processed(void)
{
	__atomic_sub_fetch(&resent.busy, 1, __ATOMIC_SEQ_CST);
	resent_check();
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct loop *l = w->loop;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	for (;;) {
		bool was_resent;
		int res;

		pthread_mutex_lock(&l->mu);
		if (!l->reader)
			l->reader = w;
		while (l->reader != w && !l->exit) {
			if (!w->waiting) {
				w->next = l->waiting;
				l->waiting = w;
				w->waiting = true;
			}
			pthread_cond_wait(&w->turn, &l->mu);
		}
		if (l->exit || fuse_session_exited(l->se)) {
			end_locked(l);
			pthread_mutex_unlock(&l->mu);
			break;
		}
		pthread_mutex_unlock(&l->mu);

		pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
		res = read_request(l, w);
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
		if (res == -EINTR || res == -EAGAIN)
			continue;
		if (res <= 0) {
			pthread_mutex_lock(&l->mu);
			if (res < 0) {
				fuse_session_exit(l->se);
				l->error = res;
			}
			end_locked(l);
			pthread_mutex_unlock(&l->mu);
			break;
		}
		was_resent = resent_read(&w->buf);
		/* Processing: seen by the watchdog, which sleeps only while
		 * nobody processes (both sides are sequentially consistent: one
		 * of them sees the other). */
		__atomic_store_n(&w->taken, w->taken + 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(&w->processing, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&l->wd_asleep, __ATOMIC_SEQ_CST)) {
			pthread_mutex_lock(&l->mu);
			l->wd_asleep = 0;
			pthread_cond_signal(&l->wd_wake);
			pthread_mutex_unlock(&l->mu);
		}
		{
			const struct fuse_in_header *in = w->buf.mem;

			/* The connection's terms, for a successor that takes
			 * it over without ever seeing INIT (connstate.c). */
			if (in->opcode == FUSE_INIT)
				lockfs_connstate_keep_init(w->buf.mem, w->buf.size);
			request_unique = in->unique;
			fuse_session_process_buf(l->se, &w->buf);
			request_unique = 0;
		}
		if (was_resent)
			resent_processed();
		__atomic_store_n(&w->processing, 0, __ATOMIC_RELEASE);
		/* Still the reader: read the next one, hot.  Else the top of
		 * the loop makes it wait. */
	}
	return NULL;
}

/* now + US on the clock wd_wake uses (CLOCK_MONOTONIC). */
static struct timespec after_us(long us)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_nsec += us * 1000L;
	while (ts.tv_nsec >= 1000000000L) {
		ts.tv_nsec -= 1000000000L;
		ts.tv_sec++;
	}
	return ts;
}

static void *watchdog_main(void *arg)
{
	struct loop *l = arg;
	struct worker *last = NULL;
	uint64_t last_taken = 0;
	unsigned idle = 0;

	pthread_mutex_lock(&l->mu);
	while (!l->exit) {
		struct worker *r;
		uint64_t taken;
		int busy;

		if (l->wd_asleep) {
			pthread_cond_wait(&l->wd_wake, &l->mu);
			idle = 0;
			last = NULL;
			continue;
		}
		{
			struct timespec until = after_us(HANDOFF_US);

			pthread_cond_timedwait(&l->wd_wake, &l->mu, &until);
		}
		if (l->exit)
			break;
		r = l->reader;
		if (!r)
			continue;
		taken = __atomic_load_n(&r->taken, __ATOMIC_SEQ_CST);
		busy = __atomic_load_n(&r->processing, __ATOMIC_SEQ_CST);
		if (busy && r == last && taken == last_taken) {
			/* The same request since the last look: let another
			 * thread read meanwhile. */
			(void)hand_off(l);
			last = NULL;
			idle = 0;
			continue;
		}
		idle = busy || r != last || taken != last_taken ? 0 : idle + 1;
		last = r;
		last_taken = taken;
		if (idle >= IDLE_TICKS) {
			/* Sleep until a request comes -- unless one is being
			 * processed right now (the reader may have missed the
			 * flag: see worker_main). */
			__atomic_store_n(&l->wd_asleep, 1, __ATOMIC_SEQ_CST);
			if (__atomic_load_n(&r->processing, __ATOMIC_SEQ_CST) ||
			    l->reader != r)
				l->wd_asleep = 0;
		}
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

int lockfs_loop_run(struct fuse_session *se, unsigned max_threads)
{
	struct loop l;
	pthread_t watchdog;
	sigset_t all_sigs, old;
	int rc;

	memset(&l, 0, sizeof(l));
	l.se = se;
	l.max = max_threads ? max_threads : DEFAULT_THREADS;
	pthread_mutex_init(&l.mu, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&l.wd_wake, &ca);
		pthread_condattr_destroy(&ca);
	}
	sem_init(&l.finish, 0, 0);

	pthread_mutex_lock(&l.mu);
	rc = worker_start(&l) ? 0 : -EAGAIN;
	pthread_mutex_unlock(&l.mu);
	if (rc == 0) {
		sigfillset(&all_sigs);
		pthread_sigmask(SIG_BLOCK, &all_sigs, &old);
		rc = -pthread_create(&watchdog, NULL, watchdog_main, &l);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (rc == 0)
			pthread_setname_np(watchdog, "lockfs-watchdog");
	}
	if (rc == 0) {
		/* sem_wait is interrupted by a signal (fs/stop.c's kick). */
		while (!fuse_session_exited(se)) {
			pthread_mutex_lock(&l.mu);
			bool ended = l.exit;
			pthread_mutex_unlock(&l.mu);
			if (ended)
				break;
			sem_wait(&l.finish);
		}
	}
	pthread_mutex_lock(&l.mu);
	end_locked(&l);
	/* The reader may wait in read(/dev/fuse): cancel it there. */
	for (unsigned i = 0; i < l.nall; i++)
		pthread_cancel(l.all[i]->thread);
	pthread_mutex_unlock(&l.mu);
	if (rc == 0)
		pthread_join(watchdog, NULL);
	for (unsigned i = 0; i < l.nall; i++) {
		pthread_join(l.all[i]->thread, NULL);
		pthread_cond_destroy(&l.all[i]->turn);
		free(l.all[i]->buf.mem);
		free(l.all[i]);
	}
	free(l.all);
	if (rc == 0)
		rc = l.error;
	sem_destroy(&l.finish);
	pthread_cond_destroy(&l.wd_wake);
	pthread_mutex_destroy(&l.mu);
	fuse_session_reset(se);
	return rc;
}
