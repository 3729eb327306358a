/* ---- Own writes and others' in the watch ---- */

/*
 * The etcd backend beside other writers to the same etcd, through
 * lockfs/backend.h: its own writes' echoes in the watch told apart from
 * others' changes, and interop with `etcdctl lock` (concurrency.Mutex)
 * both ways, the line ordered by create_revision.  The backend's other own
 * cases are test_etcd_backend.c.
 *
 * Run under tests/fixtures/etcd_fixtures.py exec, which gives
 * LOCKFS_ETCD_URL and LOCKFS_ETCD_FIXTURES (the proxy lives beside it).
 * Every wait polls with a deadline.
 */
#include <errno.h>
#include <fcntl.h>
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

#include "etcd_backend_test_util.h"

/* ---- Own writes and others' in the watch ---- */

/*
 * CHANGE_OWN and CHANGE_NAME reports per name, for the echo test, and a
 * gate that can hold the reporting thread back.
 *
 * An own write's echo is CHANGE_OWN in either order: the op notes its
 * revision when etcd's answer reaches it, and an echo that comes first is
 * known by its key (owned, and for a delete, a release on its way:
 * etcd_watch.c).  The gate makes the watch late on purpose, for the first
 * order, which a loaded machine rarely shows: while it is shut, the report
 * of GATE_NAME parks the watch thread in this callback (bounded by
 * WAIT_MS, as backend.h wants a callback to return soon) until the test
 * has made its writes and opens it.
 */
struct echoes {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char names[8][32];
	int own[8], outside[8];
	const char *gate_name;   /* with GATE_SHUT: the report that parks */
	bool gate_shut;
	bool parked;             /* the reporting thread waits in the gate */
};

static void gate_wait_locked(struct echoes *e)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += WAIT_MS / 1000;
	e->parked = true;
	pthread_cond_broadcast(&e->cv);
	while (e->gate_shut)
		if (pthread_cond_timedwait(&e->cv, &e->mu, &until) == ETIMEDOUT)
			break;
	e->parked = false;
}

static void on_echo(void *arg, enum lockfs_change what, const char *name)
{
	struct echoes *e = arg;

	if (!name || (what != LOCKFS_CHANGE_OWN && what != LOCKFS_CHANGE_NAME))
		return;
	pthread_mutex_lock(&e->mu);
	for (int i = 0; i < 8; i++) {
		if (!e->names[i][0])
			snprintf(e->names[i], sizeof(e->names[i]), "%s", name);
		if (strcmp(e->names[i], name) == 0) {
			if (what == LOCKFS_CHANGE_OWN)
				e->own[i]++;
			else
				e->outside[i]++;
			break;
		}
	}
	if (e->gate_shut && e->gate_name && strcmp(name, e->gate_name) == 0)
		gate_wait_locked(e);
	pthread_mutex_unlock(&e->mu);
}

/* How many reports NAME got: OWN ones, else CHANGE_NAME ones. */
static int echoes_of(struct echoes *e, const char *name, bool own)
{
	int n = 0;

	pthread_mutex_lock(&e->mu);
	for (int i = 0; i < 8; i++)
		if (strcmp(e->names[i], name) == 0)
			n = own ? e->own[i] : e->outside[i];
	pthread_mutex_unlock(&e->mu);
	return n;
}

/* Shut the gate on NAME's next report. */
static void gate_shut(struct echoes *e, const char *name)
{
	pthread_mutex_lock(&e->mu);
	e->gate_name = name;
	e->gate_shut = true;
	pthread_mutex_unlock(&e->mu);
}

static bool gate_parked(struct echoes *e)
{
	bool parked;

	pthread_mutex_lock(&e->mu);
	parked = e->parked;
	pthread_mutex_unlock(&e->mu);
	return parked;
}

