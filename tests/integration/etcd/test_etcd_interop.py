"""Issue 11: interop with etcd's own lock protocol (concurrency.Mutex), both
ways: `etcdctl lock PREFIX/NAME CMD` holds NAME for every lockfs host, and a
lock taken with mkdir makes `etcdctl lock` wait."""

import errno
import fcntl
import json
import time

import pytest

from etcd_fixtures import etcd3  # noqa: F401
from etcd_mounts import HOLD, etcd_mounts, etcdctl_lock, line_within  # noqa: F401
from lockfs_helpers import wait_until

@pytest.mark.slow
def test_etcdctl_lock_holds_the_lock_for_every_host(etcd3, etcd_mounts, procs, tmp_path):
    # lock_delay 30: a waiter granted within seconds after etcdctl's unlock
    # shows that the unlock started no lock-delay.
    hosts = etcd_mounts(etcd3, ttl=10, lock_delay=30)
    go = tmp_path / 'go'
    p = etcdctl_lock(procs, etcd3, hosts.prefix + 'deploy', HOLD, go)
    line = line_within(p, 15)
    assert line, f'etcdctl lock did not get the lock: {p.stderr.read() if p.poll() else ""}'
    key, rev = line.split()
    rev = int(rev)
    assert key.startswith(hosts.prefix + 'deploy/')

    # mkdir gives EEXIST on every host
    for m in hosts:
        assert procs.agent().mkdir(m.path('deploy')) == errno.EEXIST, m.host

    # owner shows the foreign holder: its key, lease and create_revision
    for m in hosts:
        wait_until(lambda: 'deploy' in hosts.listed(m), timeout=5,
                   what=f'{m.host} lists deploy')
        with open(m.path('deploy', 'owner'), 'rb') as f:
            rec = json.loads(f.read())
        assert rec.get('foreign') is True, rec
        assert rec.get('key') == key, rec
        assert rec.get('create_revision') == rev, rec
        assert int(rec.get('lease'), 16) == int(key.rsplit('/', 1)[1], 16), rec

    # a flock waiter on h3 queues behind it
    w = procs.agent()
    fd = w.open(hosts.host('h3').path('.flock', 'deploy'))
    rid = w.flock_start(fd, fcntl.LOCK_EX)
    wait_until(lambda: len(hosts.lock_keys('deploy')) == 2, timeout=10,
               what="h3's waiter in line behind etcdctl's key")
    assert [k[0] for k in hosts.lock_keys('deploy')][0] == key
    assert w.poll(rid) is None, 'the waiter was granted while etcdctl held the lock'

    # CMD ends: etcdctl unlocks, the waiter is granted at once (no lock-delay)
    t0 = time.monotonic()
    go.touch()
    assert p.wait(15) == 0, p.stderr.read()
    ans = w.wait(rid, timeout=10)
    assert ans.get('errno', 0) == 0, ans
    assert time.monotonic() - t0 < 10 < hosts.lock_delay
    grant = hosts.wait_log(hosts.host('h3'), 'deploy', 'acquired')[0]
    assert int(grant.details['fence']) > rev
    assert w.flock(fd, fcntl.LOCK_UN) == 0
    assert hosts.check_history(held=set()) == []


@pytest.mark.slow
def test_mkdir_makes_etcdctl_lock_wait_until_rmdir(etcd3, etcd_mounts, procs, tmp_path):
    hosts = etcd_mounts(etcd3, ttl=10)
    holder = procs.agent()
    assert holder.mkdir(hosts.host('h1').path('deploy')) == 0
    fence = int(hosts.wait_log(hosts.host('h1'), 'deploy', 'acquired')[0].details['fence'])
    go = tmp_path / 'go'
    go.touch()          # CMD exits as soon as it runs
    p = etcdctl_lock(procs, etcd3, hosts.prefix + 'deploy', HOLD, go)
    # etcdctl is in line behind our key ...
    wait_until(lambda: len(hosts.lock_keys('deploy')) == 2, timeout=10,
               what="etcdctl's key behind ours")
    # ... and does not get the lock while we hold it (a window; the
    # positive control follows)
    assert line_within(p, 1.5) is None, 'etcdctl lock got a lock that mkdir holds'
    assert p.poll() is None
    assert holder.rmdir(hosts.host('h1').path('deploy')) == 0
    line = line_within(p, 10)
    assert line, 'etcdctl lock did not get the lock after rmdir'
    assert int(line.split()[1]) > fence
    assert p.wait(15) == 0
    assert hosts.check_history(held=set()) == []


@pytest.mark.slow
def test_no_lock_delay_after_etcdctl_unlock(etcd3, etcd_mounts, procs, tmp_path):
    hosts = etcd_mounts(etcd3, hosts=('h1', 'h2'), ttl=10, lock_delay=30)
    go = tmp_path / 'go'
    go.touch()
    p = etcdctl_lock(procs, etcd3, hosts.prefix + 'deploy', HOLD, go)
    assert line_within(p, 15), 'etcdctl lock did not get the lock'
    assert p.wait(15) == 0
    a = procs.agent()
    # A lock-delay would refuse mkdir for 30 s; the next mkdir (at most the
    # watch's delay later) succeeds.
    wait_until(lambda: a.mkdir(hosts.host('h2').path('deploy')) == 0, timeout=5,
               what='mkdir deploy on h2 after etcdctl unlocked')
    assert a.rmdir(hosts.host('h2').path('deploy')) == 0
