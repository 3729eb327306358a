/*
 * Who is asking (caller.c): the holder-to-be of a request, its slug, its
 * user name, a new record with its token, and the rmdir rule (may this
 * caller act as that holder?).  Reads /proc through t->procs; takes no
 * stripe mutex (callers may hold one, except where said).
 */
#ifndef LOCKFS_LOCK_CALLER_H
#define LOCKFS_LOCK_CALLER_H

#include <stdbool.h>
#include <sys/types.h>

#include "table.h"

/* The LOCKFS_SLUG of thread TID's process (its exec-time environment) into
 * BUF; "" when unset or unreadable.  Returns 0, or -EINVAL for a slug that
 * is too long, not UTF-8, or has a control character. */
int lockfs_caller_slug(const struct lockfs_proc_source *src, pid_t tid, char *buf, size_t size);
/*
 * The holder-to-be of CALLER's mkdir (lockfs_holder_resolve with WANT),
 * its LOCKFS_SLUG into SLUG (LOCKFS_SLUG_MAX bytes) and, when known, its
 * command line into *CMDLINE (malloc'd, for lockfs_caller_record; NULL
 * when not read).  A process that holds for itself and comes back is
 * read in full once per exec (requesters.h); its pid, start time, comm
 * and session are read every time.  Returns 0, or -EINVAL with *BAD_SLUG
 * set for a slug lockfs_caller_slug refuses (nothing else is then
 * filled), or lockfs_holder_resolve's -errno.
 */
int lockfs_caller_identify(struct lockfs_table *t, const struct lockfs_caller *caller,
			   unsigned want, struct lockfs_proc *holder, char *slug,
			   char ***cmdline, bool *bad_slug);
/* WHO for the process of thread TID: its resolved holder's comm[pid] or
 * its LOCKFS_SLUG.  Returns the pid WHO stands for: the resolved process,
 * else TID (0 = not visible).  Reads /proc: best without a stripe mutex. */
pid_t lockfs_caller_who(struct lockfs_table *t, pid_t tid, char *buf, size_t size);

/*
 * The container of thread TID, as a holder's is named (lockfs_proc.container)
 * into OUT: "" in the daemon's own pid namespace; LOCKFS_CALLER_UNSEEN when
 * TID is 0 (a caller the daemon cannot see) or cannot be read.  Reads /proc.
 */
#define LOCKFS_CALLER_UNSEEN "?"
void lockfs_caller_container(struct lockfs_table *t, pid_t tid, char *out, size_t size);
/*
 * CALLER as a reader of `owner` (NULL: the daemon itself) into *R: for root
 * in a container under -o container_root=own, its container (kept in
 * SCOPE), whose holders alone it is root over.  Reads /proc only for root.
 */
void lockfs_caller_reader(struct lockfs_table *t, const struct lockfs_caller *caller,
			  struct lockfs_reader *r, char scope[LOCKFS_CONTAINER_MAX]);

/* Fill H (zeroed) with process P's facts, as for a new holder: CMDLINE,
 * when it points to an argv read earlier, is taken over, else P's is read.
 * 0 or -ENOMEM (then H is cleared). */
int lockfs_caller_fill_holder(struct lockfs_table *t, struct lockfs_holder *h,
			      const struct lockfs_proc *p, char ***cmdline);
/* A record for a new holder P of NAME (SLUG may be NULL or ""), with a
 * fresh token and no fence yet (the store issues it: lockfs_table_grant_src);
 * CMDLINE as for lockfs_caller_fill_holder.
 * 0 or -errno (REC cleared). */
int lockfs_caller_record(struct lockfs_table *t, const char *name, const struct lockfs_proc *p,
			 const char *slug, struct lockfs_record *rec, char ***cmdline);

/* Start LEASE anew: TTL_S from now (0 clears it). */
void lockfs_lease_start(struct lockfs_lease *lease, uint32_t ttl_s);

/* Who holds a lock, copied out of the cache so that /proc can be read
 * without the stripe mutex. */
struct lockfs_holder_ref {
	bool known;            /* false: a foreign lock */
	enum lockfs_bound bound;
	pid_t pid;
	unsigned long long start;
	uid_t uid;
	char boot_id[40];
	char host[LOCKFS_HOST_MAX]; /* "" when the record names none */
	char slug[LOCKFS_SLUG_MAX];
	char container[LOCKFS_CONTAINER_MAX]; /* "" for the daemon's own */
};

/* Holder I of REC into H (REC NULL, or I out of range: not known). */
void lockfs_caller_ref_at(struct lockfs_holder_ref *h, const struct lockfs_record *rec, size_t i);
/* May CALLER act as the holder H (the rmdir rule)?  0, -EPERM, -EACCES. */
int lockfs_caller_check(struct lockfs_table *t, const struct lockfs_holder_ref *h,
			const struct lockfs_caller *caller);
/* lockfs_caller_check on C's first holder (C NULL: a foreign lock). */
int lockfs_caller_may_act(struct lockfs_table *t, const struct held_lock *c,
			  const struct lockfs_caller *caller);

/* Log a refused request of CALLER (resolved like a holder) for NAME. */
void lockfs_caller_denied(struct lockfs_table *t, const char *name,
			  const struct lockfs_caller *caller, const char *reason);
/*
 * Refuse a request of UID for REASON: counted into the uid's burst of
 * refusals, which is logged as one `refused` line when it ends.  NAME is
 * what was asked for (may be NULL); WHO the caller as the log names it and
 * PID the process it stands for (0 = not known), or WHO NULL to resolve
 * thread PID now (only for a burst's first refusal).
 */
void lockfs_caller_refuse(struct lockfs_table *t, uid_t uid, enum quota_reason reason,
			  const char *name, const char *who, pid_t pid);

#endif
