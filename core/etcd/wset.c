/*
 * A watch set: any number of watches on one WebSocket stream to etcd
 * (websocket.c), driven by one thread, created and cancelled while the
 * stream lives.  It is what lets a daemon watch only the keys its callers
 * care about: a watch per name costs etcd one watcher on a stream it
 * already has, not a connection.
 *
 * etcd numbers the watches of a stream in the order it created them and
 * answers each create_request with a "created" message in that order, so
 * the set keeps the creates it sent in a FIFO and learns each watch's
 * etcd id from the next "created".  Each watch keeps its own next
 * revision; when the stream breaks (or falls silent past the idle bound)
 * the set reconnects by itself and creates every watch again from its own
 * next revision: nothing is missed and nothing repeats.  A watch whose
 * history was compacted ends (LOST): its caller re-reads the range and
 * adds it again.  See docs/etcd.md "Watch".
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "internal.h"

struct wset_watch {
	int64_t id;              /* ours, > 0 */
	char *key, *range_end;   /* range_end NULL: KEY alone */
	int64_t next_rev;        /* every event before it was delivered */
	int64_t etcd_id;         /* on the current stream; -1: not created */
	bool sent;               /* its create went out on the current stream */
	bool cancelled;          /* by the caller: free once etcd knows */
	struct wset_watch *next;
};

struct lockfs_etcd_wset {
	struct lockfs_etcd *c;
	lockfs_etcd_wset_cb cb;
	void *arg;
	int idle_ms;
	int efd;                 /* wakes the thread */
	pthread_t thread;

	pthread_mutex_t mu;      /* leaf: the fields below */
	struct wset_watch *watches;
	int64_t next_id;
	size_t count;            /* live (not cancelled) watches */
	bool stop, restart;

	/* The thread's own. */
	struct lockfs_etcd_ws *ws;
	int64_t *await;          /* our ids whose create awaits "created", in order */
	size_t n_await, cap_await;
	size_t initial;          /* creates of the connection not yet confirmed */
	bool up;
};

static void wake(struct lockfs_etcd_wset *s)
{
	uint64_t one = 1;

	(void)!write(s->efd, &one, sizeof(one));
}

static void watch_free(struct wset_watch *w)
{
	free(w->key);
	free(w->range_end);
	free(w);
}

static struct wset_watch *find_etcd(struct lockfs_etcd_wset *s, int64_t etcd_id)
{
	for (struct wset_watch *w = s->watches; w; w = w->next)
		if (w->etcd_id == etcd_id)
			return w;
	return NULL;
}

static void unlink_watch(struct lockfs_etcd_wset *s, struct wset_watch *w)
{
	for (struct wset_watch **pp = &s->watches; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			watch_free(w);
			return;
		}
}

/* {"create_request":{...}} for W from its next revision.  NULL: no memory. */
static char *create_text(const struct wset_watch *w)
{
	json_t *cr = json_object(), *top = json_object();
	char *text = NULL;

	if (cr && top && lockfs_etcd_set_range(cr, w->key, w->range_end, false) == 0 &&
	    json_object_set_new(cr, "start_revision", lockfs_etcd_json_int64(w->next_rev)) == 0 &&
	    json_object_set(top, "create_request", cr) == 0)
		text = json_dumps(top, JSON_COMPACT);
	json_decref(cr);
	json_decref(top);
	return text;
}

static int send_cancel(struct lockfs_etcd_wset *s, int64_t etcd_id)
{
	char text[96];

	snprintf(text, sizeof(text), "{\"cancel_request\":{\"watch_id\":\"%lld\"}}",
		 (long long)etcd_id);
	return lockfs_etcd_ws_text(s->ws, text, strlen(text));
}

