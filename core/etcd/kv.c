/*
 * Key-value calls: range, put, delete, txn, compaction, and the cluster
 * status.  Requests are built as JSON from struct lockfs_etcd_op, answers
 * parsed into struct lockfs_etcd_op_resp.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *const SORT_ORDER[] = { "NONE", "ASCEND", "DESCEND" };
static const char *const SORT_TARGET[] = { "KEY", "VERSION", "CREATE", "MOD", "VALUE" };
static const char *const TARGET[] = { "VERSION", "CREATE", "MOD", "VALUE", "LEASE" };
static const char *const CMP[] = { "EQUAL", "GREATER", "LESS", "NOT_EQUAL" };

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* OBJ[NAME] = V as a decimal string, unless V is 0 (etcd's default). */
static int set_int64(json_t *obj, const char *name, int64_t v)
{
	return v && json_object_set_new(obj, name, lockfs_etcd_json_int64(v)) ? -ENOMEM : 0;
}

static int set_true(json_t *obj, const char *name, bool v)
{
	return v && json_object_set_new(obj, name, json_true()) ? -ENOMEM : 0;
}

/* The JSON request for OP (a RangeRequest, PutRequest or
 * DeleteRangeRequest).  0 and *OUT, -EINVAL, -ENOMEM. */
static int op_json(const struct lockfs_etcd_op *op, json_t **out)
{
	json_t *j = json_object();
	int rc;

	*out = NULL;
	if (!j)
		return -ENOMEM;
	switch (op->type) {
	case LOCKFS_ETCD_RANGE:
		if ((unsigned)op->sort_order >= COUNT(SORT_ORDER) ||
		    (unsigned)op->sort_target >= COUNT(SORT_TARGET)) {
			rc = -EINVAL;
			break;
		}
		rc = lockfs_etcd_set_range(j, op->key, op->range_end, op->prefix);
		if (!rc)
			rc = set_int64(j, "revision", op->revision);
		if (!rc)
			rc = set_int64(j, "limit", op->limit);
		if (!rc)
			rc = set_int64(j, "max_create_revision", op->max_create_revision);
		if (!rc && op->sort_order != LOCKFS_ETCD_SORT_NONE &&
		    (json_object_set_new(j, "sort_order", json_string(SORT_ORDER[op->sort_order])) ||
		     json_object_set_new(j, "sort_target", json_string(SORT_TARGET[op->sort_target]))))
			rc = -ENOMEM;
		if (!rc)
			rc = set_true(j, "keys_only", op->keys_only);
		if (!rc)
			rc = set_true(j, "count_only", op->count_only);
		break;
	case LOCKFS_ETCD_PUT:
		if (!op->key || (!op->value && op->value_len)) {
			rc = -EINVAL;
			break;
		}
		rc = lockfs_etcd_set_range(j, op->key, NULL, false);
		if (!rc && json_object_set_new(j, "value",
					       lockfs_etcd_json_b64(op->value ? op->value : "",
								    op->value_len)))
			rc = -ENOMEM;
		if (!rc)
			rc = set_int64(j, "lease", op->lease);
		if (!rc)
			rc = set_true(j, "prev_kv", op->prev_kv);
		break;
	case LOCKFS_ETCD_DELETE:
		rc = lockfs_etcd_set_range(j, op->key, op->range_end, op->prefix);
		if (!rc)
			rc = set_true(j, "prev_kv", op->prev_kv);
		break;
	default:
		rc = -EINVAL;
	}
	if (rc) {
		json_decref(j);
		return rc;
	}
	*out = j;
	return 0;
}

/* Parse J, the answer to an operation of TYPE, into *R.  0, -EPROTO,
 * -ENOMEM; *R is empty on error. */
static int op_resp_parse(const json_t *j, enum lockfs_etcd_op_type type,
			 struct lockfs_etcd_op_resp *r)
{
	int rc;

