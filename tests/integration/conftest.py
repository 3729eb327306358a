"""Real-mount harness for the lockfs integration tests (run as root).

Modelled on libfuse's test/util.py: the daemon runs in the foreground with
its stderr in a file, the mount is awaited by polling /proc/self/mountinfo
(failing fast if the daemon dies), and teardown unmounts with fusermount3,
requires exit status 0 and a stderr free of errors and sanitizer reports.

Environment:
  LOCKFS_BUILD the build dir (default: this checkout's build/)
  LOCKFS_BIN   the daemon (default LOCKFS_BUILD/lockfs)
"""

import grp
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time

import pytest

# This folder's helper modules (lockfs_helpers, agent, ...) and the fixtures
# every suite shares (tests/fixtures/: etcd_fixtures, tcp_proxy), importable
# from the tests in every subfolder.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), 'fixtures'))
sys.path.insert(0, _HERE)
from lockfs_helpers import (LOCKFS_BIN, fuse_conn_alive,  # noqa: E402
                            fusermount_u, is_lockfs_mounted, mount_dev, mount_entry,
                            rmtree_unguarded, unguard)
from agent import Agent  # noqa: E402
from flock_helpers import Shell, gone, proc_syscall_nr, start_or_none  # noqa: E402

MOUNT_TIMEOUT = 10.0
EXIT_TIMEOUT = 10.0
UNMOUNT_GRACE = 2.0
STDERR_BAD = ('ERROR', 'AddressSanitizer', 'LeakSanitizer', 'ThreadSanitizer',
              'UndefinedBehaviorSanitizer', 'runtime error:')


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: takes more than a few seconds')


@pytest.fixture(scope='session', autouse=True)
def _require_root_and_binary():
    if os.geteuid() != 0:
        pytest.fail('the lockfs integration tests must run as root')
    if not os.access(LOCKFS_BIN, os.X_OK):
        pytest.fail(f'LOCKFS_BIN={LOCKFS_BIN} is not an executable file')


def _read(path):
    try:
        with open(path, 'rb') as f:
            return f.read().decode('utf-8', 'replace')
    except FileNotFoundError:
        return ''


# Frames of code that is not ours: a leak allocated only through these is
# libfuse's own.  libfuse 3.14 keeps an INTERRUPT that arrives after its
# request was answered in a session list that fuse_session_destroy never
# frees: 128 bytes, whenever such a late INTERRUPT is the last message.
_FOREIGN_FRAMES = ('libfuse3.so', 'libc.so', 'libasan.so', 'libubsan.so', '<unknown module>',
                   'in malloc', 'in calloc', 'in realloc', 'in __interceptor_')


def _without_libfuse_leaks(text):
    """TEXT minus LeakSanitizer reports whose every leak was allocated by
    libfuse itself (no frame of lockfs in its stack)."""
    out, block = [], None
    for line in text.splitlines():
        if block is None and 'ERROR: LeakSanitizer' in line:
            block = [line]
            if out and set(out[-1]) == {'='}:
                block.insert(0, out.pop())
            continue
        if block is not None:
            block.append(line)
            if line.startswith('SUMMARY: AddressSanitizer') or \
                    line.startswith('SUMMARY: LeakSanitizer'):
                frames = [l for l in block if l.strip().startswith('#')]
                if not frames or any(not any(f in l for f in _FOREIGN_FRAMES) for l in frames):
                    out.extend(block)  # a leak of ours: keep every line
                block = None
            continue
        out.append(line)
    if block is not None:
        out.extend(block)
    return '\n'.join(out)


def stderr_problems(text):
    text = _without_libfuse_leaks(text)
    return [l for l in text.splitlines() if any(b in l for b in STDERR_BAD)]


