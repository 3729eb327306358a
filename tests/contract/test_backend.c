/*
 * The backend conformance suite (docs/design/seam.md, "The contract, as
 * the conformance suite checks it"): the same cases, through
 * lockfs/backend.h only, against any kind of store.  The kind comes from
 * argv[1] ("dir", "fake"); each case opens a fresh store.  Nothing here
 * goes through the engine.
 *
 * What differs per kind is only how the test reaches around the daemon: a
 * lock made or removed by another program, a store made unusable.  Those
 * are the `struct kind_fixture` hooks; every assertion is shared.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lockfs/backend.h"
#include "base/clock.h"
#ifdef LOCKFS_WITH_ETCD
#include "lockfs/etcd_client.h"
#endif
#include "fake_backend.h"

/* ---- The store under test, per kind ---- */

enum breakage {
	BREAK_READ_ONLY, /* dir: chattr +i DIR */
	BREAK_FULL,      /* dir: DIR on a 64 KiB tmpfs, filled up */
};

struct store {
	struct lockfs_backend *be;
	char root[64];        /* dir: the test's own temporary tree */
	char dir[96];         /* dir: the store's DIR */
	char fence[96];       /* dir: its fence file (never the system's) */
	bool mounted;         /* dir: DIR is our own small tmpfs */
	bool immutable;       /* dir: DIR is chattr +i */
	struct fake_store *fake;
	char prefix[64];      /* etcd: this case's own key prefix */
	char endpoints[256];  /* etcd: what the store is opened on (maybe the proxy) */
	pid_t proxy_pid;      /* etcd: tcp_proxy.py between the store and etcd */
	FILE *proxy_in, *proxy_out;
};

struct kind_fixture {
	const char *name;
	/* A fresh store's state (not opened yet); ON_SMALL_FS: for BREAK_FULL. */
	const char *(*prepare)(struct store *s, bool on_small_fs);
	int (*open)(struct store *s, struct lockfs_backend **be);
	void (*cleanup)(struct store *s);
	/* A lock on NAME made outside lockfs, AGE_MS old; and its removal. */
	void (*foreign)(struct store *s, const char *name, int64_t age_ms);
	void (*remove_outside)(struct store *s, const char *name);
	/* Make the store unusable (NULL) or say why the test cannot. */
	const char *(*break_store)(struct store *s, enum breakage how);
	void (*mend)(struct store *s, enum breakage how);
};

static const struct kind_fixture *kind;

/* ---- dir ---- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	remove(path); /* best effort: what is left shows in /tmp, nowhere else */
	return 0;
}

static const char *dir_prepare(struct store *s, bool on_small_fs)
{
	snprintf(s->root, sizeof(s->root), "/tmp/lockfs-be-XXXXXX");
	if (!mkdtemp(s->root))
		return "mkdtemp failed";
	chmod(s->root, 0755);
	snprintf(s->dir, sizeof(s->dir), "%s/store", s->root);
	snprintf(s->fence, sizeof(s->fence), "%s/fence", s->root);
	if (mkdir(s->dir, 0755) < 0)
		return "mkdir failed";
	if (on_small_fs) {
		if (geteuid() != 0)
			return "mounting a 64 KiB tmpfs needs root";
		if (mount("lockfs-test", s->dir, "tmpfs", MS_NOSUID | MS_NODEV,
			  "size=64k,mode=0755") < 0)
			return "cannot mount a tmpfs here (no CAP_SYS_ADMIN in this namespace?)";
		s->mounted = true;
	}
	return NULL;
}

static int dir_open_store(struct store *s, struct lockfs_backend **be)
{
	struct lockfs_backend_option opts[] = {
		{ "backing", s->dir }, { "fence_file", s->fence }, { "stale", "1" },
	};
	char why[512] = "";
	struct lockfs_backend_config cfg = {
		.options = opts, .n_options = 3, .boot_id = "test-boot",
		.why = why, .why_size = sizeof(why),
	};
	const struct lockfs_backend_kind *k = lockfs_backend_kind("dir");
	int rc;

	assert_non_null(k);
	rc = k->open(&cfg, be);
	if (rc < 0)
		fprintf(stderr, "open: %s\n", why);
	return rc;
}

static int set_immutable(const char *path, bool on)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int flags = 0, rc = -1;

	if (fd < 0)
		return -1;
	if (ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0) {
		flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
		rc = ioctl(fd, FS_IOC_SETFLAGS, &flags);
	}
	close(fd);
	return rc;
}

