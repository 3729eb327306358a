/*
 * Descendants of lock holders, tracked from the process events; see
 * descendants.h.  What /proc shows when the events do not tell is
 * descendants_scan.c's; the state both share (entries, roots, rootsets) is
 * descendants_state.c's (descendants_state.h).
 *
 * The state, all protected by d->mu:
 *  - roots: one per watched holder process (pid, start), with the number
 *    of its live descendants.  Listed (findable) while a lock depends on
 *    it, and after its holder exited while a descendant lives.
 *  - entries: one per process the module knows -- a root's holder, a
 *    descendant, or both -- by pid.  A descendant names the roots it
 *    counts for in a rootset, an immutable array shared by siblings.
 *
 * The hot path (a holder's mkdir and rmdir) costs one root and one entry
 * made and freed; a fork or exit anywhere on the machine costs one lookup
 * by pid, and work only when the process is tracked.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "lockfs/descendants.h"
#include "descendants_state.h"

#define ENTRY_BUCKETS_MIN 256
/* Ancestors looked at when a caller asks to act for a holder. */
#define WALK_MAX 64
/* How often the descendants of holders that exited are checked against
 * /proc (and, without events, searched for again). */
#define CHECK_MS 1000
#define EVENT_BATCH 64

/* The kernel's CLOCK_MONOTONIC, not the engine's clock: a root's since_ns
 * is compared with the timestamps of the proc connector's fork events
 * (procevents.c), which the kernel takes on CLOCK_MONOTONIC. */
static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- roots ------------------------------------------------------------------ */

static struct root *root_find(struct lockfs_descendants *d, pid_t pid, unsigned long long start)
{
	for (struct root *r = d->roots[(unsigned)pid % ROOT_BUCKETS]; r; r = r->next)
		if (r->pid == pid && r->start == start)
			return r;
	return NULL;
}

/* Is R in S as a proven descendant's root (not a mere candidate)? */
static bool set_proves(const struct rootset *s, const struct root *r)
{
	const struct member *m = lockfs_desc_set_find(s, r);

	return m && !m->candidate;
}

/* ---- events --------------------------------------------------------------- */

/* What a child of E counts for: E's listed roots (a candidate's child is a
 * candidate), and E's own root when the fork happened (at NS) after E
 * began to hold.  A new reference, or NULL for nothing (or out of memory:
 * the child then goes untracked, as it would without events; a scan
 * finds it). */
static struct rootset *child_set(struct entry *e, uint64_t ns)
{
	struct member v[SET_MAX];
	unsigned n = 0;
	bool all = true, own = e->root && ns >= e->root->since_ns;

	for (unsigned i = 0; e->set && i < e->set->n && n < SET_MAX - 1; i++) {
		if (e->set->v[i].root->listed)
			v[n++] = e->set->v[i];
		else
			all = false;
	}
	if (!own && all && e->set) {
		e->set->refs++;
		return e->set;
	}
	if (own) {
		bool kids_ok = e->kids != NULL;

		for (unsigned i = 0; kids_ok && i < e->kids->n; i++)
			kids_ok = e->kids->v[i].root->listed;
		if (kids_ok && all) {
			e->kids->refs++;
			return e->kids;
		}
		v[n++] = (struct member){ e->root, false };
	}
	if (n == 0)
		return NULL;
	{
		struct rootset *s = lockfs_desc_set_new(v, n);

		if (s && own && all) {
			lockfs_desc_set_put(e->kids);
			e->kids = s;
			s->refs++;
		}
		return s;
	}
}

static void on_fork_event(struct lockfs_descendants *d, const struct lockfs_proc_event *ev)
{
	struct entry *parent, *child;
	struct rootset *s;
	struct lockfs_desc_proc p;

	if (ev->pid != ev->tgid)
		return; /* a thread: part of its process, not a descendant */
	parent = lockfs_desc_entry_find(d, ev->parent_tgid);
	if (!parent)
		return;
	s = child_set(parent, ev->mono_ns);
	if (!s) {
		if (!parent->root && parent->set) {
			bool any = false;

			for (unsigned i = 0; i < parent->set->n; i++)
				any |= parent->set->v[i].root->listed;
			if (!any)
				lockfs_desc_entry_drop(d, parent); /* no root needs it any more */
		}
		return;
	}
	child = lockfs_desc_entry_find(d, ev->pid);
	if (child)
		lockfs_desc_entry_drop(d, child); /* a pid whose exit we never heard of */
	/* The start time now, while the pid is surely its (its exit, if it
	 * came, is still ahead of us in the stream).  It may be gone: the
	 * time is then learnt, or the entry dropped, later. */
	child = lockfs_desc_entry_add(d, ev->pid, d->procs.stat(d->procs.ctx, ev->pid, &p) == 0 ? p.start : 0);
	if (!child) {
		lockfs_desc_set_put(s);
		return;
	}
	child->set = s;
	for (unsigned i = 0; i < s->n; i++) {
		s->v[i].root->live++;
		s->v[i].root->version++;
	}
}