class Mount:
    """One running lockfs daemon: .mnt, .dir, .proc, .stderr_path."""

    def __init__(self, mnt, backing, proc, stderr_path, stdout_path, cmd,
                 allow_other=False, options=()):
        self.mnt = mnt
        self.dir = backing
        self.proc = proc
        self.pid = proc.pid
        self.stderr_path = stderr_path
        self.stdout_path = stdout_path
        self.cmd = cmd
        self.allow_other = allow_other
        self.options = tuple(options)
        self.stopped = False
        self.returncode = None

    def __repr__(self):
        return f'<Mount {self.mnt} backing={self.dir} pid={self.proc.pid}>'

    def path(self, *parts):
        """M/parts...; bytes if any part is bytes, else str."""
        if any(isinstance(p, bytes) for p in parts):
            return os.path.join(os.fsencode(self.mnt), *[os.fsencode(p) for p in parts])
        return os.path.join(self.mnt, *parts)

    def dpath(self, *parts):
        """DIR/parts...; bytes if any part is bytes, else str."""
        if any(isinstance(p, bytes) for p in parts):
            return os.path.join(os.fsencode(self.dir), *[os.fsencode(p) for p in parts])
        return os.path.join(self.dir, *parts)

    def lockdir(self, name):
        """DIR/NAME.lock"""
        if isinstance(name, bytes):
            return os.path.join(os.fsencode(self.dir), name + b'.lock')
        return os.path.join(self.dir, name + '.lock')

    def stderr(self):
        return _read(self.stderr_path)

    def is_mounted(self):
        return is_lockfs_mounted(self.mnt)

    def assert_alive(self):
        rc = self.proc.poll()
        assert rc is None, f'daemon exited with {rc}; stderr:\n{self.stderr()}'
        assert self.is_mounted(), f'{self.mnt} is not a fuse.lockfs mount; stderr:\n{self.stderr()}'

    def _wait_exit(self):
        try:
            self.returncode = self.proc.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.returncode = None
            raise AssertionError(f'daemon pid {self.proc.pid} did not exit within '
                                 f'{EXIT_TIMEOUT}s; stderr:\n{self.stderr()}')
        return self.returncode

    def unmount(self):
        """fusermount3 -u; wait for the daemon; return its exit status.

        The kernel ends the connection only when the last copy of the mount
        is gone.  Any mount namespace made while M was mounted (another
        suite's `unshare --mount`, a container started meanwhile) holds a
        copy, and the daemon rightly serves it until that namespace ends;
        if the connection is still alive a moment after the unmount, the
        daemon is stopped with SIGTERM instead (it then exits 0 as well).
        A daemon that stays up although its connection is gone still fails.
        """
        self.stopped = True
        dev = mount_dev(self.mnt)
        fusermount_u(self.mnt)
        try:
            self.returncode = self.proc.wait(UNMOUNT_GRACE)
            return self.returncode
        except subprocess.TimeoutExpired:
            pass
        if dev and fuse_conn_alive(dev):
            self.proc.send_signal(signal.SIGTERM)
        return self._wait_exit()

    def signal(self, sig):
        """Send SIG to the daemon; wait for it; return its exit status."""
        self.stopped = True
        self.proc.send_signal(sig)
        return self._wait_exit()

    def kill9(self, lazy=False):
        """Crash the daemon: SIGKILL, reap it, then detach its dead mount with
        fusermount3 -u (if busy: -uz at once if LAZY, else -u retried
        briefly, then -uz).  Returns the daemon's exit status (-SIGKILL)."""
        self.stopped = True
        self.proc.send_signal(signal.SIGKILL)
        rc = self._wait_exit()
        if lazy:
            r = subprocess.run(['fusermount3', '-u', self.mnt], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            if r.returncode != 0 and mount_entry(self.mnt) is not None:
                subprocess.run(['fusermount3', '-uz', self.mnt], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        else:
            fusermount_u(self.mnt)
        assert mount_entry(self.mnt) is None, f'{self.mnt} still mounted after fusermount3'
        return rc


def _recorded_pid(backing):
    """The pid in DIR/.lockfs (what a daemon writes once it has mounted)."""
    try:
        with open(os.path.join(backing, '.lockfs')) as f:
            return int(f.readline() or 0)
    except (OSError, ValueError):
        return 0


@pytest.fixture
def lockfs_factory(tmp_path):
    """start(backing=None, allow_other=False, options=(), wrapper=(),
             mountpoint=None) -> Mount.

    WRAPPER is a command prefix (e.g. unshare) that must exec or fork the
    daemon and exit with its status.
    A fresh backing dir tmp_path/backingN (mode 0700) unless BACKING is
    given; the mountpoint is in a world-traversable temporary directory so
    that other uids can reach it with allow_other, unless MOUNTPOINT (an
    existing, unmounted directory, e.g. a crashed Mount's .mnt) is given.

    start.restart(m, options=None) starts a new daemon on m's backing dir
    and mountpoint with m's options (m must be stopped and unmounted, e.g.
    by m.kill9()).
    REPLACING=True: a dead or wedged lockfs mount is still on MOUNTPOINT and
    the new daemon must replace it: it is ready once it has mounted and
    written its pid to DIR/.lockfs (the device number may be the same).
    """
    base = tempfile.mkdtemp(prefix='lockfs-it-')
    os.chmod(base, 0o755)
    mounts = []

    def start(backing=None, allow_other=False, options=(), wrapper=(), mountpoint=None,
              replacing=None):
        n = len(mounts)
        if backing is None:
            backing = str(tmp_path / f'backing{n}')
            os.mkdir(backing)
            os.chmod(backing, 0o700)
        if mountpoint is None:
            mnt = os.path.join(base, f'mnt{n}')
            os.mkdir(mnt)
            os.chmod(mnt, 0o755)
        else:
            mnt = mountpoint
            assert replacing or mount_entry(mnt) is None, f"{mnt} is still mounted"
        stderr_path = str(tmp_path / f'lockfs{n}.stderr')
        stdout_path = str(tmp_path / f'lockfs{n}.stdout')
        cmd = list(wrapper) + [LOCKFS_BIN, '-f', '-o', f'backing={backing}']
        if allow_other:
            cmd += ['-o', 'allow_other']
        for o in options:
            cmd += ['-o', o]
        cmd.append(mnt)
        # Under LeakSanitizer a leak must not change the exit status by
        # itself: stderr_problems() judges the report (libfuse's own leak
        # is not ours), and any other leak still fails the test.
        env = dict(os.environ)
        env['LSAN_OPTIONS'] = ':'.join(x for x in (env.get('LSAN_OPTIONS'), 'exitcode=0') if x)
        with open(stderr_path, 'wb') as ef, open(stdout_path, 'wb') as of:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=of, stderr=ef, env=env)
        m = Mount(mnt, backing, proc, stderr_path, stdout_path, cmd,
                  allow_other=allow_other, options=options)
        mounts.append(m)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while True:
            rc = proc.poll()
            if rc is not None:
                m.stopped = True
                m.returncode = rc
                pytest.fail(f'daemon exited with {rc} before mounting: {cmd}\n'
                            f'stderr:\n{m.stderr()}')
            entry = mount_entry(mnt)
            if entry is not None and replacing and _recorded_pid(backing) != proc.pid:
                entry = None  # still the mount it is to replace
            if entry is not None:
                assert entry[0] == 'fuse.lockfs', f'{mnt} mounted with type {entry[0]}'
                break
            if time.monotonic() > deadline:
                pytest.fail(f'{mnt} not mounted after {MOUNT_TIMEOUT}s: {cmd}\n'
                            f'stderr:\n{m.stderr()}')
            time.sleep(0.01)
        return m

    def restart(m, options=None):
        assert m.stopped, f'{m} is still running'
        return start(backing=m.dir, allow_other=m.allow_other,
                     options=m.options if options is None else options, mountpoint=m.mnt)

    start.restart = restart
    yield start

    problems = []
    for m in reversed(mounts):
        try:
            if not m.stopped:
                rc = m.proc.poll()
                if rc is not None:
                    problems.append(f'{m}: daemon died during the test with {rc}')
                    m.stopped = True
                elif not m.is_mounted():
                    problems.append(f'{m}: mount vanished while the daemon ran')
                    m.proc.kill()
                    m.proc.wait()
                    m.stopped = True
                else:
                    rc = m.unmount()
                    if rc != 0:
                        problems.append(f'{m}: daemon exit status {rc} after fusermount3 -u')
                    # A clean exit leaves none of the daemon's temporaries
                    # (pooled directories included) behind in DIR.
                    left = [n for n in os.listdir(m.dir) if n.startswith('.lockfs-')]
                    if left:
                        problems.append(f'{m}: temporaries left in DIR after exit: {left[:5]}')
        except AssertionError as e:
            problems.append(str(e))
        if mount_entry(m.mnt) is not None:
            fusermount_u(m.mnt)
        bad = stderr_problems(m.stderr())
        if bad:
            problems.append(f'{m}: daemon stderr reports errors:\n' + '\n'.join(bad[:20]))
        if problems and m.stderr():
            problems.append(f'--- stderr of {m} ---\n{m.stderr()[-4000:]}')
        # The daemon made its mount point immutable (the guard).
        if mount_entry(m.mnt) is None:
            unguard(m.mnt)
        try:
            os.rmdir(m.mnt)
        except OSError:
            pass
    if not any(mount_entry(os.path.join(base, n)) for n in os.listdir(base)):
        rmtree_unguarded(base)
    if problems:
        pytest.fail('\n'.join(problems), pytrace=False)


@pytest.fixture
def mnt(lockfs_factory):
    """A fresh lockfs mount (root only)."""
    return lockfs_factory()


@pytest.fixture
def mnt_ao(lockfs_factory):
    """A fresh lockfs mount with -o allow_other (for other uids)."""
    return lockfs_factory(allow_other=True)


# --------------------------------------------------------------------------
# test users

class User:
    def __init__(self, uid, gid, name):
        self.uid, self.gid, self.name = uid, gid, name

    def __repr__(self):
        return f'User({self.name}:{self.uid}:{self.gid})'


def _ensure_user(uid, name):
    try:
        pw = pwd.getpwuid(uid)
        return User(uid, pw.pw_gid, pw.pw_name)
    except KeyError:
        pass
    try:
        grp.getgrgid(uid)
    except KeyError:
        subprocess.run(['groupadd', '-g', str(uid), name], check=True)
    subprocess.run(['useradd', '-M', '-N', '-u', str(uid), '-g', str(uid),
                    '-d', '/nonexistent', '-s', '/usr/sbin/nologin', name], check=True)
    pw = pwd.getpwuid(uid)
    return User(uid, pw.pw_gid, pw.pw_name)


@pytest.fixture(scope='session')
def users():
    """Two unprivileged users: users[0] is uid 4242, users[1] uid 4343."""
    return [_ensure_user(4242, 'lockfs-test'), _ensure_user(4343, 'lockfs-test2')]


# --------------------------------------------------------------------------
# processes of one test: agents (agent.py), shells, others

class Procs:
    """What `procs` hands out; see `procs`."""

    def __init__(self):
        self.agents = []
        self.shells = []
        self.popens = []
        self.adopted = []

    def agent(self, user=None, env=None, setup='', pass_fds=()):
        """A new Agent (agent.py) as USER, with ENV added, running SETUP first."""
        a = Agent(user=user, env=env, setup=setup, pass_fds=pass_fds)
        self.agents.append(a)
        return a

    def shell(self, user=None, env=None):
        """A new Shell (flock_helpers.py): one bash across several commands."""
        s = Shell(user=user, env=env)
        self.shells.append(s)
        return s

    def popen(self, cmd, **kw):
        """subprocess.Popen(CMD, stdin=DEVNULL unless given, **KW)"""
        kw.setdefault('stdin', subprocess.DEVNULL)
        p = subprocess.Popen(cmd, **kw)
        self.popens.append(p)
        return p

    def adopt(self, pid):
        """A process the test did not start itself (a forked grandchild):
        killed by pid at teardown as well."""
        # Remember its start time: pids are recycled fast here (pid_max
        # 32768), and a pid that exited must never be killed again.
        self.adopted.append((pid, start_or_none(pid)))
        return pid

    def cleanup(self):
        """Agents and shells idle in a read of their stdin are let go by
        closing it (they exit and close their descriptors like any program);
        every other process, and any that does not exit within 2 s, gets
        SIGKILL.  (A SIGKILLed process closing a file on the mount makes the
        kernel send an INTERRUPT for its FLUSH; if that is the last message
        before the unmount, libfuse 3.14 keeps it unanswered in its list of
        early interrupts and LeakSanitizer reports 128 bytes.)"""
        problems = []
        for pid, start in self.adopted:
            try:
                if start is not None and start_or_none(pid) == start:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        mine = [a.proc for a in self.agents] + [s.proc for s in self.shells]
        idle = [p for p in mine if p.poll() is None and proc_syscall_nr(p.pid) == 0]
        for p in idle:                                  # in read(2) of stdin
            try:
                p.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for p in idle:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        procs = mine + self.popens
        for p in procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                problems.append(f'pid {p.pid} does not die (stuck in a FUSE request?)')
            for f in (p.stdin, p.stdout, p.stderr):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        for pid, start in self.adopted:
            while start is not None and not gone(pid) and start_or_none(pid) == start \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
        return problems


@pytest.fixture
def procs(lockfs_factory):
    """The processes of one test, all stopped and reaped before the mounts
    are unmounted (a stuck one fails the test):
        procs.agent(user=None, env=None, setup='', pass_fds=())  -> Agent
        procs.shell(user=None, env=None)                           -> Shell
        procs.popen(cmd, **kw)                                     -> Popen
        procs.adopt(pid)"""
    p = Procs()
    yield p
    problems = p.cleanup()
    if problems:
        pytest.fail('; '.join(problems), pytrace=False)


@pytest.fixture
def scratch_dir():
    """A world-traversable temporary directory (mountpoints for CLI tests)."""
    d = tempfile.mkdtemp(prefix='lockfs-cli-')
    os.chmod(d, 0o755)
    yield d
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if mount_entry(p) is not None:
            fusermount_u(p)
    rmtree_unguarded(d)
