/*
 * The connection's state, kept where it outlives the serving process.
 *
 * A FUSE connection lives as long as some process holds /dev/fuse open:
 * the keeper (keeper.c) or systemd's descriptor store holds it, and with
 * it this memfd.  A successor that takes the connection over never sees
 * FUSE_INIT and must answer requests on node ids and file handles its
 * predecessor gave out, so the serving process keeps here, as it serves:
 * the INIT request, where the mount is, the node table (inode.c) and the
 * open handles (handle.c).  Writes are plain stores to shared memory (no
 * system call per request); a process killed mid-update leaves at most
 * that one slot stale, which costs one ESTALE or EBADF, never a crash.
 *
 * Layout: a header, then NODE_SLOTS node slots, then HANDLE_SLOTS handle
 * slots.  The memfd is sized once; untouched pages cost nothing.  Slots
 * are handed out from a free list in process memory (under mu), rebuilt
 * from the slots themselves when a successor adopts the state.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "connstate.h"

#define MAGIC 0x6c6f636b66736331ull /* "lockfsc1" */
#define VERSION 1
#define INIT_MAX 512
#define NODE_SLOTS 65536u
#define HANDLE_SLOTS 65536u

struct header {
	uint64_t magic;
	uint32_t version;
	uint32_t phase;           /* enum lockfs_conn_phase */
	int32_t server;
	uint32_t init_len;
	unsigned char init[INIT_MAX];
	char mountpoint[PATH_MAX];
	char binary[PATH_MAX];
	char cwd[PATH_MAX];       /* where relative arguments were given */
	uint64_t mount_dev;
	uint64_t next_node;
	uint64_t next_fh;
	uint32_t node_high;       /* slots [0, node_high) were ever used */
	uint32_t handle_high;
};

#define NODES_OFF ((sizeof(struct header) + 63) & ~(size_t)63)
#define HANDLES_OFF (NODES_OFF + NODE_SLOTS * sizeof(struct lockfs_saved_node))
#define STATE_SIZE (HANDLES_OFF + HANDLE_SLOTS * sizeof(struct lockfs_saved_handle))

static struct {
	int fd;
	struct header *hdr;
	struct lockfs_saved_node *nodes;
	struct lockfs_saved_handle *handles;
	pthread_mutex_t mu;
	/* Protected by mu: the free slots below each high-water mark. */
	uint32_t *free_nodes, *free_handles;
	uint32_t n_free_nodes, n_free_handles;
} st = { .fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER };

static int map_state(int fd)
{
	void *p = mmap(NULL, STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		return -errno;
	st.free_nodes = calloc(NODE_SLOTS, sizeof(uint32_t));
	st.free_handles = calloc(HANDLE_SLOTS, sizeof(uint32_t));
	if (!st.free_nodes || !st.free_handles) {
		free(st.free_nodes);
		free(st.free_handles);
		munmap(p, STATE_SIZE);
		return -ENOMEM;
	}
	st.fd = fd;
	st.hdr = p;
	st.nodes = (struct lockfs_saved_node *)((char *)p + NODES_OFF);
	st.handles = (struct lockfs_saved_handle *)((char *)p + HANDLES_OFF);
	return 0;
}

int lockfs_connstate_create(void)
{
	int fd = memfd_create("lockfs-state", MFD_CLOEXEC), rc;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)STATE_SIZE) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	rc = map_state(fd);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	st.hdr->version = VERSION;
	st.hdr->next_node = 1;
	st.hdr->next_fh = 1;
	__atomic_store_n(&st.hdr->magic, MAGIC, __ATOMIC_RELEASE);
	return fd;
}

