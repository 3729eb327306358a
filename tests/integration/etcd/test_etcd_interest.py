"""Issue 23 part 1: interest, not broadcast.

A daemon watches only what its own callers need: names held or waited for
on its host, names looked at (lookup, stat, `owner`) for a few seconds
after the last look, and the host keys.  Locks taken on another host cost
an idle daemon nothing: etcd sends it nothing for them.  Its views stay
exact: `ls` reads the prefix (cached briefly), `owner` and `stat` of a name
it does not watch read that name, then watch it for a while.

What flows to a daemon is measured at the wire: h2 talks to etcd through a
TCP proxy that counts the bytes etcd sends it.  Watchers are counted with
etcd's own metric `etcd_debugging_mvcc_watcher_total`.
"""

import errno
import fcntl
import os
import re
import time
import urllib.request

import pytest

from etcd_fixtures import etcd1, tcp_proxy  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from lockfs_helpers import read_owner, wait_until

# docs/etcd.md "What a daemon watches": a look keeps a name watched this
# long, and the session thread drops it at its next tick (ttl/6) after.
LOOK_S = 3.0
TTL = 6


def watchers(cluster):
    """etcd's count of watchers, on every stream of every client."""
    with urllib.request.urlopen(cluster.members[0].url + '/metrics', timeout=5) as r:
        text = r.read().decode()
    m = re.search(r'^etcd_debugging_mvcc_watcher_total (\S+)$', text, re.M)
    return int(float(m.group(1)))


def test_an_idle_host_hears_nothing_of_locks_taken_elsewhere_and_still_sees_them(
        etcd1, etcd_mounts, tcp_proxy, procs):
    proxy = tcp_proxy(etcd1.members[0].client_port)
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=1,
                        endpoints={'h2': proxy.url})
    h1, h2 = hosts
    a = procs.agent()
    pairs = 150

    before = proxy.bytes_down()
    t0 = time.monotonic()
    for i in range(pairs):
        assert a.mkdir(h1.path(f'p{i}')) == 0
        assert a.rmdir(h1.path(f'p{i}')) == 0
    for i in range(5):
        assert a.mkdir(h1.path(f'held{i}')) == 0
    took = time.monotonic() - t0
    per_pair = (proxy.bytes_down() - before) / pairs
    # Every event of the prefix is ~300 bytes to a watcher of it (two per
    # pair); an idle daemon now only gets its keepalive answers (~250 bytes
    # per ttl/6) and the stream's pongs.
    assert per_pair < 40, f'h2 got {per_pair:.0f} bytes per pair of h1 ({took:.1f} s)'

    # Its views are exact all the same: a listing within its 1 s bound
    # (docs/etcd.md), a single name at once.
    held = [f'held{i}' for i in range(5)]
    listed = lambda: sorted(n for n in os.listdir(h2.mnt) if n.startswith(('held', 'p')))
    wait_until(lambda: listed() == held, timeout=1.5, what="h2 lists h1's locks")
    st = os.stat(h2.path('held3'))
    assert st.st_mtime > 0
    rec = read_owner(h2.mnt, 'held3')
    assert rec['holder']['host'] == 'h1' and rec['holder']['pid'] == a.pid, rec
    with open(h2.path('held3', 'owner')) as f:
        assert '"h1"' in f.read()
    assert not os.path.exists(h2.path('p7'))
    b = procs.agent()
    assert b.mkdir(h2.path('held3')) == errno.EEXIST
    # h2 looked at held3: a release on h1 shows there at once.
    assert a.rmdir(h1.path('held3')) == 0
    wait_until(lambda: not os.path.exists(h2.path('held3')), timeout=2,
               what='h2 sees the release of a name it looks at')
    assert b.mkdir(h2.path('held3')) == 0
    # h1 still watches held3 (its rmdir looked at it): h2's grant reaches
    # it with the watch's next event, a few ms after etcd applied it.
    wait_until(lambda: os.path.exists(h1.path('held3', 'owner')), timeout=2,
               what="h1 sees h2's grant of a name it looks at")
    assert read_owner(h1.mnt, 'held3')['holder']['host'] == 'h2'
    assert b.rmdir(h2.path('held3')) == 0
    # A listing is at most a second old (docs/etcd.md).
    assert a.rmdir(h1.path('held4')) == 0
    wait_until(lambda: 'held4' not in os.listdir(h2.mnt), timeout=2.5,
               what='h2 lists the release of a name it never looked at')