	memset(r, 0, sizeof(*r));
	r->type = type;
	if (!json_is_object(j))
		return -EPROTO;
	rc = lockfs_etcd_get_int64(json_object_get(j, "header"), "revision", &r->revision);
	if (rc)
		return rc;
	switch (type) {
	case LOCKFS_ETCD_RANGE:
		rc = lockfs_etcd_get_int64(j, "count", &r->count);
		r->more = lockfs_etcd_get_bool(j, "more");
		if (!rc)
			rc = lockfs_etcd_parse_kvs(json_object_get(j, "kvs"), &r->kvs, &r->n_kvs);
		break;
	case LOCKFS_ETCD_PUT: {
		const json_t *prev = json_object_get(j, "prev_kv");

		if (!prev)
			break;
		r->kvs = calloc(1, sizeof(*r->kvs));
		if (!r->kvs)
			return -ENOMEM;
		rc = lockfs_etcd_parse_kv(prev, r->kvs);
		if (rc) {
			free(r->kvs);
			r->kvs = NULL;
		} else {
			r->n_kvs = 1;
		}
		break;
	}
	case LOCKFS_ETCD_DELETE:
		rc = lockfs_etcd_get_int64(j, "deleted", &r->count);
		if (!rc)
			rc = lockfs_etcd_parse_kvs(json_object_get(j, "prev_kvs"), &r->kvs, &r->n_kvs);
		break;
	}
	return rc;
}

void lockfs_etcd_op_resp_free(struct lockfs_etcd_op_resp *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n_kvs; i++)
		lockfs_etcd_kv_clear(&r->kvs[i]);
	free(r->kvs);
	memset(r, 0, sizeof(*r));
}

void lockfs_etcd_txn_resp_free(struct lockfs_etcd_txn_resp *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n_ops; i++)
		lockfs_etcd_op_resp_free(&r->ops[i]);
	free(r->ops);
	memset(r, 0, sizeof(*r));
}

/* One call of a single operation OP of type TYPE to PATH. */
static int single(struct lockfs_etcd *c, const char *path, enum lockfs_etcd_op_type type,
		  enum lockfs_etcd_resend resend, const struct lockfs_etcd_op *op,
		  struct lockfs_etcd_op_resp *out)
{
	struct lockfs_etcd_op_resp ignored;
	json_t *req, *resp;
	int rc;

	if (!out)
		out = &ignored;
	memset(out, 0, sizeof(*out));
	if (!op || op->type != type)
		return -EINVAL;
	rc = op_json(op, &req);
	if (rc)
		return rc;
	rc = lockfs_etcd_post(c, path, req, resend, &resp);
	json_decref(req);
	if (rc)
		return rc;
	rc = op_resp_parse(resp, type, out);
	json_decref(resp);
	if (out == &ignored)
		lockfs_etcd_op_resp_free(&ignored);
	return rc;
}

int lockfs_etcd_range(struct lockfs_etcd *c, const struct lockfs_etcd_op *op,
		      struct lockfs_etcd_op_resp *out)
{
	if (!out)
		return -EINVAL;
	return single(c, "/v3/kv/range", LOCKFS_ETCD_RANGE, LOCKFS_ETCD_RESEND, op, out);
}

int lockfs_etcd_put(struct lockfs_etcd *c, const struct lockfs_etcd_op *op,
		    struct lockfs_etcd_op_resp *out)
{
	return single(c, "/v3/kv/put", LOCKFS_ETCD_PUT, LOCKFS_ETCD_ONCE, op, out);
}

int lockfs_etcd_delete(struct lockfs_etcd *c, const struct lockfs_etcd_op *op,
		       struct lockfs_etcd_op_resp *out)
{
	return single(c, "/v3/kv/deleterange", LOCKFS_ETCD_DELETE, LOCKFS_ETCD_ONCE, op, out);
}

