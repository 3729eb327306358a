"""Issue 4 point 2: flock(2) on M/.flock/NAME takes lock NAME.

"LOCK_EX exclusive, LOCK_SH shared (any number of readers, no writer),
LOCK_NB try (EWOULDBLOCK when it would wait); converting between shared and
exclusive behaves as flock(2) documents (not atomic: released, then queued
anew).  flock(2) on any other file of the mount fails with ENOLCK.  It is the
same lock as `mkdir M/NAME`: a flock holder shows as M/NAME in ls with an
owner record ("bound": "fd", "mode": "exclusive" or "shared" with every
shared holder listed; the holder resolved by the first issue's rule, so that
flock(1) is skipped and `exec 9>...; flock 9` shows the shell); mkdir M/NAME
fails with EEXIST while anyone holds it; a LOCK_EX waiter queues behind a
mkdir holder and is granted when that holder rmdirs or dies."
"""

import errno
import fcntl
import json
import os
import subprocess

import pytest

from flock_helpers import (fpath, held_names, holder_pids, is_wouldblock,  # noqa: F401
                           read_waiters, wait_waiters)
from lockfs_helpers import (RFC3339_MS, errno_of, log_for, proc_comm, read_owner, wait_free,
                            wait_until)

EX, SH, NB, UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_NB, fcntl.LOCK_UN


def _granted(answer):
    assert 'errno' not in answer, f'flock failed: {errno.errorcode.get(answer["errno"])}'
    return answer