/* Send what changed since: creates of new watches, cancels.  With MU. */
static int flush_locked(struct lockfs_etcd_wset *s)
{
	struct wset_watch **pp = &s->watches;
	int rc = 0;

	while (*pp && !rc) {
		struct wset_watch *w = *pp;

		if (w->cancelled && (!w->sent || w->etcd_id >= 0)) {
			if (w->etcd_id >= 0)
				rc = send_cancel(s, w->etcd_id);
			*pp = w->next;
			watch_free(w);
			continue;
		}
		if (!w->sent && !w->cancelled) {
			char *text = create_text(w);

			if (s->n_await == s->cap_await) {
				size_t cap = s->cap_await ? s->cap_await * 2 : 16;
				int64_t *v = realloc(s->await, cap * sizeof(*v));

				if (!v) {
					free(text);
					return -ENOMEM;
				}
				s->await = v;
				s->cap_await = cap;
			}
			rc = text ? lockfs_etcd_ws_text(s->ws, text, strlen(text)) : -ENOMEM;
			free(text);
			if (rc)
				break;
			w->sent = true;
			s->await[s->n_await++] = w->id;
		}
		pp = &w->next;
	}
	return rc;
}

static void deliver_simple(struct lockfs_etcd_wset *s, enum lockfs_etcd_wset_kind kind,
			   int64_t id, int error, int64_t compact)
{
	struct lockfs_etcd_wset_msg msg = {
		.kind = kind, .id = id, .error = error, .compact_revision = compact,
	};

	s->cb(s->arg, &msg);
}

