/*
 * The transport: endpoints, failover, TLS, the per-call time bound, and a
 * pool of libcurl handles so that calls from many threads each reuse an
 * open connection.  docs/etcd.md "Transport" says why it is built so.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Idle handles kept per client; more concurrent calls make more, which
 * are freed on return. */
#define POOL_MAX 16

/* One libcurl handle and the buffer its answers go to.  Owned by one call
 * at a time (taken from and returned to the pool under pool_mu). */
struct easy {
	struct easy *next;
	CURL *curl;
	char errbuf[CURL_ERROR_SIZE];
	char *body;     /* the answer being received */
	size_t len, cap;
	bool too_big;
	/* A transfer completed on this handle: its connection is kept, and
	 * the next request goes out on it. */
	bool connected;
};

/* Did the last call of this thread perhaps reach etcd twice?  See
 * lockfs_etcd_last_call_resent(): a per-thread fact about one call,
 * read by its caller right after it. */
static __thread bool last_call_resent;

struct lockfs_etcd {
	/* Immutable after lockfs_etcd_open(). */
	char **endpoints;
	size_t n_endpoints;
	char *cacert, *cert, *key;
	int timeout_ms;
	struct curl_slist *headers;

	/* The endpoint a call tries first: the last one that answered. */
	atomic_size_t preferred;

	pthread_mutex_t pool_mu;
	struct easy *pool;   /* idle handles, most recently used first; protected by pool_mu */
	size_t pool_len;     /* protected by pool_mu */
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

/* libcurl's global state, made once and never torn down (its cleanup is
 * not thread-safe and a daemon keeps its client to the end). */
static void global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_ALL);
}

int64_t lockfs_etcd_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A copy of FILE (NULL stays NULL) after checking it can be read.
 * 0 or -errno. */
static int tls_file(const char *file, char **copy)
{
	int fd;

	*copy = NULL;
	if (!file)
		return 0;
	fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	close(fd);
	*copy = strdup(file);
	return *copy ? 0 : -ENOMEM;
}

/* Split SPEC on ';' into c->endpoints.  0, -EINVAL, -ENOMEM. */
static int parse_endpoints(struct lockfs_etcd *c, const char *spec)
{
	const char *p = spec;

	if (!spec || !*spec)
		return -EINVAL;
	for (;;) {
		size_t n = strcspn(p, ";"), host;
		const char *rest;
		char *url, **grown;

		while (n && p[n - 1] == '/')
			n--;  /* "http://h:1/" names the same endpoint */
		if (n > 8 && !strncmp(p, "https://", 8))
			host = 8;
		else if (n > 7 && !strncmp(p, "http://", 7))
			host = 7;
		else
			return -EINVAL;
		rest = memchr(p + host, '/', n - host);
		if (rest || memchr(p, ' ', n))
			return -EINVAL;  /* a path, or a stray space: a typo */
		url = strndup(p, n);
		grown = realloc(c->endpoints, (c->n_endpoints + 1) * sizeof(*grown));
		if (!url || !grown) {
			free(url);
			if (grown)
				c->endpoints = grown;
			return -ENOMEM;
		}
		c->endpoints = grown;
		c->endpoints[c->n_endpoints++] = url;
		p += strcspn(p, ";");
		if (!*p)
			return 0;
		p++;
	}
}

int lockfs_etcd_open(struct lockfs_etcd **out, const struct lockfs_etcd_config *cfg)
{
	struct lockfs_etcd *c;
	int rc;

	*out = NULL;
	if (!cfg || !cfg->cert != !cfg->key || cfg->timeout_ms < 0 ||
	    cfg->timeout_ms > LOCKFS_ETCD_TIMEOUT_MAX_MS)
		return -EINVAL;
	pthread_once(&global_once, global_init);
	if (global_rc != CURLE_OK)
		return -EIO;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->pool_mu, NULL);
	c->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : LOCKFS_ETCD_TIMEOUT_MS;
	rc = parse_endpoints(c, cfg->endpoints);
	if (!rc)
		rc = tls_file(cfg->cacert, &c->cacert);
	if (!rc)
		rc = tls_file(cfg->cert, &c->cert);
	if (!rc)
		rc = tls_file(cfg->key, &c->key);
	if (!rc) {
		/* Empty "Expect:": never wait for a "100 Continue" (libcurl
		 * asks for one above 1 MiB, etcd takes up to 1.5 MiB). */
		struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");

		if (h)
			c->headers = h;
		if (!h || !curl_slist_append(h, "Expect:"))
			rc = -ENOMEM;
	}
	if (rc) {
		lockfs_etcd_close(c);
		return rc;
	}
	*out = c;
	return 0;
}

