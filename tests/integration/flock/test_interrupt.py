"""Issue 4 point 7: giving up is clean.

"Ctrl-C, flock -w SECONDS and timeout interrupt the wait
(fuse_req_interrupt_func); the waiter leaves the queue; a grant racing an
interrupt never leaks a lock (either the caller gets it, or the next in line
does).  The kernel restarts an interrupted flock for a handler with
SA_RESTART or after Ctrl-Z and fg: keep an interrupted waiter's place for
about a second, keyed by its lock_owner, so that the restarted request
resumes it instead of going to the back; grants skip such a held place."
"""

import errno
import fcntl
import os
import select
import signal
import subprocess
import time

from flock_helpers import (blocked_in_flock, children_of, fpath, held_names,  # noqa: F401
                           proc_state, read_waiters, wait_waiters)
from lockfs_helpers import PYTHON, assert_alternating, errno_of, log_for, read_owner, wait_until

EX, SH, NB, UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_NB, fcntl.LOCK_UN


def _granted(w, rid, timeout=5):
    a = w.wait(rid, timeout)
    assert 'errno' not in a, f'{w}: {errno.errorcode.get(a["errno"])}'
    return a


def _waiter(m, procs, name='x', mode=EX, **kw):
    w = procs.agent(**kw)
    fd = w.open(fpath(m, name))
    return w, fd, w.flock_start(fd, mode)


def _held_with_two_waiters(m, procs, first=None):
    """x held by a locker, and two waiters queued behind it in that order,
    the first made by FIRST (default _waiter).
    Returns h, fh, (w1, f1, q1), (w2, f2, q2)."""
    h = procs.agent()
    fh = h.take(fpath(m, 'x'))
    w1 = (first or _waiter)(m, procs)
    wait_waiters(m, 'x', [w1[0].pid])
    w2 = _waiter(m, procs)
    wait_waiters(m, 'x', [w1[0].pid, w2[0].pid])
    return h, fh, w1, w2


def _no_trace(m, holder_pid, name='x'):
    """Only the holder ever held NAME."""
    acq = [l.details.get('pid') for l in log_for(m.dir, name) if l.event == 'acquired']
    assert acq == [str(holder_pid)], log_for(m.dir, name)


