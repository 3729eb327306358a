#!/usr/bin/python3
"""Issue 11: `lockctl status` names each holder's HOST ("-" for a foreign
holder).  On dir (one host, always runs), and on etcd with two daemons
(skipped, with the reason, when the etcd binaries are absent)."""

import os
import socket
import subprocess
import uuid

from etcd_fixtures import etcd1  # noqa: F401
from lockfs_helpers import wait_until
from test_lockctl import _require_lockctl, lc, table  # noqa: F401

HOST = 5  # the column's index in a row


def test_status_host_is_this_hosts_name_on_dir(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('mine')) == 0
    os.mkdir(mnt.lockdir('seed'))  # the seed's own protocol: a foreign lock
    r = lc(mnt, 'status')
    assert r.returncode == 0, r.stderr
    header, rows = table(r.stdout)
    assert header[HOST] == 'HOST'
    by_name = {row[0]: row for row in rows}
    assert by_name['mine'][HOST] == socket.gethostname()
    assert by_name['seed'][HOST] == '-'


def test_status_host_names_the_other_hosts_holder_on_etcd(lockfs_factory, etcd1, procs, tmp_path):
    prefix = f'/t-{uuid.uuid4().hex[:8]}/'
    opts = ('backend=etcd', f'etcd={etcd1.endpoints}', f'prefix={prefix}')
    h1 = lockfs_factory(options=opts + ('host=h1',))
    h2 = lockfs_factory(options=opts + ('host=h2',))
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(h1.path('one')) == 0
    assert b.mkdir(h2.path('two')) == 0
    held, gate = tmp_path / 'held', tmp_path / 'gate'
    script = tmp_path / 'hold.sh'
    script.write_text(f'#!/bin/sh\ntouch {held}\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n')
    script.chmod(0o755)
    ctl = procs.popen(etcd1.etcdctl_args() + ['lock', f'{prefix}ext', str(script)],
                      env=dict(os.environ, ETCDCTL_API='3'),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: held.exists(), timeout=10, what='etcdctl lock held')
        wait_until(lambda: {'one', 'two', 'ext'} <= set(os.listdir(h2.mnt)), what='h2 lists all')
        r = lc(h2, 'status')
        assert r.returncode == 0, r.stderr
        by_name = {row[0]: row for row in table(r.stdout)[1]}
        assert by_name['one'][HOST] == 'h1'
        assert by_name['two'][HOST] == 'h2'
        assert by_name['ext'][HOST] == '-'
    finally:
        gate.touch()
        ctl.wait(timeout=10)
