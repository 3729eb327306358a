"""Issue 24 point 2: deadlock detection for waits on M/.flock/NAME.

"When a blocking wait would close a cycle in the wait-for graph -- P holds A
and waits for B while Q, holding B, waits for A -- the wait that closes it
fails at once with EDEADLK, the other side keeps waiting and then gets its
lock, the log says `deadlock` with the cycle, and `lockctl status` can show
it.  Who holds and who waits is judged by the same process-tree rule as
rmdir."

Every wait that must fail is bounded (an answer awaited for a few seconds):
before detection these waits hung for ever, so each of these tests failed
by timing out.  A wait that must go on is seen parked in M/NAME/waiters
first, so the cycle exists when the closing request is made.
"""

import errno
import fcntl
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'events'))
from events_helpers import Watch  # noqa: E402
from flock_helpers import fpath, wait_waiters, waiter_pids
from lockfs_helpers import PYTHON, log_for, read_log, read_owner, source_root, wait_until

EX, UN = fcntl.LOCK_EX, fcntl.LOCK_UN
#: EDEADLK must come "at once": well within this (the goal is 10 ms; the
#: bound leaves room for a loaded test machine, not for a hang).
ANSWER_S = 5.0


def _take(procs, m, name):
    a = procs.agent()
    return a, a.take(fpath(m, name))


def _wait_start(m, who, fd, name, queued):
    """WHO starts a blocking flock on NAME; returns its request id once
    M/NAME/waiters lists QUEUED (pids, in order)."""
    rid = who.flock_start(fd, EX)
    wait_waiters(m, name, queued)
    return rid


def _deadlock_lines(m):
    return [l for l in read_log(m.dir) if l.event == 'deadlock']


def test_two_process_cycle_fails_the_closing_wait_with_edeadlk(mnt, procs):
    p, pa = _take(procs, mnt, 'A')
    q, qb = _take(procs, mnt, 'B')
    pb = p.open(fpath(mnt, 'B'))
    prid = _wait_start(mnt, p, pb, 'B', [p.pid])
    qa = q.open(fpath(mnt, 'A'))
    t0 = time.monotonic()
    rc = q.flock(qa, EX, timeout=ANSWER_S)
    took = time.monotonic() - t0
    assert rc == errno.EDEADLK, f'Q waiting for A: {errno.errorcode.get(rc, rc)}'
    assert took < 1.0, f'EDEADLK after {took:.3f}s'
    # The other side keeps waiting, then gets B once Q lets it go.
    assert p.poll(prid) is None, 'P was answered too'
    assert waiter_pids(mnt, 'A') == [], 'the failed wait stayed queued for A'
    assert waiter_pids(mnt, 'B') == [p.pid]
    assert q.close(qb) == 0
    a = p.wait(prid, 5)
    assert 'errno' not in a, errno.errorcode.get(a.get('errno'))
    assert read_owner(mnt.mnt, 'B')['holder']['pid'] == p.pid


def test_the_log_names_the_cycle(mnt, procs):
    p, pa = _take(procs, mnt, 'A')
    q, qb = _take(procs, mnt, 'B')
    pb = p.open(fpath(mnt, 'B'))
    _wait_start(mnt, p, pb, 'B', [p.pid])
    qa = q.open(fpath(mnt, 'A'))
    assert q.flock(qa, EX, timeout=ANSWER_S) == errno.EDEADLK
    lines = wait_until(lambda: _deadlock_lines(mnt), what='a deadlock line')
    [line] = lines
    d = line.details
    assert line.name == b'A'
    assert d['pid'] == str(q.pid) and d['uid'] == '0'
    assert d['cycle'] == '2'
    assert (d['pid1'], d['wait1'], d['heldby1']) == (str(q.pid), 'A', str(p.pid))
    assert (d['pid2'], d['wait2'], d['heldby2']) == (str(p.pid), 'B', str(q.pid))
    assert 'pid3' not in d


