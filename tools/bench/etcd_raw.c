/*
 * etcd_raw: the raw etcd baseline for issue 11's "an uncontended mkdir+rmdir
 * through the mount costs at most 1.2x the raw etcd pair".
 *
 *   etcd_raw [--smoke] [--rounds R] [--pairs N] [--prefix P] [--gap-us G [--spin]] [URL]
 *
 * A pair is the two transactions the etcd backend issues for an
 * uncontended mkdir + rmdir (core/backend/etcd.c, docs/etcd.md), the same
 * bodies byte for byte in meaning:
 *   acquire  (try-lock) txn: if no key exists in NAME's range R(NAME)
 *            (version == 0 over [PREFIX NAME/, PREFIX NAME0)), put KEY=RECORD
 *            with the session lease;
 *   release  txn: if create_revision(KEY) == the revision the acquire
 *            made it at, delete KEY (never a plain delete by name).
 * KEY is PREFIX NAME/<lease, 16 hex digits>-<sequence>, as the backend
 * makes it, and RECORD a 420-byte JSON record like lockfs's.
 *
 * Two clients, interleaved round by round (their order alternating) on
 * one etcd: "raw", libcurl with prebuilt bodies on one reused connection
 * (the floor: etcd's round trips and little else), and "client", the same
 * transactions through lockfs's etcd client (include/lockfs/etcd_client.h).
 * Prints, per client, p50/p99 of each transaction and of the pair over all
 * rounds, and the median of the rounds' pairs/s.  Each round is preceded
 * by an untimed warm-up.  Any failed or lost transaction stops the run with
 * exit status 1, so an error path is never timed.
 *
 * --smoke: one round of 20 pairs (for CI: does it still run?).
 * --gap-us G: the client pauses G µs after each transaction, outside the
 * times taken (a diagnostic, never the floor: what etcd's own work per
 * transaction becomes when its client thinks between calls, as a daemon
 * does; on a small machine etcd's idle-to-busy wake-ups cost CPU).  The
 * pairs/s then count the pauses; the p50s do not.
 * --spin: the pause keeps a CPU busy (the client loops on the clock)
 * instead of sleeping, as a FUSE round trip keeps one busy (the caller,
 * the kernel, the daemon's thread) while etcd waits for the next call;
 * and it ends on time, where a sleep overshoots by the timer slack.
 * --prefix P: the keys go under P "bench-raw-<pid>/" instead of a prefix of
 * their own, so that daemons watching P get every event (bench_etcd.sh's
 * etcd-raw-watched: what etcd's watch fan-out costs by itself).
 * URL defaults to $LOCKFS_ETCD_URL.  Run against a fresh etcd:
 *   tests/fixtures/etcd_fixtures.py exec -- build/tools/bench/etcd_raw
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "lockfs/etcd_client.h"

#define WARMUP 20

/* --gap-us: the pause after each transaction (0: none, the floor). */
static long gap_us;
static bool gap_spin;   /* --spin: busy, not asleep */
#define NAME_MAX_KEY 128

static const char RECORD[] =
	"{\"resource\":\"bench\",\"bound\":\"process\",\"holder\":{\"pid\":10336,"
	"\"start_time\":67284,\"uid\":0,\"user\":\"root\",\"gid\":0,\"comm\":\"bash\","
	"\"cmdline\":[\"bash\",\"-s\"],\"host\":\"h1\",\"boot_id\":"
	"\"d02d5dc7-1f48-45a5-9e89-0e4a6c7d05d1\"},\"acquired_at\":"
	"\"2026-11-29T16:58:14.933Z\",\"acquired_at_ms\":1795971494933,\"operation\":"
	"\"migrating db\",\"slug\":null,\"lease\":null,\"fence\":1027,\"token\":"
	"\"a711a590c7ab1f75b79a4a49018e59a9\",\"key\":\"/lockfs-bench/x\",\"lease_id\":"
	"\"7587883462617392661\",\"create_revision\":1027,\"padding\":\"xxxxxxxxx\"}";

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The --gap-us pause; returns the time it took (µs), to leave out. */
static double pause_gap(void)
{
	struct timespec g = { gap_us / 1000000, gap_us % 1000000 * 1000 };
	double t0;

	if (!gap_us)
		return 0;
	t0 = now_us();
	if (gap_spin) {
		while (now_us() - t0 < (double)gap_us)
			;
		return now_us() - t0;
	}
	while (nanosleep(&g, &g) == -1 && errno == EINTR)
		;
	return now_us() - t0;
}

