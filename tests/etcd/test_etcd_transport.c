/*
 * The etcd client's connections (include/lockfs/etcd_client.h) against a
 * real etcd on loopback: a connection frozen by a pausable proxy, endpoints
 * that are closed or silent, failover between them, a write that may have
 * arrived, and TLS.  The requests themselves are test_etcd_client.c.
 * Run through tests/fixtures/etcd_fixtures.py exec --tls, which starts
 * a plain and a TLS etcd and passes their URLs in LOCKFS_ETCD_*; without
 * them every test that needs etcd is skipped.
 *
 * Each test works under its own key prefix, so the order of tests does not
 * matter.  Waits poll with a deadline; time bounds are asserted only where
 * the bound is the behaviour (a call never waits longer than timeout_ms).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lockfs/etcd_client.h"

#include "etcd_client_test_util.h"

/* ---- the pausable proxy (tests/fixtures/tcp_proxy.py) ---- */

struct proxy {
	pid_t pid;
	FILE *in, *out;
	int port;
};

static int url_port(const char *url)
{
	const char *colon = strrchr(url, ':');

	return colon ? atoi(colon + 1) : -1;
}

static bool proxy_start(struct proxy *p, int target_port)
{
	const char *fixtures = getenv("LOCKFS_ETCD_FIXTURES");
	char dir[4096], script[4200], line[64], target[16];
	int to_child[2], from_child[2];

	if (!fixtures)
		return false;
	snprintf(dir, sizeof(dir), "%s", fixtures);
	snprintf(script, sizeof(script), "%s/tcp_proxy.py", dirname(dir));
	snprintf(target, sizeof(target), "%d", target_port);
	assert_int_equal(pipe2(to_child, O_CLOEXEC), 0);
	assert_int_equal(pipe2(from_child, O_CLOEXEC), 0);
	p->pid = fork();
	assert_true(p->pid >= 0);
	if (p->pid == 0) {
		dup2(to_child[0], 0);
		dup2(from_child[1], 1);
		execl("/usr/bin/python3", "python3", script, "0", target, (char *)NULL);
		_exit(127);
	}
	close(to_child[0]);
	close(from_child[1]);
	p->in = fdopen(to_child[1], "w");
	p->out = fdopen(from_child[0], "r");
	assert_non_null(fgets(line, sizeof(line), p->out));
	assert_int_equal(sscanf(line, "listening %d", &p->port), 1);
	return true;
}

static void proxy_command(struct proxy *p, const char *cmd, const char *reply)
{
	char line[64];

	fprintf(p->in, "%s\n", cmd);
	fflush(p->in);
	assert_non_null(fgets(line, sizeof(line), p->out));
	line[strcspn(line, "\n")] = '\0';
	assert_string_equal(line, reply);
}

static void proxy_stop(struct proxy *p)
{
	int status;

	fclose(p->in);  /* end of its input ends it */
	fclose(p->out);
	assert_int_equal(waitpid(p->pid, &status, 0), p->pid);
}

static struct lockfs_etcd *client_via(struct proxy *p, int timeout_ms)
{
	char url[64];

	need_etcd();
	if (!proxy_start(p, url_port(etcd_url)))
		skip();
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", p->port);
	return client_for(url, timeout_ms);
}

static void test_watch_reports_a_broken_connection_with_its_resume_point(void **state)
{
	struct proxy p;
	struct lockfs_etcd *via = client_via(&p, 0), *c = client();
	struct collector col, col2;
	struct lockfs_etcd_watch *w;
	int64_t r1, missed;

	collector_init(&col);
	w = watch(via, "/t/broken/", 0, &col);
	r1 = put(c, "/t/broken/k", "before", 0);
	assert_true(await(&col, 1));
	proxy_command(&p, "drop", "dropped");
	assert_true(await(&col, -1));
	assert_int_equal(col.end.error, -ECONNRESET);
	assert_false(col.end.resync);
	assert_int_equal(col.end.next_revision, r1 + 1);
	lockfs_etcd_watch_close(w);

	/* What happened meanwhile arrives on the resumed watch. */
	missed = put(c, "/t/broken/k", "during", 0);
	collector_init(&col2);
	w = watch(via, "/t/broken/", col.end.next_revision, &col2);
	assert_true(await(&col2, 1));
	assert_string_equal(col2.ev[0].value, "during");
	assert_int_equal(col2.ev[0].mod_revision, missed);
	lockfs_etcd_watch_close(w);
	collector_destroy(&col);
	collector_destroy(&col2);
	proxy_stop(&p);
	lockfs_etcd_close(via);
	lockfs_etcd_close(c);
}