def test_a_name_is_watched_while_held_or_looked_at_and_dropped_after(
        etcd1, etcd_mounts, procs):
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=1)
    h1, h2 = hosts
    # Idle: each daemon watches the host keys only.
    wait_until(lambda: watchers(etcd1) == 2, timeout=5, what='two idle daemons, two watchers')
    a = procs.agent()
    assert a.mkdir(h1.path('x')) == 0
    # held on h1 (and looked at there by the mkdir's lookup): one more
    wait_until(lambda: watchers(etcd1) == 3, timeout=5, what="h1 watches the name it holds")
    assert read_owner(h2.mnt, 'x')['holder']['host'] == 'h1'
    wait_until(lambda: watchers(etcd1) == 4, timeout=5, what='h2 watches the name it looks at')
    # h2's look ends; h1's hold does not.
    time.sleep(LOOK_S)
    wait_until(lambda: watchers(etcd1) == 3, timeout=TTL / 6 * 2 + 2,
               what="h2 drops the name it no longer looks at")
    time.sleep(TTL / 6 * 2)
    assert watchers(etcd1) == 3, 'the holder keeps watching what it holds'
    # ... and it is exact after the drop: read again.
    assert read_owner(h2.mnt, 'x')['holder']['host'] == 'h1'
    assert a.rmdir(h1.path('x')) == 0
    wait_until(lambda: not os.path.exists(h2.path('x')), timeout=2, what='x free on h2')
    wait_until(lambda: watchers(etcd1) == 2, timeout=LOOK_S + TTL / 6 * 2 + 3,
               what='both drop x once nobody holds or looks at it')


def test_a_waiter_on_a_host_that_never_looked_is_granted_in_order(
        etcd1, etcd_mounts, procs):
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=1)
    h1, h2 = hosts
    holder = procs.agent()
    assert holder.mkdir(h1.path('q')) == 0
    waiters = []
    for i, m in enumerate((h2, h1, h2)):
        w = procs.agent()
        fd = w.open(m.path('.flock', 'q'))
        rid = w.flock_start(fd, fcntl.LOCK_EX)
        wait_until(lambda: len(hosts.lock_keys('q')) == 2 + i, timeout=10,
                   what=f'waiter {i} on {m.host} in line')
        waiters.append((m.host, w, fd, rid))
    assert holder.rmdir(h1.path('q')) == 0
    for i, (host, w, fd, rid) in enumerate(waiters):
        ans = w.wait(rid, timeout=15)
        assert ans.get('errno', 0) == 0, f'waiter {i} on {host}: {ans}'
        for j, (h, v, _, r) in enumerate(waiters[i + 1:], i + 1):
            assert v.poll(r) is None, f'waiter {j} on {h} granted before waiter {i}'
        assert w.flock(fd, fcntl.LOCK_UN) == 0
    wait_until(lambda: hosts.lock_keys('q') == [], timeout=10, what='q free in etcd')


@pytest.mark.parametrize('how', ['mkdir', 'flock'])
def test_a_waiter_claims_another_hosts_release_without_asking_etcd_first(
        etcd1, etcd_mounts, tcp_proxy, procs, how):
    """A release on h1 reaches h2's waiter by its watch; whether that delete
    was a release or h1's session's end (lock-delay) is proved by the
    claim's own txn (h1's host key still on its lease), not asked of etcd
    in a read before the claim: one round trip less per hand-off."""
    proxy = tcp_proxy(etcd1.members[0].client_port)
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=5,
                        endpoints={'h2': proxy.url})
    h1, h2 = hosts
    holder, waiter = procs.agent(), procs.agent()
    if how == 'mkdir':
        assert holder.mkdir(h1.path('q')) == 0
    else:
        hfd = holder.open(h1.path('.flock', 'q'))
        assert holder.flock(hfd, fcntl.LOCK_EX) == 0
    wfd = waiter.open(h2.path('.flock', 'q'))
    wrid = waiter.flock_start(wfd, fcntl.LOCK_EX)
    wait_until(lambda: len(hosts.lock_keys('q')) == 2, timeout=10, what="h2's waiter in line")
    asked = proxy.ranges('/.hosts/')

    started = time.monotonic()
    if how == 'mkdir':
        assert holder.rmdir(h1.path('q')) == 0
    else:
        assert holder.flock(hfd, fcntl.LOCK_UN) == 0
    ans = waiter.wait(wrid, timeout=15)
    assert ans.get('errno', 0) == 0, ans
    # A release is no session's end: no lock-delay (5 s) came between.
    assert time.monotonic() - started < 4, 'the waiter was held as by a lock-delay'
    assert proxy.ranges('/.hosts/') == asked, \
        "h2 read h1's host key to judge the release before or after its claim"
    rec = read_owner(h2.mnt, 'q')
    assert rec['holder']['host'] == 'h2' and rec['holder']['pid'] == waiter.pid, rec
    assert waiter.flock(wfd, fcntl.LOCK_UN) == 0
    wait_until(lambda: hosts.lock_keys('q') == [], timeout=10, what='q free in etcd')


