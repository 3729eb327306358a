/*
 * The gateway's encodings: keys and values in standard padded base64,
 * int64 as decimal strings, fields with a zero value left out, gRPC status
 * codes in error bodies.  See ../shared/docs/etcd-gateway.md.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char B64[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

json_t *lockfs_etcd_json_b64(const void *data, size_t len)
{
	const unsigned char *in = data;
	size_t n = 4 * ((len + 2) / 3), o = 0;
	char *buf = malloc(n + 1);
	json_t *j;

	if (!buf)
		return NULL;
	for (size_t i = 0; i < len; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16;

		if (i + 1 < len)
			v |= (uint32_t)in[i + 1] << 8;
		if (i + 2 < len)
			v |= in[i + 2];
		buf[o++] = B64[v >> 18 & 63];
		buf[o++] = B64[v >> 12 & 63];
		buf[o++] = i + 1 < len ? B64[v >> 6 & 63] : '=';
		buf[o++] = i + 2 < len ? B64[v & 63] : '=';
	}
	buf[o] = '\0';
	j = json_stringn(buf, o);
	free(buf);
	return j;
}

/* The value of base64 digit C, or -1. */
static int b64_digit(char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

int lockfs_etcd_b64_decode(const char *s, size_t slen, char **out, size_t *len)
{
	size_t pad = 0, o = 0;
	char *buf;

	*out = NULL;
	*len = 0;
	if (slen % 4)
		return -EPROTO;
	if (slen && s[slen - 1] == '=')
		pad = slen >= 2 && s[slen - 2] == '=' ? 2 : 1;
	buf = malloc(slen / 4 * 3 + 1);
	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < slen; i += 4) {
		bool last = i + 4 == slen;
		uint32_t v = 0;

		for (size_t k = 0; k < 4; k++) {
			int d = last && k >= 4 - pad ? 0 : b64_digit(s[i + k]);

			if (d < 0) {
				free(buf);
				return -EPROTO;
			}
			v = v << 6 | (uint32_t)d;
		}
		buf[o++] = (char)(v >> 16);
		if (!last || pad < 2)
			buf[o++] = (char)(v >> 8);
		if (!last || pad < 1)
			buf[o++] = (char)v;
	}
	buf[o] = '\0';
	*out = buf;
	*len = o;
	return 0;
}

json_t *lockfs_etcd_json_int64(int64_t v)
{
	return json_sprintf("%" PRId64, v);
}

/* Parse a decimal string (an optional '-' when SIGNED_OK).  0 or -EPROTO. */
static int parse_decimal(const char *s, bool signed_ok, int64_t *sv, uint64_t *uv)
{
	char *end;

	if (!*s || (*s == '-' && !signed_ok) || *s == '+' || *s == ' ')
		return -EPROTO;
	errno = 0;
	if (signed_ok)
		*sv = strtoll(s, &end, 10);
	else
		*uv = strtoull(s, &end, 10);
	if (errno || *end)
		return -EPROTO;
	return 0;
}

int lockfs_etcd_get_int64(const json_t *obj, const char *name, int64_t *v)
{
	const json_t *j = json_object_get(obj, name);

	*v = 0;
	if (!j || json_is_null(j))
		return 0;
	if (json_is_integer(j)) {
		*v = json_integer_value(j);
		return 0;
	}
	if (!json_is_string(j))
		return -EPROTO;
	return parse_decimal(json_string_value(j), true, v, NULL);
}

int lockfs_etcd_get_uint64(const json_t *obj, const char *name, uint64_t *v)
{
	const json_t *j = json_object_get(obj, name);

	*v = 0;
	if (!j || json_is_null(j))
		return 0;
	if (json_is_integer(j) && json_integer_value(j) >= 0) {
		*v = (uint64_t)json_integer_value(j);
		return 0;
	}
	if (!json_is_string(j))
		return -EPROTO;
	return parse_decimal(json_string_value(j), false, NULL, v);
}

bool lockfs_etcd_get_bool(const json_t *obj, const char *name)
{
	return json_is_true(json_object_get(obj, name));
}

/* Decode OBJ's base64 field NAME (missing: empty) into *OUT, *LEN. */
static int get_bytes(const json_t *obj, const char *name, char **out, size_t *len)
{
	const json_t *j = json_object_get(obj, name);

	if (!j || json_is_null(j))
		return lockfs_etcd_b64_decode("", 0, out, len);
	if (!json_is_string(j))
		return -EPROTO;
	return lockfs_etcd_b64_decode(json_string_value(j), json_string_length(j), out, len);
}

