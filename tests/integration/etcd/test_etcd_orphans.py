"""The two bugs the partition runs found (docs/etcd.md, "What the runs
found"), each made deterministic with the pausable proxy
(tests/fixtures/tcp_proxy.py) between h1 and etcd, and the rule that
catches their class: a key of this daemon's session heading a name with
nobody here holding or waiting for it is an orphan, deleted at the next
session ticks (docs/etcd.md, "Orphans").

 - A fresh grant undone by a stale view: `hold-watch` holds back h1's watch
   events only, so h1's try-lock is answered while its watch still lags
   behind another host's grant and release of the same name.  The late
   event of that older key must not put it back ahead of h1's grant.
 - A claim etcd applied whose answer was lost: `hold-calls` holds back the
   answers of h1's calls only, so h1's waiter sees the line move and
   claims, etcd applies the claim, and h1 takes it as failed.  The waiter
   then gives up: its key must not stay at the head of the line."""

import errno
import fcntl
import json
import os

from etcd_fixtures import etcd1, tcp_proxy  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from lockfs_helpers import wait_until

TTL = 6          # the session tick is ttl/6: 1 s
LOCK_DELAY = 1


def two_hosts(etcd1, tcp_proxy, etcd_mounts):
    """h1 through a proxy, h2 straight to etcd."""
    proxy = tcp_proxy(etcd1.members[0].client_port)
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=LOCK_DELAY,
                        endpoints={'h1': proxy.url})
    return hosts, proxy


def fence_of(hosts, m, name):
    return int(hosts.wait_log(m, name, 'acquired')[-1].details['fence'])


def test_grant_is_not_undone_by_a_late_event_of_an_older_key(etcd1, tcp_proxy, etcd_mounts,
                                                             procs):
    hosts, proxy = two_hosts(etcd1, tcp_proxy, etcd_mounts)
    h1, h2 = hosts
    a, b = procs.agent(), procs.agent()
    # h1 watches both names (a look keeps a name watched 3 s): mk's watch
    # is the one that will lag, marker's tells when it has caught up.
    assert not os.path.exists(h1.path('mk')) and not os.path.exists(h1.path('marker'))
    proxy.hold_watch()
    try:
        # Another host takes and lets go of mk; h1 hears nothing of it yet.
        assert b.mkdir(h2.path('mk')) == 0
        assert b.rmdir(h2.path('mk')) == 0
        # h1's try-lock is answered: no key in R(mk), the grant is h1's.
        assert a.mkdir(h1.path('mk')) == 0
    finally:
        proxy.resume()
    fence = fence_of(hosts, h1, 'mk')
    # The held events come now: h2's put of mk (a key older than h1's
    # grant), its delete, h1's own put; then marker, taken after them.
    assert b.mkdir(h2.path('marker')) == 0
    wait_until(lambda: os.path.exists(h1.path('marker')), timeout=10,
               what="h1's watch caught up (marker held)")
    assert [l.event for l in hosts.log_lines(h1, 'mk')] == ['acquired'], \
        hosts.log_lines(h1, 'mk')
    assert a.owner(h1.mnt, 'mk')['holder']['pid'] == a.pid
    assert a.rmdir(h1.path('mk')) == 0
    assert hosts.lock_keys('mk') == []
    assert [int(l.details['fence']) for l in hosts.log_lines(h1, 'mk')] == [fence, fence]
    assert b.rmdir(h2.path('marker')) == 0
    assert hosts.check_history(held=set()) == []


def claimed(hosts, name, create):
    """Is NAME's key made at CREATE written with its grant's record?"""
    for _, value, c, _ in hosts.lock_keys(name):
        if c == create:
            return json.loads(value).get('fence') is not None
    return False


def test_waiter_leaving_after_a_claim_whose_answer_was_lost_frees_the_line(
        etcd1, tcp_proxy, etcd_mounts, procs):
    hosts, proxy = two_hosts(etcd1, tcp_proxy, etcd_mounts)
    h1, h2 = hosts
    holder, waiter, later = procs.agent(), procs.agent(), procs.agent()
    hfd = holder.open(h2.path('.flock', 'fl'))
    assert holder.flock(hfd, fcntl.LOCK_EX) == 0
    wfd = waiter.open(h1.path('.flock', 'fl'))
    waiter.flock_start(wfd, fcntl.LOCK_EX)
    wait_until(lambda: len(hosts.lock_keys('fl')) == 2, timeout=10, what="h1's place in line")
    place = hosts.lock_keys('fl')[1][2]
    proxy.hold_calls()
    try:
        # The holder lets go on h2; h1's watch sees it and h1 claims: etcd
        # applies the claim, h1 never hears its answer.
        holder.close(hfd)
        wait_until(lambda: claimed(hosts, 'fl', place), timeout=10,
                   what="h1's claim applied in etcd")
        # The waiter gives up (killed: its descriptor closes).
        waiter.kill()
        wait_until(lambda: 'does not answer' in h1.stderr(), timeout=10,
                   what='h1 took a call as failed')
    finally:
        proxy.resume()
    # Nobody holds fl on h1: the line must not stay wedged behind that key
    # until h1's session ends (it does not end: h1 is live).
    wait_until(lambda: hosts.lock_keys('fl') == [], timeout=4 * TTL // 3 + 4,
               what='fl free in etcd')
    lfd = later.open(h2.path('.flock', 'fl'))
    assert later.flock(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB) == 0
    later.close(lfd)
    hosts.wait_log(h2, 'fl', 'released', count=2)   # the holder's and later's
    # h1 granted nothing it did not end
    ends = [l for l in hosts.log_lines(h1, 'fl')
            if l.event in ('acquired', 'released', 'recovered', 'lost')]
    assert len(ends) % 2 == 0, ends
    assert hosts.check_history(held=set()) == []


