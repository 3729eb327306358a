/*
 * Opening and closing the etcd store: its -o options, the TLS files, the
 * check that the prefix is no other lockfs namespace's, this host's host
 * key (docs/etcd.md "Hosts"), and the first lease, watch and session
 * thread; and the ops of a store once open: start (the scan is over) and
 * session.  etcd.c, the store's other ops, calls it; it calls nothing of
 * etcd.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "lockfs/proc.h"
#include "lockfs/name.h"
#include "etcd.h"
#include "options.h"
#include "registry.h"

#define HOSTS_DIR ".hosts/"

/* ---- Open and close ---- */

/* (prefix, host) pairs open in this process: a second one is refused as
 * a live daemon would be (one process, one pid: the host key cannot tell). */
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static struct open_pair {
	char *id;
	struct open_pair *next;
} *open_pairs;

static bool open_pair_add(const char *prefix, const char *host)
{
	struct open_pair *p;
	char *id;
	bool ok = true;

	if (asprintf(&id, "%s\n%s", prefix, host) < 0)
		return false;
	pthread_mutex_lock(&open_mu);
	for (p = open_pairs; p && ok; p = p->next)
		ok = strcmp(p->id, id) != 0;
	if (ok && (p = malloc(sizeof(*p)))) {
		p->id = id;
		p->next = open_pairs;
		open_pairs = p;
		id = NULL;
	} else {
		ok = false;
	}
	pthread_mutex_unlock(&open_mu);
	free(id);
	return ok;
}

static void open_pair_remove(const char *prefix, const char *host)
{
	char *id;

	if (asprintf(&id, "%s\n%s", prefix, host) < 0)
		return;
	pthread_mutex_lock(&open_mu);
	for (struct open_pair **pp = &open_pairs; *pp; pp = &(*pp)->next)
		if (strcmp((*pp)->id, id) == 0) {
			struct open_pair *p = *pp;

			*pp = p->next;
			free(p->id);
			free(p);
			break;
		}
	pthread_mutex_unlock(&open_mu);
	free(id);
}

static void etcd_free(struct etcd_store *e)
{
	lockfs_etcdbe_free_expired(e);
	lockfs_etcdbe_keys_destroy(&e->free_keys);
	lockfs_etcdbe_owned_destroy(&e->owned);
	free(e->endpoints);
	free(e->prefix);
	free(e->source);
	free(e->host_key);
	free(e->host_value);
	free(e);
}

void lockfs_etcdbe_close(struct etcd_store *e)
{
	/* The lease is not revoked: a restarted daemon adopts the locks. */
	lockfs_etcdbe_session_stop(e);
	lockfs_etcdbe_interest_close(e);
	pthread_mutex_lock(&e->report_mu);
	e->change = NULL;
	pthread_mutex_unlock(&e->report_mu);
	lockfs_etcd_close(e->client);
	lockfs_etcd_close(e->client_short);
	lockfs_etcdbe_session_destroy(e);
	lockfs_etcdbe_mirror_free(&e->mirror);
	pthread_mutex_destroy(&e->report_mu);
	open_pair_remove(e->prefix, e->base.host);
	lockfs_statedir_close(&e->sd);
	etcd_free(e);
}

static void read_machine_id(char out[64])
{
	FILE *f = fopen("/etc/machine-id", "re");

	snprintf(out, 64, "unknown");
	if (f) {
		if (fscanf(f, "%63s", out) != 1)
			snprintf(out, 64, "unknown");
		fclose(f);
	}
}

/* A TLS file the client will need: readable now, or one line. */
static int check_tls_file(const struct lockfs_backend_config *cfg, const char *path)
{
	int fd;

	if (!path)
		return 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;

		lockfs_backend_say(cfg, "cannot read TLS file %s: %s", path, strerror(-rc));
		return rc;
	}
	close(fd);
	return 0;
}

/*
 * Take this host's host key H for the first lease.  When H exists: on
 * another machine, or in use by a live daemon of this boot -> refuse;
 * left by a daemon that is gone (dead, or an earlier boot) -> move H to
 * our lease and remember its lease for start() to revoke.  0, or -errno
 * with one line.
 */