def test_lock_ex_holds_name_with_an_fd_bound_exclusive_record(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    assert 'x' in os.listdir(mnt.mnt)
    o = read_owner(mnt.mnt, 'x')
    assert o['resource'] == 'x'
    assert o['bound'] == 'fd'
    assert o['mode'] == 'exclusive'
    assert o['holder']['pid'] == lk.pid
    assert o['holder']['comm'] == proc_comm(lk.pid)
    assert len(o['holders']) == 1
    h0 = o['holders'][0]
    for k, v in o['holder'].items():
        assert h0[k] == v, (k, h0, o['holder'])
    assert h0['fence'] == o['fence']
    assert RFC3339_MS.match(h0['acquired_at'])
    with open(mnt.path('x', 'fence')) as f:
        assert int(f.read()) == o['fence']
    acq = [l for l in log_for(mnt.dir, 'x') if l.event == 'acquired']
    assert len(acq) == 1
    d = acq[0].details
    assert (d.get('bound'), d.get('mode'), d.get('pid'), d.get('fence')) == \
        ('fd', 'exclusive', str(lk.pid), str(o['fence'])), acq[0].raw
    assert lk.flock(fd, UN) == 0
    wait_free(mnt, 'x')
    assert errno_of(os.stat, mnt.path('x')) == errno.ENOENT
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']


def test_lock_nb_on_an_exclusively_held_name_is_ewouldblock(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.take(fpath(mnt, 'x'))
    fb = b.open(fpath(mnt, 'x'))
    o = read_owner(mnt.mnt, 'x')
    assert is_wouldblock(b.flock(fb, EX | NB))
    assert is_wouldblock(b.flock(fb, SH | NB))
    assert read_owner(mnt.mnt, 'x') == o
    assert a.flock(fa, UN) == 0
    assert b.flock(fb, EX | NB) == 0          # negative control: free now
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == b.pid


def test_lock_sh_any_number_of_readers_no_writer(mnt, procs):
    readers = [procs.agent() for _ in range(4)]
    fds = [r.take(fpath(mnt, 'x'), SH) for r in readers]
    o = read_owner(mnt.mnt, 'x')
    assert o['bound'] == 'fd' and o['mode'] == 'shared'
    assert sorted(h['pid'] for h in o['holders']) == sorted(r.pid for r in readers)
    assert o['holder'] == {k: v for k, v in o['holders'][0].items() if k in o['holder']}
    for h in o['holders']:
        assert isinstance(h['fence'], int)
        assert RFC3339_MS.match(h['acquired_at'])
    writer = procs.agent()
    wfd = writer.open(fpath(mnt, 'x'))
    assert is_wouldblock(writer.flock(wfd, EX | NB))
    assert procs.agent().mkdir(mnt.path('x')) == errno.EEXIST
    for r, fd in zip(readers[:-1], fds[:-1]):
        assert r.flock(fd, UN) == 0
    assert holder_pids(mnt, 'x') == [readers[-1].pid]
    assert is_wouldblock(writer.flock(wfd, EX | NB))      # one reader is enough
    assert readers[-1].flock(fds[-1], UN) == 0
    assert writer.flock(wfd, EX | NB) == 0
    assert read_owner(mnt.mnt, 'x')['mode'] == 'exclusive'


def test_mkdir_holder_blocks_flock_and_flock_holder_blocks_mkdir(mnt, procs):
    """The same lock both ways."""
    a = procs.agent()
    lk = procs.agent()
    fd = lk.open(fpath(mnt, 'x'))
    assert a.mkdir(mnt.path('x')) == 0
    assert is_wouldblock(lk.flock(fd, EX | NB))
    assert is_wouldblock(lk.flock(fd, SH | NB))
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == a.pid
    assert a.rmdir(mnt.path('x')) == 0
    assert lk.flock(fd, EX | NB) == 0
    assert a.mkdir(mnt.path('x')) == errno.EEXIST
    assert a.rmdir(mnt.path('x')) == errno.EPERM      # a is not the holder
    assert lk.flock(fd, UN) == 0
    assert lk.flock(fd, SH | NB) == 0
    assert a.mkdir(mnt.path('x')) == errno.EEXIST      # shared holders count too
    assert lk.flock(fd, UN) == 0
    assert a.mkdir(mnt.path('x')) == 0                 # control
    assert a.rmdir(mnt.path('x')) == 0


def test_flock1_is_skipped_exec_9_flock_9_shows_the_shell(mnt):
    script = 'exec 9>"$1" || exit 11; flock 9 || exit 12; echo "$$"; cat "$2"; true'
    r = subprocess.run(['bash', '-c', script, 'bash', fpath(mnt, 'x'), mnt.path('x', 'owner')],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid, rec = r.stdout.decode().split('\n', 1)
    o = json.loads(rec)
    assert o['holder']['pid'] == int(pid)
    assert o['holder']['comm'] == 'bash'
    assert o['bound'] == 'fd' and o['mode'] == 'exclusive'


def test_flock1_with_a_command_shows_its_caller(mnt):
    """bash -> flock(1) -> cat: flock is a helper, the holder is bash."""
    script = 'echo "$$"; flock "$1" cat "$2"; true'
    r = subprocess.run(['bash', '-c', script, 'bash', fpath(mnt, 'x'), mnt.path('x', 'owner')],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid, rec = r.stdout.decode().split('\n', 1)
    o = json.loads(rec)
    assert (o['holder']['pid'], o['holder']['comm']) == (int(pid), 'bash')
    wait_free(mnt, 'x')


@pytest.mark.parametrize('path', ['.log', 'x/owner', 'x/operation', 'x/fence', 'x/lease',
                                  'x/waiters', 'x/bind'])
def test_flock_on_any_other_file_of_the_mount_is_enolck(mnt, path):
    os.mkdir(mnt.path('x'))
    o = read_owner(mnt.mnt, 'x')
    fd = os.open(mnt.path(*path.split('/')), os.O_RDONLY)
    try:
        for how in (EX | NB, SH | NB, EX, SH):
            assert errno_of(fcntl.flock, fd, how) == errno.ENOLCK, how
    finally:
        os.close(fd)
    assert read_owner(mnt.mnt, 'x') == o
    assert held_names(mnt) == [b'x']
    os.rmdir(mnt.path('x'))


def test_lock_ex_waiter_behind_mkdir_holder_is_granted_on_rmdir(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    w = procs.agent()
    fd = w.open(fpath(mnt, 'x'))
    rid = w.flock_start(fd, EX)
    wait_waiters(mnt, 'x', [w.pid])
    assert w.poll(rid) is None
    assert a.rmdir(mnt.path('x')) == 0
    _granted(w.wait(rid, 5))
    o = read_owner(mnt.mnt, 'x')
    assert (o['holder']['pid'], o['bound'], o['mode']) == (w.pid, 'fd', 'exclusive')
    assert read_waiters(mnt, 'x') == []
    ev = [(l.event, l.details.get('pid')) for l in log_for(mnt.dir, 'x')]
    assert ev == [('acquired', str(a.pid)), ('released', str(a.pid)),
                  ('acquired', str(w.pid))], ev


def test_lock_ex_waiter_behind_mkdir_holder_is_granted_when_it_dies(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    w = procs.agent()
    fd = w.open(fpath(mnt, 'x'))
    rid = w.flock_start(fd, EX)
    wait_waiters(mnt, 'x', [w.pid])
    assert w.poll(rid) is None
    a.kill()
    _granted(w.wait(rid, 5))
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w.pid
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'recovered', 'acquired']


def test_lock_sh_waiter_behind_mkdir_holder_is_granted_shared(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    r1, r2 = procs.agent(), procs.agent()
    f1, f2 = r1.open(fpath(mnt, 'x')), r2.open(fpath(mnt, 'x'))
    q1 = r1.flock_start(f1, SH)
    wait_waiters(mnt, 'x', [r1.pid])
    q2 = r2.flock_start(f2, SH)
    wait_waiters(mnt, 'x', [r1.pid, r2.pid])
    assert a.rmdir(mnt.path('x')) == 0
    _granted(r1.wait(q1, 5))
    _granted(r2.wait(q2, 5))
    o = read_owner(mnt.mnt, 'x')
    assert o['mode'] == 'shared'
    assert sorted(h['pid'] for h in o['holders']) == sorted([r1.pid, r2.pid])


def test_stranger_cannot_rmdir_an_flock_lock(mnt, procs):
    lk = procs.agent()
    lk.take(fpath(mnt, 'x'))
    assert procs.agent().rmdir(mnt.path('x')) == errno.EPERM
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == lk.pid


# -- conversions ------------------------------------------------------------

def test_sole_reader_converts_to_exclusive(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'), SH)
    assert read_owner(mnt.mnt, 'x')['mode'] == 'shared'
    assert lk.flock(fd, EX, timeout=5) == 0
    o = read_owner(mnt.mnt, 'x')
    assert (o['mode'], o['holder']['pid'], len(o['holders'])) == ('exclusive', lk.pid, 1)
    other = procs.agent()
    assert is_wouldblock(other.flock(other.open(fpath(mnt, 'x')), SH | NB))
    acq = [l.details.get('mode') for l in log_for(mnt.dir, 'x') if l.event == 'acquired']
    assert acq[0] == 'shared' and acq[-1] == 'exclusive', log_for(mnt.dir, 'x')


def test_exclusive_holder_converts_to_shared(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'), EX)
    assert lk.flock(fd, SH, timeout=5) == 0
    o = read_owner(mnt.mnt, 'x')
    assert o['mode'] == 'shared' and [h['pid'] for h in o['holders']] == [lk.pid]
    other = procs.agent()
    ofd = other.open(fpath(mnt, 'x'))
    assert other.flock(ofd, SH | NB) == 0           # readers may join now
    assert holder_pids(mnt, 'x') == sorted([lk.pid, other.pid])
    writer = procs.agent()
    assert is_wouldblock(writer.flock(writer.open(fpath(mnt, 'x')), EX | NB))


def test_upgrade_waits_for_the_other_reader(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.take(fpath(mnt, 'x'), SH)
    fb = b.take(fpath(mnt, 'x'), SH)
    rid = a.flock_start(fa, EX)
    wait_waiters(mnt, 'x', [a.pid])
    assert read_waiters(mnt, 'x')[0]['mode'] == 'exclusive'
    assert a.poll(rid) is None
    assert holder_pids(mnt, 'x') == [b.pid]          # released first (not atomic)
    assert b.flock(fb, UN) == 0
    _granted(a.wait(rid, 5))
    o = read_owner(mnt.mnt, 'x')
    assert (o['mode'], o['holder']['pid']) == ('exclusive', a.pid)


def test_upgrade_with_lock_nb_fails_while_another_reader_holds(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.take(fpath(mnt, 'x'), SH)
    b.take(fpath(mnt, 'x'), SH)
    assert is_wouldblock(a.flock(fa, EX | NB))
    o = read_owner(mnt.mnt, 'x')
    assert o['mode'] == 'shared' and b.pid in [h['pid'] for h in o['holders']]
    assert read_waiters(mnt, 'x') == []               # LOCK_NB never queues


def test_downgrade_lets_queued_readers_in(mnt, procs):
    a, r = procs.agent(), procs.agent()
    fa = a.take(fpath(mnt, 'x'), EX)
    fr = r.open(fpath(mnt, 'x'))
    rid = r.flock_start(fr, SH)
    wait_waiters(mnt, 'x', [r.pid])
    assert a.flock(fa, SH, timeout=5) == 0
    _granted(r.wait(rid, 5))
    o = read_owner(mnt.mnt, 'x')
    assert o['mode'] == 'shared'
    assert sorted(h['pid'] for h in o['holders']) == sorted([a.pid, r.pid])


def test_downgrade_behind_a_queued_writer_waits_its_turn(mnt, procs):
    """Released, then queued anew: the queued writer goes first."""
    a, x = procs.agent(), procs.agent()
    fa = a.take(fpath(mnt, 'x'), EX)
    fx = x.open(fpath(mnt, 'x'))
    qx = x.flock_start(fx, EX)
    wait_waiters(mnt, 'x', [x.pid])
    qa = a.flock_start(fa, SH)
    _granted(x.wait(qx, 5))
    wait_waiters(mnt, 'x', [a.pid])
    assert read_waiters(mnt, 'x')[0]['mode'] == 'shared'
    assert a.poll(qa) is None
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == x.pid
    assert x.flock(fx, UN) == 0
    _granted(a.wait(qa, 5))
    o = read_owner(mnt.mnt, 'x')
    assert (o['mode'], o['holder']['pid']) == ('shared', a.pid)


def test_relock_in_the_same_mode_keeps_the_lock(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'), EX)
    fence = read_owner(mnt.mnt, 'x')['fence']
    assert lk.flock(fd, EX | NB) == 0
    assert lk.flock(fd, EX, timeout=5) == 0
    o = read_owner(mnt.mnt, 'x')
    assert (o['holder']['pid'], o['mode']) == (lk.pid, 'exclusive')
    assert read_waiters(mnt, 'x') == []
    assert [l.event for l in log_for(mnt.dir, 'x')][-1] == 'acquired'
    assert o['fence'] >= fence
    assert lk.flock(fd, UN) == 0
    wait_until(lambda: errno_of(os.stat, mnt.path('x')) == errno.ENOENT, what='release')


def test_a_dying_reader_leaves_the_other_readers_holding(mnt, procs):
    a, b = procs.agent(), procs.agent()
    a.take(fpath(mnt, 'x'), SH)
    fb = b.take(fpath(mnt, 'x'), SH)
    a.kill()
    wait_until(lambda: holder_pids(mnt, 'x') == [b.pid], what='the dead reader to leave')
    o = read_owner(mnt.mnt, 'x')
    assert o['mode'] == 'shared' and o['holder']['pid'] == b.pid
    assert b.flock(fb, UN) == 0
    wait_free(mnt, 'x')


def test_each_reader_keeps_its_own_fence_and_time_when_another_leaves(mnt, procs):
    """owner.holders lists every shared holder "with fence and acquired_at":
    its own, issued when it got its share -- not the departed first reader's."""
    a, b, c = procs.agent(), procs.agent(), procs.agent()
    fa = a.take(fpath(mnt, 'x'), SH)
    b.take(fpath(mnt, 'x'), SH)
    c.take(fpath(mnt, 'x'), SH)
    before = {h['pid']: (h['fence'], h['acquired_at']) for h in read_owner(mnt.mnt, 'x')['holders']}
    assert len({f for f, _ in before.values()}) == 3, before       # one fence each
    acq = {int(l.details['pid']): int(l.details['fence'])
           for l in log_for(mnt.dir, 'x') if l.event == 'acquired'}
    assert {p: f for p, (f, _) in before.items()} == acq
    assert a.flock(fa, UN) == 0
    after = {h['pid']: (h['fence'], h['acquired_at']) for h in read_owner(mnt.mnt, 'x')['holders']}
    assert after == {b.pid: before[b.pid], c.pid: before[c.pid]}, (before, after)
