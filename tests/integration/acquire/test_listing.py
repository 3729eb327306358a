"""Point 8: ls M, ownership and mtime of lock dirs, M/.log."""

import os
import random
import stat
import subprocess

import pytest

from lockfs_helpers import errname, errno_of, parse_rfc3339_ms, read_owner


def _locks(m):
    return [n for n in os.listdir(os.fsencode(m.mnt)) if n not in (b'.log', b'.flock')]


def test_ls_lists_held_locks_sorted(mnt):
    names = ['zeta', 'alpha', 'Mid', 'caf\u00e9', '10', '9', 'a b', 'a-b', 'z\u2603', 'A']
    shuffled = names[:]
    random.Random(7).shuffle(shuffled)
    for n in shuffled:
        os.mkdir(mnt.path(n))
    listed = _locks(mnt)
    want = sorted(n.encode() for n in names)
    assert listed == want
    # ls -U prints readdir order: the same
    r = subprocess.run(['ls', '-U', '-1', mnt.mnt], capture_output=True, check=True,
                       env=dict(os.environ, LC_ALL='C', QUOTING_STYLE='literal'))
    assert [l for l in r.stdout.split(b'\n') if l] == want
    for n in names:
        os.rmdir(mnt.path(n))


def test_root_listing_shows_log_entry(mnt):
    assert b'.log' in os.listdir(os.fsencode(mnt.mnt))


def test_listing_many_locks_is_complete_sorted_and_stable(mnt):
    """Enough entries to need several readdir requests (offsets)."""
    names = [f'lock-{i:04d}-{"x" * (i % 37)}' for i in range(400)]
    random.Random(3).shuffle(names)
    for n in names:
        os.mkdir(mnt.path(n))
    first = _locks(mnt)
    assert first == sorted(n.encode() for n in names)
    assert _locks(mnt) == first
    for n in names:
        os.rmdir(mnt.path(n))
    assert _locks(mnt) == []


def test_listing_after_release_drops_the_entry(mnt):
    for n in ('a', 'b', 'c'):
        os.mkdir(mnt.path(n))
    os.rmdir(mnt.path('b'))
    assert _locks(mnt) == [b'a', b'c']
    os.rmdir(mnt.path('a'))
    os.rmdir(mnt.path('c'))


@pytest.mark.parametrize('who', ['root', 'lockfs-test'])
def test_lock_dir_owned_by_holder(mnt_ao, users, procs, who):
    u = users[0] if who != 'root' else None
    holder = procs.agent(user=u)
    assert holder.mkdir(mnt_ao.path('x')) == 0
    st = os.stat(mnt_ao.path('x'))
    want = (u.uid, u.gid) if u else (0, 0)
    assert (st.st_uid, st.st_gid) == want
    assert stat.S_ISDIR(st.st_mode)
    assert holder.rmdir(mnt_ao.path('x')) == 0


def test_lock_dir_mtime_is_acquisition_time(mnt):
    os.mkdir(mnt.path('x'))
    o = read_owner(mnt.mnt, 'x')
    t = parse_rfc3339_ms(o['acquired_at'])
    st = os.stat(mnt.path('x'))
    assert abs(st.st_mtime - t) < 1.0, (st.st_mtime, o['acquired_at'])
    os.rmdir(mnt.path('x'))


def test_lock_dir_mtime_changes_with_reacquisition(mnt):
    """Negative control for the mtime test: not a constant (e.g. mount time)."""
    os.mkdir(mnt.path('x'))
    t1 = os.stat(mnt.path('x')).st_mtime_ns
    a1 = read_owner(mnt.mnt, 'x')['acquired_at']
    os.rmdir(mnt.path('x'))
    # wait (by polling the clock, no event exists) until the millisecond changes
    for _ in range(10000):
        os.mkdir(mnt.path('x'))
        a2 = read_owner(mnt.mnt, 'x')['acquired_at']
        if a2 != a1:
            break
        os.rmdir(mnt.path('x'))
    else:
        raise AssertionError(f'acquired_at stuck at {a1}')
    t2 = os.stat(mnt.path('x')).st_mtime_ns
    assert t2 > t1
    os.rmdir(mnt.path('x'))


def test_log_view_is_readable_and_has_acquired_lines(mnt):
    os.mkdir(mnt.path('seen'))
    os.rmdir(mnt.path('seen'))
    with open(mnt.path('.log'), 'rb') as f:
        view = f.read()
    with open(os.path.join(mnt.dir, 'lock.log'), 'rb') as f:
        real = f.read()
    assert view == real
    lines = view.decode().splitlines()
    assert any(l.split(' ')[2] == 'seen' and l.endswith(' acquired') for l in lines), lines
    assert any(l.split(' ')[2] == 'seen' and l.endswith(' released') for l in lines), lines


def test_log_view_is_mode_0444(mnt):
    st = os.stat(mnt.path('.log'))
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o444


def test_writing_log_view_fails(mnt):
    os.mkdir(mnt.path('x'))
    with open(os.path.join(mnt.dir, 'lock.log'), 'rb') as f:
        before = f.read()

    def append():
        fd = os.open(mnt.path('.log'), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b'forged line acquired\n')
        finally:
            os.close(fd)

    assert errname(errno_of(append)) in ('EPERM', 'EACCES', 'EROFS', 'EBADF')
    assert errname(errno_of(os.truncate, mnt.path('.log'), 0)) in ('EPERM', 'EACCES', 'EROFS')
    with open(os.path.join(mnt.dir, 'lock.log'), 'rb') as f:
        assert f.read() == before
    os.rmdir(mnt.path('x'))


def test_lock_dir_contains_owner_and_operation(mnt):
    os.mkdir(mnt.path('x'))
    assert sorted(os.listdir(mnt.path('x'))) == ['bind', 'break', 'fence', 'lease', 'operation',
                                                'owner', 'waiters']
    os.rmdir(mnt.path('x'))
