/*
 * A WebSocket (RFC 6455) client connection to etcd's JSON gateway, for
 * the watch set (wset.c).  etcd 3.4's gateway serves /v3/watch, a
 * bidirectional stream, over a WebSocket: each text frame we send carries
 * one WatchRequest, each frame it sends one WatchResponse.  Over a plain
 * HTTP/1.1 POST the gateway answers nothing until the request body ends,
 * so one POST carries one watch; a WebSocket carries any number of them,
 * created and cancelled while the stream lives.
 *
 * libcurl 7.88 (Debian 12) has no WebSocket support, so libcurl only
 * connects (CURLOPT_CONNECT_ONLY: TCP, and TLS for https endpoints, with
 * the client's TLS files) and this file speaks the upgrade and the framing
 * over curl_easy_send / curl_easy_recv.  Client frames are masked, as the
 * RFC requires; the server's are not.  Fragmented messages are joined;
 * pings are answered.  The server's Sec-WebSocket-Accept is not checked
 * (it proves only that the server speaks WebSocket, which its 101 says).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "internal.h"

#define WS_OP_CONT 0x0
#define WS_OP_TEXT 0x1
#define WS_OP_BIN 0x2
#define WS_OP_CLOSE 0x8
#define WS_OP_PING 0x9
#define WS_OP_PONG 0xA

struct lockfs_etcd_ws {
	CURL *curl;
	curl_socket_t fd;
	char errbuf[CURL_ERROR_SIZE];
	char *in;                /* bytes received, not yet a whole frame */
	size_t in_len, in_cap;
	char *msg;               /* a fragmented message being joined */
	size_t msg_len, msg_cap;
	int msg_op;              /* its opcode; -1: none */
	int64_t last_byte_ms;    /* monotonic: when bytes last came */
};

int64_t lockfs_etcd_ws_last_byte(const struct lockfs_etcd_ws *ws)
{
	return ws->last_byte_ms;
}

int lockfs_etcd_ws_fd(const struct lockfs_etcd_ws *ws)
{
	return (int)ws->fd;
}

void lockfs_etcd_ws_close(struct lockfs_etcd_ws *ws)
{
	if (!ws)
		return;
	if (ws->curl)
		curl_easy_cleanup(ws->curl);
	free(ws->in);
	free(ws->msg);
	free(ws);
}

static int grow(char **buf, size_t *cap, size_t need)
{
	size_t c = *cap ? *cap : 4096;
	char *g;

	if (need <= *cap)
		return 0;
	while (c < need)
		c *= 2;
	if (c > LOCKFS_ETCD_BODY_MAX + 64)
		return -EPROTO;
	g = realloc(*buf, c);
	if (!g)
		return -ENOMEM;
	*buf = g;
	*cap = c;
	return 0;
}

/* Wait until FD is ready for EVENTS, at most until DEADLINE_MS (monotonic).
 * 0, -ETIMEDOUT. */
static int wait_fd(curl_socket_t fd, short events, int64_t deadline_ms)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		int64_t left = deadline_ms - lockfs_etcd_now_ms();
		int n;

		if (left <= 0)
			return -ETIMEDOUT;
		n = poll(&p, 1, (int)left);
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -EIO;
	}
}

/* Send all LEN bytes of DATA by DEADLINE_MS.  0 or -errno. */
static int send_all(struct lockfs_etcd_ws *ws, const char *data, size_t len, int64_t deadline_ms)
{
	while (len) {
		size_t sent = 0;
		CURLcode r = curl_easy_send(ws->curl, data, len, &sent);

		if (r == CURLE_AGAIN) {
			int rc = wait_fd(ws->fd, POLLOUT, deadline_ms);

			if (rc)
				return rc;
			continue;
		}
		if (r != CURLE_OK)
			return -ECONNRESET;
		data += sent;
		len -= sent;
	}
	return 0;
}

/* Read what is there into ws->in without waiting.  1: some bytes came;
 * 0: none now; -ECONNRESET: the peer closed or the connection broke. */
static int read_some(struct lockfs_etcd_ws *ws)
{
	int rc = grow(&ws->in, &ws->in_cap, ws->in_len + 16384);
	size_t got = 0;
	CURLcode r;

	if (rc)
		return rc;
	r = curl_easy_recv(ws->curl, ws->in + ws->in_len, ws->in_cap - ws->in_len, &got);
	if (r == CURLE_AGAIN)
		return 0;
	if (r != CURLE_OK || got == 0)
		return -ECONNRESET;
	ws->in_len += got;
	ws->last_byte_ms = lockfs_etcd_now_ms();
	return 1;
}

