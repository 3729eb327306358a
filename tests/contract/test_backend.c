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
 *
 * This file holds the hooks per kind, the setup and main(); the cases are
 * in test_backend_cases.c (the contract, for every kind) and
 * test_backend_kinds.c (one kind's own), declared in backend_contract.h.
 */
#include "backend_contract.h"

#ifdef LOCKFS_WITH_ETCD
#include "lockfs/etcd_client.h"
#endif

const struct kind_fixture *kind;

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
		cmocka_unit_test_setup_teardown(test_list_prefix_lists_only_those_names, setup,
						teardown),
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
