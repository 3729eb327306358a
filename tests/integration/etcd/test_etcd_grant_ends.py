"""Issue 23, part 5: every grant ends once in the log, and its holder is
told once (docs/etcd.md, "Failures"; docs/errors.md).

A write whose outcome the daemon cannot know is made with the pausable
proxy (tests/fixtures/tcp_proxy.py) between the daemon and etcd: `hold`
lets the daemon's requests reach etcd and holds back etcd's answers, so
etcd applies a write its caller never hears about; `drop` then resets the
connections (the daemon's call fails, outcome unknown) and `resume` lets
everything flow again."""

import errno
import fcntl
import os
import signal

import pytest

from etcd_fixtures import etcd1, etcd3, tcp_proxy  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from lockfs_helpers import wait_until

LOCK_DELAY = 1
END_EVENTS = ('released', 'recovered', 'lost', 'broken')


def ends_of(hosts, m, name, fence):
    return [l for l in hosts.log_lines(m, name)
            if l.event in END_EVENTS and int(l.details.get('fence', 0)) == fence]


def fence_of(hosts, m, name):
    return int(hosts.wait_log(m, name, 'acquired')[-1].details['fence'])


@pytest.fixture
def cut_h1(etcd1, tcp_proxy, etcd_mounts):
    """One host, h1, talking to etcd through a proxy; ttl 20 keeps every
    outage here well inside its session."""
    proxy = tcp_proxy(etcd1.members[0].client_port)
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=20, lock_delay=LOCK_DELAY,
                        endpoints={'h1': proxy.url})
    return hosts, proxy


def lose_the_answer(proxy, applied):
    """With the proxy holding answers: once APPLIED() (etcd did the write),
    reset the daemon's connections (its call fails, outcome unknown), then
    let traffic flow again."""
    try:
        wait_until(applied, timeout=10, what='the write applied in etcd')
        proxy.drop()
    finally:
        proxy.resume()


@pytest.mark.parametrize('how', ['close', 'unlock-then-close'])
def test_fd_holder_letting_go_when_the_answer_is_lost_ends_once(cut_h1, procs, how):
    # The release reached etcd and was applied; the daemon never heard:
    # the grant must still end, once, as `released`.
    hosts, proxy = cut_h1
    h1, = hosts
    holder = procs.agent()
    fd = holder.open(h1.path('.flock', 'f'))
    assert holder.flock(fd, fcntl.LOCK_EX) == 0
    fence = fence_of(hosts, h1, 'f')
    proxy.hold()
    if how == 'close':
        holder.close(fd)
        lose_the_answer(proxy, lambda: hosts.lock_keys('f') == [])
    else:
        rid = holder.flock_start(fd, fcntl.LOCK_UN)
        lose_the_answer(proxy, lambda: hosts.lock_keys('f') == [])
        # the holder's LOCK_UN is answered (EIO or 0); it closes anyway
        holder.wait(rid, timeout=10)
        holder.close(fd)
    wait_until(lambda: ends_of(hosts, h1, 'f', fence), timeout=15,
               what='an end line for the grant')
    other = procs.agent()
    wait_until(lambda: other.mkdir(h1.path('f')) == 0, timeout=10, what='f taken again')
    assert other.rmdir(h1.path('f')) == 0
    ends = ends_of(hosts, h1, 'f', fence)
    assert [l.event for l in ends] == ['released'], ends
    assert hosts.check_history(held=set()) == []


@pytest.mark.parametrize('how', ['close', 'unlock-then-close'])
def test_fd_holder_letting_go_while_etcd_is_silent_ends_once_when_it_answers(
        etcd1, etcd_mounts, procs, how):
    # The release times out unanswered (EIO to an unlock), etcd applies it
    # once it runs again: the retry finds the key gone, and that is the
    # release, logged `released retried=1` (asked= when the holder let go).
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=20, lock_delay=LOCK_DELAY)
    h1, = hosts
    holder = procs.agent()
    fd = holder.open(h1.path('.flock', 'f'))
    assert holder.flock(fd, fcntl.LOCK_EX) == 0
    fence = fence_of(hosts, h1, 'f')
    member = etcd1.members[0]
    os.kill(member.pid, signal.SIGSTOP)
    try:
        if how == 'close':
            holder.close(fd)
        else:
            assert holder.flock(fd, fcntl.LOCK_UN) == errno.EIO
            holder.close(fd)
        wait_until(lambda: 'does not answer' in h1.stderr(), timeout=10,
                   what="h1 says etcd does not answer")
    finally:
        os.kill(member.pid, signal.SIGCONT)
    wait_until(lambda: hosts.lock_keys('f') == [], timeout=20, what='f free in etcd')
    wait_until(lambda: ends_of(hosts, h1, 'f', fence), timeout=15,
               what='an end line for the grant')
    other = procs.agent()
    wait_until(lambda: other.mkdir(h1.path('f')) == 0, timeout=10, what='f taken again')
    assert other.rmdir(h1.path('f')) == 0
    ends = ends_of(hosts, h1, 'f', fence)
    assert [l.event for l in ends] == ['released'], ends
    assert ends[0].details.get('retried') == '1' and 'asked' in ends[0].details, ends
    assert hosts.check_history(held=set()) == []


