/*
 * The lock engine: names, holders, records, the backend and the audit log
 * put together.  It knows nothing of FUSE: fs/ turns each request into
 * calls here, and their results into exactly one reply.
 *
 * Every function returns 0 or a negative errno unless its comment says
 * otherwise, and is safe to call from several threads at once.
 */
#ifndef LOCKFS_CORE_H
#define LOCKFS_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lockfs/holder.h"
#include "lockfs/log.h"
#include "lockfs/record.h" /* enum lockfs_mode */

struct lockfs_core;
struct lockfs_backend;

/* A cap of lockfs_core_config that is never reached (-o max_...=0). */
#define LOCKFS_NO_LIMIT UINT32_MAX

struct lockfs_core_config {
	struct lockfs_backend *backend; /* the store (lockfs/backend.h), opened and
					   not yet start()ed: taken over by the core
					   once lockfs_core_open succeeds */
	const char *helpers;     /* ':'-separated; NULL = default */
	struct lockfs_log *log;  /* the audit log: taken over by the core, also
				    when lockfs_core_open fails */
	const struct lockfs_proc_source *procs; /* NULL = /proc */
	uint32_t lease_s;        /* lease of slug-bound locks; 0 = 600 */
	int break_signal;        /* sent to a holder whose lock is broken or
				    lease-recovered; 0 = none */
	bool descendants_scan;   /* find a holder's descendants by scanning /proc
				    only, not through the process-event connector */
	/* -o container_root=host: a caller in another pid namespace than the
	 * daemon's has root's powers over every lock, not only over those of
	 * its own container (docs/holder.md, "Root in a container"). */
	bool container_root_host;
	/* What one uid may hold (root: no cap), and locks in all for
	 * everyone but root; 0 = the default (docs/quota.md),
	 * LOCKFS_NO_LIMIT = none. */
	uint32_t max_open_per_uid;    /* open files and directories of M */
	uint32_t max_locks_per_uid;   /* holders of locks (EDQUOT) */
	uint32_t max_waiters_per_uid; /* parked flock/fcntl requests (EDQUOT) */
	uint32_t max_locks;           /* holders of locks in all (ENOSPC) */
	/* The FUSE connection lives on: this daemon takes over the open
	 * connection of one that died or was replaced (a keeper held it), so
	 * the open files of the mount are still open and their closes will
	 * come.  Then fd locks in the store stay fd locks of the same open
	 * files (not rebound to processes), and the requests the kernel
	 * resends (lockfs_caller.resent) are recognised: see
	 * lockfs_core_resume_done and docs/recovery.md. */
	bool resuming;
	/* -o metrics_names: the lock names (':'-separated) that get series of
	 * their own in M/.metrics; NULL = none. */
	const char *metrics_names;
};

/* Who sent a request, as FUSE reports it. */
struct lockfs_caller {
	pid_t tid; /* thread id in the daemon's pid ns; 0 = not visible */
	uid_t uid;
	gid_t gid;
	/* The kernel's number of the request (its FUSE unique with bit 63
	 * cleared): the kernel numbers the requests of one connection in the
	 * order they are made, so it orders waiters across a restart.  0 =
	 * unknown (then arrival at the engine orders). */
	uint64_t ticket;
	/* The kernel resent it (FUSE_NOTIFY_RESEND, bit 63 of the unique):
	 * a predecessor serving the same connection had read it and may have
	 * carried it out before it died, without answering. */
	bool resent;
};

/* What the mount shows of a held lock. */
struct lockfs_lock_stat {
	uid_t uid;          /* holder's uid (foreign: owner of DIR/NAME.lock) */
	gid_t gid;
	int64_t mtime_ms;   /* acquisition time */
	uint64_t identity;  /* changes whenever the stored lock changes */
	uint64_t generation; /* one acquisition of the name: its fence (foreign
				locks: the store's identity) */
	uint64_t fence;     /* 0 for a foreign lock */
	bool foreign;       /* held without a record lockfs can read */
};

/*
 * Open the engine on the backing store and look at every lock in it:
 * locks of holders that died meanwhile (or in an earlier boot) are
 * recovered and logged; live holders are watched again.
 */
int lockfs_core_open(struct lockfs_core **out, const struct lockfs_core_config *cfg)
	__attribute__((warn_unused_result));
/* The device of the mount the engine serves (lockfs_mount_dev), so that a
 * descriptor of that mount is told from one of an earlier mount (fd locks
 * rebound at a restart).  Before lockfs_core_start; unset (0), every
 * descriptor of a lock file counts as an earlier mount's (fail closed). */