static void dir_cleanup(struct store *s)
{
	if (s->immutable)
		set_immutable(s->dir, false);
	if (s->mounted && umount2(s->dir, MNT_DETACH) < 0)
		fprintf(stderr, "cannot unmount %s: %s\n", s->dir, strerror(errno));
	if (s->root[0])
		nftw(s->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void dir_foreign(struct store *s, const char *name, int64_t age_ms)
{
	char path[256];
	struct timespec ts[2];

	snprintf(path, sizeof(path), "%s/%s.lock", s->dir, name);
	assert_int_equal(mkdir(path, 0755), 0);
	clock_gettime(CLOCK_REALTIME, &ts[0]);
	ts[0].tv_sec -= age_ms / 1000;
	ts[1] = ts[0];
	assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static void dir_remove_outside(struct store *s, const char *name)
{
	char path[256];

	snprintf(path, sizeof(path), "%s/%s.lock", s->dir, name);
	assert_int_equal(rmdir(path), 0);
}

static const char *dir_break(struct store *s, enum breakage how)
{
	char path[256];
	int fd;

	if (geteuid() != 0)
		return "breaking the store needs root (chattr +i, mount)";
	if (how == BREAK_READ_ONLY) {
		if (set_immutable(s->dir, true) < 0)
			return "this filesystem has no chattr +i";
		s->immutable = true;
		return NULL;
	}
	/* Fill the small tmpfs to the last block. */
	snprintf(path, sizeof(path), "%s/filler", s->dir);
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	for (char block[4096] = { 0 }; write(fd, block, sizeof(block)) > 0;)
		;
	close(fd);
	return NULL;
}

static void dir_mend(struct store *s, enum breakage how)
{
	char path[256];

	if (how == BREAK_READ_ONLY) {
		assert_int_equal(set_immutable(s->dir, false), 0);
		s->immutable = false;
		return;
	}
	snprintf(path, sizeof(path), "%s/filler", s->dir);
	assert_int_equal(unlink(path), 0);
}

static const struct kind_fixture dir_fixture = {
	.name = "dir",
	.prepare = dir_prepare,
	.open = dir_open_store,
	.cleanup = dir_cleanup,
	.foreign = dir_foreign,
	.remove_outside = dir_remove_outside,
	.break_store = dir_break,
	.mend = dir_mend,
};

/* ---- fake ---- */

static const char *fake_prepare(struct store *s, bool on_small_fs)
{
	s->fake = fake_store_new();
	return s->fake ? NULL : "out of memory";
}

static int fake_open_store(struct store *s, struct lockfs_backend **be)
{
	return fake_backend_open(s->fake, be);
}

static void fake_cleanup(struct store *s)
{
	fake_store_free(s->fake);
}

static void fake_foreign_lock(struct store *s, const char *name, int64_t age_ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	assert_int_equal(fake_backend_foreign(s->be, name,
					      (int64_t)ts.tv_sec * 1000 - age_ms), 0);
}

static void fake_remove_outside(struct store *s, const char *name)
{
	assert_int_equal(fake_backend_remove(s->be, name), 0);
}

static const char *fake_break(struct store *s, enum breakage how)
{
	fake_backend_fail(s->be, FAKE_OP_ALL_WRITES, EIO, -1);
	return NULL;
}

static void fake_mend(struct store *s, enum breakage how)
{
	fake_backend_fail(s->be, FAKE_OP_ALL_WRITES, 0, 0);
}

static const struct kind_fixture fake_fixture = {
	.name = "fake",
	.prepare = fake_prepare,
	.open = fake_open_store,
	.cleanup = fake_cleanup,
	.foreign = fake_foreign_lock,
	.remove_outside = fake_remove_outside,
	.break_store = fake_break,
	.mend = fake_mend,
};

/* ---- etcd (argv: etcd [URL]; URL defaults to $LOCKFS_ETCD_ENDPOINTS, as
 * tests/fixtures/etcd_fixtures.py exec sets it) ---- */

#ifdef LOCKFS_WITH_ETCD
static const char *etcd_url;

/* The test's own client, for what "another program" does to the store. */
static struct lockfs_etcd *etcd_client(void)
{
	static struct lockfs_etcd *c;
	struct lockfs_etcd_config cfg = { .endpoints = etcd_url };

	if (!c)
		assert_int_equal(lockfs_etcd_open(&c, &cfg), 0);
	return c;
}

/* Start tcp_proxy.py in front of etcd_url's port, listening on
 * LISTEN_PORT (0: any).  NULL or why not. */
static const char *etcd_start_proxy(struct store *s, int listen_port)
{
	const char *fixtures = getenv("LOCKFS_ETCD_FIXTURES"), *port;
	char script[512], line[64], listen[16];
	int in[2], out[2];
	pid_t pid;

	if (!fixtures)
		return "no LOCKFS_ETCD_FIXTURES (run under etcd_fixtures.py exec): no proxy";
	snprintf(script, sizeof(script), "%s", fixtures);
	if (strrchr(script, '/'))
		strcpy(strrchr(script, '/') + 1, "tcp_proxy.py");
	port = strrchr(etcd_url, ':');
	if (!port || strchr(etcd_url, ';'))
		return "the proxy needs a single etcd URL with a port";
	assert_int_equal(pipe2(in, O_CLOEXEC), 0);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		snprintf(listen, sizeof(listen), "%d", listen_port);
		execl("/usr/bin/python3", "python3", script, listen, port + 1, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	s->proxy_pid = pid;
	s->proxy_in = fdopen(in[1], "w");
	s->proxy_out = fdopen(out[0], "r");
	assert_non_null(s->proxy_in);
	assert_non_null(s->proxy_out);
	if (!fgets(line, sizeof(line), s->proxy_out) ||
	    sscanf(line, "listening %d", &listen_port) != 1)
		return "tcp_proxy.py did not start";
	snprintf(s->endpoints, sizeof(s->endpoints), "http://127.0.0.1:%d", listen_port);
	return NULL;
}

static void etcd_proxy_command(struct store *s, const char *cmd, const char *answer)
{
	char line[64];

	fprintf(s->proxy_in, "%s\n", cmd);
	fflush(s->proxy_in);
	assert_non_null(fgets(line, sizeof(line), s->proxy_out));
	line[strcspn(line, "\n")] = '\0';
	assert_string_equal(line, answer);
}

static const char *etcd_prepare(struct store *s, bool breakable)
{
	uint64_t r = 0;
	int fd;

	if (!etcd_url || !*etcd_url)
		return "no etcd URL (argv[2] or LOCKFS_ETCD_ENDPOINTS)";
	snprintf(s->root, sizeof(s->root), "/tmp/lockfs-be-XXXXXX");
	if (!mkdtemp(s->root))
		return "mkdtemp failed";
	chmod(s->root, 0700);
	fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (read(fd, &r, sizeof(r)) != sizeof(r))
			r = (uint64_t)getpid() ^ (uint64_t)time(NULL);
		close(fd);
	}
	snprintf(s->prefix, sizeof(s->prefix), "/t-%016llx/", (unsigned long long)r);
	snprintf(s->endpoints, sizeof(s->endpoints), "%s", etcd_url);
	/* The errors case reaches etcd through a proxy it can pause. */
	return breakable ? etcd_start_proxy(s, 0) : NULL;
}

static int etcd_open_store(struct store *s, struct lockfs_backend **be)
{
	struct lockfs_backend_option opts[] = {
		{ "etcd", s->endpoints }, { "prefix", s->prefix }, { "backing", s->root },
		{ "host", "conformance" }, { "ttl", "10" },
	};
	char why[512] = "";
	struct lockfs_backend_config cfg = {
		.options = opts, .n_options = 5, .boot_id = "test-boot",
		.why = why, .why_size = sizeof(why),
	};
	const struct lockfs_backend_kind *k = lockfs_backend_kind("etcd");
	int rc;

	assert_non_null(k);
	rc = k->open(&cfg, be);
	if (rc < 0)
		fprintf(stderr, "open: %s\n", why);
	return rc;
}

static void etcd_stop_proxy(struct store *s)
{
	if (s->proxy_pid > 0) {
		fclose(s->proxy_in); /* its end of input ends it */
		fclose(s->proxy_out);
		waitpid(s->proxy_pid, NULL, 0);
		s->proxy_pid = 0;
	}
}

static void etcd_cleanup(struct store *s)
{
	etcd_stop_proxy(s);
	if (s->root[0])
		nftw(s->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Await what the store's watch must show (another program's change). */
static void etcd_await_stat(struct store *s, const char *name, int want)
{
	for (int i = 0; i < 200; i++) {
		if (s->be->ops->stat(s->be, name, NULL, false) == want)
			return;
		usleep(10 * 1000);
	}
	fail_msg("the store's watch did not show %s's change within 2 s", name);
}

/* `etcdctl lock PREFIX/NAME`'s key: PREFIX NAME "/" <lease hex>, empty. */
static void etcd_foreign(struct store *s, const char *name, int64_t age_ms)
{
	char key[256];
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_PUT, .key = key, .value = "" };

	snprintf(key, sizeof(key), "%s%s/694d7ab1c3e2f00d", s->prefix, name);
	assert_int_equal(lockfs_etcd_put(etcd_client(), &op, NULL), 0);
	etcd_await_stat(s, name, 0);
}

static void etcd_remove_outside(struct store *s, const char *name)
{
	char key[256];
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_DELETE, .key = key, .prefix = true };

	snprintf(key, sizeof(key), "%s%s/", s->prefix, name);
	assert_int_equal(lockfs_etcd_delete(etcd_client(), &op, NULL), 0);
	etcd_await_stat(s, name, -ENOENT);
}

static const char *etcd_break(struct store *s, enum breakage how)
{
	if (s->proxy_pid <= 0)
		return "no proxy between the store and etcd";
	etcd_proxy_command(s, "pause", "paused");
	return NULL;
}

static void etcd_mend(struct store *s, enum breakage how)
{
	const char *port = strrchr(s->endpoints, ':');

	/* A partition that lost what it held back: nothing sent during it
	 * arrives late (a paused proxy would pass on, once resumed, the
	 * connections it left in its backlog; a new one on the same port
	 * has none).  Late arrivals are tests/etcd/test_etcd_backend.c's. */
	etcd_proxy_command(s, "drop", "dropped");
	etcd_stop_proxy(s);
	assert_non_null(port);
	assert_null(etcd_start_proxy(s, atoi(port + 1)));
}

static const struct kind_fixture etcd_fixture = {
	.name = "etcd",
	.prepare = etcd_prepare,
	.open = etcd_open_store,
	.cleanup = etcd_cleanup,
	.foreign = etcd_foreign,
	.remove_outside = etcd_remove_outside,
	.break_store = etcd_break,
	.mend = etcd_mend,
};
#endif

/* ---- Helpers ---- */

/* The test's record: {"fence": F, "tag": T}; an edit keeps KEEP. */
struct rec {
	const char *tag;
	uint64_t keep;     /* the fence an edit (fence 0) writes */
	int calls;
};

static int rec_encode(void *arg, uint64_t fence, char **json, size_t *len)
{
	struct rec *r = arg;
	int n;

	r->calls++;
	n = asprintf(json, "{\"fence\": %" PRIu64 ", \"tag\": \"%s\"}",
		     fence ? fence : r->keep, r->tag);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

#define SRC(r) (&(struct lockfs_record_src){ .encode = rec_encode, .arg = (r) })

static struct store *store_of(void **state)
{
	return *state;
}

static int setup_with(void **state, bool small)
{
	struct store *s = calloc(1, sizeof(*s));
	const char *why;

	assert_non_null(s);
	*state = s;
	why = kind->prepare(s, small);
	if (why) {
		fprintf(stderr, "skipped: %s\n", why);
		return 0; /* the case sees s->be NULL and skips */
	}
	assert_int_equal(kind->open(s, &s->be), 0);
	return 0;
}

static int setup(void **state)
{
	return setup_with(state, false);
}

static int setup_small(void **state)
{
	return setup_with(state, true);
}

/* For the errors cases: a store the fixture can break.  dir breaks any
 * store (chattr +i); etcd needs its proxy from the start (the small-fs
 * flag says "breakable" to it). */
static int setup_breakable(void **state)
{
	return setup_with(state, strcmp(kind->name, "etcd") == 0);
}

static int teardown(void **state)
{
	struct store *s = store_of(state);

	if (s->be)
		s->be->ops->close(s->be);
	kind->cleanup(s);
	free(s);
	return 0;
}

#define NEED_STORE(s) do { if (!(s)->be) skip(); } while (0)

static int acquire(struct store *s, const char *name, const char *tag,
		   struct lockfs_entry_stat *st)
{
	struct rec r = { .tag = tag };

	return s->be->ops->acquire(s->be, name, LOCKFS_ACQ_TRY, SRC(&r), NULL, st);
}

/* NAME's record's tag ("" for a foreign lock), or -errno. */
static int read_tag(struct store *s, const char *name, char tag[64],
		    struct lockfs_entry_stat *st)
{
	char *rec = NULL;
	size_t len = 0;
	int rc = s->be->ops->read(s->be, name, &rec, &len, st);
	const char *t;

	tag[0] = '\0';
	if (rc < 0)
		return rc;
	if (rec && (t = strstr(rec, "\"tag\": \"")))
		sscanf(t + 8, "%63[^\"]", tag);
	free(rec);
	return 0;
}

static int count_name(void *arg, const char *name)
{
	(*(int *)arg)++;
	return 0;
}

static int held_count(struct store *s)
{
	int n = 0;

	assert_int_equal(s->be->ops->list(s->be, count_name, &n), 0);
	return n;
}

/* ---- 1. Indivisible acquire ---- */

#define RACERS 8
#define ROUNDS 1000

struct race {
	struct store *s;
	int inside;       /* winners holding it now (__atomic) */
	int overlaps;     /* a second winner while one held (__atomic) */
	int bad_answers;  /* neither 0 nor -EEXIST, or a failed release */
	int wins;
};

static void *racer(void *arg)
{
	struct race *r = arg;

	for (int i = 0; i < ROUNDS; i++) {
		struct lockfs_entry_stat st;
		int rc = acquire(r->s, "contended", "racer", &st);

		if (rc == -EEXIST)
			continue;
		if (rc != 0) {
			__atomic_add_fetch(&r->bad_answers, 1, __ATOMIC_RELAXED);
			continue;
		}
		if (__atomic_add_fetch(&r->inside, 1, __ATOMIC_ACQ_REL) != 1)
			__atomic_add_fetch(&r->overlaps, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&r->wins, 1, __ATOMIC_RELAXED);
		__atomic_sub_fetch(&r->inside, 1, __ATOMIC_ACQ_REL);
		if (r->s->be->ops->release(r->s->be, "contended", st.identity) != 0)
			__atomic_add_fetch(&r->bad_answers, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void test_acquire_is_indivisible_among_8_threads(void **state)
{
	struct store *s = store_of(state);
	struct race r = { .s = s };
	pthread_t t[RACERS];

	NEED_STORE(s);
	for (int i = 0; i < RACERS; i++)
		assert_int_equal(pthread_create(&t[i], NULL, racer, &r), 0);
	for (int i = 0; i < RACERS; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(r.overlaps, 0);
	assert_int_equal(r.bad_answers, 0);
	assert_true(r.wins > 0);
	assert_int_equal(held_count(s), 0);
}

/* ---- 2. Identity guards ---- */

static void test_stale_identity_never_removes_or_rewrites_a_newer_lock(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st1, st2, st3, rst;
	struct rec edit = { .tag = "edited" };
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "x", "first", &st1), 0);
	assert_int_not_equal(st1.identity, 0);
	assert_int_equal(s->be->ops->release(s->be, "x", st1.identity), 0);
	assert_int_equal(acquire(s, "x", "second", &st2), 0);
	assert_int_not_equal(st2.identity, st1.identity);
	assert_int_equal(s->be->ops->release(s->be, "x", st1.identity), -ENOENT);
	assert_int_equal(s->be->ops->update(s->be, "x", st1.identity, LOCKFS_UPD_EDIT,
					    SRC(&edit), &st3), -ENOENT);
	assert_int_equal(edit.calls, 0);
	assert_int_equal(read_tag(s, "x", tag, &rst), 0);
	assert_string_equal(tag, "second");
	assert_int_equal(rst.identity, st2.identity);

	/* An update changes the identity: the old one no longer releases. */
	edit.keep = st2.fence;
	assert_int_equal(s->be->ops->update(s->be, "x", st2.identity, LOCKFS_UPD_EDIT,
					    SRC(&edit), &st3), 0);
	assert_int_not_equal(st3.identity, st2.identity);
	assert_int_equal(s->be->ops->release(s->be, "x", st2.identity), -ENOENT);
	assert_int_equal(read_tag(s, "x", tag, &rst), 0);
	assert_string_equal(tag, "edited");
	assert_int_equal(rst.identity, st3.identity);
	assert_int_equal(rst.fence, st2.fence);
	assert_int_equal(s->be->ops->release(s->be, "x", st3.identity), 0);
	assert_int_equal(s->be->ops->stat(s->be, "x", NULL, true), -ENOENT);
}

/* ---- 3. Fences ---- */

static void test_fences_increase_per_name_and_across_reopen(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st, rst;
	struct lockfs_place place;
	struct rec r = { .tag = "t" };
	uint64_t last;
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "f", "a", &st), 0);
	assert_true(st.fence > 0);
	last = st.fence;
	assert_int_equal(read_tag(s, "f", tag, &rst), 0);
	assert_int_equal(rst.fence, st.fence);

	r.tag = "grant";
	assert_int_equal(s->be->ops->update(s->be, "f", st.identity, LOCKFS_UPD_GRANT,
					    SRC(&r), &st), 0);
	assert_true(st.fence > last);
	last = st.fence;
	assert_int_equal(read_tag(s, "f", tag, &rst), 0);
	assert_int_equal(rst.fence, st.fence);

	r.tag = "next";
	assert_int_equal(s->be->ops->acquire(s->be, "f", LOCKFS_ACQ_QUEUE, SRC(&r), &place,
					     NULL), -EINPROGRESS);
	assert_int_equal(s->be->ops->handoff(s->be, "f", st.identity, &place, SRC(&r), &st), 0);
	assert_true(st.fence > last);
	last = st.fence;
	assert_int_equal(read_tag(s, "f", tag, &rst), 0);
	assert_string_equal(tag, "next");
	assert_int_equal(rst.fence, st.fence);
	assert_int_equal(s->be->ops->release(s->be, "f", st.identity), 0);

	assert_int_equal(s->be->ops->acquire(s->be, "f", LOCKFS_ACQ_QUEUE, SRC(&r), &place,
					     NULL), -EINPROGRESS);
	assert_int_equal(s->be->ops->claim(s->be, "f", &place, SRC(&r), &st), 0);
	assert_true(st.fence > last);
	last = st.fence;
	assert_int_equal(s->be->ops->release(s->be, "f", st.identity), 0);

	/* Another name's grant does not go back either: one counter or per
	 * name, never below what this name saw. */
	s->be->ops->close(s->be);
	s->be = NULL;
	assert_int_equal(kind->open(s, &s->be), 0);
	assert_int_equal(acquire(s, "f", "after-reopen", &st), 0);
	assert_true(st.fence > last);
	assert_int_equal(read_tag(s, "f", tag, &rst), 0);
	assert_int_equal(rst.fence, st.fence);
}

/* ---- 4. The line ---- */

struct poller {
	struct store *s;
	bool stop;        /* __atomic */
	int free_seen;    /* TRY succeeded in between */
	int polls;
};

static void *poll_try(void *arg)
{
	struct poller *p = arg;

	while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
		struct lockfs_entry_stat st;

		if (acquire(p->s, "line", "thief", &st) == 0) {
			p->free_seen++;
			p->s->be->ops->release(p->s->be, "line", st.identity);
		}
		p->polls++;
	}
	return NULL;
}

static void test_handoff_gives_the_place_the_lock_with_no_gap(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st, st2;
	struct lockfs_place place, later;
	struct rec waiter = { .tag = "waiter" }, other = { .tag = "other" };
	struct poller p = { .s = s };
	pthread_t t;
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "line", "holder", &st), 0);
	assert_int_equal(pthread_create(&t, NULL, poll_try, &p), 0);
	assert_int_equal(s->be->ops->acquire(s->be, "line", LOCKFS_ACQ_OR_QUEUE, SRC(&waiter),
					     &place, &st2), -EINPROGRESS);
	assert_int_equal(s->be->ops->acquire(s->be, "line", LOCKFS_ACQ_QUEUE, SRC(&other),
					     &later, NULL), -EINPROGRESS);
	assert_true(later.rank > place.rank);
	assert_int_equal(s->be->ops->claim(s->be, "line", &place, SRC(&waiter), &st2), -EEXIST);
	assert_int_equal(s->be->ops->handoff(s->be, "line", st.identity, &place, SRC(&waiter),
					     &st2), 0);
	assert_int_not_equal(st2.identity, st.identity);
	/* Let the poller see the new grant for a while, too. */
	while (__atomic_load_n(&p.polls, __ATOMIC_RELAXED) < 200)
		sched_yield();
	__atomic_store_n(&p.stop, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	assert_int_equal(p.free_seen, 0);
	assert_int_equal(read_tag(s, "line", tag, NULL), 0);
	assert_string_equal(tag, "waiter");
	/* The old grant is over: its identity hands off nothing more. */
	assert_int_equal(s->be->ops->handoff(s->be, "line", st.identity, &later, SRC(&other),
					     &st), -ENOENT);
	assert_int_equal(s->be->ops->leave(s->be, "line", &place), 0);
	assert_int_equal(s->be->ops->leave(s->be, "line", &later), 0);
	assert_int_equal(s->be->ops->leave(s->be, "line", &later), 0);
	assert_int_equal(s->be->ops->release(s->be, "line", st2.identity), 0);
	assert_int_equal(held_count(s), 0);
}

/* ---- 5. list / read / stat ---- */

struct seen {
	char names[8][64];
	int n;
};

static int add_seen(void *arg, const char *name)
{
	struct seen *sn = arg;

	if (sn->n < 8)
		snprintf(sn->names[sn->n++], 64, "%s", name);
	return 0;
}

static bool has(const struct seen *sn, const char *name)
{
	for (int i = 0; i < sn->n; i++)
		if (strcmp(sn->names[i], name) == 0)
			return true;
	return false;
}

static void test_list_read_and_stat_agree(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat a, b, rst, sst;
	struct seen sn = { 0 };
	struct rec r = { .tag = "nobody" };
	char *rec = (char *)"untouched";
	size_t len = 1;
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "alpha", "A", &a), 0);
	assert_int_equal(acquire(s, "beta", "B", &b), 0);
	assert_int_equal(s->be->ops->list(s->be, add_seen, &sn), 0);
	assert_int_equal(sn.n, 2);
	assert_true(has(&sn, "alpha") && has(&sn, "beta"));
	assert_int_equal(read_tag(s, "alpha", tag, &rst), 0);
	assert_string_equal(tag, "A");
	assert_int_equal(s->be->ops->stat(s->be, "alpha", &sst, true), 0);
	assert_int_equal(rst.identity, a.identity);
	assert_int_equal(sst.identity, a.identity);
	assert_int_equal(s->be->ops->stat(s->be, "beta", &sst, false), 0);
	assert_int_equal(sst.identity, b.identity);

	assert_int_equal(s->be->ops->read(s->be, "gamma", &rec, &len, &rst), -ENOENT);
	assert_null(rec);
	assert_int_equal(s->be->ops->stat(s->be, "gamma", &sst, false), -ENOENT);
	assert_int_equal(s->be->ops->stat(s->be, "gamma", &sst, true), -ENOENT);
	assert_int_equal(s->be->ops->release(s->be, "gamma", a.identity), -ENOENT);
	assert_int_equal(s->be->ops->update(s->be, "gamma", a.identity, LOCKFS_UPD_EDIT,
					    SRC(&r), &rst), -ENOENT);
	assert_int_equal(s->be->ops->release(s->be, "alpha", a.identity), 0);
	memset(&sn, 0, sizeof(sn));
	assert_int_equal(s->be->ops->list(s->be, add_seen, &sn), 0);
	assert_int_equal(sn.n, 1);
	assert_string_equal(sn.names[0], "beta");
}