/* One message from etcd.  0, or -errno to drop the stream. */
static int handle(struct lockfs_etcd_wset *s, const char *text, size_t len)
{
	struct lockfs_etcd_line l;
	struct wset_watch *w;
	int rc = lockfs_etcd_line_fast(text, len, &l) ? 0 : lockfs_etcd_line_json(text, len, &l);

	if (rc)
		return rc;
	pthread_mutex_lock(&s->mu);
	if (l.created) {
		int64_t id = 0;

		if (s->n_await) {
			id = s->await[0];
			memmove(s->await, s->await + 1, --s->n_await * sizeof(*s->await));
		}
		for (w = s->watches; w && w->id != id; w = w->next)
			;
		if (w && l.canceled) {
			/* etcd refused it (a revision in the future, ...). */
			bool tell = !w->cancelled;

			unlink_watch(s, w);
			if (tell)
				s->count--;
			pthread_mutex_unlock(&s->mu);
			if (tell)
				deliver_simple(s, LOCKFS_ETCD_WSET_LOST, id, -ECANCELED, 0);
			pthread_mutex_lock(&s->mu);
		} else if (w) {
			w->etcd_id = l.watch_id;
			if (w->cancelled)
				rc = flush_locked(s);
		}
		if (s->initial && --s->initial == 0 && !s->up) {
			s->up = true;
			pthread_mutex_unlock(&s->mu);
			deliver_simple(s, LOCKFS_ETCD_WSET_UP, 0, 0, 0);
			pthread_mutex_lock(&s->mu);
		}
	} else if (l.canceled) {
		w = find_etcd(s, l.watch_id);
		if (w && w->cancelled) {
			unlink_watch(s, w);
		} else if (w && l.compact_revision > 0) {
			int64_t id = w->id;

			unlink_watch(s, w);
			s->count--;
			pthread_mutex_unlock(&s->mu);
			deliver_simple(s, LOCKFS_ETCD_WSET_LOST, id, -ERANGE, l.compact_revision);
			pthread_mutex_lock(&s->mu);
		} else if (w) {
			/* Cancelled by etcd for another reason: create it again. */
			w->sent = false;
			w->etcd_id = -1;
			rc = flush_locked(s);
		}
	} else if (l.n_events && (w = find_etcd(s, l.watch_id)) && !w->cancelled) {
		struct lockfs_etcd_wset_msg msg = {
			.kind = LOCKFS_ETCD_WSET_EVENTS, .id = w->id,
			.events = l.events, .n_events = l.n_events,
		};

		w->next_rev = l.events[l.n_events - 1].kv.mod_revision + 1;
		msg.next_revision = w->next_rev;
		/* Delivered with MU released: the callback may add and cancel.
		 * A cancel that races with this delivery is the caller's to
		 * tell (it knows which ids are current). */
		pthread_mutex_unlock(&s->mu);
		s->cb(s->arg, &msg);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	lockfs_etcd_events_free(l.events, l.n_events);
	return rc;
}

/* Connect to the first endpoint that upgrades.  0 or -errno. */
static int connect_stream(struct lockfs_etcd_wset *s)
{
	size_t n = lockfs_etcd_endpoint_count(s->c), first = lockfs_etcd_preferred(s->c);
	int64_t deadline = lockfs_etcd_now_ms() + lockfs_etcd_timeout_ms(s->c);
	int worst = 0;

	for (size_t tried = 0; tried < n; tried++) {
		size_t i = (first + tried) % n;
		int64_t left = deadline - lockfs_etcd_now_ms();
		int rc;

		if (left <= 0)
			return lockfs_etcd_worse(worst, -ETIMEDOUT);
		rc = lockfs_etcd_ws_open(s->c, i, tried + 1 == n ? deadline :
					 lockfs_etcd_now_ms() + left / (int64_t)(n - tried), &s->ws);
		if (rc == 0) {
			lockfs_etcd_endpoint_answered(s->c, i);
			return 0;
		}
		worst = lockfs_etcd_worse(worst, rc);
		lockfs_etcd_endpoint_failed(s->c, i);
	}
	return worst ? worst : -EIO;
}

/* A new stream: every watch is to be created again, from its own next
 * revision.  0 or -errno. */
static int start_stream(struct lockfs_etcd_wset *s)
{
	int rc;

	pthread_mutex_lock(&s->mu);
	s->n_await = 0;
	s->initial = 0;
	s->up = false;
	for (struct wset_watch *w = s->watches; w; w = w->next) {
		w->sent = false;
		w->etcd_id = -1;
		if (!w->cancelled)
			s->initial++;
	}
	rc = flush_locked(s);
	pthread_mutex_unlock(&s->mu);
	if (!rc && !s->initial) {
		s->up = true;
		deliver_simple(s, LOCKFS_ETCD_WSET_UP, 0, 0, 0);
	}
	return rc;
}

/* Run the stream until it breaks, goes quiet past the idle bound, or the
 * set is stopped or restarted. */
static void run_stream(struct lockfs_etcd_wset *s)
{
	int64_t next_ping = lockfs_etcd_now_ms() + s->idle_ms / 2;

	for (;;) {
		struct pollfd p[2] = {
			{ .fd = lockfs_etcd_ws_fd(s->ws), .events = POLLIN },
			{ .fd = s->efd, .events = POLLIN },
		};
		int64_t now = lockfs_etcd_now_ms(), idle_end;
		char *text;
		size_t len;
		uint64_t v;
		int rc, wait_ms;

		while ((rc = lockfs_etcd_ws_recv(s->ws, &text, &len)) == 1)
			if ((rc = handle(s, text, len)) != 0)
				return;
		if (rc < 0)
			return;
		pthread_mutex_lock(&s->mu);
		if (s->stop || s->restart) {
			s->restart = false;
			pthread_mutex_unlock(&s->mu);
			return;
		}
		rc = flush_locked(s);
		pthread_mutex_unlock(&s->mu);
		if (rc)
			return;
		now = lockfs_etcd_now_ms();
		idle_end = lockfs_etcd_ws_last_byte(s->ws) + s->idle_ms;
		if (now >= idle_end)
			return;  /* a frozen peer or a partition: nothing says so */
		if (now >= next_ping) {
			if (lockfs_etcd_ws_ping(s->ws))
				return;
			next_ping = now + s->idle_ms / 2;
		}
		wait_ms = (int)((idle_end < next_ping ? idle_end : next_ping) - now);
		if (poll(p, 2, wait_ms > 0 ? wait_ms : 0) > 0 && (p[1].revents & POLLIN))
			(void)!read(s->efd, &v, sizeof(v));
	}
}

static void *wset_thread(void *arg)
{
	struct lockfs_etcd_wset *s = arg;
	int backoff = 100;

	for (;;) {
		bool stop;
		int rc = 0;

		if (!s->ws)
			rc = connect_stream(s);
		if (!rc)
			rc = start_stream(s);
		if (!rc) {
			backoff = 100;
			run_stream(s);
		}
		if (s->ws) {
			lockfs_etcd_ws_close(s->ws);
			s->ws = NULL;
		}
		pthread_mutex_lock(&s->mu);
		stop = s->stop;
		pthread_mutex_unlock(&s->mu);
		if (stop)
			break;
		if (s->up || rc) {
			s->up = false;
			deliver_simple(s, LOCKFS_ETCD_WSET_DOWN, 0, rc ? rc : -ECONNRESET, 0);
		}
		if (rc) {
			/* No endpoint: wait a little (woken by close). */
			struct pollfd p = { .fd = s->efd, .events = POLLIN };
			uint64_t v;

			if (poll(&p, 1, backoff) > 0)
				(void)!read(s->efd, &v, sizeof(v));
			backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
		}
	}
	return NULL;
}

int lockfs_etcd_wset_open(struct lockfs_etcd_wset **out, struct lockfs_etcd *c, int idle_timeout_ms,
			  lockfs_etcd_wset_cb cb, void *arg)
{
	struct lockfs_etcd_wset *s;
	int rc;

	*out = NULL;
	if (!c || !cb || idle_timeout_ms <= 0)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->c = c;
	s->cb = cb;
	s->arg = arg;
	s->idle_ms = idle_timeout_ms;
	s->next_id = 1;
	pthread_mutex_init(&s->mu, NULL);
	s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	rc = s->efd < 0 ? -errno : connect_stream(s);
	if (!rc) {
		rc = -pthread_create(&s->thread, NULL, wset_thread, s);
		if (!rc)
			pthread_setname_np(s->thread, "lockfs-watch");
	}
	if (rc) {
		if (s->ws)
			lockfs_etcd_ws_close(s->ws);
		if (s->efd >= 0)
			close(s->efd);
		pthread_mutex_destroy(&s->mu);
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

int64_t lockfs_etcd_wset_add(struct lockfs_etcd_wset *s, const char *key, const char *range_end,
			     int64_t start_revision)
{
	struct wset_watch *w = calloc(1, sizeof(*w));
	int64_t id;

	if (!w)
		return -ENOMEM;
	w->key = strdup(key);
	w->range_end = range_end ? strdup(range_end) : NULL;
	if (!w->key || (range_end && !w->range_end)) {
		watch_free(w);
		return -ENOMEM;
	}
	w->next_rev = start_revision;
	w->etcd_id = -1;
	pthread_mutex_lock(&s->mu);
	id = w->id = s->next_id++;
	w->next = s->watches;
	s->watches = w;
	s->count++;
	pthread_mutex_unlock(&s->mu);
	wake(s);
	return id;
}

void lockfs_etcd_wset_cancel(struct lockfs_etcd_wset *s, int64_t id)
{
	pthread_mutex_lock(&s->mu);
	for (struct wset_watch *w = s->watches; w; w = w->next)
		if (w->id == id && !w->cancelled) {
			w->cancelled = true;
			s->count--;
			break;
		}
	pthread_mutex_unlock(&s->mu);
	wake(s);
}

size_t lockfs_etcd_wset_count(struct lockfs_etcd_wset *s)
{
	size_t n;

	pthread_mutex_lock(&s->mu);
	n = s->count;
	pthread_mutex_unlock(&s->mu);
	return n;
}

void lockfs_etcd_wset_restart(struct lockfs_etcd_wset *s)
{
	pthread_mutex_lock(&s->mu);
	s->restart = true;
	pthread_mutex_unlock(&s->mu);
	wake(s);
}

void lockfs_etcd_wset_close(struct lockfs_etcd_wset *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	pthread_mutex_unlock(&s->mu);
	wake(s);
	pthread_join(s->thread, NULL);
	if (s->ws)
		lockfs_etcd_ws_close(s->ws);
	while (s->watches) {
		struct wset_watch *w = s->watches;

		s->watches = w->next;
		watch_free(w);
	}
	free(s->await);
	close(s->efd);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