static int take_host_key(struct etcd_store *e, const struct lockfs_backend_config *cfg)
{
	struct lockfs_etcd_op get = { .type = LOCKFS_ETCD_RANGE, .key = e->host_key };
	struct lockfs_etcd_op_resp r;
	json_t *v = NULL;
	const char *machine = "", *boot = "", *state = "";
	char own_state[48] = "";
	json_int_t pid = 0;
	unsigned long long start_time = 0, now_start = 0;
	int64_t old_lease;
	int rc;

	for (int attempt = 0; attempt < 3; attempt++) {
		rc = lockfs_etcdbe_session_put_host(e, e->session.lease, 0);
		if (rc != -EEXIST)
			break;
		rc = lockfs_etcd_range(e->client, &get, &r);
		if (rc)
			break;
		if (r.n_kvs == 0) {
			lockfs_etcd_op_resp_free(&r);
			continue;  /* gone meanwhile: try again */
		}
		old_lease = r.kvs[0].lease;
		machine = boot = state = "";  /* nothing of an earlier attempt's */
		pid = 0;
		start_time = 0;
		v = json_loadb(r.kvs[0].value, r.kvs[0].value_len, 0, NULL);
		lockfs_etcd_op_resp_free(&r);
		if (v) {
			json_t *st = json_object_get(v, "start_time");

			machine = json_string_value(json_object_get(v, "machine_id")) ?: "";
			boot = json_string_value(json_object_get(v, "boot_id")) ?: "";
			state = json_string_value(json_object_get(v, "state_dir")) ?: "";
			pid = json_integer_value(json_object_get(v, "pid"));
			start_time = json_is_integer(st) ? (unsigned long long)json_integer_value(st)
							 : 0;
		}
		if (strcmp(machine, e->machine_id) != 0) {
			lockfs_backend_say(cfg,
			    "host %s is in use by another machine on %s (%s): give this daemon "
			    "another -o host=", e->base.host, e->prefix,
			    *machine ? machine : "unknown machine id");
			json_decref(v);
			return -EBUSY;
		}
		/* Its backing directory is ours: we hold its pid lock, so that
		 * daemon is gone (even if /proc still shows it, unreaped). */
		if (*state && lockfs_etcdbe_state_id(e, own_state) == 0 &&
		    strcmp(state, own_state) == 0 && pid != getpid())
			pid = 0;
		if (strcmp(boot, e->boot_id) == 0 && pid > 0 &&
		    ((pid == getpid() && !open_pair_add(e->prefix, e->base.host)) ||
		     (pid != getpid() &&
		      lockfs_procfs_start_time((pid_t)pid, &now_start) == 0 &&
		      now_start == start_time))) {
			lockfs_backend_say(cfg,
			    "host %s is in use by another lockfs daemon on %s (pid %lld)",
			    e->base.host, e->prefix, (long long)pid);
			json_decref(v);
			return -EBUSY;
		}
		if (pid == getpid())
			open_pair_remove(e->prefix, e->base.host);
		json_decref(v);
		v = NULL;
		/* A predecessor that is gone: its host key moves to us. */
		rc = lockfs_etcdbe_session_put_host(e, e->session.lease, old_lease);
		if (rc == 0) {
			e->session.predecessor = old_lease;
			break;
		}
		if (rc != -EEXIST)
			break;
	}
	if (rc == -EEXIST) {
		lockfs_backend_say(cfg,
		    "host %s is in use by another lockfs daemon on %s", e->base.host,
		    e->prefix);
		return -EBUSY;
	}
	if (rc == -EACCES) {
		/* Authentication on: its first write is where etcd says so. */
		lockfs_backend_say(cfg, "etcd refused our credentials (%s)", e->endpoints);
		return rc;
	}
	if (rc) {
		lockfs_backend_say(cfg,
		    "cannot register host %s on %s in etcd: %s", e->base.host, e->prefix,
		    strerror(-rc));
		return rc;
	}
	if (!open_pair_add(e->prefix, e->base.host)) {
		lockfs_backend_say(cfg, "host %s is in use by another lockfs daemon on %s (pid %d)",
		    e->base.host, e->prefix, (int)getpid());
		return -EBUSY;
	}
	return 0;
}

/* Refuse a prefix inside another lockfs namespace (one whose .hosts/ has a
 * key): every key of ours would also be one of its, our host keys showing
 * there as a lock nobody can take.  0, -EBUSY (said), or the client's
 * error. */
