/*
 * Changes the store reports (a script's `rmdir DIR/NAME.lock`, seen by the
 * dir backend's inotify watch).  The backend's thread only notes the name
 * and wakes the liveness thread, which does the work: a waiter queued
 * behind a lock that vanished is granted at once, not at some poll, and
 * the cache drops or rereads a record that changed.  The kernel is told
 * nothing (zero timeouts: its next lookup asks the engine anyway).
 *
 * The engine's own changes come back too (CHANGE_OWN: every mkdir and
 * rmdir through the mount is a rename in DIR).  The engine cached what it
 * wrote, so they wake nobody: they are noted apart and only tried at the
 * thread's next round (within a tick), and only for names that then have
 * a queue -- a stat of the record and a wake-up per request saved, and
 * nothing a change made outside needs, which is CHANGE_NAME as before.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "changes.h"
#include "session.h"
#include "queue.h"
#include "events.h"

/* Names held in the set before it gives up on them and says "anything
 * may have changed" instead, which is as good and costs no memory. */
#define CHANGES_MAX 4096
/* Names taken in per slice of the liveness thread's work. */
#define SLICE_NAMES 256
/* Own changes held apart before they are treated as reported names (and
 * wake the thread like them). */
#define OWN_MAX 1024

struct lockfs_changes {
	pthread_mutex_t mu; /* a leaf: never held across a call */
	char **names;       /* reported, not yet taken in; protected by mu */
	size_t n, cap;      /* protected by mu */
	bool all;           /* every queue is to be tried; protected by mu */
	char **own;         /* CHANGE_OWN names not taken in; protected by mu */
	size_t nown, owncap; /* protected by mu */
	bool session;       /* the session changed state; protected by mu */
};

int lockfs_changes_init(struct lockfs_table *t)
{
	struct lockfs_changes *ch = calloc(1, sizeof(*ch));

	if (!ch)
		return -ENOMEM;
	pthread_mutex_init(&ch->mu, NULL);
	t->changes = ch;
	return 0;
}

void lockfs_changes_fini(struct lockfs_table *t)
{
	struct lockfs_changes *ch = t->changes;

	if (!ch)
		return;
	for (size_t i = 0; i < ch->n; i++)
		free(ch->names[i]);
	free(ch->names);
	for (size_t i = 0; i < ch->nown; i++)
		free(ch->own[i]);
	free(ch->own);
	pthread_mutex_destroy(&ch->mu);
	free(ch);
	t->changes = NULL;
}

/* Note NAME (NULL: all) in CH.  With ch->mu held. */
static void note_locked(struct lockfs_changes *ch, const char *name)
{
	char *dup;

	if (!name || ch->all || ch->n >= CHANGES_MAX) {
		ch->all = true;
		return;
	}
	/* The same name reported twice in a row (acquire, then release) is
	 * taken in once. */
	if (ch->n && strcmp(ch->names[ch->n - 1], name) == 0)
		return;
	if (ch->n == ch->cap) {
		size_t cap = ch->cap ? ch->cap * 2 : 64;
		char **v = realloc(ch->names, cap * sizeof(*v));

		if (!v) {
			ch->all = true;
			return;
		}
		ch->names = v;
		ch->cap = cap;
	}
	dup = strdup(name);
	if (!dup) {
		ch->all = true; /* no memory: lose no change */
		return;
	}
	ch->names[ch->n++] = dup;
}

/* Note the engine's own change of NAME apart, without a wake-up.  With
 * ch->mu held.  false when it could not be kept apart (too many, no
 * memory): then it was noted as a reported name, which wakes the thread. */
static bool note_own_locked(struct lockfs_changes *ch, const char *name)
{
	char *dup;

	if (ch->nown && strcmp(ch->own[ch->nown - 1], name) == 0)
		return true;
	if (ch->nown == ch->owncap && ch->owncap < OWN_MAX) {
		size_t cap = ch->owncap ? ch->owncap * 2 : 16;
		char **v = realloc(ch->own, cap * sizeof(*v));

		if (v) {
			ch->own = v;
			ch->owncap = cap;
		}
	}
	dup = ch->nown < ch->owncap ? strdup(name) : NULL;
	if (!dup) {
		note_locked(ch, name);
		return false;
	}
	ch->own[ch->nown++] = dup;
	return true;
}

