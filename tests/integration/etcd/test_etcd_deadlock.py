#!/usr/bin/python3
"""Issue 24 point 2 on the etcd backend: cycles of waits within one host are
refused with EDEADLK as on the directory store; a cycle through another
host is not seen (each daemon knows only its own waits: etcd.md,
"Deadlocks across hosts") -- that limit is asserted too, so that a change
of it is a change of the docs.  Skipped, with the reason, only when the
etcd binaries are absent.
"""

import errno
import fcntl

from etcd_fixtures import etcd1, etcd3  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401

from flock_helpers import fpath, wait_waiters, waiter_pids
from lockfs_helpers import read_log, read_owner

EX = fcntl.LOCK_EX


def _take(procs, m, name):
    a = procs.agent()
    return a, a.take(fpath(m, name))


def test_a_cycle_within_one_host_fails_the_closing_wait(etcd1, etcd_mounts, procs):
    [h1] = etcd_mounts(etcd1, hosts=('h1',))
    p, pa = _take(procs, h1, 'A')
    q, qb = _take(procs, h1, 'B')
    prid = p.flock_start(p.open(fpath(h1, 'B')), EX)
    wait_waiters(h1, 'B', [p.pid])
    assert q.flock(q.open(fpath(h1, 'A')), EX, timeout=5) == errno.EDEADLK
    assert p.poll(prid) is None, 'the other side was answered too'
    [line] = [l for l in read_log(h1.dir) if l.event == 'deadlock']
    assert line.details['cycle'] == '2'
    assert waiter_pids(h1, 'A') == []
    # The refused wait left etcd's line for A too: Q's let-go hands B on.
    assert q.close(qb) == 0
    assert 'errno' not in p.wait(prid, 10)
    assert read_owner(h1.mnt, 'B')['holder']['pid'] == p.pid


def test_a_cycle_through_two_hosts_is_not_detected(etcd3, etcd_mounts, procs):
    """P on h1 holds A and waits for B; Q on h2 holds B and asks for A: each
    daemon sees only its own waiter, so Q waits (bounded here: interrupted)."""
    h1, h2 = etcd_mounts(etcd3, hosts=('h1', 'h2'))
    p, pa = _take(procs, h1, 'A')
    q, qb = _take(procs, h2, 'B')
    prid = p.flock_start(p.open(fpath(h1, 'B')), EX)
    wait_waiters(h1, 'B', [p.pid])
    qa = q.open(fpath(h2, 'A'))
    rid = q.start('flock', fd=qa, how=EX)
    wait_waiters(h2, 'A', [q.pid])
    assert q.poll(rid) is None and p.poll(prid) is None
    assert [l for l in read_log(h1.dir) + read_log(h2.dir) if l.event == 'deadlock'] == []
    # The way out is the agents': P gives up (killed), Q gets A.
    p.kill()
    a = q.wait(rid, 15)
    assert 'errno' not in a, a
