#!/usr/bin/python3
"""etcd on 127.0.0.1 for tests: 1- and 3-member clusters, TLS, a pausable proxy.

Every member listens on free private loopback ports (never 2379/2380, where
Debian's etcd.service would be), keeps its data in a temporary directory,
and is stopped by its PID, always (and dies with the process that started
it: PR_SET_PDEATHSIG).  A system etcd is neither used nor disturbed.

In pytest (import the fixtures into a test module):

    from etcd_fixtures import etcd1, etcd3, etcd_tls, tcp_proxy  # noqa: F401

    def test_x(etcd3, tcp_proxy):
        proxy = tcp_proxy(etcd3.members[0].client_port)
        ...   # point a daemon at proxy.url; proxy.pause(); proxy.resume()

`Cluster`: .endpoints ("URL;URL;URL", lockfs's -o etcd= form), .members,
.leader(), .wait_leader(), .etcdctl(*args), .stop().  `Member`: .url,
.kill9(), .stop(), .start() (restart on its data), .status(), .pid.

From the command line (the C tests and benchmarks run this way):

    etcd_fixtures.py exec [--tls] [--members N] -- PROGRAM ARGS...

starts a cluster (and with --tls a second, TLS-only one with client
certificate auth), runs PROGRAM with LOCKFS_ETCD_* in its environment (see
exec_main), stops everything and exits with PROGRAM's status; 77 (meson's
"skipped") with the reason on stdout when etcd or openssl is missing.
"""

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ETCD = shutil.which('etcd')
ETCDCTL = shutil.which('etcdctl')
OPENSSL = shutil.which('openssl')
PYTHON = '/usr/bin/python3'
HERE = os.path.dirname(os.path.abspath(__file__))

START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0

_PR_SET_PDEATHSIG = 1


def missing():
    """Why these fixtures cannot run here, or None."""
    if not ETCD or not ETCDCTL:
        return 'etcd is not installed (apt-get install etcd-server etcd-client)'
    if not OPENSSL:
        return 'openssl is not installed'
    return None