void lockfs_changes_report(void *arg, enum lockfs_change what, const char *name)
{
	struct lockfs_table *t = arg;
	struct lockfs_changes *ch = t->changes;
	bool wake = true;

	pthread_mutex_lock(&ch->mu);
	if (what == LOCKFS_CHANGE_OWN && name)
		wake = !note_own_locked(ch, name);
	else
		note_locked(ch, what == LOCKFS_CHANGE_NAME ? name : NULL);
	if (what == LOCKFS_CHANGE_SESSION)
		ch->session = true;
	pthread_mutex_unlock(&ch->mu);
	if (wake)
		lockfs_liveness_kick(t->liveness);
}

/* NAME changed in the store: refresh its cache entry (dropped when gone,
 * reread when replaced) and try its queue. */
static void take_in(struct lockfs_table *t, const char *name)
{
	struct stripe *s = lockfs_table_stripe(t, name);

	pthread_mutex_lock(&s->mu);
	if (lockfs_queue_find(s, name)) {
		lockfs_queue_grant_locked(t, s, name); /* loads NAME first */
	} else if (lockfs_table_find(s, name) || lockfs_events_watched(t->events)) {
		/* (Watched: a name not cached is looked at too, so that
		 * another host's new lock is an event.) */
		struct lockfs_entry_stat st;
		struct held_lock *c;
		bool foreign;

		(void)lockfs_table_load(t, s, name, &st, &foreign, &c);
	}
	lockfs_table_unlock(s);
	if (t->changed)
		t->changed(t, name);
}

/* The engine changed NAME itself and cached the result: only a queue it
 * has by now is tried (as take_in does); the cache needs no second look. */
static void take_in_own(struct lockfs_table *t, const char *name)
{
	struct stripe *s = lockfs_table_stripe(t, name);

	pthread_mutex_lock(&s->mu);
	if (lockfs_queue_find(s, name))
		lockfs_queue_grant_locked(t, s, name);
	lockfs_table_unlock(s);
	if (t->changed)
		t->changed(t, name);
}

/* Move up to SLICE_NAMES of *V (*N of them) into OUT; how many. */
static size_t take_slice(char **v, size_t *n, char *out[SLICE_NAMES])
{
	size_t k = *n < SLICE_NAMES ? *n : SLICE_NAMES;

	if (k) { /* (V is NULL until a first name) */
		memcpy(out, v, k * sizeof(*out));
		memmove(v, v + k, (*n - k) * sizeof(*v));
		*n -= k;
	}
	return k;
}

bool lockfs_changes_drain(struct lockfs_table *t)
{
	struct lockfs_changes *ch = t->changes;
	char *names[SLICE_NAMES], *own[SLICE_NAMES];
	size_t n, nown;
	bool all, more, session;

	pthread_mutex_lock(&ch->mu);
	all = ch->all;
	ch->all = false;
	session = ch->session;
	ch->session = false;
	n = take_slice(ch->names, &ch->n, names);
	nown = take_slice(ch->own, &ch->nown, own);
	more = ch->n > 0 || ch->nown > 0;
	pthread_mutex_unlock(&ch->mu);

	/* First: locks lost with the session are not tried as held below. */
	if (session)
		lockfs_session_check(t);

	if (all) {
		/* Anything may have changed: every queue is tried (a cached
		 * record is checked by the next request's stat anyway; on a
		 * store with sessions this host's locks are checked now, so
		 * one removed behind its holder is lost at once). */
		for (int i = 0; i < STRIPES; i++) {
			struct stripe *s = &t->stripes[i];

			pthread_mutex_lock(&s->mu);
			lockfs_session_recheck_locked(t, s);
			lockfs_queue_poll_locked(t, s);
			lockfs_table_unlock(s);
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (!all)
			take_in(t, names[i]);
		free(names[i]);
	}
	for (size_t i = 0; i < nown; i++) {
		if (!all)
			take_in_own(t, own[i]);
		free(own[i]);
	}
	return more;
}