void lockfs_etcd_close(struct lockfs_etcd *c)
{
	if (!c)
		return;
	while (c->pool) {
		struct easy *e = c->pool;

		c->pool = e->next;
		curl_easy_cleanup(e->curl);
		free(e->body);
		free(e);
	}
	for (size_t i = 0; i < c->n_endpoints; i++)
		free(c->endpoints[i]);
	free(c->endpoints);
	free(c->cacert);
	free(c->cert);
	free(c->key);
	curl_slist_free_all(c->headers);
	pthread_mutex_destroy(&c->pool_mu);
	free(c);
}

size_t lockfs_etcd_endpoint_count(const struct lockfs_etcd *c)
{
	return c->n_endpoints;
}

const char *lockfs_etcd_endpoint(const struct lockfs_etcd *c, size_t i)
{
	return i < c->n_endpoints ? c->endpoints[i] : NULL;
}

int lockfs_etcd_timeout_ms(const struct lockfs_etcd *c)
{
	return c->timeout_ms;
}

size_t lockfs_etcd_preferred(struct lockfs_etcd *c)
{
	return atomic_load(&c->preferred) % c->n_endpoints;
}

void lockfs_etcd_endpoint_failed(struct lockfs_etcd *c, size_t i)
{
	size_t expected = i;

	/* Only if nobody moved on meanwhile: two threads failing on one
	 * endpoint must not skip the next one. */
	atomic_compare_exchange_strong(&c->preferred, &expected, (i + 1) % c->n_endpoints);
}

void lockfs_etcd_endpoint_answered(struct lockfs_etcd *c, size_t i)
{
	atomic_store(&c->preferred, i);
}

bool lockfs_etcd_last_call_resent(void)
{
	return last_call_resent;
}

bool lockfs_etcd_outcome_unknown(int rc)
{
	return rc == -ETIMEDOUT || rc == -EIO || rc == -EAGAIN || rc == -EPROTO;
}

int lockfs_etcd_worse(int a, int b)
{
	static const int order[] = { -ENOMEM, -EACCES, -ETIMEDOUT, -EAGAIN, -EPROTO, -EIO };

	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
		if (a == order[i] || b == order[i])
			return order[i];
	return a ? a : b;
}

int lockfs_etcd_easy_setup(const struct lockfs_etcd *c, CURL *curl)
{
	CURLcode r = CURLE_OK;

#define SET(opt, val) do { if (r == CURLE_OK) r = curl_easy_setopt(curl, opt, val); } while (0)
	SET(CURLOPT_NOSIGNAL, 1L);               /* threads: no SIGALRM for timeouts */
	SET(CURLOPT_PROXY, "");                  /* never through $http_proxy */
	SET(CURLOPT_PROTOCOLS_STR, "http,https");
	SET(CURLOPT_FOLLOWLOCATION, 0L);
	SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	SET(CURLOPT_HTTPHEADER, c->headers);
	SET(CURLOPT_POST, 1L);
	SET(CURLOPT_TCP_NODELAY, 1L);
	/* A peer host that died leaves no reset behind: probe idle
	 * connections (a pooled one, or a quiet watch). */
	SET(CURLOPT_TCP_KEEPALIVE, 1L);
	SET(CURLOPT_TCP_KEEPIDLE, 5L);
	SET(CURLOPT_TCP_KEEPINTVL, 2L);
	/* TLS 1.2 at most: there a server that refuses our certificate says
	 * so in the handshake, before any request is sent.  In TLS 1.3 the
	 * refusal comes after, and races with our request (a reset or an
	 * alert, by chance), so it could not be told from a broken
	 * connection. */
	SET(CURLOPT_SSLVERSION, (long)(CURL_SSLVERSION_TLSv1_2 | CURL_SSLVERSION_MAX_TLSv1_2));
	if (c->cacert)
		SET(CURLOPT_CAINFO, c->cacert);
	if (c->cert) {
		SET(CURLOPT_SSLCERT, c->cert);
		SET(CURLOPT_SSLKEY, c->key);
	}
#undef SET
	if (r == CURLE_OUT_OF_MEMORY)
		return -ENOMEM;
	return r == CURLE_OK ? 0 : -EIO;
}

