/*
 * Telling the kernel that a lock went away without a request: the engine
 * recovered or broke it.  With zero timeouts the next lookup would find
 * out anyway; the notification makes `stat` and a watcher of the lock
 * directory (DELETE_SELF) see it at once, and drops the cached dentry.
 *
 * libfuse forbids notifying from inside a request handler that the kernel
 * is waiting on, and a notification waits for the parent directory's lock,
 * which a mkdir in flight holds.  So the engine only queues names here and
 * one thread of our own, holding no daemon mutex, sends them.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"

struct pending {
	struct pending *next;
	char name[];
};

struct notifier {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	struct pending *head, **tail; /* protected by mu */
	bool stopping;                /* protected by mu */
	bool running;
	pthread_t thread;
	struct lockfs_fs *fs;
};

static void send_one(struct lockfs_fs *fs, const char *name)
{
	static const char *const files[] = { "owner", "operation", "fence", "lease", "break",
					     "waiters", "bind" };
	struct lockfs_lock_stat now;
	uint64_t ids[8], gens[8];
	size_t n = inodes_find(fs->inodes, name, ids, gens, 8);
	size_t len = strlen(name);
	bool deleted = false, held = lockfs_core_stat(fs->core, name, &now) == 0;

	for (size_t i = 0; i < n; i++) {
		fuse_ino_t dir = ino_make(ids[i], LF_DIR);

		/* Handed straight to a waiter: the new holder's node stays. */
		if (held && gens[i] == now.generation)
			continue;

		/* The kernel refuses to delete a directory entry that still
		 * has children cached (ENOTEMPTY), and one with a file open
		 * inside cannot lose them: drop the children first, and for
		 * an open one settle for invalidating the name. */
		if (inodes_open_count(fs->inodes, ids[i]) > 0)
			continue;
		for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++)
			fuse_lowlevel_notify_inval_entry(fs->se, dir, files[f], strlen(files[f]));
		if (fuse_lowlevel_notify_delete(fs->se, FUSE_ROOT_ID, dir, name, len) == 0)
			deleted = true;
	}
	if (!deleted && !held)
		fuse_lowlevel_notify_inval_entry(fs->se, FUSE_ROOT_ID, name, len);
}

static void *notifier_thread(void *arg)
{
	struct notifier *nt = arg;

	pthread_mutex_lock(&nt->mu);
	for (;;) {
		struct pending *p;

		while (!nt->head && !nt->stopping)
			pthread_cond_wait(&nt->cond, &nt->mu);
		if (!nt->head)
			break;
		p = nt->head;
		nt->head = p->next;
		if (!nt->head)
			nt->tail = &nt->head;
		pthread_mutex_unlock(&nt->mu);
		send_one(nt->fs, p->name);
		free(p);
		pthread_mutex_lock(&nt->mu);
	}
	pthread_mutex_unlock(&nt->mu);
	return NULL;
}

struct notifier *notifier_new(struct lockfs_fs *fs)
{
	struct notifier *nt = calloc(1, sizeof(*nt));

	if (!nt)
		return NULL;
	pthread_mutex_init(&nt->mu, NULL);
	pthread_cond_init(&nt->cond, NULL);
	nt->tail = &nt->head;
	nt->fs = fs;
	return nt;
}

int notifier_run(struct notifier *nt)
{
	int rc = pthread_create(&nt->thread, NULL, notifier_thread, nt);

	if (rc)
		return -rc;
	nt->running = true;
	return 0;
}

/* lockfs_removed_fn: queue NAME.  Never blocks on the kernel. */
void notifier_removed(void *arg, const char *name)
{
	struct notifier *nt = arg;
	size_t len = strlen(name);
	struct pending *p = malloc(sizeof(*p) + len + 1);

	if (!p)
		return; /* zero timeouts: the kernel finds out at the next lookup */
	memcpy(p->name, name, len + 1);
	p->next = NULL;
	pthread_mutex_lock(&nt->mu);
	*nt->tail = p;
	nt->tail = &p->next;
	pthread_cond_signal(&nt->cond);
	pthread_mutex_unlock(&nt->mu);
}

void notifier_free(struct notifier *nt)
{
	if (!nt)
		return;
	if (nt->running) {
		pthread_mutex_lock(&nt->mu);
		nt->stopping = true;
		pthread_cond_signal(&nt->cond);
		pthread_mutex_unlock(&nt->mu);
		pthread_join(nt->thread, NULL);
	}
	while (nt->head) {
		struct pending *p = nt->head;

		nt->head = p->next;
		free(p);
	}
	pthread_cond_destroy(&nt->cond);
	pthread_mutex_destroy(&nt->mu);
	free(nt);
}
