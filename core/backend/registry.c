/*
 * The store kinds built into lockfs, found by the name `-o backend=NAME`
 * gives (docs/backing.md).  A new kind is one more line here.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "lockfs/backend.h"
#include "dir.h"
#include "options.h"
#include "registry.h"

#ifdef LOCKFS_WITH_ETCD
#include "etcd.h"
#else
/* Built without libcurl (-Detcd=disabled, or libcurl not found): the kind
 * is there by name so that `-o backend=etcd` says why it cannot be used
 * (fs/main.c prints `lockfs: <why>` and exits 1), not "unknown". */
static int etcd_not_built(const struct lockfs_backend_config *cfg, struct lockfs_backend **out)
{
	if (cfg->why && cfg->why_size)
		snprintf(cfg->why, cfg->why_size, "etcd support not built (-Detcd=disabled)");
	*out = NULL;
	return -EOPNOTSUPP;
}

static const struct lockfs_backend_kind lockfs_backend_etcd_kind = {
	.name = "etcd",
	.option_keys = lockfs_backend_etcd_option_keys,
	.help = "    (backend=etcd: not built in this lockfs, -Detcd=disabled)\n",
	.open = etcd_not_built,
};
#endif

const struct lockfs_backend_kind *const lockfs_backend_kinds[] = {
	&lockfs_backend_dir_kind,
	&lockfs_backend_etcd_kind,
	NULL,
};

/* The kind called NAME, or NULL when no kind is (fs/main.c says so in one
 * line). */
const struct lockfs_backend_kind *lockfs_backend_kind(const char *name)
{
	for (size_t i = 0; name && lockfs_backend_kinds[i]; i++)
		if (strcmp(lockfs_backend_kinds[i]->name, name) == 0)
			return lockfs_backend_kinds[i];
	return NULL;
}

void lockfs_backend_close(struct lockfs_backend *be)
{
	if (be)
		be->ops->close(be);
}
