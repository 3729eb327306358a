/*
 * The daemon's own lines in the audit log (docs/log.md, "The daemon's own
 * lines"): its start and clean stop, and what it found of a predecessor
 * that did not stop cleanly.  A crash cannot log itself: the next daemon
 * finds the pid the crashed one left in DIR/.lockfs (a clean stop empties
 * it) and writes the line for it.
 *
 * Every line is WHO `lockfs`, NAME `-`, with the uid= and pid= of the
 * daemon the line is about.  They go through lockfs_log_event_or_keep:
 * a full DIR delays them, it never stops a start or a stop.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lockfs/backend.h"
#include "fs.h"
#include "lifecycle.h"

#define WHO "lockfs"

static void put(struct lockfs_log *log, const char *const *kv, const char *event)
{
	lockfs_log_event_or_keep(log, WHO, "", kv, event);
}

void lockfs_lifecycle_predecessor(struct lockfs_log *log, struct lockfs_backend *be)
{
	struct lockfs_predecessor prev = lockfs_backend_predecessor(be);
	char uid[16], pid[16], next[16];
	const char *kv[] = { "uid", uid, "pid", pid, "next_pid", next, "evidence",
			     prev.taken_over ? "wedged" : "no-clean-stop", NULL };

	if (prev.left_pid <= 0 || prev.left_pid == getpid())
		return;
	snprintf(uid, sizeof(uid), "%u", (unsigned)geteuid());
	snprintf(pid, sizeof(pid), "%d", (int)prev.left_pid);
	snprintf(next, sizeof(next), "%d", (int)getpid());
	put(log, kv, prev.taken_over ? "daemon-taken-over" : "daemon-crashed");
	if (!prev.taken_over)
		fprintf(stderr, "lockfs: notice: the previous daemon of %s (pid %d) ended without "
			"a clean stop\n", be->state_path, (int)prev.left_pid);
	lockfs_backend_forget_predecessor(be);
}

void lockfs_lifecycle_resumed(struct lockfs_log *log, struct lockfs_backend *be, pid_t prev,
			      const char *cause)
{
	char uid[16], pid[16], prevs[16];
	const char *kv[] = { "uid", uid, "pid", pid, "prev_pid", prevs, "cause", cause,
			     "version", LOCKFS_VERSION, NULL };

	snprintf(uid, sizeof(uid), "%u", (unsigned)geteuid());
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	snprintf(prevs, sizeof(prevs), "%d", (int)prev);
	put(log, kv, "daemon-resumed");
	fprintf(stderr, "lockfs: notice: took over the connection of %s from pid %d (%s)\n",
		be->state_path, (int)prev, cause);
	lockfs_backend_forget_predecessor(be);
}

void lockfs_lifecycle_started(struct lockfs_log *log, const struct lockfs_backend *be,
			      const char *mountpoint)
{
	struct lockfs_predecessor prev = lockfs_backend_predecessor(be);
	char uid[16], pid[16], waited_pid[16], waited_ms[16];
	const char *kv[] = { "uid", uid, "pid", pid, "mount", mountpoint,
			     "backing", be->state_path, "version", LOCKFS_VERSION,
			     prev.waited_ms ? "waited_pid" : NULL, waited_pid,
			     "waited_ms", waited_ms, NULL };

	snprintf(uid, sizeof(uid), "%u", (unsigned)geteuid());
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	snprintf(waited_pid, sizeof(waited_pid), "%d", (int)prev.waited_pid);
	snprintf(waited_ms, sizeof(waited_ms), "%u", prev.waited_ms);
	put(log, kv, "daemon-started");
	if (prev.waited_ms)
		fprintf(stderr, "lockfs: notice: waited %u ms for the previous daemon of %s "
			"(pid %d) to stop\n", prev.waited_ms, be->state_path, (int)prev.waited_pid);
}

void lockfs_lifecycle_stopped(struct lockfs_log *log, const char *mountpoint, int sig)
{
	char uid[16], pid[16], cause[16];
	const char *kv[] = { "uid", uid, "pid", pid, "mount", mountpoint, "cause", cause, NULL };

	snprintf(uid, sizeof(uid), "%u", (unsigned)geteuid());
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	if (sig > 0)
		snprintf(cause, sizeof(cause), "SIG%s", sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
	else
		snprintf(cause, sizeof(cause), "unmount");
	put(log, kv, "daemon-stopped");
	fprintf(stderr, "lockfs: notice: stopped serving %s (%s)\n", mountpoint, cause);
}

void lockfs_lifecycle_failed(struct lockfs_log *log, const char *mountpoint, const char *cause)
{
	char uid[16], pid[16];
	const char *kv[] = { "uid", uid, "pid", pid, "mount", mountpoint, "cause", cause, NULL };

	snprintf(uid, sizeof(uid), "%u", (unsigned)geteuid());
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	put(log, kv, "daemon-stopped");
}
