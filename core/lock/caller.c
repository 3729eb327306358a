/*
 * Who is asking (caller.h): the holder-to-be of a request, its slug and
 * user name, a new record with its token, the rmdir rule, and the
 * refusals that name a caller.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "lockfs/utf8.h"
#include "base/clock.h"
#include "audit.h"
#include "caller.h"
#include "table.h"

#define CMDLINE_MAX 4096

void lockfs_caller_refuse(struct lockfs_table *t, uid_t uid, enum quota_reason reason,
			  const char *name, const char *who, pid_t pid)
{
	char buf[WHO_MAX];

	if (!lockfs_quota_refused(t->quota, uid, reason, name))
		return;
	lockfs_table_wake(t); /* a burst begins: the tick logs its end */
	if (!who) {
		pid = lockfs_caller_who(t, pid, buf, sizeof(buf));
		who = buf;
	}
	lockfs_quota_burst_who(t->quota, uid, reason, who, pid);
}

/* The user name of UID (cached; getpwuid may go to NSS).  Malloc'd or NULL. */
static char *user_name(struct lockfs_table *t, uid_t uid)
{
	char *name = NULL, buf[4096];
	struct passwd pw, *res = NULL;

	pthread_mutex_lock(&t->users_mu);
	for (size_t i = 0; i < t->nusers; i++) {
		if (t->users[i].uid == uid) {
			name = t->users[i].name ? strdup(t->users[i].name) : NULL;
			pthread_mutex_unlock(&t->users_mu);
			return name;
		}
	}
	pthread_mutex_unlock(&t->users_mu);

	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) == 0 && res)
		name = strdup(res->pw_name);

	pthread_mutex_lock(&t->users_mu);
	if (t->nusers < 1024) {
		struct uid_name *n = realloc(t->users, (t->nusers + 1) * sizeof(*n));

		if (n) {
			t->users = n;
			n[t->nusers].uid = uid;
			n[t->nusers].name = name ? strdup(name) : NULL;
			t->nusers++;
		}
	}
	pthread_mutex_unlock(&t->users_mu);
	return name;
}

/* 128 random bits as hex.  getrandom(2) is asked for 32 tokens at a
 * time per thread: one syscall fewer on almost every acquisition. */
static int make_token(char out[LOCKFS_TOKEN_HEX + 1])
{
	static __thread unsigned char pool[32 * LOCKFS_TOKEN_HEX / 2];
	static __thread size_t left;
	unsigned char raw[LOCKFS_TOKEN_HEX / 2];

	if (left < sizeof(raw)) {
		size_t got = 0;

		while (got < sizeof(pool)) {
			ssize_t n = getrandom(pool + got, sizeof(pool) - got, 0);

			if (n < 0) {
				if (errno == EINTR)
					continue;
				return -errno;
			}
			got += (size_t)n;
		}
		left = sizeof(pool);
	}
	left -= sizeof(raw);
	memcpy(raw, pool + left, sizeof(raw));
	/* Used bytes never serve twice. */
	memset(pool + left, 0, sizeof(raw));
	for (size_t i = 0; i < sizeof(raw); i++) {
		out[2 * i] = "0123456789abcdef"[raw[i] >> 4];
		out[2 * i + 1] = "0123456789abcdef"[raw[i] & 15];
	}
	out[LOCKFS_TOKEN_HEX] = '\0';
	return 0;
}

/* The LOCKFS_SLUG of thread TID's process (its exec-time environment) into
 * BUF; "" when unset or unreadable.  Returns 0, or -EINVAL for a slug that
 * is too long (LOCKFS_SLUG_MAX - 1 bytes at most), not UTF-8, or has a control
 * character: such a slug names nothing reliably. */
int lockfs_caller_slug(const struct lockfs_proc_source *src, pid_t tid, char *buf, size_t size)
{
	int n = tid > 0 ? lockfs_proc_source_getenv(src, tid, "LOCKFS_SLUG", buf, size) : -ENOENT;

	if (n == -ENAMETOOLONG) {
		buf[0] = '\0';
		return -EINVAL;
	}
	if (n < 0) {
		buf[0] = '\0';
		return 0;
	}
	for (int i = 0; i < n; i++) {
		if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f) {
			buf[0] = '\0';
			return -EINVAL;
		}
	}
	if (!lockfs_utf8_valid(buf, (size_t)n)) {
		buf[0] = '\0';
		return -EINVAL;
	}
	return 0;
}

