"""Issue 4 point 8: M/NAME/waiters.

"One JSON object per line for each queued waiter (pid, comm, uid, mode,
since), in queue order."  The contract adds "kind" (flock|posix); pid and
comm are the waiter's resolved holder-to-be (flock(1) skipped), and the file
is empty when nobody waits.
"""

import errno
import fcntl
import json
import os
import stat
import subprocess
import time

from flock_helpers import (dir_state, fpath, proc_state, read_waiters,  # noqa: F401
                           wait_waiters)
from lockfs_helpers import errno_of, parse_rfc3339_ms, proc_comm, read_owner, wait_until

EX, SH, NB, UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_NB, fcntl.LOCK_UN
KEYS = {'pid', 'ns_pid', 'container', 'comm', 'uid', 'mode', 'kind', 'since'}


def test_waiters_is_an_empty_0444_file_when_nobody_waits(mnt, procs):
    os.mkdir(mnt.path('x'))
    st = os.stat(mnt.path('x', 'waiters'))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444, oct(st.st_mode)
    with open(mnt.path('x', 'waiters'), 'rb') as f:
        assert f.read() == b''
    os.rmdir(mnt.path('x'))
    lk = procs.agent()
    lk.take(fpath(mnt, 'y'))
    with open(mnt.path('y', 'waiters'), 'rb') as f:
        assert f.read() == b''


def test_waiters_of_a_name_not_held_is_enoent(mnt):
    assert errno_of(open, mnt.path('x', 'waiters'), 'rb') == errno.ENOENT


