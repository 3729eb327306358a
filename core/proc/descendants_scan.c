/*
 * The descendants of holders as /proc shows them: the fallback for what
 * the process events did not tell (none to be had, some lost, a daemon
 * that starts while holders' processes run), and the real /proc source
 * (lockfs_desc_procs_real) that descendants.c asks of one process.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lockfs/proc.h"
#include "lockfs/descendants.h"
#include "descendants_state.h"

/* ---- scanning /proc ------------------------------------------------------- */

struct proc_list {
	struct lockfs_desc_proc *v;
	size_t n, cap;
	int err;
};

static int proc_list_add(void *arg, const struct lockfs_desc_proc *p)
{
	struct proc_list *l = arg;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 256;
		struct lockfs_desc_proc *v = realloc(l->v, cap * sizeof(*v));

		if (!v) {
			l->err = -ENOMEM;
			return 1;
		}
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = *p;
	return 0;
}

static int cmp_proc(const void *a, const void *b)
{
	pid_t x = ((const struct lockfs_desc_proc *)a)->pid;
	pid_t y = ((const struct lockfs_desc_proc *)b)->pid;

	return x < y ? -1 : x > y;
}

static long proc_index(const struct proc_list *l, pid_t pid)
{
	size_t lo = 0, hi = l->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (l->v[mid].pid == pid)
			return (long)mid;
		if (l->v[mid].pid < pid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

enum { Q_UNKNOWN = 0, Q_NO, Q_CANDIDATE, Q_PROVEN, Q_ROOT };

/* The index in L of P's parent, when it is one (not a later process on
 * the parent's pid), else -1. */
static long parent_of(const struct proc_list *l, const struct lockfs_desc_proc *p)
{
	long q = p->ppid > 0 ? proc_index(l, p->ppid) : -1;

	return q >= 0 && l->v[q].start <= p->start ? q : -1;
}

/* What P is to R whatever its parent: Q_NO, Q_PROVEN, Q_CANDIDATE, or
 * Q_UNKNOWN (its parent decides). */
static int own_answer(struct lockfs_descendants *d, const struct root *r,
		      const struct lockfs_desc_proc *p)
{
	const struct member *m;
	struct entry *e;

	if ((p->pid == r->pid && p->start == r->start) || p->pid == d->self ||
	    p->start < r->start || !lockfs_desc_proc_alive(p) || lockfs_desc_left_session(r, p->sid))
		return Q_NO;
	e = lockfs_desc_entry_find(d, p->pid);
	m = e && e->start == p->start ? lockfs_desc_set_find(e->set, r) : NULL;
	if (m && !m->candidate)
		return Q_PROVEN;
	return m ? Q_CANDIDATE : Q_UNKNOWN;
}

/*
 * Does process I of L count for R, and how?  Q_PROVEN when its parent is
 * the holder or a proven descendant (the process tree shows it descends
 * from the holder: an orphan is adopted by a reaper above it, which is
 * itself below the holder or outside).  Q_CANDIDATE when its parent is a
 * candidate, or when it is in the holder's session, started no earlier
 * than the holder, and was adopted -- its parent is init or a process of
 * another session, as reapers are -- since a descendant of the holder
 * whose parent died looks just like that.  A process its session-mates
 * started themselves (its parent is an older process of the session, such
 * as the login shell) is not counted, nor is one that left the holder's
 * session (setsid), nor what it started since.  MEMO holds the answers found so
 * far; CHAIN is scratch of L->n.
 */
static int qualifies(struct lockfs_descendants *d, const struct root *r,
		     const struct proc_list *l, unsigned char *memo, size_t *chain, size_t i)
{
	size_t depth = 0;
	int answer;

	/* Up to the first process whose answer does not need its parent. */
	for (;;) {
		long q;

		if (memo[i] != Q_UNKNOWN) {
			answer = memo[i];
			break;
		}
		answer = own_answer(d, r, &l->v[i]);
		if (answer != Q_UNKNOWN) {
			memo[i] = (unsigned char)answer;
			break;
		}
		chain[depth++] = i;
		q = parent_of(l, &l->v[i]);
		if (q >= 0 && l->v[q].pid == r->pid && l->v[q].start == r->start) {
			answer = Q_ROOT;
			break;
		}
		if (q < 0 || depth >= l->n) {
			answer = Q_NO;
			break;
		}
		i = (size_t)q;
	}
	/* Back down: each child takes its parent's answer, or its own
	 * chance as an adopted member of the session. */
	while (depth > 0) {
		const struct lockfs_desc_proc *p = &l->v[chain[--depth]];

		if (answer == Q_ROOT)
			answer = Q_PROVEN;
		if (answer == Q_NO && r->sid > 0 && p->sid == r->sid) {
			long q = parent_of(l, p);

			if (q < 0 || l->v[q].pid == 1 || l->v[q].sid != p->sid)
				answer = Q_CANDIDATE;
		}
		memo[chain[depth]] = (unsigned char)answer;
	}
	return answer == Q_ROOT ? Q_PROVEN : answer;
}

/*
 * Look at /proc: forget tracked processes that are gone (an exit we never
 * heard of) or left their holder's session (a SID event we never heard of), learn missing start times, and count for each listed root
 * that ONLY names (NULL: those with scan_pending, or every dead one when
 * DEAD) what qualifies().  Returns 0, or -errno when /proc cannot be
 * listed (nothing is forgotten then).
 */
int lockfs_desc_scan(struct lockfs_descendants *d, struct root *only, bool dead)
{
	struct proc_list l = { 0 };
	unsigned char *memo = NULL;
	size_t *chain = NULL;
	pid_t *gone = NULL;
	struct lockfs_desc_proc *moved = NULL; /* pid and its session now */
	size_t ngone = 0, nmoved = 0;
	int rc = d->procs.each(d->procs.ctx, proc_list_add, &l);

	d->self = getpid(); /* the daemon detaches after it made us */
	if (rc == 0)
		rc = l.err;
	if (rc < 0)
		goto out;
	qsort(l.v, l.n, sizeof(*l.v), cmp_proc);
	/* Forget first (by pid, afterwards: dropping may free others). */
	gone = malloc((d->nentries + 1) * sizeof(*gone));
	moved = malloc((d->nentries + 1) * sizeof(*moved));
	memo = malloc(l.n + 1);
	chain = malloc((l.n + 1) * sizeof(*chain));
	if (!gone || !moved || !memo || !chain) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t b = 0; b < d->nbuckets; b++) {
		for (struct entry *e = d->entries[b]; e; e = e->next) {
			long i = proc_index(&l, e->pid);

			if (i < 0 || (e->start && l.v[i].start != e->start) || !lockfs_desc_proc_alive(&l.v[i])) {
				gone[ngone++] = e->pid;
				continue;
			}
			if (!e->start)
				e->start = l.v[i].start;
			for (unsigned k = 0; e->set && k < e->set->n; k++) {
				if (lockfs_desc_left_session(e->set->v[k].root, l.v[i].sid)) {
					moved[nmoved++] = (struct lockfs_desc_proc){
						.pid = e->pid, .sid = l.v[i].sid };
					break;
				}
			}
		}
	}
	for (size_t k = 0; k < ngone; k++) {
		struct entry *e = lockfs_desc_entry_find(d, gone[k]);

		if (e)
			lockfs_desc_entry_drop(d, e);
	}
	/* A SID event lost, or no events: it left the holder's session. */
	for (size_t k = 0; k < nmoved; k++) {
		struct entry *e = lockfs_desc_entry_find(d, moved[k].pid);

		if (e)
			lockfs_desc_entry_leave_session(d, e, moved[k].sid);
	}
	for (size_t b = 0; b < ROOT_BUCKETS; b++) {
		for (struct root *r = d->roots[b], *next; r; r = next) {
			next = r->next;
			if (only ? r != only : !(r->scan_pending || (dead && r->dead)))
				continue;
			r->scan_pending = false;
			memset(memo, Q_UNKNOWN, l.n);
			for (size_t i = 0; i < l.n; i++) {
				int how = qualifies(d, r, &l, memo, chain, i);
				struct entry *e;

				if (how != Q_PROVEN && how != Q_CANDIDATE)
					continue;
				e = lockfs_desc_entry_find(d, l.v[i].pid);
				if (e && e->start != l.v[i].start) {
					lockfs_desc_entry_drop(d, e);
					e = NULL;
				}
				if (!e)
					e = lockfs_desc_entry_add(d, l.v[i].pid, l.v[i].start);
				if (!e || lockfs_desc_entry_join(e, r, how == Q_CANDIDATE) < 0) {
					rc = -ENOMEM;
					break;
				}
			}
		}
	}
out:
	free(l.v);
	free(memo);
	free(chain);
	free(gone);
	free(moved);
	return rc;
}

/* ---- /proc ---------------------------------------------------------------- */

/* lockfs_desc_procs.stat on the real /proc: comm, state (3), ppid (4),
 * session (6), threads (20), start time (22). */
static int real_stat(void *ctx, pid_t pid, struct lockfs_desc_proc *out)
{
	struct lockfs_proc_stat st;
	int rc;

	(void)ctx;
	rc = lockfs_procfs_stat(pid, 0, &st);
	if (rc < 0)
		return rc;
	memset(out, 0, sizeof(*out));
	/* The kernel's comm is at most 15 bytes; a longer one is cut short. */
	memcpy(out->comm, st.comm, strnlen(st.comm, sizeof(out->comm) - 1));
	out->zombie = st.state == 'Z' || st.state == 'X';
	out->pid = pid;
	out->ppid = st.ppid;
	out->sid = st.sid;
	out->threads = (int)st.threads;
	out->start = st.start_time;
	return 0;
}

static int real_each(void *ctx, int (*fn)(void *arg, const struct lockfs_desc_proc *p), void *arg)
{
	DIR *proc = opendir("/proc");
	struct dirent *de;

	if (!proc)
		return -errno;
	while ((de = readdir(proc))) {
		struct lockfs_desc_proc p;
		char *end;
		long pid = strtol(de->d_name, &end, 10);

		if (*end || pid <= 0 || pid > INT32_MAX)
			continue;
		if (real_stat(ctx, (pid_t)pid, &p) < 0)
			continue; /* gone in between */
		if (fn(arg, &p))
			break;
	}
	closedir(proc);
	return 0;
}

const struct lockfs_desc_procs lockfs_desc_procs_real = {
	.stat = real_stat,
	.each = real_each,
	.ctx = NULL,
};
