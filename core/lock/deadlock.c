/*
 * Deadlock detection for fd-lock waits (deadlock.h).
 *
 * The graph: one struct dl_wait per parked request that passed its check,
 * with the name it waits for and its process tree (the waiter, then its
 * ancestors, read from /proc only once a check needs them: a lone waiter
 * never is).  Holders are not copied here: a check reads them from the
 * cache, under each name's stripe mutex, only for the names it visits --
 * so nothing is added to an uncontended flock, mkdir or release.
 *
 * The check of a new wait W on name B (breadth first, so the shortest
 * cycle is the one named): for each name X reached, starting at B, each
 * holder H of X on this host; if H is W or an ancestor of W, X is W's
 * tree's, and the path B ... X is a cycle (at X = B, a wait for a lock
 * W's own tree holds, it is not counted: see waiting.md); else every
 * wait of the graph whose waiter is H or a descendant of H leads on to
 * the name it waits for.  Bounded: at most DL_NAMES names visited and
 * DL_WAITS waits in the graph looked at, and a tree is at most DL_DEPTH
 * processes deep; beyond, the check says nothing (the wait waits).
 *
 * The graph learns that a wait ended by interposing on its W->done (set
 * under the stripe mutex while W is parked): every grant or failure of a
 * parked request goes through it.  A cycle is answered only if no wait
 * of the graph ended while it was looked for (version), and the holders
 * on its path, read once more, are still the same (a lock handed to a
 * waiter whose own check has not begun ends no wait of the graph); it is
 * logged only once the wait was taken back.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/proc.h"
#include "audit.h"
#include "deadlock.h"
#include "queue.h"
#include "table.h"

/* A tree deeper than this is cut: its upper ancestors are not seen. */
#define DL_DEPTH 32
/* Names one check visits, waits of the graph it looks at. */
#define DL_NAMES 256
#define DL_WAITS 4096
/* Holders of one name looked at (a shared lock's). */
#define DL_HOLDERS 64
/* Hops named in the `deadlock` line (a longer cycle is counted). */
#define DL_LINE_HOPS 16
/* Tries when waits end while a cycle is looked for. */
#define DL_TRIES 3

struct dl_proc {
	pid_t pid;
	unsigned long long start_time;
};

struct dl_wait {
	struct dl_wait *next, *prev;  /* in dl->live while live; protected by mu */
	struct lockfs_deadlock *dl;
	void (*done)(struct lockfs_wait *w, int result); /* the caller's */
	bool live;                    /* in the graph; protected by mu */
	bool over;                    /* answered or taken back; protected by mu */
	bool busy;                    /* its own check still runs; protected by mu */
	/* Written before it is live, read-only after: */
	char name[LOCKFS_NAME_MAX + 1];
	/* [0]: the waiter, set before it is live; its parents are read from
	 * /proc the first time a check needs them (tree_read), under
	 * check_mu, which every reader of the tree holds. */
	bool tree_read;
	size_t ntree;
	struct dl_proc tree[DL_DEPTH];
};

/* One name the search reached: through WAIT (NULL at the start: the new
 * wait), whose waiter descends from HELD_BY, a holder of PARENT's name. */
struct dl_node {
	const struct dl_wait *wait;
	int parent;
	struct dl_proc held_by;
};

struct lockfs_deadlock {
	pthread_mutex_t check_mu;     /* one check at a time; before any stripe mutex */
	pthread_mutex_t mu;           /* a leaf: the fields below */
	struct dl_wait *live;
	size_t nlive;
	uint64_t version;             /* bumped when any interposed wait ends */
	/* While a check runs, ended waits are not freed (it reads them
	 * without mu): they wait here until it is done. */
	bool checking;
	struct dl_wait *graveyard;
	/* The check's own (under check_mu): */
	struct dl_wait **snap;
	struct dl_node nodes[DL_NAMES];
};

int lockfs_deadlock_new(struct lockfs_deadlock **out)
{
	struct lockfs_deadlock *dl = calloc(1, sizeof(*dl));

	if (!dl)
		return -ENOMEM;
	dl->snap = calloc(DL_WAITS, sizeof(*dl->snap));
	if (!dl->snap) {
		free(dl);
		return -ENOMEM;
	}
	pthread_mutex_init(&dl->check_mu, NULL);
	pthread_mutex_init(&dl->mu, NULL);
	*out = dl;
	return 0;
}

static void free_list(struct dl_wait *d)
{
	while (d) {
		struct dl_wait *next = d->next;

		free(d);
		d = next;
	}
}

void lockfs_deadlock_free(struct lockfs_deadlock *dl)
{
	if (!dl)
		return;
	free_list(dl->live);
	free_list(dl->graveyard);
	free(dl->snap);
	pthread_mutex_destroy(&dl->check_mu);
	pthread_mutex_destroy(&dl->mu);
	free(dl);
}

