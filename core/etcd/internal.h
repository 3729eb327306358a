/*
 * What the etcd client's files share (client.c, codec.c, kv.c, lease.c,
 * watch.c).  Not a public interface: include/lockfs/etcd_client.h is.
 */
#ifndef LOCKFS_ETCD_INTERNAL_H
#define LOCKFS_ETCD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>

#include "lockfs/etcd_client.h"

/* Largest answer (or watch line) we accept: -EPROTO beyond. */
#define LOCKFS_ETCD_BODY_MAX (64u << 20)

/* ---- client.c ---- */

/* Whether a call may be sent again, to another endpoint, after it may
 * have reached etcd: true for reads and for writes whose repetition is
 * harmless (keepalive, revoke). */
enum lockfs_etcd_resend { LOCKFS_ETCD_ONCE, LOCKFS_ETCD_RESEND };

/*
 * POST BODY to PATH ("/v3/kv/range") on the first endpoint that answers,
 * within the client's time bound (see docs/etcd.md "Failover").  Returns 0
 * and *OUT (a JSON object, the caller's reference) for HTTP 200, or the
 * negative errno of include/lockfs/etcd_client.h.
 */
int lockfs_etcd_post(struct lockfs_etcd *c, const char *path, json_t *body,
		     enum lockfs_etcd_resend resend, json_t **out);

/* Set what every handle of client C needs: TLS files, no signals, no
 * proxy, HTTP/1.1, TCP keepalive, our headers.  0 or -ENOMEM/-EIO. */
int lockfs_etcd_easy_setup(const struct lockfs_etcd *c, CURL *curl);

/* The endpoint to try first (the last that answered), and the verdict on
 * one that failed (the next call starts at the one after it). */
size_t lockfs_etcd_preferred(struct lockfs_etcd *c);
void lockfs_etcd_endpoint_failed(struct lockfs_etcd *c, size_t i);
void lockfs_etcd_endpoint_answered(struct lockfs_etcd *c, size_t i);
int lockfs_etcd_timeout_ms(const struct lockfs_etcd *c);

/* The errno for a libcurl failure; *SENT tells whether any of the
 * request left us (then a write may have been applied). */
int lockfs_etcd_curl_errno(CURL *curl, CURLcode res, const char *errbuf, bool *sent);

/* Of two failures, the one worth reporting (-ENOMEM over -EACCES over -ETIMEDOUT over
 * -EAGAIN over -EPROTO over -EIO). */
int lockfs_etcd_worse(int a, int b);

/* Milliseconds on CLOCK_MONOTONIC. */
int64_t lockfs_etcd_now_ms(void);

/* ---- codec.c ---- */

/* Standard base64 with padding, as a new JSON string (NULL: no memory). */
json_t *lockfs_etcd_json_b64(const void *data, size_t len);

/* Decode the standard padded base64 string S into a malloc'd buffer with
 * a NUL after its *LEN bytes.  0, -EPROTO for bad input, -ENOMEM. */
int lockfs_etcd_b64_decode(const char *s, size_t slen, char **out, size_t *len);

/* An int64 as the decimal JSON string etcd expects (NULL: no memory). */
json_t *lockfs_etcd_json_int64(int64_t v);

/* OBJ's field NAME as an int64 (a decimal string or a JSON integer;
 * missing or null: 0).  0 or -EPROTO. */
int lockfs_etcd_get_int64(const json_t *obj, const char *name, int64_t *v);
int lockfs_etcd_get_uint64(const json_t *obj, const char *name, uint64_t *v);

/* OBJ's field NAME as a bool (missing: false). */
bool lockfs_etcd_get_bool(const json_t *obj, const char *name);

/* Fill KV from the JSON kv object J (missing fields: zero, empty).
 * 0, -EPROTO, -ENOMEM; on error KV is left empty. */
int lockfs_etcd_parse_kv(const json_t *j, struct lockfs_etcd_kv *kv);
void lockfs_etcd_kv_clear(struct lockfs_etcd_kv *kv);

/* Parse the array of kvs ARR (NULL or missing: none) into *KVS, *N.
 * 0, -EPROTO, -ENOMEM. */
int lockfs_etcd_parse_kvs(const json_t *arr, struct lockfs_etcd_kv **kvs, size_t *n);

/* Add "key" (and "range_end") for OP-style selection to OBJ: KEY alone,
 * [KEY, RANGE_END) or, with PREFIX, every key starting with KEY.
 * 0, -EINVAL (KEY NULL), -ENOMEM. */
int lockfs_etcd_set_range(json_t *obj, const char *key, const char *range_end, bool prefix);

/* The errno for gRPC status CODE. */
int lockfs_etcd_grpc_errno(int64_t code);

/* ---- watch_line.c ---- */

/* One line of the watch stream. */
struct lockfs_etcd_line {
	int64_t revision;          /* header.revision */
	int64_t compact_revision;
	bool created, canceled;
	int64_t watch_id;          /* which watch of the stream (0 when absent) */
	struct lockfs_etcd_event *events;  /* owned; lockfs_etcd_events_free */
	size_t n_events;
};

/* Read TEXT (LEN bytes, one line) into *L with jansson.  0; -ECONNRESET
 * for etcd's {"error":...} line; -EPROTO, -ENOMEM (*L empty). */
int lockfs_etcd_line_json(const char *text, size_t len, struct lockfs_etcd_line *l);
/* The same without a JSON library, for a line of events and nothing
 * else: 1 and *L as lockfs_etcd_line_json would give it; 0 for any other
 * line (*L empty: read it with lockfs_etcd_line_json). */
int lockfs_etcd_line_fast(const char *text, size_t len, struct lockfs_etcd_line *l);
void lockfs_etcd_events_free(struct lockfs_etcd_event *ev, size_t n);

/* ---- websocket.c ---- */

/* A WebSocket to etcd's /v3/watch (see websocket.c). */
struct lockfs_etcd_ws;

/* Connect to endpoint I of C and upgrade, by DEADLINE_MS (monotonic).
 * 0 and *OUT, or the client's errors (-EPROTO: no WebSocket there). */
int lockfs_etcd_ws_open(struct lockfs_etcd *c, size_t i, int64_t deadline_ms,
			struct lockfs_etcd_ws **out);
void lockfs_etcd_ws_close(struct lockfs_etcd_ws *ws);
/* The socket, to poll for input. */
int lockfs_etcd_ws_fd(const struct lockfs_etcd_ws *ws);
/* Send one frame of OPCODE within TIMEOUT_MS.  0 or -errno. */
int lockfs_etcd_ws_send(struct lockfs_etcd_ws *ws, int opcode, const void *data, size_t len,
			int timeout_ms);
/* Send one text message / a ping.  0 or -errno. */
int lockfs_etcd_ws_text(struct lockfs_etcd_ws *ws, const char *text, size_t len);
int lockfs_etcd_ws_ping(struct lockfs_etcd_ws *ws);
/* The next whole message, without waiting: 1 and *DATA (NUL-terminated,
 * valid until the next call), *LEN; 0: none yet; -ECONNRESET (closed,
 * broken), -EPROTO, -ENOMEM.  Answers pings on the way. */
int lockfs_etcd_ws_recv(struct lockfs_etcd_ws *ws, char **data, size_t *len);
/* When bytes last came (monotonic ms; pongs count). */
int64_t lockfs_etcd_ws_last_byte(const struct lockfs_etcd_ws *ws);

#endif