def test_a_deadlock_is_an_event_and_a_metric(mnt, procs):
    """Watching it live (issue 24 point 3) sees deadlocks too: one
    `deadlock` event on M/.events naming the refused waiter, and
    lockfs_deadlocks_total in M/.metrics counts it."""
    def deadlocks():
        with open(os.path.join(mnt.mnt, '.metrics')) as f:
            for line in f:
                if line.startswith('lockfs_deadlocks_total '):
                    return int(line.split()[1])
        raise AssertionError('no lockfs_deadlocks_total in M/.metrics')

    before = deadlocks()
    w = Watch(mnt)
    try:
        w.sync()
        p, pa = _take(procs, mnt, 'A')
        q, qb = _take(procs, mnt, 'B')
        pb = p.open(fpath(mnt, 'B'))
        _wait_start(mnt, p, pb, 'B', [p.pid])
        qa = q.open(fpath(mnt, 'A'))
        assert q.flock(qa, EX, timeout=ANSWER_S) == errno.EDEADLK
        ev = w.until(lambda e: e['event'] == 'deadlock', timeout=10, what='a deadlock event')[-1]
        assert ev['name'] == 'A' and ev['pid'] == q.pid
    finally:
        w.stop()
    assert deadlocks() == before + 1


def test_fcntl_setlkw_cycle_fails_with_edeadlk(mnt, procs):
    """F_SETLKW on M/.flock/NAME: the same graph, the kernel's own errno."""
    p, q = procs.agent(), procs.agent()
    pa, pb = p.open(fpath(mnt, 'A')), p.open(fpath(mnt, 'B'))
    qa, qb = q.open(fpath(mnt, 'A')), q.open(fpath(mnt, 'B'))
    assert p.lockf(pa, fcntl.LOCK_EX) == 0
    assert q.lockf(qb, fcntl.LOCK_EX) == 0
    prid = p.lockf_start(pb, fcntl.LOCK_EX)
    wait_waiters(mnt, 'B', [p.pid])
    t = q.start('fcntl', fd=qa, cmd=fcntl.F_SETLKW, type=fcntl.F_WRLCK, start=0, len=0,
                whence=0)
    a = q.wait(t, ANSWER_S)
    assert a.get('errno') == errno.EDEADLK, a
    assert p.poll(prid) is None
    assert q.lockf(qb, fcntl.LOCK_UN) == 0
    a = p.wait(prid, 5)
    assert 'errno' not in a, a


def test_three_process_cycle(mnt, procs):
    """P holds A waits B, Q holds B waits C, R holds C and asks for A."""
    p, pa = _take(procs, mnt, 'A')
    q, qb = _take(procs, mnt, 'B')
    r, rc_ = _take(procs, mnt, 'C')
    prid = _wait_start(mnt, p, p.open(fpath(mnt, 'B')), 'B', [p.pid])
    qrid = _wait_start(mnt, q, q.open(fpath(mnt, 'C')), 'C', [q.pid])
    assert r.flock(r.open(fpath(mnt, 'A')), EX, timeout=ANSWER_S) == errno.EDEADLK
    assert p.poll(prid) is None and q.poll(qrid) is None
    [line] = _deadlock_lines(mnt)
    d = line.details
    assert d['cycle'] == '3'
    hops = [(d[f'pid{i}'], d[f'wait{i}'], d[f'heldby{i}']) for i in (1, 2, 3)]
    assert hops == [(str(r.pid), 'A', str(p.pid)), (str(p.pid), 'B', str(q.pid)),
                    (str(q.pid), 'C', str(r.pid))]
    # R lets C go: Q gets it, finishes, and P gets B.
    assert r.close(rc_) == 0
    assert 'errno' not in q.wait(qrid, 5)
    assert q.close(qb) == 0
    assert 'errno' not in p.wait(prid, 5)


def test_no_cycle_no_edeadlk(mnt, procs):
    """A chain is no cycle: P holds A waits B, Q holds B waits C (held by
    R, who waits for nothing): everybody keeps waiting."""
    p, pa = _take(procs, mnt, 'A')
    q, qb = _take(procs, mnt, 'B')
    r, rc_ = _take(procs, mnt, 'C')
    prid = _wait_start(mnt, p, p.open(fpath(mnt, 'B')), 'B', [p.pid])
    qrid = _wait_start(mnt, q, q.open(fpath(mnt, 'C')), 'C', [q.pid])
    # A fourth process waits for A: a wait behind the chain, still no cycle.
    s = procs.agent()
    srid = _wait_start(mnt, s, s.open(fpath(mnt, 'A')), 'A', [s.pid])
    for who, rid in ((p, prid), (q, qrid), (s, srid)):
        assert who.poll(rid) is None, f'{who} answered: {who.poll(rid)}'
    assert _deadlock_lines(mnt) == []
    assert r.close(rc_) == 0
    assert 'errno' not in q.wait(qrid, 5)


