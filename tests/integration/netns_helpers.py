"""A small network of our own: network namespaces, veths, etcd members and
lockfs daemons in them, and the faults Jepsen injects (issue 23 part 3).

    from netns_helpers import Lab, netns_missing

    with Lab(workdir) as lab:                       # namespaces + switch
        cluster = lab.etcd_cluster(3)               # e1 e2 e3, one netns each
        d = lab.daemon('h1', cluster, mnt, backing, options=[...])
        lab.partition(['h1'], cluster.names())      # h1 cannot reach etcd
        lab.heal()                                  # every fault undone
    # leaving the block: daemons unmounted and stopped, members stopped,
    # namespaces (and with them every veth) removed -- also on an exception

The network.  One namespace per node (etcd members `e1`.., lockfs hosts
`h1`..) named `lkn<PID>-<node>`, and one more, the switch `lkn<PID>-sw`,
holding a bridge.  Each node has one veth, `eth0` inside the node, its peer
`v-<node>` on the bridge; every node gets 10.213.0.<n>/24 and the bridge
10.213.0.254, from where the control calls (`status`, health) are made.
Nothing is attached to the root namespace: no interface, address, route or
firewall rule of the machine is touched, and the addresses cannot clash
with anything outside (two labs at once are two separate networks).

Processes run in a node's network namespace through `nsenter --net=`, which
changes only the network namespace: a lockfs daemon started that way mounts
in the caller's mount namespace, so its mount is visible to every process
of the machine.  (`ip netns exec` would not do: it unshares a mount
namespace of its own for /sys, and a mount made inside would be invisible
outside.)

The faults, each undone by `heal()`:
  partition(A, B)   iptables DROP both ways between the nodes of A and B
                    (in A's namespaces: INPUT from and OUTPUT to B's addresses)
  isolate(node)     the node reaches nobody and nobody reaches it
  slow(node, ...)   tbf on the node's eth0 (a slow link: each packet waits
                    for its bytes at RATE, so delay = queue / rate) and an
                    iptables `statistic --mode random` DROP of a share of the
                    packets coming in (loss).  This kernel has no sch_netem
                    (`tc qdisc ... netem` answers "Specified qdisc kind is
                    unknown", and there are no modules to load); TBF, HTB and
                    iptables' statistic match are built in.
  pause(member) / resume(member)   SIGSTOP / SIGCONT
  kill9(member) / member.start()   kill -9 and restart on its data dir

Every wait is bounded in time; every process is stopped by its PID.
"""

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

IP = shutil.which('ip') or '/usr/sbin/ip'
TC = shutil.which('tc') or '/usr/sbin/tc'
IPTABLES = shutil.which('iptables') or '/usr/sbin/iptables'
NSENTER = shutil.which('nsenter') or '/usr/bin/nsenter'
ETCD = shutil.which('etcd')
ETCDCTL = shutil.which('etcdctl')

SUBNET = '10.213.0'
SWITCH_ADDR = f'{SUBNET}.254'
CLIENT_PORT = 12379
PEER_PORT = 12380
CMD_TIMEOUT = 10.0        # one ip/tc/iptables call
START_TIMEOUT = 20.0      # a member healthy, a daemon mounted
STOP_TIMEOUT = 10.0

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    # a member or daemon must not outlive a runner that was killed
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _run(args, check=True, timeout=CMD_TIMEOUT):
    r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f'{" ".join(args)}: exit {r.returncode}: {r.stderr.strip()}')
    return r