int lockfs_connstate_adopt(int fd)
{
	struct stat sb;
	int rc;

	if (fstat(fd, &sb) < 0)
		return -errno;
	if ((size_t)sb.st_size != STATE_SIZE)
		return -EINVAL;
	rc = map_state(fd);
	if (rc < 0)
		return rc;
	if (st.hdr->magic != MAGIC || st.hdr->version != VERSION ||
	    st.hdr->node_high > NODE_SLOTS || st.hdr->handle_high > HANDLE_SLOTS) {
		lockfs_connstate_forget();
		return -EINVAL;
	}
	/* Keep the descriptor for the next successor, not for programs we run. */
	(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
	for (uint32_t i = st.hdr->node_high; i-- > 0;)
		if (st.nodes[i].id == 0)
			st.free_nodes[st.n_free_nodes++] = i;
	for (uint32_t i = st.hdr->handle_high; i-- > 0;)
		if (st.handles[i].fh == 0)
			st.free_handles[st.n_free_handles++] = i;
	return 0;
}

void lockfs_connstate_forget(void)
{
	if (!st.hdr)
		return;
	munmap(st.hdr, STATE_SIZE);
	free(st.free_nodes);
	free(st.free_handles);
	st.free_nodes = st.free_handles = NULL;
	st.n_free_nodes = st.n_free_handles = 0;
	st.hdr = NULL;
	st.nodes = NULL;
	st.handles = NULL;
	st.fd = -1;
}

bool lockfs_connstate_active(void)
{
	return st.hdr != NULL;
}

int lockfs_connstate_fd(void)
{
	return st.fd;
}

void lockfs_connstate_keep_init(const void *req, size_t len)
{
	if (!st.hdr || len > INIT_MAX)
		return;
	memcpy(st.hdr->init, req, len);
	__atomic_store_n(&st.hdr->init_len, (uint32_t)len, __ATOMIC_RELEASE);
}

const void *lockfs_connstate_init(size_t *len)
{
	if (!st.hdr || st.hdr->init_len == 0)
		return NULL;
	*len = st.hdr->init_len;
	return st.hdr->init;
}

void lockfs_connstate_set_phase(enum lockfs_conn_phase phase)
{
	if (st.hdr)
		__atomic_store_n(&st.hdr->phase, (uint32_t)phase, __ATOMIC_SEQ_CST);
}

enum lockfs_conn_phase lockfs_connstate_phase(void)
{
	return st.hdr ? (enum lockfs_conn_phase)__atomic_load_n(&st.hdr->phase, __ATOMIC_SEQ_CST)
		      : LOCKFS_PHASE_STARTING;
}

void lockfs_connstate_set_server(pid_t pid)
{
	if (st.hdr)
		__atomic_store_n(&st.hdr->server, (int32_t)pid, __ATOMIC_SEQ_CST);
}

pid_t lockfs_connstate_server(void)
{
	return st.hdr ? (pid_t)__atomic_load_n(&st.hdr->server, __ATOMIC_SEQ_CST) : 0;
}

static void copy_path(char *dst, const char *src)
{
	size_t n = src ? strlen(src) : 0;

	if (n >= PATH_MAX)
		n = 0;
	memcpy(dst, src ? src : "", n);
	dst[n] = '\0';
}

void lockfs_connstate_set_mount(const char *mountpoint, uint64_t dev, const char *binary,
				const char *cwd)
{
	if (!st.hdr)
		return;
	copy_path(st.hdr->mountpoint, mountpoint);
	copy_path(st.hdr->binary, binary);
	copy_path(st.hdr->cwd, cwd);
	st.hdr->mount_dev = dev;
}

const char *lockfs_connstate_mountpoint(void)
{
	return st.hdr ? st.hdr->mountpoint : "";
}

uint64_t lockfs_connstate_mount_dev(void)
{
	return st.hdr ? st.hdr->mount_dev : 0;
}

const char *lockfs_connstate_binary(void)
{
	return st.hdr ? st.hdr->binary : "";
}

const char *lockfs_connstate_cwd(void)
{
	return st.hdr ? st.hdr->cwd : "";
}

void lockfs_connstate_set_next_node(uint64_t next)
{
	if (st.hdr && next > st.hdr->next_node)
		st.hdr->next_node = next;
}

uint64_t lockfs_connstate_next_node(void)
{
	return st.hdr ? st.hdr->next_node : 1;
}

void lockfs_connstate_set_next_fh(uint64_t next)
{
	if (st.hdr && next > st.hdr->next_fh)
		st.hdr->next_fh = next;
}

uint64_t lockfs_connstate_next_fh(void)
{
	return st.hdr ? st.hdr->next_fh : 1;
}

/* A free slot index below MAX from FREE (N_FREE of them) or the
 * high-water mark *HIGH; -1 when full.  Under st.mu. */
static int64_t slot_take(uint32_t *free_list, uint32_t *n_free, uint32_t *high, uint32_t max)
{
	if (*n_free > 0)
		return free_list[--*n_free];
	if (*high >= max)
		return -1;
	return (*high)++;
}

struct lockfs_saved_node *lockfs_connstate_node_get(void)
{
	int64_t i;

	if (!st.hdr)
		return NULL;
	pthread_mutex_lock(&st.mu);
	i = slot_take(st.free_nodes, &st.n_free_nodes, &st.hdr->node_high, NODE_SLOTS);
	pthread_mutex_unlock(&st.mu);
	return i < 0 ? NULL : &st.nodes[i];
}

void lockfs_connstate_node_put(struct lockfs_saved_node *n)
{
	if (!n)
		return;
	n->id = 0;
	pthread_mutex_lock(&st.mu);
	st.free_nodes[st.n_free_nodes++] = (uint32_t)(n - st.nodes);
	pthread_mutex_unlock(&st.mu);
}

struct lockfs_saved_handle *lockfs_connstate_handle_get(void)
{
	int64_t i;

	if (!st.hdr)
		return NULL;
	pthread_mutex_lock(&st.mu);
	i = slot_take(st.free_handles, &st.n_free_handles, &st.hdr->handle_high, HANDLE_SLOTS);
	pthread_mutex_unlock(&st.mu);
	return i < 0 ? NULL : &st.handles[i];
}

void lockfs_connstate_handle_put(struct lockfs_saved_handle *h)
{
	if (!h)
		return;
	h->fh = 0;
	pthread_mutex_lock(&st.mu);
	st.free_handles[st.n_free_handles++] = (uint32_t)(h - st.handles);
	pthread_mutex_unlock(&st.mu);
}

int lockfs_connstate_each_node(int (*fn)(struct lockfs_saved_node *n, void *arg), void *arg)
{
	for (uint32_t i = 0; st.hdr && i < st.hdr->node_high; i++) {
		int rc = st.nodes[i].id ? fn(&st.nodes[i], arg) : 0;

		if (rc)
			return rc;
	}
	return 0;
}

int lockfs_connstate_each_handle(int (*fn)(struct lockfs_saved_handle *h, void *arg),
				 void *arg)
{
	for (uint32_t i = 0; st.hdr && i < st.hdr->handle_high; i++) {
		int rc = st.handles[i].fh ? fn(&st.handles[i], arg) : 0;

		if (rc)
			return rc;
	}
	return 0;
}
