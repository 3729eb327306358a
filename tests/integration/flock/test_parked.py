"""Issue 4 point 6: no thread per waiter.

"A blocking request is parked (fuse_req_t kept, reply sent later by
whichever thread releases), so 1,000 queued waiters cost memory, not
threads, and the holder's rmdir, ls and cat owner still answer promptly
while they wait."

The 1,000 waiters are threads of 4 python processes (250 each), every
thread with its own open file description of M/.flock/x.
"""

import os
import signal
import subprocess
import time

import pytest

from flock_helpers import fpath, read_waiters, threads_of  # noqa: F401
from lockfs_helpers import PYTHON, assert_alternating, log_for, read_owner, wait_until

N_PROCS, PER_PROC = 4, 250
N = N_PROCS * PER_PROC
MAX_DAEMON_THREADS = 50
PROMPT = 1.0        # seconds: "promptly" (measured ~30 ms for a pending flock)

WAITERS = r'''
import fcntl, os, sys, threading
threading.stack_size(256 * 1024)
path, n = sys.argv[1], int(sys.argv[2])
mu = threading.Lock()
granted = 0


def run(i):
    global granted
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    with mu:
        granted += 1
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
os.write(1, b'started\n')
for t in ts:
    t.join()
os.write(1, b'done %d\n' % granted)
'''


def _start_waiters(m, procs):
    ps = [procs.popen([PYTHON, '-c', WAITERS, fpath(m, 'x'), str(PER_PROC)],
                      stdout=subprocess.PIPE) for _ in range(N_PROCS)]
    for p in ps:
        assert p.stdout.readline() == b'started\n'
    peak = [0]

    def all_queued():
        peak[0] = max(peak[0], threads_of(m.pid))
        return len(read_waiters(m, 'x') or []) == N
    wait_until(all_queued, timeout=120, interval=0.1, what=f'{N} waiters in M/x/waiters')
    return ps, peak[0]


def _timed(fn, *a):
    t0 = time.monotonic()
    r = fn(*a)
    return time.monotonic() - t0, r


def _prompt_checks(m):
    lat = {}
    lat['ls M'], names = _timed(os.listdir, m.mnt)
    assert 'x' in names
    lat['ls M/.flock'], names = _timed(os.listdir, m.path('.flock'))
    assert names == ['x']
    lat['cat owner'], o = _timed(read_owner, m.mnt, 'x')
    lat['stat M/x'], _ = _timed(os.stat, m.path('x'))
    lat['cat waiters'], w = _timed(read_waiters, m, 'x')
    assert len(w) == N
    print('\nwith %d parked waiters (ms): %s' % (
        N, ', '.join(f'{k}={v * 1000:.1f}' for k, v in lat.items())))
    slow = {k: v for k, v in lat.items() if v > PROMPT}
    assert not slow, f'slow with {N} parked waiters: {slow}'
    return o


@pytest.mark.slow
def test_thousand_parked_waiters_cost_no_threads_and_are_all_granted(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    base = threads_of(mnt.pid)
    ps, peak = _start_waiters(mnt, procs)
    pids = {p.pid for p in ps}
    assert {w['pid'] for w in read_waiters(mnt, 'x')} == pids
    assert threads_of(mnt.pid) < MAX_DAEMON_THREADS, threads_of(mnt.pid)
    assert peak < MAX_DAEMON_THREADS, f'daemon reached {peak} threads (base {base})'
    o = _prompt_checks(mnt)
    assert o['holder']['pid'] == holder.pid
    t, rc = _timed(holder.rmdir, mnt.path('x'))
    assert rc == 0
    assert t <= PROMPT, f'the holder\'s rmdir took {t:.3f}s'
    # every waiter is granted in turn (each releases at once)
    deadline = time.monotonic() + 180
    while any(p.poll() is None for p in ps):
        peak = max(peak, threads_of(mnt.pid))
        assert time.monotonic() < deadline, 'the waiters were not all granted in 180 s'
        time.sleep(0.05)
    for p in ps:
        out = p.stdout.read()
        assert p.returncode == 0 and out == b'done %d\n' % PER_PROC, (p.returncode, out)
    assert peak < MAX_DAEMON_THREADS, f'daemon reached {peak} threads while granting'
    lines = log_for(mnt.dir, 'x')
    assert len([l for l in lines if l.event == 'acquired']) == N + 1
    assert_alternating(lines, 'x')
    wait_until(lambda: not os.path.lexists(mnt.lockdir('x')), what='x to be free at the end')


@pytest.mark.slow
def test_thousand_parked_waiters_killed_leave_the_queue(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    fence = read_owner(mnt.mnt, 'x')['fence']
    ps, peak = _start_waiters(mnt, procs)
    assert peak < MAX_DAEMON_THREADS
    for p in ps:
        os.kill(p.pid, signal.SIGKILL)
    for p in ps:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f'killed waiter process {p.pid} hangs: interrupts not answered?')
    wait_until(lambda: read_waiters(mnt, 'x') == [], timeout=30, what='an empty queue')
    o = read_owner(mnt.mnt, 'x')
    assert (o['holder']['pid'], o['fence']) == (holder.pid, fence)
    assert threads_of(mnt.pid) < MAX_DAEMON_THREADS
    assert holder.rmdir(mnt.path('x')) == 0
    assert not os.path.lexists(mnt.lockdir('x'))
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']