static void die(const char *what, const char *detail)
{
	fprintf(stderr, "etcd_raw: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
	exit(1);
}

/* What one pair needs to know. */
struct names {
	char key[NAME_MAX_KEY + 24];  /* PREFIX NAME/<lease, 16 hex>-1 */
	char range[NAME_MAX_KEY];  /* PREFIX NAME/ */
	char range_end[NAME_MAX_KEY];  /* PREFIX NAME0: the end of R(NAME) */
	int64_t lease;
};

/* ---- raw: libcurl and prebuilt bodies ---- */

static char *b64(const char *s)
{
	static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t len = strlen(s), o = 0;
	const unsigned char *in = (const unsigned char *)s;
	char *out = malloc(4 * ((len + 2) / 3) + 1);

	if (!out)
		die("out of memory", NULL);
	for (size_t i = 0; i < len; i += 3) {
		unsigned v = in[i] << 16 | (i + 1 < len ? in[i + 1] << 8 : 0) |
			     (i + 2 < len ? in[i + 2] : 0);

		out[o++] = A[v >> 18 & 63];
		out[o++] = A[v >> 12 & 63];
		out[o++] = i + 1 < len ? A[v >> 6 & 63] : '=';
		out[o++] = i + 2 < len ? A[v & 63] : '=';
	}
	out[o] = '\0';
	return out;
}

struct raw {
	CURL *curl;
	struct curl_slist *headers;
	char url[512];
	char *acquire_body;   /* constant: the key is the same every pair */
	char *key_b64;
	char *buf;
	size_t len, cap;
};

static size_t raw_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct raw *r = arg;
	size_t n = size * nmemb;

	if (r->len + n + 1 > r->cap) {
		r->cap = (r->len + n + 1) * 2;
		r->buf = realloc(r->buf, r->cap);
		if (!r->buf)
			return 0;
	}
	memcpy(r->buf + r->len, data, n);
	r->len += n;
	return n;
}

static void raw_init(struct raw *r, const char *url, const struct names *nm)
{
	char *key = b64(nm->key), *range = b64(nm->range), *value = b64(RECORD), *range_end;
	char end[NAME_MAX_KEY];
	size_t n;

	memset(r, 0, sizeof(*r));
	n = lockfs_etcd_prefix_end(nm->range, strlen(nm->range), end);
	end[n] = '\0';
	range_end = b64(end);
	snprintf(r->url, sizeof(r->url), "%s/v3/kv/txn", url);
	if (asprintf(&r->acquire_body,
		     "{\"compare\":[{\"key\":\"%s\",\"range_end\":\"%s\",\"target\":\"VERSION\","
		     "\"result\":\"EQUAL\",\"version\":\"0\"}],"
		     "\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%" PRId64 "\"}}]}",
		     range, range_end, key, value, nm->lease) < 0)
		die("out of memory", NULL);
	r->key_b64 = key;
	free(range);
	free(value);
	free(range_end);
	r->curl = curl_easy_init();
	r->headers = curl_slist_append(NULL, "Content-Type: application/json");
	if (!r->curl || !r->headers)
		die("curl_easy_init failed", NULL);
	curl_easy_setopt(r->curl, CURLOPT_URL, r->url);
	curl_easy_setopt(r->curl, CURLOPT_HTTPHEADER, r->headers);
	curl_easy_setopt(r->curl, CURLOPT_PROXY, "");
	curl_easy_setopt(r->curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(r->curl, CURLOPT_TIMEOUT_MS, 5000L);
	curl_easy_setopt(r->curl, CURLOPT_WRITEFUNCTION, raw_write);
	curl_easy_setopt(r->curl, CURLOPT_WRITEDATA, r);
}

/* POST BODY; the parsed answer's "succeeded" and header.revision. */
static void raw_txn(struct raw *r, const char *body, bool *succeeded, int64_t *revision,
		    json_t **out)
{
	long status = 0;
	json_t *j;
	const char *rev;

	r->len = 0;
	curl_easy_setopt(r->curl, CURLOPT_POSTFIELDS, body);
	if (curl_easy_perform(r->curl) != CURLE_OK)
		die("raw txn failed", r->url);
	curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &status);
	j = json_loadb(r->buf, r->len, 0, NULL);
	if (status != 200 || !j)
		die("raw txn refused", r->len ? r->buf : NULL);
	*succeeded = json_is_true(json_object_get(j, "succeeded"));
	rev = json_string_value(json_object_get(json_object_get(j, "header"), "revision"));
	*revision = rev ? strtoll(rev, NULL, 10) : 0;
	*out = j;
}