static int check_not_nested(struct etcd_store *e, const struct lockfs_backend_config *cfg)
{
	char outer[LOCKFS_STORE_KEY_MAX], end[LOCKFS_STORE_KEY_MAX];
	size_t len = strlen(e->prefix);

	/* Each shorter prefix that ends in '/': "/a/b/" is inside "/a/". */
	for (size_t cut = 1; cut + 1 < len; cut++) {
		struct lockfs_etcd_op op = { .type = LOCKFS_ETCD_RANGE, .key = outer,
					     .range_end = end, .limit = 1, .keys_only = true };
		struct lockfs_etcd_op_resp r;
		int n, rc;

		if (e->prefix[cut - 1] != '/')
			continue;
		n = snprintf(outer, sizeof(outer), "%.*s.hosts/", (int)cut, e->prefix);
		if (n < 0 || (size_t)n >= sizeof(outer))
			continue;
		end[lockfs_etcd_prefix_end(outer, (size_t)n, end)] = '\0';
		rc = lockfs_etcd_range(e->client, &op, &r);
		if (rc)
			return rc;
		n = (int)r.n_kvs;
		lockfs_etcd_op_resp_free(&r);
		if (n) {
			lockfs_backend_say(cfg,
			    "-o prefix=%s is inside the lockfs namespace %.*s on %s: prefixes "
			    "must not nest", e->prefix, (int)cut, e->prefix, e->endpoints);
			return -EBUSY;
		}
	}
	return 0;
}

/* A host name shows in records, log lines and lockctl's columns: printable
 * ASCII, no blank, and none of the characters keys and JSON treat apart. */
static bool host_ok(const char *host)
{
	size_t n = strlen(host);

	if (n == 0 || n >= LOCKFS_HOST_MAX)
		return false;
	for (const unsigned char *p = (const unsigned char *)host; *p; p++)
		if (*p <= ' ' || *p >= 0x7f || *p == '/' || *p == '"' || *p == '\\')
			return false;
	return true;
}

static int parse_options(struct etcd_store *e, const struct lockfs_backend_config *cfg,
			 const char **backing, const char **cacert, const char **cert,
			 const char **key)
{
	const char *prefix = "/lockfs/", *host = NULL;

	e->ttl_s = 10;
	e->lock_delay_s = 5;
	for (size_t i = 0; i < cfg->n_options; i++) {
		const struct lockfs_backend_option *o = &cfg->options[i];
		const char *val = o->value ? o->value : "";

		if (strcmp(o->key, "etcd") == 0) {
			free(e->endpoints);
			e->endpoints = strdup(val);
			if (!e->endpoints)
				goto nomem;
		} else if (strcmp(o->key, "prefix") == 0) {
			prefix = val;
		} else if (strcmp(o->key, "host") == 0) {
			host = val;
		} else if (strcmp(o->key, "ttl") == 0) {
			if (lockfs_backend_parse_seconds(val, 2, &e->ttl_s) < 0) {
				lockfs_backend_say(cfg,
				    "-o ttl=%s: want a whole number of seconds >= 2", val);
				return -EINVAL;
			}
		} else if (strcmp(o->key, "lock_delay") == 0) {
			if (lockfs_backend_parse_seconds(val, 0, &e->lock_delay_s) < 0) {
				lockfs_backend_say(cfg,
				    "-o lock_delay=%s: want a whole number of seconds >= 0", val);
				return -EINVAL;
			}
		} else if (strcmp(o->key, "etcd_cacert") == 0) {
			*cacert = val;
		} else if (strcmp(o->key, "etcd_cert") == 0) {
			*cert = val;
		} else if (strcmp(o->key, "etcd_key") == 0) {
			*key = val;
		} else if (strcmp(o->key, "backing") == 0) {
			*backing = val;
		} else {
			lockfs_backend_say(cfg, "-o %s: not an option of the etcd backend", o->key);
			return -EINVAL;
		}
	}
	if (!e->endpoints || !*e->endpoints) {
		lockfs_backend_say(cfg, "-o backend=etcd needs -o etcd=URL[;URL...]");
		return -EINVAL;
	}
	if (!*prefix || prefix[strlen(prefix) - 1] != '/' ||
	    strlen(prefix) > LOCKFS_STORE_KEY_MAX - LOCKFS_NAME_MAX - 60) {
		lockfs_backend_say(cfg,
		    "-o prefix=%s: must end in '/' (e.g. /lockfs/) and be short", prefix);
		return -EINVAL;
	}
	if (host) {
		if (!host_ok(host)) {
			lockfs_backend_say(cfg,
			    "-o host=%s: want 1 to %d printable ASCII characters, no blank, "
			    "'/', '\"' or '\\'", host, LOCKFS_HOST_MAX - 1);
			return -EINVAL;
		}
		snprintf(e->base.host, sizeof(e->base.host), "%s", host);
	} else {
		if (gethostname(e->base.host, LOCKFS_HOST_MAX - 1) < 0)
			snprintf(e->base.host, sizeof(e->base.host), "localhost");
		e->base.host[LOCKFS_HOST_MAX - 1] = '\0';
	}
	e->prefix = strdup(prefix);
	if (!e->prefix || asprintf(&e->source, "etcd:%s", prefix) < 0 ||
	    asprintf(&e->host_key, "%s" HOSTS_DIR "%s", prefix, e->base.host) < 0)
		goto nomem;
	return 0;
nomem:
	lockfs_backend_say(cfg, "out of memory");
	return -ENOMEM;
}