def netns_missing():
    """Why network namespaces cannot be used here, or None: not root, no
    ip/tc/iptables/nsenter/etcd, or the kernel refuses a namespace, a veth
    or an iptables rule in it (tried in a namespace made and removed here)."""
    if os.geteuid() != 0:
        return 'not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN'
    for tool, path in (('ip', IP), ('tc', TC), ('iptables', IPTABLES), ('nsenter', NSENTER)):
        if not path or not os.access(path, os.X_OK):
            return f'{tool} is not installed'
    if not ETCD or not ETCDCTL:
        return 'etcd is not installed (apt-get install etcd-server etcd-client)'
    ns = f'lkn{os.getpid()}-probe'
    try:
        r = _run([IP, 'netns', 'add', ns], check=False)
        if r.returncode != 0:
            return f'ip netns add fails here: {r.stderr.strip()}'
        for args, what in (
                ([IP, '-n', ns, 'link', 'add', 'name', 'pa', 'type', 'veth', 'peer', 'name', 'pb'], 'veth'),
                ([IP, '-n', ns, 'link', 'set', 'dev', 'pa', 'up'], 'link up'),
                ([TC, '-n', ns, 'qdisc', 'add', 'dev', 'pa', 'root', 'tbf', 'rate', '1mbit',
                  'burst', '4kb', 'latency', '100ms'], 'tc tbf'),
                ([NSENTER, f'--net=/run/netns/{ns}', '--', IPTABLES, '-A', 'INPUT', '-m',
                  'statistic', '--mode', 'random', '--probability', '0.1', '-j', 'DROP'],
                 'iptables statistic')):
            r = _run(args, check=False)
            if r.returncode != 0:
                return f'{what} fails in a network namespace: {r.stderr.strip()}'
        return None
    finally:
        _run([IP, 'netns', 'del', ns], check=False)


def in_netns(ns, fn, *args, timeout=5.0):
    """FN(*ARGS) on a thread moved into network namespace NS (setns moves
    only the calling thread), so that its sockets live there; its result."""
    box = {}

    def run():
        try:
            fd = os.open(f'/run/netns/{ns}', os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), 'setns')
            finally:
                os.close(fd)
            box['value'] = fn(*args)
        except BaseException as e:   # noqa: BLE001 - handed to the caller
            box['error'] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f'{fn.__name__} in {ns} did not return within {timeout} s')
    if 'error' in box:
        raise box['error']
    return box['value']


def _post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


class Member:
    """One etcd member in its own namespace; stopped by its PID."""

    def __init__(self, lab, name, addr, cluster):
        self.lab, self.name, self.addr, self.cluster = lab, name, addr, cluster
        self.data_dir = os.path.join(lab.dir, name + '.data')
        self.log_path = os.path.join(lab.dir, name + '.log')
        self.proc = None
        self.paused = False

    @property
    def url(self):
        return f'http://{self.addr}:{CLIENT_PORT}'

    @property
    def peer_url(self):
        return f'http://{self.addr}:{PEER_PORT}'

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        assert not self.alive, f'{self.name} is running'
        args = [ETCD, '--name', self.name, '--data-dir', self.data_dir,
                '--listen-client-urls', self.url, '--advertise-client-urls', self.url,
                '--listen-peer-urls', self.peer_url,
                '--initial-advertise-peer-urls', self.peer_url,
                '--initial-cluster', self.cluster.initial_cluster,
                '--initial-cluster-state', 'new',
                '--initial-cluster-token', self.cluster.token,
                '--heartbeat-interval', str(self.cluster.heartbeat_ms),
                '--election-timeout', str(self.cluster.election_ms),
                '--logger', 'zap', '--log-outputs', 'stderr']
        with open(self.log_path, 'ab') as log:
            self.proc = self.lab.popen(self.name, args, stdout=log, stderr=log)
        self.paused = False

    def _signal(self, sig):
        if self.alive:
            os.kill(self.proc.pid, sig)    # by PID: the member we started

    def pause(self):
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        self._signal(signal.SIGCONT)
        self.paused = False

    def kill9(self):
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT)
        self.proc = None
        self.paused = False

    def stop(self):
        """SIGCONT (a paused member cannot exit), SIGTERM, SIGKILL after
        STOP_TIMEOUT."""
        if self.proc is None:
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=STOP_TIMEOUT)
        self.proc = None
        self.paused = False

    def status(self, timeout=0.5):
        """/v3/maintenance/status asked from the switch, or None."""
        try:
            return in_netns(self.lab.ns('sw'), _post, self.url + '/v3/maintenance/status', {},
                            timeout, timeout=timeout + 1)
        except (OSError, ValueError, TimeoutError, urllib.error.URLError):
            return None

    def wait_healthy(self, timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f'etcd {self.name} exited with {self.proc.returncode}:\n'
                                   + self.log_tail())
            if self.status() is not None:
                return
            time.sleep(0.05)
        raise TimeoutError(f'etcd {self.name} not answering within {timeout} s:\n'
                           + self.log_tail())

    def log_tail(self, lines=15):
        try:
            with open(self.log_path, errors='replace') as f:
                return ''.join(f.readlines()[-lines:])
        except OSError:
            return ''