void lockfs_core_set_mount_dev(struct lockfs_core *core, dev_t dev);
/* The device of the lockfs mount at MOUNTPOINT (absolute, canonical: as
 * /proc/self/mountinfo shows it), read from there -- stat(2) on it would be
 * a request to the daemon itself (core/proc/descriptors.c).  Returns 0 and
 * *DEV, -ENOENT when no lockfs is mounted there, or -errno. */
int lockfs_mount_dev(const char *mountpoint, dev_t *dev) __attribute__((warn_unused_result));
/* A resuming engine (lockfs_core_config.resuming): every request the
 * kernel resent has reached the engine.  Until then (at most
 * LOCKFS_RESUME_HOLD_MS after opening, or LOCKFS_RESUME_QUIET_MS after the
 * last resent request, whichever is later), no waiter is handed a lock:
 * resent requests come back in no particular order, and the one that
 * waited longest may not have come back yet.  Call it once the request
 * loop has read a request without the resent mark (the kernel puts every
 * resent request ahead of the others) and every resent one read before
 * has been handed to the engine.  Idempotent; nothing for an engine that
 * is not resuming. */
void lockfs_core_resume_done(struct lockfs_core *core);
#define LOCKFS_RESUME_HOLD_MS 500
#define LOCKFS_RESUME_QUIET_MS 100

/* Start the liveness thread (after any fork).  0 or -errno. */
int lockfs_core_start(struct lockfs_core *core) __attribute__((warn_unused_result));
/* Stop it, and give releases the store refused one last try: the engine
 * changes no lock on its own after this returns.  Idempotent. */
void lockfs_core_stop(struct lockfs_core *core);
void lockfs_core_close(struct lockfs_core *core);

/* mkdir: acquire NAME for the caller's resolved holder.
 * 0 (ST filled, may be NULL), -EINVAL/-ENAMETOOLONG (bad name),
 * -EEXIST (held), -EACCES (holder cannot be established), -errno. */
int lockfs_core_acquire(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller, struct lockfs_lock_stat *st);

/* rmdir: release NAME if the caller is its holder or a descendant.
 * 0, -ENOENT (not held), -EPERM (not the holder's), -EACCES,
 * -ESTALE (the caller's lock was lost -- with the daemon's session to
 * the store, or removed from the store behind it -- whether NAME is free
 * or held by someone else since: told once, see lockfs_core_lost),
 * -errno. */
int lockfs_core_release(struct lockfs_core *core, const char *name,
			const struct lockfs_caller *caller);

/* Was NAME a lock lost with the daemon's session (a store with sessions,
 * etcd) that a holder has not been told of yet?  The kernel looks a name
 * up before it sends rmdir, and NAME is gone: on true, the lookup asks
 * lockfs_core_release with the caller, whose -ESTALE (for the holder)
 * or -ENOENT is the lookup's answer.  Cheap; false for dir. */
bool lockfs_core_lost(struct lockfs_core *core, const char *name);

/* Is NAME held?  0 (ST filled), -ENOENT (not held or not a valid name). */
int lockfs_core_stat(struct lockfs_core *core, const char *name,
		     struct lockfs_lock_stat *st);

/* Render NAME's `owner` JSON for READER (the token and command lines only
 * for the holder's uid and root; root in a container under
 * -o container_root=own: only for its own container's holders; NULL: all).
 * Malloc'd in *JSON.  0, -ENOENT. */
int lockfs_core_owner(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *reader, char **json, size_t *len);

/* NAME's operation text ("" when none), malloc'd.  0, -ENOENT. */
int lockfs_core_operation(struct lockfs_core *core, const char *name,
			  char **text, size_t *len);

/* Could the caller release NAME (the rmdir rule)?  0, -EPERM, -ENOENT, -EACCES. */
int lockfs_core_check_holder(struct lockfs_core *core, const char *name,
			     const struct lockfs_caller *caller);

/* Set NAME's operation to TEXT (LEN bytes; one trailing newline dropped;
 * empty clears it), if the caller may release NAME.
 * 0, -EPERM, -EFBIG (> LOCKFS_OPERATION_MAX), -EINVAL (not UTF-8), -ENOENT. */
int lockfs_core_set_operation(struct lockfs_core *core, const char *name,
			      const struct lockfs_caller *caller,
			      const char *text, size_t len);

/* NAME's lease as one line: "null\n" or its JSON object.  0, -ENOENT. */
int lockfs_core_lease(struct lockfs_core *core, const char *name, char **text, size_t *len);