/* What the session thread asks of the store: it calls nothing above it. */
static const struct etcd_session_hooks session_hooks = {
	.watch_reopen = lockfs_etcdbe_watch_reopen,
	.report = lockfs_etcdbe_report,
	.tick = lockfs_etcdbe_tick,
};

int lockfs_etcdbe_open(const struct lockfs_backend_config *cfg, struct etcd_store **out)
{
	const char *backing = LOCKFS_BACKEND_DEFAULT_BACKING;
	const char *cacert = NULL, *cert = NULL, *key = NULL;
	struct lockfs_etcd_config ecfg = { .timeout_ms = LOCKFS_ETCD_TIMEOUT_MS };
	struct lockfs_etcd_status status;
	struct etcd_store *e = calloc(1, sizeof(*e));
	bool have_sd = false, have_session = false, host_taken = false;
	int rc;

	if (!e) {
		lockfs_backend_say(cfg, "out of memory");
		return -ENOMEM;
	}
	rc = parse_options(e, cfg, &backing, &cacert, &cert, &key);
	if (rc)
		goto fail;
	snprintf(e->boot_id, sizeof(e->boot_id), "%s", cfg->boot_id ? cfg->boot_id : "");
	read_machine_id(e->machine_id);
	rc = check_tls_file(cfg, cacert);
	if (!rc)
		rc = check_tls_file(cfg, cert);
	if (!rc)
		rc = check_tls_file(cfg, key);
	if (rc)
		goto fail;
	rc = lockfs_statedir_open(&e->sd, backing,
				  strcmp(backing, LOCKFS_BACKEND_DEFAULT_BACKING) == 0,
				  cfg->takeover, cfg->takeover_arg, cfg->why, cfg->why_size);
	if (rc)
		goto fail;
	have_sd = true;
	ecfg.endpoints = e->endpoints;
	ecfg.cacert = cacert;
	ecfg.cert = cert;
	ecfg.key = key;
	rc = lockfs_etcd_open(&e->client, &ecfg);
	if (!rc) {
		ecfg.timeout_ms = SHORT_TIMEOUT_MS;
		rc = lockfs_etcd_open(&e->client_short, &ecfg);
	}
	if (rc) {
		if (rc == -EINVAL)
			lockfs_backend_say(cfg,
			    "-o etcd=%s: want http:// or https:// URLs separated by ';' "
			    "(and etcd_cert with etcd_key)", e->endpoints);
		else
			lockfs_backend_say(cfg, "cannot start the etcd client: %s", strerror(-rc));
		goto fail;
	}
	rc = lockfs_etcd_status(e->client, &status);
	if (rc == -EACCES) {
		lockfs_backend_say(cfg, "etcd refused our credentials (%s)", e->endpoints);
		goto fail;
	}
	if (rc) {
		lockfs_backend_say(cfg,
		    "no etcd endpoint answers (%s): %s", e->endpoints, strerror(-rc));
		goto fail;
	}
	e->uid = geteuid();
	e->gid = getegid();
	lockfs_etcdbe_mirror_init(&e->mirror, e->prefix);
	lockfs_etcdbe_keys_init(&e->free_keys);
	lockfs_etcdbe_owned_init(&e->owned);
	pthread_mutex_init(&e->report_mu, NULL);
	rc = lockfs_etcdbe_session_init(e, &session_hooks);
	have_session = true;
	if (rc) {
		lockfs_backend_say(cfg, rc == -EACCES ? "etcd refused our credentials (%s)" :
		    "etcd (%s) grants no session lease: %s", e->endpoints, strerror(-rc));
		goto fail;
	}
	rc = check_not_nested(e, cfg);
	if (rc == -EACCES)
		lockfs_backend_say(cfg, "etcd refused our credentials (%s)", e->endpoints);
	else if (rc && rc != -EBUSY)
		lockfs_backend_say(cfg,
		    "cannot read the namespaces around %s in etcd (%s): %s", e->prefix,
		    e->endpoints, strerror(-rc));
	if (rc)
		goto fail;
	rc = take_host_key(e, cfg);
	if (rc)
		goto fail;
	host_taken = true;
	rc = lockfs_etcdbe_interest_open(e, 0);
	if (rc) {
		lockfs_backend_say(cfg, "cannot watch %s in etcd (%s): %s", e->prefix, e->endpoints,
		    strerror(-rc));
		goto fail;
	}
	/* No earlier daemon's session to adopt from: it may have expired
	 * with locks whose holders live on (into the mirror, for the scan). */
	if (!e->session.predecessor)
		lockfs_etcdbe_find_expired(e, e->session.lease);
	rc = lockfs_etcdbe_session_start(e);
	if (rc) {
		lockfs_backend_say(cfg, "cannot start the etcd session thread: %s", strerror(-rc));
		goto fail;
	}
	e->base.state_dirfd = e->sd.dirfd;
	e->base.state_path = e->sd.path;
	e->base.source = e->source;
	e->base.statedir = &e->sd;
	*out = e;
	return 0;
fail:
	lockfs_etcdbe_interest_close(e);
	if (have_session) {
		/* Nothing of ours may stay: the lease takes the host key along. */
		if (e->session.lease)
			(void)!lockfs_etcd_lease_revoke(e->client, e->session.lease);
		lockfs_etcdbe_session_destroy(e);
		lockfs_etcdbe_mirror_free(&e->mirror);
		pthread_mutex_destroy(&e->report_mu);
	}
	if (host_taken)
		open_pair_remove(e->prefix, e->base.host);
	if (e->client)
		lockfs_etcd_close(e->client);
	if (e->client_short)
		lockfs_etcd_close(e->client_short);
	if (have_sd)
		lockfs_statedir_close(&e->sd);
	etcd_free(e);
	return rc < 0 ? rc : -EIO;
}

