/*
 * The engine's life: lockfs_core_open (the caps' defaults, the
 * descendants tracker, the startup scan), _start, _stop and _close, with
 * the liveness thread wired to recovery.c's and changes.c's entry points
 * (what happens without a request: holder death, leases, restart); and
 * the resources every open file costs (lockfs_core_handle_open/_close).
 * The requests are answered by the other files at core/'s top level
 * (engine.h); docs/architecture.md draws the floors.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/statvfs.h>

#include "lockfs/holder.h"
#include "engine.h"
#include "engine_test.h"
#include "lock/audit.h"
#include "lock/caller.h"
#include "lock/changes.h"
#include "lock/events.h"
#include "lock/follow.h"
#include "lock/metrics.h"
#include "lock/deadlock.h"
#include "slots.h"
#include "lock/queue.h"
#include "lock/recovery.h"
#include "lock/resume.h"
#include "lock/remote.h"
#include "lock/session.h"
#include "lock/startup.h"
#include "lock/store.h"
#include "lock/table.h"
#include "lockfs/descendants.h"
#include "proc/fds.h"
#include "proc/liveness.h"
#include "lockfs/procevents.h"
#include "proc/requesters.h"

#define DEFAULT_LEASE_S 600
/* Quota defaults (docs/quota.md says why).  A lock costs DIR up to
 * LOCK_BYTES (its record file: two pages with a 4 KiB command line) and
 * two inodes, and the daemon about 5 KiB. */
#define DEFAULT_LOCKS_PER_UID 1024
#define DEFAULT_WAITERS_PER_UID 1024
#define DEFAULT_OPEN_PER_UID 1024
#define DEFAULT_LOCKS_MAX 16384
#define DEFAULT_LOCKS_MIN 64
#define LOCK_BYTES 8192
#define LOCK_INODES 2
/* How often the liveness thread looks at leases and holders. */
#define TICK_MS 50

/* lockfs_log_set_waker's callback (async-signal-safe). */
static void wake_liveness(void *lv)
{
	lockfs_liveness_wake(lv);
}

int lockfs_core_log_open_ro(struct lockfs_core *core)
{
	return lockfs_log_open_ro(core->table.log);
}

void lockfs_core_log_reopen(struct lockfs_core *core)
{
	lockfs_log_request_reopen(core->table.log);
}

/* The descendants tracker, fed by the process-event connector unless
 * SCAN_ONLY or the kernel refuses it (then scans answer, and we say so
 * once).  0 or -errno. */
static int descendants_open(struct lockfs_core *core, bool scan_only)
{
	struct lockfs_event_source events;
	char why[160];
	int rc;

	if (!scan_only) {
		if (lockfs_procevents_open(&core->procevents, why, sizeof(why)) == 0)
			events = lockfs_procevents_source(core->procevents);
		else
			fprintf(stderr, "lockfs: warning: no process events (%s); a holder's "
				"descendants are found by scanning /proc for its session, which "
				"misses those that left it (docs/holder.md)\n", why);
	}
	rc = lockfs_descendants_new(&core->table.descendants,
				    core->procevents ? &events : NULL, NULL);
	/* The same events keep repeat requesters' /proc facts exact. */
	if (rc == 0 && core->procevents && lockfs_requesters_new(&core->table.requesters) == 0)
		lockfs_descendants_observe(core->table.descendants, lockfs_requesters_event,
					   core->table.requesters);
	return rc;
}

/* A cap from the configuration: 0 is DEFAULT, LOCKFS_NO_LIMIT none. */
static uint32_t cap_of(uint32_t given, uint32_t dflt)
{
	return given == LOCKFS_NO_LIMIT ? QUOTA_NONE : given ? given : dflt;
}

/*
 * The default of -o max_locks: DEFAULT_LOCKS_MAX, but never more than a
 * quarter of DIR's file system at the largest cost of a lock, in bytes
 * and in inodes -- so that a small tmpfs (a /run of 10 % of a small
 * machine's memory) cannot be filled by locks either.
 */
static uint32_t default_max_locks(int dirfd)
{
	struct statvfs sv;
	uint64_t n = DEFAULT_LOCKS_MAX;

	if (dirfd >= 0 && fstatvfs(dirfd, &sv) == 0) {
		uint64_t by_bytes = (uint64_t)sv.f_blocks * sv.f_frsize / 4 / LOCK_BYTES;
		uint64_t by_inodes = (uint64_t)sv.f_files / 4 / LOCK_INODES;

		if (sv.f_blocks && by_bytes < n)
			n = by_bytes;
		if (sv.f_files && by_inodes < n) /* 0: no inode limit (btrfs) */
			n = by_inodes;
	}
	return n < DEFAULT_LOCKS_MIN ? DEFAULT_LOCKS_MIN : (uint32_t)n;
}

/* Make core->table.quota with CFG's caps.  The open-file cap's default depends
 * on the descriptor limit, known at lockfs_core_start.  0 or -ENOMEM. */
