"""Issue 4 point 5: FIFO, no barging, no starvation.

"Blocking requests are granted strictly in arrival order; on release the
head of the queue is granted at once, before any newcomer's mkdir or
non-blocking request can take it; a shared request behind a queued exclusive
one waits its turn.  (A script that takes DIR/NAME.lock directly with the
seed's protocol does not queue; waiters behind such a lock learn of its
release by watching DIR, and the docs say that such scripts can barge.)"

Every waiter is started alone and M/NAME/waiters is awaited to list it
before the next one starts, so "arrival order" is known to the test.
"""

import errno
import fcntl
import json
import os
import subprocess

import pytest

from flock_helpers import (blocked_in_flock, fpath, holder_pids, is_wouldblock,  # noqa: F401
                           read_waiters, wait_waiters, waiter_pids)
from lockfs_helpers import (PYTHON, assert_alternating, log_for, read_owner, wait_until)

EX, SH, NB, UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_NB, fcntl.LOCK_UN


def _queue(m, procs, name, modes, kinds=None):
    """Start one waiter per mode, each only after the previous is listed.
    Returns [(locker, fd, request id)]."""
    out = []
    for i, mode in enumerate(modes):
        kind = kinds[i] if kinds else 'flock'
        w = procs.agent()
        fd = w.open(fpath(m, name))
        if kind == 'flock':
            rid = w.flock_start(fd, mode)
        else:
            rid = w.lockf_start(fd, mode)
        wait_waiters(m, name, [x.pid for x, _, _ in out] + [w.pid])
        out.append((w, fd, rid))
    return out


def _ready(waiters):
    return [w for w, _, rid in waiters if w.poll(rid) is not None]


def _granted(w, rid, timeout=5):
    a = w.wait(rid, timeout)
    assert 'errno' not in a, f'{w}: {errno.errorcode.get(a["errno"])}'
    return a