/* The full reads of lockfs_caller_identify; with a TICKET (claimed
 * before them) what they learn of process PID is kept for next time. */
static int identify_reading(struct lockfs_table *t, const struct lockfs_caller *caller,
			    unsigned want, struct lockfs_proc *holder, char *slug,
			    char ***cmdline, bool *bad_slug, pid_t pid, uint64_t ticket)
{
	struct lockfs_requester facts;
	int rc;

	if (lockfs_caller_slug(t->procs, caller->tid, slug, LOCKFS_SLUG_MAX) < 0) {
		*bad_slug = true; /* not kept: the claim stays unready */
		return -EINVAL;
	}
	rc = lockfs_holder_resolve(t->procs, caller->tid, caller->uid, &t->helpers, want,
				   holder);
	if (rc < 0 || !ticket)
		return rc;
	/* Only a process that holds for itself is kept: a helper's walk to
	 * its parent depends on more than one process, and a multi-call
	 * binary's applet on its comm, which changes without an exec. */
	if (holder->pid != pid || holder->multicall[0] ||
	    lockfs_helpers_contains(&t->helpers, holder->exe))
		return 0;
	if (lockfs_proc_source_cmdline(t->procs, holder->pid, CMDLINE_MAX, cmdline) < 0)
		return 0; /* lockfs_caller_record tries again */
	memset(&facts, 0, sizeof(facts));
	snprintf(facts.exe, sizeof(facts.exe), "%s", holder->exe);
	snprintf(facts.slug, sizeof(facts.slug), "%s", slug);
	facts.cmdline = *cmdline;
	facts.start = holder->start_time;
	facts.ppid = holder->ppid;
	facts.sid = holder->sid;
	snprintf(facts.comm, sizeof(facts.comm), "%s", holder->comm);
	(void)lockfs_requesters_put(t->requesters, pid, ticket, &facts);
	return 0;
}

/* The holder *HOLDER is P, a process whose kept FACTS answer for the
 * rest (its cmdline moves to *CMDLINE).  Returns 0. */
static int known_requester(struct lockfs_table *t, unsigned want, struct lockfs_proc *p,
			   struct lockfs_requester *facts, struct lockfs_proc *holder,
			   char *slug, char ***cmdline)
{
	snprintf(p->exe, sizeof(p->exe), "%s", facts->exe);
	p->multicall[0] = '\0';
	p->at_uid_boundary = false;
	p->ns_pid = 0;
	p->container[0] = '\0';
	if ((want & LOCKFS_PROC_NS) && t->procs->read_ns &&
	    t->procs->read_ns(t->procs->ctx, p->pid, p) < 0) {
		p->ns_pid = 0;
		p->container[0] = '\0';
	}
	snprintf(slug, LOCKFS_SLUG_MAX, "%s", facts->slug);
	*cmdline = facts->cmdline;
	*holder = *p;
	return 0;
}