/* One pair; the time of each transaction in *T_ACQ, *T_REL (µs). */
static void raw_pair(struct raw *r, double *t_acq, double *t_rel)
{
	char body[1024];
	bool won, released;
	int64_t rev, rev2;
	json_t *j;
	double t0 = now_us(), t1, paused;

	raw_txn(r, r->acquire_body, &won, &rev, &j);
	t1 = now_us();
	json_decref(j);
	/* Uncontended: the range was empty, our put made KEY at REV. */
	if (!won)
		die("raw acquire did not win (is another run using this etcd?)", NULL);
	snprintf(body, sizeof(body),
		 "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"result\":\"EQUAL\","
		 "\"create_revision\":\"%" PRId64 "\"}],"
		 "\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}]}",
		 r->key_b64, rev, r->key_b64);
	paused = pause_gap();
	raw_txn(r, body, &released, &rev2, &j);
	json_decref(j);
	if (!released)
		die("raw release did not delete the key", NULL);
	*t_acq = t1 - t0;
	*t_rel = now_us() - t1 - paused;
	(void)pause_gap();
}

static void raw_free(struct raw *r)
{
	curl_easy_cleanup(r->curl);
	curl_slist_free_all(r->headers);
	free(r->acquire_body);
	free(r->key_b64);
	free(r->buf);
}

/* ---- client: the same two transactions through lockfs's client ---- */

static void client_pair(struct lockfs_etcd *c, const struct names *nm, double *t_acq,
			double *t_rel)
{
	struct lockfs_etcd_compare none = {
		.key = nm->range, .range_end = nm->range_end, .target = LOCKFS_ETCD_VERSION,
	};
	struct lockfs_etcd_op put = {
		.type = LOCKFS_ETCD_PUT, .key = nm->key, .value = RECORD,
		.value_len = sizeof(RECORD) - 1, .lease = nm->lease,
	};
	struct lockfs_etcd_txn acquire = {
		.compare = &none, .n_compare = 1, .success = &put, .n_success = 1,
	};
	struct lockfs_etcd_op del = { .type = LOCKFS_ETCD_DELETE, .key = nm->key };
	struct lockfs_etcd_compare mine = {
		.key = nm->key, .target = LOCKFS_ETCD_CREATE, .result = LOCKFS_ETCD_EQUAL,
	};
	struct lockfs_etcd_txn release = { .compare = &mine, .n_compare = 1, .success = &del, .n_success = 1 };
	struct lockfs_etcd_txn_resp r;
	double t0 = now_us(), t1, paused;
	int rc;

	rc = lockfs_etcd_txn(c, &acquire, &r);
	t1 = now_us();
	if (rc)
		die("client acquire failed", strerror(-rc));
	if (!r.succeeded)
		die("client acquire did not win (is another run using this etcd?)", NULL);
	mine.number = r.revision;
	lockfs_etcd_txn_resp_free(&r);
	paused = pause_gap();
	rc = lockfs_etcd_txn(c, &release, &r);
	if (rc)
		die("client release failed", strerror(-rc));
	if (!r.succeeded)
		die("client release did not delete the key", NULL);
	lockfs_etcd_txn_resp_free(&r);
	*t_acq = t1 - t0;
	*t_rel = now_us() - t1 - paused;
	(void)pause_gap();
}

/* ---- figures ---- */

