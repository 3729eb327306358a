/*
 * What the etcd backend's tests (test_etcd_backend.c, test_etcd_interop.c)
 * share: the etcd URL from etcd_fixtures.py, a case's world (its prefix,
 * state directories and pausable proxy) set up and torn down around each
 * case, opening stores, one-line steps and AWAIT.  Each test program is one
 * translation unit, so these are static (inline: a program that does not
 * use one is not warned about it).
 */
#ifndef LOCKFS_TESTS_ETCD_BACKEND_TEST_UTIL_H
#define LOCKFS_TESTS_ETCD_BACKEND_TEST_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lockfs/backend.h"
#include "lockfs/etcd_client.h"

/* The longest any awaited event may take: a watch that reconnects after a
 * dropped connection can need several of its retries under ASan on a loaded
 * machine. */
#define WAIT_MS 20000

static const char *etcd_url;

static inline int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline struct lockfs_etcd *client(void)
{
	static struct lockfs_etcd *c;
	struct lockfs_etcd_config cfg = { .endpoints = etcd_url };

	if (!c)
		assert_int_equal(lockfs_etcd_open(&c, &cfg), 0);
	return c;
}

/* ---- A case's world: its prefix, its state dirs, a proxy ---- */

struct world {
	char prefix[64];
	char root[64];
	pid_t proxy_pid;
	FILE *proxy_in, *proxy_out;
	char proxy_url[64];
	int proxy_port;
};

static inline int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	remove(path);
	return 0;
}

static inline int setup(void **state)
{
	struct world *w = calloc(1, sizeof(*w));
	uint64_t r = 0;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

	assert_non_null(w);
	if (!etcd_url) {
		*state = w;
		return 0;
	}
	assert_true(fd >= 0);
	assert_int_equal(read(fd, &r, sizeof(r)), sizeof(r));
	close(fd);
	snprintf(w->prefix, sizeof(w->prefix), "/xb-%016" PRIx64 "/", r);
	snprintf(w->root, sizeof(w->root), "/tmp/lockfs-xb-XXXXXX");
	assert_non_null(mkdtemp(w->root));
	chmod(w->root, 0700);
	*state = w;
	return 0;
}

static inline void proxy_stop(struct world *w)
{
	if (w->proxy_pid > 0) {
		fclose(w->proxy_in);
		fclose(w->proxy_out);
		waitpid(w->proxy_pid, NULL, 0);
		w->proxy_pid = 0;
	}
}