/* ---- 6. Changes ---- */

struct changes {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char names[64][64];  /* NAME and OWN events; "*" for CHANGE_ALL */
	bool own[64];        /* names[i] came as CHANGE_OWN */
	int n;
};

static void on_change(void *arg, enum lockfs_change what, const char *name)
{
	struct changes *c = arg;

	pthread_mutex_lock(&c->mu);
	if (c->n < 64) {
		bool named = what == LOCKFS_CHANGE_NAME || what == LOCKFS_CHANGE_OWN;

		c->own[c->n] = what == LOCKFS_CHANGE_OWN;
		snprintf(c->names[c->n++], 64, "%s", named ? name : "*");
	}
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

/* Wait up to 1 s for a change of NAME (or "anything changed"); then
 * forget what was seen.  True when it came; with OUTSIDE, only as a
 * change made outside (never CHANGE_OWN, which would wake no waiter). */
static bool await_change_as(struct changes *c, const char *name, bool outside)
{
	struct timespec deadline;
	bool seen = false;

	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 1;
	pthread_mutex_lock(&c->mu);
	while (!seen) {
		for (int i = 0; i < c->n && !seen; i++)
			seen = (strcmp(c->names[i], name) == 0 && !(outside && c->own[i])) ||
			       strcmp(c->names[i], "*") == 0;
		if (!seen && pthread_cond_timedwait(&c->cv, &c->mu, &deadline) == ETIMEDOUT)
			break;
	}
	c->n = 0;
	pthread_mutex_unlock(&c->mu);
	return seen;
}

static bool await_change(struct changes *c, const char *name)
{
	return await_change_as(c, name, false);
}

/* Wait until no change came for 100 ms, then forget them: what follows
 * is caused by the next step only. */
static void settle(struct changes *c)
{
	int n, rounds = 0;

	/* Bounded: a store that reports "anything may have changed" every
	 * 50 ms (dir without inotify) never goes quiet. */
	do {
		pthread_mutex_lock(&c->mu);
		n = c->n;
		c->n = 0;
		pthread_mutex_unlock(&c->mu);
		usleep(100 * 1000); /* quiet period, not synchronisation */
	} while (n && ++rounds < 10);
}

static void test_changes_are_reported_within_a_second(void **state)
{
	struct store *s = store_of(state);
	struct changes c = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	struct lockfs_entry_stat st;
	struct rec r = { .tag = "edited" };

	NEED_STORE(s);
	assert_int_equal(s->be->ops->start(s->be, on_change, &c), 0);
	settle(&c);
	assert_int_equal(acquire(s, "w", "first", &st), 0);
	assert_true(await_change(&c, "w"));
	settle(&c);
	r.keep = st.fence;
	assert_int_equal(s->be->ops->update(s->be, "w", st.identity, LOCKFS_UPD_EDIT, SRC(&r),
					    &st), 0);
	assert_true(await_change(&c, "w"));
	settle(&c);
	assert_int_equal(s->be->ops->release(s->be, "w", st.identity), 0);
	assert_true(await_change(&c, "w"));
	settle(&c);
	kind->foreign(s, "script", 0);
	assert_true(await_change_as(&c, "script", true));
	settle(&c);
	kind->remove_outside(s, "script");
	assert_true(await_change_as(&c, "script", true));
	/* Nothing is reported after close (teardown closes: the callback's
	 * state must outlive it, and it does here). */
}

/* ---- 7. Errors ---- */

static void check_broken_store(void **state, enum breakage how)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat held, st;
	struct lockfs_place place;
	struct rec r = { .tag = "edited" };
	struct seen sn = { 0 };
	const char *why;
	int release_rc, update_rc, queue_rc;
	char tag[64];

	NEED_STORE(s);
	assert_int_equal(acquire(s, "held", "before", &held), 0);
	why = kind->break_store(s, how);
	if (why) {
		fprintf(stderr, "skipped: %s\n", why);
		skip();
	}
	/* A new lock: never a false success, never "held". */
	assert_int_equal(acquire(s, "new", "during", &st), -EIO);
	queue_rc = s->be->ops->acquire(s->be, "new", LOCKFS_ACQ_OR_QUEUE, SRC(&r), &place, &st);
	assert_true(queue_rc == -EIO || queue_rc == -EINPROGRESS);
	if (queue_rc == -EINPROGRESS)
		assert_int_equal(s->be->ops->leave(s->be, "new", &place), 0);
	/* Changes of a held lock: -EIO, or really done (checked below);
	 * never -ENOENT ("not held") or -EPERM from the medium. */
	r.keep = held.fence;
	update_rc = s->be->ops->update(s->be, "held", held.identity, LOCKFS_UPD_EDIT, SRC(&r),
				       &st);
	assert_true(update_rc == 0 || update_rc == -EIO);
	if (update_rc == 0)
		held = st;
	release_rc = s->be->ops->release(s->be, "held", held.identity);
	assert_true(release_rc == 0 || release_rc == -EIO);
	kind->mend(s, how);

	/* Nothing half-made: the failed acquisition left no lock, the held
	 * one is there exactly when its release failed, with the record its
	 * update's answer says. */
	assert_int_equal(s->be->ops->list(s->be, add_seen, &sn), 0);
	assert_false(has(&sn, "new"));
	assert_int_equal(has(&sn, "held"), release_rc != 0);
	if (release_rc != 0) {
		assert_int_equal(read_tag(s, "held", tag, NULL), 0);
		assert_string_equal(tag, update_rc == 0 ? "edited" : "before");
		assert_int_equal(s->be->ops->release(s->be, "held", held.identity), 0);
	}
	/* And the store works again. */
	assert_int_equal(acquire(s, "new", "after", &st), 0);
	assert_int_equal(s->be->ops->release(s->be, "new", st.identity), 0);
}

