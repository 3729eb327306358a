/*
 * Unit tests for core/proc/helpers.c and the holder walk through genuine
 * helpers: the helper list (helpers=), which binaries count as the system's
 * helpers, the uid boundary (issue 8 §3), processes in another root
 * (a container), and the pid namespace boundary (issue 22 §1), all on the
 * fake process table.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "lockfs/holder.h"

#include "fake_procs.h"
#include "holder_test_util.h"

/* ---- the helper list ------------------------------------------------- */

static void test_helpers_default_list(void **state)
{
	struct lockfs_helpers *h = *state;
	assert_true(lockfs_helpers_contains(h, "mkdir"));
	assert_true(lockfs_helpers_contains(h, "lockctl"));
	assert_true(lockfs_helpers_contains(h, "sudo"));
	assert_false(lockfs_helpers_contains(h, "bash"));
	assert_false(lockfs_helpers_contains(h, "mkdi"));
	assert_false(lockfs_helpers_contains(h, ""));
	assert_false(lockfs_helpers_contains(h, NULL));
}

static void test_helpers_empty_string_is_empty_set(void **state)
{
	struct lockfs_helpers h;
	assert_int_equal(lockfs_helpers_parse(&h, ""), 0);
	assert_non_null(h.names);
	assert_null(h.names[0]);
	assert_false(lockfs_helpers_contains(&h, "mkdir"));
	lockfs_helpers_free(&h);
}

static void test_helpers_single_and_several(void **state)
{
	struct lockfs_helpers h;
	assert_int_equal(lockfs_helpers_parse(&h, "foo"), 0);
	assert_string_equal(h.names[0], "foo");
	assert_null(h.names[1]);
	lockfs_helpers_free(&h);
	assert_null(h.names);

	assert_int_equal(lockfs_helpers_parse(&h, "a:bb:ccc"), 0);
	assert_string_equal(h.names[0], "a");
	assert_string_equal(h.names[1], "bb");
	assert_string_equal(h.names[2], "ccc");
	assert_null(h.names[3]);
	assert_true(lockfs_helpers_contains(&h, "bb"));
	assert_false(lockfs_helpers_contains(&h, "b"));
	lockfs_helpers_free(&h);
}

static void test_helpers_bad_lists_are_einval(void **state)
{
	static const char *const bad[] = {
		":", "a:", ":a", "a::b", "/", "a/b", "mkdir:/bin/mkdir",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct lockfs_helpers h;
		assert_int_equal(lockfs_helpers_parse(&h, bad[i]), -EINVAL);
		assert_null(h.names);
		lockfs_helpers_free(&h); /* safe after a failure */
	}
}

/* ---- genuine helpers and the uid boundary (issue 8 §3) --------------- */

/* resolve() with the holder's at_uid_boundary in *BOUNDARY. */
static int resolve_b(void **state, pid_t tid, bool *boundary)
{
	struct lockfs_proc p;
	int rc = lockfs_holder_resolve(fake, tid, LOCKFS_UID_UNKNOWN, *state, 0, &p);

	*boundary = rc == 0 && p.at_uid_boundary;
	return rc < 0 ? rc : p.pid;
}

static void test_a_program_named_like_a_helper_is_no_helper(void **state)
{
	bool b;

	assert_int_equal(resolve_b(state, 1600, &b), 1600); /* ~/bin/mkdir */
	assert_false(b);
	assert_int_equal(resolve_b(state, 600, &b), 500);   /* the real one */
}

static void test_busybox_applets_are_judged_by_their_binary(void **state)
{
	bool b;

	assert_int_equal(resolve_b(state, 1610, &b), 1610); /* a copy of busybox */
	assert_int_equal(resolve_b(state, 1620, &b), 500);  /* the system's */
	assert_int_equal(resolve_b(state, 1630, &b), 500);  /* one-binary coreutils */
}

static void test_a_helper_under_a_parent_of_another_uid_stops_the_walk(void **state)
{
	struct lockfs_proc p;
	bool b;

	/* setpriv --reuid=4242 mkdir, run by a root shell */
	assert_int_equal(resolve_b(state, 1701, &b), 1701);
	assert_true(b);
	/* the same with the uid FUSE reports for the request */
	assert_int_equal(lockfs_holder_resolve(fake, 1701, 4242, *state, 0, &p), 0);
	assert_int_equal(p.pid, 1701);
	assert_true(p.at_uid_boundary);
}

static void test_a_users_fake_env_under_a_root_shell_acts_for_itself(void **state)
{
	bool b;

	assert_int_equal(resolve_b(state, 1702, &b), 1702);
	assert_false(b); /* not a helper at all: no boundary to speak of */
}

static void test_helpers_under_a_shell_of_their_own_uid_are_skipped(void **state)
{
	bool b;

	assert_int_equal(resolve_b(state, 1704, &b), 1703);
	assert_false(b);
}

