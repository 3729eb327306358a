"""Several lockfs hosts on one etcd cluster: one daemon per host name, each
on its own mount point and backing dir (its lock.log and pid lock), all on
one key prefix that no other test uses.

    from etcd_fixtures import etcd3, tcp_proxy      # noqa: F401
    from etcd_mounts import etcd_mounts             # noqa: F401

    def test_x(etcd3, etcd_mounts, procs):          # the cluster first: it is
        hosts = etcd_mounts(etcd3)                  # stopped after the daemons
        h1, h2, h3 = hosts
        os.mkdir(h1.path('deploy'))
        ...
        assert hosts.check_history(held=set()) == []

`etcd_mounts(cluster, hosts=('h1', 'h2', 'h3'), ttl=2, lock_delay=1,
endpoints=None, options=(), prefix=None)` starts, through `lockfs_factory`,

    lockfs -f -o backing=DIR -o backend=etcd -o etcd=URLS -o host=hN
           -o prefix=/t-<uuid>/ -o ttl=T -o lock_delay=D [-o TLS files] MNT

per host, one after the other, and returns an `EtcdHosts` (a list of the
`Mount`s, each with `.host`, `.prefix`, `.cluster`).  ENDPOINTS maps a host
to its own `etcd=` (a `tcp_proxy`'s URL, to cut that host off); OPTIONS are
more `-o` options for every host.  TLS files come from the cluster's `.tls`.
The daemons are unmounted and checked by `lockfs_factory`'s teardown.
"""

import base64
import json
import os
import select
import subprocess
import uuid

import pytest

from history import check_history, grants_of, read_histories
from lockfs_helpers import LOCKFS_BIN, read_log, run_expect_refusal, wait_until


# A daemon writes `released` once etcd confirmed the delete; the next host
# can be granted (its watch saw the delete) and write `acquired` first.
# Measured here: up to ~10 ms on an idle machine; loaded (8 helpers on 2
# cores) more.  The witness file of a herd is the exact check.
LOG_LAG_MS = 250


def etcd_options(cluster, host, prefix, ttl, lock_delay, endpoints=None):
    """The -o options of one etcd host (a list of 'key=value')."""
    opts = ['backend=etcd', f'etcd={endpoints or cluster.endpoints}', f'host={host}',
            f'prefix={prefix}', f'ttl={ttl}', f'lock_delay={lock_delay}']
    if cluster.tls:
        opts += [f'etcd_cacert={cluster.tls.ca}', f'etcd_cert={cluster.tls.client}',
                 f'etcd_key={cluster.tls.client_key}']
    return opts


