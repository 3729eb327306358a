"""Issue 24 §1 on the etcd backend: two daemons (hosts h1, h2) on one etcd
share the slots of one name (docs/slots.md, "Backends").  Slot K of NAME is
the lock `.slotKofN:NAME`, whose contenders are etcd keys
PREFIX `.slotKofN:NAME/` LEASE-SEQ like any lock's.  Skipped, with the
reason, only when the etcd binaries are absent."""

import errno
import fcntl

from etcd_fixtures import etcd1  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from lockfs_helpers import read_log, wait_until, slot_owner, slot_waiters

EX = fcntl.LOCK_EX




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
