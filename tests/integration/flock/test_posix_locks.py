"""Issue 4 point 4: whole-file POSIX locks on M/.flock/NAME.

"Whole-file POSIX locks (fcntl F_SETLK/F_SETLKW/F_GETLK, lockf) on
.flock/NAME map to the same lock (F_WRLCK exclusive, F_RDLCK shared,
released by POSIX rules: any close by the owning process); byte ranges that
are not the whole file fail with ENOLCK.  Never leave a POSIX lock silently
local to the kernel while someone else holds NAME."
"""

import errno
import fcntl
import os

import pytest

from flock_helpers import (fpath, gone, holder_pids, is_wouldblock,  # noqa: F401
                           read_waiters, wait_waiters)
from lockfs_helpers import errno_of, log_for, read_owner, stays_held, wait_free, wait_until

EX, SH, NB, UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_NB, fcntl.LOCK_UN
SETLK, SETLKW, GETLK = fcntl.F_SETLK, fcntl.F_SETLKW, fcntl.F_GETLK
WR, RD, UNLCK = fcntl.F_WRLCK, fcntl.F_RDLCK, fcntl.F_UNLCK
WINDOW = 0.5


def _e(answer):
    return answer.get('errno', 0)


def _control_recovery(m, procs, name='control'):
    d = procs.agent()
    assert d.mkdir(m.path(name)) == 0
    d.kill()
    wait_free(m, name, timeout=2)