static void test_read_only_store_fails_with_eio_and_makes_nothing(void **state)
{
	check_broken_store(state, BREAK_READ_ONLY);
}

static void test_full_store_fails_with_eio_and_makes_nothing(void **state)
{
	check_broken_store(state, BREAK_FULL);
}

/* ---- 8. Foreign locks ---- */

static void test_foreign_lock_reads_without_record_and_blocks_try(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st, rst;
	char *rec = (char *)"untouched";
	size_t len = 1;

	NEED_STORE(s);
	kind->foreign(s, "seed", 0);
	assert_int_equal(s->be->ops->read(s->be, "seed", &rec, &len, &rst), 0);
	assert_null(rec);
	assert_int_not_equal(rst.identity, 0);
	assert_int_equal(rst.fence, 0);
	assert_int_equal(acquire(s, "seed", "mine", &st), -EEXIST);
	assert_int_equal(s->be->ops->stat(s->be, "seed", &st, false), 0);
	assert_int_equal(st.identity, rst.identity);
	/* Young: not stale under stale=1 s. */
	if (s->be->ops->foreign_stale)
		assert_int_equal(s->be->ops->foreign_stale(s->be, "seed", &st), 0);
}

static void test_old_foreign_lock_is_stale_and_recoverable(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st, mine;

	NEED_STORE(s);
	if (!s->be->ops->foreign_stale)
		skip(); /* this kind has no staleness policy */
	kind->foreign(s, "old", 5000);
	assert_int_equal(acquire(s, "mine", "m", &mine), 0);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "old", &st), 1);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "mine", &st), 0);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "absent", &st), 0);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "old", &st), 1);
	assert_int_equal(s->be->ops->release(s->be, "old", st.identity), 0);
	assert_int_equal(acquire(s, "old", "recovered", &st), 0);
}