def _die_with_parent():
    # The member must not outlive a test runner that was killed.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def free_ports(n):
    """N distinct loopback ports that nothing listens on now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(('127.0.0.1', 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Tls:
    """A CA, a server certificate for 127.0.0.1, a client certificate, and
    a client certificate from another CA (which etcd must refuse), made
    with openssl in DIRECTORY."""

    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.ca, self.ca_key = self._ca('ca', 'lockfs test CA')
        self.server, self.server_key = self._leaf('server', self.ca, self.ca_key,
                                                  'subjectAltName=IP:127.0.0.1,DNS:localhost\n'
                                                  'extendedKeyUsage=serverAuth,clientAuth')
        self.client, self.client_key = self._leaf('client', self.ca, self.ca_key,
                                                  'extendedKeyUsage=clientAuth')
        other_ca, other_key = self._ca('other-ca', 'another CA')
        self.bad_client, self.bad_client_key = self._leaf('bad-client', other_ca, other_key,
                                                          'extendedKeyUsage=clientAuth')

    def _path(self, name):
        return os.path.join(self.dir, name)

    def _run(self, *args):
        subprocess.run([OPENSSL, *args], check=True, capture_output=True, timeout=30)

    def _ca(self, name, cn):
        cert, key = self._path(name + '.pem'), self._path(name + '-key.pem')
        self._run('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
                  '-nodes', '-keyout', key, '-out', cert, '-days', '2', '-subj', '/CN=' + cn,
                  '-addext', 'basicConstraints=critical,CA:TRUE',
                  '-addext', 'keyUsage=critical,keyCertSign,cRLSign')
        return cert, key

    def _leaf(self, name, ca, ca_key, ext):
        cert, key, csr = (self._path(name + '.pem'), self._path(name + '-key.pem'),
                          self._path(name + '.csr'))
        extfile = self._path(name + '.ext')
        with open(extfile, 'w') as f:
            f.write('basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n'
                    + ext + '\n')
        self._run('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
                  '-keyout', key, '-out', csr, '-subj', '/CN=' + name)
        self._run('x509', '-req', '-in', csr, '-CA', ca, '-CAkey', ca_key, '-CAcreateserial',
                  '-out', cert, '-days', '2', '-extfile', extfile)
        return cert, key

    def ssl_context(self):
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.load_cert_chain(self.client, self.client_key)
        return ctx


class Member:
    """One etcd process of a Cluster."""

    def __init__(self, cluster, name, client_port, peer_port):
        self.cluster = cluster
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = os.path.join(cluster.dir, name + '.data')
        self.log_path = os.path.join(cluster.dir, name + '.log')
        self.proc = None

    @property
    def url(self):
        return f'{self.cluster.scheme}://127.0.0.1:{self.client_port}'

    @property
    def peer_url(self):
        return f'http://127.0.0.1:{self.peer_port}'

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        """Start (or restart on its data dir) without waiting for health."""
        assert not self.alive, f'{self.name} is running'
        tls = self.cluster.tls
        args = [ETCD, '--name', self.name, '--data-dir', self.data_dir,
                '--listen-client-urls', self.url, '--advertise-client-urls', self.url,
                '--listen-peer-urls', self.peer_url, '--initial-advertise-peer-urls', self.peer_url,
                '--initial-cluster', self.cluster.initial_cluster,
                '--initial-cluster-state', 'new',
                '--initial-cluster-token', self.cluster.token,
                # Elections in ~0.1 s instead of ~1 s; leases of 1 s possible.
                '--heartbeat-interval', '10', '--election-timeout', '100',
                '--logger', 'zap', '--log-outputs', 'stderr']
        if tls:
            args += ['--cert-file', tls.server, '--key-file', tls.server_key,
                     '--trusted-ca-file', tls.ca, '--client-cert-auth']
        args += self.cluster.extra_args
        log = open(self.log_path, 'ab')
        try:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         preexec_fn=_die_with_parent)
        finally:
            log.close()

    def _signal(self, sig, timeout):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)   # by PID: only the member we started
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=STOP_TIMEOUT)
        self.proc = None

    def stop(self):
        """SIGTERM (etcd exits cleanly), SIGKILL after STOP_TIMEOUT."""
        self._signal(signal.SIGTERM, STOP_TIMEOUT)

    def kill9(self):
        self._signal(signal.SIGKILL, STOP_TIMEOUT)

    def post(self, path, body, timeout=1.0):
        """POST BODY (a dict) to this member's gateway; the JSON answer."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={'Content-Type': 'application/json'})
        ctx = self.cluster.tls.ssl_context() if self.cluster.tls else None
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            return json.load(r)

    def status(self):
        """/v3/maintenance/status: member_id (header), leader, raftTerm..."""
        return self.post('/v3/maintenance/status', {})

    def member_id(self):
        return self.status()['header']['member_id']

    def healthy(self):
        try:
            req = urllib.request.Request(self.url + '/health')
            ctx = self.cluster.tls.ssl_context() if self.cluster.tls else None
            with urllib.request.urlopen(req, timeout=0.5, context=ctx) as r:
                return json.load(r).get('health') == 'true'
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def wait_healthy(self, timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f'etcd {self.name} exited with {self.proc.returncode}:\n'
                                   + self.log_tail())
            if self.healthy():
                return
            time.sleep(0.02)
        raise TimeoutError(f'etcd {self.name} not healthy within {timeout} s:\n' + self.log_tail())

    def log_tail(self, lines=15):
        try:
            with open(self.log_path, errors='replace') as f:
                return ''.join(f.readlines()[-lines:])
        except OSError:
            return ''


