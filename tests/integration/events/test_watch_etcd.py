"""lockctl watch on the etcd backend (issue 24, section 3): a lock of this
host lost in etcd is a `lost` event; another host's acquisition and release
are `acquired` and `released` events with `remote` and `host`; a waiter here
granted after another host's release is a `granted` event here
(docs/operations.md says what a daemon sees of other hosts)."""
import fcntl

from etcd_fixtures import etcd1  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from events_helpers import Watch
from lockfs_helpers import wait_until


def test_watch_sees_a_lock_lost_in_etcd(etcd1, etcd_mounts, procs):
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=2, lock_delay=1)
    h1, = hosts
    w = Watch(h1)
    try:
        w.sync()
        holder = procs.agent()
        assert holder.mkdir(h1.path('x')) == 0
        acq = w.until(lambda e: e.get('name') == 'x' and e['event'] == 'acquired')[-1]
        (key, _, _, _), = hosts.lock_keys('x')
        hosts.cluster.etcdctl('del', key)
        lost = w.until(lambda e: e.get('name') == 'x' and e['event'] == 'lost', timeout=10)[-1]
        assert lost['evidence'] == 'removed-in-store'
        assert lost['fence'] == acq['fence'] and lost['pid'] == holder.pid
    finally:
        w.stop()


def test_watch_sees_a_grant_here_after_another_hosts_release(etcd1, etcd_mounts, procs):
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=2, lock_delay=1)
    h1, h2 = hosts
    w = Watch(h2, ['g', 'gsync'])
    try:
        w.sync(name='gsync')
        holder, waiter = procs.agent(), procs.agent()
        assert holder.mkdir(h1.path('g')) == 0
        # Another host's acquisition, as this daemon learns it from etcd.
        remote = w.until(lambda e: e['event'] == 'acquired', timeout=10)[-1]
        assert remote['remote'] == 1 and remote['host'] != '' and remote['pid'] == holder.pid
        wait_until(lambda: 'g' in hosts.listed(h2), timeout=5, what="h2 sees h1's g")
        fd = waiter.open(h2.path('.flock', 'g'))
        rid = waiter.flock_start(fd, fcntl.LOCK_EX)
        ev = w.until(lambda e: e['event'] == 'waiting', timeout=10)[-1]
        assert ev['pid'] == waiter.pid
        assert holder.rmdir(h1.path('g')) == 0
        assert 'errno' not in waiter.wait(rid, timeout=10)
        evs = w.until(lambda e: e['event'] == 'granted', timeout=10)
        assert [e['event'] for e in evs][-2:] == ['acquired', 'granted']
        assert evs[-1]['pid'] == waiter.pid and 'remote' not in evs[-1]
        # h1's release, as this daemon saw it, came first, and once: the
        # grant here had to find h1's key gone, however it learnt of it.
        rel, = [e for e in evs if e['event'] == 'released']
        assert rel['remote'] == 1 and rel['fence'] == remote['fence']
        assert rel['host'] == remote['host']
    finally:
        w.stop()


def test_watch_sees_another_hosts_lock_of_a_name_this_host_never_used(etcd1, etcd_mounts, procs):
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=2, lock_delay=1)
    h1, h2 = hosts
    w = Watch(h2, ['solo', 'ssync'])
    try:
        w.sync(name='ssync')
        a = procs.agent()
        assert a.mkdir(h1.path('solo')) == 0
        acq = w.until(lambda e: e['name'] == 'solo', timeout=10)[-1]
        assert (acq['event'], acq['remote'], acq['pid']) == ('acquired', 1, a.pid)
        assert a.rmdir(h1.path('solo')) == 0
        rel = w.until(lambda e: e['name'] == 'solo', timeout=10)[-1]
        assert (rel['event'], rel['remote'], rel['fence']) == ('released', 1, acq['fence'])
    finally:
        w.stop()