class EtcdHosts(list):
    """The Mounts of one namespace, in host order; see the module docstring."""

    def __init__(self, factory, cluster, prefix, ttl, lock_delay):
        super().__init__()
        self.factory = factory
        self.cluster = cluster
        self.prefix = prefix
        self.ttl = ttl
        self.lock_delay = lock_delay

    def host(self, name):
        return next(m for m in self if m.host == name)

    def start(self, host, endpoints=None, options=()):
        """Start one more host's daemon (or a second one with a used name)."""
        opts = etcd_options(self.cluster, host, self.prefix, self.ttl, self.lock_delay,
                            endpoints) + list(options)
        m = self.factory(options=opts)
        m.host, m.prefix, m.cluster = host, self.prefix, self.cluster
        self.append(m)
        return m

    def restart(self, m):
        """A new daemon for M's host on M's backing dir and mount point (M
        must be stopped: m.kill9()); it replaces M in this list."""
        n = self.factory.restart(m)
        n.host, n.prefix, n.cluster = m.host, m.prefix, m.cluster
        self[self.index(m)] = n
        return n

    # ---- what etcd holds ----
    def keys(self, name=None):
        """[(key, value, create_revision, lease)] under the prefix (or under
        PREFIX NAME/), in create_revision order, read with etcdctl."""
        k = self.prefix + (name + '/' if name else '')
        out = self.cluster.etcdctl('get', '--prefix', k, '-w', 'json', timeout=10).stdout
        kvs = json.loads(out).get('kvs') or []
        rows = []
        for kv in kvs:
            rows.append((base64.b64decode(kv['key']).decode(),
                         base64.b64decode(kv.get('value', '')).decode('utf-8', 'replace'),
                         int(kv.get('create_revision', 0)), int(kv.get('lease', 0))))
        return sorted(rows, key=lambda r: r[2])

    def lock_keys(self, name):
        """The contenders' keys of NAME, in create_revision order."""
        return self.keys(name)

    # ---- what the hosts logged ----
    def logs(self):
        """{host: [LogLine]} of every host's lock.log (a restarted host's
        daemon appends to the same file)."""
        seen, out = set(), {}
        for m in self:
            if m.dir not in seen:
                seen.add(m.dir)
                out.update(read_histories([(m.host, m.dir)]))
        return out

    def check_history(self, held=None, cross_host_ms=None):
        """history.check_history over every host's log, allowing
        LOG_LAG_MS between one host's end line and another's acquired."""
        return check_history(self.logs(), held=held,
                             cross_host_ms=LOG_LAG_MS if cross_host_ms is None else cross_host_ms)

    def grants(self, name=None):
        return grants_of(self.logs(), name)

    def log_lines(self, m, name=None, event=None):
        """M's log lines (of NAME, with EVENT, when given)."""
        if isinstance(name, str):
            name = name.encode()
        return [l for l in read_log(m.dir)
                if (name is None or l.name == name) and (event is None or l.event == event)]

    def wait_log(self, m, name, event, count=1, timeout=10.0):
        """Poll M's log until NAME has COUNT EVENT lines; return them."""
        def found():
            ls = self.log_lines(m, name, event)
            return ls if len(ls) >= count else None
        return wait_until(found, timeout=timeout, interval=0.01,
                          what=f'{count} {event!r} line(s) for {name!r} in {m.host}\'s lock.log')

    def listed(self, m):
        """The lock names M lists (no dot entries)."""
        return sorted(n for n in os.listdir(m.mnt) if not n.startswith('.'))


@pytest.fixture
def etcd_mounts(lockfs_factory):
    """etcd_mounts(cluster, hosts=('h1', 'h2', 'h3'), ttl=2, lock_delay=1,
    endpoints=None, options=(), prefix=None) -> EtcdHosts (module doc)."""

    def start(cluster, hosts=('h1', 'h2', 'h3'), ttl=2, lock_delay=1, endpoints=None,
              options=(), prefix=None):
        hs = EtcdHosts(lockfs_factory, cluster, prefix or f'/t-{uuid.uuid4().hex[:12]}/',
                       ttl, lock_delay)
        for h in hosts:
            hs.start(h, (endpoints or {}).get(h), options)
        return hs
    return start


def start_refused(options, mountpoint, backing, timeout=10.0):
    """Run `lockfs -f -o backing=BACKING -o OPT... MOUNTPOINT`, which must
    refuse to start: (exit status, stderr).  One that mounts instead is
    unmounted and killed, and the test fails (run_expect_refusal)."""
    cmd = [LOCKFS_BIN, '-f', '-o', f'backing={backing}']
    for o in options:
        cmd += ['-o', o]
    return run_expect_refusal(cmd + [mountpoint], mountpoint, timeout)


# etcdctl lock runs CMD with ETCD_LOCK_KEY and ETCD_LOCK_REV set and holds
# the lock until CMD exits.  This CMD (sh -c HOLD GO) says what it holds,
# then waits for the file GO.
HOLD = 'echo "$ETCD_LOCK_KEY $ETCD_LOCK_REV"; while [ ! -e "$0" ]; do sleep 0.02; done'


def etcdctl_lock(procs, cluster, key, script, go):
    """`etcdctl lock KEY sh -c SCRIPT GO` in the background (stdout piped),
    a `procs` process (killed at teardown)."""
    env = dict(os.environ, ETCDCTL_API='3')
    return procs.popen(cluster.etcdctl_args() + ['lock', key, '--', 'sh', '-c', script, str(go)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def line_within(p, timeout):
    """P's next stdout line, or None if none came within TIMEOUT seconds."""
    r, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline().strip() if r else None
