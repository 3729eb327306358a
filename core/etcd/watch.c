/*
 * A streaming watch: POST /v3/watch with a create_request, then one JSON
 * message per line for as long as the connection lives.  Each watch has
 * its own libcurl handle, driven through a multi handle by its own thread
 * so that lockfs_etcd_watch_close() can wake it at once
 * (curl_multi_wakeup), even when the connection is frozen.
 *
 * The watch never resumes by itself: it reports how it ended and from
 * which revision a new watch misses nothing (docs/etcd.md "Watch").
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* How the start went, as open() waits for it; protected by start_mu. */
enum start_state { STARTING, STARTED, START_FAILED };

struct lockfs_etcd_watch {
	/* Immutable while the thread runs. */
	struct lockfs_etcd *c;
	lockfs_etcd_watch_cb cb;
	void *arg;
	char *body;              /* the create_request, as JSON text */
	int64_t start_revision;
	int idle_timeout_ms;
	CURLM *multi;
	pthread_t thread;

	atomic_bool stop;        /* set by close(); the thread polls it */

	pthread_mutex_t start_mu;
	pthread_cond_t start_cond;
	enum start_state state;  /* protected by start_mu */
	int start_rc;            /* protected by start_mu */

	/* The thread's own, from here on. */
	CURL *curl;
	char errbuf[CURL_ERROR_SIZE];
	char *line;              /* bytes received, not yet a whole line */
	size_t len, cap;
	int64_t last_byte_ms;
	int64_t next_revision;
	bool created;
	bool ended;              /* the stream's end is decided: see end_* */
	int end_error;
	bool end_resync;
	int64_t end_compact;
};

/* Report the start's outcome to open(). */
static void start_done(struct lockfs_etcd_watch *w, int rc)
{
	pthread_mutex_lock(&w->start_mu);
	if (w->state == STARTING) {
		w->state = rc ? START_FAILED : STARTED;
		w->start_rc = rc;
		pthread_cond_signal(&w->start_cond);
	}
	pthread_mutex_unlock(&w->start_mu);
}

/* Decide how the stream ends (the first cause found stands); the thread
 * stops reading and reports it in the ENDED message. */
static void watch_end(struct lockfs_etcd_watch *w, int error, bool resync, int64_t compact)
{
	if (w->ended)
		return;
	w->ended = true;
	w->end_error = error;
	w->end_resync = resync;
	w->end_compact = compact;
}

static void deliver(struct lockfs_etcd_watch *w, struct lockfs_etcd_watch_msg *msg)
{
	msg->next_revision = w->next_revision;
	w->cb(w->arg, msg);
}

/* One message from etcd: {"result":{...}} or {"error":{...}}. */
static void handle_line(struct lockfs_etcd_watch *w, const char *text, size_t len)
{
	struct lockfs_etcd_watch_msg msg = { 0 };
	struct lockfs_etcd_line l;
	int rc = lockfs_etcd_line_fast(text, len, &l) ? 0 : lockfs_etcd_line_json(text, len, &l);

	if (rc) {
		watch_end(w, rc, false, 0);
		return;
	}
	msg.revision = l.revision;
	if (l.created && !w->created) {
		w->created = true;
		/* From now on, or from the revision asked for. */
		w->next_revision = w->start_revision ? w->start_revision : msg.revision + 1;
		msg.kind = LOCKFS_ETCD_WATCH_CREATED;
		deliver(w, &msg);
		start_done(w, 0);
	}
	if (l.n_events) {
		/* In revision order: the last one is the newest seen. */
		w->next_revision = l.events[l.n_events - 1].kv.mod_revision + 1;
		msg.kind = LOCKFS_ETCD_WATCH_EVENTS;
		msg.events = l.events;
		msg.n_events = l.n_events;
		deliver(w, &msg);
	} else if (w->created && !l.created && !l.canceled) {
		/* A progress notification.  next_revision stays: etcd 3.4
		 * does not order these with the stream's events (etcd issue
		 * 15220), so one proves nothing about what was delivered. */
		msg.kind = LOCKFS_ETCD_WATCH_PROGRESS;
		deliver(w, &msg);
	}
	lockfs_etcd_events_free(l.events, l.n_events);
	if (l.canceled)
		watch_end(w, l.compact_revision > 0 ? -ERANGE : -ECANCELED, l.compact_revision > 0,
			  l.compact_revision);
}

