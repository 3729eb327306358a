"""A holder's release racing the loss of its daemon's etcd session
(docs/etcd.md, "What the runs found"; docs/errors.md, ESTALE).  Every grant
ends once in the log -- `released` or `lost`, never both, never neither --
and its holder's rmdir says which: 0 only when etcd confirmed the delete
(its compare found the key, so the session still held it), ESTALE when the
loss won.

Each order is made deterministic with the pausable proxy
(tests/fixtures/tcp_proxy.py) between h1 and etcd, and with `etcdctl lease
revoke`, which ends h1's session in etcd (its keys go with it) at a moment
the test picks, as an expiry does, while h1 has not heard of it yet:

 - the loss first: etcd ended the session, h1's watch has not said so, and
   the holder's rmdir finds its key gone.  The old build answered ENOENT
   and logged nothing at all for the grant (the partition herd's
   `[no-end]`).
 - the release in flight: the rmdir's delete is on its way when the
   session ends; its answer is lost and the copy sent again finds the key
   gone.  The old build took that as its own first copy's work: `released`,
   and 0 where ESTALE was due (the herd's `[lost-rmdir] ... answered OK`).
 - the loss logged first, the release after: once `lost` is logged for a
   grant, a release of that grant that the holder asks for afterwards
   (its key still shown by the store) ends nothing more and answers
   ESTALE (the herd's `[ends] ... ended twice`)."""

import errno
import json
import os

from etcd_fixtures import etcd1, tcp_proxy  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from lockfs_helpers import wait_until

TTL = 30         # keepalives every 5 s: h1 hears of the loss only when the test says
LOCK_DELAY = 1
END_EVENTS = ('released', 'recovered', 'lost', 'broken')


def one_host(etcd1, tcp_proxy, etcd_mounts):
    proxy = tcp_proxy(etcd1.members[0].client_port)
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=TTL, lock_delay=LOCK_DELAY,
                        endpoints={'h1': proxy.url})
    return hosts, proxy


def fence_of(hosts, m, name):
    return int(hosts.wait_log(m, name, 'acquired')[-1].details['fence'])


def ends_of(hosts, m, name, fence):
    return [l for l in hosts.log_lines(m, name)
            if l.event in END_EVENTS and int(l.details.get('fence', 0)) == fence]


def h1_lease(hosts):
    (_, _, _, lease), = [k for k in hosts.keys('.hosts') if k[0].endswith('/h1')]
    return lease


def revoke(hosts, lease):
    hosts.cluster.etcdctl('lease', 'revoke', f'{lease:x}')
    assert not [k for k in hosts.keys() if k[3] == lease], 'the lease kept keys'


def settled(hosts, h1, name, fence):
    """h1 knows its session ended (a new one is live) and the grant's end
    lines are all written; its ends."""
    wait_until(lambda: 'new session' in h1.stderr(), timeout=4 * TTL // 6 + 5,
               what='h1 noticed the session ended and made a new one')
    wait_until(lambda: ends_of(hosts, h1, name, fence), timeout=10,
               what=f'an end line of {name} fence {fence}')
    return [l.event for l in ends_of(hosts, h1, name, fence)]


def test_rmdir_finding_its_key_gone_with_the_session_is_told_lost_once(
        etcd1, tcp_proxy, etcd_mounts, procs):
    hosts, proxy = one_host(etcd1, tcp_proxy, etcd_mounts)
    h1, = hosts
    a = procs.agent()
    assert a.mkdir(h1.path('mk')) == 0
    fence = fence_of(hosts, h1, 'mk')
    proxy.hold_watch()              # h1's view of etcd stops here
    try:
        revoke(hosts, h1_lease(hosts))
        rc = a.rmdir(h1.path('mk'))
    finally:
        proxy.resume()
    assert rc == errno.ESTALE, errno.errorcode.get(rc, rc)
    ends = settled(hosts, h1, 'mk', fence)
    assert ends == ['lost'], hosts.log_lines(h1, 'mk')
    # told once: the holder's next mkdir is a fresh acquire
    wait_until(lambda: a.mkdir(h1.path('mk')) == 0, timeout=10, what='mk taken again')
    assert a.rmdir(h1.path('mk')) == 0
    assert hosts.check_history(held=set()) == []


def test_rmdir_resent_across_the_session_loss_is_not_released(
        etcd1, tcp_proxy, etcd_mounts, procs):
    hosts, proxy = one_host(etcd1, tcp_proxy, etcd_mounts)
    h1, = hosts
    a = procs.agent()
    assert a.mkdir(h1.path('mk')) == 0
    fence = fence_of(hosts, h1, 'mk')
    lease = h1_lease(hosts)
    proxy.hold_watch()
    try:
        # The session ends in etcd; the watch does not say so.  Then every
        # answer is held: the rmdir's delete reaches etcd (its compare
        # finds the key gone) and its answer is lost; the connections are
        # reset, and the delete is sent again on a new one.
        revoke(hosts, lease)
        proxy.hold()
        before = proxy.txns()
        rid = a.start('rmdir', path=a._p(h1.path('mk')))
        wait_until(lambda: proxy.txns() > before, timeout=10,
                   what="the rmdir's delete reached etcd (its answer held)")
        proxy.drop()
    finally:
        proxy.resume()
    rc = a.wait(rid, timeout=10).get('errno', 0)
    assert rc == errno.ESTALE, errno.errorcode.get(rc, rc)
    ends = settled(hosts, h1, 'mk', fence)
    assert ends == ['lost'], hosts.log_lines(h1, 'mk')
    wait_until(lambda: a.mkdir(h1.path('mk')) == 0, timeout=10, what='mk taken again')
    assert a.rmdir(h1.path('mk')) == 0
    assert hosts.check_history(held=set()) == []


def test_release_after_the_loss_was_logged_ends_nothing_more(
        etcd1, tcp_proxy, etcd_mounts, procs):
    # The store shows the lost grant's record again, on h1's live session
    # (here put there by hand: in the partition runs a view of the key that
    # was not gone yet): the holder's rmdir must not make the grant end a
    # second time, `released` after `lost`, nor answer 0.
    hosts, proxy = one_host(etcd1, tcp_proxy, etcd_mounts)
    h1, = hosts
    a = procs.agent()
    assert a.mkdir(h1.path('mk')) == 0
    fence = fence_of(hosts, h1, 'mk')
    (_, value, _, _), = hosts.lock_keys('mk')
    record = json.loads(value)
    record['fence'] = fence
    old = h1_lease(hosts)
    revoke(hosts, old)
    assert settled(hosts, h1, 'mk', fence) == ['lost']
    new = h1_lease(hosts)
    assert new != old
    hosts.cluster.etcdctl('put', f'--lease={new:x}', f'{hosts.prefix}mk/{new:016x}-fffff',
                          json.dumps(record))
    wait_until(lambda: os.path.exists(h1.path('mk')), timeout=10,
               what="h1 shows the lost grant's record again")
    rc = a.rmdir(h1.path('mk'))
    assert rc == errno.ESTALE, errno.errorcode.get(rc, rc)
    assert [l.event for l in ends_of(hosts, h1, 'mk', fence)] == ['lost'], \
        hosts.log_lines(h1, 'mk')
    wait_until(lambda: hosts.lock_keys('mk') == [], timeout=10, what='mk free in etcd')
    wait_until(lambda: a.mkdir(h1.path('mk')) == 0, timeout=10, what='mk taken again')
    assert a.rmdir(h1.path('mk')) == 0
    assert hosts.check_history(held=set()) == []