def _bash_waiter(m, procs, cmd):
    """bash -c 'CMD; echo rc=$?' with $1 = M/.flock/x; returns the Popen."""
    return procs.popen(['bash', '-c', cmd + '; echo "rc=$?"', 'bash', fpath(m, 'x')],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def test_ctrl_c_of_a_waiting_flock1_leaves_the_queue(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    b = _bash_waiter(mnt, procs, 'flock "$1" true')
    wait_waiters(mnt, 'x', [b.pid])               # flock(1) skipped: bash waits
    w2, f2, q2 = _waiter(mnt, procs)
    wait_waiters(mnt, 'x', [b.pid, w2.pid])
    [flock1] = children_of(b.pid)
    os.kill(flock1, signal.SIGINT)                # Ctrl-C
    out, _ = b.communicate(timeout=10)
    assert out == b'rc=130\n', out
    wait_waiters(mnt, 'x', [w2.pid])
    assert holder.rmdir(mnt.path('x')) == 0
    _granted(w2, q2)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w2.pid
    acq = [l.details.get('pid') for l in log_for(mnt.dir, 'x') if l.event == 'acquired']
    assert str(b.pid) not in acq


def test_flock_w_times_out_with_exit_1_and_leaves_no_trace(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    t0 = time.monotonic()
    b = _bash_waiter(mnt, procs, 'flock -w 1 "$1" true')
    wait_waiters(mnt, 'x', [b.pid])
    out, _ = b.communicate(timeout=10)
    took = time.monotonic() - t0
    assert out == b'rc=1\n', out
    assert 0.9 <= took < 5, took
    assert read_waiters(mnt, 'x') == []
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == holder.pid
    assert holder.rmdir(mnt.path('x')) == 0
    assert errno_of(os.stat, mnt.path('x')) == errno.ENOENT     # nobody got it
    assert held_names(mnt) == []
    _no_trace(mnt, holder.pid)


def test_timeout_1_flock_exits_124_and_leaves_no_trace(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    b = _bash_waiter(mnt, procs, 'timeout 1 flock "$1" true')
    wait_waiters(mnt, 'x', [b.pid])
    out, _ = b.communicate(timeout=10)
    assert out == b'rc=124\n', out
    assert read_waiters(mnt, 'x') == []
    assert holder.rmdir(mnt.path('x')) == 0
    assert errno_of(os.stat, mnt.path('x')) == errno.ENOENT
    _no_trace(mnt, holder.pid)


POSIX_ALARM = r'''
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR)
def give_up(s, f):
    raise TimeoutError
signal.signal(signal.SIGALRM, give_up)
signal.alarm(1)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX)
    print('granted')
except TimeoutError:
    print('gave up')
'''


def test_an_interrupted_posix_wait_leaves_the_queue(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    p = procs.popen([PYTHON, '-c', POSIX_ALARM, fpath(mnt, 'x')], stdout=subprocess.PIPE)
    wait_waiters(mnt, 'x', [p.pid])
    assert read_waiters(mnt, 'x')[0]['kind'] == 'posix'
    out, _ = p.communicate(timeout=10)
    assert out == b'gave up\n', out
    assert read_waiters(mnt, 'x') == []
    assert holder.rmdir(mnt.path('x')) == 0
    assert errno_of(os.stat, mnt.path('x')) == errno.ENOENT
    _no_trace(mnt, holder.pid)


SA_RESTART_SETUP = r'''
import os, signal
_w = int(os.environ['WAKE_FD'])
os.set_blocking(_w, False)
signal.signal(signal.SIGUSR1, lambda s, f: None)
signal.siginterrupt(signal.SIGUSR1, False)      # SA_RESTART
signal.set_wakeup_fd(_w)                        # the C handler writes here at once
'''


def test_sa_restart_handler_keeps_the_waiters_place(mnt, procs):
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'))
    r, w = os.pipe()
    try:
        w1 = procs.agent(env={'WAKE_FD': str(w)}, setup=SA_RESTART_SETUP, pass_fds=(w,))
        os.close(w)
        f1 = w1.open(fpath(mnt, 'x'))
        q1 = w1.flock_start(f1, EX)
        wait_waiters(mnt, 'x', [w1.pid])
        w2, f2, q2 = _waiter(mnt, procs)
        wait_waiters(mnt, 'x', [w1.pid, w2.pid])
        os.kill(w1.pid, signal.SIGUSR1)
        ready, _, _ = select.select([r], [], [], 10)
        assert ready, ('the SIGUSR1 handler did not run within 10 s: the interrupted '
                       'flock was not answered (fuse_req_interrupt_func)')
        assert os.read(r, 16) == bytes([signal.SIGUSR1])
        # the kernel restarts flock(2) by itself: blocked in it again, not returned
        wait_until(lambda: blocked_in_flock(w1.pid), what='the restarted flock to block')
        assert w1.poll(q1) is None
        wait_waiters(mnt, 'x', [w1.pid, w2.pid])        # same place, not the back
        assert h.flock(fh, UN) == 0
        _granted(w1, q1)
        assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w1.pid
        assert w2.poll(q2) is None
        assert w1.flock(f1, UN) == 0
        _granted(w2, q2)
    finally:
        os.close(r)


def _stop(pid):
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: proc_state(pid) == 'T', timeout=10,
               what=f'{pid} to stop (the interrupted flock must be answered first)')


def _cont(pid):
    os.kill(pid, signal.SIGCONT)
    wait_until(lambda: blocked_in_flock(pid), what=f'{pid} to block in flock again')


def test_ctrl_z_and_fg_keep_the_waiters_place(mnt, procs):
    h, fh, (w1, f1, q1), (w2, f2, q2) = _held_with_two_waiters(mnt, procs)
    _stop(w1.pid)
    _cont(w1.pid)
    assert w1.poll(q1) is None
    wait_waiters(mnt, 'x', [w1.pid, w2.pid])
    assert h.flock(fh, UN) == 0
    _granted(w1, q1)
    assert w2.poll(q2) is None
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w1.pid


def test_a_grant_skips_a_stopped_waiters_held_place(mnt, procs):
    h, fh, (w1, f1, q1), (w2, f2, q2) = _held_with_two_waiters(mnt, procs)
    _stop(w1.pid)
    assert h.flock(fh, UN) == 0
    _granted(w2, q2)                                   # not held up by the stopped one
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w2.pid
    _cont(w1.pid)
    wait_waiters(mnt, 'x', [w1.pid])
    assert w1.poll(q1) is None
    assert w2.flock(f2, UN) == 0
    _granted(w1, q1)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w1.pid


def test_a_held_place_lapses_after_about_a_second(mnt, procs):
    h, _, (w1, f1, q1), (w2, f2, q2) = _held_with_two_waiters(mnt, procs)
    _stop(w1.pid)
    time.sleep(3.0)            # the duration under test: well past "about a second"
    _cont(w1.pid)
    wait_waiters(mnt, 'x', [w2.pid, w1.pid])           # back of the queue now
    assert w1.poll(q1) is None and w2.poll(q2) is None


def test_a_waiter_killed_as_it_is_granted_never_leaks_the_lock(mnt, procs):
    """Release and SIGKILL of the head waiter at the same moment, 30 times:
    either the killed one got it (and its death releases it) or the next in
    line did -- the next in line always ends up holding it."""
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'))
    for rnd in range(30):
        w, fw, qw = _waiter(mnt, procs)
        wait_waiters(mnt, 'x', [w.pid])
        n, fn, qn = _waiter(mnt, procs)
        wait_waiters(mnt, 'x', [w.pid, n.pid])
        if rnd % 2:
            ru = h.start('flock', fd=fh, how=UN)
            os.kill(w.pid, signal.SIGKILL)
        else:
            os.kill(w.pid, signal.SIGKILL)
            ru = h.start('flock', fd=fh, how=UN)
        assert 'errno' not in h.wait(ru, 10)
        w.kill()                                        # reaped: it really died
        _granted(n, qn, timeout=5)
        assert read_owner(mnt.mnt, 'x')['holder']['pid'] == n.pid, f'round {rnd}'
        assert read_waiters(mnt, 'x') == [], f'round {rnd}'
        h, fh = n, fn
    assert h.flock(fh, UN) == 0
    wait_until(lambda: not os.path.lexists(mnt.lockdir('x')), what='x to be free')
    assert held_names(mnt) == []
    assert_alternating(log_for(mnt.dir, 'x'), 'x')


# -- interrupted without SA_RESTART: EINTR reaches the caller ----------------

EINTR_SETUP = r'''
import signal
signal.signal(signal.SIGUSR1, lambda s, f: None)
signal.siginterrupt(signal.SIGUSR1, True)       # no SA_RESTART: flock(2) says EINTR
'''


def _eintr_waiter(m, procs, name='x'):
    w = procs.agent(setup=EINTR_SETUP)
    fd = w.open(fpath(m, name))
    return w, fd, w.cflock_start(fd, EX)


def _interrupt(w, rid):
    os.kill(w.pid, signal.SIGUSR1)
    a = w.wait(rid, 10)
    assert a.get('errno') == errno.EINTR, a
    return a


def test_an_interrupted_waiter_retrying_at_once_resumes_its_place(mnt, procs):
    """What the kernel does for SA_RESTART, done by the caller itself within
    the second: the same open file description asks again."""
    h, fh, (w1, f1, q1), (w2, f2, q2) = _held_with_two_waiters(mnt, procs, first=_eintr_waiter)
    _interrupt(w1, q1)
    q1 = w1.cflock_start(f1, EX)
    wait_until(lambda: blocked_in_flock(w1.pid), what='the retry to block')
    wait_waiters(mnt, 'x', [w1.pid, w2.pid])
    assert h.flock(fh, UN) == 0
    _granted(w1, q1)
    assert w2.poll(q2) is None
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w1.pid


def test_a_kept_place_belongs_to_the_open_file_description(mnt, procs):
    """Another descriptor (another open) of the same process goes to the back."""
    h, fh, (w1, f1, q1), (w2, f2, q2) = _held_with_two_waiters(mnt, procs, first=_eintr_waiter)
    _interrupt(w1, q1)
    other = w1.open(fpath(mnt, 'x'))
    q1b = w1.cflock_start(other, EX)
    wait_waiters(mnt, 'x', [w2.pid, w1.pid])
    assert h.flock(fh, UN) == 0
    _granted(w2, q2)
    assert w1.poll(q1b) is None
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w2.pid


def test_a_grant_racing_an_interrupt_never_leaks_the_lock(mnt, procs):
    """SIGUSR1 (no SA_RESTART) to the head waiter and the release at the same
    moment, 30 times: the waiter either gets the lock (flock returns 0) or
    EINTR -- and then the next in line gets it, not nobody."""
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'))
    outcomes = {'granted': 0, 'eintr': 0}
    for rnd in range(30):
        w, fw, qw = _eintr_waiter(mnt, procs)
        wait_waiters(mnt, 'x', [w.pid])
        n, fn, qn = _waiter(mnt, procs)
        wait_waiters(mnt, 'x', [w.pid, n.pid])
        if rnd % 2:
            ru = h.start('flock', fd=fh, how=UN)
            os.kill(w.pid, signal.SIGUSR1)
        else:
            os.kill(w.pid, signal.SIGUSR1)
            ru = h.start('flock', fd=fh, how=UN)
        assert 'errno' not in h.wait(ru, 10)
        a = w.wait(qw, 10)
        if 'errno' not in a:
            outcomes['granted'] += 1
            assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w.pid, f'round {rnd}'
            assert n.poll(qn) is None
            assert w.flock(fw, UN) == 0
        else:
            assert a['errno'] == errno.EINTR, a
            outcomes['eintr'] += 1
        _granted(n, qn, timeout=3)
        assert read_owner(mnt.mnt, 'x')['holder']['pid'] == n.pid, f'round {rnd}: {outcomes}'
        w.kill()
        h, fh = n, fn
    print(f'\ngrant vs interrupt outcomes: {outcomes}')
    assert h.flock(fh, UN) == 0
    wait_until(lambda: not os.path.lexists(mnt.lockdir('x')), what='x to be free')
    assert_alternating(log_for(mnt.dir, 'x'), 'x')


def test_interrupts_at_any_moment_of_the_request_leave_no_trace(mnt, procs):
    """SIGUSR1 (no SA_RESTART) sent over and over from the moment flock(2)
    is called -- before, while and after the daemon parks it -- until the
    caller gets EINTR: nothing stays queued and nobody but the holder ever
    held the lock."""
    h = procs.agent()
    fh = h.take(fpath(mnt, 'x'))
    w = procs.agent(setup=EINTR_SETUP)
    fd = w.open(fpath(mnt, 'x'))
    for rnd in range(20):
        rid = w.cflock_start(fd, EX)
        deadline = time.monotonic() + 10
        while (a := w.poll(rid)) is None:
            assert time.monotonic() < deadline, f'round {rnd}: no EINTR in 10 s'
            os.kill(w.pid, signal.SIGUSR1)
            time.sleep(0.0005 * (rnd % 4))
        assert a.get('errno') == errno.EINTR, (rnd, a)
    wait_until(lambda: read_waiters(mnt, 'x') == [], timeout=5,
               what='the interrupted requests to leave the queue')
    assert h.flock(fh, UN) == 0
    wait_until(lambda: errno_of(os.stat, mnt.path('x')) == errno.ENOENT, what='x to be free')
    assert held_names(mnt) == []
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']
