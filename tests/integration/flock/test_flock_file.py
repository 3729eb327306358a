"""Issue 4 point 1: M/.flock/NAME, a regular file for every valid NAME.

"Looking it up or opening it -- also with O_CREAT, O_RDWR, O_TRUNC, as
flock(1) and lock libraries do -- creates nothing in DIR and takes no lock;
chmod/fchmod/utimens on it succeed and change nothing; writes are accepted
and discarded (its size stays 0, so `exec 9>...; flock 9; echo $$ >&9`
works).  `ls M/.flock` lists the names that have holders or waiters.
O_CREAT|O_EXCL on it fails with EEXIST."
"""

import errno
import fcntl
import os
import stat
import subprocess

import pytest

from flock_helpers import dir_state, fpath, held_names
from lockfs_helpers import (errno_of, expected_name_errno, read_owner, wait_free,
                            wait_until)

VALID = ['x', 'deploy', 'a b', 'café', 'Z-9_.', 'n' * 250]


def _stat_ok(st):
    assert stat.S_ISREG(st.st_mode), oct(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o666, oct(st.st_mode)
    assert st.st_size == 0
    assert st.st_uid == os.getuid() and st.st_gid == os.getgid()   # the mounting user


def _no_lock(m, name):
    assert errno_of(os.stat, m.path(name)) == errno.ENOENT, f'{name!r} became held'
    assert not os.path.lexists(m.lockdir(name))
    assert os.fsencode(name) not in held_names(m)


def test_flock_directory_is_0555_and_owned_by_the_mounting_user(mnt):
    st = os.stat(mnt.path('.flock'))
    assert stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o555, oct(st.st_mode)
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert os.listdir(mnt.path('.flock')) == []


@pytest.mark.parametrize('name', VALID, ids=lambda n: n[:12])
def test_a_free_name_looks_absent_until_opened_with_o_creat_then_is_an_empty_0666_file(mnt, name):
    """Issue 19: a lookup of a free name leaves nothing, so it answers
    ENOENT; O_CREAT opens it (flock(1), `exec 9>`, lock libraries), and
    while it is open it is an empty 0666 file for every lookup."""
    before = dir_state(mnt)
    assert errno_of(os.stat, fpath(mnt, name)) == errno.ENOENT
    assert not os.path.isfile(fpath(mnt, name))
    fd = os.open(fpath(mnt, name), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _stat_ok(os.fstat(fd))
        _stat_ok(os.stat(fpath(mnt, name)))
        _stat_ok(os.lstat(fpath(mnt, name)))
        assert os.fstat(fd).st_ino == os.stat(fpath(mnt, name)).st_ino
        assert dir_state(mnt) == before
    finally:
        os.close(fd)
    assert errno_of(os.stat, fpath(mnt, name)) == errno.ENOENT
    _no_lock(mnt, name)


def test_open_without_o_creat_is_enoent_for_a_free_name_and_works_for_a_held_one(mnt, procs):
    assert errno_of(os.open, fpath(mnt, 'x'), os.O_RDONLY) == errno.ENOENT
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    _stat_ok(os.stat(fpath(mnt, 'x')))
    os.close(os.open(fpath(mnt, 'x'), os.O_RDONLY))
    assert a.rmdir(mnt.path('x')) == 0
    assert errno_of(os.open, fpath(mnt, 'x'), os.O_RDONLY) == errno.ENOENT


@pytest.mark.parametrize('flags', [
    os.O_WRONLY | os.O_CREAT | os.O_TRUNC,          # sh: exec 9>FILE
    os.O_RDWR | os.O_CREAT | os.O_TRUNC,            # filelock
    os.O_RDWR | os.O_CREAT,
    os.O_WRONLY | os.O_CREAT | os.O_APPEND,         # open(FILE, 'a'): fasteners, portalocker
    os.O_RDONLY | os.O_CREAT | os.O_NOCTTY,         # flock(1)
], ids=['wr-creat-trunc', 'rdwr-creat-trunc', 'rdwr-creat', 'append', 'flock1'])
def test_open_creates_nothing_in_dir_and_takes_no_lock(mnt, procs, flags):
    before = dir_state(mnt)
    fd = os.open(fpath(mnt, 'x'), flags, 0o644)
    try:
        _stat_ok(os.fstat(fd))
        assert dir_state(mnt) == before
        _no_lock(mnt, 'x')
        # another process can take the lock while the file is open here
        other = procs.agent()
        ofd = other.open(fpath(mnt, 'x'))
        assert other.flock(ofd, fcntl.LOCK_EX | fcntl.LOCK_NB) == 0
        assert read_owner(mnt.mnt, 'x')['holder']['pid'] == other.pid
        assert other.flock(ofd, fcntl.LOCK_UN) == 0
        wait_free(mnt, 'x')
    finally:
        os.close(fd)
    _no_lock(mnt, 'x')


def test_open_of_a_held_name_changes_nothing_for_the_holder(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    o = read_owner(mnt.mnt, 'x')
    before = dir_state(mnt)
    fd = os.open(fpath(mnt, 'x'), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        assert os.write(fd, b'junk\n') == 5
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    assert dir_state(mnt) == before
    assert read_owner(mnt.mnt, 'x') == o
    assert a.rmdir(mnt.path('x')) == 0


def test_chmod_fchmod_succeed_and_change_nothing(mnt):
    p = fpath(mnt, 'x')
    keep = os.open(p, os.O_RDWR | os.O_CREAT)  # a free name exists while open
    before = dir_state(mnt)
    os.chmod(p, 0o600)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o666
    fd = os.open(p, os.O_RDWR | os.O_CREAT)
    try:
        os.fchmod(fd, 0o400)
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o666
    finally:
        os.close(fd)
    assert subprocess.run(['chmod', '600', p]).returncode == 0
    _stat_ok(os.stat(p))
    assert dir_state(mnt) == before
    os.close(keep)
    _no_lock(mnt, 'x')


def test_utimens_succeeds_and_changes_nothing(mnt):
    p = fpath(mnt, 'x')
    keep = os.open(p, os.O_RDWR | os.O_CREAT)  # a free name exists while open
    before = dir_state(mnt)
    os.utime(p, (1000000000, 1000000000))          # 2001: would be visible
    assert os.stat(p).st_mtime != 1000000000
    os.utime(p)                                     # touch
    assert subprocess.run(['touch', p]).returncode == 0
    fd = os.open(p, os.O_RDWR)
    try:
        os.utime(fd, (1000000000, 1000000000))
        assert os.fstat(fd).st_mtime != 1000000000
    finally:
        os.close(fd)
    _stat_ok(os.stat(p))
    assert dir_state(mnt) == before
    os.close(keep)
    _no_lock(mnt, 'x')


def test_truncate_succeeds_and_size_stays_zero(mnt):
    p = fpath(mnt, 'x')
    keep = os.open(p, os.O_RDWR | os.O_CREAT)  # a free name exists while open
    before = dir_state(mnt)
    os.truncate(p, 4096)
    assert os.stat(p).st_size == 0
    fd = os.open(p, os.O_RDWR)
    try:
        os.ftruncate(fd, 4096)
        assert os.fstat(fd).st_size == 0
    finally:
        os.close(fd)
    os.close(keep)
    assert dir_state(mnt) == before


def test_writes_are_accepted_and_discarded(mnt):
    p = fpath(mnt, 'x')
    before = dir_state(mnt)
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        assert os.write(fd, b'12345\n') == 6
        assert os.write(fd, b'x' * 100000) == 100000
        assert os.fstat(fd).st_size == 0
        assert os.pread(fd, 100, 0) == b''
    finally:
        os.close(fd)
    with open(p, 'a') as f:
        f.write('appended\n')
        assert os.stat(p).st_size == 0
        with open(p, 'rb') as f2:
            assert f2.read() == b''
    assert dir_state(mnt) == before
    _no_lock(mnt, 'x')


def test_shell_exec_flock_echo_pid_works(mnt):
    """`exec 9>M/.flock/x; flock 9; echo $$ >&9` -- the shell holds x while it runs."""
    script = ('exec 9>"$1" || exit 11; flock 9 || exit 12; echo $$ >&9 || exit 13; '
              'echo "pid=$$"; cat "$2/x/owner" || exit 14; true')
    r = subprocess.run(['bash', '-c', script, 'bash', fpath(mnt, 'x'), mnt.mnt],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, (r.returncode, r.stderr)
    out = r.stdout.decode()
    pid = int(out.split('\n', 1)[0].split('=')[1])
    import json
    o = json.loads(out.split('\n', 1)[1])
    assert o['holder']['pid'] == pid and o['holder']['comm'] == 'bash', o
    assert o['bound'] == 'fd'
    wait_free(mnt, 'x')                # the shell exited: its fd 9 closed
    assert errno_of(os.stat, fpath(mnt, 'x')) == errno.ENOENT   # free again: absent


def test_o_creat_o_excl_is_eexist(mnt):
    for name in ('x', 'never-seen-before'):
        with pytest.raises(FileExistsError):
            os.open(fpath(mnt, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        _no_lock(mnt, name)


def test_ls_flock_lists_every_held_name_sorted(mnt, procs):
    assert held_names(mnt) == []
    assert errno_of(os.stat, fpath(mnt, 'looked-up')) == errno.ENOENT  # lookups list nothing
    os.close(os.open(fpath(mnt, 'opened'), os.O_RDWR | os.O_CREAT))
    assert held_names(mnt) == []
    a = procs.agent()
    assert a.mkdir(mnt.path('b-mkdir')) == 0
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'é-flock'))
    fd2 = lk.take(fpath(mnt, 'Z-shared'), fcntl.LOCK_SH)
    env = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
    env['LOCKFS_SLUG'] = 'agent-7'
    r = subprocess.run(['bash', '-c', 'mkdir "$1" && true', 'bash', mnt.path('c-slug')],
                       env=env, capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    want = sorted([b'b-mkdir', 'é-flock'.encode(), b'Z-shared', b'c-slug'])   # bytewise
    assert held_names(mnt) == want
    # a name with a holder and waiters is listed once
    w = procs.agent()
    wfd = w.open(fpath(mnt, 'b-mkdir'))
    rid = w.flock_start(wfd, fcntl.LOCK_EX)
    wait_until(lambda: [x['pid'] for x in _waiters(mnt, 'b-mkdir')] == [w.pid],
               what='the waiter to queue')
    assert held_names(mnt) == want
    # released names leave the listing
    assert lk.flock(fd, fcntl.LOCK_UN) == 0
    assert lk.close(fd2) == 0
    wait_until(lambda: held_names(mnt) == sorted([b'b-mkdir', b'c-slug']),
               what='released names to leave M/.flock')
    assert a.rmdir(mnt.path('b-mkdir')) == 0
    assert 'errno' not in w.wait(rid, 10)
    assert w.close(wfd) == 0
    r = subprocess.run(['bash', '-c', 'rmdir "$1"', 'bash', mnt.path('c-slug')], env=env)
    assert r.returncode == 0
    wait_until(lambda: held_names(mnt) == [], what='M/.flock to be empty')


def _waiters(m, name):
    from flock_helpers import read_waiters
    return read_waiters(m, name) or []


BAD = [
    '.hidden', '.flock', 'a\x01b', 'tab\there', 'new\nline', 'del\x7f', 'c1\u0085',
    b'\xff\xfe', b'\xc0\xaf', 'x' * 251, 'y' * 255,
]


@pytest.mark.parametrize('name', BAD, ids=lambda n: repr(n)[:16])
def test_invalid_names_are_refused_like_mkdir(mnt, name):
    want = expected_name_errno(name)
    assert want in (errno.EINVAL, errno.ENAMETOOLONG)
    p = fpath(mnt, name)
    before = dir_state(mnt)
    assert errno_of(os.stat, p) == want
    assert errno_of(os.open, p, os.O_RDWR | os.O_CREAT, 0o644) == want
    assert errno_of(os.open, p, os.O_RDONLY) == want
    assert dir_state(mnt) == before
    assert held_names(mnt) == []


def test_other_users_can_open_it_for_writing_with_allow_other(mnt_ao, users, procs):
    """mode 0666: `exec 9>M/.flock/x` works for everyone."""
    lk = procs.agent(user=users[0])
    fd = lk.open(fpath(mnt_ao, 'x'), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    assert lk.writefd(fd, b'4242\n') == (0, 5)
    assert lk.flock(fd, fcntl.LOCK_EX) == 0
    o = read_owner(mnt_ao.mnt, 'x')
    assert o['holder']['uid'] == users[0].uid and o['holder']['pid'] == lk.pid
    assert os.stat(mnt_ao.path('x')).st_uid == users[0].uid
    assert lk.close(fd) == 0
    wait_free(mnt_ao, 'x')


def test_a_name_with_waiters_behind_a_foreign_lock_is_listed(mnt, procs):
    """DIR/NAME.lock made by another tool, and a waiter queued behind it."""
    os.mkdir(mnt.lockdir('x'))
    w = procs.agent()
    fd = w.open(fpath(mnt, 'x'))
    rid = w.flock_start(fd, fcntl.LOCK_EX)
    wait_until(lambda: [x['pid'] for x in _waiters(mnt, 'x')] == [w.pid],
               what='the waiter to be listed in M/x/waiters')
    assert held_names(mnt) == [b'x']
    assert w.poll(rid) is None
    os.rmdir(mnt.lockdir('x'))
    assert 'errno' not in w.wait(rid, 10)