class Cluster:
    """SIZE etcd members on 127.0.0.1, data under DIRECTORY."""

    def __init__(self, directory, size=1, tls=None, extra_args=()):
        self.dir = directory
        self.size = size
        self.tls = tls
        self.extra_args = list(extra_args)
        self.scheme = 'https' if tls else 'http'
        self.members = []
        self.token = 'lockfs-test-' + os.path.basename(directory)

    @property
    def initial_cluster(self):
        return ','.join(f'{m.name}={m.peer_url}' for m in self.members)

    @property
    def endpoints(self):
        """The client URLs separated by ';' (lockfs's -o etcd= form)."""
        return ';'.join(m.url for m in self.members)

    @property
    def url(self):
        return self.members[0].url

    def start(self, attempts=3):
        """Start every member and wait until each is healthy.  A port taken
        between choosing and binding it: retry on fresh ports."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        for attempt in range(attempts):
            ports = free_ports(2 * self.size)
            self.members = [Member(self, f'm{i}', ports[2 * i], ports[2 * i + 1])
                            for i in range(self.size)]
            try:
                for m in self.members:
                    m.start()
                for m in self.members:
                    m.wait_healthy()
                self.wait_leader()
                return self
            except (RuntimeError, TimeoutError):
                self.stop()
                for m in self.members:
                    shutil.rmtree(m.data_dir, ignore_errors=True)
                if attempt == attempts - 1:
                    raise
        return self

    def stop(self):
        """Stop every member (by PID), whatever happens."""
        errors = []
        for m in self.members:
            try:
                m.stop()
            except Exception as e:  # noqa: BLE001 - stop the others anyway
                errors.append(e)
        if errors:
            raise errors[0]

    def leader(self):
        """The member that every live member names as leader, or None (one
        does not answer, or knows no leader yet: a member that has just
        joined or voted learns of the winner a moment later)."""
        ids = {}
        leader_ids = set()
        for m in self.members:
            if not m.alive:
                continue
            try:
                st = m.status()
            except (OSError, ValueError, urllib.error.URLError):
                return None
            ids[st['header']['member_id']] = m
            leader_ids.add(st.get('leader', '0'))
        if len(leader_ids) != 1 or '0' in leader_ids:
            return None
        return ids.get(leader_ids.pop())

    def wait_leader(self, timeout=START_TIMEOUT, exclude=None):
        """Wait until the live members agree on a leader (not EXCLUDE)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.leader()
            if m is not None and m is not exclude:
                return m
            time.sleep(0.02)
        raise TimeoutError(f'no leader within {timeout} s')

    def etcdctl_args(self, endpoints=None):
        args = [ETCDCTL, '--endpoints', endpoints or ','.join(m.url for m in self.members)]
        if self.tls:
            args += ['--cacert', self.tls.ca, '--cert', self.tls.client,
                     '--key', self.tls.client_key]
        return args

    def etcdctl(self, *args, endpoints=None, timeout=10, check=True):
        """Run etcdctl (API v3) against this cluster; a CompletedProcess."""
        env = dict(os.environ, ETCDCTL_API='3')
        return subprocess.run(self.etcdctl_args(endpoints) + list(args), env=env, check=check,
                              capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def running_cluster(directory, size=1, tls=None, extra_args=()):
    cluster = Cluster(directory, size, tls, extra_args)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


class TcpProxy:
    """tcp_proxy.py forwarding 127.0.0.1:port -> 127.0.0.1:TARGET_PORT."""

    def __init__(self, target_port, scheme='http'):
        self.proc = subprocess.Popen([PYTHON, os.path.join(HERE, 'tcp_proxy.py'), '0',
                                      str(target_port)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1, preexec_fn=_die_with_parent)
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != 'listening':
            self.stop()
            raise RuntimeError(f'tcp_proxy.py did not start: {line}')
        self.port = int(line[1])
        self.url = f'{scheme}://127.0.0.1:{self.port}'

    def command(self, cmd):
        self.proc.stdin.write(cmd + '\n')
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def pause(self):
        assert self.command('pause') == 'paused'

    def resume(self):
        assert self.command('resume') == 'resumed'

    def drop(self):
        assert self.command('drop') == 'dropped'

    def connections(self):
        return int(self.command('count'))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()   # its end of input ends it
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=STOP_TIMEOUT)
        self.proc.stdout.close()


# ---- pytest fixtures (import them into a test module) ----

try:
    import pytest
except ImportError:  # the command line below needs no pytest
    pytest = None

if pytest is not None:
    def _need_etcd():
        why = missing()
        if why:
            pytest.skip(why)

    @pytest.fixture
    def etcd1(tmp_path):
        """A 1-member cluster (plain HTTP)."""
        _need_etcd()
        with running_cluster(str(tmp_path / 'etcd1'), 1) as c:
            yield c

    @pytest.fixture
    def etcd3(tmp_path):
        """A 3-member cluster (plain HTTP)."""
        _need_etcd()
        with running_cluster(str(tmp_path / 'etcd3'), 3) as c:
            yield c

    @pytest.fixture
    def etcd_tls(tmp_path):
        """A 1-member cluster serving only TLS with client certificate
        auth; .tls holds the files (ca, client, client_key, bad_client...)."""
        _need_etcd()
        tls = Tls(str(tmp_path / 'tls'))
        with running_cluster(str(tmp_path / 'etcd-tls'), 1, tls) as c:
            yield c

    @pytest.fixture
    def tcp_proxy():
        """tcp_proxy(target_port) -> a running TcpProxy, stopped at teardown."""
        proxies = []

        def make(target_port, scheme='http'):
            p = TcpProxy(target_port, scheme)
            proxies.append(p)
            return p
        yield make
        for p in proxies:
            p.stop()


# ---- command line ----

def exec_main(argv):
    """exec [--tls] [--members N] -- PROGRAM ARGS: run PROGRAM with
      LOCKFS_ETCD_ENDPOINTS  the cluster's URLs (';'), LOCKFS_ETCD_URL the first,
      and with --tls: LOCKFS_ETCD_TLS_URL, LOCKFS_ETCD_CACERT, _CERT, _KEY,
      LOCKFS_ETCD_BAD_CERT, _BAD_KEY (a client certificate of another CA),
      LOCKFS_ETCD_FIXTURES (this script)."""
    tls_wanted, size = False, 1
    while argv and argv[0] != '--':
        if argv[0] == '--tls':
            tls_wanted = True
            argv = argv[1:]
        elif argv[0] == '--members' and len(argv) > 1:
            size = int(argv[1])
            argv = argv[2:]
        else:
            sys.stderr.write(f'etcd_fixtures.py exec: unknown option {argv[0]}\n')
            return 2
    if len(argv) < 2:
        sys.stderr.write('usage: etcd_fixtures.py exec [--tls] [--members N] -- PROGRAM ARGS\n')
        return 2
    why = missing()
    if why:
        print(f'SKIP: {why}')
        return 77
    with tempfile.TemporaryDirectory(prefix='lockfs-etcd-') as tmp, \
            contextlib.ExitStack() as stack:
        env = dict(os.environ, LOCKFS_ETCD_FIXTURES=os.path.abspath(__file__))
        # Progress notifications every 200 ms, not 10 min, so a test sees one.
        plain = stack.enter_context(running_cluster(
            os.path.join(tmp, 'plain'), size,
            extra_args=['--experimental-watch-progress-notify-interval', '200ms']))
        env.update(LOCKFS_ETCD_ENDPOINTS=plain.endpoints, LOCKFS_ETCD_URL=plain.url)
        if tls_wanted:
            tls = Tls(os.path.join(tmp, 'tls'))
            secure = stack.enter_context(running_cluster(os.path.join(tmp, 'tls-etcd'), 1, tls))
            env.update(LOCKFS_ETCD_TLS_URL=secure.url, LOCKFS_ETCD_CACERT=tls.ca,
                       LOCKFS_ETCD_CERT=tls.client, LOCKFS_ETCD_KEY=tls.client_key,
                       LOCKFS_ETCD_BAD_CERT=tls.bad_client,
                       LOCKFS_ETCD_BAD_KEY=tls.bad_client_key)
        # Not exec: the clusters must be stopped after PROGRAM ends.
        rc = subprocess.run(argv[1:], env=env).returncode
        return 128 - rc if rc < 0 else rc


def _exit_on_term(sig, frame):
    sys.exit(128 + sig)   # unwinds the with blocks: the members are stopped


def main(argv):
    signal.signal(signal.SIGTERM, _exit_on_term)
    if argv[:1] == ['exec']:
        return exec_main(argv[1:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
