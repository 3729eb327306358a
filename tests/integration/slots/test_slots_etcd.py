"""Issue 24 §1 on the etcd backend: two daemons (hosts h1, h2) on one etcd
share the slots of one name (docs/slots.md, "Backends").  Slot K of NAME is
the lock `.slotKofN:NAME`, whose contenders are etcd keys
PREFIX `.slotKofN:NAME/` LEASE-SEQ like any lock's.  Skipped, with the
reason, only when the etcd binaries are absent."""

import errno
import fcntl
import json
import os

from etcd_fixtures import etcd1  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from flock_helpers import waiter_pids
from lockfs_helpers import read_log, wait_until, slot_owner, slot_waiters

EX = fcntl.LOCK_EX


def slot_holders(m, name):
    """(host, pid) of every holder of slotted NAME, as mount M's `owner` has
    them ([] while none is held)."""
    try:
        return [(h['host'], h['pid']) for h in slot_owner(m, name)['holders']]
    except FileNotFoundError:
        return []


def slot_line(m, name):
    """(pid, host) of every waiter in slotted NAME's line, as mount M lists it."""
    try:
        with open(m.path('.slots', name, 'waiters')) as f:
            return [(w['pid'], w['host']) for w in map(json.loads, f) if w]
    except FileNotFoundError:
        return []




def test_two_hosts_share_the_slots_of_one_name(etcd1, etcd_mounts, procs):
    h1, h2 = etcd_mounts(etcd1, hosts=('h1', 'h2'))
    a, b, c = procs.agent(), procs.agent(), procs.agent()
    assert a.mkdir(h1.path('.slots', 'gpu=2')) == 0
    assert b.mkdir(h2.path('.slots', 'gpu=2')) == 0
    # All taken, whichever host asks; another count is refused on both.
    assert c.mkdir(h2.path('.slots', 'gpu=2')) == errno.EEXIST
    assert c.mkdir(h1.path('.slots', 'gpu=2')) == errno.EEXIST
    assert c.mkdir(h2.path('.slots', 'gpu=3')) == errno.ERANGE
    assert any(ln.event == 'denied' and ln.name == b'gpu' and 'slots-conflict' in ln.raw
               for ln in read_log(h2.dir))
    for m in (h1, h2):
        o = slot_owner(m, 'gpu')
        assert (o['slots'], o['held']) == (2, 2)
        assert sorted((h['slot'], h['host'], h['pid']) for h in o['holders']) == [
            (0, 'h1', a.pid), (1, 'h2', b.pid)]
    # The key layout: each slot is a lock of its own under the prefix.
    out = etcd1.etcdctl('get', '--prefix', f'{h1.prefix}.slot', '--keys-only').stdout
    keys = sorted(k for k in out.splitlines() if k)
    assert [k.split('/')[-2] for k in keys] == ['.slot0of2:gpu', '.slot1of2:gpu'], keys
    # A waiter on h2 gets the slot h1's holder lets go.
    w = procs.agent()
    fd = w.open(h2.path('.flock', '.slots', 'gpu=2'))
    rid = w.flock_start(fd, EX)
    wait_until(lambda: slot_waiters(h2, 'gpu') == [w.pid], what='the waiter listed on h2')
    assert b.rmdir(h1.path('.slots', 'gpu')) == errno.EPERM  # not b's slot there
    assert a.rmdir(h1.path('.slots', 'gpu')) == 0
    assert 'errno' not in w.wait(rid, 10)
    wait_until(lambda: sorted((h['slot'], h['host']) for h in slot_owner(h1, 'gpu')['holders'])
               == [(0, 'h2'), (1, 'h2')], what='h1 sees both slots held on h2')
    fences = sorted(h['fence'] for h in slot_owner(h2, 'gpu')['holders'])
    assert len(set(fences)) == 2
    lines = [ln for ln in read_log(h2.dir) if ln.name == b'.slot0of2:gpu']
    assert [ln.event for ln in lines] == ['acquired'] and f'pid={w.pid}' in lines[0].raw