static void on_exit_event(struct lockfs_descendants *d, const struct lockfs_proc_event *ev)
{
	struct lockfs_desc_proc p;
	struct entry *e;

	if (ev->pid != ev->tgid)
		return; /* a thread */
	e = lockfs_desc_entry_find(d, ev->tgid);
	if (!e || e->suspect)
		return;
	/* The leader's exit ends the process only when no other thread is
	 * left (exit_group, or a single thread).  A leader may also exit
	 * alone, or be replaced by a thread that calls exec: keep counting
	 * it until /proc says the whole group is gone. */
	if (d->procs.stat(d->procs.ctx, ev->tgid, &p) == 0 && p.threads > 1 &&
	    (!e->start || p.start == e->start)) {
		e->suspect = true;
		d->nsuspects++;
		return;
	}
	lockfs_desc_entry_drop(d, e);
}


static void on_sid_event(struct lockfs_descendants *d, const struct lockfs_proc_event *ev)
{
	struct entry *e;

	if (ev->pid != ev->tgid)
		return; /* setsid(2) from a thread is refused unless it leads */
	e = lockfs_desc_entry_find(d, ev->tgid);
	if (e)
		lockfs_desc_entry_leave_session(d, e, 0);
}

void lockfs_descendants_event(struct lockfs_descendants *d, const struct lockfs_proc_event *ev)
{
	pthread_mutex_lock(&d->mu);
	if (d->observer)
		d->observer(d->observer_ctx, ev);
	if (ev->kind == LOCKFS_PROC_FORK)
		on_fork_event(d, ev);
	else if (ev->kind == LOCKFS_PROC_EXIT)
		on_exit_event(d, ev);
	else if (ev->kind == LOCKFS_PROC_SID)
		on_sid_event(d, ev);
	pthread_mutex_unlock(&d->mu);
}

/* Settle the processes whose exit was in doubt. */
static void settle_suspects(struct lockfs_descendants *d)
{
	for (size_t b = 0; b < d->nbuckets && d->nsuspects > 0; b++) {
		for (struct entry *e = d->entries[b], *next; e; e = next) {
			struct lockfs_desc_proc p;

			next = e->next;
			if (!e->suspect)
				continue;
			if (d->procs.stat(d->procs.ctx, e->pid, &p) == 0 && lockfs_desc_proc_alive(&p) &&
			    (!e->start || p.start == e->start))
				continue;
			/* Dropping E frees nothing but E (a root it names stays
			 * listed or has no entry), so NEXT stays valid. */
			lockfs_desc_entry_drop(d, e);
		}
	}
}

/*
 * Take in every pending event; after a loss, scan before anything is
 * answered: the scan finds what the lost events would have told, and
 * forgets processes whose exit was among them.
 */
static void drain(struct lockfs_descendants *d)
{
	struct lockfs_proc_event evs[EVENT_BATCH];

	while (d->has_events) {
		int n = d->events.read(d->events.ctx, evs, EVENT_BATCH);

		if (n == -ENOBUFS) {
			d->lost = true;
			if (d->observer)
				d->observer(d->observer_ctx, NULL);
			continue;
		}
		if (n < 0 && n != -EINTR && n != -EAGAIN) {
			/* The source is broken: from now on scans answer. */
			d->has_events = false;
			d->lost = true;
			if (d->observer)
				d->observer(d->observer_ctx, NULL);
			break;
		}
		if (n <= 0)
			break;
		for (int i = 0; i < n; i++) {
			if (d->observer)
				d->observer(d->observer_ctx, &evs[i]);
			if (evs[i].kind == LOCKFS_PROC_FORK)
				on_fork_event(d, &evs[i]);
			else if (evs[i].kind == LOCKFS_PROC_EXIT)
				on_exit_event(d, &evs[i]);
			else if (evs[i].kind == LOCKFS_PROC_SID)
				on_sid_event(d, &evs[i]);
		}
	}
	if (d->lost) {
		/* Every root may have lost a fork: count what a scan finds. */
		for (size_t b = 0; b < ROOT_BUCKETS; b++)
			for (struct root *r = d->roots[b]; r; r = r->next)
				r->scan_pending = true;
		d->scan_pending = true;
		d->lost = false;
	}
	if (d->scan_pending && lockfs_desc_scan(d, NULL, false) == 0)
		d->scan_pending = false;
}

