/* Repeat requesters' facts, valid until the next exec; see requesters.h. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/proc.h"
#include "requesters.h"

/* Direct-mapped by pid: the requesters that come back are few (a shell
 * running a script, an agent taking lock after lock), and a collision
 * only costs the next request the full reads. */
#define SLOTS 256

struct slot {
	pid_t pid;                /* 0: empty */
	unsigned long long start;
	uint64_t ticket;          /* the claim that owns the slot */
	bool ready;               /* FACTS hold; else claimed and being read */
	struct lockfs_requester facts;
};

struct lockfs_requesters {
	pthread_mutex_t mu;
	uint64_t next_ticket;     /* protected by mu */
	struct slot slots[SLOTS]; /* protected by mu */
};

static void slot_clear(struct slot *s)
{
	lockfs_argv_free(s->facts.cmdline);
	memset(s, 0, sizeof(*s));
}

int lockfs_requesters_new(struct lockfs_requesters **out)
{
	struct lockfs_requesters *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->mu, NULL);
	r->next_ticket = 1;
	*out = r;
	return 0;
}

void lockfs_requesters_free(struct lockfs_requesters *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < SLOTS; i++)
		slot_clear(&r->slots[i]);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

void lockfs_requesters_event(void *ctx, const struct lockfs_proc_event *ev)
{
	struct lockfs_requesters *r = ctx;

	pthread_mutex_lock(&r->mu);
	if (!ev) {
		for (size_t i = 0; i < SLOTS; i++)
			slot_clear(&r->slots[i]);
	} else if (ev->kind == LOCKFS_PROC_EXEC || ev->kind == LOCKFS_PROC_COMM ||
		   ev->kind == LOCKFS_PROC_SID ||
		   (ev->kind == LOCKFS_PROC_EXIT && ev->pid == ev->tgid)) {
		struct slot *s = &r->slots[(size_t)ev->tgid % SLOTS];

		/* A claim is voided too: its reads may have seen the old
		 * program, name or session. */
		if (s->pid == ev->tgid)
			slot_clear(s);
	}
	if (ev && ev->kind == LOCKFS_PROC_EXIT) {
		/* Its children get another parent (any task's exit may be
		 * the last of its process).  A claim in progress may have
		 * read the old one: voided too, it is read again. */
		for (size_t i = 0; i < SLOTS; i++) {
			struct slot *s = &r->slots[i];

			if (s->pid && (!s->ready || s->facts.ppid == ev->tgid))
				slot_clear(s);
		}
	}
	pthread_mutex_unlock(&r->mu);
}

int lockfs_requesters_get(struct lockfs_requesters *r, pid_t pid, unsigned long long start,
			  struct lockfs_requester *out)
{
	struct slot *s = &r->slots[(size_t)pid % SLOTS];
	int rc = -ENOENT;

	pthread_mutex_lock(&r->mu);
	if (pid > 0 && s->pid == pid && s->start == start && s->ready) {
		*out = s->facts;
		out->cmdline = lockfs_argv_dup(s->facts.cmdline);
		rc = out->cmdline ? 0 : -ENOMEM;
	}
	pthread_mutex_unlock(&r->mu);
	return rc;
}

int lockfs_requesters_current(struct lockfs_requesters *r, pid_t pid,
			      struct lockfs_requester *out)
{
	struct slot *s = &r->slots[(size_t)pid % SLOTS];
	int rc = -ENOENT;

	pthread_mutex_lock(&r->mu);
	if (pid > 0 && s->pid == pid && s->ready && s->facts.start) {
		*out = s->facts;
		out->cmdline = lockfs_argv_dup(s->facts.cmdline);
		rc = out->cmdline ? 0 : -ENOMEM;
	}
	pthread_mutex_unlock(&r->mu);
	return rc;
}

bool lockfs_requesters_known(struct lockfs_requesters *r, pid_t pid)
{
	struct slot *s = &r->slots[(size_t)pid % SLOTS];
	bool known;

	pthread_mutex_lock(&r->mu);
	known = pid > 0 && s->pid == pid && s->ready;
	pthread_mutex_unlock(&r->mu);
	return known;
}

uint64_t lockfs_requesters_claim(struct lockfs_requesters *r, pid_t pid,
				 unsigned long long start)
{
	struct slot *s = &r->slots[(size_t)pid % SLOTS];
	uint64_t ticket;

	pthread_mutex_lock(&r->mu);
	ticket = r->next_ticket++;
	slot_clear(s);
	s->pid = pid;
	s->start = start;
	s->ticket = ticket;
	pthread_mutex_unlock(&r->mu);
	return ticket;
}

bool lockfs_requesters_put(struct lockfs_requesters *r, pid_t pid, uint64_t ticket,
			   const struct lockfs_requester *facts)
{
	struct slot *s = &r->slots[(size_t)pid % SLOTS];
	char **argv = lockfs_argv_dup(facts->cmdline);
	bool kept = false;

	if (!argv)
		return false;
	pthread_mutex_lock(&r->mu);
	if (pid > 0 && s->pid == pid && s->ticket == ticket && !s->ready &&
	    (!facts->start || facts->start == s->start)) {
		s->facts = *facts;
		s->facts.cmdline = argv;
		s->ready = true;
		kept = true;
	}
	pthread_mutex_unlock(&r->mu);
	if (!kept)
		lockfs_argv_free(argv);
	return kept;
}
