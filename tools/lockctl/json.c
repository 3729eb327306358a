/*
 * Reading a member of the JSON the mount shows (owner, waiters): the two
 * accessors every section of lockctl uses.  A file of their own, below
 * mount.c, holder_view.c, status.c and wait.c, so that those call each
 * other one way only (tools/check_floors.py: no circle of files).
 */
#include <stdbool.h>

#include <jansson.h>

#include "lockctl.h"

const char *lockfs_ctl_jstr(const json_t *o, const char *key)
{
	return json_string_value(json_object_get(o, key));
}

bool lockfs_ctl_jint(const json_t *o, const char *key, long long *v)
{
	json_t *x = json_object_get(o, key);
	if (!json_is_integer(x))
		return false;
	*v = json_integer_value(x);
	return true;
}
