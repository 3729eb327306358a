/*
 * The kernel's process-event connector (netlink NETLINK_CONNECTOR,
 * CN_IDX_PROC): a FORK and an EXIT event for every task on the machine,
 * an EXEC event for every execve(2) (queued during the execve itself, so
 * it is readable before the new program can make a request), and a SID
 * event for every process that starts a session of its own, as a struct
 * lockfs_event_source for descendants.c.
 *
 * Only fork, exec, exit and sid events are asked for (kernels from 6.6 filter the
 * rest out before they are sent).  The socket's buffer is made large, and
 * a full one loses events: the next read says -ENOBUFS once.
 */
#ifndef LOCKFS_PROCEVENTS_H
#define LOCKFS_PROCEVENTS_H

#include <stddef.h>

#include "lockfs/descendants.h"

struct lockfs_procevents;

/*
 * Subscribe.  The kernel must acknowledge the subscription: it does not
 * for a caller outside the initial pid and user namespaces (whose pids
 * the events would not be in), nor, before Linux 6.6, without
 * CAP_NET_ADMIN.  Returns 0 and *OUT, or -errno with a short reason in
 * WHY (WHYLEN bytes).
 */
int lockfs_procevents_open(struct lockfs_procevents **out, char *why, size_t whylen)
	__attribute__((warn_unused_result));

/* The event source reading PE (valid while PE is open). */
struct lockfs_event_source lockfs_procevents_source(struct lockfs_procevents *pe);

/* Unsubscribe and close. */
void lockfs_procevents_close(struct lockfs_procevents *pe);

#endif
