"""Issue 8 §2, "Quotas": what one user may hold.

`-o max_locks_per_uid=N` (EDQUOT past it), `-o max_waiters_per_uid=N`
(EDQUOT for a flock/fcntl request that would wait), `-o max_locks=N`
(ENOSPC), with defaults one user cannot fill a tmpfs DIR with.  Root is
exempt from all three.  Locks are counted per uid across process-bound,
slug-bound and fd locks, shared holders, hand-offs, recoveries and
restarts.  Every refusal is logged once per burst (`refused`).
"""

import errno
import fcntl
import os
import subprocess

import pytest

from flock_helpers import fpath, wait_waiters  # noqa: F401
from lockfs_helpers import (PYTHON, errno_of, held_in_backing, read_log, wait_free, wait_log,
                            wait_until)
from quota_helpers import refused_lines

EX, SH, NB = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_NB


def _mkdirs(locker, m, prefix, n):
    """mkdir M/PREFIX-0..N-1 by LOCKER; the errno of each."""
    return [locker.mkdir(m.path(f'{prefix}-{i}')) for i in range(n)]


# --------------------------------------------------------------------------
# max_locks_per_uid

def test_a_uid_past_its_lock_cap_gets_edquot(lockfs_factory, users, procs):
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=5',))
    a, b = procs.agent(users[0]), procs.agent(users[1])
    assert _mkdirs(a, m, 'a', 5) == [0] * 5
    assert a.mkdir(m.path('a-5')) == errno.EDQUOT
    assert not os.path.lexists(m.lockdir('a-5'))
    # Others are not touched by it.
    assert _mkdirs(b, m, 'b', 5) == [0] * 5
    # Letting one go makes room for one.
    assert a.rmdir(m.path('a-0')) == 0
    assert a.mkdir(m.path('a-5')) == 0
    assert a.mkdir(m.path('a-6')) == errno.EDQUOT


def test_root_is_exempt_from_the_per_uid_caps(lockfs_factory, procs):
    m = lockfs_factory(options=('max_locks_per_uid=2', 'max_locks=3'))
    r = procs.agent()
    assert _mkdirs(r, m, 'r', 10) == [0] * 10


def test_the_default_lock_cap_stops_one_uid_long_before_dir_fills(lockfs_factory, users):
    """The observed case, bounded: one user's mkdir loop (it took 100,000
    locks, 793 MB of a tmpfs DIR) stops at the default cap, 1024."""
    m = lockfs_factory(allow_other=True)
    code = ('import errno, os, sys\n'
            'for i in range(1100):\n'
            '    try:\n'
            '        os.mkdir(os.path.join(sys.argv[1], "l-%d" % i))\n'
            '    except OSError as e:\n'
            '        print(i, e.errno, flush=True); sys.stdin.read(); sys.exit(0)\n'
            'print(1100, 0, flush=True); sys.stdin.read()\n')
    # flush=True: the child waits on stdin after its line, which a pipe
    # would otherwise keep in its buffer (hung forever where the caller's
    # environment lacks PYTHONUNBUFFERED, as on a brand-new machine).
    p = subprocess.Popen([PYTHON, '-c', code, m.mnt], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, user=users[0].uid, group=users[0].gid,
                         extra_groups=[])
    try:
        n, err = map(int, p.stdout.readline().split())
        assert (n, err) == (1024, errno.EDQUOT)
        assert len(held_in_backing(m.dir)) == 1024
    finally:
        p.stdin.close()
        p.wait(30)
    wait_until(lambda: not held_in_backing(m.dir), timeout=20, what='the locks recovered')


# --------------------------------------------------------------------------
# what counts

def test_process_slug_and_fd_locks_count_in_one_quota(lockfs_factory, users, procs):
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=3',))
    a = procs.agent(users[0])
    s = procs.agent(users[0], env={'LOCKFS_SLUG': 'agent-1'})
    assert a.mkdir(m.path('p')) == 0                 # process-bound
    assert s.mkdir(m.path('s')) == 0                 # slug-bound
    fd = a.open(fpath(m, 'f'))
    assert a.flock(fd, EX | NB) == 0                 # fd lock
    assert a.mkdir(m.path('x')) == errno.EDQUOT
    assert s.mkdir(m.path('x')) == errno.EDQUOT
    fd2 = a.open(fpath(m, 'g'))
    assert a.flock(fd2, EX | NB) == errno.EDQUOT
    assert a.flock(fd2, EX) == errno.EDQUOT          # would be granted at once
    assert not os.path.lexists(m.lockdir('g'))
    # The fd lock let go: room again.
    assert a.flock(fd, fcntl.LOCK_UN) == 0
    assert a.flock(fd2, EX | NB) == 0