def test_lock_delay_holds_on_a_host_that_first_looks_after_the_session_ended(
        etcd1, etcd_mounts, procs):
    # h2 never looked at x while h1 held it, so it did not watch x when h1's
    # session ended; its host-key watch saw the end, and its first look at
    # x asks etcd whether that session headed x then: lock-delay holds.
    delay = 6
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=2, lock_delay=delay)
    h1, h2 = hosts
    holder = procs.agent()
    assert holder.mkdir(h1.path('x')) == 0
    h1.kill9()
    wait_until(lambda: hosts.keys('.hosts') == [] or
               all('/h1' not in k for k, *_ in hosts.keys('.hosts')),
               timeout=15, what="h1's session expired in etcd")
    ended = time.monotonic()
    wait_until(lambda: hosts.lock_keys('x') == [], timeout=5, what="x's key gone with it")
    other = procs.agent()
    rec = read_owner(h2.mnt, 'x')
    assert rec.get('holder') is None and 'lock_delay_until' in rec, rec
    assert other.mkdir(h2.path('x')) == errno.EEXIST
    assert time.monotonic() - ended < delay - 1, 'the machine was too slow to tell'
    wait_until(lambda: other.mkdir(h2.path('x')) == 0, timeout=delay + 10,
               what='x granted once lock-delay is over')
    assert time.monotonic() - ended >= delay - 0.5
    assert other.rmdir(h2.path('x')) == 0


def test_a_waiting_host_hears_only_of_the_key_ahead_of_its_waiter(
        etcd1, etcd_mounts, tcp_proxy, procs):
    """A waiter watches the key just ahead of it, as etcd's Mutex does: the
    other waiters that come and go behind it cost its host nothing, and it
    is still granted in its turn, with an exact `owner` after."""
    proxy = tcp_proxy(etcd1.members[0].client_port)
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2', 'h3'), ttl=TTL, lock_delay=1,
                        endpoints={'h2': proxy.url})
    h1, h2, h3 = hosts
    holder = procs.agent()
    assert holder.mkdir(h1.path('q')) == 0
    waiter = procs.agent()
    wfd = waiter.open(h2.path('.flock', 'q'))
    wrid = waiter.flock_start(wfd, fcntl.LOCK_EX)
    wait_until(lambda: len(hosts.lock_keys('q')) == 2, timeout=10, what="h2's waiter in line")

    # What etcd sends an idle h2 anyway (keepalive answers, the stream's
    # pongs), per second: measured over a window, not awaited.
    t0, idle0 = time.monotonic(), proxy.bytes_down()
    time.sleep(3)
    idle_rate = (proxy.bytes_down() - idle0) / (time.monotonic() - t0)

    def churn(rounds):
        """Waiters on h3 that queue behind h2's, then give up (they die).
        Returns the bytes etcd sent h2 meanwhile beyond its idle rate (a
        loaded machine makes the rounds slow, not the waiters dearer), per
        waiter."""
        before, t0 = proxy.bytes_down(), time.monotonic()
        for _ in range(rounds):
            w = procs.agent()
            w.flock_start(w.open(h3.path('.flock', 'q')), fcntl.LOCK_EX)
            wait_until(lambda: len(hosts.lock_keys('q')) == 3, timeout=10,
                       what="h3's waiter in line")
            w.kill()
            wait_until(lambda: len(hosts.lock_keys('q')) == 2, timeout=10,
                       what="h3's waiter gone")
        idle = idle_rate * (time.monotonic() - t0)
        return (proxy.bytes_down() - before - idle) / rounds

    # Each waiter behind is two events (~300 bytes each) to a watcher of the
    # whole name; h2 narrows its watch at its next tick (ttl/6) and then
    # gets only its keepalive answers (~250 bytes per ttl/6).
    wait_until(lambda: churn(3) < 100, timeout=TTL * 2,
               what='h2 to stop hearing of the waiters behind its own')
    per_waiter = churn(12)
    assert per_waiter < 100, f'h2 got {per_waiter:.0f} bytes per waiter behind its own'
    assert waiter.poll(wrid) is None, "h2's waiter granted while h1 holds q"
    # Its turn comes all the same, and what h2 shows of q is exact.
    assert holder.rmdir(h1.path('q')) == 0
    ans = waiter.wait(wrid, timeout=15)
    assert ans.get('errno', 0) == 0, ans
    rec = read_owner(h2.mnt, 'q')
    assert rec['holder']['host'] == 'h2' and rec['holder']['pid'] == waiter.pid, rec
    assert waiter.flock(wfd, fcntl.LOCK_UN) == 0
    wait_until(lambda: hosts.lock_keys('q') == [], timeout=10, what='q free in etcd')
