/*
 * The backend suite's cases for one kind only: the kinds' lookup by
 * name, the dir kind's state directory checks, and the fake store's
 * knobs the engine tests lean on.  They skip on the other kinds.
 */
#include "backend_contract.h"

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

void test_kinds_are_found_by_name_and_unknown_is_null(void **state)
{
	assert_non_null(lockfs_backend_kind("dir"));
	assert_string_equal(lockfs_backend_kind("dir")->name, "dir");
	assert_ptr_equal(lockfs_backend_kinds[0], lockfs_backend_kind("dir"));
	assert_null(lockfs_backend_kind("nope"));
	assert_null(lockfs_backend_kind(NULL));
}

/* -o backend=etcd is known by name in every build; without libcurl its
 * open says why in one line. */
void test_etcd_kind_is_known_and_says_when_not_built(void **state)
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

void test_second_daemon_on_the_same_dir_is_refused(void **state)
{
	struct store *s = store_of(state);
	char why[512] = "";

	DIR_ONLY(s);
	assert_int_equal(lockfs_backend_record_pid(s->be), 0);
	assert_int_equal(open_dir_at(s->dir, s->fence, why, sizeof(why)), -EBUSY);
	assert_non_null(strstr(why, "is already served by another lockfs daemon (pid "));
	assert_non_null(strstr(why, "; mount it once and bind-mount that"));
}

void test_group_writable_or_missing_dir_is_refused_with_one_line(void **state)
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

void test_removed_dir_answers_eio_never_not_held(void **state)
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

void test_fake_fail_knob_fails_count_calls_then_works(void **state)
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

void test_fake_other_host_lock_is_held_and_its_session_live(void **state)
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

void test_fake_lost_session_is_reported_and_makes_own_locks_stale(void **state)
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