def test_every_holder_of_a_shared_lock_counts(lockfs_factory, users, procs):
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=2',))
    a, b = procs.agent(users[0]), procs.agent(users[1])
    fds = [a.open(fpath(m, 'sh')) for _ in range(3)]
    assert a.flock(fds[0], SH | NB) == 0
    assert a.flock(fds[1], SH | NB) == 0
    assert a.flock(fds[2], SH | NB) == errno.EDQUOT
    assert b.flock(b.open(fpath(m, 'sh')), SH | NB) == 0   # another uid joins
    assert a.mkdir(m.path('x')) == errno.EDQUOT
    assert a.flock(fds[0], fcntl.LOCK_UN) == 0
    assert a.mkdir(m.path('x')) == 0


def test_a_hand_off_to_a_waiter_at_its_cap_is_edquot_and_goes_on(lockfs_factory, users,
                                                                  procs):
    """A waiter that has meanwhile reached its cap is answered EDQUOT when
    its turn comes; the next waiter gets the lock."""
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=2',))
    r, a, b = procs.agent(), procs.agent(users[0]), procs.agent(users[1])
    assert r.mkdir(m.path('x')) == 0
    fa, fb = a.open(fpath(m, 'x')), b.open(fpath(m, 'x'))
    ra = a.flock_start(fa, EX, bg=True)
    wait_waiters(m, 'x', [a.pid])
    rb = b.flock_start(fb, EX, bg=True)
    wait_waiters(m, 'x', [a.pid, b.pid])
    assert _mkdirs(a, m, 'a', 2) == [0, 0]           # A is at its cap now
    assert r.rmdir(m.path('x')) == 0
    assert a.wait(ra).get('errno') == errno.EDQUOT
    assert b.wait(rb).get('errno', 0) == 0
    owner = [l for l in read_log(m.dir) if l.event == 'acquired' and l.name == b'x'][-1]
    assert owner.details['pid'] == str(b.pid)


def test_a_recovered_holder_no_longer_counts(lockfs_factory, users, procs):
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=3',))
    a = procs.agent(users[0])
    assert _mkdirs(a, m, 'a', 3) == [0, 0, 0]
    a.kill()
    for i in range(3):
        wait_free(m, f'a-{i}')
    a2 = procs.agent(users[0])
    assert _mkdirs(a2, m, 'b', 4) == [0, 0, 0, errno.EDQUOT]


def test_locks_found_at_a_restart_count(lockfs_factory, users, procs):
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=3',))
    a = procs.agent(users[0])
    assert _mkdirs(a, m, 'a', 2) == [0, 0]
    m.kill9()
    m2 = lockfs_factory.restart(m)
    assert a.mkdir(m2.path('a-2')) == 0
    assert a.mkdir(m2.path('a-3')) == errno.EDQUOT
    assert a.rmdir(m2.path('a-0')) == 0
    assert a.mkdir(m2.path('a-3')) == 0


# --------------------------------------------------------------------------
# max_waiters_per_uid