int lockfs_etcd_ws_send(struct lockfs_etcd_ws *ws, int opcode, const void *data, size_t len,
			int timeout_ms)
{
	unsigned char hdr[14], mask[4];
	size_t h = 0;
	char *frame;
	int rc;

	if (getrandom(mask, sizeof(mask), 0) != (ssize_t)sizeof(mask))
		memset(mask, 0x5a, sizeof(mask));  /* the mask hides nothing from etcd */
	hdr[h++] = (unsigned char)(0x80 | (opcode & 0x0f));
	if (len < 126) {
		hdr[h++] = (unsigned char)(0x80 | len);
	} else if (len <= 0xffff) {
		hdr[h++] = 0x80 | 126;
		hdr[h++] = (unsigned char)(len >> 8);
		hdr[h++] = (unsigned char)len;
	} else {
		hdr[h++] = 0x80 | 127;
		for (int i = 7; i >= 0; i--)
			hdr[h++] = (unsigned char)((uint64_t)len >> (8 * i));
	}
	memcpy(hdr + h, mask, 4);
	h += 4;
	frame = malloc(h + len);
	if (!frame)
		return -ENOMEM;
	memcpy(frame, hdr, h);
	for (size_t i = 0; i < len; i++)
		frame[h + i] = (char)(((const unsigned char *)data)[i] ^ mask[i % 4]);
	rc = send_all(ws, frame, h + len, lockfs_etcd_now_ms() + timeout_ms);
	free(frame);
	return rc;
}

/* One whole frame at the start of ws->in: 1 and its parts; 0: not yet;
 * -EPROTO. */
static int parse_frame(struct lockfs_etcd_ws *ws, bool *fin, int *op, size_t *off, size_t *plen)
{
	const unsigned char *b = (const unsigned char *)ws->in;
	size_t h = 2;
	uint64_t len;
	bool masked;

	if (ws->in_len < 2)
		return 0;
	*fin = b[0] & 0x80;
	*op = b[0] & 0x0f;
	masked = b[1] & 0x80;
	len = b[1] & 0x7f;
	if (len == 126) {
		if (ws->in_len < 4)
			return 0;
		len = (uint64_t)b[2] << 8 | b[3];
		h = 4;
	} else if (len == 127) {
		if (ws->in_len < 10)
			return 0;
		len = 0;
		for (int i = 0; i < 8; i++)
			len = len << 8 | b[2 + i];
		h = 10;
	}
	if (len > LOCKFS_ETCD_BODY_MAX)
		return -EPROTO;
	if (masked)
		h += 4;
	if (ws->in_len < h + len)
		return 0;
	if (masked)  /* a server must not mask; unmask all the same */
		for (size_t i = 0; i < len; i++)
			ws->in[h + i] ^= ws->in[h - 4 + i % 4];
	*off = h;
	*plen = (size_t)len;
	return 1;
}

int lockfs_etcd_ws_recv(struct lockfs_etcd_ws *ws, char **data, size_t *len)
{
	for (;;) {
		bool fin;
		int op, rc;
		size_t off, plen;

		rc = parse_frame(ws, &fin, &op, &off, &plen);
		if (rc < 0)
			return rc;
		if (rc == 0) {
			rc = read_some(ws);
			if (rc <= 0)
				return rc;
			continue;
		}
		rc = 0;
		if (op == WS_OP_PING) {
			rc = lockfs_etcd_ws_send(ws, WS_OP_PONG, ws->in + off, plen, 1000);
		} else if (op == WS_OP_CLOSE) {
			rc = -ECONNRESET;
		} else if (op == WS_OP_TEXT || op == WS_OP_BIN || op == WS_OP_CONT) {
			if (op != WS_OP_CONT)
				ws->msg_len = 0;
			rc = grow(&ws->msg, &ws->msg_cap, ws->msg_len + plen + 1);
			if (!rc) {
				memcpy(ws->msg + ws->msg_len, ws->in + off, plen);
				ws->msg_len += plen;
				ws->msg[ws->msg_len] = '\0';
			}
		}
		/* PONG and unknown control frames: nothing to do. */
		memmove(ws->in, ws->in + off + plen, ws->in_len - off - plen);
		ws->in_len -= off + plen;
		if (rc)
			return rc;
		if (fin && (op == WS_OP_TEXT || op == WS_OP_BIN || op == WS_OP_CONT)) {
			*data = ws->msg;
			*len = ws->msg_len;
			ws->msg_len = 0;
			return 1;
		}
	}
}

/* The host[:port] part of URL, into BUF. */
static void url_host(const char *url, char *buf, size_t size)
{
	const char *p = strstr(url, "://");
	size_t n;

	p = p ? p + 3 : url;
	n = strcspn(p, "/");
	snprintf(buf, size, "%.*s", (int)n, p);
}