/* ---- the interface -------------------------------------------------------- */

int lockfs_descendants_new(struct lockfs_descendants **out,
			   const struct lockfs_event_source *events,
			   const struct lockfs_desc_procs *procs)
{
	struct lockfs_descendants *d = calloc(1, sizeof(*d));

	if (!d)
		return -ENOMEM;
	d->nbuckets = ENTRY_BUCKETS_MIN;
	d->entries = calloc(d->nbuckets, sizeof(*d->entries));
	if (!d->entries) {
		free(d);
		return -ENOMEM;
	}
	pthread_mutex_init(&d->mu, NULL);
	if (events) {
		d->events = *events;
		d->has_events = true;
	}
	d->procs = procs ? *procs : lockfs_desc_procs_real;
	*out = d;
	return 0;
}

void lockfs_descendants_free(struct lockfs_descendants *d)
{
	if (!d)
		return;
	/* Entries first (they hold rootsets), then whatever roots are left. */
	for (size_t b = 0; b < d->nbuckets; b++) {
		while (d->entries[b]) {
			struct entry *e = d->entries[b];

			d->entries[b] = e->next;
			if (e->root)
				e->root->has_entry = false;
			lockfs_desc_set_put(e->set);
			lockfs_desc_set_put(e->kids);
			free(e);
		}
	}
	for (size_t b = 0; b < ROOT_BUCKETS; b++) {
		while (d->roots[b]) {
			struct root *r = d->roots[b];

			d->roots[b] = r->next;
			r->listed = false;
			lockfs_desc_root_put(r);
		}
	}
	free(d->entries);
	pthread_mutex_destroy(&d->mu);
	free(d);
}

void lockfs_descendants_observe(struct lockfs_descendants *d,
				void (*fn)(void *ctx, const struct lockfs_proc_event *ev),
				void *ctx)
{
	pthread_mutex_lock(&d->mu);
	d->observer = fn;
	d->observer_ctx = ctx;
	pthread_mutex_unlock(&d->mu);
}

bool lockfs_descendants_sync(struct lockfs_descendants *d)
{
	bool exact;

	pthread_mutex_lock(&d->mu);
	drain(d);
	exact = d->has_events;
	pthread_mutex_unlock(&d->mu);
	return exact;
}

const char *lockfs_descendants_mechanism(const struct lockfs_descendants *d)
{
	return d->has_events ? "connector" : "scan";
}

static struct root *root_new(struct lockfs_descendants *d, pid_t pid, unsigned long long start,
			     pid_t sid)
{
	struct root *r = calloc(1, sizeof(*r));
	struct root **b = &d->roots[(unsigned)pid % ROOT_BUCKETS];

	if (!r)
		return NULL;
	r->pid = pid;
	r->start = start;
	r->sid = sid;
	r->since_ns = mono_ns();
	r->listed = true;
	r->next = *b;
	*b = r;
	return r;
}

int lockfs_descendants_watch(struct lockfs_descendants *d, pid_t pid,
			     unsigned long long start, pid_t sid, bool scan_now)
{
	struct lockfs_desc_proc p;
	struct root *r;
	struct entry *e;
	int rc = 0;

	if (sid <= 0 && d->procs.stat(d->procs.ctx, pid, &p) == 0 && p.start == start)
		sid = p.sid;
	pthread_mutex_lock(&d->mu);
	r = root_find(d, pid, start);
	if (r) {
		r->refs++;
		goto out;
	}
	e = lockfs_desc_entry_find(d, pid);
	if (e && e->start && e->start != start) {
		lockfs_desc_entry_drop(d, e); /* an earlier process on this pid */
		e = NULL;
	}
	r = root_new(d, pid, start, sid);
	if (!r) {
		rc = -ENOMEM;
		goto out;
	}
	if (!e)
		e = lockfs_desc_entry_add(d, pid, start);
	if (!e) {
		r->listed = false;
		d->roots[(unsigned)pid % ROOT_BUCKETS] = r->next;
		free(r);
		rc = -ENOMEM;
		goto out;
	}
	e->start = start;
	e->root = r;
	lockfs_desc_entry_set_changed(e);
	r->has_entry = true;
	r->refs = 1;
	if (scan_now) {
		r->scan_pending = true;
		d->scan_pending = true;
	}
out:
	pthread_mutex_unlock(&d->mu);
	return rc;
}