/* The JSON Compare for CMP.  0 and *OUT, -EINVAL, -ENOMEM. */
static int compare_json(const struct lockfs_etcd_compare *cmp, json_t **out)
{
	static const char *const FIELD[] = {
		"version", "create_revision", "mod_revision", NULL, "lease"
	};
	json_t *j;
	int rc;

	*out = NULL;
	if (!cmp->key || (unsigned)cmp->target >= COUNT(TARGET) ||
	    (unsigned)cmp->result >= COUNT(CMP) ||
	    (cmp->target == LOCKFS_ETCD_VALUE && !cmp->value && cmp->value_len))
		return -EINVAL;
	j = json_object();
	if (!j)
		return -ENOMEM;
	rc = lockfs_etcd_set_range(j, cmp->key, cmp->range_end, false);
	if (!rc && (json_object_set_new(j, "target", json_string(TARGET[cmp->target])) ||
		    json_object_set_new(j, "result", json_string(CMP[cmp->result]))))
		rc = -ENOMEM;
	/* Always sent, zero too: the comparison needs its operand. */
	if (!rc && cmp->target == LOCKFS_ETCD_VALUE &&
	    json_object_set_new(j, "value",
				lockfs_etcd_json_b64(cmp->value ? cmp->value : "", cmp->value_len)))
		rc = -ENOMEM;
	if (!rc && cmp->target != LOCKFS_ETCD_VALUE &&
	    json_object_set_new(j, FIELD[cmp->target], lockfs_etcd_json_int64(cmp->number)))
		rc = -ENOMEM;
	if (rc) {
		json_decref(j);
		return rc;
	}
	*out = j;
	return 0;
}

/* Append N operations OPS to a new array *OUT, each wrapped as a RequestOp. */
static int ops_json(const struct lockfs_etcd_op *ops, size_t n, json_t **out)
{
	static const char *const WRAP[] = { "request_range", "request_put", "request_delete_range" };
	json_t *arr = json_array();

	*out = NULL;
	if (!arr)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *op, *wrap;
		int rc = (unsigned)ops[i].type < COUNT(WRAP) ? op_json(&ops[i], &op) : -EINVAL;

		if (rc) {
			json_decref(arr);
			return rc;
		}
		wrap = json_object();
		if (!wrap || json_object_set_new(wrap, WRAP[ops[i].type], op) ||
		    json_array_append_new(arr, wrap)) {
			if (!wrap)
				json_decref(op);
			json_decref(arr);
			return -ENOMEM;
		}
	}
	*out = arr;
	return 0;
}

static int txn_json(const struct lockfs_etcd_txn *txn, json_t **out)
{
	json_t *j = json_object(), *cmps = json_array(), *success = NULL, *failure = NULL;
	int rc = j && cmps ? 0 : -ENOMEM;

	for (size_t i = 0; !rc && i < txn->n_compare; i++) {
		json_t *cmp;

		rc = compare_json(&txn->compare[i], &cmp);
		if (!rc && json_array_append_new(cmps, cmp))
			rc = -ENOMEM;
	}
	if (!rc)
		rc = ops_json(txn->success, txn->n_success, &success);
	if (!rc)
		rc = ops_json(txn->failure, txn->n_failure, &failure);
	if (!rc && (json_object_set(j, "compare", cmps) ||
		    json_object_set(j, "success", success) ||
		    json_object_set(j, "failure", failure)))
		rc = -ENOMEM;
	json_decref(cmps);
	json_decref(success);
	json_decref(failure);
	if (rc) {
		json_decref(j);
		return rc;
	}
	*out = j;
	return 0;
}

/* Parse one ResponseOp ({"response_range": {...}} etc.) into *R. */
static int response_op_parse(const json_t *j, struct lockfs_etcd_op_resp *r)
{
	static const char *const WRAP[] = { "response_range", "response_put", "response_delete_range" };

	memset(r, 0, sizeof(*r));
	for (size_t t = 0; t < COUNT(WRAP); t++) {
		const json_t *inner = json_object_get(j, WRAP[t]);

		if (inner)
			return op_resp_parse(inner, (enum lockfs_etcd_op_type)t, r);
	}
	return -EPROTO;  /* a txn inside a txn: we never send one */
}

