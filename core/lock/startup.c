/*
 * The startup scan (startup.h): the locks the store holds when the daemon
 * starts.  Each record is read, cached and its holder watched; fd locks
 * are rebound to the processes that still hold their old descriptors;
 * then everything that died while no daemon watched is recovered, before
 * the mount serves anyone.
 */
#include <pthread.h>
#include <stdbool.h>

#include "rebound.h"
#include "recovery.h"
#include "startup.h"
#include "table.h"

int lockfs_startup_scan(struct lockfs_table *t)
{
	char **names;
	size_t n;
	int rc;

	t->starting = true;
	rc = lockfs_table_names(t, &names, &n);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		struct stripe *s = lockfs_table_stripe(t, names[i]);
		struct lockfs_entry_stat st;
		struct cached *c;
		bool foreign;

		/* Reading each record caches it and watches its holder; a
		 * holder that died while no daemon watched is marked gone. */
		pthread_mutex_lock(&s->mu);
		if (lockfs_table_reload(t, s, names[i], &st, &foreign, &c) == 0 && c)
			lockfs_rebound_bind_locked(t, s, c, &st);
		lockfs_table_unlock(s);
	}
	if (rc == 0) {
		lockfs_table_names_free(names, n);
		/* Nothing is served yet: recover it all now, while the
		 * evidence is `exited-while-down`. */
		lockfs_recovery_startup(t);
	}
	t->starting = false;
	return rc;
}