def test_twenty_waiters_are_granted_in_arrival_order(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    ws = _queue(mnt, procs, 'x', [EX] * 20)
    assert _ready(ws) == []
    assert holder.rmdir(mnt.path('x')) == 0
    order, fences = [], []
    for k, (w, fd, rid) in enumerate(ws):
        _granted(w, rid)
        order.append(w.pid)
        o = read_owner(mnt.mnt, 'x')
        assert o['holder']['pid'] == w.pid
        fences.append(o['fence'])
        assert [x['pid'] for x in read_waiters(mnt, 'x')] == [x.pid for x, _, _ in ws[k + 1:]]
        assert _ready(ws[k + 1:]) == [], f'granted out of turn after #{k}'
        assert w.flock(fd, UN) == 0
    assert order == [w.pid for w, _, _ in ws]
    assert fences == sorted(set(fences)), f'fences not strictly increasing: {fences}'
    acq = [int(l.details['pid']) for l in log_for(mnt.dir, 'x') if l.event == 'acquired']
    assert acq == [holder.pid] + order
    assert_alternating(log_for(mnt.dir, 'x'), 'x')


def test_release_grants_the_head_at_once(mnt, procs):
    """The record is the waiter's the moment LOCK_UN returns: newcomers find it held."""
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'))
    [(w, fw, rid)] = _queue(mnt, procs, 'x', [EX])
    newcomer = procs.agent()
    fn = newcomer.open(fpath(mnt, 'x'))
    agent = procs.agent()
    assert h.flock(fh, UN) == 0
    assert agent.mkdir(mnt.path('x')) == errno.EEXIST
    assert is_wouldblock(newcomer.flock(fn, EX | NB))
    assert is_wouldblock(newcomer.flock(fn, SH | NB))
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w.pid
    _granted(w, rid)
    # the same when the holder releases with rmdir
    [(w2, fw2, rid2)] = _queue(mnt, procs, 'x', [EX])
    assert w.rmdir(mnt.path('x')) == 0
    assert agent.mkdir(mnt.path('x')) == errno.EEXIST
    assert is_wouldblock(newcomer.flock(fn, EX | NB))
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w2.pid
    _granted(w2, rid2)


BARGER = r'''
import fcntl, os, sys
mnt, name, mode, stats = sys.argv[1:5]
p = os.path.join(mnt, name)
fd = os.open(os.path.join(mnt, '.flock', name), os.O_RDWR | os.O_CREAT)
tries = wins = 0


def report():
    with open(stats + '.new', 'w') as f:
        f.write('%d %d\n' % (tries, wins))
    os.rename(stats + '.new', stats)


sys.stdout.write('ready\n')
sys.stdout.flush()
while True:
    tries += 1
    won = False
    if mode == 'mkdir':
        try:
            os.mkdir(p)
            won = True
            os.rmdir(p)
        except OSError:
            pass
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            won = True
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
    wins += won
    if won or tries % 20 == 0:
        report()
'''


@pytest.mark.parametrize('mode', ['mkdir', 'lock_nb'])
def test_no_barging_at_the_moment_of_release(mnt, procs, tmp_path, mode):
    """A process spinning on mkdir (or LOCK_EX|LOCK_NB) never gets the lock
    while waiters are queued: each release (LOCK_UN or the holder's rmdir)
    goes to the head of the queue."""
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'))
    stats = str(tmp_path / 'barger')
    b = procs.popen([PYTHON, '-c', BARGER, mnt.mnt, 'x', mode, stats],
                    stdout=subprocess.PIPE)
    assert b.stdout.readline() == b'ready\n'
    holder, hfd = h, fh
    for rnd in range(10):
        [(w, fw, rid)] = _queue(mnt, procs, 'x', [EX])
        before = _stats(stats)
        if rnd % 2:
            assert holder.rmdir(mnt.path('x')) == 0     # release by rmdir
        else:
            assert holder.flock(hfd, UN) == 0           # release by LOCK_UN
        _granted(w, rid)
        assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w.pid
        wait_until(lambda: _stats(stats)[0] > before[0], what='the barger to keep trying')
        holder, hfd = w, fw
    assert _stats(stats)[1] == 0, f'the {mode} barger got the lock {_stats(stats)[1]} times'
    acq = [l.details.get('pid') for l in log_for(mnt.dir, 'x') if l.event == 'acquired']
    assert str(b.pid) not in acq
    b.kill()
    b.wait()
    assert holder.flock(hfd, UN) == 0


def _stats(path):
    try:
        with open(path) as f:
            t, w = f.read().split()
        return int(t), int(w)
    except (FileNotFoundError, ValueError):
        return 0, 0


def test_shared_request_waits_behind_a_queued_exclusive_one(mnt, procs):
    r = procs.agent()
    fr = r.take(fpath(mnt, 'x'), SH)
    ws = _queue(mnt, procs, 'x', [EX, SH])
    (x, fx, qx), (s, fs, qs) = ws
    assert _ready(ws) == []
    assert [w['mode'] for w in read_waiters(mnt, 'x')] == ['exclusive', 'shared']
    # a non-blocking reader may not pass the queued writer either
    nb = procs.agent()
    assert is_wouldblock(nb.flock(nb.open(fpath(mnt, 'x')), SH | NB))
    assert holder_pids(mnt, 'x') == [r.pid]
    assert r.flock(fr, UN) == 0
    _granted(x, qx)
    assert s.poll(qs) is None
    assert x.flock(fx, UN) == 0
    _granted(s, qs)
    assert read_owner(mnt.mnt, 'x')['mode'] == 'shared'


def test_runs_of_shared_waiters_are_granted_together(mnt, procs):
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'), EX)
    ws = _queue(mnt, procs, 'x', [SH, SH, EX, SH])
    (s1, f1, q1), (s2, f2, q2), (x3, f3, q3), (s4, f4, q4) = ws
    assert h.flock(fh, UN) == 0
    _granted(s1, q1)
    _granted(s2, q2)
    assert holder_pids(mnt, 'x') == sorted([s1.pid, s2.pid])
    assert [w['pid'] for w in read_waiters(mnt, 'x')] == [x3.pid, s4.pid]
    assert s1.flock(f1, UN) == 0
    assert holder_pids(mnt, 'x') == [s2.pid]
    assert _ready([ws[2], ws[3]]) == []
    assert s2.flock(f2, UN) == 0
    _granted(x3, q3)
    assert s4.poll(q4) is None
    assert read_owner(mnt.mnt, 'x')['mode'] == 'exclusive'
    assert x3.flock(f3, UN) == 0
    _granted(s4, q4)
    assert holder_pids(mnt, 'x') == [s4.pid]


def test_conversion_queues_anew_behind_earlier_waiters(mnt, procs):
    a, b = procs.agent(), procs.agent()
    fa = a.take(fpath(mnt, 'x'), SH)
    fb = b.take(fpath(mnt, 'x'), SH)
    [(c, fc, qc)] = _queue(mnt, procs, 'x', [EX])
    qa = a.flock_start(fa, EX)                 # upgrade: released, then queued anew
    wait_waiters(mnt, 'x', [c.pid, a.pid])
    assert holder_pids(mnt, 'x') == [b.pid]
    assert b.flock(fb, UN) == 0
    _granted(c, qc)
    assert a.poll(qa) is None
    assert c.flock(fc, UN) == 0
    _granted(a, qa)
    o = read_owner(mnt.mnt, 'x')
    assert (o['holder']['pid'], o['mode']) == (a.pid, 'exclusive')


def test_flock_and_posix_waiters_share_one_queue(mnt, procs):
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'))
    kinds = ['posix', 'flock', 'posix', 'flock', 'flock', 'posix']
    ws = _queue(mnt, procs, 'x', [EX] * 6, kinds)
    assert [w['kind'] for w in read_waiters(mnt, 'x')] == kinds
    assert h.flock(fh, UN) == 0
    for k, ((w, fd, rid), kind) in enumerate(zip(ws, kinds)):
        _granted(w, rid)
        assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w.pid
        assert _ready(ws[k + 1:]) == []
        if kind == 'posix':
            assert w.lockf(fd, UN) == 0
        else:
            assert w.flock(fd, UN) == 0


def test_an_exclusive_waiter_is_not_starved_by_a_stream_of_readers(mnt, procs):
    """Readers keep arriving while one reader always holds: the writer queued
    first is served before every reader that came after it."""
    r0 = procs.agent()
    f0 = r0.take(fpath(mnt, 'x'), SH)
    [(x, fx, qx)] = _queue(mnt, procs, 'x', [EX])
    later = _queue_after(mnt, procs, 'x', [x.pid], [SH] * 3)
    assert r0.flock(f0, UN) == 0
    _granted(x, qx)
    assert _ready(later) == []
    assert x.flock(fx, UN) == 0
    for w, fd, rid in later:
        _granted(w, rid)
    assert holder_pids(mnt, 'x') == sorted(w.pid for w, _, _ in later)


def _queue_after(m, procs, name, already, modes):
    out = []
    for mode in modes:
        w = procs.agent()
        fd = w.open(fpath(m, name))
        rid = w.flock_start(fd, mode)
        wait_waiters(m, name, list(already) + [x.pid for x, _, _ in out] + [w.pid])
        out.append((w, fd, rid))
    return out


def test_waiters_behind_a_lock_taken_directly_in_dir_learn_of_its_release(mnt, procs):
    """The seed's protocol (mkdir DIR/NAME.lock) does not queue; the waiter
    notices the release by watching DIR."""
    os.mkdir(mnt.lockdir('x'))
    with open(os.path.join(mnt.lockdir('x'), 'owner.json'), 'w') as f:
        json.dump({'agent': 'seed'}, f)
    w = procs.agent()
    fd = w.open(fpath(mnt, 'x'))
    rid = w.flock_start(fd, EX)
    wait_waiters(mnt, 'x', [w.pid])                   # queued, not just in flock(2)
    assert w.poll(rid) is None
    os.unlink(os.path.join(mnt.lockdir('x'), 'owner.json'))
    os.rmdir(mnt.lockdir('x'))
    _granted(w, rid, timeout=5)
    o = read_owner(mnt.mnt, 'x')
    assert (o['holder']['pid'], o['bound']) == (w.pid, 'fd')


def test_a_break_grants_the_head_waiter(mnt, procs):
    h = procs.agent()
    h.take(fpath(mnt, 'x'))
    ws = _queue(mnt, procs, 'x', [EX, EX])
    with open(mnt.path('x', 'break'), 'w') as f:
        f.write('stuck\n')
    (w1, f1, q1), (w2, f2, q2) = ws
    _granted(w1, q1)
    assert w2.poll(q2) is None
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w1.pid
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'broken', 'acquired']


