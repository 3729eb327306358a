/* The process-event connector; see procevents.h. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/cn_proc.h>
#include <linux/connector.h>
#include <linux/netlink.h>

#include "lockfs/procevents.h"

/* Room for a burst of fork/exit events between two drains (each costs
 * the socket about 1 KiB of buffer). */
#define RCVBUF (8 * 1024 * 1024)

/* Linux 6.6's subscription with an event filter (not in older headers). */
struct proc_input_filter {
	uint32_t mcast_op;   /* enum proc_cn_mcast_op */
	uint32_t event_type; /* the events wanted, PROC_EVENT_* bits */
};

/* Datagrams taken per recvmmsg(2): one event each, so one system call
 * brings in a batch rather than a single event.  A datagram is about 80
 * bytes; a longer one (a future kernel's) is cut and skipped. */
#define BATCH 64
#define DGRAM 256

struct lockfs_procevents {
	int fd;
	uint32_t ack;        /* ours, to know our acknowledgement among others' */
	/* The datagrams of the last recvmmsg, handed out in order: the
	 * reader may take fewer events than they hold. */
	char buf[BATCH][DGRAM] __attribute__((aligned(NLMSG_ALIGNTO)));
	struct mmsghdr msgs[BATCH];
	struct iovec iov[BATCH];
	unsigned got, next;  /* datagrams received, and the next to hand out */
	size_t off;          /* in datagram NEXT: what was handed out */
	bool lost;           /* an overflow to report at the next read */
};

/* Send one control message with DATA (LEN bytes).  0 or -errno. */
static int send_op(struct lockfs_procevents *pe, const void *data, size_t len)
{
	char msg[NLMSG_SPACE(sizeof(struct cn_msg) + sizeof(struct proc_input_filter))]
		__attribute__((aligned(NLMSG_ALIGNTO)));
	struct nlmsghdr *nh = (struct nlmsghdr *)msg;
	struct cn_msg *cn = NLMSG_DATA(nh);

	memset(msg, 0, sizeof(msg));
	nh->nlmsg_len = (uint32_t)NLMSG_LENGTH(sizeof(*cn) + len);
	nh->nlmsg_type = NLMSG_DONE;
	cn->id.idx = CN_IDX_PROC;
	cn->id.val = CN_VAL_PROC;
	cn->ack = pe->ack;
	cn->len = (uint16_t)len;
	memcpy(cn->data, data, len);
	return send(pe->fd, nh, nh->nlmsg_len, 0) < 0 ? -errno : 0;
}

/*
 * The event in the message at H, copied out: it sits 4 bytes past an
 * 8-byte boundary, so it cannot be read in place.  Returns the number of
 * its bytes the message holds (the rest of *EV is zero), or 0 when H is
 * not the process connector's.
 */
static size_t event_of(const struct nlmsghdr *h, struct proc_event *ev, const struct cn_msg **cnp)
{
	const struct cn_msg *cn = NLMSG_DATA(h);
	size_t have;

	memset(ev, 0, sizeof(*ev));
	if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*cn)) || cn->id.idx != CN_IDX_PROC ||
	    cn->id.val != CN_VAL_PROC)
		return 0;
	have = h->nlmsg_len - NLMSG_LENGTH(sizeof(*cn));
	if (have > cn->len)
		have = cn->len;
	if (have > sizeof(*ev))
		have = sizeof(*ev);
	memcpy(ev, cn->data, have);
	*cnp = cn;
	return have;
}

/* Bytes of struct proc_event up to and including the member M. */
#define EVENT_UPTO(m) (offsetof(struct proc_event, m) + sizeof(((struct proc_event *)0)->m))

/*
 * The kernel answers a subscription at once, before send() returns, with
 * an event of kind NONE whose ack is ours + 1 (to every listener: others'
 * answers are skipped).  Returns 0 when it accepted, -errno when it
 * refused, -ENOMSG when no answer came.
 */
static int read_ack(struct lockfs_procevents *pe)
{
	char buf[8192] __attribute__((aligned(NLMSG_ALIGNTO)));

	for (;;) {
		ssize_t n = recv(pe->fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? -ENOMSG : -errno;
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n);
		     h = NLMSG_NEXT(h, n)) {
			const struct cn_msg *cn = NULL;
			struct proc_event ev;

			if (event_of(h, &ev, &cn) < EVENT_UPTO(event_data.ack))
				continue;
			if (ev.what == PROC_EVENT_NONE && cn->ack == pe->ack + 1)
				return ev.event_data.ack.err ? -(int)ev.event_data.ack.err : 0;
		}
	}
}