def test_a_slot_goes_to_the_waiter_that_came_first_whichever_host_it_is_on(
        etcd1, etcd_mounts, procs):
    """One FIFO line per slotted name across hosts: waiters stand in the
    line of the lock `.slotline:NAME`, in etcd's order, and only its head
    takes a free slot; a newcomer on any host does not go ahead of it."""
    h1, h2 = etcd_mounts(etcd1, hosts=('h1', 'h2'))
    holder, first, second, late = (procs.agent() for _ in range(4))
    assert holder.mkdir(h1.path('.slots', 'seat=1')) == 0
    fd1 = first.open(h2.path('.flock', '.slots', 'seat=1'))
    r1 = first.flock_start(fd1, EX)
    wait_until(lambda: slot_waiters(h2, 'seat') == [first.pid], what='first waits on h2')
    fd2 = second.open(h1.path('.flock', '.slots', 'seat=1'))
    r2 = second.flock_start(fd2, EX)
    # Both hosts list the one line, every host's waiter, in etcd's order.
    for m in (h1, h2):
        wait_until(lambda: slot_line(m, 'seat') == [(first.pid, 'h2'), (second.pid, 'h1')],
                   what=f'the line on {m.host}')
    # The slot frees on h1, where `second` waits: it is `first`'s all the same,
    # and a newcomer on h1 or h2 at that moment is told it is taken.
    assert holder.rmdir(h1.path('.slots', 'seat')) == 0
    assert late.mkdir(h1.path('.slots', 'seat=1')) == errno.EEXIST
    assert late.mkdir(h2.path('.slots', 'seat=1')) == errno.EEXIST
    assert 'errno' not in first.wait(r1, 10)
    assert second.poll(r2) is None
    # Every host's `owner` of a slotted name shows it (see the next test).
    wait_until(lambda: slot_holders(h1, 'seat') == [('h2', first.pid)],
               what="h1 sees first's slot")
    # `first` lets go: `second`, next in the line, has it.
    first.close(fd1)
    assert 'errno' not in second.wait(r2, 10)
    wait_until(lambda: slot_holders(h2, 'seat') == [('h1', second.pid)],
               what="h2 sees second's slot")
    second.close(fd2)


def test_a_waiter_killed_at_the_head_of_the_line_lets_the_next_host_in(
        etcd1, etcd_mounts, procs):
    """The head of the line (it holds `.slotline:NAME`) is killed while it
    waits: it leaves the line, and the waiter behind it on the other host
    gets the next slot; nothing of the dead waiter is left in etcd."""
    h1, h2 = etcd_mounts(etcd1, hosts=('h1', 'h2'))
    holder, first, second = (procs.agent() for _ in range(3))
    assert holder.mkdir(h1.path('.slots', 'seat=1')) == 0
    fd1 = first.open(h2.path('.flock', '.slots', 'seat=1'))
    first.flock_start(fd1, EX)
    wait_until(lambda: slot_waiters(h2, 'seat') == [first.pid], what='first waits on h2')
    fd2 = second.open(h1.path('.flock', '.slots', 'seat=1'))
    r2 = second.flock_start(fd2, EX)
    wait_until(lambda: slot_waiters(h1, 'seat') == [first.pid, second.pid],
               what='second waits behind first')
    first.kill()
    wait_until(lambda: slot_waiters(h2, 'seat') == [second.pid], what="first's wait ended")
    assert holder.rmdir(h1.path('.slots', 'seat')) == 0
    assert 'errno' not in second.wait(r2, 10)
    wait_until(lambda: slot_holders(h2, 'seat') == [('h1', second.pid)],
               what="h2 sees second's slot")
    second.close(fd2)
    # The line is empty again: its keys are gone, a newcomer takes the slot.
    wait_until(lambda: not etcd1.etcdctl('get', '--prefix', f'{h1.prefix}.slotline:seat',
                                         '--keys-only').stdout.strip(),
               what='no key left in the line')
    assert holder.mkdir(h2.path('.slots', 'seat=1')) == 0


def test_owner_of_a_slotted_name_is_exact_on_every_host(etcd1, etcd_mounts, procs):
    """`owner` and a lookup of M/.slots/NAME read NAME's slots from etcd at
    that moment, not from the listing a daemon keeps for `ls` (up to 1 s
    old): a slot taken or let go on another host shows at once, or, once
    this daemon watches the slots it looked at, within the few ms etcd's
    watch takes (docs/etcd.md) -- well under the half second allowed here,
    where the `ls` listing just read stays as it was for a second."""
    h1, h2 = etcd_mounts(etcd1, hosts=('h1', 'h2'))
    a = procs.agent()
    for _ in range(3):
        # h1 has just listed: nothing held.
        assert 'lab' not in os.listdir(h1.path('.slots'))
        assert not os.path.exists(h1.path('.slots', 'lab'))
        assert a.mkdir(h2.path('.slots', 'lab=2')) == 0
        wait_until(lambda: slot_holders(h1, 'lab') == [('h2', a.pid)], timeout=0.5,
                   what="h1's owner shows h2's slot")
        assert a.rmdir(h2.path('.slots', 'lab')) == 0
        wait_until(lambda: not os.path.exists(h1.path('.slots', 'lab')), timeout=0.5,
                   what='h1 sees the slot let go')


