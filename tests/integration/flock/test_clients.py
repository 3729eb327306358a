"""Issue 4 point 10: unmodified clients work.

"flock(1) (-n, -w, -s, -x, -c), Python's fcntl.flock and fcntl.lockf, and
the common lock libraries' Unix file locks pointed at M/.flock/NAME."

The common lock libraries are tested as Debian packages them
(python3-filelock, python3-fasteners, python3-portalocker; a test skips when
its package is not installed), and the syscall sequences filelock and
fasteners perform are also replayed with plain fcntl, so that they are
covered on a machine without the packages.
"""

import errno
import fcntl
import json
import os
import subprocess
import time

import pytest

from flock_helpers import (fpath, holder_pids, read_waiters, sh_quote,  # noqa: F401
                           wait_waiters)
from lockfs_helpers import PYTHON, errno_of, log_for, read_owner, wait_free, wait_until

EX, SH, NB, UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_NB, fcntl.LOCK_UN


def _flock1(m, args, cmd=None, name='x', timeout=30, user=None):
    """bash -c 'echo $$; flock ARGS M/.flock/NAME -c CMD; echo rc=$?'
    -> (bash pid, exit status of flock, output of CMD, stderr).
    CMD defaults to cat M/NAME/owner."""
    if cmd is None:
        cmd = 'cat ' + sh_quote(m.path(name, 'owner'))
    script = f'echo "$$"; flock {args} "$1" -c {sh_quote(cmd)}; echo "rc=$?"'
    kw = {}
    if user is not None:
        kw = dict(user=user.uid, group=user.gid, extra_groups=[])
    r = subprocess.run(['bash', '-c', script, 'bash', fpath(m, name)],
                       capture_output=True, timeout=timeout, cwd='/', **kw)
    lines = r.stdout.decode().split('\n')
    assert lines[-1] == '' and lines[-2].startswith('rc='), r
    return int(lines[0]), int(lines[-2][3:]), '\n'.join(lines[1:-2]), r.stderr


# -- flock(1) ---------------------------------------------------------------

def test_flock1_c_runs_the_command_under_the_lock(mnt):
    pid, rc, out, err = _flock1(mnt, '')
    assert rc == 0, err
    o = json.loads(out)
    assert (o['holder']['pid'], o['bound'], o['mode']) == (pid, 'fd', 'exclusive')
    wait_free(mnt, 'x')
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']


def test_flock1_x_is_exclusive(mnt):
    pid, rc, out, err = _flock1(mnt, '-x')
    assert rc == 0, err
    assert json.loads(out)['mode'] == 'exclusive'


def test_flock1_s_is_shared_with_other_readers(mnt, procs):
    r = procs.agent()
    r.take(fpath(mnt, 'x'), SH)
    pid, rc, out, err = _flock1(mnt, '-s -n')
    assert rc == 0, err
    o = json.loads(out)
    assert o['mode'] == 'shared'
    assert sorted(h['pid'] for h in o['holders']) == sorted([r.pid, pid])
    wait_until(lambda: holder_pids(mnt, 'x') == [r.pid],
               what='flock(1) to let go of its share')


