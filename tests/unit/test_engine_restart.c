/*
 * The engine's startup scan across a daemon restart on the fake backend
 * (fake_backend.h): on a store with sessions (etcd) every kept lock of
 * this host is adopted into the new session -- a lock the store says is
 * gone is `lost`, one the store cannot take now is kept -- and another
 * host's lock is never asked for; a dir-like store (no caps) is never
 * asked at all.  The holder is this test process, through /proc.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "lockfs/backend.h"
#include "lockfs/core.h"
#include "lockfs/log.h"
#include "fake_backend.h"

struct env {
	struct fake_store *store;
	struct lockfs_backend *be;   /* the running daemon's (the core owns it) */
	struct lockfs_core *core;
	unsigned caps;
	char dir[64];
	int dirfd;
	struct lockfs_caller me;
};

/* A daemon on E's store: a new backend (a new session) and engine.  The
 * next ADOPT_FAILS calls of adopt return -ADOPT_ERR (0: none). */
static void daemon_start(struct env *e, int adopt_err, int adopt_fails)
{
	struct lockfs_core_config cfg = { 0 };
	struct lockfs_backend *be;
	struct lockfs_log *log;

	assert_int_equal(fake_backend_open(e->store, &be), 0);
	be->caps = e->caps;
	if (adopt_err)
		fake_backend_fail(be, FAKE_OP_ADOPT, adopt_err, adopt_fails);
	assert_int_equal(lockfs_log_open(&log, e->dirfd, "lock.log", NULL), 0);
	cfg.backend = be;
	cfg.log = log;
	cfg.descendants_scan = true;
	assert_int_equal(lockfs_core_open(&e->core, &cfg), 0);
	e->be = be;
}

/* The daemon goes; its locks stay in the store for the next one. */
static void daemon_stop(struct env *e)
{
	lockfs_core_stop(e->core);
	lockfs_core_close(e->core);
	e->core = NULL;
	e->be = NULL;
}

static int open_env(void **state, unsigned caps)
{
	struct env *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	snprintf(e->dir, sizeof(e->dir), "/tmp/lockfs-test-restart-XXXXXX");
	assert_non_null(mkdtemp(e->dir));
	e->dirfd = open(e->dir, O_RDONLY | O_DIRECTORY);
	assert_true(e->dirfd >= 0);
	assert_non_null(e->store = fake_store_new());
	e->caps = caps;
	e->me = (struct lockfs_caller){ .tid = getpid(), .uid = getuid(), .gid = getgid() };
	*state = e;
	return 0;
}

static int setup_sessions(void **state)
{
	return open_env(state, LOCKFS_BE_SESSIONS | LOCKFS_BE_RETRY_RELEASES);
}

static int setup_dirlike(void **state)
{
	return open_env(state, 0);
}

static int teardown(void **state)
{
	struct env *e = *state;
	char path[128];

	if (e->core)
		daemon_stop(e);
	fake_store_free(e->store);
	snprintf(path, sizeof(path), "%s/lock.log", e->dir);
	unlink(path);
	close(e->dirfd);
	rmdir(e->dir);
	free(e);
	return 0;
}

/* How many lines of the audit log end with " EVENT" and name NAME. */
static int log_count(struct env *e, const char *name, const char *event)
{
	char path[128], line[4096], field[300];
	int n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/lock.log", e->dir);
	f = fopen(path, "r");
	assert_non_null(f);
	snprintf(field, sizeof(field), " %s ", name);
	while (fgets(line, sizeof(line), f)) {
		size_t len = strcspn(line, "\n"), elen = strlen(event);

		line[len] = '\0';
		if (strstr(line, field) && len > elen && line[len - elen - 1] == ' ' &&
		    strcmp(line + len - elen, event) == 0)
			n++;
	}
	fclose(f);
	return n;
}

static void test_restart_asks_the_store_to_adopt_each_live_lock_of_this_host(void **state)
{
	struct env *e = *state;

	daemon_start(e, 0, 0);
	assert_int_equal(lockfs_core_acquire(e->core, "x", &e->me, NULL), 0);
	daemon_stop(e);
	/* The store says x is gone: it was asked, and the holder is told. */
	daemon_start(e, ENOENT, -1);
	assert_int_equal(log_count(e, "x", "lost"), 1);
	assert_int_equal(log_count(e, "x", "recovered"), 0);
}

static void test_restart_never_asks_to_adopt_another_hosts_lock(void **state)
{
	struct env *e = *state;
	json_t *rec;
	char *text, *out;
	size_t len;

	/* Another host's lock: a record of ours with its holder's host
	 * changed (a live process, but not this host's to judge). */
	daemon_start(e, 0, 0);
	assert_int_equal(lockfs_core_acquire(e->core, "template", &e->me, NULL), 0);
	assert_int_equal(e->be->ops->read(e->be, "template", &text, &len, NULL), 0);
	assert_int_equal(lockfs_core_release(e->core, "template", &e->me), 0);
	assert_non_null(rec = json_loadb(text, len, 0, NULL));
	free(text);
	json_object_set_new(rec, "resource", json_string("z"));
	json_object_set_new(json_object_get(rec, "holder"), "host", json_string("other-host"));
	assert_non_null(out = json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER));
	json_decref(rec);
	assert_int_equal(fake_backend_other_host(e->be, "z", "other-host", out), 0);
	free(out);
	daemon_stop(e);
	daemon_start(e, ENOENT, -1);
	assert_int_equal(log_count(e, "z", "lost"), 0);
	assert_int_equal(lockfs_core_stat(e->core, "z", NULL), 0);
}

static void test_restart_keeps_a_lock_the_store_cannot_adopt_now(void **state)
{
	struct env *e = *state;

	daemon_start(e, 0, 0);
	assert_int_equal(lockfs_core_acquire(e->core, "x", &e->me, NULL), 0);
	daemon_stop(e);
	/* Every try fails with EIO: kept as it is (fail closed), not lost. */
	daemon_start(e, EIO, -1);
	assert_int_equal(log_count(e, "x", "lost"), 0);
	assert_int_equal(lockfs_core_stat(e->core, "x", NULL), 0);
	fake_backend_fail(e->be, FAKE_OP_ADOPT, 0, 0);
	assert_int_equal(lockfs_core_release(e->core, "x", &e->me), 0);
}

static void test_dirlike_store_is_never_asked_to_adopt(void **state)
{
	struct env *e = *state;

	daemon_start(e, 0, 0);
	assert_int_equal(lockfs_core_acquire(e->core, "x", &e->me, NULL), 0);
	daemon_stop(e);
	daemon_start(e, ENOENT, -1);
	assert_int_equal(log_count(e, "x", "lost"), 0);
	assert_int_equal(lockfs_core_release(e->core, "x", &e->me), 0);
	assert_int_equal(log_count(e, "x", "released"), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			test_restart_asks_the_store_to_adopt_each_live_lock_of_this_host,
			setup_sessions, teardown),
		cmocka_unit_test_setup_teardown(test_restart_never_asks_to_adopt_another_hosts_lock,
						setup_sessions, teardown),
		cmocka_unit_test_setup_teardown(test_restart_keeps_a_lock_the_store_cannot_adopt_now,
						setup_sessions, teardown),
		cmocka_unit_test_setup_teardown(test_dirlike_store_is_never_asked_to_adopt,
						setup_dirlike, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