class Cluster:
    """SIZE members e1..eSIZE, one namespace each."""

    def __init__(self, lab, size, heartbeat_ms, election_ms):
        self.lab = lab
        self.heartbeat_ms, self.election_ms = heartbeat_ms, election_ms
        self.token = f'lockfs-netns-{os.getpid()}'
        self.members = [Member(lab, f'e{i + 1}', lab.addr(f'e{i + 1}'), self)
                        for i in range(size)]

    @property
    def initial_cluster(self):
        return ','.join(f'{m.name}={m.peer_url}' for m in self.members)

    @property
    def endpoints(self):
        """lockfs's -o etcd= form."""
        return ';'.join(m.url for m in self.members)

    def names(self):
        return [m.name for m in self.members]

    def member(self, name):
        return next(m for m in self.members if m.name == name)

    def start(self):
        for m in self.members:
            m.start()
        for m in self.members:
            m.wait_healthy()
        self.wait_leader()
        return self

    def leader(self):
        """The member a majority of the reachable live members name as
        leader (a minority cut off may still believe in an old one), or None."""
        votes, by_id = {}, {}
        for m in self.members:
            if not m.alive or m.paused:
                continue
            st = m.status(timeout=0.3)
            if st is None:
                continue
            by_id[st['header']['member_id']] = m
            lid = st.get('leader', '0')
            if lid != '0':
                votes[lid] = votes.get(lid, 0) + 1
        for lid, n in votes.items():
            if n * 2 > len(self.members) and lid in by_id:
                return by_id[lid]
        return None

    def wait_leader(self, timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.leader()
            if m is not None:
                return m
            time.sleep(0.05)
        raise TimeoutError(f'no etcd leader within {timeout} s')

    def etcdctl(self, *args, timeout=10):
        """etcdctl run from the switch namespace (it reaches every member)."""
        env = dict(os.environ, ETCDCTL_API='3')
        return subprocess.run([NSENTER, f'--net=/run/netns/{self.lab.ns("sw")}', '--', ETCDCTL,
                               '--endpoints', ','.join(m.url for m in self.members)]
                              + list(args), env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def stop(self):
        for m in self.members:
            m.stop()


class Daemon:
    """One lockfs daemon in a host's namespace, mounted in ours."""

    def __init__(self, lab, host, mnt, backing, proc, stderr_path):
        self.lab, self.host, self.mnt, self.backing = lab, host, mnt, backing
        self.proc, self.stderr_path = proc, stderr_path
        self.returncode = None

    @property
    def dir(self):
        return self.backing

    def stderr(self):
        try:
            with open(self.stderr_path, errors='replace') as f:
                return f.read()
        except OSError:
            return ''

    def stop(self):
        """Unmount (lazily: a wedged mount must not hold us), then wait for
        the daemon by its PID, SIGKILL after STOP_TIMEOUT; the exit status."""
        if self.proc is None:
            return self.returncode
        if _is_mounted(self.mnt):
            _run(['fusermount3', '-u', '-z', self.mnt], check=False)
        try:
            self.returncode = self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)   # by PID: the daemon we started
            self.returncode = self.proc.wait(timeout=STOP_TIMEOUT)
        self.proc = None
        # the daemon marks its unmounted mount point immutable (so that
        # nothing is written there by mistake); the caller removes it
        _run(['chattr', '-i', self.mnt], check=False)
        return self.returncode


def _is_mounted(path):
    with open('/proc/self/mountinfo') as f:
        return any(line.split()[4] == path for line in f)


class Lab:
    """The namespaces of one run (module docstring).  A context manager:
    leaving it undoes everything, also after an exception."""

    def __init__(self, workdir, nodes=('e1', 'e2', 'e3', 'h1', 'h2', 'h3')):
        self.dir = workdir
        self.tag = f'lkn{os.getpid()}'
        self.nodes = list(nodes)
        self.namespaces = []       # made by us, removed by close()
        self.procs = []            # every Popen we started
        self.members = []
        self.daemons = []
        self.faulted = set()       # nodes with iptables rules or a qdisc
        self.cluster = None

    # ---- names and addresses ----
    def ns(self, node):
        return f'{self.tag}-{node}'

    def addr(self, node):
        return f'{SUBNET}.{self.nodes.index(node) + 1}'

    def _ipt(self, node, *args):
        return _run([NSENTER, f'--net=/run/netns/{self.ns(node)}', '--', IPTABLES, '-w', '2']
                    + list(args))

    # ---- set-up and tear-down ----
    def __enter__(self):
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def open(self):
        sw = self.ns('sw')
        _run([IP, 'netns', 'add', sw])
        self.namespaces.append(sw)
        _run([IP, '-n', sw, 'link', 'add', 'br0', 'type', 'bridge'])
        _run([IP, '-n', sw, 'addr', 'add', f'{SWITCH_ADDR}/24', 'dev', 'br0'])
        _run([IP, '-n', sw, 'link', 'set', 'br0', 'up'])
        _run([IP, '-n', sw, 'link', 'set', 'lo', 'up'])
        for node in self.nodes:
            ns = self.ns(node)
            _run([IP, 'netns', 'add', ns])
            self.namespaces.append(ns)
            # both ends made inside our namespaces: nothing appears in the root one
            _run([IP, '-n', sw, 'link', 'add', f'v-{node}', 'type', 'veth',
                  'peer', 'name', 'eth0', 'netns', ns])
            _run([IP, '-n', sw, 'link', 'set', f'v-{node}', 'master', 'br0'])
            _run([IP, '-n', sw, 'link', 'set', f'v-{node}', 'up'])
            _run([IP, '-n', ns, 'addr', 'add', f'{self.addr(node)}/24', 'dev', 'eth0'])
            _run([IP, '-n', ns, 'link', 'set', 'eth0', 'up'])
            _run([IP, '-n', ns, 'link', 'set', 'lo', 'up'])

    def popen(self, node, args, **kw):
        """ARGS run in NODE's network namespace (our mount namespace)."""
        p = subprocess.Popen([NSENTER, f'--net=/run/netns/{self.ns(node)}', '--'] + list(args),
                             stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent, **kw)
        self.procs.append(p)
        return p

    def close(self):
        """Undo everything, in order, whatever fails on the way: daemons
        (unmounted, stopped), members, any other process, namespaces."""
        errors = []

        def attempt(fn, *a):
            try:
                fn(*a)
            except Exception as e:   # noqa: BLE001 - go on with the rest
                errors.append(f'{fn.__name__}: {e}')
        for d in self.daemons:
            attempt(d.stop)
        for m in self.members:
            attempt(m.stop)
        for p in self.procs:
            if p.poll() is None:
                attempt(os.kill, p.pid, signal.SIGCONT)
                attempt(os.kill, p.pid, signal.SIGKILL)   # by PID: ours
                attempt(p.wait, STOP_TIMEOUT)
        for ns in reversed(self.namespaces):
            attempt(_run, [IP, 'netns', 'del', ns])
        self.namespaces = []
        return errors

    # ---- what runs in the lab ----
    def etcd_cluster(self, size=3, heartbeat_ms=50, election_ms=500):
        assert size <= sum(1 for n in self.nodes if n.startswith('e'))
        self.cluster = Cluster(self, size, heartbeat_ms, election_ms)
        self.members.extend(self.cluster.members)
        return self.cluster.start()

    def daemon(self, host, cluster, mnt, backing, lockfs_bin, options=()):
        """`lockfs -f -o backing=BACKING -o backend=etcd -o etcd=... -o
        host=HOST -o OPTIONS... MNT` in HOST's namespace; waits until mounted."""
        stderr_path = os.path.join(self.dir, f'{host}.stderr')
        cmd = [lockfs_bin, '-f', '-o', f'backing={backing}', '-o', 'backend=etcd',
               '-o', f'etcd={cluster.endpoints}', '-o', f'host={host}']
        for o in options:
            cmd += ['-o', o]
        with open(stderr_path, 'ab') as err:
            proc = self.popen(host, cmd + [mnt], stdout=subprocess.DEVNULL, stderr=err)
        d = Daemon(self, host, mnt, backing, proc, stderr_path)
        self.daemons.append(d)
        deadline = time.monotonic() + START_TIMEOUT
        while not _is_mounted(mnt):
            if proc.poll() is not None:
                raise RuntimeError(f'lockfs {host} exited with {proc.returncode}:\n{d.stderr()}')
            if time.monotonic() > deadline:
                raise TimeoutError(f'lockfs {host} not mounted within {START_TIMEOUT} s:\n'
                                   + d.stderr())
            time.sleep(0.02)
        return d

    # ---- faults ----
    def partition(self, side_a, side_b):
        """Nothing passes between the nodes of SIDE_A and those of SIDE_B
        (rules in SIDE_A's namespaces, both directions)."""
        for a in side_a:
            for b in side_b:
                self._ipt(a, '-A', 'INPUT', '-s', self.addr(b), '-j', 'DROP')
                self._ipt(a, '-A', 'OUTPUT', '-d', self.addr(b), '-j', 'DROP')
            self.faulted.add(a)

    def isolate(self, node):
        """NODE reaches no other node (loopback still works)."""
        self._ipt(node, '-A', 'INPUT', '-i', 'eth0', '-j', 'DROP')
        self._ipt(node, '-A', 'OUTPUT', '-o', 'eth0', '-j', 'DROP')
        self.faulted.add(node)

    def slow(self, node, rate_kbit, loss):
        """NODE's link gets slow both ways (tbf at RATE_KBIT on its eth0
        and on its port of the switch: packets queue behind each other, a
        1,500-byte one takes 1500*8/RATE ms to pass; `latency 400ms` bounds
        the queue) and lossy (LOSS, 0..1, of incoming packets dropped at
        random by iptables' statistic match)."""
        for ns, dev in ((self.ns(node), 'eth0'), (self.ns('sw'), f'v-{node}')):
            _run([TC, '-n', ns, 'qdisc', 'replace', 'dev', dev, 'root', 'tbf',
                  'rate', f'{rate_kbit}kbit', 'burst', '1600', 'latency', '400ms'])
        if loss > 0:
            self._ipt(node, '-A', 'INPUT', '-i', 'eth0', '-m', 'statistic', '--mode', 'random',
                      '--probability', f'{loss:.3f}', '-j', 'DROP')
        self.faulted.add(node)

    def heal(self):
        """Every network fault undone; every paused member resumed."""
        for node in sorted(self.faulted):
            self._ipt(node, '-F', 'INPUT')
            self._ipt(node, '-F', 'OUTPUT')
            _run([TC, '-n', self.ns(node), 'qdisc', 'del', 'dev', 'eth0', 'root'], check=False)
            _run([TC, '-n', self.ns('sw'), 'qdisc', 'del', 'dev', f'v-{node}', 'root'],
                 check=False)
        self.faulted.clear()
        for m in self.members:
            if m.paused:
                m.resume()


@contextlib.contextmanager
def lab(workdir, **kw):
    with Lab(workdir, **kw) as lb:
        yield lb
