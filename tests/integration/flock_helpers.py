"""Helpers and a fixture for the issue-4 tests (waiting through M/.flock/NAME).

- `procs` (fixture): starts the processes a test needs and kills every one
  of them by pid (SIGKILL + a bounded reap) before the mounts are unmounted.
    procs.locker(user=None, env=None, setup='', pass_fds=())  -> Locker
    procs.shell(user=None, env=None)                           -> Shell
    procs.popen(cmd, **kw)                                     -> Popen
    procs.adopt(pid)   a process the test did not start itself (a forked
                       grandchild): killed by pid at teardown as well
- `Locker`: a long-lived /usr/bin/python3 that opens files, calls flock(2),
  fcntl(2) and lockf(3) and does mkdir/rmdir/read/write on request.  A
  request can be started and its answer collected later, so a blocking
  flock stays pending while the test looks at M/NAME/waiters.  Requests run
  in the main thread (the one a signal interrupts) unless bg=True.
- `Shell`: a bash reading commands from a pipe, so `exec 9>M/.flock/x;
  flock 9` happens in one shell process across several commands.
- M/.flock/NAME and M/NAME/waiters readers: `fpath`, `read_waiters`,
  `waiter_pids`, `wait_waiters`, `read_bind`.
- /proc helpers: `proc_state`, `proc_syscall_nr`, `children_of`,
  `threads_of`, `blocked_in_flock`.

All waits are bounded; nothing here sleeps to synchronise.
"""

import errno
import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import time

import pytest

from lockfs_helpers import PYTHON, proc_start_time, wait_until

SYS_FLOCK = 73          # x86_64
SYS_FCNTL = 72
#: struct flock on x86_64: short l_type, short l_whence, off_t l_start,
#: off_t l_len, pid_t l_pid (+ padding): 32 bytes
FLOCK_FMT = 'hhqqi4x'


def fpath(m, name):
    """M/.flock/NAME"""
    return m.path('.flock', name)


def read_waiters(m, name):
    """M/NAME/waiters as a list of dicts (queue order); None if NAME is not held."""
    try:
        with open(m.path(name, 'waiters'), 'rb') as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    text = data.decode('utf-8')
    assert text == '' or text.endswith('\n'), f'waiters does not end with a newline: {text!r}'
    return [json.loads(l) for l in text.split('\n')[:-1]]


def waiter_pids(m, name):
    return [w['pid'] for w in (read_waiters(m, name) or [])]


def wait_waiters(m, name, pids, timeout=5.0):
    """Wait until M/NAME/waiters lists exactly PIDS, in that order."""
    pids = list(pids)
    last = []

    def ok():
        last[:] = [waiter_pids(m, name)]
        return last[0] == pids
    try:
        wait_until(ok, timeout=timeout, interval=0.003, what=f'{name!r} waiters == {pids}')
    except AssertionError:
        raise AssertionError(f'M/{name}/waiters lists {last[0] if last else "?"}, '
                             f'expected {pids} (timed out after {timeout}s)') from None


def read_bind(m, name):
    with open(m.path(name, 'bind'), 'rb') as f:
        return f.read()


def held_names(m):
    """ls M/.flock"""
    return sorted(os.listdir(os.fsencode(m.path('.flock'))))


def holder_pids(m, name):
    """pids in owner.holders (sorted), or None when NAME is not held."""
    from lockfs_helpers import read_owner
    try:
        o = read_owner(m.mnt, name)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return sorted(h['pid'] for h in o['holders'])


# --------------------------------------------------------------------------
# /proc

def proc_state(pid):
    """One-letter state from /proc/PID/stat ('' if the process is gone)."""
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return ''
    return data[data.rindex(b')') + 2:].split()[0].decode()


def proc_syscall_nr(pid):
    """The syscall PID is blocked in (-1 when running or gone)."""
    try:
        with open(f'/proc/{pid}/syscall') as f:
            first = f.read().split()
    except OSError:
        return -1
    if not first or first[0] in ('running', '-1'):
        return -1
    return int(first[0])


def blocked_in(pid, nr):
    return proc_state(pid) == 'S' and proc_syscall_nr(pid) == nr


def blocked_in_flock(pid):
    return blocked_in(pid, SYS_FLOCK)


def children_of(pid):
    out = []
    try:
        for tid in os.listdir(f'/proc/{pid}/task'):
            with open(f'/proc/{pid}/task/{tid}/children') as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def threads_of(pid):
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            if line.startswith('Threads:'):
                return int(line.split()[1])
    raise AssertionError(f'no Threads: line for {pid}')


def start_or_none(pid):
    """PID's start time, or None once it is gone."""
    try:
        return proc_start_time(pid)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None


