/*
 * M/.events and M/.metrics.
 *
 * M/.events: each open is a cursor into the engine's ring of recent events
 * (core/lock/events.c).  A read answers at once with the whole lines
 * there are; when there are none it is parked, not waited for: the
 * handler returns, no request thread is held, and this file's one thread
 * answers it when an event comes (like a flock waiter, fs/flock.c).  An
 * interrupt (the reader's signal, Ctrl-C of `lockctl watch`) answers it
 * with EINTR; the daemon's stop answers every parked read with end of
 * file before the session goes.
 *
 * The parked reads are on one list under EV->MU, which is also held
 * while a read or the thread takes events for a parked read: a read
 * takes and parks under it, the thread answers under it after the ring
 * moved, so no event slips between a read finding none and parking.
 * Lock order: EV->MU, then the ring's mutex (a leaf).  Nothing calls
 * into the engine but for the ring; no stripe mutex is ever taken here.
 *
 * What a reader watches is also what the store is to tell this daemon of
 * (lockfs_core_events_follow: on etcd, other hosts' changes of those
 * names): from its first read or write -- `lockctl watch gpu` writes its
 * names before it reads, so it never follows every name on the way --
 * until it is closed.  FOLLOW_MU keeps one reader's changes in order; it
 * is taken before EV->MU and held across the engine's call, which may
 * wait for the store, so EV->MU never is.
 *
 * M/.metrics is rendered once per open (ops.c), like `owner`.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "events_file.h"
#include "lockfs/name.h"

/* Bytes a read takes at most: the kernel asks for up to 128 KiB. */
#define READ_MAX (128u << 10)

struct parked_read {
	struct parked_read *next;
	fuse_req_t req;
	struct open_file *of;
	size_t size;
};

struct uid_count {
	uid_t uid;
	unsigned n;
};

struct events_files {
	pthread_mutex_t follow_mu;  /* see the top */
	pthread_mutex_t mu;
	struct parked_read *parked; /* protected by mu */
	struct uid_count *uids;     /* open M/.events per uid; protected by mu */
	size_t nuids;
	bool stopping;              /* protected by mu */
	pthread_t thread;
	bool started;
};

/* What OF follows, as lockfs_core_events_follow takes it. */
static const char *followed(const struct open_file *of)
{
	if (!of->following)
		return LOCKFS_FOLLOW_NONE;
	return of->watch ? of->watch : LOCKFS_FOLLOW_ALL;
}

/* OF follows what it watches from now on.  With ev->follow_mu held. */
static void start_following(struct lockfs_fs *fs, struct open_file *of)
{
	if (of->following)
		return;
	of->following = true;
	(void)lockfs_core_events_follow(fs->core, LOCKFS_FOLLOW_NONE, followed(of));
}

/* Does the reader whose watch list is ARG want NAME's events? */
static bool wants(void *arg, const char *name)
{
	const char *w = arg;

	if (!w)
		return true;
	for (; *w; w += strlen(w) + 1)
		if (strcmp(w, name) == 0)
			return true;
	return false;
}

/* Take OF's next lines into a buffer of SIZE and answer REQ with them:
 * true if answered (events, or an error), false if none yet.  With
 * ev->mu held. */
static bool answer_locked(struct lockfs_fs *fs, fuse_req_t req, struct open_file *of, size_t size)
{
	char *buf;
	ssize_t n;

	if (size > READ_MAX)
		size = READ_MAX;
	buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return true;
	}
	n = lockfs_core_events_take(fs->core, &of->cursor, buf, size, wants, of->watch);
	if (n < 0)
		fuse_reply_err(req, (int)-n); /* EOVERFLOW: a buffer smaller than a line */
	else if (n > 0)
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
	return n != 0;
}

/* The thread: each time the ring moves, answer every parked read that
 * now has lines.  Ends when the events are shut. */