static void gate_open(struct echoes *e)
{
	pthread_mutex_lock(&e->mu);
	e->gate_shut = false;
	pthread_cond_broadcast(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

/* B takes NAME when *IDENTITY is 0, else releases it: one write of
 * another daemon, which A's watch reports as CHANGE_NAME. */
static void b_writes(struct lockfs_backend *b, const char *name, uint64_t *identity)
{
	struct lockfs_entry_stat st;

	if (*identity) {
		assert_int_equal(b->ops->release(b, name, *identity), 0);
		*identity = 0;
	} else {
		assert_int_equal(try_lock(b, name, &st), 0);
		*identity = st.identity;
	}
}

/* Park A's watch thread in the gate: B writes "gate" and the test waits
 * until its report is held.  A's writes from now until gate_open() are
 * noted by their ops before the watch can bring their echoes. */
static void hold_watch(struct echoes *ec, struct lockfs_backend *b, uint64_t *gate)
{
	gate_shut(ec, "gate");
	b_writes(b, "gate", gate);
	AWAIT(gate_parked(ec), "A's watch parked in the gate");
}

/*
 * Wait until A's watch has reported everything written before now: B
 * writes "mark" and the test waits for that report.  The watch delivers
 * in revision order, so every earlier write's report came before it.
 */
static void watch_passed(struct echoes *ec, struct lockfs_backend *b, uint64_t *mark)
{
	int before = echoes_of(ec, "mark", false);

	b_writes(b, "mark", mark);
	AWAIT(echoes_of(ec, "mark", false) > before, "the watch passed the marker");
}

/* The watch brings this daemon's own writes back: uncontended ones come
 * as CHANGE_OWN (a hint that wakes nobody), everything the engine must
 * act on as CHANGE_NAME: another daemon's change, and our release while
 * another daemon waits in the line. */
static void test_own_uncontended_writes_echo_as_own_the_rest_as_changes(void **state)
{
	struct world *w = *state;
	struct lockfs_backend *a, *b;
	struct lockfs_entry_stat st, bst, ost;
	struct lockfs_place place;
	struct echoes ec = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	uint64_t gate = 0, mark = 0;
	int line_outside, line_own;

	NEED_ETCD();
	a = must_open(w, &(struct opts){ .host = "o1" });
	b = must_open(w, &(struct opts){ .host = "o2" });
	assert_int_equal(a->ops->start(a, on_echo, &ec), 0);
	/* A watches only the names it was asked about (docs/etcd.md "What a
	 * daemon watches"): look at them all first, as the engine would. */
	for (size_t i = 0; i < 5; i++)
		(void)a->ops->stat(a, (const char *[]){ "solo", "other", "line", "gate",
							"mark" }[i], NULL, false);
	/* Ours, alone: both echoes are CHANGE_OWN, none CHANGE_NAME. */
	hold_watch(&ec, b, &gate);
	assert_int_equal(try_lock(a, "solo", &st), 0);
	assert_int_equal(a->ops->release(a, "solo", st.identity), 0);
	gate_open(&ec);
	/* Another daemon's lock: CHANGE_NAME (and the watch passed "solo"). */
	assert_int_equal(try_lock(b, "other", &ost), 0);
	AWAIT(echoes_of(&ec, "other", false) >= 1, "another daemon's lock as CHANGE_NAME");
	assert_true(echoes_of(&ec, "solo", true) >= 1);
	assert_int_equal(echoes_of(&ec, "solo", false), 0);
	/* Our release with another daemon's waiter behind: CHANGE_NAME, and
	 * not CHANGE_OWN even when the op notes it before the echo comes.
	 * The waiter's key is in A's mirror first (the marker), else A could
	 * rightly take its release for uncontended. */
	assert_int_equal(try_lock(a, "line", &st), 0);
	assert_int_equal(b->ops->acquire(b, "line", LOCKFS_ACQ_OR_QUEUE, SRC("w"), &place, &bst),
			 -EINPROGRESS);
	watch_passed(&ec, b, &mark);
	assert_true(echoes_of(&ec, "line", false) >= 1);  /* the waiter's key */
	line_outside = echoes_of(&ec, "line", false);
	line_own = echoes_of(&ec, "line", true);
	hold_watch(&ec, b, &gate);
	assert_int_equal(a->ops->release(a, "line", st.identity), 0);
	gate_open(&ec);
	watch_passed(&ec, b, &mark);
	assert_true(echoes_of(&ec, "line", false) > line_outside);
	assert_int_equal(echoes_of(&ec, "line", true), line_own);
	/* Never CHANGE_OWN for another daemon's write. */
	assert_int_equal(echoes_of(&ec, "other", true), 0);
	assert_int_equal(echoes_of(&ec, "gate", true), 0);
	assert_int_equal(echoes_of(&ec, "mark", true), 0);
	/* Our own key removed behind us (etcdctl del): news, CHANGE_NAME --
	 * a delete of an own key is an echo only while its release is on
	 * its way. */
	assert_int_equal(try_lock(a, "solo", &st), 0);
	watch_passed(&ec, b, &mark);
	line_own = echoes_of(&ec, "solo", true);
	line_outside = echoes_of(&ec, "solo", false);
	delete_keys_of(w, "solo");
	watch_passed(&ec, b, &mark);
	assert_int_equal(echoes_of(&ec, "solo", false), line_outside + 1);
	assert_int_equal(echoes_of(&ec, "solo", true), line_own);
	AWAIT(b->ops->claim(b, "line", &place, SRC("w"), &bst) == 0, "the waiter granted");
	assert_int_equal(b->ops->release(b, "line", bst.identity), 0);
	assert_int_equal(b->ops->release(b, "other", ost.identity), 0);
	b->ops->close(b);
	a->ops->close(a);
}

/* ---- Interop with etcdctl lock (concurrency.Mutex) ---- */

/* `etcdctl lock KEY CMD...` in the background, its stdout in *OUT. */
static pid_t etcdctl_lock(const char *key, FILE **out, const char *cmd)
{
	int fds[2];
	pid_t pid;

	assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fds[1], 1);
		setenv("ETCDCTL_API", "3", 1);
		execlp("etcdctl", "etcdctl", "--endpoints", etcd_url, "lock", key, "--", "sh", "-c", cmd,
		       (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	*out = fdopen(fds[0], "r");
	assert_non_null(*out);
	return pid;
}

static void test_etcdctl_lock_holder_is_foreign_and_blocks_try_and_queues_ahead(void **state)
{
	struct world *w = *state;
	struct lockfs_backend *be;
	struct lockfs_entry_stat st, rst;
	struct lockfs_place place;
	char key[128], line[64], stop[128], cmd[512], *rec = (char *)"untouched";
	size_t len;
	FILE *out;
	pid_t pid;
	int status;

	NEED_ETCD();
	be = must_open(w, &(struct opts){ .host = "i1" });
	snprintf(key, sizeof(key), "%sdeploy", w->prefix);
	/* It holds until the test makes STOP (bounded: 30 s at most). */
	snprintf(stop, sizeof(stop), "%s/stop", w->root);
	snprintf(cmd, sizeof(cmd), "echo held; i=0; while [ ! -e %s ] && [ $i -lt 600 ]; do "
		 "sleep 0.05; i=$((i+1)); done", stop);
	pid = etcdctl_lock(key, &out, cmd);
	assert_non_null(fgets(line, sizeof(line), out));
	assert_string_equal(line, "held\n");
	AWAIT(be->ops->stat(be, "deploy", NULL, false) == 0, "the mirror sees etcdctl's key");
	assert_int_equal(be->ops->read(be, "deploy", &rec, &len, &rst), 0);
	assert_null(rec);
	assert_int_equal(rst.fence, 0);
	assert_true(rst.key[0] != '\0');
	assert_true(rst.lease != 0);
	assert_true(create_revision(&rst) > 0);
	assert_int_equal(try_lock(be, "deploy", &st), -EEXIST);
	/* Our waiter's key sorts before etcdctl's by name or not: it is
	 * behind it by create_revision either way. */
	assert_int_equal(be->ops->acquire(be, "deploy", LOCKFS_ACQ_OR_QUEUE, SRC("w"), &place,
					  &st), -EINPROGRESS);
	assert_true(place.rank > create_revision(&rst));
	assert_int_equal(be->ops->claim(be, "deploy", &place, SRC("w"), &st), -EEXIST);
	fclose(fopen(stop, "w"));   /* CMD ends: etcdctl unlocks */
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	fclose(out);
	AWAIT(be->ops->claim(be, "deploy", &place, SRC("w"), &st) == 0,
	      "our waiter granted after etcdctl's unlock (no lock-delay)");
	assert_int_equal(st.fence, (uint64_t)place.rank);
	assert_int_equal(be->ops->release(be, "deploy", st.identity), 0);
	be->ops->close(be);
}

/* The line is by create_revision across the range, not by key name: an
 * earlier key that sorts after ours by name is still ahead. */
static void test_line_follows_create_revision_not_key_order(void **state)
{
	struct world *w = *state;
	struct lockfs_backend *be;
	struct lockfs_entry_stat st;
	struct lockfs_place place;
	char key[128];
	struct lockfs_etcd_op put = { .type = LOCKFS_ETCD_PUT, .key = key, .value = "" };
	struct lockfs_etcd_op del = { .type = LOCKFS_ETCD_DELETE, .key = key };

	NEED_ETCD();
	be = must_open(w, &(struct opts){ .host = "o1" });
	snprintf(key, sizeof(key), "%sorder/zzzzzzzz", w->prefix);
	assert_int_equal(lockfs_etcd_put(client(), &put, NULL), 0);
	AWAIT(be->ops->stat(be, "order", NULL, false) == 0, "the mirror sees the early key");
	assert_int_equal(be->ops->acquire(be, "order", LOCKFS_ACQ_OR_QUEUE, SRC("w"), &place,
					  &st), -EINPROGRESS);
	assert_int_equal(be->ops->claim(be, "order", &place, SRC("w"), &st), -EEXIST);
	assert_int_equal(lockfs_etcd_delete(client(), &del, NULL), 0);
	AWAIT(be->ops->claim(be, "order", &place, SRC("w"), &st) == 0, "granted once it is gone");
	assert_int_equal(be->ops->release(be, "order", st.identity), 0);
	be->ops->close(be);
}

static void test_our_lock_makes_etcdctl_lock_wait_until_release(void **state)
{
	struct world *w = *state;
	struct lockfs_backend *be;
	struct lockfs_entry_stat st;
	char key[128], line[64];
	struct pollfd pfd;
	FILE *out;
	pid_t pid;
	int status;

	NEED_ETCD();
	be = must_open(w, &(struct opts){ .host = "i2" });
	assert_int_equal(try_lock(be, "migrate", &st), 0);
	snprintf(key, sizeof(key), "%smigrate", w->prefix);
	pid = etcdctl_lock(key, &out, "echo got");
	pfd = (struct pollfd){ .fd = fileno(out), .events = POLLIN };
	/* Waiting: nothing within a second (a negative window, bounded). */
	assert_int_equal(poll(&pfd, 1, 1000), 0);
	assert_int_equal(be->ops->release(be, "migrate", st.identity), 0);
	assert_int_equal(poll(&pfd, 1, WAIT_MS), 1);
	assert_non_null(fgets(line, sizeof(line), out));
	assert_string_equal(line, "got\n");
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	fclose(out);
	be->ops->close(be);
}

int main(int argc, char *argv[])
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			test_etcdctl_lock_holder_is_foreign_and_blocks_try_and_queues_ahead, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_our_lock_makes_etcdctl_lock_wait_until_release,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_line_follows_create_revision_not_key_order,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_own_uncontended_writes_echo_as_own_the_rest_as_changes, setup, teardown),
	};

	etcd_url = getenv("LOCKFS_ETCD_URL");
	if (!etcd_url || !*etcd_url) {
		printf("SKIP: no LOCKFS_ETCD_URL (run under etcd_fixtures.py exec)\n");
		return 77;
	}
	cmocka_set_message_output(CM_OUTPUT_STDOUT);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