def test_a_uid_past_its_waiter_cap_gets_edquot_for_a_request_that_would_wait(
        lockfs_factory, users, procs):
    m = lockfs_factory(allow_other=True, options=('max_waiters_per_uid=2',))
    r = procs.agent()
    assert r.mkdir(m.path('x')) == 0
    waiters = []
    for _ in range(2):
        w = procs.agent(users[0])
        waiters.append((w, w.flock_start(w.open(fpath(m, 'x')), EX)))
    wait_waiters(m, 'x', [w.pid for w, _ in waiters])
    c = procs.agent(users[0])
    fd = c.open(fpath(m, 'x'))
    assert c.flock(fd, EX, timeout=10) == errno.EDQUOT
    assert c.flock(fd, EX | NB) == errno.EWOULDBLOCK    # would not wait: as ever
    assert c.lockf(fd, EX) == errno.EDQUOT               # fcntl(F_SETLKW) too
    b = procs.agent(users[1])                           # another uid still waits
    rb = b.flock_start(b.open(fpath(m, 'x')), EX)
    wait_waiters(m, 'x', [w.pid for w, _ in waiters] + [b.pid])
    # A waiter that is granted leaves room.
    assert r.rmdir(m.path('x')) == 0
    assert waiters[0][0].wait(waiters[0][1]).get('errno', 0) == 0
    c.flock_start(fd, EX)
    wait_waiters(m, 'x', [waiters[1][0].pid, b.pid, c.pid])


# --------------------------------------------------------------------------
# max_locks

def test_past_max_locks_everyone_but_root_gets_enospc(lockfs_factory, users, procs):
    m = lockfs_factory(allow_other=True, options=('max_locks=6',))
    a, b, r = procs.agent(users[0]), procs.agent(users[1]), procs.agent()
    assert _mkdirs(a, m, 'a', 3) == [0] * 3
    assert _mkdirs(b, m, 'b', 3) == [0] * 3
    assert a.mkdir(m.path('a-3')) == errno.ENOSPC
    assert b.flock(b.open(fpath(m, 'f')), EX | NB) == errno.ENOSPC
    assert r.mkdir(m.path('r')) == 0                      # root: exempt
    assert b.rmdir(m.path('b-0')) == 0
    assert a.mkdir(m.path('a-3')) == errno.ENOSPC          # root's lock counts too
    assert r.rmdir(m.path('r')) == 0
    assert a.mkdir(m.path('a-3')) == 0


def test_zero_means_no_limit(lockfs_factory, users, procs):
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=0', 'max_locks=0'))
    a = procs.agent(users[0])
    code = ('import os, sys\n'
            'for i in range(1100): os.mkdir(os.path.join(sys.argv[1], "l-%d" % i))\n')
    subprocess.run([PYTHON, '-c', code, m.mnt], check=True, timeout=60, user=users[0].uid,
                   group=users[0].gid, extra_groups=[])
    assert a.mkdir(m.path('more')) == 0


@pytest.mark.parametrize('opt', ['max_locks_per_uid=-1', 'max_locks=x', 'max_waiters_per_uid=',
                                 'max_open_per_uid=3000000000', 'max_locks=1e3'])
def test_bad_caps_refuse_to_start(scratch_dir, opt):
    from lockfs_helpers import LOCKFS_BIN, run_expect_refusal
    mnt = os.path.join(scratch_dir, 'm')
    back = os.path.join(scratch_dir, 'd')
    os.mkdir(mnt)
    os.mkdir(back, 0o700)
    rc, err = run_expect_refusal([LOCKFS_BIN, '-f', '-o', f'backing={back}', '-o', opt, mnt],
                                 mnt)
    assert rc == 1
    assert err.strip() == f'lockfs: -o {opt}: want a whole number (0 = no limit)', err


# --------------------------------------------------------------------------
# the log

def test_refusals_are_logged_once_per_burst(lockfs_factory, users, procs):
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=1',))
    a = procs.agent(users[0])
    assert a.mkdir(m.path('a')) == 0
    for i in range(30):
        assert a.mkdir(m.path(f'x-{i}')) == errno.EDQUOT
    lines = wait_until(lambda: refused_lines(m, 'locks-per-uid'), timeout=5,
                       what='the burst logged')
    assert len(lines) == 1, lines
    l = lines[0]
    assert l.who == f'python3[{a.pid}]'
    assert l.name == b'x-0'
    assert l.details == {'uid': str(users[0].uid), 'pid': str(a.pid),
                         'reason': 'locks-per-uid', 'count': '30', 'limit': '1'}
    # A later burst is a line of its own.
    assert a.mkdir(m.path('y')) == errno.EDQUOT
    wait_until(lambda: len(refused_lines(m, 'locks-per-uid')) == 2, timeout=5,
               what='a second burst')
    assert refused_lines(m)[-1].details['count'] == '1'