static inline int teardown(void **state)
{
	struct world *w = *state;

	proxy_stop(w);
	if (w->root[0])
		nftw(w->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	free(w);
	return 0;
}

#define NEED_ETCD() do { if (!etcd_url) skip(); } while (0)

/* tcp_proxy.py in front of etcd, on PORT (0: any). */
static inline void proxy_start(struct world *w, int port)
{
	const char *fixtures = getenv("LOCKFS_ETCD_FIXTURES");
	const char *target = strrchr(etcd_url, ':');
	char script[512], line[64], listen[16];
	int in[2], out[2];
	pid_t pid;

	assert_non_null(fixtures);
	assert_non_null(target);
	snprintf(script, sizeof(script), "%s", fixtures);
	strcpy(strrchr(script, '/') + 1, "tcp_proxy.py");
	assert_int_equal(pipe2(in, O_CLOEXEC), 0);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		snprintf(listen, sizeof(listen), "%d", port);
		execl("/usr/bin/python3", "python3", script, listen, target + 1, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	w->proxy_pid = pid;
	w->proxy_in = fdopen(in[1], "w");
	w->proxy_out = fdopen(out[0], "r");
	assert_non_null(fgets(line, sizeof(line), w->proxy_out));
	assert_int_equal(sscanf(line, "listening %d", &w->proxy_port), 1);
	snprintf(w->proxy_url, sizeof(w->proxy_url), "http://127.0.0.1:%d", w->proxy_port);
}

static inline void proxy_command(struct world *w, const char *cmd, const char *answer)
{
	char line[64];

	fprintf(w->proxy_in, "%s\n", cmd);
	fflush(w->proxy_in);
	assert_non_null(fgets(line, sizeof(line), w->proxy_out));
	line[strcspn(line, "\n")] = '\0';
	assert_string_equal(line, answer);
}

/* ---- Stores ---- */

struct opts {
	const char *url;      /* NULL: etcd_url */
	const char *host;
	const char *ttl;      /* NULL: "10" */
	const char *lock_delay;
	const char *sub;      /* state dir under root (NULL: host) */
	const char *boot_id;  /* NULL: "test-boot" */
	const char *cacert, *cert, *key;  /* TLS files (NULL: none) */
};

static inline int open_store(struct world *w, const struct opts *o, struct lockfs_backend **be,
		      char *why, size_t why_size)
{
	char dir[128];
	struct lockfs_backend_option opts[] = {
		{ "etcd", o->url ? o->url : etcd_url }, { "prefix", w->prefix },
		{ "backing", dir }, { "host", o->host }, { "ttl", o->ttl ? o->ttl : "10" },
		{ "lock_delay", o->lock_delay ? o->lock_delay : "5" },
	};
	struct lockfs_backend_option all[9];
	struct lockfs_backend_config cfg = {
		.options = all, .n_options = 6, .boot_id = o->boot_id ? o->boot_id : "test-boot",
		.why = why, .why_size = why_size,
	};

	memcpy(all, opts, sizeof(opts));
	if (o->cacert)
		all[cfg.n_options++] = (struct lockfs_backend_option){ "etcd_cacert", o->cacert };
	if (o->cert)
		all[cfg.n_options++] = (struct lockfs_backend_option){ "etcd_cert", o->cert };
	if (o->key)
		all[cfg.n_options++] = (struct lockfs_backend_option){ "etcd_key", o->key };
	snprintf(dir, sizeof(dir), "%s/%s", w->root, o->sub ? o->sub : o->host);
	mkdir(dir, 0700);
	return lockfs_backend_kind("etcd")->open(&cfg, be);
}

/*
 * Open a store the case needs.  On a loaded machine etcd now and then
 * answers the first call of an open (its status) after the client's
 * per-call bound (LOCKFS_ETCD_TIMEOUT_MS): such an open is tried again
 * until WAIT_MS, as any awaited event.  Nothing is made in etcd before that
 * call answers, so a retry starts clean.  The open's own timing is
 * test_open_fails_fast_with_one_line's business, which does not come here.
 */
static inline struct lockfs_backend *must_open(struct world *w, const struct opts *o)
{
	int64_t deadline = now_ms() + WAIT_MS;
	struct lockfs_backend *be = NULL;
	char why[512] = "";
	int rc;

	while ((rc = open_store(w, o, &be, why, sizeof(why))) == -ETIMEDOUT &&
	       strncmp(why, "no etcd endpoint answers", 24) == 0 && now_ms() < deadline)
		why[0] = '\0';
	if (rc)
		fail_msg("open %s: %s", o->host, why);
	return be;
}

static inline int rec_encode(void *arg, uint64_t fence, char **json, size_t *len)
{
	int n = asprintf(json, "{\"fence\": %" PRIu64 ", \"tag\": \"%s\"}", fence,
			 (const char *)arg);

	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

#define SRC(tag) (&(struct lockfs_record_src){ .encode = rec_encode, .arg = (void *)(tag) })

/* The "create_revision" field ST names for `owner` (0: none). */
static inline int64_t create_revision(const struct lockfs_entry_stat *st)
{
	for (size_t i = 0; i < st->n_fields; i++)
		if (strcmp(st->fields[i].name, "create_revision") == 0)
			return st->fields[i].number;
	return 0;
}

static inline int try_lock(struct lockfs_backend *be, const char *name, struct lockfs_entry_stat *st)
{
	return be->ops->acquire(be, name, LOCKFS_ACQ_TRY, SRC("t"), NULL, st);
}

static inline enum lockfs_session_state session_of(struct lockfs_backend *be, int64_t *id)
{
	struct lockfs_session s;

	assert_int_equal(be->ops->session(be, NULL, &s), 0);
	if (id)
		*id = s.id;
	return s.state;
}

/* Poll until COND holds (or fail after WAIT_MS). */
#define AWAIT(cond, what) do { \
		int64_t deadline_ = now_ms() + WAIT_MS; \
		while (!(cond)) { \
			if (now_ms() > deadline_) \
				fail_msg("not within %d ms: %s", WAIT_MS, what); \
			usleep(20 * 1000); \
		} \
	} while (0)

/* Keys in etcd under PREFIX NAME "/". */
static inline int64_t keys_of(struct world *w, const char *name)
{
	char key[256];
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = key, .prefix = true,
				     .count_only = true };
	struct lockfs_etcd_op_resp r;
	int64_t n;

	snprintf(key, sizeof(key), "%s%s/", w->prefix, name);
	assert_int_equal(lockfs_etcd_range(client(), &op, &r), 0);
	n = r.count;
	lockfs_etcd_op_resp_free(&r);
	return n;
}

/* Delete every key under PREFIX NAME "/", as `etcdctl del --prefix` would. */
static inline void delete_keys_of(struct world *w, const char *name)
{
	char key[256];
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_DELETE, .key = key, .prefix = true };
	struct lockfs_etcd_op_resp r;

	snprintf(key, sizeof(key), "%s%s/", w->prefix, name);
	assert_int_equal(lockfs_etcd_delete(client(), &op, &r), 0);
	lockfs_etcd_op_resp_free(&r);
}

static inline int count_name(void *arg, const char *name)
{
	(*(int *)arg)++;
	return 0;
}

static inline int listed(struct lockfs_backend *be)
{
	int n = 0;

	assert_int_equal(be->ops->list(be, count_name, &n), 0);
	return n;
}

#endif