int lockfs_caller_identify(struct lockfs_table *t, const struct lockfs_caller *caller,
			   unsigned want, struct lockfs_proc *holder, char *slug,
			   char ***cmdline, bool *bad_slug)
{
	struct lockfs_requester facts;
	struct lockfs_proc p;
	uint64_t ticket;
	int pidfd, rc;

	*cmdline = NULL;
	*bad_slug = false;
	if (!t->requesters || caller->tid <= 0)
		return identify_reading(t, caller, want, holder, slug, cmdline, bad_slug, 0, 0);
	/* A pidfd wanted is opened before anything kept is trusted: had the
	 * pid changed hands before, the old process's exit is among the
	 * events the sync takes in, and its entry is gone (requesters.h). */
	pidfd = (want & LOCKFS_PROC_PIDFD) && lockfs_requesters_known(t->requesters, caller->tid)
		? lockfs_proc_source_pidfd_open(t->procs, caller->tid) : -1;
	/* Without the connector's events an exec would go unseen: read all. */
	if (!lockfs_descendants_sync(t->descendants)) {
		if (pidfd >= 0)
			close(pidfd);
		return identify_reading(t, caller, want, holder, slug, cmdline, bad_slug, 0, 0);
	}
	/* A repeat requester's own thread (its leader: the pidfd opened, or
	 * an entry answers to its id): nothing to read. */
	if ((pidfd >= 0 || !(want & LOCKFS_PROC_PIDFD)) &&
	    lockfs_requesters_current(t->requesters, caller->tid, &facts) == 0) {
		memset(&p, 0, sizeof(p));
		p.pid = caller->tid;
		p.ppid = facts.ppid;
		p.sid = facts.sid;
		p.start_time = facts.start;
		snprintf(p.comm, sizeof(p.comm), "%s", facts.comm);
		p.has_pidfd = pidfd >= 0;
		p.pidfd = pidfd;
		return known_requester(t, want, &p, &facts, holder, slug, cmdline);
	}
	if (pidfd >= 0)
		close(pidfd);
	/* Who it is now (pid, start time; a pidfd opened before, if asked):
	 * read, as are comm and session, for a thread that is not its
	 * process's leader. */
	rc = t->procs->read_tid(t->procs->ctx, caller->tid, want & LOCKFS_PROC_PIDFD, &p);
	if (rc < 0)
		return rc == -ENOENT ? -ESRCH : rc;
	if (lockfs_requesters_get(t->requesters, p.pid, p.start_time, &facts) == 0)
		return known_requester(t, want, &p, &facts, holder, slug, cmdline);
	lockfs_proc_put(&p);
	/* Claimed before the first read: an exec from here on voids it. */
	ticket = lockfs_requesters_claim(t->requesters, p.pid, p.start_time);
	return identify_reading(t, caller, want, holder, slug, cmdline, bad_slug, p.pid, ticket);
}

pid_t lockfs_caller_who(struct lockfs_table *t, pid_t tid, char *buf, size_t size)
{
	struct lockfs_proc p;
	char slug[LOCKFS_SLUG_MAX];
	bool resolved;

	(void)lockfs_caller_slug(t->procs, tid, slug, sizeof(slug)); /* a bad slug reads as none */
	/* Resolved even behind a slug: the line's pid= is the process's,
	 * whatever name its environment gives it. */
	resolved = tid > 0 && lockfs_holder_resolve(t->procs, tid, LOCKFS_UID_UNKNOWN,
						    &t->helpers, 0, &p) == 0;
	if (resolved && !*slug)
		lockfs_audit_who(buf, size, NULL, p.comm, p.pid);
	else
		lockfs_audit_who(buf, size, slug, "?", tid);
	return resolved ? p.pid : tid;
}

void lockfs_caller_container(struct lockfs_table *t, pid_t tid, char *out, size_t size)
{
	struct lockfs_proc p;

	if (tid <= 0) {
		/* Not visible from the daemon's pid namespace (an ancestor's
		 * or a sibling's): nothing tells it from another container. */
		snprintf(out, size, "%s", LOCKFS_CALLER_UNSEEN);
		return;
	}
	if (!t->procs->read_ns) {
		out[0] = '\0'; /* a source that knows no namespaces: all ours */
		return;
	}
	/* The thread itself, with no start time: read_ns then neither trusts
	 * nor fills what it keeps by (pid, start time) -- a pid alone may
	 * have been a host process's before it was reused -- and reads the
	 * namespace link afresh (cheap: one readlink for the daemon's own).
	 * The caller waits in its request meanwhile: TID is still its. */
	memset(&p, 0, sizeof(p));
	p.pid = tid;
	if (t->procs->read_ns(t->procs->ctx, tid, &p) < 0) {
		/* Gone, or /proc refused: fail closed, as a container. */
		snprintf(out, size, "%s", LOCKFS_CALLER_UNSEEN);
		return;
	}
	snprintf(out, size, "%s", p.container);
}

void lockfs_caller_reader(struct lockfs_table *t, const struct lockfs_caller *caller,
			  struct lockfs_reader *r, char scope[LOCKFS_CONTAINER_MAX])
{
	memset(r, 0, sizeof(*r));
	r->uid = caller ? caller->uid : 0;
	r->host = t->host;
	r->boot_id = t->boot_id;
	/* Only root's powers depend on the container: read /proc for it
	 * alone.  NULL (the daemon itself) and -o container_root=host:
	 * every holder. */
	if (!caller || caller->uid != 0 || t->container_root_host)
		return;
	lockfs_caller_container(t, caller->tid, scope, LOCKFS_CONTAINER_MAX);
	if (scope[0])
		r->container = scope;
}