int lockfs_procevents_open(struct lockfs_procevents **out, char *why, size_t whylen)
{
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK, .nl_groups = CN_IDX_PROC };
	struct proc_input_filter filter = { PROC_CN_MCAST_LISTEN,
					    PROC_EVENT_FORK | PROC_EVENT_EXEC |
					    PROC_EVENT_EXIT | PROC_EVENT_SID |
					    PROC_EVENT_COMM };
	uint32_t listen = PROC_CN_MCAST_LISTEN;
	struct lockfs_procevents *pe = calloc(1, sizeof(*pe));
	int size = RCVBUF, rc;

	if (!pe) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	pe->fd = socket(PF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_CONNECTOR);
	if (pe->fd < 0) {
		rc = -errno;
		snprintf(why, whylen, "netlink connector socket: %s", strerror(-rc));
		free(pe);
		return rc;
	}
	/* Beyond rmem_max needs CAP_NET_ADMIN; the plain size is capped. */
	if (setsockopt(pe->fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size)) < 0)
		(void)setsockopt(pe->fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
	if (bind(pe->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		rc = -errno;
		snprintf(why, whylen, "bind to the process events: %s", strerror(-rc));
		goto fail;
	}
	pe->ack = (uint32_t)getpid();
	/* First the plain subscription, which every kernel answers; then
	 * the filter, which kernels before 6.6 ignore (they then send every
	 * kind of event, and the reader skips the others). */
	rc = send_op(pe, &listen, sizeof(listen));
	if (rc == 0)
		rc = read_ack(pe);
	if (rc < 0) {
		snprintf(why, whylen, "%s", rc == -ENOMSG
			 ? "the kernel did not answer the subscription (not in the initial pid "
			   "namespace?)"
			 : strerror(-rc));
		goto fail;
	}
	rc = send_op(pe, &filter, sizeof(filter));
	if (rc < 0) {
		snprintf(why, whylen, "process events filter: %s", strerror(-rc));
		goto fail;
	}
	*out = pe;
	return 0;
fail:
	close(pe->fd);
	free(pe);
	return rc;
}

/* An event of one process (exec, exit, comm, sid): the kernel's structs
 * for them all begin with process_pid, process_tgid. */
#define PROCESS_EVENT(pev, have, what_, member, kind_, ev) \
	((pev).what == (what_) && (have) >= EVENT_UPTO(event_data.member) \
	 ? ((ev)->kind = (kind_), (ev)->parent_tgid = 0, \
	    (ev)->pid = (pev).event_data.member.process_pid, \
	    (ev)->tgid = (pev).event_data.member.process_tgid, 1) : 0)

/* Turn the message at H into *EV.  Returns 1 for a fork, exec, exit, comm
 * or sid event, 0 for anything else (answers to subscriptions, other
 * kinds). */
static int parse(const struct nlmsghdr *h, struct lockfs_proc_event *ev)
{
	const struct cn_msg *cn = NULL;
	struct proc_event pev;
	size_t have = event_of(h, &pev, &cn);

	ev->mono_ns = pev.timestamp_ns;
	if (pev.what == PROC_EVENT_FORK && have >= EVENT_UPTO(event_data.fork)) {
		ev->kind = LOCKFS_PROC_FORK;
		ev->parent_tgid = pev.event_data.fork.parent_tgid;
		ev->pid = pev.event_data.fork.child_pid;
		ev->tgid = pev.event_data.fork.child_tgid;
		return 1;
	}
	return PROCESS_EVENT(pev, have, PROC_EVENT_EXEC, exec, LOCKFS_PROC_EXEC, ev) ||
	       PROCESS_EVENT(pev, have, PROC_EVENT_EXIT, exit, LOCKFS_PROC_EXIT, ev) ||
	       PROCESS_EVENT(pev, have, PROC_EVENT_COMM, comm, LOCKFS_PROC_COMM, ev) ||
	       PROCESS_EVENT(pev, have, PROC_EVENT_SID, sid, LOCKFS_PROC_SID, ev);
}

static int read_events(void *ctx, struct lockfs_proc_event *evs, int max)
{
	struct lockfs_procevents *pe = ctx;
	int n = 0;

	if (pe->lost) {
		pe->lost = false;
		return -ENOBUFS;
	}
	while (n < max) {
		size_t len;

		if (pe->next >= pe->got) {
			int got;

			for (unsigned i = 0; i < BATCH; i++) {
				pe->iov[i] = (struct iovec){ pe->buf[i], DGRAM };
				memset(&pe->msgs[i], 0, sizeof(pe->msgs[i]));
				pe->msgs[i].msg_hdr.msg_iov = &pe->iov[i];
				pe->msgs[i].msg_hdr.msg_iovlen = 1;
			}
			got = recvmmsg(pe->fd, pe->msgs, BATCH, MSG_DONTWAIT, NULL);
			pe->got = pe->next = 0;
			pe->off = 0;
			if (got < 0) {
				if (errno == EINTR)
					continue;
				if (errno == EAGAIN || errno == EWOULDBLOCK)
					break;
				/* ENOBUFS: the buffer overflowed; the stream goes on
				 * after a gap, which the caller must make up for.
				 * The kernel says so once: keep it for the next
				 * call when events are handed out now. */
				if (errno == ENOBUFS && n > 0) {
					pe->lost = true;
					break;
				}
				return -errno;
			}
			pe->got = (unsigned)got;
			continue;
		}
		len = pe->msgs[pe->next].msg_len;
		if (!(pe->msgs[pe->next].msg_hdr.msg_flags & MSG_TRUNC) && pe->off < len) {
			struct nlmsghdr *h = (struct nlmsghdr *)(pe->buf[pe->next] + pe->off);

			if (NLMSG_OK(h, len - pe->off)) {
				pe->off += NLMSG_ALIGN(h->nlmsg_len);
				n += parse(h, &evs[n]);
				continue;
			}
		}
		pe->next++;
		pe->off = 0;
	}
	return n;
}

struct lockfs_event_source lockfs_procevents_source(struct lockfs_procevents *pe)
{
	struct lockfs_event_source s = { .read = read_events, .ctx = pe };

	return s;
}

void lockfs_procevents_close(struct lockfs_procevents *pe)
{
	uint32_t ignore = PROC_CN_MCAST_IGNORE;

	if (!pe)
		return;
	/* The kernel counts listeners and sends events while any is left. */
	(void)send_op(pe, &ignore, sizeof(ignore));
	close(pe->fd);
	free(pe);
}
