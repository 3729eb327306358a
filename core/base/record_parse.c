/*
 * The lock record read back from JSON (include/lockfs/record.h), with
 * jansson.
 *
 * Parsing is strict: the record comes from a backing directory anyone with
 * write access could have edited, and the engine trusts pid, start_time and
 * token from it when deciding who may release a lock.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lockfs/record.h"

/* Most cmdline elements a parsed record may carry. */
#define RECORD_CMDLINE_MAX 4096
/* Longest container id a parsed record may carry. */
#define RECORD_CONTAINER_MAX 255

/*
 * Parsing helpers.  Each returns 0, -EINVAL when the member is missing or
 * has the wrong type or range, or -ENOMEM.
 */

static int get_int(const json_t *o, const char *key, json_int_t min,
		   json_int_t max, json_int_t *out)
{
	json_t *v = json_object_get(o, key);
	json_int_t i;

	if (!json_is_integer(v))
		return -EINVAL;
	i = json_integer_value(v);
	if (i < min || i > max)
		return -EINVAL;
	*out = i;
	return 0;
}

/* A fence: a number >= 1, or null (0: a store that issues fences by its
 * writes, etcd, wrote the record before it knew the fence and supplies it
 * on every read). */
static int get_fence(const json_t *o, json_int_t *out)
{
	if (json_is_null(json_object_get(o, "fence"))) {
		*out = 0;
		return 0;
	}
	return get_int(o, "fence", 1, INT64_MAX, out);
}

static int dup_json_str(const json_t *v, size_t max, char **out)
{
	size_t n = json_string_length(v);

	/* JSON_ALLOW_NUL is not set, so the string holds no NUL. */
	if (n > max)
		return -EINVAL;
	*out = strndup(json_string_value(v), n);
	return *out ? 0 : -ENOMEM;
}

static int get_str(const json_t *o, const char *key, size_t max, char **out)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_string(v))
		return -EINVAL;
	return dup_json_str(v, max, out);
}

/* A string or null (*OUT = NULL); a missing key is an error. */
static int get_opt_str(const json_t *o, const char *key, size_t max, char **out)
{
	json_t *v = json_object_get(o, key);

	if (json_is_null(v)) {
		*out = NULL;
		return 0;
	}
	if (!json_is_string(v))
		return -EINVAL;
	return dup_json_str(v, max, out);
}

static int parse_cmdline(const json_t *v, char ***out)
{
	size_t n, i;
	char **argv;

	if (!json_is_array(v))
		return -EINVAL;
	n = json_array_size(v);
	if (n > RECORD_CMDLINE_MAX)
		return -EINVAL;
	/* Every element is checked before anything is allocated, so a
	 * failure leaves nothing half-built. */
	for (i = 0; i < n; i++)
		if (!json_is_string(json_array_get(v, i)))
			return -EINVAL;
	argv = calloc(n + 1, sizeof(*argv));
	if (!argv)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		if (dup_json_str(json_array_get(v, i), SIZE_MAX, &argv[i]) < 0) {
			while (i > 0)
				free(argv[--i]);
			free(argv);
			return -ENOMEM;
		}
	}
	*out = argv;
	return 0;
}

static int parse_holder(const json_t *o, struct lockfs_holder *h)
{
	json_int_t v;
	int rc;

	if (!json_is_object(o))
		return -EINVAL;
	if ((rc = get_int(o, "pid", 1, INT32_MAX, &v)) < 0)
		return rc;
	h->pid = (pid_t)v;
	/* ns_pid and container came later: a record without them (or with
	 * null) knows neither. */
	if (json_object_get(o, "ns_pid") && !json_is_null(json_object_get(o, "ns_pid"))) {
		if ((rc = get_int(o, "ns_pid", 1, INT32_MAX, &v)) < 0)
			return rc;
		h->ns_pid = (pid_t)v;
	}
	if (json_object_get(o, "container") &&
	    (rc = get_opt_str(o, "container", RECORD_CONTAINER_MAX, &h->container)) < 0)
		return rc;
	if ((rc = get_int(o, "start_time", 0, INT64_MAX, &v)) < 0)
		return rc;
	h->start_time = (unsigned long long)v;
	if ((rc = get_int(o, "uid", 0, UINT32_MAX, &v)) < 0)
		return rc;
	h->uid = (uid_t)v;
	if ((rc = get_int(o, "gid", 0, UINT32_MAX, &v)) < 0)
		return rc;
	h->gid = (gid_t)v;
	if ((rc = get_opt_str(o, "user", SIZE_MAX, &h->user)) < 0)
		return rc;
	if ((rc = get_str(o, "comm", SIZE_MAX, &h->comm)) < 0)
		return rc;
	if ((rc = parse_cmdline(json_object_get(o, "cmdline"), &h->cmdline)) < 0)
		return rc;
	if ((rc = get_str(o, "host", SIZE_MAX, &h->host)) < 0)
		return rc;
	return get_str(o, "boot_id", SIZE_MAX, &h->boot_id);
}

