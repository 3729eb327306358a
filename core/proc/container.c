/*
 * The container a process runs in, as its cgroup path names it, seen
 * from the daemon's own cgroup (lockfs_container_of_cgroup_under,
 * include/lockfs/proc.h): text only, no /proc.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "lockfs/proc.h"

static bool is_hex64(const char *s, size_t len)
{
	if (len != 64)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* Does COMP (LEN bytes) start with PREFIX and end with SUFFIX (either may
 * be "")?  Sets *MID, *MIDLEN to what lies between. */
static bool wraps(const char *comp, size_t len, const char *prefix, const char *suffix,
		  const char **mid, size_t *midlen)
{
	size_t pl = strlen(prefix), sl = strlen(suffix);

	if (len <= pl + sl || memcmp(comp, prefix, pl) != 0 ||
	    memcmp(comp + len - sl, suffix, sl) != 0)
		return false;
	*mid = comp + pl;
	*midlen = len - pl - sl;
	return true;
}

/* Copy a systemd unit-name fragment, undoing its \xNN escapes, into OUT.
 * Returns false when it does not fit or holds a control character. */
static bool unescape_unit(const char *s, size_t len, char *out, size_t size)
{
	size_t o = 0;

	for (size_t i = 0; i < len; i++) {
		unsigned c = (unsigned char)s[i];
		unsigned v;

		if (c == '\\' && i + 3 < len && s[i + 1] == 'x' &&
		    sscanf(s + i + 2, "%2x", &v) == 1) {
			c = v;
			i += 3;
		}
		if (c < 0x20 || c == 0x7f || o + 1 >= size)
			return false;
		out[o++] = (char)c;
	}
	out[o] = '\0';
	return o > 0;
}

/*
 * The container that path component COMP (LEN bytes) names, after the
 * component PREV (PLEN bytes; "" at the top), into OUT.  True if found.
 */
static bool container_of_component(const char *prev, size_t plen, const char *comp,
				   size_t len, char *out, size_t size)
{
	/* runtimes that name the container by its 64-hex id */
	static const char *const hex_forms[][2] = {
		{ "libpod-conmon-", ".scope" }, { "libpod-", ".scope" }, { "libpod-", "" },
		{ "docker-", ".scope" }, { "cri-containerd-", ".scope" },
		{ "crio-conmon-", ".scope" }, { "crio-", ".scope" }, { "", "" },
	};
	/* and those that name it by its name */
	static const char *const name_forms[][2] = {
		{ "lxc.payload.", "" }, { "machine-", ".scope" },
		{ "systemd-nspawn@", ".service" },
	};
	const char *mid;
	size_t mlen;

	for (size_t i = 0; i < sizeof(hex_forms) / sizeof(hex_forms[0]); i++) {
		if (wraps(comp, len, hex_forms[i][0], hex_forms[i][1], &mid, &mlen) &&
		    is_hex64(mid, mlen) && mlen < size) {
			memcpy(out, mid, mlen);
			out[mlen] = '\0';
			return true;
		}
	}
	for (size_t i = 0; i < sizeof(name_forms) / sizeof(name_forms[0]); i++)
		if (wraps(comp, len, name_forms[i][0], name_forms[i][1], &mid, &mlen) &&
		    unescape_unit(mid, mlen, out, size))
			return true;
	/* the old lxc layout: /lxc/NAME */
	return plen == 3 && memcmp(prev, "lxc", 3) == 0 && unescape_unit(comp, len, out, size);
}

/* The innermost container the cgroup PATH (LEN bytes) names; true if any. */
static bool container_of_path(const char *path, size_t len, char *out, size_t size)
{
	const char *prev = "", *comp = NULL;
	size_t plen = 0;
	bool found = false;
	char tmp[LOCKFS_CONTAINER_MAX];

	for (size_t i = 0; i <= len; i++) {
		if (i < len && path[i] != '/') {
			if (!comp)
				comp = path + i;
			continue;
		}
		if (comp) {
			size_t clen = (size_t)(path + i - comp);

			if (container_of_component(prev, plen, comp, clen, tmp,
						   size < sizeof(tmp) ? size : sizeof(tmp))) {
				snprintf(out, size, "%s", tmp);
				found = true;
			}
			prev = comp;
			plen = clen;
			comp = NULL;
		}
	}
	return found;
}

/* The path of the line of OWN (a /proc/PID/cgroup text) for hierarchy
 * KEY ("0::", "4:memory:", KLEN bytes), into *PATH, *PLEN.  True if any. */
static bool own_path_of(const char *own, const char *key, size_t klen, const char **path,
			size_t *plen)
{
	for (const char *line = own; line && *line;) {
		const char *nl = strchrnul(line, '\n');

		if ((size_t)(nl - line) >= klen && memcmp(line, key, klen) == 0) {
			*path = line + klen;
			*plen = (size_t)(nl - line) - klen;
			return true;
		}
		line = *nl ? nl + 1 : NULL;
	}
	return false;
}

/*
 * The part of PATH (*LEN bytes) below the daemon's own cgroup in the same
 * hierarchy (OWN_PATH, OWN_LEN bytes): a process in the daemon's cgroup
 * or under it is placed relative to it, so the container the daemon runs
 * in names nobody, and one started inside it is named by its own id.  A
 * path elsewhere is left whole.
 */
static const char *below_own(const char *path, size_t *len, const char *own_path, size_t own_len)
{
	while (own_len > 0 && own_path[own_len - 1] == '/')
		own_len--; /* "/" is the root: everything is below it */
	if (*len < own_len || memcmp(path, own_path, own_len) != 0 ||
	    (*len > own_len && path[own_len] != '/'))
		return path;
	*len -= own_len;
	return path + own_len;
}

int lockfs_container_of_cgroup_under(const char *text, const char *own, char *out, size_t size)
{
	/* Pass 0 looks at the unified hierarchy (0::PATH) only, pass 1 at
	 * the v1 controllers. */
	if (size == 0)
		return 0;
	out[0] = '\0';
	for (int pass = 0; pass < 2; pass++) {
		for (const char *line = text; line && *line;) {
			const char *nl = strchrnul(line, '\n');
			const char *c1 = memchr(line, ':', (size_t)(nl - line));
			const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(nl - c1 - 1)) : NULL;
			bool unified = c1 && c2 == c1 + 1 && c1 - line == 1 && line[0] == '0';

			if (c2 && unified == (pass == 0)) {
				const char *path = c2 + 1, *own_path;
				size_t len = (size_t)(nl - c2 - 1), own_len;

				if (own && own_path_of(own, line, (size_t)(path - line), &own_path,
						       &own_len))
					path = below_own(path, &len, own_path, own_len);
				if (container_of_path(path, len, out, size))
					return 1;
			}
			line = *nl ? nl + 1 : NULL;
		}
	}
	return 0;
}

int lockfs_container_of_cgroup(const char *text, char *out, size_t size)
{
	return lockfs_container_of_cgroup_under(text, NULL, out, size);
}