EINTR_SETUP = r'''
import signal
signal.signal(signal.SIGUSR1, lambda s, f: None)
signal.siginterrupt(signal.SIGUSR1, True)       # no SA_RESTART: flock(2) says EINTR
'''


def gave_up_at_the_head(hosts, procs):
    """A holder of M/.flock/f and a waiter whose blocking flock a signal
    interrupted; the holder lets go within the second the waiter's place
    is kept (an interrupted flock(2) may be restarted), so that place is
    the head of etcd's line -- shown as the holder, granted to nobody.
    (holder, waiter, the waiter's fd, the place's create_revision)."""
    h1, = hosts
    holder, waiter = procs.agent(), procs.agent(setup=EINTR_SETUP)
    fh = holder.open(h1.path('.flock', 'f'))
    assert holder.flock(fh, fcntl.LOCK_EX) == 0
    fw = waiter.open(h1.path('.flock', 'f'))
    rid = waiter.cflock_start(fw, fcntl.LOCK_EX)
    wait_until(lambda: len(hosts.lock_keys('f')) == 2, timeout=10, what="the waiter's place")
    os.kill(waiter.pid, signal.SIGUSR1)
    assert waiter.wait(rid, timeout=10).get('errno') == errno.EINTR
    assert holder.flock(fh, fcntl.LOCK_UN) == 0
    (_, _, place, _), = hosts.lock_keys('f')
    return holder, waiter, fw, place


def assert_only_real_grants(hosts, procs, holder, place):
    """F free in etcd, taken and let go once more; the log shows the two
    real grants, and nothing of the waiter's place."""
    h1, = hosts
    wait_until(lambda: hosts.lock_keys('f') == [], timeout=20, what='the place gone from etcd')
    other = procs.agent()
    wait_until(lambda: other.mkdir(h1.path('f')) == 0, timeout=10, what='f taken again')
    assert other.rmdir(h1.path('f')) == 0
    lines = hosts.log_lines(h1, 'f')
    assert [(l.event, int(l.details['pid'])) for l in lines] == [
        ('acquired', holder.pid), ('released', holder.pid),
        ('acquired', other.pid), ('released', other.pid)], lines
    assert all(int(l.details['fence']) != place for l in lines), (place, lines)
    assert hosts.check_history(held=set()) == []


def test_a_waiter_that_gave_up_at_the_head_of_the_line_ends_no_grant(etcd1, etcd_mounts, procs):
    # Seen in the partition herd: a blocking flock was interrupted (its
    # caller's alarm) just as its place reached the head of etcd's line,
    # and its file was closed while etcd was slow.  The store then showed
    # that place as the holder, so the close "released" it -- retried, and
    # logged `released retried=1` for a fence no `acquired` line ever gave.
    # A place nobody was granted is withdrawn, not released: no end line.
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=20, lock_delay=LOCK_DELAY)
    h1, = hosts
    holder, waiter, fw, place = gave_up_at_the_head(hosts, procs)
    member = etcd1.members[0]
    os.kill(member.pid, signal.SIGSTOP)
    try:
        waiter.close(fw)
        wait_until(lambda: 'does not answer' in h1.stderr(), timeout=10,
                   what="h1 says etcd does not answer")
    finally:
        os.kill(member.pid, signal.SIGCONT)
    assert_only_real_grants(hosts, procs, holder, place)


def test_a_waiter_that_gave_up_at_the_head_and_rmdirs_withdraws_its_place(
        etcd1, etcd_mounts, procs):
    # `owner` names the waiter while its place is the head (etcd's view);
    # its rmdir then takes the place back, as its close would: 0, the name
    # free at once, and no `released` for a grant it never had.
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=20, lock_delay=LOCK_DELAY)
    h1, = hosts
    holder, waiter, fw, place = gave_up_at_the_head(hosts, procs)
    assert waiter.owner(h1.mnt, 'f')['holder']['pid'] == waiter.pid
    assert waiter.rmdir(h1.path('f')) == 0
    assert hosts.lock_keys('f') == []
    assert_only_real_grants(hosts, procs, holder, place)
    waiter.close(fw)


