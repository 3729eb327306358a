"""Helpers for the issue-4 tests (waiting through M/.flock/NAME).

- The agent that opens files and calls flock(2), fcntl(2) and lockf(3) on
  request is `agent.Agent` (`procs.agent()`; the `procs` fixture is in
  conftest.py).
- `Shell`: a bash reading commands from a pipe, so `exec 9>M/.flock/x;
  flock 9` happens in one shell process across several commands
  (`procs.shell()`).
- M/.flock/NAME and M/NAME/waiters readers: `fpath`, `read_waiters`,
  `waiter_pids`, `wait_waiters`, `read_bind`.
- /proc helpers: `proc_state`, `proc_syscall_nr`, `children_of`,
  `threads_of`, `blocked_in_flock`.

All waits are bounded; nothing here sleeps to synchronise.
"""

import errno
import json
import os
import select
import struct
import subprocess
import time

from agent import kill_and_reap
from lockfs_helpers import proc_start_time, wait_until

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
        kill_and_reap(self.proc, f'shell {self.pid} does not die')

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