/*
 * A token is exactly LOCKFS_TOKEN_HEX lower-case hex digits.  Upper case is
 * refused: lockfs only ever writes lower case, and the engine compares
 * tokens as strings, so accepting "ABC..." would make two spellings of one
 * token compare unequal.
 */
static int parse_token(const json_t *o, char token[LOCKFS_TOKEN_HEX + 1])
{
	json_t *v = json_object_get(o, "token");
	const char *s;

	if (!json_is_string(v) || json_string_length(v) != LOCKFS_TOKEN_HEX)
		return -EINVAL;
	s = json_string_value(v);
	for (size_t i = 0; i < LOCKFS_TOKEN_HEX; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return -EINVAL;
	memcpy(token, s, LOCKFS_TOKEN_HEX);
	token[LOCKFS_TOKEN_HEX] = '\0';
	return 0;
}

static int parse_bound(const json_t *v, enum lockfs_bound *out)
{
	const char *b = json_string_value(v);

	if (!b)
		return -EINVAL;
	if (strcmp(b, "process") == 0)
		*out = LOCKFS_BOUND_PROCESS;
	else if (strcmp(b, "slug") == 0)
		*out = LOCKFS_BOUND_SLUG;
	else if (strcmp(b, "fd") == 0)
		*out = LOCKFS_BOUND_FD;
	else
		return -EINVAL;
	return 0;
}

/* An optional "fd_owner": a string shorter than LOCKFS_FD_OWNER_MAX. */
static int parse_fd_owner(const json_t *o, char out[LOCKFS_FD_OWNER_MAX])
{
	json_t *v = json_object_get(o, "fd_owner");

	out[0] = '\0';
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v) || json_string_length(v) == 0 ||
	    json_string_length(v) >= LOCKFS_FD_OWNER_MAX)
		return -EINVAL;
	memcpy(out, json_string_value(v), json_string_length(v) + 1);
	return 0;
}

/* An optional kernel number ("via_file", "ticket", "handed_by"): 1..INT64_MAX, 0 when
 * absent (records written before they were kept have none). */
static int parse_opt_id(const json_t *o, const char *key, uint64_t *out)
{
	json_int_t v;
	int rc;

	*out = 0;
	if (!json_object_get(o, key))
		return 0;
	rc = get_int(o, key, 1, INT64_MAX, &v);
	if (rc == 0)
		*out = (uint64_t)v;
	return rc;
}

/* "holders" of a shared record: element 0 repeats `holder`; the rest
 * are the other holders. */