def test_a_waiters_place_at_the_head_cannot_be_bound(etcd1, etcd_mounts, procs):
    # Writing `process` to M/NAME/bind turns a held fd lock into a process
    # lock; a place no grant made the writer's is not one: EPERM.
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=20, lock_delay=LOCK_DELAY)
    h1, = hosts
    holder, waiter, fw, place = gave_up_at_the_head(hosts, procs)
    assert waiter.write(h1.path('f', 'bind'), b'process') == errno.EPERM
    waiter.close(fw)
    assert_only_real_grants(hosts, procs, holder, place)


def warm(agent, m):
    """One grant and release first, so that the daemon's connections to
    etcd are kept ones (libcurl resends only on a kept connection)."""
    assert agent.mkdir(m.path('warm')) == 0
    assert agent.rmdir(m.path('warm')) == 0


def test_mkdir_whose_answer_is_lost_is_granted_once_and_ends_once(cut_h1, procs):
    # The try-lock's write reached etcd and made the key; its answer was
    # lost and the request went again, finding that key.  That key is the
    # grant: mkdir says 0 (not EEXIST with the key held by nobody), the
    # holder's owner, rmdir and the log agree, and nothing undoes it.
    hosts, proxy = cut_h1
    h1, = hosts
    a, other = procs.agent(), procs.agent()
    warm(a, h1)
    # The daemon reads a name it does not watch at its lookup (and then
    # watches it a while): look first, so that the try-lock is the
    # request whose answer is lost.
    assert not os.path.exists(h1.path('x'))
    proxy.hold()
    rid = a.start('mkdir', path=h1.path('x').encode().hex())
    lose_the_answer(proxy, lambda: hosts.lock_keys('x') != [])
    assert a.wait(rid, timeout=10).get('errno') is None
    fence = fence_of(hosts, h1, 'x')
    (_, value, create, _), = hosts.lock_keys('x')
    assert create == fence
    assert a.owner(h1.mnt, 'x')['holder']['pid'] == a.pid
    assert other.mkdir(h1.path('x')) == errno.EEXIST
    assert other.rmdir(h1.path('x')) == errno.EPERM
    assert a.rmdir(h1.path('x')) == 0
    assert hosts.lock_keys('x') == []
    assert [l.event for l in hosts.log_lines(h1, 'x') if l.event != 'denied'] == [
        'acquired', 'released']
    # and the name is free for a fresh grant
    assert other.mkdir(h1.path('x')) == 0
    assert other.rmdir(h1.path('x')) == 0
    assert hosts.check_history(held=set()) == []


def test_flock_grant_whose_answer_is_lost_is_granted_once_and_ends_once(cut_h1, procs):
    # The same for an uncontended flock: its first write is a put that
    # the resend writes again (create_revision kept, mod moved).
    hosts, proxy = cut_h1
    h1, = hosts
    a, other = procs.agent(), procs.agent()
    warm(a, h1)
    fd = a.open(h1.path('.flock', 'g'))
    proxy.hold()
    rid = a.flock_start(fd, fcntl.LOCK_EX)
    lose_the_answer(proxy, lambda: hosts.lock_keys('g') != [])
    assert 'errno' not in a.wait(rid, timeout=15)
    fence = fence_of(hosts, h1, 'g')
    (_, _, create, _), = hosts.lock_keys('g')
    assert fence >= create
    assert other.mkdir(h1.path('g')) == errno.EEXIST
    a.close(fd)
    wait_until(lambda: ends_of(hosts, h1, 'g', fence), timeout=10, what="g's end line")
    wait_until(lambda: other.mkdir(h1.path('g')) == 0, timeout=10, what='g taken again')
    assert other.rmdir(h1.path('g')) == 0
    assert [l.event for l in ends_of(hosts, h1, 'g', fence)] == ['released']
    assert [l.event for l in hosts.log_lines(h1, 'g')] == [
        'acquired', 'released', 'acquired', 'released']
    assert hosts.check_history(held=set()) == []