/* D's wait is over: out of the graph, and freed unless a check still
 * reads it.  Called with dl->mu held. */
static void end_locked(struct lockfs_deadlock *dl, struct dl_wait *d)
{
	d->over = true;
	dl->version++;
	if (d->live) {
		if (d->prev)
			d->prev->next = d->next;
		else
			dl->live = d->next;
		if (d->next)
			d->next->prev = d->prev;
		d->live = false;
		dl->nlive--;
	}
	if (d->busy)
		return; /* its check frees it */
	if (dl->checking) {
		d->next = dl->graveyard;
		dl->graveyard = d;
	} else {
		free(d);
	}
}

/* The W->done of a wait in the graph: called (under the stripe mutex)
 * when the wait is granted or failed; hands the answer on. */
static void dl_done(struct lockfs_wait *w, int result)
{
	struct dl_wait *d = w->deadlock;
	struct lockfs_deadlock *dl = d->dl;
	void (*done)(struct lockfs_wait *, int) = d->done;

	w->done = done;
	w->deadlock = NULL;
	pthread_mutex_lock(&dl->mu);
	end_locked(dl, d);
	pthread_mutex_unlock(&dl->mu);
	done(w, result);
}

void lockfs_deadlock_cancelled(struct lockfs_deadlock *dl, struct lockfs_wait *w)
{
	struct dl_wait *d = w->deadlock;

	if (!dl || !d)
		return;
	w->done = d->done;
	w->deadlock = NULL;
	pthread_mutex_lock(&dl->mu);
	end_locked(dl, d);
	pthread_mutex_unlock(&dl->mu);
}

/* D's process tree: the waiter, then each parent that started no later
 * than its child (a pid reused is no parent), up to pid 1 or DL_DEPTH. */
static void read_tree(const struct lockfs_proc_source *src, struct dl_wait *d)
{
	struct lockfs_proc p = { .ppid = 0 };
	pid_t pid = d->tree[0].pid;

	d->tree_read = true;
	d->ntree = 1;
	if (src->read_tid(src->ctx, pid, 0, &p) < 0 || p.pid != pid)
		return;
	lockfs_proc_put(&p);
	while (d->ntree < DL_DEPTH && p.ppid > 1) {
		struct lockfs_proc q = { .ppid = 0 };
		unsigned long long child_start = p.start_time;

		if (src->read_tid(src->ctx, p.ppid, 0, &q) < 0)
			return;
		lockfs_proc_put(&q);
		if (q.pid != p.ppid || q.start_time > child_start)
			return;
		d->tree[d->ntree++] = (struct dl_proc){ q.pid, q.start_time };
		p = q;
	}
}

static bool same_proc(const struct dl_proc *a, const struct dl_proc *b)
{
	return a->pid == b->pid && (!a->start_time || !b->start_time ||
				    a->start_time == b->start_time);
}

/* Is process H in D's tree (D's waiter or one of its ancestors)?  A start
 * time of 0 is not known, and matches any.  Called with check_mu held:
 * reads D's ancestors the first time they are needed. */
static bool in_tree(const struct lockfs_proc_source *src, struct dl_wait *d,
		    const struct dl_proc *h)
{
	if (same_proc(&d->tree[0], h))
		return true;
	if (!d->tree_read)
		read_tree(src, d);
	for (size_t i = 1; i < d->ntree; i++)
		if (same_proc(&d->tree[i], h))
			return true;
	return false;
}

/* NAME's holders on this host, as the cache has them; how many (0: free,
 * unreadable, or another host's: no edge goes on from it). */
static size_t read_holders(struct lockfs_table *t, const char *name, struct dl_proc *out)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	struct lockfs_entry_stat st;
	struct held_lock *c;
	bool foreign;
	size_t n = 0;

	pthread_mutex_lock(&s->mu);
	if (lockfs_table_load(t, s, name, &st, &foreign, &c) == 0 && c) {
		size_t count = lockfs_record_holders(&c->rec);

		for (size_t i = 0; i < count && n < DL_HOLDERS; i++) {
			const struct lockfs_holder *h = lockfs_record_holder(&c->rec, i);

			if (h->pid > 0 && !lockfs_table_elsewhere(t, h))
				out[n++] = (struct dl_proc){ h->pid, h->start_time };
		}
	}
	lockfs_table_unlock(s);
	return n;
}

/* A cycle found: NODES[LAST] is held by CLOSER, of the new wait's tree. */
struct dl_cycle {
	int last;
	struct dl_proc closer;
};