static void test_the_walk_stops_at_the_last_helper_before_the_boundary(void **state)
{
	bool b;

	/* mkdir (4242) -> timeout (4242) | root shell */
	assert_int_equal(resolve_b(state, 1706, &b), 1705);
	assert_true(b);
}

static void test_genuine_setuid_sudo_crosses_to_the_user_who_ran_it(void **state)
{
	struct lockfs_proc p;

	assert_int_equal(lockfs_holder_resolve(fake, 1802, 0, *state, 0, &p), 0);
	assert_int_equal(p.pid, 1800);
	assert_int_equal(p.uid, 1000);
	assert_false(p.at_uid_boundary);
}

static void test_a_setuid_file_that_is_not_the_systems_sudo_holds(void **state)
{
	bool b;

	assert_int_equal(resolve_b(state, 1812, &b), 1811);
	assert_false(b);
}

static void test_sudo_without_its_setuid_bit_does_not_cross(void **state)
{
	bool b;

	assert_int_equal(resolve_b(state, 1822, &b), 1821);
	assert_true(b);
}

static void test_sudo_u_another_user_mkdir_stops_at_mkdir(void **state)
{
	bool b;

	/* mkdir (4242) under sudo (root): mkdir is not set-uid */
	assert_int_equal(resolve_b(state, 1831, &b), 1831);
	assert_true(b);
}

static void test_a_helper_nobody_can_stat_is_no_helper(void **state)
{
	struct lockfs_proc_source blind = { .read_tid = fake_procs_read_tid };
	struct lockfs_proc p;

	assert_int_equal(lockfs_holder_resolve(&blind, 600, 1000, *state, 0, &p), 0);
	assert_int_equal(p.pid, 600);
}

/* ---- processes in another root (a container) -------------------------- */

static void put_file(const char *rel, mode_t mode)
{
	char path[PATH_MAX * 2];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", fake_procs_root_dir, rel);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, rel, strlen(rel)), (ssize_t)strlen(rel));
	close(fd);
	assert_int_equal(chmod(path, mode), 0);
}

static void put_dir(const char *rel, mode_t mode)
{
	char path[PATH_MAX * 2];

	snprintf(path, sizeof(path), "%s/%s", fake_procs_root_dir, rel);
	assert_int_equal(mkdir(path, mode), 0);
	assert_int_equal(chmod(path, mode), 0);
}

/* A root file system: usr/bin/{mkdir,sh}, bin -> usr/bin, a user's
 * home/u/mkdir, and a world-writable usr/local/bin/env. */
static int setup_root(void **state)
{
	char path[PATH_MAX * 2];

	snprintf(fake_procs_root_dir, sizeof(fake_procs_root_dir), "/tmp/lockfs-test-root-XXXXXX");
	if (!mkdtemp(fake_procs_root_dir) || chmod(fake_procs_root_dir, 0755) < 0)
		return -1;
	put_dir("usr", 0755);
	put_dir("usr/bin", 0755);
	put_dir("usr/local", 0755);
	put_dir("usr/local/bin", 0777);
	put_dir("home", 0755);
	put_dir("home/u", 0755);
	put_file("usr/bin/mkdir", 0755);
	put_file("usr/bin/sh", 0755);
	put_file("home/u/mkdir", 0755);
	put_file("usr/local/bin/env", 0755);
	snprintf(path, sizeof(path), "%s/bin", fake_procs_root_dir);
	return symlink("usr/bin", path) == 0 ? setup_helpers(state) : -1;
}

static int teardown_root(void **state)
{
	char cmd[PATH_MAX + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fake_procs_root_dir);
	fake_procs_root_dir[0] = '\0';
	return teardown_helpers(state) | system(cmd);
}

static void test_a_containers_own_mkdir_is_genuine_in_its_root(void **state)
{
	struct lockfs_proc p;

	assert_int_equal(lockfs_holder_resolve(fake, 1901, 1000, *state, LOCKFS_PROC_NS, &p), 0);
	assert_int_equal(p.pid, 1900);
	assert_int_equal(p.ns_pid, 1);
	assert_string_equal(p.container, "c0ffee");
}

static void test_a_copy_elsewhere_in_a_containers_root_is_not(void **state)
{
	assert_int_equal(resolve(state, 1902), 1902);
}

static void test_a_helper_in_a_world_writable_system_dir_is_not(void **state)
{
	assert_int_equal(resolve(state, 1903), 1903);
}

static void test_ns_info_only_when_asked(void **state)
{
	struct lockfs_proc p;

	assert_int_equal(lockfs_holder_resolve(fake, 500, 1000, *state, 0, &p), 0);
	assert_int_equal(p.ns_pid, 0);
	assert_string_equal(p.container, "");
	assert_int_equal(lockfs_holder_resolve(fake, 600, 1000, *state, LOCKFS_PROC_NS, &p), 0);
	assert_int_equal(p.ns_pid, 500);
	assert_string_equal(p.container, "");
}

/* ---- the pid namespace boundary (issue 22 §1) -------------------------- */