static int txn_resp_parse(const json_t *j, struct lockfs_etcd_txn_resp *r)
{
	const json_t *arr = json_object_get(j, "responses");
	size_t n = json_array_size(arr);
	int rc;

	rc = lockfs_etcd_get_int64(json_object_get(j, "header"), "revision", &r->revision);
	if (rc)
		return rc;
	r->succeeded = lockfs_etcd_get_bool(j, "succeeded");
	if (arr && !json_is_array(arr))
		return -EPROTO;
	if (!n)
		return 0;
	r->ops = calloc(n, sizeof(*r->ops));
	if (!r->ops)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		rc = response_op_parse(json_array_get(arr, i), &r->ops[i]);
		if (rc)
			return rc;
		r->n_ops = i + 1;
	}
	return 0;
}

static int txn_post(struct lockfs_etcd *c, const struct lockfs_etcd_txn *txn,
		    enum lockfs_etcd_resend resend, struct lockfs_etcd_txn_resp *out);

int lockfs_etcd_txn(struct lockfs_etcd *c, const struct lockfs_etcd_txn *txn,
		    struct lockfs_etcd_txn_resp *out)
{
	return txn_post(c, txn, LOCKFS_ETCD_ONCE, out);
}

int lockfs_etcd_txn_resendable(struct lockfs_etcd *c, const struct lockfs_etcd_txn *txn,
			       struct lockfs_etcd_txn_resp *out)
{
	return txn_post(c, txn, LOCKFS_ETCD_RESEND, out);
}

static int txn_post(struct lockfs_etcd *c, const struct lockfs_etcd_txn *txn,
		    enum lockfs_etcd_resend resend, struct lockfs_etcd_txn_resp *out)
{
	json_t *req, *resp;
	int rc;

	if (!out)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	if (!txn || (txn->n_compare && !txn->compare) || (txn->n_success && !txn->success) ||
	    (txn->n_failure && !txn->failure))
		return -EINVAL;
	rc = txn_json(txn, &req);
	if (rc)
		return rc;
	rc = lockfs_etcd_post(c, "/v3/kv/txn", req, resend, &resp);
	json_decref(req);
	if (rc)
		return rc;
	rc = txn_resp_parse(resp, out);
	json_decref(resp);
	if (rc)
		lockfs_etcd_txn_resp_free(out);
	return rc;
}

int lockfs_etcd_compact(struct lockfs_etcd *c, int64_t revision)
{
	json_t *req = json_object(), *resp;
	int rc;

	if (!req || json_object_set_new(req, "revision", lockfs_etcd_json_int64(revision))) {
		json_decref(req);
		return -ENOMEM;
	}
	rc = lockfs_etcd_post(c, "/v3/kv/compaction", req, LOCKFS_ETCD_ONCE, &resp);
	json_decref(req);
	if (!rc)
		json_decref(resp);
	return rc;
}

int lockfs_etcd_status(struct lockfs_etcd *c, struct lockfs_etcd_status *out)
{
	json_t *req = json_object(), *resp;
	const json_t *header, *version;
	int rc;

	memset(out, 0, sizeof(*out));
	if (!req)
		return -ENOMEM;
	rc = lockfs_etcd_post(c, "/v3/maintenance/status", req, LOCKFS_ETCD_RESEND, &resp);
	json_decref(req);
	if (rc)
		return rc;
	header = json_object_get(resp, "header");
	version = json_object_get(resp, "version");
	if (json_is_string(version))
		snprintf(out->version, sizeof(out->version), "%s", json_string_value(version));
	rc = lockfs_etcd_get_uint64(header, "member_id", &out->member_id);
	if (!rc)
		rc = lockfs_etcd_get_int64(header, "revision", &out->revision);
	if (!rc)
		rc = lockfs_etcd_get_int64(header, "raft_term", &out->raft_term);
	if (!rc)
		rc = lockfs_etcd_get_uint64(resp, "leader", &out->leader);
	json_decref(resp);
	return rc;
}