static bool visited(const struct dl_node *nodes, int n, const char *name, const char *start)
{
	if (strcmp(name, start) == 0)
		return true;
	for (int i = 1; i < n; i++)
		if (strcmp(nodes[i].wait->name, name) == 0)
			return true;
	return false;
}

/* Breadth first from D's name over the NSNAP waits of SNAP (none of them
 * D); true and *CY when a cycle comes back to D's tree. */
static bool search(struct lockfs_table *t, struct dl_wait *d, struct dl_wait *const *snap,
		   size_t nsnap, struct dl_node *nodes, struct dl_cycle *cy)
{
	struct dl_proc holders[DL_HOLDERS];
	int n = 1;

	/* Every step after the first is a wait of the graph: with none, no
	 * cycle (and no /proc read: a lone waiter, a hand-off, costs nothing). */
	if (nsnap == 0)
		return false;

	nodes[0] = (struct dl_node){ .wait = NULL, .parent = -1 };
	for (int i = 0; i < n; i++) {
		const char *name = nodes[i].wait ? nodes[i].wait->name : d->name;
		size_t nh = read_holders(t, name, holders);

		for (size_t h = 0; h < nh; h++) {
			if (in_tree(t->procs, d, &holders[h])) {
				if (i == 0)
					continue; /* W's own tree holds B: no cycle of two */
				*cy = (struct dl_cycle){ .last = i, .closer = holders[h] };
				return true;
			}
			for (size_t k = 0; k < nsnap && n < DL_NAMES; k++) {
				struct dl_wait *r = snap[k];

				if (!in_tree(t->procs, r, &holders[h]) ||
				    visited(nodes, n, r->name, d->name))
					continue;
				nodes[n++] = (struct dl_node){ .wait = r, .parent = i,
							       .held_by = holders[h] };
			}
		}
	}
	return false;
}

/* The `deadlock` line of the cycle CY, found for new wait D of WAITER:
 * hop 1 is D (pid1 waits for wait1), each next hop the wait that leads on;
 * heldbyI is the holder of waitI (the next hop's waiter or its ancestor,
 * the last one of D's tree). */
static void log_cycle(struct lockfs_table *t, const struct dl_wait *d,
		      const struct lockfs_deadlock_waiter *waiter, const struct dl_node *nodes,
		      const struct dl_cycle *cy)
{
	int path[DL_NAMES], len = 0;
	char num[DL_LINE_HOPS * 3 + 3][24], keys[DL_LINE_HOPS * 3][16], uid[16], pid[16];
	const char *kv[2 * (3 + DL_LINE_HOPS * 3) + 1];
	size_t k = 0, nn = 0, nk = 0;

	for (int i = cy->last; i >= 0; i = nodes[i].parent)
		path[len++] = i;
	lockfs_audit_ids(uid, pid, waiter->uid, waiter->pid);
	kv[k++] = "uid";
	kv[k++] = uid;
	kv[k++] = "pid";
	kv[k++] = pid;
	snprintf(num[nn], sizeof(num[nn]), "%d", len);
	kv[k++] = "cycle";
	kv[k++] = num[nn++];
	/* path runs from the last node back to the start: hop j is
	 * path[len - 1 - j]. */
	for (int j = 0; j < len && j < DL_LINE_HOPS; j++) {
		const struct dl_node *node = &nodes[path[len - 1 - j]];
		const struct dl_proc *holder = j + 1 < len ? &nodes[path[len - 2 - j]].held_by
							   : &cy->closer;

		snprintf(keys[nk], sizeof(keys[nk]), "pid%d", j + 1);
		snprintf(num[nn], sizeof(num[nn]), "%d",
			 (int)(node->wait ? node->wait->tree[0].pid : waiter->pid));
		kv[k++] = keys[nk++];
		kv[k++] = num[nn++];
		snprintf(keys[nk], sizeof(keys[nk]), "wait%d", j + 1);
		kv[k++] = keys[nk++];
		kv[k++] = node->wait ? node->wait->name : d->name;
		snprintf(keys[nk], sizeof(keys[nk]), "heldby%d", j + 1);
		snprintf(num[nn], sizeof(num[nn]), "%d", (int)holder->pid);
		kv[k++] = keys[nk++];
		kv[k++] = num[nn++];
	}
	kv[k] = NULL;
	lockfs_audit_event(t, waiter->who, d->name, kv, "deadlock");
}

/* Does every name of the cycle CY still have the holder the search found?
 * A holder can change without a wait of the graph ending (the lock handed
 * to a waiter whose own check has not begun): looked at once more. */
