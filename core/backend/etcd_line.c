/*
 * The store's line for one name (backend op `line`): every host's
 * contenders waiting for NAME, in etcd's own order, for `M/NAME/waiters`.
 * One range read of R(NAME) sorted by create_revision -- exact, and
 * independent of what this daemon mirrors -- of which the first key is
 * the holder's (or the lock-delay's) and the rest wait.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "etcd.h"

int lockfs_etcdbe_line(struct lockfs_backend *be, const char *name, lockfs_line_cb cb, void *arg)
{
	struct etcd_store *e = (struct etcd_store *)be;
	char key[LOCKFS_STORE_KEY_MAX];
	struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = key, .prefix = true,
				     .sort_order = LOCKFS_ETCD_SORT_ASCEND,
				     .sort_target = LOCKFS_ETCD_SORT_CREATE };
	struct lockfs_etcd_op_resp r;
	int n = snprintf(key, sizeof(key), "%s%s/", e->prefix, name);
	int rc;

	if (n < 0 || (size_t)n >= sizeof(key) || !*name || strchr(name, '/'))
		return -EINVAL;
	rc = lockfs_etcd_range(e->client, &op, &r);
	if (rc)
		return rc == -ENOMEM ? rc : -EIO;
	for (size_t i = 1; i < r.n_kvs && rc == 0; i++)
		rc = cb(arg, &(struct lockfs_line_entry){ .rank = r.kvs[i].create_revision,
							  .record = r.kvs[i].value,
							  .record_len = r.kvs[i].value_len });
	lockfs_etcd_op_resp_free(&r);
	return rc;
}
