/*
 * Lease calls.  A keepalive is one POST (the gateway serves the streaming
 * RPC for one request); etcd answers a lease that is gone with HTTP 200
 * and no TTL, so a missing or zero TTL is what "lease lost" looks like.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* POST {"ID": ID} (plus EXTRA's fields, may be NULL) to PATH. */
static int lease_call(struct lockfs_etcd *c, const char *path, int64_t id, json_t *extra,
		      enum lockfs_etcd_resend resend, json_t **out)
{
	json_t *req = extra ? extra : json_object();
	int rc;

	*out = NULL;
	if (!req || json_object_set_new(req, "ID", lockfs_etcd_json_int64(id))) {
		json_decref(req);
		return -ENOMEM;
	}
	rc = lockfs_etcd_post(c, path, req, resend, out);
	json_decref(req);
	return rc;
}

int lockfs_etcd_lease_grant(struct lockfs_etcd *c, int64_t ttl_s, int64_t id,
			    int64_t *out_id, int64_t *out_ttl)
{
	json_t *req = json_object(), *resp;
	const json_t *err;
	int64_t ttl = 0;
	int rc;

	*out_id = 0;
	if (out_ttl)
		*out_ttl = 0;
	if (ttl_s <= 0 || id < 0) {
		json_decref(req);
		return -EINVAL;
	}
	if (!req || json_object_set_new(req, "TTL", lockfs_etcd_json_int64(ttl_s))) {
		json_decref(req);
		return -ENOMEM;
	}
	/* A retry could grant a second lease, which would only expire. */
	rc = lease_call(c, "/v3/lease/grant", id, req, LOCKFS_ETCD_ONCE, &resp);
	if (rc)
		return rc;
	err = json_object_get(resp, "error");
	if (json_is_string(err) && json_string_length(err))
		rc = -EIO;
	if (!rc)
		rc = lockfs_etcd_get_int64(resp, "ID", out_id);
	if (!rc)
		rc = lockfs_etcd_get_int64(resp, "TTL", &ttl);
	if (!rc && (*out_id <= 0 || ttl <= 0))
		rc = -EPROTO;
	json_decref(resp);
	if (rc)
		*out_id = 0;
	else if (out_ttl)
		*out_ttl = ttl;
	return rc;
}

int lockfs_etcd_lease_keepalive(struct lockfs_etcd *c, int64_t id, int64_t *ttl)
{
	json_t *resp;
	const json_t *result, *err;
	int64_t left = 0, code = 0;
	int rc;

	if (ttl)
		*ttl = 0;
	rc = lease_call(c, "/v3/lease/keepalive", id, NULL, LOCKFS_ETCD_RESEND, &resp);
	if (rc)
		return rc;
	result = json_object_get(resp, "result");
	err = json_object_get(resp, "error");
	if (json_is_object(result))
		rc = lockfs_etcd_get_int64(result, "TTL", &left);
	else if (json_is_object(err))  /* a stream's error: {"error":{"grpc_code":N,..}} */
		rc = lockfs_etcd_get_int64(err, "grpc_code", &code) ? -EPROTO
		     : lockfs_etcd_grpc_errno(code ? code : 2);
	else
		rc = -EPROTO;
	json_decref(resp);
	if (rc)
		return rc;
	if (left <= 0)
		return -ENOENT;
	if (ttl)
		*ttl = left;
	return 0;
}

int lockfs_etcd_lease_revoke(struct lockfs_etcd *c, int64_t id)
{
	json_t *resp;
	int rc = lease_call(c, "/v3/lease/revoke", id, NULL, LOCKFS_ETCD_RESEND, &resp);

	json_decref(resp);
	return rc;
}

int lockfs_etcd_lease_timetolive(struct lockfs_etcd *c, int64_t id, bool want_keys,
				 struct lockfs_etcd_lease_info *info)
{
	json_t *req = json_object(), *resp;
	const json_t *keys;
	int rc;

	memset(info, 0, sizeof(*info));
	if (!req || (want_keys && json_object_set_new(req, "keys", json_true()))) {
		json_decref(req);
		return -ENOMEM;
	}
	rc = lease_call(c, "/v3/lease/timetolive", id, req, LOCKFS_ETCD_RESEND, &resp);
	if (rc)
		return rc;
	rc = lockfs_etcd_get_int64(resp, "TTL", &info->ttl);
	if (!rc)
		rc = lockfs_etcd_get_int64(resp, "grantedTTL", &info->granted_ttl);
	/* etcd says TTL -1 for a lease it does not know. */
	if (!rc && info->ttl < 0)
		rc = -ENOENT;
	keys = json_object_get(resp, "keys");
	if (!rc && want_keys) {
		size_t n = json_array_size(keys);

		info->keys = calloc(n + 1, sizeof(*info->keys));
		if (!info->keys)
			rc = -ENOMEM;
		for (size_t i = 0; !rc && i < n; i++) {
			const json_t *k = json_array_get(keys, i);
			size_t len;

			rc = json_is_string(k)
			     ? lockfs_etcd_b64_decode(json_string_value(k), json_string_length(k),
						      &info->keys[i], &len)
			     : -EPROTO;
			if (!rc)
				info->n_keys = i + 1;
		}
	}
	json_decref(resp);
	if (rc)
		lockfs_etcd_lease_info_free(info);
	return rc;
}

void lockfs_etcd_lease_info_free(struct lockfs_etcd_lease_info *info)
{
	if (!info)
		return;
	for (size_t i = 0; i < info->n_keys; i++)
		free(info->keys[i]);
	free(info->keys);
	memset(info, 0, sizeof(*info));
}
