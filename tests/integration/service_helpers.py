"""Helpers for the service tests (issue 9 §3, §4): namespaces that run what
the test asks, the systemd unit read as systemd would run it, and the
sockets a service manager and syslog would offer.

No fixtures here; the test modules build on these.
"""

import json
import os
import re
import select
import shlex
import socket
import subprocess
import time

import pytest

# SOURCE_ROOT: for the tests that import it from here.
from lockfs_helpers import LOCKFS_BIN, PYTHON, SOURCE_ROOT, wait_until  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get('LOCKFS_BUILD', os.path.dirname(LOCKFS_BIN))
UNIT = os.path.join(BUILD, 'tools', 'systemd', 'lockfs.service')
MOUNTPOINT_TOOL = os.path.join(BUILD, 'tools', 'systemd', 'lockfs-mountpoint')
LOCKCTL_STATIC = os.path.join(BUILD, 'tools', 'lockctl-static')


def build_option(name):
    """The value of meson option NAME in BUILD, or None."""
    try:
        with open(os.path.join(BUILD, 'meson-info', 'intro-buildoptions.json')) as f:
            return next((o['value'] for o in json.load(f) if o['name'] == name), None)
    except OSError:
        return None


def static_lockctl_or_skip():
    """Skip (with the reason) when this build has no lockctl-static by
    design; fail when it should have one and has not."""
    if os.access(LOCKCTL_STATIC, os.X_OK):
        return
    if build_option('b_sanitize') not in (None, 'none'):
        pytest.skip('a sanitizer build cannot link lockctl-static (static and ASan exclude '
                    'each other)')
    if build_option('static_lockctl') == 'disabled':
        pytest.skip('built with -Dstatic_lockctl=disabled')
    pytest.fail(f'{LOCKCTL_STATIC} was not built: it needs libc6-dev and libjansson-dev '
                '(tools/deps.sh installs them)')


class NsAgent:
    """ns_agent.py started under PREFIX (e.g. ['unshare', '--mount']), after
    the shell SETUP ran inside.  Requests go to it over pipes."""

    TIMEOUT = 30.0

    def __init__(self, prefix, setup='', env=None):
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen(list(prefix) + [PYTHON, os.path.join(HERE, 'ns_agent.py'),
                                                     setup],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=e)
        self._buf = b''
        first = self._line(self.TIMEOUT)
        if 'ready' not in first:
            self.close()
            raise AssertionError(f'namespace agent did not start: {first}')
        # the agent's pid as the host sees it (an ancestor's pid ns)
        self.host_pid = self._host_pid(first['ready'])

    def _host_pid(self, inner):
        # prefix processes (unshare, nsenter) may fork: find the python
        # child whose innermost pid is INNER
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                with open(f'/proc/{pid}/status') as f:
                    ns = [l for l in f if l.startswith('NSpid:')][0].split()[1:]
                if int(ns[-1]) == inner and 'python' in open(f'/proc/{pid}/comm').read():
                    return pid
                with open(f'/proc/{pid}/task/{pid}/children') as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, IndexError):
                continue
        raise AssertionError(f'cannot find the agent with inner pid {inner}')

    def _line(self, timeout):
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b'\n' not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f'namespace agent {self.proc.pid}: no answer in {timeout}s')
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    err = self.proc.stderr.read().decode(errors='replace')
                    raise AssertionError(f'namespace agent died (rc={self.proc.poll()}): {err}')
                self._buf += chunk
        line, self._buf = self._buf.split(b'\n', 1)
        return json.loads(line)

    def call(self, **req):
        """Send REQ; its answer (waiting a little longer than the request's
        own timeout)."""
        self.proc.stdin.write((json.dumps(req) + '\n').encode())
        self.proc.stdin.flush()
        return self._line(req.get('timeout', 0) + self.TIMEOUT)

    def run(self, argv, env=None, timeout=30, check=False):
        r = self.call(op='run', argv=list(argv), env=env or {}, timeout=timeout)
        if check:
            assert r['rc'] == 0, f'{argv} failed ({r["rc"]}): {r["err"]}'
        return r

    def sh(self, script, env=None, timeout=30, check=False):
        return self.run(['/bin/sh', '-ec', script], env=env, timeout=timeout, check=check)

    def spawn(self, argv, env=None, stderr=None):
        return self.call(op='spawn', argv=list(argv), env=env or {}, stderr=stderr)['pid']

    def wait(self, pid, timeout=10):
        return self.call(op='wait', pid=pid, timeout=timeout)['status']

    def errno_of(self, op, path):
        return self.call(op=op, path=path).get('errno', 0)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()


def mounts_in(agent, under):
    """Mount points (deepest first) in AGENT's mount ns at or below UNDER."""
    r = agent.run(['cat', '/proc/self/mountinfo'], check=True)
    points = []
    for line in r['out'].splitlines():
        mp = re.sub(r'\\([0-7]{3})', lambda m: chr(int(m.group(1), 8)), line.split(' ')[4])
        if mp == under or mp.startswith(under.rstrip('/') + '/'):
            points.append(mp)
    return sorted(set(points), key=len, reverse=True)