def test_lockf_takes_the_lock_exclusively(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.open(fpath(mnt, 'x'))
    assert a.lockf(fa, EX) == 0
    o = read_owner(mnt.mnt, 'x')
    assert (o['bound'], o['mode'], o['holder']['pid']) == ('fd', 'exclusive', a.pid)
    assert [h['pid'] for h in o['holders']] == [a.pid]
    assert procs.agent().mkdir(mnt.path('x')) == errno.EEXIST
    fb = b.open(fpath(mnt, 'x'))
    assert is_wouldblock(b.flock(fb, EX | NB))
    assert is_wouldblock(b.flock(fb, SH | NB))
    assert b.lockf(fb, EX | NB) in (errno.EAGAIN, errno.EACCES)
    assert _e(b.fcntl_lock(fb, SETLK, RD)) == errno.EAGAIN
    assert a.lockf(fa, UN) == 0
    wait_free(mnt, 'x')
    assert b.lockf(fb, EX | NB) == 0                 # control: free now


def test_f_setlk_conflicts_with_an_flock_holder(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.take(fpath(mnt, 'x'), EX)
    fb = b.open(fpath(mnt, 'x'))
    assert _e(b.fcntl_lock(fb, SETLK, WR)) == errno.EAGAIN
    assert _e(b.fcntl_lock(fb, SETLK, RD)) == errno.EAGAIN
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == a.pid
    assert a.flock(fa, UN) == 0
    assert _e(b.fcntl_lock(fb, SETLK, WR)) == 0
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == b.pid


def test_f_setlk_conflicts_with_a_mkdir_holder(mnt, procs):
    """Never silently local: the kernel must not grant it while mkdir holds NAME."""
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    b = procs.agent()
    fb = b.open(fpath(mnt, 'x'))
    assert _e(b.fcntl_lock(fb, SETLK, WR)) == errno.EAGAIN
    assert _e(b.fcntl_lock(fb, SETLK, RD)) == errno.EAGAIN
    assert b.lockf(fb, EX | NB) in (errno.EAGAIN, errno.EACCES)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == a.pid
    assert a.rmdir(mnt.path('x')) == 0
    assert _e(b.fcntl_lock(fb, SETLK, WR)) == 0
    assert a.mkdir(mnt.path('x')) == errno.EEXIST   # and the other way round
    assert a.rmdir(mnt.path('x')) == errno.EPERM


def test_flock_and_mkdir_conflict_with_a_posix_holder(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.open(fpath(mnt, 'x'))
    assert _e(a.fcntl_lock(fa, SETLK, WR)) == 0
    fb = b.open(fpath(mnt, 'x'))
    assert is_wouldblock(b.flock(fb, EX | NB))
    assert procs.agent().mkdir(mnt.path('x')) == errno.EEXIST


def test_f_rdlck_is_shared_with_flock_lock_sh(mnt, procs):
    a, b, c = procs.agent(), procs.agent(), procs.agent()
    fa = a.open(fpath(mnt, 'x'))
    assert _e(a.fcntl_lock(fa, SETLK, RD)) == 0
    b.take(fpath(mnt, 'x'), SH)
    o = read_owner(mnt.mnt, 'x')
    assert o['mode'] == 'shared'
    assert sorted(h['pid'] for h in o['holders']) == sorted([a.pid, b.pid])
    fc = c.open(fpath(mnt, 'x'))
    assert _e(c.fcntl_lock(fc, SETLK, WR)) == errno.EAGAIN
    assert _e(c.fcntl_lock(fc, SETLK, RD)) == 0
    assert holder_pids(mnt, 'x') == sorted([a.pid, b.pid, c.pid])


def test_f_setlkw_waits_behind_an_flock_holder_and_is_granted(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.take(fpath(mnt, 'x'), EX)
    fb = b.open(fpath(mnt, 'x'))
    rid = b.fcntl_start(fb, SETLKW, WR)
    wait_waiters(mnt, 'x', [b.pid])
    w = read_waiters(mnt, 'x')[0]
    assert (w['kind'], w['mode']) == ('posix', 'exclusive')
    assert b.poll(rid) is None
    assert a.flock(fa, UN) == 0
    assert _e(b.wait(rid, 5)) == 0
    o = read_owner(mnt.mnt, 'x')
    assert (o['holder']['pid'], o['mode'], o['bound']) == (b.pid, 'exclusive', 'fd')


def test_lockf_waits_behind_a_mkdir_holder_and_is_granted(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    b = procs.agent()
    fb = b.open(fpath(mnt, 'x'))
    rid = b.lockf_start(fb, EX)
    wait_waiters(mnt, 'x', [b.pid])
    assert b.poll(rid) is None
    assert a.rmdir(mnt.path('x')) == 0
    assert _e(b.wait(rid, 5)) == 0
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == b.pid


def test_flock_waits_behind_a_posix_holder(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.open(fpath(mnt, 'x'))
    assert a.lockf(fa, EX) == 0
    fb = b.open(fpath(mnt, 'x'))
    rid = b.flock_start(fb, EX)
    wait_waiters(mnt, 'x', [b.pid])
    assert read_waiters(mnt, 'x')[0]['kind'] == 'flock'
    assert a.lockf(fa, UN) == 0
    assert _e(b.wait(rid, 5)) == 0
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == b.pid


def test_f_getlk_reports_the_conflicting_lock(mnt, procs):
    q = procs.agent()
    fq = q.open(fpath(mnt, 'x'))
    free = q.fcntl_lock(fq, GETLK, WR)
    assert _e(free) == 0 and free['type'] == UNLCK, free
    a = procs.agent()
    fa = a.take(fpath(mnt, 'x'), EX)
    r = q.fcntl_lock(fq, GETLK, WR)
    assert _e(r) == 0 and r['type'] == WR, r
    r = q.fcntl_lock(fq, GETLK, RD)
    assert _e(r) == 0 and r['type'] == WR, r
    assert a.flock(fa, SH) == 0                      # now a reader holds it
    r = q.fcntl_lock(fq, GETLK, WR)
    assert _e(r) == 0 and r['type'] == RD, r
    r = q.fcntl_lock(fq, GETLK, RD)
    assert _e(r) == 0 and r['type'] == UNLCK, r      # readers do not conflict
    assert a.flock(fa, UN) == 0
    wait_free(mnt, 'x')
    ag = procs.agent()
    assert ag.mkdir(mnt.path('x')) == 0               # a mkdir holder conflicts too
    r = q.fcntl_lock(fq, GETLK, RD)
    assert _e(r) == 0 and r['type'] == WR, r
    assert not read_waiters(mnt, 'x')                 # F_GETLK never queues
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == ag.pid


@pytest.mark.parametrize('start,length,whence', [
    (0, 1, os.SEEK_SET), (0, 100, os.SEEK_SET), (5, 0, os.SEEK_SET), (1, 1, os.SEEK_SET),
    (10, 0, os.SEEK_CUR),
], ids=['0+1', '0+100', '5+eof', '1+1', 'cur10'])
def test_a_byte_range_is_enolck(mnt, procs, start, length, whence):
    lk = procs.agent()
    fd = lk.open(fpath(mnt, 'x'))
    for cmd in (SETLK, SETLKW, GETLK):
        for typ in (WR, RD):
            r = lk.fcntl_lock(fd, cmd, typ, start, length, whence)
            assert _e(r) == errno.ENOLCK, (cmd, typ, r)
    assert errno_of(os.stat, mnt.path('x')) == errno.ENOENT    # nothing taken
    assert _e(lk.fcntl_lock(fd, SETLK, WR)) == 0               # control: whole file


def test_lockf_with_a_length_is_enolck(mnt, procs):
    lk = procs.agent()
    fd = lk.open(fpath(mnt, 'x'))
    assert lk.lockf(fd, EX, 10) == errno.ENOLCK
    assert lk.lockf(fd, EX | NB, 0, 1) == errno.ENOLCK
    assert lk.lockf(fd, SH | NB, 4096, 0) == errno.ENOLCK
    assert errno_of(os.stat, mnt.path('x')) == errno.ENOENT
    assert lk.lockf(fd, EX | NB) == 0                           # control


def test_whole_file_from_seek_end_is_the_whole_file(mnt, procs):
    """Size 0, so SEEK_END+0 with length 0 is start 0 to EOF: the whole file."""
    lk = procs.agent()
    fd = lk.open(fpath(mnt, 'x'))
    assert _e(lk.fcntl_lock(fd, SETLK, WR, 0, 0, os.SEEK_END)) == 0
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == lk.pid


def test_any_close_by_the_owning_process_releases(mnt, procs):
    lk = procs.agent()
    f1 = lk.open(fpath(mnt, 'x'))
    assert lk.lockf(f1, EX) == 0
    f2 = lk.open(fpath(mnt, 'x'))
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == lk.pid
    assert lk.close(f2) == 0                          # another descriptor: POSIX rules
    wait_free(mnt, 'x', timeout=2)
    assert lk.lockf(f1, EX | NB) == 0
    f3 = lk.dup(f1)
    assert lk.close(f3) == 0                          # a dup counts too
    wait_free(mnt, 'x', timeout=2)


def test_a_close_by_another_process_releases_nothing(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.open(fpath(mnt, 'x'))
    assert a.lockf(fa, EX) == 0
    fb = b.open(fpath(mnt, 'x'))
    assert b.close(fb) == 0
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == a.pid


def test_posix_holder_exit_releases(mnt, procs):
    lk = procs.agent()
    fd = lk.open(fpath(mnt, 'x'))
    assert lk.lockf(fd, EX) == 0
    lk.kill()
    wait_free(mnt, 'x', timeout=2)
    assert [l.event for l in log_for(mnt.dir, 'x')][-1] in ('released', 'recovered')


def test_f_unlck_releases(mnt, procs):
    lk = procs.agent()
    fd = lk.open(fpath(mnt, 'x'))
    assert _e(lk.fcntl_lock(fd, SETLK, WR)) == 0
    assert _e(lk.fcntl_lock(fd, SETLK, UNLCK)) == 0
    wait_free(mnt, 'x')
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']


@pytest.mark.parametrize('path', ['.log', 'x/owner', 'x/operation', 'x/waiters'])
def test_posix_locks_on_other_files_are_enolck(mnt, path):
    os.mkdir(mnt.path('x'))
    fd = os.open(mnt.path(*path.split('/')), os.O_RDONLY)
    try:
        assert errno_of(fcntl.lockf, fd, SH | NB) == errno.ENOLCK
        assert errno_of(fcntl.lockf, fd, SH) == errno.ENOLCK
        from flock_helpers import flock_struct
        assert errno_of(fcntl.fcntl, fd, GETLK, flock_struct(RD)) == errno.ENOLCK
    finally:
        os.close(fd)
    os.rmdir(mnt.path('x'))


def test_posix_locks_of_one_process_never_conflict(mnt, procs):
    """POSIX rules: the owner is the process, so a second descriptor of the
    same process locks again instead of waiting for itself."""
    lk = procs.agent()
    f1 = lk.open(fpath(mnt, 'x'))
    f2 = lk.open(fpath(mnt, 'x'))
    assert lk.lockf(f1, EX) == 0
    assert lk.lockf(f2, EX | NB) == 0
    assert _e(lk.fcntl_lock(f2, SETLK, RD)) == 0
    o = read_owner(mnt.mnt, 'x')
    assert [h['pid'] for h in o['holders']] == [lk.pid]
    other = procs.agent()
    assert other.lockf(other.open(fpath(mnt, 'x')), EX | NB) in (errno.EAGAIN, errno.EACCES)


F_OFD_SETLK, F_OFD_SETLKW = 37, 38      # linux/fcntl.h


def test_an_open_file_description_lock_never_outlives_its_descriptor(mnt, procs):
    """F_OFD_SETLK is a whole-file fcntl lock too.  Whether the daemon grants
    it or refuses it, it must not leak: once granted, the last close of its
    descriptor (or its process's death) ends it, like a flock lock."""
    lk = procs.agent()
    fd = lk.open(fpath(mnt, 'x'))
    r = lk.fcntl_lock(fd, F_OFD_SETLK, WR)
    if _e(r):
        assert errno_of(os.stat, mnt.path('x')) == errno.ENOENT, 'refused, yet held'
        return
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == lk.pid
    assert lk.close(fd) == 0
    try:
        wait_free(mnt, 'x', timeout=2)
    except AssertionError:
        raise AssertionError('an F_OFD_SETLK lock stays held after its only descriptor '
                             f'was closed: {[l.raw for l in log_for(mnt.dir, "x")]}') from None
    lk2 = procs.agent()
    fd2 = lk2.open(fpath(mnt, 'y'))
    assert _e(lk2.fcntl_lock(fd2, F_OFD_SETLK, WR)) == 0
    lk2.kill()
    wait_free(mnt, 'y', timeout=2)


def test_a_forked_childs_exit_releases_nothing_of_its_parents_posix_lock(mnt, procs):
    """POSIX locks are not inherited: the child's close of the inherited
    descriptor is not a close by the owning process."""
    lk = procs.agent()
    fd = lk.open(fpath(mnt, 'x'))
    assert lk.lockf(fd, EX) == 0
    child = procs.adopt(lk.fork())
    os.kill(child, 9)
    wait_until(lambda: gone(child), what='the forked child to die')
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == lk.pid


def test_a_lock_taken_again_through_another_file_outlives_the_first_files_release(
        mnt, procs):
    """The release of an open file ends only the fcntl locks granted through it
    and not granted through another open file since: a process that closed fd1
    (ending its lock), then locked again through fd2, keeps that lock when a
    forked child's last copy of fd1 is closed."""
    lk = procs.agent()
    fd1 = lk.open(fpath(mnt, 'x'))
    assert lk.lockf(fd1, EX) == 0
    child = procs.adopt(lk.fork())          # keeps fd1's open file alive
    assert lk.close(fd1) == 0               # a close by the owner: released
    wait_free(mnt, 'x', timeout=2)
    fd2 = lk.open(fpath(mnt, 'x'))
    assert lk.lockf(fd2, EX) == 0
    os.kill(child, 9)                       # the last copy of fd1 goes: release
    wait_until(lambda: gone(child), what='the forked child to die')
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == lk.pid