/* The daemon's wall clock moved by clock_shift_ms (lockfs_clock_override). */
static int64_t clock_shift_ms;

static int64_t real_ms(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t shifted_wall_ms(void *arg)
{
	return real_ms(CLOCK_REALTIME) + clock_shift_ms;
}

static int64_t real_boot_ms(void *arg)
{
	return real_ms(CLOCK_BOOTTIME);
}

/* -o stale judges a foreign lock's age by the daemon's clock (clock.h),
 * so a test can move it: 10 s on, a lock made just now is stale under
 * stale=1 s; 10 s back, one made 5 s ago is not. */
static void test_foreign_lock_ages_by_the_daemons_clock(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_clock shifted = { shifted_wall_ms, real_boot_ms, NULL };
	struct lockfs_entry_stat st;
	int young_later, old_earlier;

	NEED_STORE(s);
	if (!s->be->ops->foreign_stale)
		skip(); /* this kind has no staleness policy */
	kind->foreign(s, "young", 0);
	kind->foreign(s, "old", 5000);
	lockfs_clock_override(&shifted);
	clock_shift_ms = 10000;
	young_later = s->be->ops->foreign_stale(s->be, "young", &st);
	clock_shift_ms = -10000;
	old_earlier = s->be->ops->foreign_stale(s->be, "old", &st);
	lockfs_clock_override(NULL); /* before any assertion can jump out */
	assert_int_equal(young_later, 1);
	assert_int_equal(old_earlier, 0);
	/* And by the real clock again: as they are. */
	assert_int_equal(s->be->ops->foreign_stale(s->be, "young", &st), 0);
	assert_int_equal(s->be->ops->foreign_stale(s->be, "old", &st), 1);
}

/* ---- Session ---- */

static void test_own_session_is_live_and_other_hosts_unknown(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_session ses;

	NEED_STORE(s);
	assert_int_equal(s->be->ops->session(s->be, NULL, &ses), 0);
	assert_int_equal(ses.state, LOCKFS_SESSION_LIVE);
	assert_int_equal(s->be->ops->session(s->be, s->be->host, &ses), 0);
	assert_int_equal(ses.state, LOCKFS_SESSION_LIVE);
	assert_true(s->be->host[0] != '\0');
	assert_int_equal(s->be->ops->session(s->be, "no-such-host.invalid", &ses), -ENOENT);
	if (s->be->ops->check)
		assert_int_equal(s->be->ops->check(s->be), 0);
}

/* ---- Opening (dir only: the state directory's checks) ---- */

#define DIR_ONLY(s) do { if (!(s)->be || strcmp(kind->name, "dir") != 0) skip(); } while (0)

/* Open the dir kind on PATH; its one line in WHY. */
static int open_dir_at(const char *path, const char *fence, char *why, size_t size)
{
	struct lockfs_backend_option opts[] = { { "backing", path }, { "fence_file", fence } };
	struct lockfs_backend_config cfg = {
		.options = opts, .n_options = 2, .boot_id = "test-boot",
		.why = why, .why_size = size,
	};
	struct lockfs_backend *be = NULL;
	int rc = lockfs_backend_kind("dir")->open(&cfg, &be);

	if (rc == 0)
		be->ops->close(be);
	return rc;
}

static void test_kinds_are_found_by_name_and_unknown_is_null(void **state)
{
	assert_non_null(lockfs_backend_kind("dir"));
	assert_string_equal(lockfs_backend_kind("dir")->name, "dir");
	assert_ptr_equal(lockfs_backend_kinds[0], lockfs_backend_kind("dir"));
	assert_null(lockfs_backend_kind("nope"));
	assert_null(lockfs_backend_kind(NULL));
}

/* -o backend=etcd is known by name in every build; without libcurl its
 * open says why in one line. */
static void test_etcd_kind_is_known_and_says_when_not_built(void **state)
{
	const struct lockfs_backend_kind *k = lockfs_backend_kind("etcd");

	assert_non_null(k);
	assert_string_equal(k->name, "etcd");
#ifndef LOCKFS_WITH_ETCD
	{
		char why[128] = "";
		struct lockfs_backend *be = NULL;
		struct lockfs_backend_config cfg = { .why = why, .why_size = sizeof(why) };

		assert_int_equal(k->open(&cfg, &be), -EOPNOTSUPP);
		assert_null(be);
		assert_string_equal(why, "etcd support not built (-Detcd=disabled)");
	}
#endif
}

static void test_second_daemon_on_the_same_dir_is_refused(void **state)
{
	struct store *s = store_of(state);
	char why[512] = "";

	DIR_ONLY(s);
	assert_int_equal(lockfs_backend_record_pid(s->be), 0);
	assert_int_equal(open_dir_at(s->dir, s->fence, why, sizeof(why)), -EBUSY);
	assert_non_null(strstr(why, "is already served by another lockfs daemon (pid "));
	assert_non_null(strstr(why, "; mount it once and bind-mount that"));
}

static void test_group_writable_or_missing_dir_is_refused_with_one_line(void **state)
{
	struct store *s = store_of(state);
	char why[512] = "", path[160];

	DIR_ONLY(s);
	snprintf(path, sizeof(path), "%s/open", s->root);
	assert_int_equal(mkdir(path, 0775), 0);
	assert_int_equal(chmod(path, 0775), 0);
	assert_int_equal(open_dir_at(path, s->fence, why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "is writable by its group (mode 0775); anyone could forge "
			       "or remove locks: chmod go-w it"));
	assert_null(strchr(why, '\n'));
	snprintf(path, sizeof(path), "%s/missing", s->root);
	assert_int_equal(open_dir_at(path, s->fence, why, sizeof(why)), -ENOENT);
	assert_non_null(strstr(why, "missing: No such file or directory"));
}

static void test_removed_dir_answers_eio_never_not_held(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat held, st;
	char old[160], *rec = NULL;
	size_t len;

	DIR_ONLY(s);
	assert_int_equal(acquire(s, "held", "before", &held), 0);
	snprintf(old, sizeof(old), "%s/store.old", s->root);
	assert_int_equal(rename(s->dir, old), 0);
	assert_int_equal(mkdir(s->dir, 0755), 0); /* made anew: never adopted */
	assert_int_equal(s->be->ops->check(s->be), -EIO);
	assert_int_equal(s->be->ops->stat(s->be, "held", &st, true), -EIO);
	assert_int_equal(s->be->ops->read(s->be, "held", &rec, &len, &st), -EIO);
	assert_int_equal(s->be->ops->release(s->be, "held", held.identity), -EIO);
	assert_int_equal(acquire(s, "new", "during", &st), -EIO);
	assert_int_equal(s->be->ops->list(s->be, count_name, &(int){ 0 }), -EIO);
	assert_int_equal(rmdir(s->dir), 0); /* nothing was made in the new one */
}

/* ---- The fake's knobs (fake only: what engine tests will lean on) ---- */

#define FAKE_ONLY(s) do { if (!(s)->be || strcmp(kind->name, "fake") != 0) skip(); } while (0)

static void test_fake_fail_knob_fails_count_calls_then_works(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_entry_stat st;

	FAKE_ONLY(s);
	fake_backend_fail(s->be, FAKE_OP_ACQUIRE, ENOMEM, 2);
	assert_int_equal(acquire(s, "k", "t", &st), -ENOMEM);
	assert_int_equal(acquire(s, "k", "t", &st), -ENOMEM);
	assert_int_equal(held_count(s), 0);
	assert_int_equal(acquire(s, "k", "t", &st), 0);
	fake_backend_fail(s->be, FAKE_OP_RELEASE, EIO, -1);
	assert_int_equal(s->be->ops->release(s->be, "k", st.identity), -EIO);
	assert_int_equal(s->be->ops->release(s->be, "k", st.identity), -EIO);
	fake_backend_fail(s->be, FAKE_OP_RELEASE, 0, 0);
	assert_int_equal(s->be->ops->release(s->be, "k", st.identity), 0);
}

static void test_fake_other_host_lock_is_held_and_its_session_live(void **state)
{
	struct store *s = store_of(state);
	struct lockfs_session ses;
	struct lockfs_entry_stat st;
	char tag[64];

	FAKE_ONLY(s);
	assert_int_equal(s->be->ops->session(s->be, "far", &ses), -ENOENT);
	assert_int_equal(fake_backend_other_host(s->be, "o", "far",
						 "{\"fence\": 7, \"tag\": \"theirs\"}"), 0);
	assert_int_equal(s->be->ops->session(s->be, "far", &ses), 0);
	assert_int_equal(ses.state, LOCKFS_SESSION_LIVE);
	assert_int_equal(read_tag(s, "o", tag, &st), 0);
	assert_string_equal(tag, "theirs");
	assert_int_equal(acquire(s, "o", "mine", &st), -EEXIST);
}

static void test_fake_lost_session_is_reported_and_makes_own_locks_stale(void **state)
{
	struct store *s = store_of(state);
	struct changes c = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	struct lockfs_entry_stat st;
	struct lockfs_session ses;

	FAKE_ONLY(s);
	assert_int_equal(acquire(s, "mine", "t", &st), 0);
	assert_int_equal(s->be->ops->start(s->be, on_change, &c), 0);
	fake_backend_session(s->be, LOCKFS_SESSION_UNCERTAIN);
	assert_true(await_change(&c, "*"));
	assert_int_equal(acquire(s, "other", "t", NULL), -EIO);
	fake_backend_session(s->be, LOCKFS_SESSION_LOST);
	assert_int_equal(s->be->ops->session(s->be, NULL, &ses), 0);
	assert_int_equal(ses.state, LOCKFS_SESSION_LOST);
	assert_int_equal(s->be->ops->release(s->be, "mine", st.identity), -ESTALE);
	fake_backend_change(s->be, LOCKFS_CHANGE_NAME, "poke");
	assert_true(await_change(&c, "poke"));
}

int main(int argc, char *argv[])
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_acquire_is_indivisible_among_8_threads,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_stale_identity_never_removes_or_rewrites_a_newer_lock, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fences_increase_per_name_and_across_reopen,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_handoff_gives_the_place_the_lock_with_no_gap,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_list_read_and_stat_agree, setup, teardown),
		cmocka_unit_test_setup_teardown(test_changes_are_reported_within_a_second,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_read_only_store_fails_with_eio_and_makes_nothing, setup_breakable,
			teardown),
		cmocka_unit_test_setup_teardown(test_full_store_fails_with_eio_and_makes_nothing,
						setup_small, teardown),
		cmocka_unit_test_setup_teardown(
			test_foreign_lock_reads_without_record_and_blocks_try, setup, teardown),
		cmocka_unit_test_setup_teardown(test_old_foreign_lock_is_stale_and_recoverable,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_foreign_lock_ages_by_the_daemons_clock,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_own_session_is_live_and_other_hosts_unknown, setup, teardown),
		cmocka_unit_test(test_kinds_are_found_by_name_and_unknown_is_null),
		cmocka_unit_test(test_etcd_kind_is_known_and_says_when_not_built),
		cmocka_unit_test_setup_teardown(test_fake_fail_knob_fails_count_calls_then_works,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_fake_other_host_lock_is_held_and_its_session_live, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_fake_lost_session_is_reported_and_makes_own_locks_stale, setup, teardown),
		cmocka_unit_test_setup_teardown(test_removed_dir_answers_eio_never_not_held,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_second_daemon_on_the_same_dir_is_refused,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_group_writable_or_missing_dir_is_refused_with_one_line, setup, teardown),
	};

	if (argc < 2) {
		fprintf(stderr, "usage: %s dir|fake|etcd [URL]\n", argv[0]);
		return 2;
	}
	if (strcmp(argv[1], "dir") == 0) {
		kind = &dir_fixture;
	} else if (strcmp(argv[1], "fake") == 0) {
		kind = &fake_fixture;
	} else if (strcmp(argv[1], "etcd") == 0) {
#ifdef LOCKFS_WITH_ETCD
		kind = &etcd_fixture;
		etcd_url = argc > 2 ? argv[2] : getenv("LOCKFS_ETCD_ENDPOINTS");
		if (!etcd_url || !*etcd_url) {
			printf("SKIP: no etcd URL (argv[2], or run under etcd_fixtures.py exec)\n");
			return 77;
		}
#else
		printf("SKIP: etcd support not built (-Detcd=disabled)\n");
		return 77;
#endif
	} else {
		fprintf(stderr, "%s: unknown backend kind %s\n", argv[0], argv[1]);
		return 2;
	}
	cmocka_set_message_output(CM_OUTPUT_STDOUT);
	return _cmocka_run_group_tests(kind->name, tests, sizeof(tests) / sizeof(tests[0]),
				       NULL, NULL);
}