def mount_line(agent, mnt):
    """(fstype, source, propagation fields) of the topmost mount on MNT in
    AGENT's namespace, or None."""
    r = agent.run(['cat', '/proc/self/mountinfo'], check=True)
    found = None
    for line in r['out'].splitlines():
        pre, _, post = line.partition(' - ')
        f = pre.split(' ')
        if re.sub(r'\\([0-7]{3})', lambda m: chr(int(m.group(1), 8)), f[4]) == mnt:
            found = (post.split(' ')[0], post.split(' ')[1], f[6:])
    return found


# --------------------------------------------------------------------------
# the unit, read as systemd runs it

def unit_settings(path=UNIT):
    """[(key, value)] of the unit's [Service] section, in order."""
    out, section = [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith('#'):
                continue
            if line.startswith('['):
                section = line
                continue
            if section == '[Service]':
                k, _, v = line.partition('=')
                out.append((k, v))
    return out


def unit_value(key, path=UNIT):
    vals = [v for k, v in unit_settings(path) if k == key]
    return vals[-1] if vals else None


def unit_environment(path=UNIT, overrides=None):
    env = {}
    for k, v in unit_settings(path):
        if k == 'Environment':
            for word in shlex.split(v):
                name, _, val = word.partition('=')
                env[name] = val
    env.update(overrides or {})
    return env


def expand_command(line, env):
    """systemd's expansion of one Exec line: ${VAR} is one word, a bare $VAR
    word splits into zero or more words; a leading '-' or '@' etc. drops."""
    line = line.lstrip('-@:+!')
    words = []
    for w in shlex.split(line):
        m = re.fullmatch(r'\$([A-Za-z_][A-Za-z0-9_]*)', w)
        if m:
            words.extend(env.get(m.group(1), '').split())
            continue
        words.append(re.sub(r'\$\{([A-Za-z_][A-Za-z0-9_]*)\}',
                            lambda mm: env.get(mm.group(1), ''), w))
    return words


def unit_commands(key, env, path=UNIT):
    """The KEY (ExecStart, ExecStartPre, ExecStopPost) commands of the unit,
    expanded, with the installed paths of lockfs and lockfs-mountpoint
    replaced by this build's."""
    cmds = []
    for k, v in unit_settings(path):
        if k != key:
            continue
        argv = expand_command(v, env)
        if argv[0].endswith('/lockfs'):
            argv[0] = LOCKFS_BIN
        elif argv[0].endswith('/lockfs-mountpoint'):
            argv[0] = MOUNTPOINT_TOOL
        cmds.append(argv)
    return cmds


# --------------------------------------------------------------------------
# what a service manager and a syslog daemon offer

class DgramSocket:
    """An AF_UNIX datagram socket bound at PATH (NOTIFY_SOCKET, /dev/log)."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        os.chmod(path, 0o666)

    def recv(self, timeout):
        """One datagram (str), or None after TIMEOUT seconds."""
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return None
        return self.sock.recv(65536).decode(errors='replace')

    def recv_until(self, pred, timeout, what='a datagram'):
        """Datagrams until PRED(text) is true; returns (match, all seen)."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f'no {what} within {timeout}s; got {seen}')
            d = self.recv(left)
            if d is None:
                continue
            seen.append(d)
            if pred(d):
                return d, seen

    def drain(self, timeout=0.0):
        out = []
        while True:
            d = self.recv(timeout)
            if d is None:
                return out
            out.append(d)

    def close(self):
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


SYSLOG_RE = re.compile(r'^<(\d+)>(?:\w{3} [ \d]\d \d\d:\d\d:\d\d )?(\S+?)\[(\d+)\]: (.*)$')


def parse_syslog(datagram):
    """(facility, severity, ident, pid, text) of a syslog(3) datagram."""
    m = SYSLOG_RE.match(datagram)
    assert m, f'not a syslog datagram: {datagram!r}'
    pri = int(m.group(1))
    return pri // 8, pri % 8, m.group(2), int(m.group(3)), m.group(4)


def daemon_pid(backing, timeout=5.0):
    """The pid a daemon wrote to BACKING/.lockfs.  A detached start returns
    after the pid is written (test_daemonize.py); a start by mount(8) or
    one still under way may not have written it yet: wait for the pid of a
    live lockfs process."""
    def read():
        try:
            with open(os.path.join(backing, '.lockfs')) as f:
                pid = int(f.read().strip())
            with open(f'/proc/{pid}/stat') as f:
                comm_state = f.read()
        except (OSError, ValueError):
            return None
        alive = comm_state.rsplit(')', 1)[1].split()[0] != 'Z'
        return pid if alive and '(lockfs)' in comm_state else None
    return wait_until(read, timeout, what=f'the daemon\'s pid in {backing}/.lockfs')
