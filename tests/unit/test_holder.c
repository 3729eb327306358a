/*
 * Unit tests for core/proc/holder.c on a fake process table: the holder rule
 * (which process a mkdir names, past the helpers), the release rule (which
 * processes may rmdir), and the fake table itself (fake_procs.h).
 * Helper lists and foreign roots: test_helpers.c; the real /proc: test_procfs.c.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "lockfs/holder.h"

#include "fake_procs.h"
#include "holder_test_util.h"

/* ---- the holder rule ------------------------------------------------- */

static void test_caller_not_a_helper_is_the_holder(void **state)
{
	struct lockfs_proc p;
	assert_int_equal(lockfs_holder_resolve(fake, 500, 1000, *state, 0, &p), 0);
	assert_int_equal(p.pid, 500);
	assert_int_equal(p.start_time, 1000);
	assert_string_equal(p.exe, "bash");
	assert_int_equal(fake_procs_reads, 1);
}

static void test_mkdir_helper_is_skipped_to_the_shell(void **state)
{
	struct lockfs_proc p;
	assert_int_equal(lockfs_holder_resolve(fake, 600, 1000, *state, 0, &p), 0);
	assert_int_equal(p.pid, 500);
	assert_int_equal(p.start_time, 1000);
	assert_int_equal(fake_procs_reads, 2);
}

static void test_sudo_env_mkdir_chain_is_skipped_to_the_shell(void **state)
{
	assert_int_equal(resolve(state, 712), 500);
}

static void test_busybox_applet_mkdir_is_skipped(void **state)
{
	assert_int_equal(resolve(state, 730), 500);
}

static void test_empty_helper_list_skips_nothing(void **state)
{
	struct lockfs_helpers none;
	struct lockfs_proc p;
	assert_int_equal(lockfs_helpers_parse(&none, ""), 0);
	assert_int_equal(lockfs_holder_resolve(fake, 712, 1000, &none, 0, &p), 0);
	assert_int_equal(p.pid, 712);
	lockfs_helpers_free(&none);
}

static void test_thread_id_maps_to_its_thread_group(void **state)
{
	struct lockfs_proc p;
	assert_int_equal(lockfs_holder_resolve(fake, 802, 1000, *state, 0, &p), 0);
	assert_int_equal(p.pid, 800);
	assert_int_equal(p.start_time, 4000);
}

static void test_tid_zero_is_eacces(void **state)
{
	assert_int_equal(resolve(state, 0), -EACCES);
	assert_int_equal(fake_procs_reads, 0);
}

static void test_helper_whose_parent_is_init_is_eacces(void **state)
{
	assert_int_equal(resolve(state, 900), -EACCES);
}

static void test_helper_whose_parent_started_later_is_eacces(void **state)
{
	assert_int_equal(resolve(state, 920), -EACCES);
}

static void test_helper_adopted_by_subreaper_is_eacces(void **state)
{
	assert_int_equal(resolve(state, 940), -EACCES);
}

static void test_helper_leading_its_own_session_is_skipped(void **state)
{
	assert_int_equal(resolve(state, 720), 500);  /* sudo with a pty */
	assert_int_equal(resolve(state, 721), 500);  /* mkdir under it */
}

static void test_helper_whose_parent_vanished_is_eacces(void **state)
{
	assert_int_equal(resolve(state, 950), -EACCES);
}

static void test_caller_vanished_is_esrch(void **state)
{
	assert_int_equal(resolve(state, 999), -ESRCH);
}

static void test_caller_init_is_eacces(void **state)
{
	assert_int_equal(resolve(state, 1), -EACCES);
}

static void test_helper_cycle_is_eacces(void **state)
{
	assert_int_equal(resolve(state, 960), -EACCES);
}

static void test_unreadable_exe_is_not_a_helper(void **state)
{
	assert_int_equal(resolve(state, 970), 970);
}

/* ---- the release rule ------------------------------------------------ */

static int may(pid_t tid, pid_t holder, unsigned long long start)
{
	return lockfs_holder_may_release(fake, tid, holder, start, false);
}

/* With the holder known alive (a pidfd says so), its pid alone names it. */
static void test_live_holder_itself_needs_no_read(void **state)
{
	fake_procs_reads = 0;
	assert_int_equal(lockfs_holder_may_release(fake, 500, 500, 1000, true), 0);
	assert_int_equal(fake_procs_reads, 0);
}

static void test_child_of_live_holder_reads_only_itself(void **state)
{
	fake_procs_reads = 0;
	assert_int_equal(lockfs_holder_may_release(fake, 610, 500, 1000, true), 0);
	assert_int_equal(fake_procs_reads, 1);
}

