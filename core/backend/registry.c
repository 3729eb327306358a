/*
 * The store kinds built into lockfs, found by the name `-o backend=NAME`
 * gives (docs/backing.md).  A new kind is one more line here.
 */
#include <string.h>

#include "lockfs/backend.h"
#include "dir.h"

const struct lockfs_backend_kind *const lockfs_backend_kinds[] = {
	&lockfs_backend_dir_kind,
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