/* ---- The watch set: many watches on one WebSocket stream ---- */

struct wseen {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	int64_t a, b;            /* the ids of the two watches */
	int n_a, n_b, up, down;
	size_t b_len;            /* the length of the last value B saw */
	int64_t b_revs[16];
};

static void wcollect(void *arg, const struct lockfs_etcd_wset_msg *m)
{
	struct wseen *w = arg;

	pthread_mutex_lock(&w->mu);
	if (m->kind == LOCKFS_ETCD_WSET_UP)
		w->up++;
	else if (m->kind == LOCKFS_ETCD_WSET_DOWN)
		w->down++;
	for (size_t i = 0; m->kind == LOCKFS_ETCD_WSET_EVENTS && i < m->n_events; i++) {
		if (m->id == w->a) {
			w->n_a++;
		} else if (m->id == w->b && w->n_b < 16) {
			w->b_revs[w->n_b++] = m->events[i].kv.mod_revision;
			w->b_len = m->events[i].kv.value_len;
		}
	}
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->mu);
}

/* Wait (5 s at most) until *FIELD >= N. */
static bool wawait(struct wseen *w, const int *field, int n)
{
	int64_t end = now_ms() + 5000;
	bool ok;

	pthread_mutex_lock(&w->mu);
	while (*field < n && now_ms() < end) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&w->cond, &w->mu, &ts);
	}
	ok = *field >= n;
	pthread_mutex_unlock(&w->mu);
	return ok;
}

static void test_watch_set_carries_many_watches_and_large_frames(void **state)
{
	struct lockfs_etcd *c = client();
	struct wseen w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct lockfs_etcd_wset *s;
	size_t big_len = 200000;  /* a frame with a 64-bit length, likely in fragments */
	char *big = malloc(big_len + 1);
	int64_t r;

	assert_non_null(big);
	memset(big, 'v', big_len);
	big[big_len] = '\0';
	assert_int_equal(lockfs_etcd_wset_open(&s, c, 3000, wcollect, &w), 0);
	r = put(c, "/t/ws/mark", "m", 0);
	pthread_mutex_lock(&w.mu);
	w.a = lockfs_etcd_wset_add(s, "/t/ws/a", NULL, r + 1);
	w.b = lockfs_etcd_wset_add(s, "/t/ws/b/", "/t/ws/b0", r + 1);
	pthread_mutex_unlock(&w.mu);
	assert_true(w.a > 0 && w.b > 0 && w.a != w.b);
	assert_int_equal(lockfs_etcd_wset_count(s), 2);
	put(c, "/t/ws/a", "one", 0);
	put(c, "/t/ws/c", "outside both", 0);
	put(c, "/t/ws/b/x", big, 0);
	assert_true(wawait(&w, &w.n_a, 1));
	assert_true(wawait(&w, &w.n_b, 1));
	assert_int_equal(w.b_len, big_len);
	assert_int_equal(w.n_a, 1);
	assert_int_equal(w.n_b, 1);
	lockfs_etcd_wset_cancel(s, w.a);
	assert_int_equal(lockfs_etcd_wset_count(s), 1);
	put(c, "/t/ws/b/y", "small", 0);
	assert_true(wawait(&w, &w.n_b, 2));
	assert_int_equal(w.b_len, 5);
	lockfs_etcd_wset_close(s);
	free(big);
	lockfs_etcd_close(c);
}

