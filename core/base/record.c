/*
 * The lock record (include/lockfs/record.h): the model -- holder I of a
 * record by name, whatever its place (the lock's own holder or a share)
 * -- and freeing it.  Encoding is record_encode.c's (and the fast one,
 * record_compact.c's); parsing is record_parse.c's.
 */
#include <stdlib.h>
#include <string.h>

#include "lockfs/record.h"

uint64_t lockfs_holder_fence(const struct lockfs_record *r)
{
	return r->holder_fence ? r->holder_fence : r->fence;
}

int64_t lockfs_holder_acquired_at(const struct lockfs_record *r)
{
	return r->holder_fence ? r->holder_acquired_at_ms : r->acquired_at_ms;
}

size_t lockfs_record_holders(const struct lockfs_record *r)
{
	return r->has_holder ? 1 + r->nshares : 0;
}

struct lockfs_holder *lockfs_record_holder(const struct lockfs_record *r, size_t i)
{
	return (struct lockfs_holder *)(i == 0 ? &r->holder : &r->shares[i - 1].holder);
}

enum lockfs_bound lockfs_record_bound_at(const struct lockfs_record *r, size_t i)
{
	return i == 0 ? r->bound : r->shares[i - 1].bound;
}

void lockfs_record_set_bound_at(struct lockfs_record *r, size_t i, enum lockfs_bound b)
{
	if (i == 0)
		r->bound = b;
	else
		r->shares[i - 1].bound = b;
}

uint64_t lockfs_record_fence_at(const struct lockfs_record *r, size_t i)
{
	return i == 0 ? lockfs_holder_fence(r) : r->shares[i - 1].fence;
}

const char *lockfs_record_fd_owner_at(const struct lockfs_record *r, size_t i)
{
	return i == 0 ? r->fd_owner : r->shares[i - 1].fd_owner;
}

uint64_t lockfs_record_via_file_at(const struct lockfs_record *r, size_t i)
{
	return i == 0 ? r->via_file : r->shares[i - 1].via_file;
}

const char *lockfs_record_slug_at(const struct lockfs_record *r, size_t i)
{
	return i == 0 ? r->slug : r->shares[i - 1].slug;
}

const char *lockfs_bound_name(enum lockfs_bound b)
{
	return b == LOCKFS_BOUND_SLUG ? "slug" : b == LOCKFS_BOUND_FD ? "fd" : "process";
}

void lockfs_holder_clear(struct lockfs_holder *h)
{
	free(h->user);
	free(h->container);
	free(h->comm);
	free(h->host);
	free(h->boot_id);
	if (h->cmdline) {
		for (char **a = h->cmdline; *a; a++)
			free(*a);
		free(h->cmdline);
	}
	memset(h, 0, sizeof(*h));
}

void lockfs_record_clear(struct lockfs_record *r)
{
	if (!r)
		return;
	free(r->resource);
	free(r->operation);
	free(r->slug);
	lockfs_holder_clear(&r->holder);
	for (size_t i = 0; i < r->nshares; i++) {
		lockfs_holder_clear(&r->shares[i].holder);
		free(r->shares[i].slug);
	}
	free(r->shares);
	free(r->descendants);
	memset(r, 0, sizeof(*r));
}
