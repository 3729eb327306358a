"""The test agent: one long-lived /usr/bin/python3 that does file and lock
operations on request, over JSON lines on its stdin and stdout.

Tests start it with the `procs` fixture (`procs.agent(user=None, env=None,
setup='', pass_fds=())`, conftest.py), which stops every agent before the
mounts are unmounted.  It runs as USER (a conftest `User`) with ENV added to
the test's environment (never an inherited `LOCKFS_SLUG`), in `/`; SETUP is
python code run before serving (a signal handler, a process name).

Protocol: each request is one JSON object with `op` and a request `id`; each
answer carries the same `id`, the time it was sent (`t`), and either the
result or `errno` plus the `stage` (which system call failed: `open`,
`write` or `close` for a write).  Paths travel as hex (any bytes).  Requests
run one at a time in the main thread (the one a signal interrupts), unless
`bg=True` runs one in a thread of its own, so that a blocking flock can stay
pending while the agent answers other requests.

    call(op, timeout=None, **req)     send and wait for the answer
    start(op, **req) -> id            send only; poll(id) / wait(id) later

Operations (methods below): mkdir, rmdir, read, write, stat, utime, owner,
open, close, dup, flock, cflock, lockf, fcntl, writefd, fork, info.
"""

import errno
import fcntl
import json
import os
import select
import signal
import subprocess
import time

from lockfs_helpers import PYTHON

AGENT_SRC = r'''
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
    stage = op
    try:
        if op == 'mkdir':
            os.mkdir(P(req['path']))
        elif op == 'rmdir':
            os.rmdir(P(req['path']))
        elif op == 'read':
            with open(P(req['path']), 'rb') as f:
                res['data'] = f.read().hex()
        elif op == 'write':
            stage = 'open'
            fd = os.open(P(req['path']), os.O_WRONLY | (os.O_TRUNC if req['trunc'] else 0))
            try:
                stage = 'write'
                res['n'] = os.write(fd, P(req['data']))
            finally:
                stage = 'close'
                os.close(fd)
        elif op == 'stat':
            st = os.stat(P(req['path']))
            res.update(uid=st.st_uid, gid=st.st_gid, mode=st.st_mode,
                       mtime_ns=st.st_mtime_ns)
        elif op == 'utime':
            os.utime(P(req['path']))
        elif op == 'open':
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
        elif op == 'writefd':
            res['n'] = os.write(req['fd'], P(req['data']))
        elif op == 'preadfd':
            res['data'] = os.pread(req['fd'], 64, 0).hex()
        elif op == 'fork':
            # a child that inherits every descriptor and just lives on;
            # forked children reap themselves
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
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
            res.update(pid=os.getpid(), uid=os.getuid(), gid=os.getgid(),
                       ppid=os.getppid())
        else:
            raise ValueError(op)
    except OSError as e:
        res = {'errno': e.errno, 'stage': stage}
    res['id'] = req['id']
    res['t'] = time.time()
    reply(res)
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


def kill_and_reap(proc, what):
    """SIGKILL PROC unless already reaped (its pid may be anyone's then), and
    reap it within 10 s, else fail with WHAT."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        raise AssertionError(what) from None


class AgentError(OSError):
    pass


class Agent:
    """See the module docstring.  Operations answer 0 / errno, or a value."""

    TIMEOUT = 30.0

    def __init__(self, user=None, env=None, setup='', pass_fds=()):
        e = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
        if env:
            e.update(env)
        kw = {}
        if user is not None:
            kw = dict(user=user.uid, group=user.gid, extra_groups=[])
        self.proc = subprocess.Popen([PYTHON, '-c', setup + '\n' + AGENT_SRC],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd='/', env=e, pass_fds=pass_fds, **kw)
        self.pid = self.proc.pid
        self._buf = b''
        self._answers = {}
        self._next = 0

    def __repr__(self):
        return f'<Agent {self.pid}>'

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
            raise AssertionError(f'agent {self.pid} died (rc={self.proc.poll()})')
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
        """The answer to RID; AssertionError after TIMEOUT (default 30 s)."""
        timeout = self.TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while rid not in self._answers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f'agent {self.pid}: request {rid} still pending '
                                     f'after {timeout}s')
            self._pump(left)
        return self._answers.pop(rid)

    def call(self, op, timeout=None, **req):
        """Send a request and return its answer (a dict)."""
        return self.wait(self.start(op, **req), timeout)

    # -- paths and files --------------------------------------------------
    @staticmethod
    def _p(path):
        return os.fsencode(path).hex()

    def mkdir(self, path):
        """0 or errno"""
        return self.call('mkdir', path=self._p(path)).get('errno', 0)

    def rmdir(self, path):
        """0 or errno"""
        return self.call('rmdir', path=self._p(path)).get('errno', 0)

    def read(self, path):
        """File contents (bytes); raises AgentError."""
        r = self.call('read', path=self._p(path))
        if 'errno' in r:
            raise AgentError(r['errno'], os.strerror(r['errno']), path)
        return bytes.fromhex(r['data'])

    def write(self, path, data, trunc=True):
        """0 or errno (from open O_WRONLY [|O_TRUNC], write or close)"""
        return self.call('write', path=self._p(path), data=bytes(data).hex(),
                         trunc=trunc).get('errno', 0)

    def utime(self, path):
        """touch: utimensat(UTIME_NOW); 0 or errno"""
        return self.call('utime', path=self._p(path)).get('errno', 0)

    def stat(self, path):
        """dict(uid, gid, mode, mtime_ns); raises AgentError."""
        r = self.call('stat', path=self._p(path))
        if 'errno' in r:
            raise AgentError(r['errno'], os.strerror(r['errno']), path)
        return r

    def owner(self, mnt, name):
        """MNT/NAME/owner, parsed."""
        return json.loads(self.read(os.path.join(os.fsencode(mnt), os.fsencode(name), b'owner')))

    # -- descriptors and locks --------------------------------------------
    def open(self, path, flags=os.O_RDWR | os.O_CREAT):
        """fd; raises AgentError"""
        r = self.call('open', path=self._p(path), flags=flags)
        if 'errno' in r:
            raise AgentError(r['errno'], os.strerror(r['errno']), path)
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

    def writefd(self, fd, data):
        """(0 or errno, bytes written)"""
        r = self.call('writefd', fd=fd, data=bytes(data).hex())
        return r.get('errno', 0), r.get('n')

    def fork(self):
        """pid of a child that inherited every descriptor and pauses forever."""
        return self.call('fork')['pid']

    def take(self, path, how=fcntl.LOCK_EX):
        """open PATH and flock it (must succeed at once); returns the fd."""
        fd = self.open(path)
        rc = self.flock(fd, how, timeout=10)
        assert rc == 0, f'agent {self.pid}: flock({path}, {how}) -> {errno.errorcode.get(rc)}'
        return fd

    # -- lifetime -----------------------------------------------------------
    def kill(self):
        """SIGKILL and reap, bounded (a holder dying without releasing): an
        agent stuck in a FUSE request nobody answers fails the test instead
        of hanging the suite."""
        kill_and_reap(self.proc, f'agent {self.pid} does not die (stuck in a FUSE '
                                 f'request the daemon never answers?)')

    def exit(self):
        """Let it exit normally (closes its descriptors); wait for it and
        return its exit status."""
        if self.proc.poll() is None:
            self.proc.stdin.write(b'{"op": "exit", "id": 0}\n')
            self.proc.stdin.flush()
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f'agent {self.pid} does not exit')