static void test_watch_set_resumes_every_watch_after_a_broken_stream(void **state)
{
	struct proxy p;
	struct lockfs_etcd *via = client_via(&p, 0), *c = client();
	struct wseen w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct lockfs_etcd_wset *s;
	int64_t r, revs[3];

	assert_int_equal(lockfs_etcd_wset_open(&s, via, 3000, wcollect, &w), 0);
	assert_true(wawait(&w, &w.up, 1));
	r = put(c, "/t/wsr/mark", "m", 0);
	pthread_mutex_lock(&w.mu);
	w.b = lockfs_etcd_wset_add(s, "/t/wsr/k/", "/t/wsr/k0", r + 1);
	pthread_mutex_unlock(&w.mu);
	revs[0] = put(c, "/t/wsr/k/1", "before", 0);
	assert_true(wawait(&w, &w.n_b, 1));
	proxy_command(&p, "drop", "dropped");
	/* Written while the stream is down or coming back. */
	revs[1] = put(c, "/t/wsr/k/2", "during", 0);
	revs[2] = put(c, "/t/wsr/k/1", "after", 0);
	assert_true(wawait(&w, &w.down, 1));
	assert_true(wawait(&w, &w.up, 2));
	assert_true(wawait(&w, &w.n_b, 3));
	/* Each event once, in order: nothing missed, nothing repeated. */
	assert_int_equal(w.n_b, 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(w.b_revs[i], revs[i]);
	lockfs_etcd_wset_close(s);
	proxy_stop(&p);
	lockfs_etcd_close(via);
	lockfs_etcd_close(c);
}

static void test_watch_idle_timeout_ends_a_frozen_watch(void **state)
{
	struct proxy p;
	struct lockfs_etcd *via = client_via(&p, 0);
	struct lockfs_etcd_watch_req req = { .key = "/t/frozen/", .prefix = true, .idle_timeout_ms = 300 };
	struct collector col;
	struct lockfs_etcd_watch *w;

	collector_init(&col);
	assert_int_equal(lockfs_etcd_watch_open(&w, via, &req, collect, &col), 0);
	proxy_command(&p, "pause", "paused");
	assert_true(await(&col, -1));
	assert_int_equal(col.end.error, -ETIMEDOUT);
	assert_false(col.end.resync);
	lockfs_etcd_watch_close(w);
	proxy_command(&p, "resume", "resumed");
	collector_destroy(&col);
	proxy_stop(&p);
	lockfs_etcd_close(via);
}

static void test_watch_close_is_prompt_on_a_frozen_connection(void **state)
{
	struct proxy p;
	struct lockfs_etcd *via = client_via(&p, 0);
	struct collector col;
	struct lockfs_etcd_watch *w;
	int64_t t0;

	collector_init(&col);
	w = watch(via, "/t/frozen-close/", 0, &col);
	proxy_command(&p, "pause", "paused");
	t0 = now_ms();
	lockfs_etcd_watch_close(w);
	/* Woken at once: its own poll would wait up to 1 s. */
	assert_true(now_ms() - t0 < 150);
	assert_false(col.ended);
	proxy_command(&p, "resume", "resumed");
	collector_destroy(&col);
	proxy_stop(&p);
	lockfs_etcd_close(via);
}

static void test_call_through_a_frozen_connection_ends_within_the_bound(void **state)
{
	struct proxy p;
	struct lockfs_etcd *via = client_via(&p, 300);
	struct lockfs_etcd_status st;
	int64_t t0;

	assert_int_equal(lockfs_etcd_status(via, &st), 0);  /* a pooled connection now */
	proxy_command(&p, "pause", "paused");
	t0 = now_ms();
	assert_int_equal(lockfs_etcd_status(via, &st), -ETIMEDOUT);
	assert_true(now_ms() - t0 < 300 + 500);
	proxy_command(&p, "resume", "resumed");
	assert_int_equal(lockfs_etcd_status(via, &st), 0);
	proxy_stop(&p);
	lockfs_etcd_close(via);
}

/* ---- endpoints that do not answer ---- */

/* A loopback port nobody listens on. */
static int closed_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* A listening socket that never accepts: connections complete in the
 * kernel's backlog and then hear nothing, like a frozen server. */
static int blackhole(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 16), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

static void test_failover_skips_a_dead_first_endpoint(void **state)
{
	char urls[256];
	struct lockfs_etcd *c;
	struct lockfs_etcd_txn_resp r;
	struct lockfs_etcd_status st;
	int64_t t0;

	need_etcd();
	snprintf(urls, sizeof(urls), "http://127.0.0.1:%d;%s", closed_port(), etcd_url);
	c = client_for(urls, 0);
	t0 = now_ms();
	assert_int_equal(lockfs_etcd_status(c, &st), 0);
	/* A refused connection carried nothing: even a txn moves on. */
	assert_int_equal(create_if_absent(c, "/t/failover/k", "x", 0, &r), 0);
	assert_true(r.succeeded);
	assert_true(now_ms() - t0 < 1000);
	assert_true(guarded_delete(c, "/t/failover/k", r.revision));
	lockfs_etcd_txn_resp_free(&r);
	lockfs_etcd_close(c);
}

static void test_no_endpoint_listening_fails_with_eio_within_the_bound(void **state)
{
	char urls[256];
	struct lockfs_etcd *c;
	struct lockfs_etcd_txn_resp r;
	struct lockfs_etcd_op_resp got;
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = "/t/k" };
	int64_t t0, lease;

	snprintf(urls, sizeof(urls), "http://127.0.0.1:%d;http://127.0.0.1:%d",
		 closed_port(), closed_port());
	c = client_for(urls, 0);
	t0 = now_ms();
	assert_int_equal(lockfs_etcd_range(c, &op, &got), -EIO);
	assert_int_equal(create_if_absent(c, "/t/k", "x", 0, &r), -EIO);
	assert_int_equal(lockfs_etcd_lease_grant(c, 10, 0, &lease, NULL), -EIO);
	assert_true(now_ms() - t0 < LOCKFS_ETCD_TIMEOUT_MS);
	lockfs_etcd_close(c);
}

