/*
 * What the backend contract suite's files share: the store under test and
 * the per-kind hooks that reach around it (test_backend.c defines them and
 * main()), the test's own record, the small helpers every case uses and
 * the recorder of the store's change reports; and the cases kept in
 * test_backend_cases.c (the contract, for every kind) and
 * test_backend_kinds.c (what only one kind has).
 */
#ifndef LOCKFS_TESTS_BACKEND_CONTRACT_H
#define LOCKFS_TESTS_BACKEND_CONTRACT_H

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

/* The kind under test, chosen by main() from argv[1]. */
extern const struct kind_fixture *kind;

/* ---- Helpers ---- */

/* The test's record: {"fence": F, "tag": T}; an edit keeps KEEP. */
struct rec {
	const char *tag;
	uint64_t keep;     /* the fence an edit (fence 0) writes */
	int calls;
};

static inline int rec_encode(void *arg, uint64_t fence, char **json, size_t *len)
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

static inline struct store *store_of(void **state)
{
	return *state;
}

#define NEED_STORE(s) do { if (!(s)->be) skip(); } while (0)

static inline int acquire(struct store *s, const char *name, const char *tag,
		   struct lockfs_entry_stat *st)
{
	struct rec r = { .tag = tag };

	return s->be->ops->acquire(s->be, name, LOCKFS_ACQ_TRY, SRC(&r), NULL, st);
}

/* NAME's record's tag ("" for a foreign lock), or -errno. */
static inline int read_tag(struct store *s, const char *name, char tag[64],
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

static inline int count_name(void *arg, const char *name)
{
	(*(int *)arg)++;
	return 0;
}

static inline int held_count(struct store *s)
{
	int n = 0;

	assert_int_equal(s->be->ops->list(s->be, count_name, &n), 0);
	return n;
}
/* ---- The store's change reports, recorded (section 6 and the fake's lost session) ---- */


struct changes {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char names[64][64];  /* NAME and OWN events; "*" for CHANGE_ALL */
	bool own[64];        /* names[i] came as CHANGE_OWN */
	int n;
};

static inline void on_change(void *arg, enum lockfs_change what, const char *name)
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
static inline bool await_change_as(struct changes *c, const char *name, bool outside)
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

static inline bool await_change(struct changes *c, const char *name)
{
	return await_change_as(c, name, false);
}

/* Wait until no change came for 100 ms, then forget them: what follows
 * is caused by the next step only. */
static inline void settle(struct changes *c)
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

/* The cases (test_backend_cases.c): the contract, the same for every kind. */
void test_acquire_is_indivisible_among_8_threads(void **state);
void test_stale_identity_never_removes_or_rewrites_a_newer_lock(void **state);
void test_fences_increase_per_name_and_across_reopen(void **state);
void test_handoff_gives_the_place_the_lock_with_no_gap(void **state);
void test_list_read_and_stat_agree(void **state);
void test_list_prefix_lists_only_those_names(void **state);
void test_changes_are_reported_within_a_second(void **state);
void test_read_only_store_fails_with_eio_and_makes_nothing(void **state);
void test_full_store_fails_with_eio_and_makes_nothing(void **state);
void test_foreign_lock_reads_without_record_and_blocks_try(void **state);
void test_old_foreign_lock_is_stale_and_recoverable(void **state);
void test_foreign_lock_ages_by_the_daemons_clock(void **state);
void test_own_session_is_live_and_other_hosts_unknown(void **state);

/* The cases (test_backend_kinds.c): one kind's own, skipped on the others. */
void test_kinds_are_found_by_name_and_unknown_is_null(void **state);
void test_etcd_kind_is_known_and_says_when_not_built(void **state);
void test_second_daemon_on_the_same_dir_is_refused(void **state);
void test_group_writable_or_missing_dir_is_refused_with_one_line(void **state);
void test_removed_dir_answers_eio_never_not_held(void **state);
void test_fake_fail_knob_fails_count_calls_then_works(void **state);
void test_fake_other_host_lock_is_held_and_its_session_live(void **state);
void test_fake_lost_session_is_reported_and_makes_own_locks_stale(void **state);

#endif