void lockfs_descendants_unwatch(struct lockfs_descendants *d, pid_t pid,
				unsigned long long start)
{
	struct root *r;

	pthread_mutex_lock(&d->mu);
	r = root_find(d, pid, start);
	if (r && r->refs > 0) {
		r->refs--;
		lockfs_desc_root_maybe_unlist(d, r);
	}
	pthread_mutex_unlock(&d->mu);
}

int lockfs_descendants_holder_exited(struct lockfs_descendants *d,
				     const struct lockfs_exited_holder *h)
{
	pid_t pid = h->pid, sid = h->sid;
	unsigned long long start = h->start;
	const struct lockfs_descendant *known = h->known;
	size_t nknown = h->nknown;
	bool scan_now = h->scan, take_ref = h->take_ref;
	struct root *r;
	struct entry *e;
	int rc = 0, n;

	pthread_mutex_lock(&d->mu);
	drain(d);
	r = root_find(d, pid, start);
	if (!r) {
		/* Not watched (no memory then, or a record read afresh):
		 * nothing was counted, so look. */
		r = root_new(d, pid, start, sid);
		if (!r) {
			pthread_mutex_unlock(&d->mu);
			return -ENOMEM;
		}
		scan_now = true;
	}
	r->refs++; /* ours while we look: nothing below may free it */
	if (r->sid <= 0)
		r->sid = sid;
	e = lockfs_desc_entry_find(d, pid);
	if (e && e->root == r)
		lockfs_desc_entry_drop(d, e); /* its exit event may still be on the way */
	lockfs_desc_root_mark_dead(d, r);
	if (scan_now || !d->has_events) {
		for (size_t i = 0; i < nknown; i++) {
			struct lockfs_desc_proc p;

			if (d->procs.stat(d->procs.ctx, known[i].pid, &p) < 0 ||
			    p.start != known[i].start_time || !lockfs_desc_proc_alive(&p) ||
			    lockfs_desc_left_session(r, p.sid))
				continue;
			e = lockfs_desc_entry_find(d, p.pid);
			if (e && e->start != p.start) {
				lockfs_desc_entry_drop(d, e);
				e = NULL;
			}
			if (!e)
				e = lockfs_desc_entry_add(d, p.pid, p.start);
			/* A list this module wrote: proven then, proven now
			 * (a candidate came with the same start time as
			 * itself, and is listed as one). */
			if (!e || lockfs_desc_entry_join(e, r, known[i].candidate) < 0)
				rc = -ENOMEM;
		}
		if (lockfs_desc_scan(d, r, false) < 0)
			rc = rc ? rc : -EIO;
	}
	/* What was found keeps the lock even when the look was incomplete;
	 * finding nothing then proves nothing. */
	n = r->live > 0 ? (int)(r->live > 1000000 ? 1000000 : r->live) : rc;
	if (!(n > 0 && take_ref))
		r->refs--; /* else it stays, the caller's */
	lockfs_desc_root_maybe_unlist(d, r);
	pthread_mutex_unlock(&d->mu);
	return n;
}

int lockfs_descendants_count(struct lockfs_descendants *d, pid_t pid,
			     unsigned long long start, uint64_t *version)
{
	struct root *r;
	int n = -ENOENT;

	pthread_mutex_lock(&d->mu);
	r = root_find(d, pid, start);
	if (r) {
		n = r->live > 1000000 ? 1000000 : (int)r->live;
		if (version)
			*version = r->version;
	}
	pthread_mutex_unlock(&d->mu);
	return n;
}

static int cmp_descendant(const void *a, const void *b)
{
	pid_t x = ((const struct lockfs_descendant *)a)->pid;
	pid_t y = ((const struct lockfs_descendant *)b)->pid;

	return x < y ? -1 : x > y;
}

