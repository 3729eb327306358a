/*
 * libFuzzer target for the record parser: the record comes from a backing
 * directory that anything with write access there may have edited, and
 * the engine decides who may release a lock from it.  Whatever the bytes,
 * parsing must not crash, leak or read out of bounds; and a record it
 * accepts must survive an encode/parse round trip unchanged.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lockfs/record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct lockfs_record r, back;
	size_t len;
	char *json;

	if (lockfs_record_parse((const char *)data, size, &r) != 0)
		return 0;
	json = lockfs_record_encode(&r, LOCKFS_RECORD_WITH_TOKEN, &len);
	if (!json)
		abort();
	if (lockfs_record_parse(json, len, &back) != 0)
		abort(); /* we wrote something we cannot read */
	if (strcmp(r.resource, back.resource) || r.fence != back.fence ||
	    strcmp(r.token, back.token) || r.bound != back.bound ||
	    r.has_holder != back.has_holder ||
	    (r.has_holder && (r.holder.pid != back.holder.pid ||
			      r.holder.start_time != back.holder.start_time)))
		abort();
	free(json);
	lockfs_record_clear(&back);
	lockfs_record_clear(&r);
	return 0;
}