static void test_silent_endpoints_time_out_within_the_bound(void **state)
{
	int port1, port2, fd1 = blackhole(&port1), fd2 = blackhole(&port2);
	char urls[256];
	struct lockfs_etcd *c;
	struct lockfs_etcd_txn_resp r;
	struct lockfs_etcd_op_resp got;
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = "/t/k" };
	int64_t t0, took;

	snprintf(urls, sizeof(urls), "http://127.0.0.1:%d;http://127.0.0.1:%d", port1, port2);
	c = client_for(urls, 0);  /* the default bound: 1 s */
	t0 = now_ms();
	assert_int_equal(lockfs_etcd_range(c, &op, &got), -ETIMEDOUT);
	took = now_ms() - t0;
	assert_true(took >= LOCKFS_ETCD_TIMEOUT_MS - 50);
	assert_true(took < LOCKFS_ETCD_TIMEOUT_MS + 500);  /* slack for a loaded machine */
	t0 = now_ms();
	assert_int_equal(create_if_absent(c, "/t/k", "x", 0, &r), -ETIMEDOUT);
	took = now_ms() - t0;
	assert_true(took >= LOCKFS_ETCD_TIMEOUT_MS - 50);
	assert_true(took < LOCKFS_ETCD_TIMEOUT_MS + 500);
	lockfs_etcd_close(c);
	close(fd1);
	close(fd2);
}

static void test_silent_first_endpoint_reads_fail_over_and_next_call_skips_it(void **state)
{
	int port, fd;
	char urls[256];
	struct lockfs_etcd *c;
	struct lockfs_etcd_txn_resp r;
	struct lockfs_etcd_status st;
	int64_t t0;

	need_etcd();
	fd = blackhole(&port);
	snprintf(urls, sizeof(urls), "http://127.0.0.1:%d;%s", port, etcd_url);
	c = client_for(urls, 0);
	/* A read gets half the bound on the silent one, then succeeds. */
	t0 = now_ms();
	assert_int_equal(lockfs_etcd_status(c, &st), 0);
	assert_true(now_ms() - t0 < LOCKFS_ETCD_TIMEOUT_MS);
	lockfs_etcd_close(c);

	/* A txn waits for its answer as long as the bound allows, and then
	 * the next call starts at the endpoint after the silent one. */
	c = client_for(urls, 0);
	assert_int_equal(create_if_absent(c, "/t/silent/k", "x", 0, &r), -ETIMEDOUT);
	assert_false(exists(c, "/t/silent/k"));
	t0 = now_ms();
	assert_int_equal(create_if_absent(c, "/t/silent/k", "x", 0, &r), 0);
	assert_true(now_ms() - t0 < LOCKFS_ETCD_TIMEOUT_MS / 2);  /* not the silent one again */
	assert_true(r.succeeded);
	assert_true(guarded_delete(c, "/t/silent/k", r.revision));
	lockfs_etcd_txn_resp_free(&r);
	lockfs_etcd_close(c);
	close(fd);
}