/* Start LEASE anew: TTL_S from now (0 clears it).  The deadline that
 * counts is on the boot clock; the wall-clock copy is for people and is
 * fixed here, so every reading shows the same instant. */
void lockfs_lease_start(struct lockfs_lease *lease, uint32_t ttl_s)
{
	lease->ttl_s = ttl_s;
	lease->deadline_boot_ms = ttl_s ? lockfs_boot_ms() + (int64_t)ttl_s * 1000 : 0;
	lease->expires_at_ms = ttl_s ? lockfs_wall_ms() + (int64_t)ttl_s * 1000 : 0;
}

int lockfs_caller_fill_holder(struct lockfs_table *t, struct lockfs_holder *h,
			      const struct lockfs_proc *p, char ***cmdline)
{
	h->pid = p->pid;
	h->ns_pid = p->ns_pid;
	if (p->container[0])
		h->container = strdup(p->container);
	h->start_time = p->start_time;
	h->uid = p->uid;
	h->gid = p->gid;
	h->user = user_name(t, p->uid);
	h->comm = strdup(p->comm);
	h->host = strdup(t->host);
	h->boot_id = strdup(t->boot_id);
	if (cmdline && *cmdline) {
		h->cmdline = *cmdline; /* read earlier (a parked waiter) */
		*cmdline = NULL;
	} else if (lockfs_proc_source_cmdline(t->procs, p->pid, CMDLINE_MAX, &h->cmdline) < 0) {
		h->cmdline = calloc(1, sizeof(char *));
	}
	if (!h->comm || !h->host || !h->boot_id || !h->cmdline ||
	    (p->container[0] && !h->container)) {
		lockfs_holder_clear(h);
		return -ENOMEM;
	}
	return 0;
}

/* Build the record for a new holder.  Returns 0 or -errno. */
int lockfs_caller_record(struct lockfs_table *t, const char *name, const struct lockfs_proc *p,
			 const char *slug, struct lockfs_record *rec, char ***cmdline)
{
	int rc;

	memset(rec, 0, sizeof(*rec));
	rec->has_holder = true;
	rc = lockfs_caller_fill_holder(t, &rec->holder, p, cmdline);
	if (rc < 0)
		goto fail;
	rec->holder_session = p->sid;
	rec->resource = strdup(name);
	if (slug && *slug) {
		/* Agents whose commands run in throwaway shells bind the lock
		 * to (uid, slug); a lease stands in for a process to watch. */
		rec->slug = strdup(slug);
		rec->bound = LOCKFS_BOUND_SLUG;
		lockfs_lease_start(&rec->lease, t->default_lease_s);
	}
	if (!rec->resource || (slug && *slug && !rec->slug)) {
		rc = -ENOMEM;
		goto fail;
	}
	rec->acquired_at_ms = lockfs_wall_ms();
	/* The fence is the store's to issue, in the write that grants
	 * (lockfs_table_grant_src). */
	rc = make_token(rec->token);
	if (rc < 0)
		goto fail;
	return 0;
fail:
	lockfs_record_clear(rec);
	return rc;
}

void lockfs_caller_denied(struct lockfs_table *t, const char *name,
			  const struct lockfs_caller *caller, const char *reason)
{
	char who[WHO_MAX], container[LOCKFS_CONTAINER_MAX];
	pid_t pid = lockfs_caller_who(t, caller->tid, who, sizeof(who));

	lockfs_caller_container(t, caller->tid, container, sizeof(container));
	lockfs_audit_refusal(t, caller->uid, pid, container, who, name, reason);
}