/* Append what libcurl received to the handle's buffer. */
static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct easy *e = arg;
	size_t n = size * nmemb;

	if (e->len + n + 1 > e->cap) {
		size_t cap = e->cap ? e->cap : 4096;
		char *grown;

		while (cap < e->len + n + 1)
			cap *= 2;
		if (cap > LOCKFS_ETCD_BODY_MAX) {
			e->too_big = true;
			return 0;  /* aborts the transfer */
		}
		grown = realloc(e->body, cap);
		if (!grown)
			return 0;
		e->body = grown;
		e->cap = cap;
	}
	memcpy(e->body + e->len, data, n);
	e->len += n;
	e->body[e->len] = '\0';
	return n;
}

/* An idle handle from the pool, or a new one.  NULL: no memory. */
static struct easy *easy_get(struct lockfs_etcd *c)
{
	struct easy *e;

	pthread_mutex_lock(&c->pool_mu);
	e = c->pool;
	if (e) {
		c->pool = e->next;
		c->pool_len--;
	}
	pthread_mutex_unlock(&c->pool_mu);
	if (e)
		return e;
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->curl = curl_easy_init();
	if (!e->curl || lockfs_etcd_easy_setup(c, e->curl) ||
	    curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_body) != CURLE_OK ||
	    curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, e) != CURLE_OK ||
	    curl_easy_setopt(e->curl, CURLOPT_ERRORBUFFER, e->errbuf) != CURLE_OK) {
		if (e->curl)
			curl_easy_cleanup(e->curl);
		free(e);
		return NULL;
	}
	return e;
}

static void easy_put(struct lockfs_etcd *c, struct easy *e)
{
	pthread_mutex_lock(&c->pool_mu);
	if (c->pool_len < POOL_MAX) {
		e->next = c->pool;
		c->pool = e;
		c->pool_len++;
		e = NULL;
	}
	pthread_mutex_unlock(&c->pool_mu);
	if (e) {
		curl_easy_cleanup(e->curl);
		free(e->body);
		free(e);
	}
}

int lockfs_etcd_curl_errno(CURL *curl, CURLcode res, const char *errbuf, bool *sent)
{
	long size = 0;

	/* Bytes of the request sent: 0 when the connection (or its TLS
	 * handshake) failed, so etcd cannot have seen it. */
	if (curl_easy_getinfo(curl, CURLINFO_REQUEST_SIZE, &size) != CURLE_OK)
		size = 1;  /* unknown: assume it left */
	*sent = size > 0;
	switch (res) {
	case CURLE_OUT_OF_MEMORY:
		return -ENOMEM;
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_PEER_FAILED_VERIFICATION:
	case CURLE_SSL_CERTPROBLEM:
	case CURLE_SSL_CACERT_BADFILE:
	case CURLE_SSL_ISSUER_ERROR:
		return -EACCES;
	case CURLE_SSL_CONNECT_ERROR:
		/* etcd refusing our certificate (or its absence): an alert
		 * in the handshake, "sslv3 alert bad certificate". */
		if (errbuf && strstr(errbuf, "alert") && strstr(errbuf, "certificate"))
			return -EACCES;
		return -EIO;
	default:
		return -EIO;
	}
}

/* The result of an HTTP answer STATUS with body E->body: 0 and *OUT for
 * 200 with a JSON object, else the mapped error. */
static int answer(const struct easy *e, long status, json_t **out)
{
	json_t *j = e->len ? json_loadb(e->body, e->len, 0, NULL) : NULL;
	int64_t code;

	if (!json_is_object(j)) {
		json_decref(j);
		return -EPROTO;
	}
	if (status == 200) {
		*out = j;
		return 0;
	}
	/* A unary error: {"error":"...","message":"...","code":N}. */
	if (lockfs_etcd_get_int64(j, "code", &code) || !json_object_get(j, "code"))
		code = -1;
	/* A cluster with authentication on, asked without a user, says
	 * "user name is empty" as INVALID_ARGUMENT: it refuses us. */
	if (code == 3 && json_is_string(json_object_get(j, "message")) &&
	    strstr(json_string_value(json_object_get(j, "message")), "user name is empty"))
		code = 16;
	json_decref(j);
	return code < 0 ? -EPROTO : (code == 0 ? -EIO : lockfs_etcd_grpc_errno(code));
}