def test_a_recovered_slug_lock_grants_the_head_waiter(lockfs_factory, procs):
    """A slug-bound lock whose lease ran out (and no process carries the
    slug) is recovered, and the queue moves on."""
    m = lockfs_factory(options=['lease=1'])
    env = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
    env['LOCKFS_SLUG'] = 'gone-agent'
    r = subprocess.run(['bash', '-c', 'mkdir "$1" && true', 'bash', m.path('x')], env=env,
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    [(w, fw, qw)] = _queue(m, procs, 'x', [EX])
    _granted(w, qw, timeout=15)
    assert read_owner(m.mnt, 'x')['holder']['pid'] == w.pid
    assert [l.event for l in log_for(m.dir, 'x')] == ['acquired', 'recovered', 'acquired']


@pytest.mark.parametrize('kind', ['flock', 'lockf'])
def test_two_threads_of_one_owner_both_return_when_it_is_granted(mnt, procs, kind):
    """Kernel locks: a second thread blocked for the same owner (the same open
    file for flock, the same process for fcntl/lockf) returns as soon as that
    owner holds the lock, whoever waits between the two."""
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'))
    t = procs.agent()
    tfd = t.open(fpath(mnt, 'x'))

    def start():
        if kind == 'flock':
            return t.flock_start(tfd, EX, bg=True)
        return t.lockf_start(tfd, fcntl.LOCK_EX, bg=True)
    t1 = start()
    wait_waiters(mnt, 'x', [t.pid])
    (w, wfd, wrid), = _queue_after(mnt, procs, 'x', [t.pid], [EX])
    t2 = start()
    wait_waiters(mnt, 'x', [t.pid, w.pid, t.pid])
    assert h.flock(fh, UN) == 0
    _granted(t, t1)
    _granted(t, t2)
    assert waiter_pids(mnt, 'x') == [w.pid]
    assert w.poll(wrid) is None
    assert holder_pids(mnt, 'x') == [t.pid]
    if kind == 'flock':
        assert t.flock(tfd, UN) == 0
    else:
        assert t.lockf(tfd, fcntl.LOCK_UN) == 0
    _granted(w, wrid)
    assert holder_pids(mnt, 'x') == [w.pid]