void lockfs_caller_ref_at(struct lockfs_holder_ref *h, const struct lockfs_record *rec, size_t i)
{
	const struct lockfs_holder *x;

	memset(h, 0, sizeof(*h));
	if (!rec || i >= lockfs_record_holders(rec))
		return;
	x = lockfs_record_holder(rec, i);
	h->known = true;
	h->bound = lockfs_record_bound_at(rec, i);
	h->pid = x->pid;
	h->start = x->start_time;
	h->uid = x->uid;
	snprintf(h->boot_id, sizeof(h->boot_id), "%s", x->boot_id);
	snprintf(h->host, sizeof(h->host), "%s", x->host ? x->host : "");
	snprintf(h->container, sizeof(h->container), "%s", x->container ? x->container : "");
	/* Only the first holder can be bound to a slug. */
	snprintf(h->slug, sizeof(h->slug), "%s", i == 0 && rec->slug ? rec->slug : "");
}

/*
 * Root's slug-bound lock H, and root's slug: uid 0 is every container's
 * root without a user namespace, so under -o container_root=own root in a
 * container acts for such a lock only when it was taken from that same
 * container (slugs are shown to everyone); root on the host for every
 * one.  0 or -EPERM.
 */
static int root_slug_check(struct lockfs_table *t, const struct lockfs_holder_ref *h,
			   const struct lockfs_caller *caller)
{
	char mine[LOCKFS_CONTAINER_MAX];

	if (t->container_root_host)
		return 0;
	lockfs_caller_container(t, caller->tid, mine, sizeof(mine));
	/* Root beside the daemon (no container) keeps every power, as for
	 * break: its slug reaches a slug lock taken in a container too. */
	if (!*mine)
		return 0;
	return strcmp(mine, h->container) == 0 && strcmp(mine, LOCKFS_CALLER_UNSEEN) != 0
		? 0 : -EPERM;
}

/*
 * A process-bound lock: the holder process or a descendant.  A slug-bound
 * lock: a process of the holder's uid whose environment carries the slug.
 */
int lockfs_caller_check(struct lockfs_table *t, const struct lockfs_holder_ref *h,
			const struct lockfs_caller *caller)
{
	int rc;

	if (!h->known)
		return -EPERM; /* nobody can prove they hold a foreign lock */
	/* Another host's holder: nobody here acts for it (break does). */
	if (*h->host && strcmp(h->host, t->host) != 0)
		return -EPERM;
	if (h->bound == LOCKFS_BOUND_SLUG) {
		char slug[LOCKFS_SLUG_MAX];

		if (caller->tid <= 0)
			return -EACCES;
		if (lockfs_caller_slug(t->procs, caller->tid, slug, sizeof(slug)) < 0)
			return -EPERM;
		if (caller->uid != h->uid || !*slug || strcmp(slug, h->slug) != 0)
			return -EPERM;
		return caller->uid == 0 ? root_slug_check(t, h, caller) : 0;
	}
	/* Held by a process of an earlier boot: no pid of it is one of ours. */
	if (strcmp(h->boot_id, t->boot_id) != 0)
		return -EPERM;
	rc = lockfs_holder_may_release(t->procs, caller->tid, h->pid, h->start,
				       lockfs_liveness_alive(t->liveness, h->pid, h->start));
	if (rc == -EPERM && h->bound == LOCKFS_BOUND_PROCESS) {
		/* A process the holder started while it held the lock acts for
		 * it wherever it was re-parented, also once the holder exited. */
		struct lockfs_proc me;

		if (t->procs->read_tid(t->procs->ctx, caller->tid, 0, &me) == 0 &&
		    lockfs_descendants_acts_for(t->descendants, h->pid, h->start, me.pid,
						me.start_time))
			rc = 0;
	}
	/* A descendant that runs as another user (not root) does not act
	 * for the holder: a root holder's child dropping to uid 4242 gets
	 * EPERM, while `sudo rmdir` in a user's holder shell still works. */
	if (rc == 0 && caller->uid != h->uid && caller->uid != 0)
		rc = -EPERM;
	return rc == -ESRCH ? -EPERM : rc;
}

/* lockfs_caller_check() on the cached entry C (NULL: foreign). */
int lockfs_caller_may_act(struct lockfs_table *t, const struct held_lock *c,
			  const struct lockfs_caller *caller)
{
	struct lockfs_holder_ref h;

	lockfs_caller_ref_at(&h, c ? &c->rec : NULL, 0);
	return lockfs_caller_check(t, &h, caller);
}