int lockfs_etcd_post(struct lockfs_etcd *c, const char *path, json_t *body,
		     enum lockfs_etcd_resend resend, json_t **out)
{
	int64_t deadline = lockfs_etcd_now_ms() + c->timeout_ms;
	size_t first = lockfs_etcd_preferred(c);
	char *text = json_dumps(body, JSON_COMPACT);
	struct easy *e = text ? easy_get(c) : NULL;
	char url[2048];
	bool reached = false; /* a copy of the request may have reached etcd */
	int worst = 0;

	*out = NULL;
	last_call_resent = false;
	if (!e) {
		free(text);
		return -ENOMEM;
	}
	for (size_t tried = 0; tried < c->n_endpoints; tried++) {
		size_t i = (first + tried) % c->n_endpoints;
		int64_t left = deadline - lockfs_etcd_now_ms();
		/* Each endpoint still to try gets a fair share of what is
		 * left to connect (and, for a call that may be resent, to
		 * answer): one dead or silent endpoint cannot use it all. */
		long share = (long)(left / (int64_t)(c->n_endpoints - tried));
		CURLcode res;
		long status = 0;
		bool sent;
		int rc;

		if (left <= 0) {
			worst = lockfs_etcd_worse(worst, -ETIMEDOUT);
			break;
		}
		/* A copy that may have reached etcd goes again: say so. */
		if (reached)
			last_call_resent = true;
		if (share < 1)
			share = 1;
		if ((size_t)snprintf(url, sizeof(url), "%s%s", c->endpoints[i], path) >= sizeof(url)) {
			worst = -EINVAL;
			break;
		}
		e->len = 0;
		e->too_big = false;
		e->errbuf[0] = '\0';
		curl_easy_setopt(e->curl, CURLOPT_URL, url);
		curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, text);
		curl_easy_setopt(e->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(text));
		curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, share);
		curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS,
				 resend == LOCKFS_ETCD_RESEND ? share : (long)left);
		res = curl_easy_perform(e->curl);
		if (res == CURLE_OK) {
			long connects = 0;

			reached = true;

			/* libcurl sends a request again, on a new connection,
			 * when the kept one died before any answer came -- also
			 * after etcd had taken the first copy.  A new connect
			 * where one was kept may be that. */
			curl_easy_getinfo(e->curl, CURLINFO_NUM_CONNECTS, &connects);
			last_call_resent = last_call_resent || (e->connected && connects > 0);
			e->connected = true;
			curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &status);
			rc = answer(e, status, out);
			if (rc == -EPROTO) {
				/* Not etcd's answer (a 404 page, a proxy's
				 * error page): this endpoint cannot serve, and
				 * must not stay the preferred one.  A call that
				 * may not be resent stops here all the same:
				 * something did take it. */
				lockfs_etcd_endpoint_failed(c, i);
				worst = lockfs_etcd_worse(worst, rc);
				if (resend == LOCKFS_ETCD_ONCE)
					break;
				continue;
			}
			if (rc != -EAGAIN && rc != -ETIMEDOUT) {
				lockfs_etcd_endpoint_answered(c, i);
				worst = rc;
				break;
			}
			/* This member cannot serve now (no leader, or etcd's
			 * own timeout): another may. */
			lockfs_etcd_endpoint_failed(c, i);
			worst = lockfs_etcd_worse(worst, rc);
			if (resend == LOCKFS_ETCD_ONCE)
				break;
			continue;
		}
		e->connected = false;
		rc = e->too_big ? -EPROTO : lockfs_etcd_curl_errno(e->curl, res, e->errbuf, &sent);
		reached = reached || sent;
		lockfs_etcd_endpoint_failed(c, i);
		worst = lockfs_etcd_worse(worst, rc);
		if (rc == -ENOMEM || (sent && resend == LOCKFS_ETCD_ONCE))
			break;
	}
	easy_put(c, e);
	free(text);
	return worst ? worst : 0;
}