static bool holders_still(struct lockfs_table *t, const struct dl_wait *d,
			  const struct dl_node *nodes, const struct dl_cycle *cy)
{
	struct dl_proc holders[DL_HOLDERS];
	const struct dl_proc *want = &cy->closer;

	for (int i = cy->last; i >= 0; i = nodes[i].parent) {
		const char *name = nodes[i].wait ? nodes[i].wait->name : d->name;
		size_t nh = read_holders(t, name, holders), h;

		for (h = 0; h < nh; h++)
			if (holders[h].pid == want->pid && holders[h].start_time == want->start_time)
				break;
		if (h == nh)
			return false;
		want = &nodes[i].held_by;
	}
	return true;
}

/* Look for a cycle D would close, with the graph as it is now: true, with
 * the path in dl->nodes and its end in *CY, when there is one and no wait
 * ended meanwhile.  What the nodes point to stays readable until
 * check_end(). */
static bool find_cycle(struct lockfs_table *t, struct lockfs_deadlock *dl, struct dl_wait *d,
		       struct dl_cycle *cy)
{
	struct dl_node *nodes = dl->nodes;

	for (int tries = 0; tries < DL_TRIES; tries++) {
		size_t nsnap = 0;
		uint64_t version;
		bool found, same;

		pthread_mutex_lock(&dl->mu);
		if (d->over) {
			pthread_mutex_unlock(&dl->mu);
			return false; /* answered already */
		}
		version = dl->version;
		for (struct dl_wait *r = dl->live; r && nsnap < DL_WAITS; r = r->next)
			dl->snap[nsnap++] = r;
		dl->checking = true;
		pthread_mutex_unlock(&dl->mu);

		found = search(t, d, dl->snap, nsnap, nodes, cy);
		if (found && !holders_still(t, d, nodes, cy))
			continue;

		pthread_mutex_lock(&dl->mu);
		same = dl->version == version && !d->over;
		pthread_mutex_unlock(&dl->mu);
		if (!found)
			return false;
		if (same)
			return true;
	}
	return false;
}

/* The check is over: free the waits that ended while it read them. */
static void check_end(struct lockfs_deadlock *dl)
{
	struct dl_wait *dead;

	pthread_mutex_lock(&dl->mu);
	dl->checking = false;
	dead = dl->graveyard;
	dl->graveyard = NULL;
	pthread_mutex_unlock(&dl->mu);
	free_list(dead);
}

int lockfs_deadlock_check(struct lockfs_table *t, struct lockfs_deadlock *dl, const char *name,
			  const char *owner, const struct lockfs_deadlock_waiter *waiter,
			  struct lockfs_wait *w)
{
	struct stripe *s = lockfs_table_stripe(t, name);
	struct dl_wait *d = calloc(1, sizeof(*d));
	struct dl_cycle cy;
	bool cycle, answer = false;

	if (!d)
		return -EINPROGRESS; /* no memory to look: the wait waits */
	d->dl = dl;
	snprintf(d->name, sizeof(d->name), "%s", name);
	d->tree[0] = (struct dl_proc){ waiter->pid, waiter->start_time };
	d->ntree = 1;
	d->busy = true;
	/* Interpose on DONE while W is parked; once answered (another thread
	 * may have granted it already) there is nothing to look at. */
	pthread_mutex_lock(&s->mu);
	if (!w->parked) {
		lockfs_table_unlock(s);
		free(d);
		return -EINPROGRESS;
	}
	d->done = w->done;
	w->deadlock = d;
	w->done = dl_done;
	lockfs_table_unlock(s);

	pthread_mutex_lock(&dl->check_mu);
	cycle = find_cycle(t, dl, d, &cy);
	/* Logged only once taken back: a wait granted in between (-EALREADY)
	 * was no deadlock after all. */
	if (cycle && lockfs_queue_cancel(t, name, w) == 0) {
		/* Taken back: ours to answer, and its place is not kept (the
		 * victim's retry should not stand ahead of the others). */
		pthread_mutex_lock(&s->mu);
		lockfs_queue_forget_kept(s, name, owner);
		lockfs_table_unlock(s);
		w->done = d->done;
		w->deadlock = NULL;
		log_cycle(t, d, waiter, dl->nodes, &cy);
		answer = true;
	}
	pthread_mutex_lock(&dl->mu);
	d->busy = false;
	if (answer || d->over) {
		/* Taken back, or granted or failed while checked (dl_done
		 * left it to us). */
		if (!d->over)
			dl->version++;
		free(d);
	} else {
		d->live = true;
		d->prev = NULL;
		d->next = dl->live;
		if (dl->live)
			dl->live->prev = d;
		dl->live = d;
		dl->nlive++;
	}
	pthread_mutex_unlock(&dl->mu);
	check_end(dl);
	pthread_mutex_unlock(&dl->check_mu);
	return answer ? -EDEADLK : -EINPROGRESS;
}
