/*
 * The engine (include/lockfs/core.h) on the fake backend (fake_backend.h):
 * what a store with sessions (etcd) makes it do -- a lost session's locks
 * are lost (a `lost` line, a tombstone, ESTALE for the holder, ENOENT for
 * others), no grant while the session is uncertain, the unconfirmed view,
 * a refused release completed once -- and that a dir-like store (no caps)
 * keeps today's answers.  The holder is this test process, through /proc.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "lockfs/backend.h"
#include "lockfs/core.h"
#include "lockfs/log.h"
#include "fake_backend.h"

struct env {
	struct fake_store *store;
	struct lockfs_backend *be;
	struct lockfs_core *core;
	char dir[64];
	int dirfd;
	struct lockfs_caller me;
};

static int open_env(void **state, unsigned caps)
{
	struct env *e = calloc(1, sizeof(*e));
	struct lockfs_log *log;
	struct lockfs_core_config cfg = { 0 };

	assert_non_null(e);
	snprintf(e->dir, sizeof(e->dir), "/tmp/lockfs-test-engine-XXXXXX");
	assert_non_null(mkdtemp(e->dir));
	e->dirfd = open(e->dir, O_RDONLY | O_DIRECTORY);
	assert_true(e->dirfd >= 0);
	assert_non_null(e->store = fake_store_new());
	assert_int_equal(fake_backend_open(e->store, &e->be), 0);
	e->be->caps = caps;
	assert_int_equal(lockfs_log_open(&log, e->dirfd, "lock.log", NULL), 0);
	cfg.backend = e->be;
	cfg.log = log;
	cfg.descendants_scan = true;
	assert_int_equal(lockfs_core_open(&e->core, &cfg), 0);
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

	lockfs_core_stop(e->core);
	lockfs_core_close(e->core);
	fake_store_free(e->store);
	snprintf(path, sizeof(path), "%s/lock.log", e->dir);
	unlink(path);
	close(e->dirfd);
	rmdir(e->dir);
	free(e);
	return 0;
}

/* The audit log's text (malloc'd). */
static char *log_text(struct env *e)
{
	char path[128], *buf = calloc(1, 65536);
	FILE *f;

	snprintf(path, sizeof(path), "%s/lock.log", e->dir);
	f = fopen(path, "r");
	assert_non_null(f);
	(void)!fread(buf, 1, 65535, f);
	fclose(f);
	return buf;
}

static char *owner_of(struct env *e, const char *name)
{
	char *json = NULL;
	size_t len = 0;

	assert_int_equal(lockfs_core_owner(e->core, name, getuid(), &json, &len), 0);
	return json;
}

static void test_lost_session_tombstones_the_lock_holder_gets_estale(void **state)
{
	struct env *e = *state;
	struct lockfs_caller other = { .tid = getppid(), .uid = getuid(), .gid = getgid() };
	char *log;

	assert_int_equal(lockfs_core_acquire(e->core, "x", &e->me, NULL), 0);
	fake_backend_session(e->be, LOCKFS_SESSION_LOST);
	/* The release looks at the session first: lost, so the lock is. */
	assert_int_equal(lockfs_core_release(e->core, "x", &other), -ENOENT);
	assert_true(lockfs_core_lost(e->core, "x"));
	assert_int_equal(lockfs_core_stat(e->core, "x", NULL), -ENOENT);
	assert_int_equal(lockfs_core_release(e->core, "x", &e->me), -ESTALE);
	log = log_text(e);
	assert_non_null(strstr(log, "evidence=session-expired session="));
	assert_non_null(strstr(log, " lost\n"));
	assert_null(strstr(log, "released"));
	free(log);
}

static void test_uncertain_session_refuses_grants_and_owner_says_so(void **state)
{
	struct env *e = *state;
	char *o;

	assert_int_equal(lockfs_core_acquire(e->core, "y", &e->me, NULL), 0);
	o = owner_of(e, "y");
	assert_non_null(strstr(o, "\"session\": \"live\""));
	free(o);
	fake_backend_session(e->be, LOCKFS_SESSION_UNCERTAIN);
	assert_int_equal(lockfs_core_acquire(e->core, "z", &e->me, NULL), -EIO);
	o = owner_of(e, "y");
	assert_non_null(strstr(o, "\"session\": \"uncertain\""));
	free(o);
	fake_backend_session(e->be, LOCKFS_SESSION_LIVE);
	assert_int_equal(lockfs_core_release(e->core, "y", &e->me), 0);
}

static void test_refused_release_is_eio_then_completed_once(void **state)
{
	struct env *e = *state;
	char *log, *p;
	int n = 0;

	assert_int_equal(lockfs_core_acquire(e->core, "r", &e->me, NULL), 0);
	fake_backend_fail(e->be, FAKE_OP_RELEASE, EIO, 1);
	assert_int_equal(lockfs_core_release(e->core, "r", &e->me), -EIO);
	log = log_text(e);
	assert_null(strstr(log, "released"));
	free(log);
	lockfs_core_stop(e->core); /* its last try of the refused releases, as the tick's */
	assert_int_equal(lockfs_core_stat(e->core, "r", NULL), -ENOENT);
	log = log_text(e);
	for (p = log; (p = strstr(p, "retried=1 released")); p++)
		n++;
	assert_int_equal(n, 1);
	free(log);
}

static void test_dirlike_store_keeps_todays_answers(void **state)
{
	struct env *e = *state;
	char *o;

	assert_int_equal(lockfs_core_acquire(e->core, "d", &e->me, NULL), 0);
	o = owner_of(e, "d");
	assert_null(strstr(o, "\"session\""));
	assert_null(strstr(o, "\"key\""));
	free(o);
	assert_false(lockfs_core_lost(e->core, "d"));
	fake_backend_fail(e->be, FAKE_OP_RELEASE, EIO, 1);
	assert_int_equal(lockfs_core_release(e->core, "d", &e->me), -EIO);
	lockfs_core_stop(e->core); /* its last try of the refused releases, as the tick's */
	/* No RETRY_RELEASES: the lock stays held; its holder must rmdir again. */
	assert_int_equal(lockfs_core_stat(e->core, "d", NULL), 0);
	assert_int_equal(lockfs_core_release(e->core, "d", &e->me), 0);
	assert_int_equal(lockfs_core_release(e->core, "d", &e->me), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_lost_session_tombstones_the_lock_holder_gets_estale,
						setup_sessions, teardown),
		cmocka_unit_test_setup_teardown(test_uncertain_session_refuses_grants_and_owner_says_so,
						setup_sessions, teardown),
		cmocka_unit_test_setup_teardown(test_refused_release_is_eio_then_completed_once,
						setup_sessions, teardown),
		cmocka_unit_test_setup_teardown(test_dirlike_store_keeps_todays_answers,
						setup_dirlike, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
