/*
 * What the holder tests (test_holder.c, test_helpers.c, test_procfs.c) share:
 * the fake process table as the source, the default helper list set up and
 * torn down around each test, and resolve() on the fake.
 */
#ifndef LOCKFS_TESTS_HOLDER_TEST_UTIL_H
#define LOCKFS_TESTS_HOLDER_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lockfs/holder.h"

#include "fake_procs.h"

/* The fake process table (fake_procs.h) stands in for /proc. */
static const struct lockfs_proc_source *const fake = &fake_procs_source;

/* The default helper list, parsed for each test. */
static inline int setup_helpers(void **state)
{
	struct lockfs_helpers *h = calloc(1, sizeof(*h));
	assert_non_null(h);
	assert_int_equal(lockfs_helpers_parse(h, LOCKFS_DEFAULT_HELPERS), 0);
	for (char **n = h->names; *n; n++)
		assert_int_equal(lockfs_helpers_trust_file(h, *n, FAKE_PROCS_DEV, fake_procs_name_ino(*n)), 0);
	assert_int_equal(lockfs_helpers_trust_file(h, "busybox", FAKE_PROCS_DEV, fake_procs_name_ino("busybox")), 0);
	assert_int_equal(lockfs_helpers_trust_file(h, "coreutils", FAKE_PROCS_DEV, fake_procs_name_ino("coreutils")),
			 0);
	*state = h;
	fake_procs_reset();
	return 0;
}

static inline int teardown_helpers(void **state)
{
	lockfs_helpers_free(*state);
	free(*state);
	return 0;
}

/* resolve() on the fake: the holder's pid, or the negative errno. */
static inline int resolve(void **state, pid_t tid)
{
	struct lockfs_proc p;
	memset(&p, 0xa5, sizeof(p));
	int rc = lockfs_holder_resolve(fake, tid, LOCKFS_UID_UNKNOWN, *state, 0, &p);
	return rc < 0 ? rc : p.pid;
}

#endif
