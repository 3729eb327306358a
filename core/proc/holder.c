/*
 * The holder rule (see include/lockfs/holder.h): who holds what a caller
 * takes (lockfs_holder_resolve, on every mkdir), and may a caller release
 * what a holder holds (lockfs_holder_may_release, on every rmdir).  Process
 * facts come only through a struct lockfs_proc_source (the real /proc,
 * procfs.c, or a test's table); genuine helpers are helpers.c's.
 */
#include <errno.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "lockfs/holder.h"
#include "helpers.h"

/* Longest parent walk; a real process tree is never this deep, so hitting
 * it means a cycle in the source (pid reuse in a fake or a racing /proc). */
#define WALK_MAX 4096

/* ---- the holder rule -------------------------------------------------- */

/* Read the thread group of TID; the caller's own absence is -ESRCH. */
static int read_caller(const struct lockfs_proc_source *src, pid_t tid,
		       unsigned want, struct lockfs_proc *out)
{
	int rc = src->read_tid(src->ctx, tid, want, out);
	return rc == -ENOENT ? -ESRCH : rc;
}

/* The effective uid of P: *UID when known, else read (then stored in
 * *UID).  0 or -errno. */
static int uid_of(const struct lockfs_proc_source *src, const struct lockfs_proc *p, uid_t *uid)
{
	struct lockfs_proc tmp;
	int rc;

	if (*uid != LOCKFS_UID_UNKNOWN)
		return 0;
	if (p->have_ids) {
		*uid = p->uid;
		return 0;
	}
	rc = src->read_tid(src->ctx, p->pid, LOCKFS_PROC_IDS, &tmp);
	if (rc < 0)
		return rc;
	lockfs_proc_put(&tmp);
	if (!tmp.have_ids || tmp.pid != p->pid || tmp.start_time != p->start_time)
		return -ENOENT; /* gone, or its pid reused */
	*uid = tmp.uid;
	return 0;
}

/* The pid namespace of P into *NS, once (*KNOWN).  0, or -errno: -ENOENT
 * when P is gone, else P's namespace cannot be read (not ours to look at).
 * A source that cannot tell puts every process in one namespace. */
static int pidns_of(const struct lockfs_proc_source *src, const struct lockfs_proc *p,
		    unsigned long long *ns, bool *known)
{
	int rc;

	if (*known)
		return 0;
	if (!src->pidns) {
		*ns = 0;
		*known = true;
		return 0;
	}
	rc = src->pidns(src->ctx, p->pid, p->start_time, ns);
	*known = rc == 0;
	return rc;
}

/*
 * Is Q, just read as P's parent, outside P's pid namespace?  P_NS caches
 * P's namespace (P_NS_KNOWN), and gets Q's when the answer is no (Q is
 * the next P).  Returns 1 (outside), 0 (same namespace, or nobody can
 * tell: the walk goes on as it always did), or -ENOENT when P or Q left.
 */
static int parent_outside(const struct lockfs_proc_source *src, const struct lockfs_proc *p,
			  const struct lockfs_proc *q, unsigned long long *p_ns,
			  bool *p_ns_known)
{
	unsigned long long q_ns;
	bool q_known = false;
	int rc = pidns_of(src, p, p_ns, p_ns_known);

	if (rc == 0)
		rc = pidns_of(src, q, &q_ns, &q_known);
	if (rc == -ENOENT)
		return rc;
	if (rc < 0) {
		*p_ns_known = false;
		return 0;
	}
	if (q_ns != *p_ns)
		return 1;
	return 0; /* *P_NS is Q's too */
}

/* Most times a parent that left is looked for again: a process whose
 * parent exits gets a new one (a subreaper, or its namespace's init), as
 * what `podman exec` starts is left by `runc init` to conmon. */
#define REPARENT_TRIES 3

/*
 * Read P's parent into *Q (with WANT besides its exe and ids).  P_NS and
 * P_NS_KNOWN cache P's pid namespace (parent_outside()).
 *
 * Never out of P's pid namespace: what starts a container's process
 * (conmon, runc, unshare) is not the holder the container's user knows,
 * and answers for every container at once; and a parent the daemon cannot
 * see (ppid 0) is outside the daemon's namespace, so outside P's.  Asked
 * before the parent's believability: a parent outside never holds,
 * whatever it is.  When P's parent left, P is read again for the parent
 * it was given.
 *
 * Returns 0 (*Q is the process on P's ppid, in P's pid namespace: the
 * caller judges it and closes it), 1 (P's parent is outside P's pid
 * namespace: P holds), or -EACCES (an orphan of init, or a parent that
 * left without P getting another: nobody believable).
 */
static int read_parent(const struct lockfs_proc_source *src, struct lockfs_proc *p,
		       unsigned want, struct lockfs_proc *q, unsigned long long *p_ns,
		       bool *p_ns_known)
{
	for (int tries = 0;; tries++) {
		struct lockfs_proc again;
		int rc;

		if (p->ppid == 0 && p->pid > 1)
			return 1;
		if (p->ppid <= 1)
			return -EACCES; /* an orphan of init has no believable holder */
		rc = src->read_tid(src->ctx, p->ppid, LOCKFS_PROC_EXE | LOCKFS_PROC_IDS | want, q);
		if (rc == 0 && q->pid != p->ppid)
			return 0; /* a thread's id: not believable, the caller says */
		if (rc == 0) {
			rc = parent_outside(src, p, q, p_ns, p_ns_known);
			if (rc == 0)
				return 0;
			lockfs_proc_put(q);
			if (rc == 1)
				return 1;
		}
		if (rc != -ENOENT)
			return rc;
		/* The parent left (or P did): P has another by now, or is gone. */
		if (tries == REPARENT_TRIES || src->read_tid(src->ctx, p->pid, 0, &again) < 0)
			return -EACCES;
		lockfs_proc_put(&again);
		if (again.pid != p->pid || again.start_time != p->start_time ||
		    again.ppid == p->ppid)
			return -EACCES;
		p->ppid = again.ppid;
	}
}