def test_a_wait_for_a_lock_of_its_own_tree_is_no_deadlock(mnt, procs):
    """A child waiting for the lock its parent holds waits (the parent may
    let go): no cycle of one."""
    sh = procs.shell()
    assert sh.wait(sh.start(f'mkdir {mnt.path("A")}'))[0] == 0
    tag = sh.start(f'{PYTHON} -c "import fcntl,os; '
                   f'fcntl.flock(os.open(\'{fpath(mnt, "A")}\', os.O_RDWR), fcntl.LOCK_EX)"')
    wait_until(lambda: len(waiter_pids(mnt, 'A')) == 1, what='the child waits for A')
    assert sh.poll(tag) is None
    assert _deadlock_lines(mnt) == []
    child = waiter_pids(mnt, 'A')[0]
    os.kill(child, 9)
    assert sh.wait(tag, 5)[0] != 0


def test_a_waiting_child_of_a_mkdir_holder_counts_as_the_holder(mnt, procs):
    """The shell holds A by mkdir; its child (not a helper) waits for B,
    which Q holds; Q then waits for A: a cycle through the process tree."""
    sh = procs.shell()
    assert sh.wait(sh.start(f'mkdir {mnt.path("A")}'))[0] == 0
    q, qb = _take(procs, mnt, 'B')
    tag = sh.start(f'{PYTHON} -c "import fcntl,os; '
                   f'fcntl.flock(os.open(\'{fpath(mnt, "B")}\', os.O_RDWR), fcntl.LOCK_EX)"')
    wait_until(lambda: len(waiter_pids(mnt, 'B')) == 1, what='the child waits for B')
    [child] = waiter_pids(mnt, 'B')
    assert child != sh.pid
    assert q.flock(q.open(fpath(mnt, 'A')), EX, timeout=ANSWER_S) == errno.EDEADLK
    [line] = _deadlock_lines(mnt)
    d = line.details
    # Q waits for A, held by the shell; the shell's child waits for B, held by Q.
    assert (d['pid1'], d['wait1'], d['heldby1']) == (str(q.pid), 'A', str(sh.pid))
    assert (d['pid2'], d['wait2'], d['heldby2']) == (str(child), 'B', str(q.pid))
    assert sh.poll(tag) is None, 'the other side was answered too'
    assert q.close(qb) == 0
    assert sh.wait(tag, 5)[0] == 0


def test_a_mkdir_holder_waiting_through_flock1_closes_a_cycle(mnt, procs):
    """flock(1) is a helper: a shell holding A (mkdir) that runs `flock B`
    waits as itself.  Q holds B and waits for A first; the shell's wait
    closes the cycle and flock(1) reports the EDEADLK."""
    sh = procs.shell()
    assert sh.wait(sh.start(f'mkdir {mnt.path("A")}'))[0] == 0
    q, qb = _take(procs, mnt, 'B')
    qrid = _wait_start(mnt, q, q.open(fpath(mnt, 'A')), 'A', [q.pid])
    rc, out = sh.wait(sh.start(f'flock {fpath(mnt, "B")} true'), ANSWER_S)
    # util-linux flock(1): warn() with the path, then exit EX_DATAERR (65)
    assert rc == 65, (rc, out)
    assert 'Resource deadlock avoided' in out, out
    assert q.poll(qrid) is None
    assert sh.wait(sh.start(f'rmdir {mnt.path("A")}'))[0] == 0
    assert 'errno' not in q.wait(qrid, 5)