static void test_live_holder_rule_still_refuses_strangers(void **state)
{
	assert_int_equal(lockfs_holder_may_release(fake, 400, 500, 1000, true), -EPERM);
	assert_int_equal(lockfs_holder_may_release(fake, 930, 500, 1000, true), -EPERM);
	/* a thread of the live holder's process */
	assert_int_equal(lockfs_holder_may_release(fake, 801, 800, 4000, true), 0);
}

static void test_dead_holder_pid_match_needs_start_time(void **state)
{
	/* Not known alive: pid 500 might be someone new; the start time
	 * decides. */
	assert_int_equal(lockfs_holder_may_release(fake, 500, 500, 999, false), -EPERM);
}

static void test_release_by_the_holder_itself(void **state)
{
	assert_int_equal(may(500, 500, 1000), 0);
}

static void test_release_by_execd_rmdir_in_the_holder_process(void **state)
{
	/* 1500 took the lock as `mkdir` and exec'd `rmdir`: it resolves to
	 * its shell, yet as the holder itself it may release. */
	assert_int_equal(resolve(state, 1500), 500);
	assert_int_equal(may(1500, 1500, 7000), 0);
}

static void test_release_by_a_thread_of_the_holder(void **state)
{
	assert_int_equal(may(801, 800, 4000), 0);
}

static void test_release_by_child_of_holder(void **state)
{
	assert_int_equal(may(610, 500, 1000), 0);
}

static void test_release_by_grandchild_of_holder(void **state)
{
	assert_int_equal(may(620, 500, 1000), 0);
	assert_int_equal(may(712, 500, 1000), 0);
}

static void test_release_by_sibling_is_eperm(void **state)
{
	assert_int_equal(may(610, 600, 2000), -EPERM);
}

static void test_release_by_unrelated_is_eperm(void **state)
{
	assert_int_equal(may(400, 500, 1000), -EPERM); /* the holder's parent */
	assert_int_equal(may(930, 500, 1000), -EPERM);
}

static void test_release_with_reused_holder_pid_is_eperm(void **state)
{
	assert_int_equal(may(500, 500, 999), -EPERM);
	assert_int_equal(may(610, 500, 999), -EPERM);
}

static void test_release_across_a_younger_parent_is_eperm(void **state)
{
	/* 920's parent pid 910 belongs to a process that began after 920,
	 * so 910 and everything above it are not 920's ancestors. */
	assert_int_equal(may(920, 910, 5000), -EPERM);
	assert_int_equal(may(920, 500, 1000), -EPERM);
	/* negative control: 910 itself does reach 500 */
	assert_int_equal(may(910, 500, 1000), 0);
}

static void test_release_walk_stops_at_init(void **state)
{
	assert_int_equal(may(620, 1, 1), -EPERM);
	assert_int_equal(may(950, 500, 1000), -EPERM); /* parent gone */
}

static void test_release_cycle_terminates(void **state)
{
	assert_int_equal(may(960, 500, 1000), -EPERM);
}

static void test_release_tid_zero_is_eacces(void **state)
{
	assert_int_equal(may(0, 500, 1000), -EACCES);
}

static void test_release_caller_vanished_is_esrch(void **state)
{
	assert_int_equal(may(999, 500, 1000), -ESRCH);
}

/* ---- the fake process table itself (fake_procs.h) --------------------- */

static bool readable(int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	return poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN);
}

static void test_fake_pidfd_becomes_readable_when_its_process_exits(void **state)
{
	int a = lockfs_proc_source_pidfd_open(fake, 500);
	int b = lockfs_proc_source_pidfd_open(fake, 500);
	int other = lockfs_proc_source_pidfd_open(fake, 400);
	unsigned long long start = 0;
	struct lockfs_proc p;

	(void)state;
	assert_true(a >= 0 && b >= 0 && other >= 0);
	assert_false(readable(a));
	assert_int_equal(fake_procs_exit(500), 0);
	assert_true(readable(a));
	assert_true(readable(b));               /* every pidfd on it */
	assert_false(readable(other));          /* and no other */
	/* gone from then on */
	assert_int_equal(fake_procs_read_tid(NULL, 500, 0, &p), -ENOENT);
	assert_int_equal(lockfs_proc_source_start_time(fake, 500, &start), -ENOENT);
	assert_int_equal(lockfs_proc_source_pidfd_open(fake, 500), -ESRCH);
	assert_int_equal(fake_procs_exit(500), -ESRCH);
	/* a child whose parent exited no longer resolves to it */
	assert_int_equal(resolve(state, 600), -EACCES);
	close(a);
	close(b);
	close(other);
	fake_procs_reset();
	assert_int_equal(resolve(state, 600), 500);
}