int lockfs_etcd_parse_kv(const json_t *j, struct lockfs_etcd_kv *kv)
{
	int rc;

	memset(kv, 0, sizeof(*kv));
	if (!json_is_object(j))
		return -EPROTO;
	rc = get_bytes(j, "key", &kv->key, &kv->key_len);
	if (!rc)
		rc = get_bytes(j, "value", &kv->value, &kv->value_len);
	if (!rc)
		rc = lockfs_etcd_get_int64(j, "create_revision", &kv->create_revision);
	if (!rc)
		rc = lockfs_etcd_get_int64(j, "mod_revision", &kv->mod_revision);
	if (!rc)
		rc = lockfs_etcd_get_int64(j, "version", &kv->version);
	if (!rc)
		rc = lockfs_etcd_get_int64(j, "lease", &kv->lease);
	if (rc)
		lockfs_etcd_kv_clear(kv);
	return rc;
}

void lockfs_etcd_kv_clear(struct lockfs_etcd_kv *kv)
{
	free(kv->key);
	free(kv->value);
	memset(kv, 0, sizeof(*kv));
}

int lockfs_etcd_parse_kvs(const json_t *arr, struct lockfs_etcd_kv **kvs, size_t *n)
{
	size_t count;

	*kvs = NULL;
	*n = 0;
	if (!arr || json_is_null(arr))
		return 0;
	if (!json_is_array(arr))
		return -EPROTO;
	count = json_array_size(arr);
	if (!count)
		return 0;
	*kvs = calloc(count, sizeof(**kvs));
	if (!*kvs)
		return -ENOMEM;
	for (size_t i = 0; i < count; i++) {
		int rc = lockfs_etcd_parse_kv(json_array_get(arr, i), &(*kvs)[i]);

		if (rc) {
			for (size_t k = 0; k < i; k++)
				lockfs_etcd_kv_clear(&(*kvs)[k]);
			free(*kvs);
			*kvs = NULL;
			return rc;
		}
	}
	*n = count;
	return 0;
}

int lockfs_etcd_set_range(json_t *obj, const char *key, const char *range_end, bool prefix)
{
	size_t klen;
	json_t *jkey, *jend = NULL;

	if (!key)
		return -EINVAL;
	klen = strlen(key);
	if (prefix && klen == 0) {
		/* Every key: etcd's "from \0 to the end". */
		jkey = lockfs_etcd_json_b64("", 1);
		jend = lockfs_etcd_json_b64("", 1);
	} else if (prefix) {
		char *end = malloc(klen);
		size_t n;

		if (!end)
			return -ENOMEM;
		n = lockfs_etcd_prefix_end(key, klen, end);
		jkey = lockfs_etcd_json_b64(key, klen);
		jend = n ? lockfs_etcd_json_b64(end, n) : lockfs_etcd_json_b64("", 1);
		free(end);
	} else {
		jkey = lockfs_etcd_json_b64(key, klen);
		if (range_end)
			jend = lockfs_etcd_json_b64(range_end,
						    *range_end ? strlen(range_end) : 1);
	}
	if (!jkey || ((prefix || range_end) && !jend)) {
		json_decref(jkey);
		json_decref(jend);
		return -ENOMEM;
	}
	if (json_object_set_new(obj, "key", jkey) ||
	    (jend && json_object_set_new(obj, "range_end", jend)))
		return -ENOMEM;
	return 0;
}

size_t lockfs_etcd_prefix_end(const char *prefix, size_t prefix_len, char *end)
{
	for (size_t i = prefix_len; i-- > 0;) {
		unsigned char b = (unsigned char)prefix[i];

		if (b < 0xff) {
			memcpy(end, prefix, i);
			end[i] = (char)(b + 1);
			return i + 1;
		}
	}
	return 0;
}

int lockfs_etcd_grpc_errno(int64_t code)
{
	switch (code) {
	case 0:  return 0;
	case 1:  return -ECANCELED;   /* CANCELLED */
	case 3:  return -EINVAL;      /* INVALID_ARGUMENT */
	case 4:  return -ETIMEDOUT;   /* DEADLINE_EXCEEDED */
	case 5:  return -ENOENT;      /* NOT_FOUND: "requested lease not found" */
	case 6:  return -EEXIST;      /* ALREADY_EXISTS */
	case 7:  return -EACCES;      /* PERMISSION_DENIED */
	case 8:  return -ENOSPC;      /* RESOURCE_EXHAUSTED */
	case 9:  return -EEXIST;      /* FAILED_PRECONDITION: "lease already exists" */
	case 10: return -EAGAIN;      /* ABORTED */
	case 11: return -ERANGE;      /* OUT_OF_RANGE: compacted / future revision */
	case 12: return -EOPNOTSUPP;  /* UNIMPLEMENTED */
	case 14: return -EAGAIN;      /* UNAVAILABLE: no leader, leader changed, timeout */
	case 16: return -EACCES;      /* UNAUTHENTICATED */
	default: return -EIO;         /* UNKNOWN, INTERNAL, DATA_LOSS, others */
	}
}
