"""Helpers for the issue-8 §2 modules (test_fds.py, test_quota.py,
test_mass_recovery.py): processes that press on the daemon's limits, and
the everyday operations that must keep working for everyone else."""

import json
import os
import select
import signal
import subprocess
import time

from lockfs_helpers import PYTHON, read_log

# A process (as some uid) that opens a path again and again and keeps the
# descriptors: the way one user can make the daemon keep descriptors.
HOG_SRC = r'''
import json, os, sys
fds = []
for line in sys.stdin:
    req = json.loads(line)
    res = {}
    if req['op'] == 'fill':
        err = 0
        # A free .flock name is opened with O_CREAT, as flock(1) does.
        flags = os.O_RDONLY | (os.O_CREAT if '/.flock/' in req['path'] else 0)
        while req.get('max') is None or len(fds) < req['max']:
            try:
                fds.append(os.open(req['path'], flags))
            except OSError as e:
                err = e.errno
                break
        res = {'n': len(fds), 'errno': err}
    elif req['op'] == 'drop':
        for fd in fds:
            os.close(fd)
        fds = []
    elif req['op'] == 'exit':
        break
    sys.stdout.write(json.dumps(res) + '\n')
    sys.stdout.flush()
'''


class Hog:
    """Opens PATH until refused, as USER (None: root), holding every fd."""

    def __init__(self, user=None):
        kw = {}
        if user is not None:
            kw = dict(user=user.uid, group=user.gid, extra_groups=[])
        self.proc = subprocess.Popen([PYTHON, '-c', HOG_SRC], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd='/', **kw)

    def _call(self, **req):
        self.proc.stdin.write((json.dumps(req) + '\n').encode())
        self.proc.stdin.flush()
        r, _, _ = select.select([self.proc.stdout], [], [], 60)
        assert r, f'hog {self.proc.pid}: no answer to {req}'
        return json.loads(self.proc.stdout.readline())

    def fill(self, path, limit=None):
        """Open PATH until an error (or LIMIT opens in all); (count held, errno)."""
        r = self._call(op='fill', path=os.fspath(path), max=limit)
        return r['n'], r['errno']

    def drop(self):
        self._call(op='drop')

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self.proc.stdin.close()
        self.proc.stdout.close()


# What every user does every day: take and release a lock, list the locks,
# read the log, and take an fd lock.  Each step's errno (0 = it worked).
EVERYDAY_SRC = r'''
import errno, fcntl, json, os, sys
m, name = sys.argv[1], sys.argv[2]
res = {}
def step(k, fn):
    try:
        fn()
        res[k] = 0
    except OSError as e:
        res[k] = e.errno
def cat_log():
    with open(os.path.join(m, '.log'), 'rb') as f:
        f.read()
def flock():
    fd = os.open(os.path.join(m, '.flock', name), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
step('mkdir', lambda: os.mkdir(os.path.join(m, name)))
step('ls', lambda: os.listdir(m))
step('cat .log', cat_log)
step('owner', lambda: open(os.path.join(m, name, 'owner'), 'rb').close())
step('rmdir', lambda: os.rmdir(os.path.join(m, name)))
step('flock', flock)
print(json.dumps(res))
'''


def everyday(m, name, user=None, timeout=30):
    """Run the everyday steps on lock NAME as USER; {step: errno}."""
    kw = {}
    if user is not None:
        kw = dict(user=user.uid, group=user.gid, extra_groups=[])
    r = subprocess.run([PYTHON, '-c', EVERYDAY_SRC, m.mnt, name], stdout=subprocess.PIPE,
                       cwd='/', timeout=timeout, check=True, **kw)
    return json.loads(r.stdout)


def fd_limits(pid):
    """(soft, hard) RLIMIT_NOFILE of process PID, from /proc/PID/limits."""
    with open(f'/proc/{pid}/limits') as f:
        for line in f:
            if line.startswith('Max open files'):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError(f'no "Max open files" in /proc/{pid}/limits')


def open_fds(pid):
    return len(os.listdir(f'/proc/{pid}/fd'))


def refused_lines(m, reason=None):
    return [l for l in read_log(m.dir)
            if l.event == 'refused' and (reason is None or l.details.get('reason') == reason)]


def nofile(soft, hard=None):
    """A wrapper that starts the daemon with RLIMIT_NOFILE SOFT:HARD."""
    return ('prlimit', f'--nofile={soft}:{hard if hard is not None else soft}', '--')


def kill_and_reap(proc):
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def wait_lines(m, pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        ls = [l for l in read_log(m.dir) if pred(l)]
        if ls:
            return ls
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out after {timeout}s waiting for {what}')
        time.sleep(0.01)