static void test_fake_pidfd_of_a_thread_or_a_stranger_is_refused(void **state)
{
	(void)state;
	assert_int_equal(lockfs_proc_source_pidfd_open(fake, 801), -EINVAL);
	assert_int_equal(fake_procs_exit(801), -ESRCH);
	assert_int_equal(lockfs_proc_source_pidfd_open(fake, 999), -ESRCH);
	assert_int_equal(fake_procs_exit(999), -ESRCH);
}

static void test_fake_added_rows_answer_until_reset(void **state)
{
	const struct fake_proc row = { .pid = 3000, .ppid = 500, .sid = 500, .start = 12345,
				       .exe = "python3", .uid = 4242, .slug = "deploy" };
	unsigned long long start = 0;
	char slug[8], tiny[3];
	char **argv = NULL;
	pid_t who = 0;

	assert_int_equal(fake_procs_add(&row), 0);
	assert_int_equal(fake_procs_add(&row), -EEXIST);
	assert_int_equal(resolve(state, 3000), 3000);
	assert_int_equal(lockfs_proc_source_start_time(fake, 3000, &start), 0);
	assert_true(start == 12345);
	assert_int_equal(lockfs_proc_source_cmdline(fake, 3000, 4096, &argv), 0);
	assert_string_equal(argv[0], "python3");
	assert_null(argv[1]);
	lockfs_argv_free(argv);
	assert_int_equal(lockfs_proc_source_getenv(fake, 3000, "LOCKFS_SLUG", slug, sizeof(slug)), 6);
	assert_string_equal(slug, "deploy");
	assert_int_equal(lockfs_proc_source_getenv(fake, 3000, "LOCKFS_SLUG", tiny, sizeof(tiny)),
			 -ENAMETOOLONG);
	assert_int_equal(lockfs_proc_source_getenv(fake, 500, "LOCKFS_SLUG", slug, sizeof(slug)),
			 -ENOENT);
	assert_int_equal(lockfs_proc_source_env_exists(fake, 4242, "LOCKFS_SLUG", "deploy", &who), 1);
	assert_int_equal(who, 3000);
	assert_int_equal(lockfs_proc_source_env_exists(fake, 1000, "LOCKFS_SLUG", "deploy", &who), 0);
	assert_int_equal(fake_procs_exit(3000), 0);
	assert_int_equal(lockfs_proc_source_env_exists(fake, 4242, "LOCKFS_SLUG", "deploy", &who), 0);
	fake_procs_reset();
	assert_int_equal(resolve(state, 3000), -ESRCH);
	assert_int_equal(fake_procs_add(&row), 0);  /* forgotten, so new again */
	fake_procs_reset();
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_helpers, teardown_helpers)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_caller_not_a_helper_is_the_holder),
		T(test_mkdir_helper_is_skipped_to_the_shell),
		T(test_sudo_env_mkdir_chain_is_skipped_to_the_shell),
		T(test_busybox_applet_mkdir_is_skipped),
		T(test_empty_helper_list_skips_nothing),
		T(test_thread_id_maps_to_its_thread_group),
		T(test_tid_zero_is_eacces),
		T(test_helper_whose_parent_is_init_is_eacces),
		T(test_helper_whose_parent_started_later_is_eacces),
		T(test_helper_adopted_by_subreaper_is_eacces),
		T(test_helper_leading_its_own_session_is_skipped),
		T(test_helper_whose_parent_vanished_is_eacces),
		T(test_caller_vanished_is_esrch),
		T(test_caller_init_is_eacces),
		T(test_helper_cycle_is_eacces),
		T(test_unreadable_exe_is_not_a_helper),
		T(test_release_by_the_holder_itself),
		T(test_live_holder_itself_needs_no_read),
		T(test_child_of_live_holder_reads_only_itself),
		T(test_live_holder_rule_still_refuses_strangers),
		T(test_dead_holder_pid_match_needs_start_time),
		T(test_release_by_execd_rmdir_in_the_holder_process),
		T(test_release_by_a_thread_of_the_holder),
		T(test_release_by_child_of_holder),
		T(test_release_by_grandchild_of_holder),
		T(test_release_by_sibling_is_eperm),
		T(test_release_by_unrelated_is_eperm),
		T(test_release_with_reused_holder_pid_is_eperm),
		T(test_release_across_a_younger_parent_is_eperm),
		T(test_release_walk_stops_at_init),
		T(test_release_cycle_terminates),
		T(test_release_tid_zero_is_eacces),
		T(test_release_caller_vanished_is_esrch),
		T(test_fake_pidfd_becomes_readable_when_its_process_exits),
		T(test_fake_pidfd_of_a_thread_or_a_stranger_is_refused),
		T(test_fake_added_rows_answer_until_reset),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