def test_lockctl_status_shows_the_last_deadlock(mnt, procs):
    p, pa = _take(procs, mnt, 'A')
    q, qb = _take(procs, mnt, 'B')
    _wait_start(mnt, p, p.open(fpath(mnt, 'B')), 'B', [p.pid])
    assert q.flock(q.open(fpath(mnt, 'A')), EX, timeout=ANSWER_S) == errno.EDEADLK
    lockctl = os.path.join(os.environ.get('LOCKFS_BUILD', os.path.join(source_root(), 'build')),
                           'tools', 'lockctl')
    out = subprocess.run([lockctl, 'status', '--mount', mnt.mnt], capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 0, out.stderr
    last = [l for l in out.stdout.splitlines() if l.startswith('last deadlock:')]
    assert len(last) == 1, out.stdout
    assert f'{q.pid} waits for A' in last[0] and f'{p.pid} waits for B' in last[0], last[0]


def test_after_the_deadlock_the_victim_can_wait_again(mnt, procs):
    """EDEADLK keeps no place in the queue: once the cycle is gone (Q let
    B go), Q's retry waits behind P like anyone."""
    p, pa = _take(procs, mnt, 'A')
    q, qb = _take(procs, mnt, 'B')
    prid = _wait_start(mnt, p, p.open(fpath(mnt, 'B')), 'B', [p.pid])
    qa = q.open(fpath(mnt, 'A'))
    assert q.flock(qa, EX, timeout=ANSWER_S) == errno.EDEADLK
    assert q.close(qb) == 0
    assert 'errno' not in p.wait(prid, 5)
    qrid = _wait_start(mnt, q, qa, 'A', [q.pid])
    assert p.close(pa) == 0
    assert 'errno' not in q.wait(qrid, 5)
    assert len(_deadlock_lines(mnt)) == 1
    assert [l.event for l in log_for(mnt.dir, 'A')].count('acquired') == 2


def test_lockctl_run_reports_the_deadlock_and_exits_1(mnt, procs):
    """lockctl is a helper: `lockctl run B` in a shell that holds A waits as
    the shell, and says why it gives up."""
    lockctl = os.path.join(os.environ.get('LOCKFS_BUILD', os.path.join(source_root(), 'build')),
                           'tools', 'lockctl')
    sh = procs.shell()
    assert sh.wait(sh.start(f'mkdir {mnt.path("A")}'))[0] == 0
    q, qb = _take(procs, mnt, 'B')
    qrid = _wait_start(mnt, q, q.open(fpath(mnt, 'A')), 'A', [q.pid])
    rc, out = sh.wait(sh.start(f'{lockctl} run B --mount {mnt.mnt} -- true'), ANSWER_S)
    assert rc == 1, (rc, out)
    assert out.strip() == 'lockctl: B: flock: Resource deadlock avoided', out
    assert q.poll(qrid) is None
    assert sh.wait(sh.start(f'rmdir {mnt.path("A")}'))[0] == 0
    assert 'errno' not in q.wait(qrid, 5)


_IN_NS = r'''
import errno, fcntl, os, signal, sys, time
m = sys.argv[1]
def fl(n):
    return os.open(os.path.join(m, '.flock', n), os.O_RDWR | os.O_CREAT)
def stop(*_):
    raise TimeoutError()
qp_r, qp_w = os.pipe()
pq_r, pq_w = os.pipe()
p = os.fork()
if p == 0:                                     # P: holds A, then waits for B
    a, b = fl('A'), fl('B')
    os.read(qp_r, 1)                           # once Q holds B
    fcntl.flock(a, fcntl.LOCK_EX)
    os.write(pq_w, b'a')
    fcntl.flock(b, fcntl.LOCK_EX)              # granted once Q lets B go
    os._exit(0)
q = os.fork()
if q == 0:                                     # Q: holds B, then asks for A
    b, a = fl('B'), fl('A')
    fcntl.flock(b, fcntl.LOCK_EX)
    os.write(qp_w, b'b')
    os.read(pq_r, 1)
    t_end = time.monotonic() + 5
    while os.path.getsize(os.path.join(m, 'B', 'waiters')) == 0:
        assert time.monotonic() < t_end, 'P never waited for B'
        time.sleep(0.001)
    signal.signal(signal.SIGALRM, stop)
    signal.alarm(5)                            # bounded: before detection this hung
    try:
        fcntl.flock(a, fcntl.LOCK_EX)
        print('granted', flush=True)
    except TimeoutError:
        print('hung', flush=True)
    except OSError as e:
        print('EDEADLK' if e.errno == errno.EDEADLK else e.errno, flush=True)
    signal.alarm(0)
    fcntl.flock(b, fcntl.LOCK_UN)
    os._exit(0)
print('Q', os.waitpid(q, 0)[1], flush=True)
print('P', os.waitpid(p, 0)[1], flush=True)
'''


def test_a_cycle_inside_a_pid_namespace(mnt):
    """Processes in a pid namespace of their own (as in a container): the
    daemon sees them by its own pids, and the cycle is found all the same."""
    if subprocess.run(['unshare', '--pid', '--fork', 'true']).returncode != 0:
        import pytest
        pytest.skip('unshare --pid does not work here')
    out = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', '--kill-child',
                          PYTHON, '-c', _IN_NS, mnt.mnt], capture_output=True, text=True,
                         timeout=30)
    assert out.stdout.split() == ['EDEADLK', 'Q', '0', 'P', '0'], (out.stdout, out.stderr)
    [line] = _deadlock_lines(mnt)
    assert line.details['cycle'] == '2'