/* Set NAME's lease to the decimal seconds in TEXT (a trailing newline
 * allowed) and renew it; 0 clears a process-bound lock's lease.
 * 0, -EPERM (not the holder's), -EINVAL (not a number; 0 for a slug-bound
 * lock, whose lease is its liveness), -ENOENT. */
int lockfs_core_set_lease(struct lockfs_core *core, const char *name,
			  const struct lockfs_caller *caller, const char *text, size_t len);

/* Renew NAME's lease, if it has one (`touch M/NAME`).  0, -EPERM, -ENOENT. */
int lockfs_core_renew(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *caller);

/* Break NAME with REASON (1..LOCKFS_REASON_MAX bytes of UTF-8; one
 * trailing newline dropped): release it whoever holds it, log `broken`.
 * Whether the caller may break is the mount's decision, not the engine's.
 * 0, -EINVAL (bad reason), -ENOENT. */
int lockfs_core_break(struct lockfs_core *core, const char *name,
		      const struct lockfs_caller *caller, const char *reason, size_t len);

/*
 * Waiting: fd locks (flock(2) and whole-file fcntl locks on M/.flock/NAME).
 *
 * An fd lock belongs to an open file description or a POSIX lock owner,
 * named by OWNER ("flock:HEX" / "posix:HEX", < LOCKFS_FD_OWNER_MAX bytes):
 * it ends when that owner lets go (lockfs_core_fd_unlock), not when the
 * process that asked exits.  A blocking request that cannot be granted at
 * once is parked in NAME's FIFO queue with its struct lockfs_wait, which
 * the caller owns and keeps alive until DONE has been called -- exactly
 * once, from whichever thread grants or fails it, with NAME's engine mutex
 * held (so the waiter runs as soon as it may): DONE must answer and
 * return, never call into the engine.  A newcomer is granted at once only
 * when nobody waits ahead of it.
 */
struct lockfs_wait {
	/* Set by the caller: RESULT is 0 (granted) or -errno. */
	void (*done)(struct lockfs_wait *w, int result);
	/* The engine's: */
	void *entry;  /* its place in the queue, while parked */
	void *deadlock; /* its record in the wait-for graph (lock/deadlock.c),
			   which interposes on DONE while it is in it */
	bool parked;  /* protected by the name's stripe mutex */
};

/* One fd-lock request: flock(2), or a whole-file fcntl lock. */
struct lockfs_fd_request {
	const char *name;
	/* Whose lock: "flock:HEX" (an open file description) or "posix:HEX"
	 * (a POSIX lock owner), < LOCKFS_FD_OWNER_MAX bytes. */
	const char *owner;
	/* The open file (the mount's handle) an fcntl lock is taken through,
	 * 0 for none (flock).  A grant remembers the last open file of NAME
	 * that OWNER was granted through: lockfs_core_fd_file_closed() of
	 * that file ends OWNER's lock, as the last close of an open file
	 * description ends its OFD lock without any unlock. */
	uint64_t via_file;
	enum lockfs_mode mode;
	bool wait;   /* park the request when it cannot be granted now */
};

/* The holder an fd-lock request conflicts with (F_GETLK). */
struct lockfs_fd_conflict {
	bool shared; /* it holds NAME shared */
	pid_t pid;   /* its pid, 0 when unknown (a foreign lock) */
};

/* Take RQ->name for RQ->owner in RQ->mode.  0: granted now (also when
 * OWNER holds it in that mode already); -EWOULDBLOCK: it would wait and
 * RQ->wait is false; -EINPROGRESS: parked, W->done will tell;
 * -EINVAL/-ENAMETOOLONG (bad name), -EACCES (holder unknown), -errno.
 * Holding it in the other mode, OWNER lets go first (flock(2)'s
 * conversion: not atomic). */
int lockfs_core_fd_lock(struct lockfs_core *core, const struct lockfs_caller *caller,
			const struct lockfs_fd_request *rq, struct lockfs_wait *w);

/* Take W out of NAME's queue if it is still parked there (an interrupted
 * request): its place is kept for a second for OWNER's restarted request.
 * 0: cancelled, DONE will not be called (the caller answers);
 * -EALREADY: not parked (not yet, or being granted: DONE will tell). */
int lockfs_core_fd_cancel(struct lockfs_core *core, const char *name, struct lockfs_wait *w);

/* OWNER lets go of NAME (LOCK_UN, F_UNLCK, its last close).  0 also when
 * OWNER held nothing. */
int lockfs_core_fd_unlock(struct lockfs_core *core, const char *name, const char *owner);