int lockfs_descendants_list(struct lockfs_descendants *d, pid_t pid, unsigned long long start,
			    struct lockfs_descendant **out, size_t *n, uint64_t *version)
{
	struct lockfs_descendant *v = NULL;
	struct root *r;
	size_t k = 0;
	int rc = 0;

	*out = NULL;
	*n = 0;
	pthread_mutex_lock(&d->mu);
	drain(d);
	r = root_find(d, pid, start);
	if (!r) {
		rc = -ENOENT;
		goto out;
	}
	if (version)
		*version = r->version;
	if (r->live == 0)
		goto out;
	v = calloc(r->live < LOCKFS_DESCENDANTS_MAX ? r->live : LOCKFS_DESCENDANTS_MAX,
		   sizeof(*v));
	if (!v) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t b = 0; b < d->nbuckets && k < r->live && k < LOCKFS_DESCENDANTS_MAX; b++) {
		for (struct entry *e = d->entries[b]; e && k < r->live &&
		     k < LOCKFS_DESCENDANTS_MAX; e = e->next) {
			const struct member *m = lockfs_desc_set_find(e->set, r);
			struct lockfs_desc_proc p;

			if (!m)
				continue;
			v[k].pid = e->pid;
			v[k].candidate = m->candidate;
			if (d->procs.stat(d->procs.ctx, e->pid, &p) == 0 &&
			    (!e->start || p.start == e->start)) {
				e->start = p.start;
				memcpy(v[k].comm, p.comm, sizeof(v[k].comm));
				v[k].comm[sizeof(v[k].comm) - 1] = '\0';
			}
			v[k].start_time = e->start;
			k++;
		}
	}
	qsort(v, k, sizeof(*v), cmp_descendant);
out:
	pthread_mutex_unlock(&d->mu);
	if (rc == 0 && k > 0) {
		*out = v;
		*n = k;
	} else {
		free(v);
	}
	return rc;
}

bool lockfs_descendants_acts_for(struct lockfs_descendants *d, pid_t pid,
				 unsigned long long start, pid_t caller,
				 unsigned long long caller_start)
{
	struct root *r;
	bool yes = false;

	pthread_mutex_lock(&d->mu);
	drain(d);
	r = root_find(d, pid, start);
	for (int i = 0; r && i < WALK_MAX && caller > 1; i++) {
		struct entry *e = lockfs_desc_entry_find(d, caller);
		struct lockfs_desc_proc p, q;

		if (e && (!e->start || e->start == caller_start) && set_proves(e->set, r)) {
			yes = true;
			break;
		}
		/* An untracked process under a tracked one (a scan saw the
		 * parent, not yet the child): follow parents while each is
		 * no younger than its child. */
		if (d->procs.stat(d->procs.ctx, caller, &p) < 0 || p.start != caller_start ||
		    p.ppid <= 1 || d->procs.stat(d->procs.ctx, p.ppid, &q) < 0 ||
		    q.start > p.start)
			break;
		if (q.pid == pid && q.start == start) {
			yes = true;
			break;
		}
		caller = q.pid;
		caller_start = q.start;
	}
	pthread_mutex_unlock(&d->mu);
	return yes;
}

bool lockfs_descendants_idle(struct lockfs_descendants *d)
{
	bool idle;

	if (!d)
		return true;
	pthread_mutex_lock(&d->mu);
	/* Tracked processes need their fork events taken in before the
	 * connector's buffer overflows (a scan finds less than events do). */
	idle = !d->nentries && !d->nsuspects && !d->ndead && !d->scan_pending;
	for (size_t b = 0; b < ROOT_BUCKETS && idle; b++)
		idle = d->roots[b] == NULL;
	pthread_mutex_unlock(&d->mu);
	return idle;
}

void lockfs_descendants_tick(struct lockfs_descendants *d)
{
	int64_t now;

	pthread_mutex_lock(&d->mu);
	drain(d);
	if (d->nsuspects)
		settle_suspects(d);
	now = lockfs_boot_ms(); /* the engine's time (core/base/clock.c) */
	if (d->ndead > 0 && now >= d->next_check_ms) {
		/* With events: only forget what is gone (an exit that never
		 * came must not keep a lock for ever).  Without: look again,
		 * as nothing tells of new processes. */
		if (lockfs_desc_scan(d, NULL, !d->has_events) < 0)
			d->next_check_ms = now; /* unknown: try at the next tick */
		else
			d->next_check_ms = now + CHECK_MS;
	}
	pthread_mutex_unlock(&d->mu);
}