int lockfs_etcd_ws_open(struct lockfs_etcd *c, size_t i, int64_t deadline_ms,
			struct lockfs_etcd_ws **out)
{
	struct lockfs_etcd_ws *ws = calloc(1, sizeof(*ws));
	const char *base = lockfs_etcd_endpoint(c, i);
	char url[2048], host[512], req[1024], keyb64[32];
	unsigned char key[16];
	int64_t left = deadline_ms - lockfs_etcd_now_ms();
	curl_socket_t sock = CURL_SOCKET_BAD;
	CURLcode r;
	int rc;

	*out = NULL;
	if (!ws)
		return -ENOMEM;
	ws->msg_op = -1;
	if (left <= 0) {
		free(ws);
		return -ETIMEDOUT;
	}
	ws->curl = curl_easy_init();
	if (!ws->curl || lockfs_etcd_easy_setup(c, ws->curl)) {
		lockfs_etcd_ws_close(ws);
		return -ENOMEM;
	}
	snprintf(url, sizeof(url), "%s/v3/watch", base);
	curl_easy_setopt(ws->curl, CURLOPT_URL, url);
	curl_easy_setopt(ws->curl, CURLOPT_HTTPGET, 1L);
	curl_easy_setopt(ws->curl, CURLOPT_CONNECT_ONLY, 1L);
	curl_easy_setopt(ws->curl, CURLOPT_CONNECTTIMEOUT_MS, left);
	curl_easy_setopt(ws->curl, CURLOPT_ERRORBUFFER, ws->errbuf);
	r = curl_easy_perform(ws->curl);
	if (r != CURLE_OK) {
		bool sent;

		rc = lockfs_etcd_curl_errno(ws->curl, r, ws->errbuf, &sent);
		lockfs_etcd_ws_close(ws);
		return rc ? rc : -EIO;
	}
	if (curl_easy_getinfo(ws->curl, CURLINFO_ACTIVESOCKET, &sock) != CURLE_OK ||
	    sock == CURL_SOCKET_BAD) {
		lockfs_etcd_ws_close(ws);
		return -EIO;
	}
	ws->fd = sock;
	if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key))
		memset(key, 0x42, sizeof(key));
	{
		static const char b64[] =
			"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
		size_t o = 0;

		for (size_t k = 0; k < 15; k += 3) {
			uint32_t v = (uint32_t)key[k] << 16 | (uint32_t)key[k + 1] << 8 | key[k + 2];

			keyb64[o++] = b64[v >> 18 & 63];
			keyb64[o++] = b64[v >> 12 & 63];
			keyb64[o++] = b64[v >> 6 & 63];
			keyb64[o++] = b64[v & 63];
		}
		keyb64[o++] = b64[key[15] >> 2];
		keyb64[o++] = b64[(key[15] & 3) << 4];
		keyb64[o++] = '=';
		keyb64[o++] = '=';
		keyb64[o] = '\0';
	}
	url_host(base, host, sizeof(host));
	snprintf(req, sizeof(req),
		 "GET /v3/watch HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\n"
		 "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n",
		 host, keyb64);
	rc = send_all(ws, req, strlen(req), deadline_ms);
	/* The answer's head: "HTTP/1.1 101 ..." up to an empty line; what
	 * follows it is already the stream. */
	while (!rc) {
		char *end;

		end = ws->in_len ? memmem(ws->in, ws->in_len, "\r\n\r\n", 4) : NULL;
		if (end) {
			size_t head = (size_t)(end - ws->in) + 4;

			if (strncmp(ws->in, "HTTP/1.1 101", 12) != 0 &&
			    strncmp(ws->in, "HTTP/1.0 101", 12) != 0)
				rc = -EPROTO;  /* not etcd's gateway, or no WebSocket */
			memmove(ws->in, ws->in + head, ws->in_len - head);
			ws->in_len -= head;
			break;
		}
		if (ws->in_len > 16384) {
			rc = -EPROTO;
			break;
		}
		rc = read_some(ws);
		if (rc == 0)
			rc = wait_fd(ws->fd, POLLIN, deadline_ms);
		else if (rc > 0)
			rc = 0;
	}
	if (rc) {
		lockfs_etcd_ws_close(ws);
		return rc;
	}
	*out = ws;
	return 0;
}

int lockfs_etcd_ws_ping(struct lockfs_etcd_ws *ws)
{
	return lockfs_etcd_ws_send(ws, WS_OP_PING, "p", 1, 1000);
}

int lockfs_etcd_ws_text(struct lockfs_etcd_ws *ws, const char *text, size_t len)
{
	return lockfs_etcd_ws_send(ws, WS_OP_TEXT, text, len, 1000);
}
