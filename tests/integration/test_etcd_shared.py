#!/usr/bin/python3
"""Issue 11, fences are etcd revisions: a shared lock on the etcd backend.

A process that joins a held shared lock (`flock(fd, LOCK_SH)` on
`M/.flock/NAME`) is one more grant: its fence is the revision of the write
that added it, shown in `owner` and in the record that `etcdctl get` reads.
etcd issues that revision only in the write itself, so the daemon writes the
record once more with it.  Skipped, with the reason, only when the etcd
binaries are absent.
"""

import base64
import fcntl
import json
import uuid

from etcd_fixtures import etcd1  # noqa: F401
from flock_helpers import fpath
from lockfs_helpers import log_for, read_owner

SH = fcntl.LOCK_SH


def _stored_records(cluster, prefix, name):
    out = cluster.etcdctl('get', '--prefix', f'{prefix}{name}/', '-w', 'json').stdout
    return [json.loads(base64.b64decode(kv['value']))
            for kv in json.loads(out).get('kvs', []) if kv.get('value')]


def test_a_joining_share_gets_its_own_fence_in_owner_and_in_the_store(
        lockfs_factory, etcd1, procs):
    prefix = f'/t-{uuid.uuid4().hex[:8]}/'
    m = lockfs_factory(options=('backend=etcd', f'etcd={etcd1.endpoints}',
                                f'prefix={prefix}', 'host=h1', 'ttl=4', 'lock_delay=1'))
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