/* ---- The ops of a store open and serving ---- */

int lockfs_etcdbe_session_op(struct lockfs_backend *be, const char *host,
			      struct lockfs_session *out)
{
	struct etcd_store *e = (struct etcd_store *)be;
	int64_t lease;

	if (!host || strcmp(host, e->base.host) == 0) {
		lockfs_etcdbe_session_get(e, out);
		return 0;
	}
	if (lockfs_etcdbe_mirror_host(&e->mirror, host, &lease) < 0)
		return -ENOENT;
	out->state = LOCKFS_SESSION_LIVE;
	out->since_ms = 0;
	out->id = lease;
	return 0;
}

int lockfs_etcdbe_start_op(struct lockfs_backend *be, lockfs_change_fn fn, void *arg)
{
	struct etcd_store *e = (struct etcd_store *)be;
	int64_t old;

	if (!fn)
		return -EINVAL;
	pthread_mutex_lock(&e->report_mu);
	if (e->change) {
		pthread_mutex_unlock(&e->report_mu);
		return -EINVAL;
	}
	e->change = fn;
	e->change_arg = arg;
	pthread_mutex_unlock(&e->report_mu);
	/* The scan is over: an expired session's keys were shown to it
	 * only (etcd_expired.c). */
	if (e->n_expired) {
		struct etcd_names changed = { 0 };

		lockfs_etcdbe_drop_expired(e, &changed);
		lockfs_etcdbe_report(e, &changed, false);
	}
	/* From now on only what this daemon needs is watched. */
	lockfs_etcdbe_interest_start(e);
	/* What the earlier daemon of this host left and the startup scan did
	 * not adopt goes with its lease (its host key moved already, so this
	 * starts no lock-delay elsewhere). */
	pthread_mutex_lock(&e->session.mu);
	old = e->session.predecessor;
	e->session.predecessor = 0;
	pthread_mutex_unlock(&e->session.mu);
	if (old && e->adopt_failed) {
		fprintf(stderr, "lockfs: etcd: some locks of the earlier daemon's session %016"
			PRIx64 " could not be adopted (etcd did not answer): they end with that "
			"session, in at most %" PRId64 " s\n", (uint64_t)old, e->ttl_s);
	} else if (old) {
		int rc = lockfs_etcd_lease_revoke(e->client, old);

		if (rc && rc != -ENOENT)
			fprintf(stderr, "lockfs: etcd: cannot revoke the earlier daemon's session "
				"%016" PRIx64 " (%s): its locks end with it in at most %" PRId64
				" s\n", (uint64_t)old, strerror(-rc), e->ttl_s);
	}
	return 0;
}