def gone(pid):
    """True once PID no longer exists (or is a zombie)."""
    return proc_state(pid) in ('', 'Z', 'X')


# --------------------------------------------------------------------------
# the Locker: a python process that locks on request

LOCKER_SRC = r'''
import fcntl, json, os, signal, struct, sys, threading, time
FL = 'hhqqi4x'
_out = threading.Lock()
def P(x): return bytes.fromhex(x)
def reply(res):
    with _out:
        os.write(1, (json.dumps(res) + '\n').encode())
def do(req):
    op = req['op']
    res = {}
    try:
        if op == 'open':
            res['fd'] = os.open(P(req['path']), req['flags'], 0o666)
        elif op == 'close':
            os.close(req['fd'])
        elif op == 'dup':
            res['fd'] = os.dup(req['fd'])
        elif op == 'flock':
            fcntl.flock(req['fd'], req['how'])
        elif op == 'cflock':
            # libc's flock(2) straight: an EINTR is returned, not retried (PEP 475)
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.flock(req['fd'], req['how']) != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))
        elif op == 'lockf':
            fcntl.lockf(req['fd'], req['how'], req['len'], req['start'], req['whence'])
        elif op == 'fcntl':
            buf = struct.pack(FL, req['type'], req['whence'], req['start'], req['len'], 0)
            r = fcntl.fcntl(req['fd'], req['cmd'], buf)
            t, w, s, l, p = struct.unpack(FL, r)
            res.update(type=t, whence=w, start=s, len=l, pid=p)
        elif op == 'mkdir':
            os.mkdir(P(req['path']))
        elif op == 'rmdir':
            os.rmdir(P(req['path']))
        elif op == 'read':
            with open(P(req['path']), 'rb') as f:
                res['data'] = f.read().hex()
        elif op == 'write':
            fd = os.open(P(req['path']), os.O_WRONLY | os.O_TRUNC)
            try:
                res['n'] = os.write(fd, P(req['data']))
            finally:
                os.close(fd)
        elif op == 'writefd':
            res['n'] = os.write(req['fd'], P(req['data']))
        elif op == 'fork':
            # a child that inherits every descriptor and just lives on
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(r)
                    devnull = os.open('/dev/null', os.O_RDWR)
                    os.dup2(devnull, 0)
                    os.dup2(devnull, 1)
                    os.write(w, b'x')
                    os.close(w)
                    while True:
                        signal.pause()
                finally:
                    os._exit(0)
            os.close(w)
            os.read(r, 1)
            os.close(r)
            res['pid'] = pid
        elif op == 'info':
            res.update(pid=os.getpid(), uid=os.getuid())
        else:
            raise ValueError(op)
    except OSError as e:
        res = {'errno': e.errno}
    res['id'] = req['id']
    res['t'] = time.time()
    reply(res)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # forked children reap themselves
buf = b''
while True:
    while b'\n' not in buf:
        chunk = os.read(0, 65536)
        if not chunk:
            sys.exit(0)
        buf += chunk
    line, buf = buf.split(b'\n', 1)
    req = json.loads(line)
    if req['op'] == 'exit':
        break
    if req.get('bg'):
        threading.Thread(target=do, args=(req,), daemon=True).start()
    else:
        do(req)
'''