/* Open file FILE of NAME (a via_file) is closed for good: every lock that
 * was granted through it last ends (lockfs_core_fd_unlock of its owner). */
void lockfs_core_fd_file_closed(struct lockfs_core *core, const char *name, uint64_t file);

/* What F_GETLK reports: would RQ (its name, owner and mode; via_file and
 * wait are not looked at) conflict?  0 = no (*OUT untouched), 1 = yes:
 * *OUT describes the holder.  -errno. */
int lockfs_core_fd_test(struct lockfs_core *core, const struct lockfs_fd_request *rq,
			struct lockfs_fd_conflict *out);

/* NAME's queued waiters, one JSON object per line, in queue order
 * (malloc'd, "" when none).  0, -ENOENT (not held). */
int lockfs_core_waiters(struct lockfs_core *core, const char *name, char **text, size_t *len);

/* NAME's binding as a line: "fd", "process" or "slug".  0, -ENOENT. */
int lockfs_core_binding(struct lockfs_core *core, const char *name, char **text, size_t *len);

/* Turn NAME's exclusive fd lock into a process-bound ("process") or
 * slug-bound ("slug") one, with the same fence, for a caller that passes
 * the rmdir rule.  0, -EPERM, -EINVAL (bad text, not an exclusive fd lock,
 * no LOCKFS_SLUG), -ENOENT. */
int lockfs_core_bind(struct lockfs_core *core, const char *name,
		     const struct lockfs_caller *caller, const char *text, size_t len);

/*
 * Slots (docs/slots.md): one of N slots of a slotted NAME.  REQUEST is
 * "NAME=N"; a NAME_GIVEN is "NAME" or "NAME=N".  Slot K is the lock
 * ".slotKofN:NAME" to the rest of the engine.  -EOPNOTSUPP: the store
 * serves no slots (etcd).
 */
/* mkdir M/.slots/NAME=N: take a free slot for the caller's holder.  0 (ST
 * filled: the slot's lock), -EEXIST (all held, or flock waiters queued),
 * -ERANGE (NAME's slots were taken with another N: logged `denied`),
 * -EINVAL/-ENAMETOOLONG, -EACCES, -errno. */
int lockfs_core_slot_acquire(struct lockfs_core *core, const char *request,
			     const struct lockfs_caller *caller, struct lockfs_lock_stat *st);
/* rmdir M/.slots/NAME: release a slot of NAME that the caller may
 * release (the rmdir rule).  0, -ENOENT (none held), -EPERM. */
int lockfs_core_slot_release(struct lockfs_core *core, const char *name_given,
			     const struct lockfs_caller *caller);
/* Is any slot of NAME held?  0 (ST: one stat that stays the same while
 * any is held), -ENOENT. */
int lockfs_core_slot_stat(struct lockfs_core *core, const char *name_given,
			  struct lockfs_lock_stat *st);
/* NAME's `owner`: every holder of every slot, each with "slot": K. */
int lockfs_core_slot_owner(struct lockfs_core *core, const char *name_given,
			   const struct lockfs_caller *reader, char **json, size_t *len);
/* Slotted names with a slot held, sorted (lockfs_names_free). */
int lockfs_core_slot_list(struct lockfs_core *core, char ***names, size_t *count);
/* flock/fcntl on M/.flock/.slots/NAME=N: as lockfs_core_fd_lock (RQ->name
 * is REQUEST; the mode is always one slot), plus -ERANGE as above.  A
 * parked waiter is granted in arrival order whenever any slot frees. */
int lockfs_core_slot_fd_lock(struct lockfs_core *core, const struct lockfs_caller *caller,
			     const struct lockfs_fd_request *rq, struct lockfs_wait *w);
int lockfs_core_slot_fd_cancel(struct lockfs_core *core, const char *request,
			       struct lockfs_wait *w);
int lockfs_core_slot_fd_unlock(struct lockfs_core *core, const char *request, const char *owner);
void lockfs_core_slot_fd_file_closed(struct lockfs_core *core, const char *request,
				     uint64_t file);
/* NAME's parked flock waiters, in line order, one JSON object a line:
 * {"pid":requester,"uid":…,"slots":N}.  0, -ENOENT. */
int lockfs_core_slot_waiters(struct lockfs_core *core, const char *name_given, char **text,
			     size_t *len);
/* For slots: a request's holder-to-be, command line and slug read once
 * (when a slot waiter parks), so that lockfs_core_fd_lock_as() of a slot,
 * tried when any frees, reads nothing of /proc: as lockfs_core_fd_lock
 * for RQ's name, owner, file and mode. */