/* Bytes from etcd: split into lines (each message ends with '\n'). */
static size_t on_data(char *data, size_t size, size_t nmemb, void *arg)
{
	struct lockfs_etcd_watch *w = arg;
	size_t n = size * nmemb, start = 0;
	long status = 0;

	w->last_byte_ms = lockfs_etcd_now_ms();
	if (w->ended)
		return 0;
	if (w->len + n + 1 > w->cap) {
		size_t cap = w->cap ? w->cap : 4096;
		char *grown;

		while (cap < w->len + n + 1)
			cap *= 2;
		grown = cap <= LOCKFS_ETCD_BODY_MAX ? realloc(w->line, cap) : NULL;
		if (!grown) {
			watch_end(w, cap <= LOCKFS_ETCD_BODY_MAX ? -ENOMEM : -EPROTO, false, 0);
			return 0;
		}
		w->line = grown;
		w->cap = cap;
	}
	memcpy(w->line + w->len, data, n);
	w->len += n;
	/* An HTTP error's body is one unary error object: read it whole at
	 * the end. */
	curl_easy_getinfo(w->curl, CURLINFO_RESPONSE_CODE, &status);
	if (status != 200)
		return n;
	for (size_t i = 0; i < w->len && !w->ended; i++) {
		if (w->line[i] != '\n')
			continue;
		handle_line(w, w->line + start, i - start);
		start = i + 1;
	}
	memmove(w->line, w->line + start, w->len - start);
	w->len -= start;
	return w->ended ? 0 : n;
}

/* The start's error when the transfer of an unconfirmed watch ended with
 * RES: from the HTTP error body, or from libcurl. */
static int start_error(struct lockfs_etcd_watch *w, CURLcode res)
{
	bool sent;
	long status = 0;
	int64_t code = -1;
	json_t *j;

	if (w->ended)
		return w->end_error;
	if (res != CURLE_OK)
		return lockfs_etcd_curl_errno(w->curl, res, w->errbuf, &sent);
	curl_easy_getinfo(w->curl, CURLINFO_RESPONSE_CODE, &status);
	if (status == 200)
		return -ECONNRESET;  /* ended before etcd confirmed it */
	j = json_loadb(w->line, w->len, 0, NULL);
	if (json_is_object(j) && json_object_get(j, "code") &&
	    lockfs_etcd_get_int64(j, "code", &code))
		code = -1;
	json_decref(j);
	return code < 0 ? -EPROTO : (code ? lockfs_etcd_grpc_errno(code) : -EIO);
}

/* Run one transfer on endpoint I until it ends, the watch is closed, or
 * (before etcd confirmed it) START_DEADLINE passes.  Returns the CURLcode
 * of a finished transfer, or CURLE_OK with w->ended / w->stop set. */
static CURLcode run_transfer(struct lockfs_etcd_watch *w, int64_t start_deadline)
{
	for (;;) {
		int running = 0, queued, wait_ms = 1000;
		CURLMsg *m;
		int64_t now;

		if (curl_multi_perform(w->multi, &running) != CURLM_OK) {
			watch_end(w, -EIO, false, 0);
			return CURLE_OK;
		}
		while ((m = curl_multi_info_read(w->multi, &queued)))
			if (m->msg == CURLMSG_DONE)
				return m->data.result;
		if (w->ended || atomic_load(&w->stop))
			return CURLE_OK;
		now = lockfs_etcd_now_ms();
		if (!w->created) {
			if (now >= start_deadline)
				return CURLE_OPERATION_TIMEDOUT;
			if (start_deadline - now < wait_ms)
				wait_ms = (int)(start_deadline - now);
		} else if (w->idle_timeout_ms) {
			int64_t idle_end = w->last_byte_ms + w->idle_timeout_ms;

			if (now >= idle_end) {
				watch_end(w, -ETIMEDOUT, false, 0);
				return CURLE_OK;
			}
			if (idle_end - now < wait_ms)
				wait_ms = (int)(idle_end - now);
		}
		if (!running)
			continue;  /* a done message is queued */
		curl_multi_poll(w->multi, NULL, 0, wait_ms, NULL);
	}
}

static void *watch_thread(void *arg)
{
	struct lockfs_etcd_watch *w = arg;
	struct lockfs_etcd *c = w->c;
	size_t n = lockfs_etcd_endpoint_count(c), first = lockfs_etcd_preferred(c);
	int64_t deadline = lockfs_etcd_now_ms() + lockfs_etcd_timeout_ms(c);
	int worst = 0;
	char url[2048];

	for (size_t tried = 0; tried < n && !atomic_load(&w->stop); tried++) {
		size_t i = (first + tried) % n;
		int64_t left = deadline - lockfs_etcd_now_ms();
		long share = (long)(left / (int64_t)(n - tried));
		CURLcode res;
		int rc;

		if (left <= 0) {
			worst = lockfs_etcd_worse(worst, -ETIMEDOUT);
			break;
		}
		snprintf(url, sizeof(url), "%s/v3/watch", lockfs_etcd_endpoint(c, i));
		w->len = 0;
		w->errbuf[0] = '\0';
		curl_easy_setopt(w->curl, CURLOPT_URL, url);
		/* No CURLOPT_TIMEOUT: the stream lives as long as it may. */
		curl_easy_setopt(w->curl, CURLOPT_CONNECTTIMEOUT_MS, share > 0 ? share : 1L);
		w->last_byte_ms = lockfs_etcd_now_ms();
		curl_multi_add_handle(w->multi, w->curl);
		/* The last endpoint may use all that is left; the others
		 * their share, so that a silent one cannot use it all. */
		res = run_transfer(w, tried + 1 == n ? deadline : lockfs_etcd_now_ms() + share);
		curl_multi_remove_handle(w->multi, w->curl);
		if (w->created) {
			lockfs_etcd_endpoint_answered(c, i);
			/* Closed by etcd, or broken: either way a new watch
			 * from next_revision resumes. */
			watch_end(w, -ECONNRESET, false, 0);
			if (!atomic_load(&w->stop)) {
				struct lockfs_etcd_watch_msg msg = {
					.kind = LOCKFS_ETCD_WATCH_ENDED,
					.error = w->end_error,
					.resync = w->end_resync,
					.compact_revision = w->end_compact,
				};
				deliver(w, &msg);
			}
			return NULL;
		}
		if (atomic_load(&w->stop))
			break;
		rc = start_error(w, res);
		worst = lockfs_etcd_worse(worst, rc);
		if (w->ended || (res == CURLE_OK && rc != -EAGAIN && rc != -ETIMEDOUT))
			break;  /* etcd answered: another endpoint would too */
		lockfs_etcd_endpoint_failed(c, i);
		w->ended = false;
	}
	start_done(w, worst ? worst : -ECANCELED);
	return NULL;
}