def test_flock1_n_fails_at_once_with_exit_1_when_held(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    t0 = time.monotonic()
    pid, rc, out, err = _flock1(mnt, '-n', cmd='echo ran')
    assert rc == 1 and 'ran' not in out, (rc, out, err)
    assert time.monotonic() - t0 < 2
    pid, rc, out, err = _flock1(mnt, '-n -E 7', cmd='echo ran')
    assert rc == 7 and 'ran' not in out
    assert read_waiters(mnt, 'x') == []
    assert a.rmdir(mnt.path('x')) == 0
    pid, rc, out, err = _flock1(mnt, '-n', cmd='echo ran')    # control
    assert rc == 0 and out == 'ran'


def test_flock1_x_n_fails_against_readers(mnt, procs):
    r = procs.agent()
    r.take(fpath(mnt, 'x'), SH)
    pid, rc, out, err = _flock1(mnt, '-x -n', cmd='echo ran')
    assert rc == 1 and 'ran' not in out


def test_flock1_w_waits_then_gives_up_with_exit_1(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    t0 = time.monotonic()
    pid, rc, out, err = _flock1(mnt, '-w 1', cmd='echo ran')
    took = time.monotonic() - t0
    assert rc == 1 and 'ran' not in out, (rc, out, err)
    assert 0.9 <= took < 5, took
    assert read_waiters(mnt, 'x') == []
    assert a.rmdir(mnt.path('x')) == 0


def test_flock1_w_is_granted_when_released_in_time(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    cmd = 'cat ' + sh_quote(mnt.path('x', 'owner'))
    b = procs.popen(['bash', '-c', f'flock -w 20 "$1" -c {sh_quote(cmd)}; echo "rc=$?"',
                     'bash', fpath(mnt, 'x')], stdout=subprocess.PIPE)
    wait_waiters(mnt, 'x', [b.pid])
    assert a.rmdir(mnt.path('x')) == 0
    out, _ = b.communicate(timeout=10)
    rec, rc = out.decode().rsplit('rc=', 1)
    assert rc.strip() == '0'
    assert json.loads(rec)['holder']['pid'] == b.pid


def test_flock1_passes_the_commands_exit_status_and_releases(mnt):
    r = subprocess.run(['flock', fpath(mnt, 'x'), 'sh', '-c', 'exit 7'], timeout=30)
    assert r.returncode == 7
    wait_free(mnt, 'x')


def test_flock1_u_unlocks_a_descriptor(mnt, procs):
    sh = procs.shell()
    sh.ok(f'exec 9>"{fpath(mnt, "x")}"; flock -x 9')
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == sh.pid
    sh.ok('flock -u 9')
    wait_free(mnt, 'x')
    sh.ok('flock -s 9')
    assert read_owner(mnt.mnt, 'x')['mode'] == 'shared'


def test_flock1_as_another_user(mnt_ao, users):
    pid, rc, out, err = _flock1(mnt_ao, '', user=users[0])
    assert rc == 0, err
    o = json.loads(out)
    assert (o['holder']['uid'], o['holder']['pid']) == (users[0].uid, pid)


# -- Python's fcntl ---------------------------------------------------------

PY_FLOCK = r'''
import fcntl, json, os, sys
path, owner = sys.argv[1], sys.argv[2]
with open(path, 'w') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    a = json.load(open(owner))
    fcntl.flock(f, fcntl.LOCK_SH)
    b = json.load(open(owner))
    fcntl.flock(f, fcntl.LOCK_UN)
    gone = not os.path.exists(os.path.dirname(owner))
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
print(json.dumps([os.getpid(), a['mode'], a['holder']['pid'], b['mode'], gone]))
'''


def test_python_fcntl_flock(mnt):
    r = subprocess.run([PYTHON, '-c', PY_FLOCK, fpath(mnt, 'x'), mnt.path('x', 'owner')],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid, ma, ha, mb, gone = json.loads(r.stdout)
    assert (ma, ha, mb) == ('exclusive', pid, 'shared')
    assert gone, 'LOCK_UN did not free x'
    wait_free(mnt, 'x')                       # closed by the with block


PY_LOCKF = r'''
import fcntl, json, os, sys
path, owner = sys.argv[1], sys.argv[2]
f = open(path, 'a+')  # O_CREAT: a free name looks absent until opened so
fcntl.lockf(f, fcntl.LOCK_EX)
a = json.load(open(owner))
fcntl.lockf(f, fcntl.LOCK_UN)
gone = not os.path.exists(os.path.dirname(owner))
fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
b = json.load(open(owner))
try:
    fcntl.lockf(f, fcntl.LOCK_EX, 10)
    ranged = 0
except OSError as e:
    ranged = e.errno
print(json.dumps([os.getpid(), a['mode'], a['holder']['pid'], gone, b['mode'], ranged]))
'''


def test_python_fcntl_lockf(mnt):
    r = subprocess.run([PYTHON, '-c', PY_LOCKF, fpath(mnt, 'x'), mnt.path('x', 'owner')],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid, ma, ha, gone, mb, ranged = json.loads(r.stdout)
    assert (ma, ha, mb) == ('exclusive', pid, 'shared')
    assert gone
    assert ranged == errno.ENOLCK
    wait_free(mnt, 'x')


def test_python_fcntl_lockf_nb_conflict_raises(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    with open(fpath(mnt, 'x'), 'a') as f:
        assert errno_of(fcntl.lockf, f, EX | NB) in (errno.EAGAIN, errno.EACCES)
        assert errno_of(fcntl.flock, f, EX | NB) == errno.EWOULDBLOCK
    assert a.rmdir(mnt.path('x')) == 0


# -- what the common lock libraries do --------------------------------------

FILELOCK_REPLAY = r'''
# filelock.UnixFileLock._acquire / _release (filelock 3.x), polled like
# FileLock.acquire(timeout=T, poll_interval=0.05)
import fcntl, os, sys, time
path, timeout = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + timeout
flags = os.O_RDWR | os.O_TRUNC
if not os.path.exists(path):
    flags |= os.O_CREAT
while True:
    fd = os.open(path, flags, 0o644)
    try:
        os.fchmod(fd, 0o644)
    except PermissionError:
        pass
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
    except OSError:
        os.close(fd)
        if time.monotonic() > deadline:
            print('timeout'); sys.exit(3)
        time.sleep(0.05)
print(os.getpid(), flush=True)
sys.stdin.readline()
fcntl.flock(fd, fcntl.LOCK_UN)
os.close(fd)
'''

FASTENERS_REPLAY = r'''
# fasteners.InterProcessLock (open(path, 'a'), lockf LOCK_EX|LOCK_NB polled)
import fcntl, os, sys, time
path, timeout = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + timeout
f = open(path, 'a')
while True:
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
    except OSError:
        if time.monotonic() > deadline:
            print('timeout'); sys.exit(3)
        time.sleep(0.05)
print(os.getpid(), flush=True)
sys.stdin.readline()
fcntl.lockf(f, fcntl.LOCK_UN)
f.close()
'''


@pytest.mark.parametrize('replay', [FILELOCK_REPLAY, FASTENERS_REPLAY],
                         ids=['filelock', 'fasteners'])
def test_lock_library_syscall_sequences(mnt, procs, replay):
    p1 = procs.popen([PYTHON, '-c', replay, fpath(mnt, 'x'), '10'], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE)
    assert int(p1.stdout.readline()) == p1.pid
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == p1.pid
    # a second one polls, and gets it once the first lets go
    p2 = procs.popen([PYTHON, '-c', replay, fpath(mnt, 'x'), '0.3'], stdout=subprocess.PIPE)
    assert p2.stdout.read() == b'timeout\n' and p2.wait(10) == 3
    p3 = procs.popen([PYTHON, '-c', replay, fpath(mnt, 'x'), '20'], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE)
    p1.stdin.write(b'\n')
    p1.stdin.flush()
    assert p1.wait(10) == 0
    assert int(p3.stdout.readline()) == p3.pid
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == p3.pid
    p3.stdin.write(b'\n')
    p3.stdin.flush()
    assert p3.wait(10) == 0
    wait_until(lambda: not os.path.lexists(mnt.lockdir('x')), what='x to be free')
    acq = [l.details.get('pid') for l in log_for(mnt.dir, 'x') if l.event == 'acquired']
    assert acq == [str(p1.pid), str(p3.pid)]


LIBS = {
    # name: (acquire with timeout T, setting ok; release)
    'filelock': ("import filelock\nl = filelock.FileLock(P)\n"
                 "try:\n    l.acquire(timeout=T, poll_interval=0.05)\n    ok = True\n"
                 "except filelock.Timeout:\n    ok = False",
                 "l.release()"),
    'fasteners': ("import fasteners\nl = fasteners.InterProcessLock(P)\n"
                  "ok = l.acquire(blocking=True, delay=0.05, timeout=T)",
                  "l.release()"),
    'portalocker': ("import portalocker\n"
                    "l = portalocker.Lock(P, timeout=T, check_interval=0.05, "
                    "fail_when_locked=False)\n"
                    "try:\n    l.acquire()\n    ok = True\n"
                    "except portalocker.exceptions.LockException:\n    ok = False",
                    "l.release()"),
}

LIB_TEMPLATE = """
import os, sys
P, T = sys.argv[1], float(sys.argv[2])
{acquire}
if not ok:
    print('timeout', flush=True)
    sys.exit(3)
print(os.getpid(), flush=True)
sys.stdin.readline()
{release}
"""


@pytest.mark.parametrize('lib', sorted(LIBS))
def test_installed_lock_library(mnt, procs, lib):
    """The library itself (Debian's python3-LIB), pointed at M/.flock/x:
    it holds the lock, a second user of it times out, a third gets it when
    the first lets go."""
    r = subprocess.run([PYTHON, '-c', f'import {lib}'], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f'{lib} is not installed for {PYTHON}')
    acquire, release = LIBS[lib]
    code = LIB_TEMPLATE.format(acquire=acquire, release=release)
    p1 = procs.popen([PYTHON, '-c', code, fpath(mnt, 'x'), '10'], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE)
    assert int(p1.stdout.readline()) == p1.pid
    o = read_owner(mnt.mnt, 'x')
    assert (o['holder']['pid'], o['bound'], o['mode']) == (p1.pid, 'fd', 'exclusive')
    p2 = procs.popen([PYTHON, '-c', code, fpath(mnt, 'x'), '0.3'], stdout=subprocess.PIPE)
    assert p2.stdout.read() == b'timeout\n' and p2.wait(10) == 3
    p3 = procs.popen([PYTHON, '-c', code, fpath(mnt, 'x'), '20'], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE)
    p1.stdin.write(b'\n')
    p1.stdin.flush()
    assert p1.wait(10) == 0
    assert int(p3.stdout.readline()) == p3.pid
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == p3.pid
    p3.stdin.write(b'\n')
    p3.stdin.flush()
    assert p3.wait(10) == 0
    wait_free(mnt, 'x')
    acq = [l.details.get('pid') for l in log_for(mnt.dir, 'x') if l.event == 'acquired']
    assert acq == [str(p1.pid), str(p3.pid)]
