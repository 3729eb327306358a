#!/usr/bin/python3
"""Issue 11, per-host rules across hosts, and the endpoint list.

Root on any host may `break` any host's lock (the `broken` line names the
breaking host and the key); the lock is then free on every host.  `-o
etcd=URL;URL` lists endpoints: a daemon whose first endpoint is dead starts
and serves through the next one.  Skipped, with the reason, only when the
etcd binaries are absent.
"""

import errno
import os
import uuid

import pytest

from etcd_fixtures import etcd1, free_ports  # noqa: F401
from lockfs_helpers import log_for, read_owner, wait_until


@pytest.fixture
def prefix():
    return f'/t-{uuid.uuid4().hex[:8]}/'


def _mount(lockfs_factory, endpoints, prefix, host):
    return lockfs_factory(options=('backend=etcd', f'etcd={endpoints}', f'prefix={prefix}',
                                   f'host={host}', 'ttl=4', 'lock_delay=1'))


def test_root_on_another_host_breaks_the_lock_and_the_line_names_that_host(
        lockfs_factory, etcd1, prefix, procs):
    h1 = _mount(lockfs_factory, etcd1.endpoints, prefix, 'h1')
    h2 = _mount(lockfs_factory, etcd1.endpoints, prefix, 'h2')
    holder, other = procs.agent(), procs.agent()
    assert holder.mkdir(h1.path('x')) == 0
    key = read_owner(h1.mnt, 'x')['key']
    wait_until(lambda: 'x' in os.listdir(h2.mnt), what="h2 lists h1's lock")

    with open(h2.path('x', 'break'), 'w') as f:
        f.write('stuck on h1\n')

    [line] = [ln for ln in log_for(h2.dir, 'x') if ln.event == 'broken']
    assert line.details.get('host') == 'h2', line
    assert line.details.get('key') == key, line
    wait_until(lambda: 'x' not in os.listdir(h2.mnt), what='x free on h2')
    wait_until(lambda: 'x' not in os.listdir(h1.mnt), what='x free on h1')
    assert other.mkdir(h2.path('x')) == 0
    wait_until(lambda: 'x' in os.listdir(h1.mnt), what="h1 lists h2's new lock")
    assert read_owner(h1.mnt, 'x')['holder']['host'] == 'h2'


def test_a_dead_first_endpoint_is_skipped(lockfs_factory, etcd1, prefix, procs):
    [dead] = free_ports(1)
    m = _mount(lockfs_factory, f'http://127.0.0.1:{dead};{etcd1.endpoints}', prefix, 'h1')
    a = procs.agent()
    assert a.mkdir(m.path('x')) == 0
    assert read_owner(m.mnt, 'x')['holder']['pid'] == a.pid
    assert a.mkdir(m.path('x')) == errno.EEXIST
    assert a.rmdir(m.path('x')) == 0
