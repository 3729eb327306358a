#!/usr/bin/python3
"""Issue 11: fd locks (`flock`/`fcntl` on `M/.flock/NAME`) on the etcd backend
behave as on one machine.

Fences are etcd revisions: a process that joins a held shared lock (`flock(fd, LOCK_SH)` on
`M/.flock/NAME`) is one more grant: its fence is the revision of the write
that added it, shown in `owner` and in the record that `etcdctl get` reads.
etcd issues that revision only in the write itself, so the daemon writes the
record once more with it.  Skipped, with the reason, only when the etcd
binaries are absent.

Two threads blocked for one owner (one open file for flock, one process for
fcntl/lockf) both return as soon as that owner is granted, whoever waits
between them, as the kernel's own locks behave (waiting.md).
"""

import base64
import os
import fcntl
import json
import uuid

from etcd_fixtures import etcd1  # noqa: F401
import pytest

from flock_helpers import fpath, holder_pids, wait_waiters, waiter_pids
from lockfs_helpers import log_for, read_owner

EX, SH, UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_UN


@pytest.fixture
def prefix():
    return f'/t-{uuid.uuid4().hex[:8]}/'


@pytest.fixture
def m(lockfs_factory, etcd1, prefix):
    return lockfs_factory(options=('backend=etcd', f'etcd={etcd1.endpoints}',
                                   f'prefix={prefix}', 'host=h1', 'ttl=4', 'lock_delay=1'))


def _stored_records(cluster, prefix, name):
    out = cluster.etcdctl('get', '--prefix', f'{prefix}{name}/', '-w', 'json').stdout
    return [json.loads(base64.b64decode(kv['value']))
            for kv in json.loads(out).get('kvs', []) if kv.get('value')]


def _granted(agent, rid, timeout=5):
    a = agent.wait(rid, timeout)
    assert 'errno' not in a, f'{agent}: errno {a["errno"]}'


def test_a_joining_share_gets_its_own_fence_in_owner_and_in_the_store(m, etcd1, prefix, procs):
    first, second = procs.agent(), procs.agent()
    fd1, fd2 = first.open(fpath(m, 'x')), second.open(fpath(m, 'x'))
    assert first.flock(fd1, SH) == 0
    assert second.flock(fd2, SH) == 0

    o = read_owner(m.mnt, 'x')
    fences = {h['pid']: h['fence'] for h in o['holders']}
    assert set(fences) == {first.pid, second.pid}, o['holders']
    assert all(isinstance(f, int) and f > 0 for f in fences.values()), fences
    assert fences[second.pid] > fences[first.pid], fences
    assert o['fence'] == fences[first.pid]

    [stored] = _stored_records(etcd1, prefix, 'x')
    assert {h['pid']: h['fence'] for h in stored['holders']} == fences, stored['holders']

    acquired = [ln for ln in log_for(m.dir, 'x') if ln.event == 'acquired']
    assert sorted(int(ln.details['fence']) for ln in acquired) == sorted(fences.values())


@pytest.mark.parametrize('kind', ['flock', 'lockf'])
def test_two_threads_of_one_owner_both_return_when_it_is_granted(m, procs, kind):
    h = procs.agent()
    fh = h.take(fpath(m, 'x'))
    t = procs.agent()
    tfd = t.open(fpath(m, 'x'))

    def start():
        if kind == 'flock':
            return t.flock_start(tfd, EX, bg=True)
        return t.lockf_start(tfd, fcntl.LOCK_EX, bg=True)
    t1 = start()
    wait_waiters(m, 'x', [t.pid])
    w = procs.agent()
    wfd = w.open(fpath(m, 'x'))
    wrid = w.flock_start(wfd, EX)
    wait_waiters(m, 'x', [t.pid, w.pid])
    t2 = start()
    wait_waiters(m, 'x', [t.pid, w.pid, t.pid])
    assert h.flock(fh, UN) == 0
    _granted(t, t1)
    _granted(t, t2)
    assert waiter_pids(m, 'x') == [w.pid]
    assert w.poll(wrid) is None
    assert holder_pids(m, 'x') == [t.pid]
    if kind == 'flock':
        assert t.flock(tfd, UN) == 0
    else:
        assert t.lockf(tfd, fcntl.LOCK_UN) == 0
    _granted(w, wrid)
    assert holder_pids(m, 'x') == [w.pid]


def test_an_open_file_of_another_host_with_the_same_number_is_not_ours(lockfs_factory, etcd1,
                                                                        prefix):
    """A grant is an open file of one mount: another host's daemon numbers
    its open files too, and the same number there is another file.  Two
    fresh daemons give their first open of .flock/NAME the same file
    handle; h2's must not take h1's grant for its own (a second holder),
    and h2's close must leave h1's lock alone."""
    mounts = [lockfs_factory(options=('backend=etcd', f'etcd={etcd1.endpoints}',
                                      f'prefix={prefix}', f'host=h{i}', 'ttl=4',
                                      'lock_delay=1')) for i in (1, 2)]
    fds = [os.open(fpath(m, 'same'), os.O_RDWR | os.O_CREAT) for m in mounts]
    try:
        fcntl.flock(fds[0], EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fds[1], EX | fcntl.LOCK_NB)
        os.close(fds.pop())
        o = read_owner(mounts[0].mnt, 'same')
        assert o['holder']['host'] == 'h1' and o['bound'] == 'fd', o
        assert not [l for l in log_for(mounts[0].dir, 'same') if l.event == 'lost']
    finally:
        for fd in fds:
            os.close(fd)