static void *answer_thread(void *arg)
{
	struct lockfs_fs *fs = arg;
	struct events_files *ev = fs->events;
	uint64_t seen = 0;

	for (;;) {
		seen = lockfs_core_events_wait(fs->core, seen);
		pthread_mutex_lock(&ev->mu);
		if (ev->stopping || lockfs_core_events_shut_down(fs->core)) {
			pthread_mutex_unlock(&ev->mu);
			break;
		}
		for (struct parked_read **pp = &ev->parked; *pp;) {
			struct parked_read *p = *pp;

			if (!answer_locked(fs, p->req, p->of, p->size)) {
				pp = &p->next;
				continue;
			}
			*pp = p->next;
			free(p);
		}
		pthread_mutex_unlock(&ev->mu);
	}
	return NULL;
}

int lockfs_events_file_start(struct lockfs_fs *fs)
{
	struct events_files *ev = calloc(1, sizeof(*ev));
	int rc;

	if (!ev)
		return -ENOMEM;
	pthread_mutex_init(&ev->mu, NULL);
	pthread_mutex_init(&ev->follow_mu, NULL);
	fs->events = ev;
	rc = pthread_create(&ev->thread, NULL, answer_thread, fs);
	if (rc != 0)
		return -rc;
	ev->started = true;
	return 0;
}

void lockfs_events_file_shutdown(struct lockfs_fs *fs)
{
	struct events_files *ev = fs->events;

	if (!ev)
		return;
	lockfs_core_events_shut(fs->core);
	pthread_mutex_lock(&ev->mu);
	ev->stopping = true;
	/* End of file: `lockctl watch` and `cat` end cleanly. */
	while (ev->parked) {
		struct parked_read *p = ev->parked;

		ev->parked = p->next;
		fuse_reply_buf(p->req, NULL, 0);
		free(p);
	}
	pthread_mutex_unlock(&ev->mu);
	if (ev->started)
		pthread_join(ev->thread, NULL);
	free(ev->uids);
	pthread_mutex_destroy(&ev->mu);
	pthread_mutex_destroy(&ev->follow_mu);
	free(ev);
	fs->events = NULL;
}

void lockfs_events_file_attr(struct lockfs_fs *fs, fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	/* Anyone may read both; anyone may write names to an open M/.events
	 * (its own filter).  Sizes are 0: reads go to the daemon (direct_io). */
	st->st_mode = S_IFREG | (ino == INO_EVENTS ? 0666 : 0444);
	st->st_nlink = 1;
	st->st_uid = fs->mount_uid;
	st->st_gid = fs->mount_gid;
	clock_gettime(CLOCK_REALTIME, &st->st_mtim);
	st->st_atim = st->st_ctim = st->st_mtim;
}

/* UID's count of open M/.events, made if needed (NULL: no memory).  With
 * ev->mu held. */
static struct uid_count *uid_count(struct events_files *ev, uid_t uid)
{
	struct uid_count *more;

	for (size_t i = 0; i < ev->nuids; i++)
		if (ev->uids[i].uid == uid)
			return &ev->uids[i];
	more = realloc(ev->uids, (ev->nuids + 1) * sizeof(*more));
	if (!more)
		return NULL;
	ev->uids = more;
	more[ev->nuids] = (struct uid_count){ .uid = uid };
	return &more[ev->nuids++];
}

int lockfs_events_file_open(struct lockfs_fs *fs, fuse_req_t req, struct open_file *of)
{
	struct events_files *ev = fs->events;
	struct uid_count *c;
	int rc = 0;

	if (!ev)
		return -ENOTCONN;
	pthread_mutex_lock(&ev->mu);
	c = uid_count(ev, fuse_req_ctx(req)->uid);
	if (!c)
		rc = -ENOMEM;
	else if (c->n >= LOCKFS_EVENTS_OPEN_PER_UID)
		rc = -EMFILE;
	else
		c->n++;
	pthread_mutex_unlock(&ev->mu);
	if (rc < 0)
		return rc;
	of->events = true;
	of->cursor = lockfs_core_events_attach(fs->core);
	return 0;
}

void lockfs_events_file_close(struct lockfs_fs *fs, struct open_file *of)
{
	struct events_files *ev = fs->events;

	if (!of->events || !ev)
		return;
	pthread_mutex_lock(&ev->follow_mu);
	if (of->following)
		(void)lockfs_core_events_follow(fs->core, followed(of), LOCKFS_FOLLOW_NONE);
	of->following = false;
	pthread_mutex_unlock(&ev->follow_mu);
	lockfs_core_events_detach(fs->core);
	pthread_mutex_lock(&ev->mu);
	for (size_t i = 0; i < ev->nuids; i++)
		if (ev->uids[i].uid == of->h.uid && ev->uids[i].n)
			ev->uids[i].n--;
	pthread_mutex_unlock(&ev->mu);
	of->events = false;
}

