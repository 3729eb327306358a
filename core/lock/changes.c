/*
 * Changes the store reports (a script's `rmdir DIR/NAME.lock`, seen by the
 * dir backend's inotify watch).  The backend's thread only notes the name
 * and wakes the liveness thread, which does the work: a waiter queued
 * behind a lock that vanished is granted at once, not at some poll, and
 * the cache drops or rereads a record that changed.  The kernel is told
 * nothing (zero timeouts: its next lookup asks the engine anyway).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "changes.h"
#include "session.h"
#include "queue.h"

/* Names held in the set before it gives up on them and says "anything
 * may have changed" instead, which is as good and costs no memory. */
#define CHANGES_MAX 4096
/* Names taken in per slice of the liveness thread's work. */
#define SLICE_NAMES 256

struct lockfs_changes {
	pthread_mutex_t mu; /* a leaf: never held across a call */
	char **names;       /* reported, not yet taken in; protected by mu */
	size_t n, cap;      /* protected by mu */
	bool all;           /* every queue is to be tried; protected by mu */
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

void lockfs_changes_report(void *arg, enum lockfs_change what, const char *name)
{
	struct lockfs_table *t = arg;
	struct lockfs_changes *ch = t->changes;

	pthread_mutex_lock(&ch->mu);
	note_locked(ch, what == LOCKFS_CHANGE_NAME ? name : NULL);
	if (what == LOCKFS_CHANGE_SESSION)
		ch->session = true;
	pthread_mutex_unlock(&ch->mu);
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
	} else if (lockfs_table_find(s, name)) {
		struct lockfs_entry_stat st;
		struct cached *c;
		bool foreign;

		(void)lockfs_table_load(t, s, name, &st, &foreign, &c);
	}
	lockfs_table_unlock(s);
}

bool lockfs_changes_drain(struct lockfs_table *t)
{
	struct lockfs_changes *ch = t->changes;
	char *names[SLICE_NAMES];
	size_t n;
	bool all, more, session;

	pthread_mutex_lock(&ch->mu);
	all = ch->all;
	ch->all = false;
	session = ch->session;
	ch->session = false;
	n = ch->n < SLICE_NAMES ? ch->n : SLICE_NAMES;
	if (n) { /* (ch->names is NULL until a first name) */
		memcpy(names, ch->names, n * sizeof(*names));
		memmove(ch->names, ch->names + n, (ch->n - n) * sizeof(*names));
		ch->n -= n;
	}
	more = ch->n > 0;
	pthread_mutex_unlock(&ch->mu);

	/* First: locks lost with the session are not tried as held below. */
	if (session)
		lockfs_session_check(t);

	if (all) {
		/* Anything may have changed: every queue is tried (a cached
		 * record is checked by the next request's stat anyway). */
		for (int i = 0; i < STRIPES; i++) {
			struct stripe *s = &t->stripes[i];

			pthread_mutex_lock(&s->mu);
			lockfs_queue_poll_locked(t, s);
			lockfs_table_unlock(s);
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (!all)
			take_in(t, names[i]);
		free(names[i]);
	}
	return more;
}
