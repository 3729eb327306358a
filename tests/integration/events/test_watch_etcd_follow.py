"""A reader of events is interest (issue 24 section 3 on top of issue 23's
"interest, not broadcast"; docs/etcd.md "What a daemon watches").

An etcd daemon with no reader of M/.events hears nothing of names only
other hosts use.  While `lockctl watch` (no names) reads, it follows the
whole prefix -- one more watcher in etcd, other hosts' locks flow to it and
are events; while `lockctl watch NAME` reads, it watches NAME.  When the
reader closes it goes back: the watcher goes, nothing flows.

Watchers are counted with etcd's `etcd_debugging_mvcc_watcher_total`; what
flows to h2 with the bytes etcd sends through a TCP proxy in front of it.
"""
import os
import re
import sys
import time
import urllib.request

from etcd_fixtures import etcd1, tcp_proxy  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from events_helpers import Watch
from lockfs_helpers import read_owner, wait_until

TTL = 6
# A look keeps a name watched this long, and the session thread's tick
# (ttl/6) drops it after (docs/etcd.md).
LOOK_S = 3.0


def watchers(cluster):
    """etcd's count of watchers, on every stream of every client."""
    with urllib.request.urlopen(cluster.members[0].url + '/metrics', timeout=5) as r:
        text = r.read().decode()
    m = re.search(r'^etcd_debugging_mvcc_watcher_total (\S+)$', text, re.M)
    return int(float(m.group(1)))


def bytes_per_pair(proxy, agent, m, stem, pairs=40):
    """Bytes etcd sent h2 per mkdir+rmdir pair made on M (another host)."""
    before = proxy.bytes_down()
    for i in range(pairs):
        assert agent.mkdir(m.path(f'{stem}{i}')) == 0
        assert agent.rmdir(m.path(f'{stem}{i}')) == 0
    return (proxy.bytes_down() - before) / pairs


def settle(cluster, n):
    """Wait until etcd counts N watchers: names h1 looked at (each of its
    own mkdirs) are dropped a look's time and a tick later."""
    wait_until(lambda: watchers(cluster) == n, timeout=LOOK_S + TTL / 6 * 2 + 3,
               what=f'{n} watchers')


def test_a_reader_of_every_name_follows_the_prefix_until_it_closes(
        etcd1, etcd_mounts, tcp_proxy, procs):
    proxy = tcp_proxy(etcd1.members[0].client_port)
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=1,
                        endpoints={'h2': proxy.url})
    h1, h2 = hosts
    a, b = procs.agent(), procs.agent()
    # Idle, nobody reading: each daemon watches the host keys only, and
    # h1's locks cost h2 nothing (its keepalives and pongs only).
    settle(etcd1, 2)
    quiet = bytes_per_pair(proxy, a, h1, 'q')
    assert quiet < 40, f'h2 got {quiet:.0f} bytes per pair of h1 with nobody watching'
    settle(etcd1, 2)

    w = Watch(h2)
    try:
        # Its first read makes h2 follow the prefix: one watcher more.
        settle(etcd1, 3)
        assert a.mkdir(h1.path('far')) == 0
        acq = w.until(lambda e: e['name'] == 'far', timeout=5)[-1]
        assert (acq['event'], acq['remote'], acq['pid']) == ('acquired', 1, a.pid)
        assert a.rmdir(h1.path('far')) == 0
        rel = w.until(lambda e: e['name'] == 'far', timeout=5)[-1]
        assert (rel['event'], rel['remote'], rel['fence']) == ('released', 1, acq['fence'])
        loud = bytes_per_pair(proxy, a, h1, 'l')
        assert loud > 200, f'h2 got only {loud:.0f} bytes per pair of h1 while followed'
        # A lock h2 takes meanwhile: the prefix's watch brings its events.
        assert b.mkdir(h2.path('mine')) == 0
        # One h1 holds past the reader's close: h2 knew it from the prefix.
        assert a.mkdir(h1.path('kept')) == 0
        w.until(lambda e: e['name'] == 'kept' and e['event'] == 'acquired', timeout=5)
    finally:
        w.stop()
    # What h2 shows of it stays exact once h2 no longer hears of it.
    assert read_owner(h2.mnt, 'kept')['holder']['host'] == 'h1'
    assert a.rmdir(h1.path('kept')) == 0
    wait_until(lambda: not os.path.exists(h2.path('kept')), timeout=2,
               what="h2 sees kept released after its reader closed")
    # The reader closed: the prefix's watch goes, nothing of h1's flows ...
    quiet = bytes_per_pair(proxy, a, h1, 'r')
    assert quiet < 40, f'h2 got {quiet:.0f} bytes per pair of h1 after the reader closed'
    assert 'far' not in os.listdir(h2.mnt)
    # ... but the lock h2 holds is watched by itself from then on.
    settle(etcd1, 3)
    time.sleep(TTL / 6 * 2)
    assert watchers(etcd1) == 3, 'h2 keeps watching the lock it holds'
    assert b.rmdir(h2.path('mine')) == 0
    settle(etcd1, 2)


def test_a_reader_of_names_watches_those_names_until_it_closes(
        etcd1, etcd_mounts, procs):
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=1)
    h1, h2 = hosts
    a = procs.agent()
    wait_until(lambda: watchers(etcd1) == 2, timeout=5, what='two idle daemons, two watchers')
    w = Watch(h2, ['gpu'])
    try:
        # lockctl writes its names before its first read: h2 watches gpu,
        # and never the whole prefix on the way.
        wait_until(lambda: watchers(etcd1) == 3, timeout=5, what='h2 watches gpu')
        assert a.mkdir(h1.path('other')) == 0
        assert a.mkdir(h1.path('gpu')) == 0
        acq = w.until(lambda e: e['name'] == 'gpu', timeout=5)[-1]
        assert (acq['event'], acq['remote'], acq['pid']) == ('acquired', 1, a.pid)
        # h1 watches its two locks, h2 gpu only.
        assert watchers(etcd1) == 5
        assert a.rmdir(h1.path('gpu')) == 0
        rel = w.until(lambda e: e['name'] == 'gpu', timeout=5)[-1]
        assert (rel['event'], rel['remote']) == ('released', 1)
    finally:
        w.stop()
    assert a.rmdir(h1.path('other')) == 0
    # gpu is dropped at the sweep after the last look (the change's read).
    wait_until(lambda: watchers(etcd1) == 2, timeout=LOOK_S + TTL / 6 * 2 + 3,
               what='h2 drops gpu once its reader closed')


if __name__ == '__main__':
    sys.exit('run with pytest-3')