def test_first_takers_on_two_hosts_with_other_counts_never_both_win(etcd1, etcd_mounts, procs):
    """Two first takers of a free name, on two hosts at the same moment,
    asking for different counts: never do both get a slot (a first taker
    holds the name's line lock while it reads the slots and takes one), so
    the slots never stand under two counts."""
    h1, h2 = etcd_mounts(etcd1, hosts=('h1', 'h2'))
    a, b = procs.agent(), procs.agent()
    both = 0
    for i in range(20):
        name = f'race{i}'
        ra = a.start('mkdir', path=a._p(h1.path('.slots', f'{name}=2')))
        rb = b.start('mkdir', path=b._p(h2.path('.slots', f'{name}=3')))
        got = (a.wait(ra).get('errno', 0), b.wait(rb).get('errno', 0))
        assert sorted(got) in ([0, errno.EEXIST], [0, errno.ERANGE]), got
        o = slot_owner(h1, name)
        assert o['held'] == 1 and o['slots'] == (2 if got[0] == 0 else 3), o
        both += got == (0, 0)
        for who, m, e in ((a, h1, got[0]), (b, h2, got[1])):
            if e == 0:
                assert who.rmdir(m.path('.slots', name)) == 0
    assert both == 0
    # The same with flock(LOCK_NB), whose first taker holds the line lock
    # as an fd lock of its open file.
    for i in range(10):
        name = f'nbrace{i}'
        fa = a.open(h1.path('.flock', '.slots', f'{name}=2'))
        fb = b.open(h2.path('.flock', '.slots', f'{name}=3'))
        ra = a.start('flock', fd=fa, how=EX | fcntl.LOCK_NB, timeout=None)
        rb = b.start('flock', fd=fb, how=EX | fcntl.LOCK_NB, timeout=None)
        got = (a.wait(ra).get('errno', 0), b.wait(rb).get('errno', 0))
        assert sorted(got) in ([0, errno.EWOULDBLOCK], [0, errno.ERANGE]), got
        assert slot_owner(h1, name)['held'] == 1
        a.close(fa)
        b.close(fb)


def test_a_place_in_the_slots_line_is_no_wait_for_the_deadlock_check(etcd1, etcd_mounts, procs):
    """Deadlock detection does not see waits for slots (docs/slots.md), and
    on etcd a slot waiter's place in the line of `.slotline:NAME` is no
    exception: P, holding A, waits behind Q for a slot while Q waits for A.
    That is no deadlock (Q's slot comes when R lets go, then P's), so Q's
    wait for A is not refused with EDEADLK."""
    h1, = etcd_mounts(etcd1, hosts=('h1',))
    r, q, p = procs.agent(), procs.agent(), procs.agent()
    assert r.mkdir(h1.path('.slots', 'S=1')) == 0
    qs = q.open(h1.path('.flock', '.slots', 'S=1'))
    rq_slot = q.flock_start(qs, EX, bg=True)
    wait_until(lambda: slot_waiters(h1, 'S') == [q.pid], what='q waits for the slot')
    pa = p.open(h1.path('.flock', 'A'))
    assert p.flock(pa, EX) == 0
    ps = p.open(h1.path('.flock', '.slots', 'S=1'))
    rp_slot = p.flock_start(ps, EX, bg=True)
    wait_until(lambda: slot_waiters(h1, 'S') == [q.pid, p.pid], what='p waits behind q')
    qa = q.open(h1.path('.flock', 'A'))
    rq_a = q.flock_start(qa, EX)
    wait_until(lambda: waiter_pids(h1, 'A') == [q.pid], what='q waits for A')
    assert q.poll(rq_a) is None, q.poll(rq_a)
    # R lets go: Q's slot; P lets A go: Q's A; Q goes: P's slot.
    assert r.rmdir(h1.path('.slots', 'S')) == 0
    assert 'errno' not in q.wait(rq_slot, 10)
    assert p.flock(pa, fcntl.LOCK_UN) == 0
    assert 'errno' not in q.wait(rq_a, 10)
    q.close(qs)
    assert 'errno' not in p.wait(rp_slot, 10)