static int parse_shares(const json_t *o, struct lockfs_record *r)
{
	json_t *a = json_object_get(o, "holders");
	size_t n;
	json_int_t v, v2;
	int rc;

	if (!a)
		return 0;
	if (!json_is_array(a) || json_array_size(a) < 1 || !r->has_holder ||
	    json_array_size(a) > LOCKFS_SHARED_MAX)
		return -EINVAL;
	n = json_array_size(a) - 1;
	/* holders[0] is `holder`: only its own grant is new here. */
	if (json_is_object(json_array_get(a, 0))) {
		const json_t *first = json_array_get(a, 0);

		if (get_int(first, "fence", 1, INT64_MAX, &v) == 0 &&
		    get_int(first, "acquired_at_ms", INT64_MIN, INT64_MAX, &v2) == 0) {
			r->holder_fence = (uint64_t)v;
			r->holder_acquired_at_ms = v2;
		}
	}
	if (n == 0)
		return 0;
	r->shares = calloc(n, sizeof(*r->shares));
	if (!r->shares)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const json_t *e = json_array_get(a, i + 1);
		struct lockfs_share *sh = &r->shares[i];

		r->nshares = i + 1; /* cleared by the caller on failure */
		if ((rc = parse_holder(e, &sh->holder)) < 0)
			return rc;
		if ((rc = parse_bound(json_object_get(e, "bound"), &sh->bound)) < 0)
			return rc;
		if (sh->bound == LOCKFS_BOUND_SLUG)
			return -EINVAL;
		if ((rc = parse_fd_owner(e, sh->fd_owner)) < 0)
			return rc;
		if ((sh->bound == LOCKFS_BOUND_FD) != (sh->fd_owner[0] != '\0'))
			return -EINVAL;
		if ((rc = parse_opt_id(e, "via_file", &sh->via_file)) < 0)
			return rc;
		if ((rc = get_fence(e, &v)) < 0)
			return rc;
		sh->fence = (uint64_t)v;
		if ((rc = get_int(e, "acquired_at_ms", INT64_MIN, INT64_MAX, &v)) < 0)
			return rc;
		sh->acquired_at_ms = v;
		/* Optional: shares stored before it was kept have none. */
		if (json_object_get(e, "slug") &&
		    (rc = get_opt_str(e, "slug", SIZE_MAX, &sh->slug)) < 0)
			return rc;
	}
	return 0;
}

/* The optional "holder_session", "holder_exited" and "descendants".
 * Records written before they existed have none: session unknown, holder
 * not known to have exited. */
static int parse_descendants(const json_t *o, struct lockfs_record *r)
{
	json_t *v = json_object_get(o, "holder_session"), *a;
	json_int_t n;
	int rc;

	if (v && (rc = get_int(o, "holder_session", 0, INT32_MAX, &n)) < 0)
		return rc;
	r->holder_session = v ? (pid_t)n : 0;
	v = json_object_get(o, "holder_exited");
	if (!v || json_is_false(v))
		return 0;
	if (!json_is_true(v))
		return -EINVAL;
	a = json_object_get(o, "descendants");
	if (!json_is_array(a) || json_array_size(a) > LOCKFS_DESCENDANTS_MAX)
		return -EINVAL;
	r->holder_exited = true;
	if (json_array_size(a) == 0)
		return 0;
	r->descendants = calloc(json_array_size(a), sizeof(*r->descendants));
	if (!r->descendants)
		return -ENOMEM;
	for (size_t i = 0; i < json_array_size(a); i++) {
		const json_t *e = json_array_get(a, i), *comm, *via;
		struct lockfs_descendant *d = &r->descendants[i];

		if (!json_is_object(e))
			return -EINVAL;
		if ((rc = get_int(e, "pid", 1, INT32_MAX, &n)) < 0)
			return rc;
		d->pid = (pid_t)n;
		if ((rc = get_int(e, "start_time", 0, INT64_MAX, &n)) < 0)
			return rc;
		d->start_time = (unsigned long long)n;
		/* Informative only: cut to what a comm can be. */
		comm = json_object_get(e, "comm");
		if (comm && !json_is_string(comm))
			return -EINVAL;
		if (comm)
			snprintf(d->comm, sizeof(d->comm), "%s", json_string_value(comm));
		/* Anything but a known proof counts as a mere candidate. */
		via = json_object_get(e, "via");
		d->candidate = !json_is_string(via) || strcmp(json_string_value(via), "tree") != 0;
		r->ndescendants = i + 1;
	}
	return 0;
}