static int quota_open_limits(struct lockfs_core *core, const struct lockfs_core_config *cfg)
{
	struct quota_limits lim = {
		.open_per_uid = cap_of(cfg->max_open_per_uid, DEFAULT_OPEN_PER_UID),
		.locks_per_uid = cap_of(cfg->max_locks_per_uid, DEFAULT_LOCKS_PER_UID),
		.waiters_per_uid = cap_of(cfg->max_waiters_per_uid, DEFAULT_WAITERS_PER_UID),
		.locks = cfg->max_locks ? cap_of(cfg->max_locks, 0) : default_max_locks(cfg->backend ? cfg->backend->state_dirfd : -1),
	};

	core->open_cap_given = cfg->max_open_per_uid != 0;
	return lockfs_quota_new(&core->table.quota, &lim);
}

int lockfs_core_handle_open(struct lockfs_core *core, const struct lockfs_caller *caller,
			    bool keeps_fd, const char *name)
{
	struct lockfs_table *t = &core->table;

	if (lockfs_quota_open_add(t->quota, caller->uid) < 0) {
		lockfs_caller_refuse(t, caller->uid, QUOTA_OPEN_PER_UID, name, NULL, caller->tid);
		return -EMFILE;
	}
	if (keeps_fd && !lockfs_fds_take(&core->fds, caller->uid == 0 ? LOCKFS_FD_PRIVILEGED
								    : LOCKFS_FD_CALLER)) {
		lockfs_quota_open_sub(t->quota, caller->uid);
		lockfs_caller_refuse(t, caller->uid, QUOTA_FD_RESERVE, name, NULL, caller->tid);
		return -EMFILE;
	}
	return 0;
}

void lockfs_core_handle_close(struct lockfs_core *core, uid_t uid, bool keeps_fd)
{
	lockfs_quota_open_sub(core->table.quota, uid);
	if (keeps_fd)
		lockfs_fds_give(&core->fds);
}

void lockfs_core_set_mount_dev(struct lockfs_core *core, dev_t dev)
{
	core->table.mount_dev = dev;
}

int lockfs_core_open(struct lockfs_core **out, const struct lockfs_core_config *cfg)
{
	struct lockfs_core *core = calloc(1, sizeof(*core));
	struct lockfs_table *t;
	int rc;

	if (!core) {
		lockfs_log_close(cfg->log);
		return -ENOMEM;
	}
	t = &core->table;
	for (int i = 0; i < STRIPES; i++)
		pthread_mutex_init(&t->stripes[i].mu, NULL);
	pthread_mutex_init(&t->users_mu, NULL);
	pthread_mutex_init(&t->session_mu, NULL);
	pthread_mutex_init(&t->holders.mu, NULL);
	for (int i = 0; i < STRIPES; i++)
		t->stripes[i].due_boot_ms = INT64_MAX;
	lockfs_fds_init(&core->fds);
	rc = lockfs_deadlock_new(&core->deadlock);
	if (rc == 0)
		rc = lockfs_core_slots_new(core);
	if (rc < 0)
		goto fail;
	t->procs = cfg->procs ? cfg->procs : &lockfs_procfs_source;
	t->default_lease_s = cfg->lease_s ? cfg->lease_s : DEFAULT_LEASE_S;
	t->break_signal = cfg->break_signal;
	t->container_root_host = cfg->container_root_host;
	t->log = cfg->log;
	if (!t->log) {
		rc = -EINVAL;
		goto fail;
	}
	rc = lockfs_events_new(&t->events);
	if (rc == 0)
		rc = lockfs_follow_new(cfg->backend, &t->follow);
	if (rc == 0)
		rc = lockfs_metrics_new(&t->metrics, cfg->metrics_names);
	if (rc < 0)
		goto fail;
	rc = lockfs_helpers_parse(&t->helpers,
				  cfg->helpers ? cfg->helpers : LOCKFS_DEFAULT_HELPERS);
	if (rc < 0)
		goto fail;
	if (!cfg->backend) {
		rc = -EINVAL;
		goto fail;
	}
	/* This host, as the store names it in records: the holders the
	 * engine may judge by pid and boot id are this host's only. */
	snprintf(t->host, sizeof(t->host), "%s", cfg->backend->host);
	rc = lockfs_procfs_boot_id(t->boot_id);
	if (rc < 0)
		goto fail;
	rc = quota_open_limits(core, cfg);
	if (rc < 0)
		goto fail;
	rc = lockfs_recovery_init(t);
	if (rc < 0)
		goto fail;
	rc = lockfs_changes_init(t);
	if (rc < 0)
		goto fail;
	/* table.c calls up into session.c through this, as the store's
	 * answer replaces a cached lock (a loss, on a store with sessions). */
	t->vanished = lockfs_session_vanished_locked;
	/* And into remote.c, as a lock held on another host comes or goes. */
	t->elsewhere = lockfs_remote_note;
	/* And into slots.c, as the store reports a change. */
	t->changed = lockfs_core_slots_changed;
	/* The thread calls up into recovery.c through these, with the table. */
	rc = lockfs_liveness_new(&t->liveness, lockfs_recovery_holder_exited, lockfs_recovery_tick,
				 t, TICK_MS);
	if (rc < 0)
		goto fail;
	/* Lines kept, bursts of denials and reopens wake a sleeping tick. */
	lockfs_log_set_waker(t->log, wake_liveness, t->liveness);
	rc = descendants_open(core, cfg->descendants_scan);
	if (rc < 0)
		goto fail;
	lockfs_liveness_set_fds(t->liveness, &core->fds);
	lockfs_liveness_set_work(t->liveness, lockfs_recovery_work);
	t->be = cfg->backend;
	lockfs_resume_init(t, cfg->resuming);
	rc = lockfs_startup_scan(t);
	if (rc < 0) {
		t->be = NULL; /* the caller still owns it on failure */
		goto fail;
	}
	*out = core;
	return 0;
fail:
	lockfs_core_close(core);
	return rc;
}