/* The create_request for REQ as JSON text.  0 and *OUT, -EINVAL, -ENOMEM. */
static int request_text(const struct lockfs_etcd_watch_req *req, char **out)
{
	json_t *cr = json_object(), *top = json_object();
	int rc = cr && top ? 0 : -ENOMEM;

	*out = NULL;
	if (!rc)
		rc = lockfs_etcd_set_range(cr, req->key, req->range_end, req->prefix);
	if (!rc && req->start_revision &&
	    json_object_set_new(cr, "start_revision", lockfs_etcd_json_int64(req->start_revision)))
		rc = -ENOMEM;
	if (!rc && req->prev_kv && json_object_set_new(cr, "prev_kv", json_true()))
		rc = -ENOMEM;
	if (!rc && req->progress_notify && json_object_set_new(cr, "progress_notify", json_true()))
		rc = -ENOMEM;
	if (!rc && json_object_set(top, "create_request", cr))
		rc = -ENOMEM;
	if (!rc) {
		*out = json_dumps(top, JSON_COMPACT);
		if (!*out)
			rc = -ENOMEM;
	}
	json_decref(cr);
	json_decref(top);
	return rc;
}

static void watch_free(struct lockfs_etcd_watch *w)
{
	if (w->curl)
		curl_easy_cleanup(w->curl);
	if (w->multi)
		curl_multi_cleanup(w->multi);
	pthread_mutex_destroy(&w->start_mu);
	pthread_cond_destroy(&w->start_cond);
	free(w->body);
	free(w->line);
	free(w);
}

int lockfs_etcd_watch_open(struct lockfs_etcd_watch **out, struct lockfs_etcd *c,
			   const struct lockfs_etcd_watch_req *req,
			   lockfs_etcd_watch_cb cb, void *arg)
{
	struct lockfs_etcd_watch *w;
	int rc;

	*out = NULL;
	if (!c || !req || !cb || req->start_revision < 0 || req->idle_timeout_ms < 0)
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->start_mu, NULL);
	pthread_cond_init(&w->start_cond, NULL);
	w->c = c;
	w->cb = cb;
	w->arg = arg;
	w->start_revision = req->start_revision;
	w->idle_timeout_ms = req->idle_timeout_ms;
	rc = request_text(req, &w->body);
	if (!rc) {
		w->multi = curl_multi_init();
		w->curl = curl_easy_init();
		if (!w->multi || !w->curl)
			rc = -ENOMEM;
	}
	if (!rc)
		rc = lockfs_etcd_easy_setup(c, w->curl);
	if (!rc && (curl_easy_setopt(w->curl, CURLOPT_POSTFIELDS, w->body) != CURLE_OK ||
		    curl_easy_setopt(w->curl, CURLOPT_WRITEFUNCTION, on_data) != CURLE_OK ||
		    curl_easy_setopt(w->curl, CURLOPT_WRITEDATA, w) != CURLE_OK ||
		    curl_easy_setopt(w->curl, CURLOPT_ERRORBUFFER, w->errbuf) != CURLE_OK))
		rc = -ENOMEM;
	if (!rc) {
		rc = -pthread_create(&w->thread, NULL, watch_thread, w);
		if (rc)
			rc = -EAGAIN;
		else
			pthread_setname_np(w->thread, "lockfs-watch");
	}
	if (rc) {
		watch_free(w);
		return rc;
	}
	pthread_mutex_lock(&w->start_mu);
	while (w->state == STARTING)
		pthread_cond_wait(&w->start_cond, &w->start_mu);
	rc = w->start_rc;
	pthread_mutex_unlock(&w->start_mu);
	if (rc) {
		pthread_join(w->thread, NULL);
		watch_free(w);
		return rc;
	}
	*out = w;
	return 0;
}

void lockfs_etcd_watch_close(struct lockfs_etcd_watch *w)
{
	if (!w)
		return;
	atomic_store(&w->stop, true);
	curl_multi_wakeup(w->multi);
	pthread_join(w->thread, NULL);
	watch_free(w);
}