def test_orphan_key_of_this_session_at_the_head_is_deleted(etcd1, etcd_mounts, procs):
    # The net under both: a key on h1's lease heads a name that nobody on h1
    # holds or waits for.  h1 deletes it (guarded by its revisions) within
    # two session ticks, says so, and the name is free for every host.
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=LOCK_DELAY)
    h1, h2 = hosts
    a = procs.agent()
    assert not os.path.exists(h1.path('orph'))     # h1 watches orph
    (_, value, _, lease), = [k for k in hosts.keys('.hosts') if k[0].endswith('/h1')]
    key = f"{hosts.prefix}orph/{lease:016x}-fffff"
    hosts.cluster.etcdctl('put', f'--lease={lease:x}', key, '')
    assert a.mkdir(h2.path('orph')) == errno.EEXIST    # it holds orph, for everybody
    wait_until(lambda: hosts.lock_keys('orph') == [], timeout=3 * TTL // 6 + 5,
               what='the orphan deleted')
    assert 'orphan, deleted' in h1.stderr()
    # h2 looked at orph: the delete reaches it with its watch's next event
    # (a few ms after etcd applied it), and then the name is free there too.
    wait_until(lambda: a.mkdir(h2.path('orph')) == 0, timeout=2,
               what='h2 takes orph once the orphan is gone')
    assert a.rmdir(h2.path('orph')) == 0


def test_hand_off_is_not_undone_by_a_late_event_of_an_older_key(etcd1, tcp_proxy, etcd_mounts,
                                                                 procs):
    # The same for a grant by hand-off: h2's waiter joins the line and
    # leaves it while h1's watch lags; h1's holder hands fl to h1's waiter,
    # whose place is behind where h2's was.  That older key's late event
    # must not come back ahead of the grant.
    hosts, proxy = two_hosts(etcd1, tcp_proxy, etcd_mounts)
    h1, h2 = hosts
    a, b, c = procs.agent(), procs.agent(), procs.agent()
    afd = a.open(h1.path('.flock', 'fl'))
    assert a.flock(afd, fcntl.LOCK_EX) == 0
    assert not os.path.exists(h1.path('marker'))
    proxy.hold_watch()
    try:
        cfd = c.open(h2.path('.flock', 'fl'))
        c.flock_start(cfd, fcntl.LOCK_EX)
        wait_until(lambda: len(hosts.lock_keys('fl')) == 2, timeout=10, what="h2's place")
        bfd = b.open(h1.path('.flock', 'fl'))
        rid = b.flock_start(bfd, fcntl.LOCK_EX)
        wait_until(lambda: len(hosts.lock_keys('fl')) == 3, timeout=10, what="h1's place")
        c.kill()                                  # h2's waiter leaves the line
        wait_until(lambda: len(hosts.lock_keys('fl')) == 2, timeout=10, what="h2's leave")
        assert a.flock(afd, fcntl.LOCK_UN) == 0   # handed to b
        assert 'errno' not in b.wait(rid, timeout=10)
    finally:
        proxy.resume()
    fence = fence_of(hosts, h1, 'fl')
    assert b.mkdir(h2.path('marker')) == 0
    wait_until(lambda: os.path.exists(h1.path('marker')), timeout=10,
               what="h1's watch caught up (marker held)")
    assert [l.event for l in hosts.log_lines(h1, 'fl')] == ['acquired', 'released', 'acquired'], \
        hosts.log_lines(h1, 'fl')
    assert b.owner(h1.mnt, 'fl')['holder']['pid'] == b.pid
    a.close(afd)
    b.close(bfd)
    wait_until(lambda: hosts.lock_keys('fl') == [], timeout=10, what='fl free')
    wait_until(lambda: len([l for l in hosts.log_lines(h1, 'fl')
                            if int(l.details.get('fence', 0)) == fence]) == 2,
               timeout=10, what="b's end line")
    ends = [l.event for l in hosts.log_lines(h1, 'fl') if int(l.details.get('fence', 0)) == fence]
    assert ends == ['acquired', 'released'], ends
    assert b.rmdir(h2.path('marker')) == 0
    assert hosts.check_history(held=set()) == []