struct lockfs_fd_asker;
int lockfs_core_fd_asker_new(struct lockfs_core *core, const struct lockfs_caller *caller,
			     const struct lockfs_fd_request *rq, struct lockfs_fd_asker **out);
void lockfs_core_fd_asker_free(struct lockfs_fd_asker *a);
int lockfs_core_fd_lock_as(struct lockfs_core *core, const struct lockfs_fd_asker *a,
			   const struct lockfs_fd_request *rq, struct lockfs_wait *w);
/* The slot OWNER holds of REQUEST's name (0-based), or -ENOENT. */
int lockfs_core_slot_index(struct lockfs_core *core, const char *request, const char *owner);

/* Names that are held or have waiters, sorted (as lockfs_core_list). */
int lockfs_core_list_flock(struct lockfs_core *core, char ***names, size_t *count);

/* Names of all held locks with a valid name, sorted bytewise.
 * *NAMES is a malloc'd NULL-terminated array; free with lockfs_names_free. */
int lockfs_core_list(struct lockfs_core *core, char ***names, size_t *count);
void lockfs_names_free(char **names);

/*
 * An open file or directory of the mount for CALLER: counted against
 * -o max_open_per_uid, and, when it KEEPS_FD (a descriptor in the daemon
 * for as long as it is open: M/.log), against the descriptors the daemon
 * may keep for callers (root may use half of the reserve).  NAME is what
 * is opened, for the log.  0, or -EMFILE (logged as a `refused` burst).
 * Every 0 is matched by one lockfs_core_handle_close(), with the same uid.
 */
int lockfs_core_handle_open(struct lockfs_core *core, const struct lockfs_caller *caller,
			    bool keeps_fd, const char *name);
void lockfs_core_handle_close(struct lockfs_core *core, uid_t uid, bool keeps_fd);

/* A fresh descriptor to read the audit log from, for `M/.log`: the file
 * the daemon writes now, whatever its name.  fd or -errno. */
int lockfs_core_log_open_ro(struct lockfs_core *core);

/* Open DIR/lock.log again soon (SIGHUP: logrotate moved it).
 * Async-signal-safe. */
void lockfs_core_log_reopen(struct lockfs_core *core);

/*
 * M/.events (docs/operations.md): one JSON line per event of a lock, for
 * readers that attach.  A reader's cursor starts at the next event
 * (lockfs_core_events_attach); lockfs_core_events_take copies whole lines
 * from it into BUF -- those WANT (NULL: all) accepts by lock name --
 * and returns the bytes (0: none yet), or -EOVERFLOW when SIZE cannot
 * hold the next line.  lockfs_core_events_wait blocks until the event
 * numbered SEEN exists or the events are shut, and returns the next
 * event's number.  lockfs_core_events_shut
 * wakes every waiter for good (the daemon stops).
 */
typedef bool (*lockfs_core_event_want_fn)(void *arg, const char *name);
uint64_t lockfs_core_events_attach(struct lockfs_core *core);
void lockfs_core_events_detach(struct lockfs_core *core);
ssize_t lockfs_core_events_take(struct lockfs_core *core, uint64_t *cursor, char *buf, size_t size,
				lockfs_core_event_want_fn want, void *arg);
uint64_t lockfs_core_events_wait(struct lockfs_core *core, uint64_t seen);
void lockfs_core_events_shut(struct lockfs_core *core);

/*
 * A reader of M/.events follows NEW from now on, no longer OLD: each a
 * watch list (names, each NUL-terminated, an empty one last),
 * LOCKFS_FOLLOW_ALL (every name), or LOCKFS_FOLLOW_NONE (nothing: before
 * its first read or write, after close).  A store that hears only of the
 * names this daemon needs (etcd) hears of what readers follow too, so
 * that other hosts' locks are events.  0, or the store's -errno (events
 * of some names may then be missing).  May wait for the store (one
 * bounded read); call it with no lock held that a store's report needs.
 */
#ifndef LOCKFS_FOLLOW_NONE
#define LOCKFS_FOLLOW_NONE ((const char *)0)
extern const char lockfs_follow_all[];
#define LOCKFS_FOLLOW_ALL lockfs_follow_all
#endif
int lockfs_core_events_follow(struct lockfs_core *core, const char *old, const char *new_);
bool lockfs_core_events_shut_down(struct lockfs_core *core);

/* M/.metrics' text (Prometheus' text format) in *TEXT (malloc'd, *LEN
 * bytes).  0 or -ENOMEM. */
int lockfs_core_metrics(struct lockfs_core *core, char **text, size_t *len);

#endif