int lockfs_holder_resolve(const struct lockfs_proc_source *src, pid_t caller_tid,
			  uid_t caller_uid, struct lockfs_helpers *helpers, unsigned want,
			  struct lockfs_proc *holder)
{
	if (caller_tid <= 0)
		return -EACCES;
	if (!src)
		src = &lockfs_procfs_source;
	struct lockfs_proc p, q;
	struct stat exe;
	uid_t uid = caller_uid; /* p's effective uid, or unknown */
	bool ns = want & LOCKFS_PROC_NS;
	want &= LOCKFS_PROC_PIDFD;
	int rc = read_caller(src, caller_tid, LOCKFS_PROC_EXE | want, &p);
	if (rc < 0)
		return rc;
	p.at_uid_boundary = false;
	p.at_pidns_boundary = false;
	unsigned long long p_ns = 0; /* P's pid namespace, once read */
	bool p_ns_known = false;
	int steps = 0;
	/* A helper on the list, but only a genuine copy of it: anything else
	 * named so is a program like any other, and holds. */
	while (lockfs_helpers_contains(helpers, p.exe)) {
		/* Whose walk a lookup in P's root is (helper_files.c counts
		 * them per uid): P's uid, read when the caller's is unknown. */
		if (uid == LOCKFS_UID_UNKNOWN && uid_of(src, &p, &uid) < 0)
			uid = LOCKFS_UID_UNKNOWN;
		rc = lockfs_helpers_genuine(src, helpers, &p, uid, &exe);
		if (rc == 0)
			break;
		if (rc < 0)
			goto fail; /* P's root did not answer in time: nobody can say */
		rc = -EACCES;
		if (++steps > WALK_MAX)
			goto fail;
		rc = uid_of(src, &p, &uid);
		if (rc < 0) {
			rc = rc == -ENOENT ? (steps == 1 ? -ESRCH : -EACCES) : rc;
			goto fail;
		}
		rc = read_parent(src, &p, want, &q, &p_ns, &p_ns_known);
		if (rc < 0)
			goto fail;
		if (rc == 1) {
			p.at_pidns_boundary = true;
			break;
		}
		/* Believable only if: the pid is the parent's, not init; the
		 * parent is not younger than its child (else it is a new
		 * process on a recycled pid, not the one that started the
		 * helper); and a child that does not lead its own session
		 * shares its parent's (a different one means a reaper adopted
		 * it). */
		rc = q.pid != p.ppid || q.pid <= 1 || q.start_time > p.start_time ||
		     (p.sid != q.sid && p.sid != p.pid) ? -EACCES : 0;
		if (rc < 0) {
			lockfs_proc_put(&q);
			goto fail;
		}
		/* Never across a uid boundary: the parent would answer for what
		 * a process of another user did.  Only a set-uid helper (sudo)
		 * runs as another user than its parent by design: the user who
		 * ran it is the one it acts for. */
		if (q.uid != uid && !((exe.st_mode & S_ISUID) && exe.st_uid == uid)) {
			lockfs_proc_put(&q);
			p.at_uid_boundary = true;
			break;
		}
		lockfs_proc_put(&p);
		p = q;
		p.at_uid_boundary = false;
		p.at_pidns_boundary = false;
		uid = q.uid;
	}
	if (p.pid <= 1) {
		rc = -EACCES;
		goto fail;
	}
	p.ns_pid = 0;
	p.container[0] = '\0';
	if (ns && src->read_ns && src->read_ns(src->ctx, p.pid, &p) < 0) {
		p.ns_pid = 0; /* unknown: the record says null */
		p.container[0] = '\0';
	}
	*holder = p;
	return 0;
fail:
	lockfs_proc_put(&p);
	return rc;
}

int lockfs_holder_may_release(const struct lockfs_proc_source *src, pid_t caller_tid,
			      pid_t holder_pid, unsigned long long holder_start,
			      bool holder_alive)
{
	if (caller_tid <= 0)
		return -EACCES;
	if (!src)
		src = &lockfs_procfs_source;
	/* A live holder owns its pid, and thread ids are unique across the
	 * system: a caller with that id is the holder's own main thread. */
	if (holder_alive && caller_tid == holder_pid)
		return 0;
	struct lockfs_proc c, q;
	int rc = read_caller(src, caller_tid, 0, &c);
	if (rc < 0)
		return rc;
	/* First, before any helper logic: `sh -c 'mkdir X && rmdir X'` may
	 * exec rmdir in the very process that holds X. */
	if (c.pid == holder_pid && (holder_alive || c.start_time == holder_start))
		return 0;
	if (holder_pid <= 1)
		return -EPERM;
	for (int steps = 0; steps < WALK_MAX; steps++) {
		if (c.ppid <= 1)
			return -EPERM; /* reached init (never a holder) or the top */
		if (holder_alive && c.ppid == holder_pid)
			return 0; /* the live holder is our parent: no read needed */
		if (src->read_tid(src->ctx, c.ppid, 0, &q) < 0)
			return -EPERM; /* the chain is broken: no proof */
		if (q.pid != c.ppid || q.start_time > c.start_time)
			return -EPERM; /* recycled pid: not our ancestor */
		if (q.pid == holder_pid && q.start_time == holder_start)
			return 0;
		c = q;
	}
	return -EPERM;
}