struct series {
	double *acq, *rel, *pair, *rate;
	size_t n, rounds;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The P-th percentile (nearest rank) of N values V (sorted in place). */
static double pct(double *v, size_t n, double p)
{
	size_t rank;

	qsort(v, n, sizeof(*v), cmp_double);
	rank = (size_t)(p / 100.0 * (double)n + 0.999999);
	return v[rank ? rank - 1 : 0];
}

static void report(const char *label, struct series *s)
{
	printf("%-7s acquire p50 %7.0f p99 %7.0f | release p50 %7.0f p99 %7.0f | "
	       "pair p50 %7.0f p99 %7.0f us | %6.0f pairs/s\n", label,
	       pct(s->acq, s->n, 50), pct(s->acq, s->n, 99), pct(s->rel, s->n, 50),
	       pct(s->rel, s->n, 99), pct(s->pair, s->n, 50), pct(s->pair, s->n, 99),
	       pct(s->rate, s->rounds, 50));
}

static void usage(void)
{
	fprintf(stderr, "usage: etcd_raw [--smoke] [--rounds R] [--pairs N] [--prefix P] [--gap-us G [--spin]] [URL]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *url = getenv("LOCKFS_ETCD_URL");
	const char *prefix = NULL;
	int rounds = 5, pairs = 1000;
	struct lockfs_etcd_config cfg = { .timeout_ms = 5000 };
	struct lockfs_etcd *c;
	struct names nm;
	struct raw raw;
	struct series s[2];
	int rc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--smoke")) {
			rounds = 1;
			pairs = 20;
		} else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
			rounds = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) {
			pairs = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--prefix") && i + 1 < argc) {
			prefix = argv[++i];
		} else if (!strcmp(argv[i], "--gap-us") && i + 1 < argc) {
			gap_us = atol(argv[++i]);
			if (gap_us < 0 || gap_us > 1000000)
				usage();
		} else if (!strcmp(argv[i], "--spin")) {
			gap_spin = true;
		} else if (argv[i][0] == '-') {
			usage();
		} else {
			url = argv[i];
		}
	}
	if (!url || rounds < 1 || pairs < 1)
		usage();
	cfg.endpoints = url;
	rc = lockfs_etcd_open(&c, &cfg);
	if (rc)
		die("bad URL", strerror(-rc));
	/* The daemon's session lease: one per daemon, granted once. */
	rc = lockfs_etcd_lease_grant(c, 60, 0, &nm.lease, NULL);
	if (rc)
		die("cannot grant a lease", strerror(-rc));
	if (prefix)
		snprintf(nm.range, sizeof(nm.range), "%sbench-raw-%d/", prefix, (int)getpid());
	else
		snprintf(nm.range, sizeof(nm.range), "/lockfs-bench-%d/bench/", (int)getpid());
	snprintf(nm.key, sizeof(nm.key), "%s%016" PRIx64 "-1", nm.range, (uint64_t)nm.lease);
	nm.range_end[lockfs_etcd_prefix_end(nm.range, strlen(nm.range), nm.range_end)] = '\0';
	raw_init(&raw, url, &nm);

	for (int k = 0; k < 2; k++) {
		s[k].n = 0;
		s[k].rounds = 0;
		s[k].acq = calloc((size_t)rounds * pairs, sizeof(double));
		s[k].rel = calloc((size_t)rounds * pairs, sizeof(double));
		s[k].pair = calloc((size_t)rounds * pairs, sizeof(double));
		s[k].rate = calloc((size_t)rounds, sizeof(double));
		if (!s[k].acq || !s[k].rel || !s[k].pair || !s[k].rate)
			die("out of memory", NULL);
	}
	printf("etcd_raw: %d round(s) x %d pairs per client, interleaved, on %s\n",
	       rounds, pairs, url);
	for (int round = 0; round < rounds; round++) {
		for (int step = 0; step < 2; step++) {
			int k = (round + step) % 2;   /* 0 raw, 1 client; order alternates */
			struct series *cur = &s[k];
			double a, b, t0;

			for (int i = 0; i < WARMUP; i++)
				k ? client_pair(c, &nm, &a, &b) : raw_pair(&raw, &a, &b);
			t0 = now_us();
			for (int i = 0; i < pairs; i++) {
				k ? client_pair(c, &nm, &a, &b) : raw_pair(&raw, &a, &b);
				cur->acq[cur->n] = a;
				cur->rel[cur->n] = b;
				cur->pair[cur->n++] = a + b;
			}
			cur->rate[cur->rounds++] = pairs / ((now_us() - t0) / 1e6);
		}
	}
	report("raw", &s[0]);
	report("client", &s[1]);
	{
		double raw50 = pct(s[0].pair, s[0].n, 50), cl50 = pct(s[1].pair, s[1].n, 50);

		printf("client/raw pair p50: %.2fx\n", cl50 / raw50);
	}
	rc = lockfs_etcd_lease_revoke(c, nm.lease);
	if (rc)
		die("cannot revoke the lease", strerror(-rc));
	for (int k = 0; k < 2; k++) {
		free(s[k].acq);
		free(s[k].rel);
		free(s[k].pair);
		free(s[k].rate);
	}
	raw_free(&raw);
	lockfs_etcd_close(c);
	return 0;
}