static int parse_object(const json_t *o, struct lockfs_record *r)
{
	json_t *holder, *lease, *bound, *mode;
	json_int_t v;
	int rc;

	if (!json_is_object(o))
		return -EINVAL;
	if ((rc = get_str(o, "resource", SIZE_MAX, &r->resource)) < 0)
		return rc;
	/* Records written before "bound" existed were all process-bound. */
	bound = json_object_get(o, "bound");
	if (!bound)
		r->bound = LOCKFS_BOUND_PROCESS;
	else if ((rc = parse_bound(bound, &r->bound)) < 0)
		return rc;
	/* ... and before "mode", all exclusive. */
	mode = json_object_get(o, "mode");
	if (mode && (!json_is_string(mode) ||
		     (strcmp(json_string_value(mode), "exclusive") != 0 &&
		      strcmp(json_string_value(mode), "shared") != 0)))
		return -EINVAL;
	r->mode = mode && strcmp(json_string_value(mode), "shared") == 0 ? LOCKFS_SHARED
									 : LOCKFS_EXCLUSIVE;
	if ((rc = parse_fd_owner(o, r->fd_owner)) < 0)
		return rc;
	if ((r->bound == LOCKFS_BOUND_FD) != (r->fd_owner[0] != '\0'))
		return -EINVAL;
	if ((rc = parse_opt_id(o, "via_file", &r->via_file)) < 0 ||
	    (rc = parse_opt_id(o, "ticket", &r->ticket)) < 0 ||
	    (rc = parse_opt_id(o, "handed_by", &r->handed_by)) < 0)
		return rc;
	if (r->bound == LOCKFS_BOUND_SLUG && !json_is_string(json_object_get(o, "slug")))
		return -EINVAL;
	holder = json_object_get(o, "holder");
	if (!holder)
		return -EINVAL;
	if (!json_is_null(holder)) {
		r->has_holder = true;
		if ((rc = parse_holder(holder, &r->holder)) < 0)
			return rc;
	}
	/* The human-readable copy must be there, but the milliseconds are
	 * what counts. */
	if (!json_is_string(json_object_get(o, "acquired_at")))
		return -EINVAL;
	if ((rc = get_int(o, "acquired_at_ms", INT64_MIN, INT64_MAX, &v)) < 0)
		return rc;
	r->acquired_at_ms = v;
	if ((rc = get_opt_str(o, "operation", LOCKFS_OPERATION_MAX, &r->operation)) < 0)
		return rc;
	if ((rc = get_opt_str(o, "slug", SIZE_MAX, &r->slug)) < 0)
		return rc;
	lease = json_object_get(o, "lease");
	if (json_is_object(lease)) {
		if ((rc = get_int(lease, "ttl_s", 1, UINT32_MAX, &v)) < 0)
			return rc;
		r->lease.ttl_s = (uint32_t)v;
		if ((rc = get_int(lease, "deadline_boottime_ms", INT64_MIN, INT64_MAX, &v)) < 0)
			return rc;
		r->lease.deadline_boot_ms = v;
		if ((rc = get_int(lease, "expires_at_ms", INT64_MIN, INT64_MAX, &v)) < 0)
			return rc;
		r->lease.expires_at_ms = v;
	} else if (!json_is_null(lease)) {
		return -EINVAL;
	}
	if ((rc = get_fence(o, &v)) < 0)
		return rc;
	r->fence = (uint64_t)v;
	if (r->mode == LOCKFS_SHARED && (rc = parse_shares(o, r)) < 0)
		return rc;
	if ((rc = parse_descendants(o, r)) < 0)
		return rc;
	/* Unknown keys are ignored, for the same forward compatibility. */
	return parse_token(o, r->token);
}

int lockfs_record_parse(const char *buf, size_t len, struct lockfs_record *out)
{
	json_error_t jerr;
	json_t *root;
	int rc;

	memset(out, 0, sizeof(*out));
	/* Size first: never hand an attacker-sized buffer to the parser. */
	if (len > LOCKFS_RECORD_MAX)
		return -EFBIG;
	if (!buf)
		return -EINVAL;
	/* Without JSON_DECODE_ANY the top level must be an object or array;
	 * without JSON_ALLOW_NUL "\u0000" is refused, so strings stay C
	 * strings; trailing garbage after the value is refused. */
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return json_error_code(&jerr) == json_error_out_of_memory ? -ENOMEM : -EINVAL;
	rc = parse_object(root, out);
	json_decref(root);
	if (rc < 0)
		lockfs_record_clear(out);
	return rc;
}

int lockfs_record_peek_fence(const char *buf, size_t len, uint64_t *fence)
{
	json_error_t jerr;
	json_int_t v;
	json_t *root;
	int rc;

	if (len > LOCKFS_RECORD_MAX)
		return -EFBIG;
	if (!buf)
		return -EINVAL;
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return json_error_code(&jerr) == json_error_out_of_memory ? -ENOMEM : -EINVAL;
	rc = json_is_object(root) ? get_int(root, "fence", 1, INT64_MAX, &v) : -EINVAL;
	json_decref(root);
	if (rc == 0)
		*fence = (uint64_t)v;
	return rc;
}
