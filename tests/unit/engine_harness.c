/* The engine without a mount (engine_harness.h). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine_harness.h"
#include "fake_backend.h"
#include "fake_procs.h"
#include "lockfs/log.h"
#include "base/clock.h"
#include "lock/changes.h"
#include "lock/recovery.h"
#include "engine_test.h"

/* Above PID_MAX_LIMIT (2^22): no real process has such a pid or session,
 * so the descendants' scans of the real /proc never count one for ours. */
#define FIRST_PID 5000001

static int64_t real_ms(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t fake_wall(void *arg)
{
	const struct engine_harness *h = arg;

	return h->wall0_ms + h->offset_ms;
}

static int64_t fake_boot(void *arg)
{
	const struct engine_harness *h = arg;

	return h->boot0_ms + h->offset_ms;
}

/* Set by engine_open, for as long as the harness is open. */
static struct lockfs_clock clock_of_harness;

void engine_open(struct engine_harness *h, const struct engine_options *o)
{
	struct engine_options none = { 0 };
	struct lockfs_log *log;
	int dirfd;

	if (!o)
		o = &none;
	/* The engine closes fake pidfds (pipes) whose exit is then written
	 * to nobody (fake_procs_exit). */
	signal(SIGPIPE, SIG_IGN);
	memset(h, 0, sizeof(*h));
	h->next_pid = FIRST_PID;
	h->wall0_ms = real_ms(CLOCK_REALTIME);
	h->boot0_ms = real_ms(CLOCK_BOOTTIME);
	clock_of_harness = (struct lockfs_clock){ fake_wall, fake_boot, h };
	lockfs_clock_override(&clock_of_harness);

	snprintf(h->dir, sizeof(h->dir), "/tmp/lockfs-engine-XXXXXX");
	assert_non_null(mkdtemp(h->dir));
	dirfd = open(h->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dirfd >= 0);
	assert_int_equal(lockfs_log_open(&log, dirfd, "lock.log", NULL), 0);
	close(dirfd);

	h->store = fake_store_new();
	assert_non_null(h->store);
	assert_int_equal(fake_backend_open(h->store, &h->be), 0);
	h->be->stale_s = o->stale_s;
	h->be->caps = o->caps;
	assert_int_equal(lockfs_core_open(&h->core, &(struct lockfs_core_config){
		.backend = h->be,
		.helpers = "",        /* every caller holds for itself */
		.log = log,
		.procs = &fake_procs_source,
		.lease_s = o->lease_s,
		.max_locks_per_uid = o->max_locks_per_uid,
		.descendants_scan = true, /* no process-event connector */
	}), 0);
	h->t = lockfs_core_table(h->core);
}

void engine_close(struct engine_harness *h)
{
	char path[PATH_MAX + 16];

	lockfs_core_close(h->core); /* closes the backend and the log */
	h->core = NULL;
	h->be = NULL;
	fake_store_free(h->store);
	h->store = NULL;
	snprintf(path, sizeof(path), "%s/lock.log", h->dir);
	unlink(path);
	rmdir(h->dir);
	fake_procs_reset();
	lockfs_clock_override(NULL);
}

pid_t engine_proc(struct engine_harness *h, const char *slug)
{
	pid_t pid = h->next_pid++;

	assert_int_equal(fake_procs_add(&(struct fake_proc){
		.pid = pid, .ppid = 1, .sid = pid, .start = 100000 + (unsigned long long)pid,
		.exe = "worker", .slug = slug }), 0);
	return pid;
}

struct lockfs_caller engine_caller(pid_t pid)
{
	return (struct lockfs_caller){ .tid = pid, .uid = 1000, .gid = 1000 };
}

int engine_acquire(struct engine_harness *h, pid_t pid, const char *name)
{
	struct lockfs_caller c = engine_caller(pid);

	return lockfs_core_acquire(h->core, name, &c, NULL);
}

int engine_release(struct engine_harness *h, pid_t pid, const char *name)
{
	struct lockfs_caller c = engine_caller(pid);

	return lockfs_core_release(h->core, name, &c);
}

char *engine_owner(struct engine_harness *h, const char *name)
{
	char *json = NULL;
	size_t len = 0;

	if (lockfs_core_owner(h->core, name, 0, &json, &len) < 0)
		return NULL;
	return json;
}

void engine_advance(struct engine_harness *h, int64_t ms)
{
	h->offset_ms += ms;
}

void engine_work(struct engine_harness *h)
{
	for (int i = 0; i < 1000 && lockfs_recovery_work(h->t); i++)
		;
}

void engine_tick(struct engine_harness *h)
{
	lockfs_recovery_tick(h->t);
	engine_work(h);
}

void engine_exit(struct engine_harness *h, pid_t pid)
{
	const struct fake_proc *f = fake_procs_find(pid);
	unsigned long long start;

	assert_non_null(f);
	start = f->start;
	assert_int_equal(fake_procs_exit(pid), 0);
	lockfs_recovery_holder_exited(h->t, pid, start);
	engine_work(h);
}

void engine_changed(struct engine_harness *h, const char *name)
{
	lockfs_changes_report(h->t, LOCKFS_CHANGE_NAME, name);
	engine_work(h);
}

void engine_plant(struct engine_harness *h, const char *name, pid_t pid,
		  const char *host, const char *boot_id)
{
	struct lockfs_caller caller = engine_caller(pid);
	json_t *rec, *holder;
	char *text, *out;
	size_t len;

	assert_int_equal(lockfs_core_acquire(h->core, "planted-template", &caller, NULL), 0);
	assert_int_equal(h->be->ops->read(h->be, "planted-template", &text, &len, NULL), 0);
	assert_int_equal(lockfs_core_release(h->core, "planted-template", &caller), 0);
	rec = json_loadb(text, len, 0, NULL);
	free(text);
	assert_non_null(rec);
	holder = json_object_get(rec, "holder");
	assert_non_null(holder);
	json_object_set_new(rec, "resource", json_string(name));
	if (host)
		json_object_set_new(holder, "host", json_string(host));
	if (boot_id)
		json_object_set_new(holder, "boot_id", json_string(boot_id));
	out = json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(rec);
	assert_non_null(out);
	assert_int_equal(fake_backend_other_host(h->be, name, host ? host : h->be->host, out), 0);
	free(out);
}

char *engine_log(struct engine_harness *h)
{
	char path[PATH_MAX + 16];
	FILE *f;
	char *buf;
	long n;

	snprintf(path, sizeof(path), "%s/lock.log", h->dir);
	f = fopen(path, "r");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = calloc(1, (size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	return buf;
}

/* Does LINE (one log line, no newline) have NAME as its third field? */
static bool line_names(const char *line, const char *name)
{
	const char *p = strchr(line, ' ');
	size_t n = strlen(name);

	p = p ? strchr(p + 1, ' ') : NULL;
	return p && strncmp(p + 1, name, n) == 0 && p[1 + n] == ' ';
}

int engine_logged(struct engine_harness *h, const char *name, const char *event,
		  const char *const *kv)
{
	char *log = engine_log(h), *save = NULL;
	int count = 0;

	for (char *line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		const char *last = strrchr(line, ' ');
		bool ok = last && strcmp(last + 1, event) == 0 && line_names(line, name);

		for (const char *const *k = kv; ok && k && *k; k++) {
			char want[256];

			snprintf(want, sizeof(want), " %s ", *k);
			ok = strstr(line, want) != NULL;
		}
		count += ok;
	}
	free(log);
	return count;
}