/* A server that reads each request and resets the connection: the
 * request may have been applied, and no answer says whether. */
static void *resetter(void *arg)
{
	int lfd = *(int *)arg;

	for (;;) {
		struct linger lg = { 1, 0 };
		char buf[4096];
		int fd = accept(lfd, NULL, NULL);

		if (fd < 0)
			return NULL;  /* the test shut the socket down */
		(void)!read(fd, buf, sizeof(buf));
		setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		close(fd);
	}
}

static void test_a_write_that_may_have_arrived_is_not_resent(void **state)
{
	int port, lfd;
	pthread_t t;
	char urls[256];
	struct lockfs_etcd *c;
	struct lockfs_etcd_txn_resp r;
	struct lockfs_etcd_op_resp got;
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = "/t/resend/k" };
	int64_t lease;

	need_etcd();
	lfd = blackhole(&port);
	assert_int_equal(pthread_create(&t, NULL, resetter, &lfd), 0);
	snprintf(urls, sizeof(urls), "http://127.0.0.1:%d;%s", port, etcd_url);

	/* Sent again to the live endpoint, a txn could apply twice. */
	c = client_for(urls, 0);
	assert_int_equal(create_if_absent(c, "/t/resend/k", "x", 0, &r), -EIO);
	assert_true(lockfs_etcd_outcome_unknown(-EIO));
	assert_false(exists(c, "/t/resend/k"));
	lockfs_etcd_close(c);
	c = client_for(urls, 0);
	assert_int_equal(lockfs_etcd_lease_grant(c, 10, 0, &lease, NULL), -EIO);
	lockfs_etcd_close(c);
	/* A read is harmless to repeat: it moves on. */
	c = client_for(urls, 0);
	assert_int_equal(lockfs_etcd_range(c, &op, &got), 0);
	assert_int_equal(got.n_kvs, 0);
	lockfs_etcd_op_resp_free(&got);
	lockfs_etcd_close(c);

	shutdown(lfd, SHUT_RDWR);
	assert_int_equal(pthread_join(t, NULL), 0);
	close(lfd);
}

static void test_watch_start_fails_within_the_bound_when_nothing_answers(void **state)
{
	int port, fd = blackhole(&port);
	char urls[256];
	struct lockfs_etcd *c;
	struct lockfs_etcd_watch_req req = { .key = "/t/", .prefix = true };
	struct lockfs_etcd_watch *w;
	struct collector col;
	int64_t t0;

	collector_init(&col);
	snprintf(urls, sizeof(urls), "http://127.0.0.1:%d;http://127.0.0.1:%d", closed_port(), port);
	c = client_for(urls, 0);
	t0 = now_ms();
	assert_int_equal(lockfs_etcd_watch_open(&w, c, &req, collect, &col), -ETIMEDOUT);
	assert_null(w);
	assert_true(now_ms() - t0 < LOCKFS_ETCD_TIMEOUT_MS + 500);
	assert_int_equal(col.created, 0);
	lockfs_etcd_close(c);
	collector_destroy(&col);
	close(fd);
}

/* ---- TLS ---- */

static struct lockfs_etcd *tls_client(const char *cacert, const char *cert, const char *key)
{
	struct lockfs_etcd_config cfg = {
		.endpoints = getenv("LOCKFS_ETCD_TLS_URL"), .cacert = cacert, .cert = cert, .key = key,
	};
	struct lockfs_etcd *c;

	if (!cfg.endpoints)
		skip();
	assert_int_equal(lockfs_etcd_open(&c, &cfg), 0);
	return c;
}

static void test_tls_with_client_certificate(void **state)
{
	struct lockfs_etcd *c = tls_client(getenv("LOCKFS_ETCD_CACERT"), getenv("LOCKFS_ETCD_CERT"),
					   getenv("LOCKFS_ETCD_KEY"));
	struct lockfs_etcd_status st;
	struct lockfs_etcd_txn_resp r;
	struct collector col;
	struct lockfs_etcd_watch *w;

	assert_int_equal(lockfs_etcd_status(c, &st), 0);
	collector_init(&col);
	w = watch(c, "/t/tls/", 0, &col);
	assert_int_equal(create_if_absent(c, "/t/tls/k", "secret", 0, &r), 0);
	assert_true(r.succeeded);
	assert_true(await(&col, 1));
	assert_string_equal(col.ev[0].value, "secret");
	lockfs_etcd_watch_close(w);
	assert_true(guarded_delete(c, "/t/tls/k", r.revision));
	lockfs_etcd_txn_resp_free(&r);
	collector_destroy(&col);
	lockfs_etcd_close(c);
}