/* resolve() with the holder's at_pidns_boundary in *BOUNDARY. */
static int resolve_ns(void **state, pid_t tid, bool *boundary)
{
	struct lockfs_proc p;
	int rc = lockfs_holder_resolve(fake, tid, LOCKFS_UID_UNKNOWN, *state, 0, &p);

	*boundary = rc == 0 && p.at_pidns_boundary;
	return rc < 0 ? rc : p.pid;
}

static void test_the_first_process_of_a_pid_namespace_holds_not_unshare(void **state)
{
	bool b;

	/* unshare --pid --fork --mount-proc flock F cat: flock, not unshare */
	assert_int_equal(resolve_ns(state, 2001, &b), 2001);
	assert_true(b);
}

static void test_helpers_inside_one_pid_namespace_are_still_skipped(void **state)
{
	bool b;

	/* unshare ... sh -c 'mkdir X': the namespace's shell */
	assert_int_equal(resolve_ns(state, 2003, &b), 2002);
	assert_false(b);
	/* and the usual walk on the host, as a negative control */
	assert_int_equal(resolve_ns(state, 600, &b), 500);
	assert_false(b);
}

static void test_podman_exec_helpers_stop_at_the_containers_edge(void **state)
{
	bool b;

	/* podman exec C lockctl ...: lockctl itself, never conmon */
	assert_int_equal(resolve_ns(state, 2011, &b), 2011);
	assert_true(b);
	/* podman exec C timeout 5 mkdir X: the last helper inside */
	assert_int_equal(resolve_ns(state, 2013, &b), 2012);
	assert_true(b);
}

static void test_an_unbelievable_parent_outside_still_leaves_the_child_holding(void **state)
{
	bool b;

	/* runc started after flock and is in another session: it is not
	 * flock's parent, but neither would a real parent outside be. */
	assert_int_equal(resolve_ns(state, 2021, &b), 2021);
	assert_true(b);
}

static void test_a_parent_the_daemon_cannot_see_is_outside(void **state)
{
	bool b;

	/* ppid 0 from the daemon's /proc: the parent is outside its pid
	 * namespace, so outside the caller's */
	assert_int_equal(resolve_ns(state, 2030, &b), 2030);
	assert_true(b);
	/* init's own orphans are still nobody's */
	assert_int_equal(resolve_ns(state, 900, &b), -EACCES);
}

static void test_a_namespace_nobody_may_read_lets_the_walk_go_on(void **state)
{
	bool b;

	assert_int_equal(resolve_ns(state, 2041, &b), 2040);
	assert_false(b);
}

static void test_a_source_without_pidns_knows_one_namespace(void **state)
{
	struct lockfs_proc_source one = fake_procs_source;
	struct lockfs_proc p;

	one.pidns = NULL;
	assert_int_equal(lockfs_holder_resolve(&one, 2001, 1000, *state, 0, &p), 0);
	assert_int_equal(p.pid, 2000); /* the old walk: unshare */
	assert_false(p.at_pidns_boundary);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_helpers, teardown_helpers)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_helpers_default_list),
		T(test_helpers_empty_string_is_empty_set),
		T(test_helpers_single_and_several),
		T(test_helpers_bad_lists_are_einval),
		T(test_a_program_named_like_a_helper_is_no_helper),
		T(test_busybox_applets_are_judged_by_their_binary),
		T(test_a_helper_under_a_parent_of_another_uid_stops_the_walk),
		T(test_a_users_fake_env_under_a_root_shell_acts_for_itself),
		T(test_helpers_under_a_shell_of_their_own_uid_are_skipped),
		T(test_the_walk_stops_at_the_last_helper_before_the_boundary),
		T(test_genuine_setuid_sudo_crosses_to_the_user_who_ran_it),
		T(test_a_setuid_file_that_is_not_the_systems_sudo_holds),
		T(test_sudo_without_its_setuid_bit_does_not_cross),
		T(test_sudo_u_another_user_mkdir_stops_at_mkdir),
		T(test_a_helper_nobody_can_stat_is_no_helper),
		T(test_ns_info_only_when_asked),
		T(test_the_first_process_of_a_pid_namespace_holds_not_unshare),
		T(test_helpers_inside_one_pid_namespace_are_still_skipped),
		T(test_podman_exec_helpers_stop_at_the_containers_edge),
		T(test_an_unbelievable_parent_outside_still_leaves_the_child_holding),
		T(test_a_parent_the_daemon_cannot_see_is_outside),
		T(test_a_namespace_nobody_may_read_lets_the_walk_go_on),
		T(test_a_source_without_pidns_knows_one_namespace),
		cmocka_unit_test_setup_teardown(test_a_containers_own_mkdir_is_genuine_in_its_root,
						setup_root, teardown_root),
		cmocka_unit_test_setup_teardown(test_a_copy_elsewhere_in_a_containers_root_is_not,
						setup_root, teardown_root),
		cmocka_unit_test_setup_teardown(test_a_helper_in_a_world_writable_system_dir_is_not,
						setup_root, teardown_root),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