def test_one_compact_json_object_per_line_in_queue_order(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    plan = [('flock', EX), ('flock', SH), ('posix', EX), ('posix', SH), ('flock', EX)]
    ws, windows = [], []
    for kind, mode in plan:
        w = procs.agent()
        fd = w.open(fpath(mnt, 'x'))
        t0 = time.time()
        if kind == 'flock':
            w.flock_start(fd, mode)
        else:
            w.lockf_start(fd, mode)
        wait_waiters(mnt, 'x', [x.pid for x in ws] + [w.pid])
        windows.append((t0, time.time()))
        ws.append(w)
    with open(mnt.path('x', 'waiters'), 'rb') as f:
        raw = f.read()
    lines = raw.decode().split('\n')
    assert lines[-1] == '' and all(lines[:-1]), raw
    assert all(': ' not in l and '\n' not in l for l in lines[:-1])   # compact
    got = read_waiters(mnt, 'x')
    assert len(got) == len(plan)
    prev = 0
    for w, (kind, mode), (t0, t1), rec in zip(ws, plan, windows, got):
        assert set(rec) == KEYS, rec
        assert rec['pid'] == w.pid
        assert (rec['ns_pid'], rec['container']) == (w.pid, None)
        assert rec['comm'] == proc_comm(w.pid)
        assert rec['uid'] == 0
        assert rec['kind'] == kind
        assert rec['mode'] == ('exclusive' if mode == EX else 'shared')
        since = parse_rfc3339_ms(rec['since'])
        assert t0 - 0.002 <= since <= t1 + 0.002, (rec, t0, t1)
        assert since >= prev
        prev = since


def test_pid_and_comm_are_the_holder_to_be_not_flock1(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    sh = procs.shell()
    tag = sh.start(f'flock -s "{fpath(mnt, "x")}" true')
    wait_waiters(mnt, 'x', [sh.pid])
    [rec] = read_waiters(mnt, 'x')
    assert (rec['comm'], rec['mode'], rec['kind']) == ('bash', 'shared', 'flock')
    assert sh.poll(tag) is None
    assert holder.rmdir(mnt.path('x')) == 0
    assert sh.wait(tag, 10)[0] == 0


def test_uid_of_a_non_root_waiter(mnt_ao, users, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt_ao.path('x')) == 0
    w = procs.agent(user=users[0])
    fd = w.open(fpath(mnt_ao, 'x'))
    rid = w.flock_start(fd, EX)
    wait_waiters(mnt_ao, 'x', [w.pid])
    assert read_waiters(mnt_ao, 'x')[0]['uid'] == users[0].uid
    # everyone may read it
    r = subprocess.run(['setpriv', f'--reuid={users[1].uid}', f'--regid={users[1].gid}',
                        '--clear-groups', 'cat', mnt_ao.path('x', 'waiters')],
                       capture_output=True)
    assert r.returncode == 0 and b'"uid":%d' % users[0].uid in r.stdout.replace(b' ', b''), r
    assert holder.rmdir(mnt_ao.path('x')) == 0
    assert 'errno' not in w.wait(rid, 5)
    o = read_owner(mnt_ao.mnt, 'x')
    assert (o['holder']['pid'], o['holder']['uid']) == (w.pid, users[0].uid)
    assert os.stat(mnt_ao.path('x')).st_uid == users[0].uid


def test_granted_and_departed_waiters_leave_the_list(mnt, procs):
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'))
    ws = []
    for _ in range(3):
        w = procs.agent()
        fd = w.open(fpath(mnt, 'x'))
        ws.append((w, fd, w.flock_start(fd, EX)))
        wait_waiters(mnt, 'x', [x.pid for x, _, _ in ws])
    a, b, c = ws
    b[0].kill()                                     # a waiter that dies leaves
    wait_waiters(mnt, 'x', [a[0].pid, c[0].pid])
    assert h.flock(fh, UN) == 0
    assert 'errno' not in a[0].wait(a[2], 5)
    assert [r['pid'] for r in read_waiters(mnt, 'x')] == [c[0].pid]   # the granted one left
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == a[0].pid


def test_lock_nb_requests_are_never_listed(mnt, procs):
    h = procs.agent()
    h.take(fpath(mnt, 'x'))
    other = procs.agent()
    fd = other.open(fpath(mnt, 'x'))
    assert other.flock(fd, EX | NB) in (errno.EAGAIN, errno.EWOULDBLOCK)
    assert read_waiters(mnt, 'x') == []


def test_waiters_cannot_be_written(mnt, procs):
    h = procs.agent()
    h.take(fpath(mnt, 'x'))
    w = procs.agent()
    w.flock_start(w.open(fpath(mnt, 'x')), EX)
    wait_waiters(mnt, 'x', [w.pid])
    before_dir = dir_state(mnt)
    before = read_waiters(mnt, 'x')
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC):
        assert errno_of(os.open, mnt.path('x', 'waiters'), flags) in (errno.EACCES, errno.EPERM)
    assert errno_of(os.truncate, mnt.path('x', 'waiters'), 0) in (errno.EACCES, errno.EPERM)
    assert read_waiters(mnt, 'x') == before
    assert dir_state(mnt) == before_dir
    assert proc_state(w.pid) == 'S'


def test_a_waiter_whose_comm_is_not_utf8_does_not_break_the_list(mnt, procs):
    """comm is whatever a process sets (prctl PR_SET_NAME, or the name of the
    file it executed): the list must stay readable, one JSON object per line,
    as owner does for a holder with such a comm."""
    h = procs.agent()
    h.take(fpath(mnt, 'x'))
    plain = procs.agent()
    plain.flock_start(plain.open(fpath(mnt, 'x')), EX)
    wait_waiters(mnt, 'x', [plain.pid])
    odd = procs.agent(setup="import ctypes\nctypes.CDLL(None).prctl(15, b'\\xff\\xfeodd', 0, 0, 0)")
    ofd = odd.open(fpath(mnt, 'x'))                   # answered after its setup ran
    with open(f'/proc/{odd.pid}/comm', 'rb') as f:
        assert f.read() == b'\xff\xfeodd\n'                     # premise
    odd.flock_start(ofd, EX)

    def read_raw():
        try:
            with open(mnt.path('x', 'waiters'), 'rb') as f:
                return f.read()
        except OSError as e:
            raise AssertionError(f'M/x/waiters unreadable while a waiter has a non-UTF-8 comm: '
                                 f'{errno.errorcode.get(e.errno)}') from None
    # Blocked in flock(2) is not yet queued: the daemon may not have read the
    # request.  Wait for the list itself to show a second line.
    last = [b'']

    def both_listed():
        last[0] = read_raw()
        return last[0].count(b'\n') == 2
    wait_until(both_listed, what='the odd waiter to be listed')
    raw = last[0]
    recs = [json.loads(l) for l in raw.decode('utf-8').split('\n')[:-1]]
    assert [r['pid'] for r in recs] == [plain.pid, odd.pid]
    assert isinstance(recs[1]['comm'], str)