void lockfs_core_resume_done(struct lockfs_core *core)
{
	lockfs_resume_end(&core->table);
}

int lockfs_core_start(struct lockfs_core *core)
{
	struct lockfs_table *t = &core->table;
	int rc;

	/* The mount is made: what is open now is the daemon's own. */
	lockfs_fds_start(&core->fds);
	if (!core->open_cap_given) {
		long room = lockfs_fds_callers_max(&core->fds) / 4;

		lockfs_quota_set_open_limit(t->quota, room < DEFAULT_OPEN_PER_UID ?
				     (uint32_t)(room > 0 ? room : 1) : DEFAULT_OPEN_PER_UID);
	}
	rc = lockfs_liveness_run(t->liveness);
	if (rc < 0)
		return rc;
	/* The session the engine acts on from now on (a store with
	 * sessions): one lost before the first report is still noticed. */
	lockfs_session_check(t);
	/* The store reports changes from now on: the startup scan is over,
	 * and the thread that takes them in runs. */
	return lockfs_store_start(t->be, lockfs_changes_report, t);
}

void lockfs_core_stop(struct lockfs_core *core)
{
	struct lockfs_table *t;

	if (!core)
		return;
	t = &core->table;
	lockfs_core_slots_stop(core);
	lockfs_liveness_stop(t->liveness);
	/* Releases the store refused get one last try before the daemon
	 * goes; what is left stays in DIR (see lockfs_queue_free_all). */
	lockfs_recovery_retry_all(t);
	lockfs_quota_flush(t->quota, true, lockfs_audit_refused, t);
}

void lockfs_core_close(struct lockfs_core *core)
{
	struct lockfs_table *t;

	if (!core)
		return;
	t = &core->table;
	/* The thread first: it calls into everything below.  Then the store,
	 * whose reports kick that thread (changes.c): none may come once the
	 * thread is freed, and nothing below needs the store. */
	lockfs_core_slots_free(core);
	lockfs_liveness_stop(t->liveness);
	if (t->be)
		lockfs_store_close(t->be);
	t->be = NULL;
	t->elsewhere = NULL; /* emptying the cache releases nothing */
	t->changed = NULL;
	for (int i = 0; i < STRIPES; i++) {
		while (t->stripes[i].head) {
			struct held_lock *c = t->stripes[i].head;

			lockfs_table_drop(t, &t->stripes[i], c->name);
		}
		lockfs_queue_free_all(&t->stripes[i]);
		lockfs_session_free_tombstones(&t->stripes[i]);
		pthread_mutex_destroy(&t->stripes[i].mu);
	}
	lockfs_log_set_waker(t->log, NULL, NULL);
	lockfs_liveness_free(t->liveness);
	lockfs_deadlock_free(core->deadlock);
	lockfs_descendants_free(t->descendants);
	lockfs_requesters_free(t->requesters);
	lockfs_procevents_close(core->procevents);
	lockfs_recovery_fini(t);
	lockfs_quota_free(t->quota);
	pthread_mutex_destroy(&t->holders.mu);
	for (size_t i = 0; i < t->nusers; i++)
		free(t->users[i].name);
	free(t->users);
	pthread_mutex_destroy(&t->users_mu);
	pthread_mutex_destroy(&t->session_mu);
	lockfs_changes_fini(t);
	lockfs_events_free(t->events);
	lockfs_follow_free(t->follow);
	lockfs_metrics_free(t->metrics);
	{
		size_t left = lockfs_log_close(t->log);

		if (left)
			fprintf(stderr, "lockfs: warning: %zu audit log line(s) could not be written "
				"to the log before exit; they went to syslog\n", left);
	}
	lockfs_helpers_free(&t->helpers);
	free(core);
}

/* For unit tests only (tests/fixtures/engine_harness.c): the table, so that a
 * test calls the liveness thread's entry points (lock/recovery.h,
 * lock/changes.h) itself, one step at a time, instead of starting it. */
struct lockfs_table *lockfs_core_table(struct lockfs_core *core)
{
	return &core->table;
}