def test_lost_holder_is_told_estale_once_then_mkdir_is_a_fresh_acquire(etcd1, etcd_mounts, procs):
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=20, lock_delay=LOCK_DELAY)
    h1, = hosts
    holder = procs.agent()
    assert holder.mkdir(h1.path('x')) == 0
    fence = fence_of(hosts, h1, 'x')
    (key, _, _, _), = hosts.lock_keys('x')
    hosts.cluster.etcdctl('del', key)     # removed behind its holder's back
    lost = hosts.wait_log(h1, 'x', 'lost', timeout=10)[0]
    assert int(lost.details['fence']) == fence
    assert holder.rmdir(h1.path('x')) == errno.ESTALE      # told, once
    # at once after (well inside the kernel's retry window): a new grant
    assert holder.mkdir(h1.path('x')) == 0
    assert holder.owner(h1.mnt, 'x')['holder']['pid'] == holder.pid
    assert holder.rmdir(h1.path('x')) == 0
    assert [l.event for l in hosts.log_lines(h1, 'x')] == [
        'acquired', 'lost', 'acquired', 'released']
    assert hosts.check_history(held=set()) == []


def test_lost_holder_told_by_its_owner_read_is_told_once(etcd1, etcd_mounts, procs):
    # Any look at the name tells it (here `cat owner`): ESTALE once, then
    # the name is simply free to that holder too.
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=20, lock_delay=LOCK_DELAY)
    h1, = hosts
    holder = procs.agent()
    assert holder.mkdir(h1.path('x')) == 0
    (key, _, _, _), = hosts.lock_keys('x')
    hosts.cluster.etcdctl('del', key)
    hosts.wait_log(h1, 'x', 'lost', timeout=10)
    ans = holder.call('read', path=h1.path('x', 'owner').encode().hex(), timeout=10)
    assert ans.get('errno') == errno.ESTALE, ans
    assert holder.rmdir(h1.path('x')) == errno.ENOENT
    assert holder.mkdir(h1.path('x')) == 0
    assert holder.rmdir(h1.path('x')) == 0


def while_the_leader_goes(cluster, how, call):
    """CALL() right after CLUSTER's leader died (`kill9`) or froze
    (`sigstop`); the leader back, and a leader elected, before returning
    what CALL returned."""
    leader = cluster.wait_leader(timeout=30)
    if how == 'kill9':
        leader.kill9()
    else:
        os.kill(leader.pid, signal.SIGSTOP)
    try:
        return call()
    finally:
        if how == 'kill9':
            leader.start()
        else:
            os.kill(leader.pid, signal.SIGCONT)
        cluster.wait_leader(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize('how', ['kill9', 'sigstop'])
def test_holders_rmdir_rides_out_a_leader_election(etcd3, etcd_mounts, procs, how):
    # The fixtures' members elect in ~0.1 s (--election-timeout 100): well
    # inside the 1 s bound, so the holder's rmdir right after the leader
    # died (or froze) must succeed, not answer EIO.  Some rounds, since
    # the daemon may be talking to any member when the leader goes.
    hosts = etcd_mounts(etcd3, hosts=('h1',), ttl=10, lock_delay=LOCK_DELAY)
    h1, = hosts
    holder = procs.agent()
    answers = []
    for i in range(3):
        name = f'x{i}'
        assert holder.mkdir(h1.path(name)) == 0
        fence = fence_of(hosts, h1, name)
        answers.append(while_the_leader_goes(etcd3, how, lambda: holder.rmdir(h1.path(name))))
        wait_until(lambda: ends_of(hosts, h1, name, fence), timeout=15,
                   what=f"{name}'s end line")
        assert [l.event for l in ends_of(hosts, h1, name, fence)] == ['released']
        wait_until(lambda: hosts.lock_keys(name) == [], timeout=10, what=f'{name} free in etcd')
    assert answers == [0, 0, 0], answers
    assert hosts.check_history(held=set()) == []


@pytest.mark.slow
@pytest.mark.parametrize('how', ['kill9', 'sigstop'])
def test_mkdir_rides_out_a_leader_election(etcd3, etcd_mounts, procs, how):
    # A mkdir right after the leader died (or froze) is granted: its lookup
    # is a read, sent again within the 1 s bound until a member answers,
    # and the fixtures' members elect in ~0.1 s.  (A claim whose answer is
    # lost in the election is not sent twice: EIO, undone later.)
    hosts = etcd_mounts(etcd3, hosts=('h1',), ttl=10, lock_delay=LOCK_DELAY)
    h1, = hosts
    holder = procs.agent()
    answers = []
    for i in range(3):
        name = f'y{i}'
        answers.append(while_the_leader_goes(etcd3, how, lambda: holder.mkdir(h1.path(name))))
        if answers[-1] == 0:
            assert holder.rmdir(h1.path(name)) == 0
        wait_until(lambda: hosts.lock_keys(name) == [], timeout=15, what=f'{name} free in etcd')
    assert answers == [0, 0, 0], answers
    assert hosts.check_history(held=set()) == []