def _kill_and_reap(proc, what):
    """SIGKILL PROC unless already reaped (its pid may be anyone's then), and
    reap it within 10 s, else fail with WHAT."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        raise AssertionError(what) from None


class LockerError(OSError):
    pass


class Locker:
    """See the module docstring.  Ops answer 0 / errno, or a value."""

    TIMEOUT = 30.0

    def __init__(self, user=None, env=None, setup='', pass_fds=()):
        e = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
        if env:
            e.update(env)
        kw = {}
        if user is not None:
            kw = dict(user=user.uid, group=user.gid, extra_groups=[])
        self.proc = subprocess.Popen([PYTHON, '-c', setup + '\n' + LOCKER_SRC],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd='/', env=e, pass_fds=pass_fds, **kw)
        self.pid = self.proc.pid
        self._buf = b''
        self._answers = {}
        self._next = 0

    def __repr__(self):
        return f'<Locker {self.pid}>'

    # -- protocol -------------------------------------------------------
    def start(self, op, **req):
        """Send a request, do not wait; returns its id."""
        self._next += 1
        req.update(op=op, id=self._next)
        self.proc.stdin.write((json.dumps(req) + '\n').encode())
        self.proc.stdin.flush()
        return self._next

    def _pump(self, timeout):
        fd = self.proc.stdout.fileno()
        r, _, _ = select.select([fd], [], [], max(0.0, timeout))
        if not r:
            return False
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f'locker {self.pid} died (rc={self.proc.poll()})')
        self._buf += chunk
        while b'\n' in self._buf:
            line, self._buf = self._buf.split(b'\n', 1)
            a = json.loads(line)
            self._answers[a['id']] = a
        return True

    def poll(self, rid):
        """The answer to RID if it has arrived, else None (never blocks)."""
        while rid not in self._answers:
            if not self._pump(0):
                return None
        return self._answers[rid]

    def wait(self, rid, timeout=None):
        """The answer to RID; AssertionError after TIMEOUT."""
        timeout = self.TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while rid not in self._answers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f'locker {self.pid}: request {rid} still pending '
                                     f'after {timeout}s')
            self._pump(left)
        return self._answers.pop(rid)

    def call(self, op, timeout=None, **req):
        return self.wait(self.start(op, **req), timeout)

    # -- operations -----------------------------------------------------
    @staticmethod
    def _p(path):
        return os.fsencode(path).hex()

    def open(self, path, flags=os.O_RDWR | os.O_CREAT):
        """fd; raises LockerError"""
        r = self.call('open', path=self._p(path), flags=flags)
        if 'errno' in r:
            raise LockerError(r['errno'], os.strerror(r['errno']), path)
        return r['fd']

    def close(self, fd):
        return self.call('close', fd=fd).get('errno', 0)

    def dup(self, fd):
        return self.call('dup', fd=fd)['fd']

    def flock(self, fd, how, timeout=None):
        """0 or errno"""
        return self.call('flock', fd=fd, how=how, timeout=timeout).get('errno', 0)

    def flock_start(self, fd, how, bg=False):
        """Start a (blocking) flock; returns the request id for poll/wait."""
        return self.start('flock', fd=fd, how=how, bg=bg)

    def cflock_start(self, fd, how):
        """Start libc flock(2) through ctypes: a signal without SA_RESTART
        makes it answer EINTR instead of Python retrying it."""
        return self.start('cflock', fd=fd, how=how)

    def lockf(self, fd, how, length=0, start=0, whence=0):
        return self.call('lockf', fd=fd, how=how, len=length, start=start,
                         whence=whence).get('errno', 0)

    def lockf_start(self, fd, how, length=0, start=0, whence=0, bg=False):
        return self.start('lockf', fd=fd, how=how, len=length, start=start, whence=whence,
                          bg=bg)

    def fcntl_lock(self, fd, cmd, typ, start=0, length=0, whence=os.SEEK_SET):
        """dict(type, whence, start, len, pid) or dict(errno)"""
        return self.call('fcntl', fd=fd, cmd=cmd, type=typ, start=start, len=length,
                         whence=whence)

    def fcntl_start(self, fd, cmd, typ, start=0, length=0, whence=os.SEEK_SET):
        return self.start('fcntl', fd=fd, cmd=cmd, type=typ, start=start, len=length,
                          whence=whence)

    def mkdir(self, path):
        return self.call('mkdir', path=self._p(path)).get('errno', 0)

    def rmdir(self, path):
        return self.call('rmdir', path=self._p(path)).get('errno', 0)

    def read(self, path):
        r = self.call('read', path=self._p(path))
        if 'errno' in r:
            raise LockerError(r['errno'], os.strerror(r['errno']), path)
        return bytes.fromhex(r['data'])

    def write(self, path, data):
        """0 or errno (open O_WRONLY|O_TRUNC, write, close)"""
        return self.call('write', path=self._p(path), data=bytes(data).hex()).get('errno', 0)

    def writefd(self, fd, data):
        r = self.call('writefd', fd=fd, data=bytes(data).hex())
        return r.get('errno', 0), r.get('n')

    def fork(self):
        """pid of a child that inherited every descriptor and pauses forever."""
        return self.call('fork')['pid']

    def take(self, path, how=fcntl.LOCK_EX):
        """open PATH and flock it (must succeed at once); returns the fd."""
        fd = self.open(path)
        rc = self.flock(fd, how, timeout=10)
        assert rc == 0, f'locker {self.pid}: flock({path}, {how}) -> {errno.errorcode.get(rc)}'
        return fd

    # -- lifetime -------------------------------------------------------
    def kill(self):
        """SIGKILL and reap (bounded)."""
        _kill_and_reap(self.proc, f'locker {self.pid} does not die (stuck in a FUSE '
                                  f'request the daemon never answers?)')

    def exit(self):
        """Let it exit normally (closes its descriptors); wait for it."""
        if self.proc.poll() is None:
            self.proc.stdin.write(b'{"op": "exit", "id": 0}\n')
            self.proc.stdin.flush()
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f'locker {self.pid} does not exit')


# --------------------------------------------------------------------------
# the Shell: one bash process across several commands

class Shell:
    """bash reading commands from a pipe; stderr goes to stdout."""

    def __init__(self, user=None, env=None):
        e = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
        if env:
            e.update(env)
        kw = {}
        if user is not None:
            kw = dict(user=user.uid, group=user.gid, extra_groups=[])
        self.proc = subprocess.Popen(['bash', '--noprofile', '--norc'], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     cwd='/', env=e, **kw)
        self.pid = self.proc.pid
        self._n = 0
        self._buf = b''
        self._done = {}

    def __repr__(self):
        return f'<Shell {self.pid}>'

    def start(self, cmd):
        """Send CMD (one line, must not read stdin); returns a tag for wait/poll."""
        assert '\n' not in cmd
        self._n += 1
        tag = f'__lockfs_done_{self._n}__'
        self.proc.stdin.write(f'{cmd}\necho "{tag} $?"\n'.encode())
        self.proc.stdin.flush()
        return tag

    def _pump(self, timeout):
        fd = self.proc.stdout.fileno()
        r, _, _ = select.select([fd], [], [], max(0.0, timeout))
        if not r:
            return False
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f'shell {self.pid} exited (rc={self.proc.poll()}); '
                                 f'output so far: {self._buf!r}')
        self._buf += chunk
        while True:
            i = self._buf.find(b'__lockfs_done_')
            if i < 0:
                break
            j = self._buf.find(b'\n', i)
            if j < 0:
                break
            tag, rc = self._buf[i:j].decode().split()
            self._done[tag] = (int(rc), self._buf[:i].decode('utf-8', 'replace'))
            self._buf = self._buf[j + 1:]
        return True

    def poll(self, tag):
        while tag not in self._done:
            if not self._pump(0):
                return None
        return self._done[tag]

    def wait(self, tag, timeout=30.0):
        """(exit status, output) of the command with TAG."""
        deadline = time.monotonic() + timeout
        while tag not in self._done:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f'shell {self.pid}: {tag} not done after {timeout}s; '
                                     f'output so far: {self._buf!r}')
            self._pump(left)
        return self._done.pop(tag)

    def run(self, cmd, timeout=30.0):
        return self.wait(self.start(cmd), timeout)

    def ok(self, cmd, timeout=30.0):
        """Run CMD, assert exit status 0, return its output."""
        rc, out = self.run(cmd, timeout)
        assert rc == 0, f'shell {self.pid}: {cmd!r} exited {rc}: {out}'
        return out

    def kill(self):
        _kill_and_reap(self.proc, f'shell {self.pid} does not die')

    def exit(self, timeout=10):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'exit 0\n')
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f'shell {self.pid} does not exit')


def sh_quote(s):
    return "'" + os.fspath(s).replace("'", "'\\''") + "'"


# --------------------------------------------------------------------------
# the fixture

class Procs:
    def __init__(self):
        self.lockers = []
        self.shells = []
        self.popens = []
        self.adopted = []

    def locker(self, user=None, env=None, setup='', pass_fds=()):
        lk = Locker(user=user, env=env, setup=setup, pass_fds=pass_fds)
        self.lockers.append(lk)
        return lk

    def shell(self, user=None, env=None):
        s = Shell(user=user, env=env)
        self.shells.append(s)
        return s

    def popen(self, cmd, **kw):
        kw.setdefault('stdin', subprocess.DEVNULL)
        p = subprocess.Popen(cmd, **kw)
        self.popens.append(p)
        return p

    def adopt(self, pid):
        # Remember its start time: pids are recycled fast here (pid_max
        # 32768), and a pid that exited must never be killed again.
        self.adopted.append((pid, start_or_none(pid)))
        return pid

    def cleanup(self):
        """Lockers and shells idle in a read of their stdin are let go by
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
        mine = [lk.proc for lk in self.lockers] + [s.proc for s in self.shells]
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
    """Processes of one test; all SIGKILLed and reaped before unmounting."""
    p = Procs()
    yield p
    problems = p.cleanup()
    if problems:
        pytest.fail('; '.join(problems), pytrace=False)


def is_wouldblock(e):
    return e in (errno.EWOULDBLOCK, errno.EAGAIN)


def flock_struct(typ, start=0, length=0, whence=os.SEEK_SET):
    return struct.pack(FLOCK_FMT, typ, whence, start, length, 0)


def dir_state(m):
    """snapshot(DIR) without DIR/.lockfs, whose pid the daemon may still be
    writing just after the mount appeared (it is the daemon's, not a lock's)."""
    from lockfs_helpers import snapshot
    s = snapshot(m.dir)
    s.pop(b'.lockfs', None)
    return s