/* The reader gave up (a signal): the kernel sent an INTERRUPT. */
static void read_interrupted(fuse_req_t req, void *data)
{
	struct events_files *ev = ((struct lockfs_fs *)data)->events;

	pthread_mutex_lock(&ev->mu);
	for (struct parked_read **pp = &ev->parked; *pp; pp = &(*pp)->next) {
		struct parked_read *p = *pp;

		if (p->req != req)
			continue;
		*pp = p->next;
		fuse_reply_err(req, EINTR);
		free(p);
		break;
	}
	pthread_mutex_unlock(&ev->mu);
}

void lockfs_events_file_read(fuse_req_t req, struct lockfs_fs *fs, struct open_file *of,
			     size_t size)
{
	struct events_files *ev = fs->events;
	struct parked_read *p;

	if (!ev)
		return (void)fuse_reply_buf(req, NULL, 0);
	if (of->events && !of->following) {
		pthread_mutex_lock(&ev->follow_mu);
		start_following(fs, of);
		pthread_mutex_unlock(&ev->follow_mu);
	}
	/* Before parking: once parked, another thread may answer (and free)
	 * REQ at any moment.  An interrupt that comes before it is parked
	 * finds nothing to answer; fuse_req_interrupted says so below. */
	fuse_req_interrupt_func(req, read_interrupted, fs);
	pthread_mutex_lock(&ev->mu);
	if (!of->events) {
		/* A successor's copy of a predecessor's open (handle.c):
		 * from the next event on. */
		pthread_mutex_unlock(&ev->mu);
		if (lockfs_events_file_open(fs, req, of) < 0)
			return (void)fuse_reply_buf(req, NULL, 0);
		pthread_mutex_lock(&ev->mu);
	}
	if (ev->stopping) {
		pthread_mutex_unlock(&ev->mu);
		return (void)fuse_reply_buf(req, NULL, 0);
	}
	if (answer_locked(fs, req, of, size)) {
		pthread_mutex_unlock(&ev->mu);
		return;
	}
	p = fuse_req_interrupted(req) ? NULL : calloc(1, sizeof(*p));
	if (!p) {
		pthread_mutex_unlock(&ev->mu);
		return (void)fuse_reply_err(req, fuse_req_interrupted(req) ? EINTR : ENOMEM);
	}
	p->req = req;
	p->of = of;
	p->size = size;
	p->next = ev->parked;
	ev->parked = p;
	pthread_mutex_unlock(&ev->mu);
}

int lockfs_events_file_write(struct lockfs_fs *fs, struct open_file *of, const char *buf,
			     size_t size)
{
	struct events_files *ev = fs->events;
	char *watch = malloc(size + 2), *old;
	size_t used = 0;

	if (!watch)
		return -ENOMEM;
	for (size_t i = 0; i < size;) {
		const char *nl = memchr(buf + i, '\n', size - i);
		size_t n = (nl ? (size_t)(nl - buf) : size) - i;

		memcpy(watch + used, buf + i, n);
		watch[used + n] = '\0';
		if (n && lockfs_name_check(watch + used) < 0) {
			free(watch);
			return -EINVAL;
		}
		if (n)
			used += n + 1;
		i += n + 1;
	}
	watch[used] = '\0';
	if (!ev) {
		free(watch);
		return -ENOTCONN;
	}
	pthread_mutex_lock(&ev->follow_mu);
	pthread_mutex_lock(&ev->mu);
	old = of->watch;
	of->watch = watch;
	pthread_mutex_unlock(&ev->mu);
	if (of->events && of->following)
		(void)lockfs_core_events_follow(fs->core, old ? old : LOCKFS_FOLLOW_ALL, watch);
	else if (of->events)
		start_following(fs, of);
	pthread_mutex_unlock(&ev->follow_mu);
	free(old);
	return (int)size;
}