/* The watch set's WebSocket over TLS (libcurl makes the TLS connection,
 * websocket.c frames over it), with a value larger than one TLS record. */
static void test_watch_set_over_tls(void **state)
{
	struct lockfs_etcd *c = tls_client(getenv("LOCKFS_ETCD_CACERT"), getenv("LOCKFS_ETCD_CERT"),
					   getenv("LOCKFS_ETCD_KEY"));
	struct wseen w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct lockfs_etcd_wset *s;
	char big[40001];
	int64_t r;

	memset(big, 't', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_int_equal(lockfs_etcd_wset_open(&s, c, 3000, wcollect, &w), 0);
	r = put(c, "/t/wstls/mark", "m", 0);
	pthread_mutex_lock(&w.mu);
	w.b = lockfs_etcd_wset_add(s, "/t/wstls/k", NULL, r + 1);
	pthread_mutex_unlock(&w.mu);
	put(c, "/t/wstls/k", big, 0);
	assert_true(wawait(&w, &w.n_b, 1));
	assert_int_equal(w.b_len, sizeof(big) - 1);
	lockfs_etcd_wset_close(s);
	lockfs_etcd_close(c);
}

static void test_tls_refusals_are_eacces(void **state)
{
	const char *ca = getenv("LOCKFS_ETCD_CACERT");
	struct lockfs_etcd_status st;
	struct lockfs_etcd *c;

	/* No client certificate: etcd refuses us. */
	c = tls_client(ca, NULL, NULL);
	assert_int_equal(lockfs_etcd_status(c, &st), -EACCES);
	lockfs_etcd_close(c);
	/* A certificate from a CA etcd does not trust. */
	c = tls_client(ca, getenv("LOCKFS_ETCD_BAD_CERT"), getenv("LOCKFS_ETCD_BAD_KEY"));
	assert_int_equal(lockfs_etcd_status(c, &st), -EACCES);
	lockfs_etcd_close(c);
	/* A server we cannot verify (the system CAs do not know ours). */
	c = tls_client(NULL, getenv("LOCKFS_ETCD_CERT"), getenv("LOCKFS_ETCD_KEY"));
	assert_int_equal(lockfs_etcd_status(c, &st), -EACCES);
	lockfs_etcd_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_watch_reports_a_broken_connection_with_its_resume_point),
		cmocka_unit_test(test_watch_idle_timeout_ends_a_frozen_watch),
		cmocka_unit_test(test_watch_close_is_prompt_on_a_frozen_connection),
		cmocka_unit_test(test_call_through_a_frozen_connection_ends_within_the_bound),
		cmocka_unit_test(test_failover_skips_a_dead_first_endpoint),
		cmocka_unit_test(test_no_endpoint_listening_fails_with_eio_within_the_bound),
		cmocka_unit_test(test_silent_endpoints_time_out_within_the_bound),
		cmocka_unit_test(test_silent_first_endpoint_reads_fail_over_and_next_call_skips_it),
		cmocka_unit_test(test_a_write_that_may_have_arrived_is_not_resent),
		cmocka_unit_test(test_watch_start_fails_within_the_bound_when_nothing_answers),
		cmocka_unit_test(test_watch_set_carries_many_watches_and_large_frames),
		cmocka_unit_test(test_watch_set_resumes_every_watch_after_a_broken_stream),
		cmocka_unit_test(test_tls_with_client_certificate),
		cmocka_unit_test(test_watch_set_over_tls),
		cmocka_unit_test(test_tls_refusals_are_eacces),
	};

	signal(SIGPIPE, SIG_IGN);  /* a proxy that died must fail a test, not kill us */
	etcd_url = getenv("LOCKFS_ETCD_URL");
	if (!etcd_url)
		fprintf(stderr, "LOCKFS_ETCD_URL is not set: the tests that need etcd are skipped "
			"(run through tests/fixtures/etcd_fixtures.py exec --tls)\n");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
