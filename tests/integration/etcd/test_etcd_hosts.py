#!/usr/bin/python3
"""Issue 11, per-host rules across hosts, and the endpoint list.

Root on any host may `break` any host's lock (the `broken` line names the
breaking host and the key); the lock is then free on every host.  `-o
etcd=URL;URL` lists endpoints: a daemon whose first endpoint is dead starts
and serves through the next one.  Skipped, with the reason, only when the
etcd binaries are absent.

A daemon that detaches itself (no `-f`, as under fstab or `mount -t
fuse.lockfs`) is the same daemon as one in the foreground: its host key
names the process that serves (not the one that started it and returned),
its session is kept alive past `ttl`, and a start that fails says so in one
line.
"""

import base64
import errno
import http.server
import json
import os
import signal
import subprocess
import threading
import time
import uuid

import pytest

from etcd_fixtures import etcd1, free_ports  # noqa: F401
from etcd_mounts import start_refused
from lockfs_helpers import (LOCKFS_BIN, fusermount_u, log_for, mount_entry, read_owner,
                            wait_until)


TTL = 2


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


@pytest.fixture
def not_etcd():
    """The URL of an HTTP server that answers every call 404 "page not
    found", as an etcd member's peer port or any other web server would."""
    class NotEtcd(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = b'404 page not found\n'
            self.send_response(404)
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), NotEtcd)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{srv.server_address[1]}'
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def test_a_first_endpoint_that_is_not_etcd_is_skipped(lockfs_factory, etcd1, prefix, procs,
                                                      not_etcd):
    m = _mount(lockfs_factory, f'{not_etcd};{etcd1.endpoints}', prefix, 'h1')
    a = procs.agent()
    assert a.mkdir(m.path('x')) == 0
    assert read_owner(m.mnt, 'x')['holder']['pid'] == a.pid
    assert a.rmdir(m.path('x')) == 0


def test_an_endpoint_that_is_not_etcd_never_becomes_the_one_used(
        lockfs_factory, etcd1, prefix, procs, not_etcd):
    """etcd refuses once, the daemon tries the next endpoint, which answers
    but not as etcd does: it must move on from it, not stay there."""
    member = etcd1.members[0]
    m = lockfs_factory(options=('backend=etcd', f'etcd={etcd1.endpoints};{not_etcd}',
                                f'prefix={prefix}', 'host=h1', 'ttl=20', 'lock_delay=1'))
    a = procs.agent()
    assert a.mkdir(m.path('x')) == 0
    assert a.rmdir(m.path('x')) == 0
    member.stop()
    try:
        assert a.mkdir(m.path('y')) == errno.EIO
    finally:
        member.start()
    member.wait_healthy()
    # at most one more call goes to the wrong server, then etcd serves
    wait_until(lambda: a.mkdir(m.path('y')) == 0, timeout=15, interval=0.2,
               what='mkdir through etcd again')
    assert a.rmdir(m.path('y')) == 0


@pytest.fixture
def detached(etcd1, prefix, scratch_dir, tmp_path):
    """Start `lockfs -o backend=etcd,... M` without -f; yields (M, pid of
    the serving daemon); stops it by that pid."""
    mnt, backing = os.path.join(scratch_dir, 'm'), str(tmp_path / 'b')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    r = subprocess.run([LOCKFS_BIN, '-o', f'backend=etcd,etcd={etcd1.endpoints},'
                        f'prefix={prefix},host=h1,ttl={TTL},lock_delay=1,backing={backing}', mnt],
                       capture_output=True, text=True, timeout=15)
    assert r.returncode == 0, r
    with open(os.path.join(backing, '.lockfs')) as f:
        pid = int(f.read())
    try:
        yield mnt, pid
    finally:
        os.kill(pid, signal.SIGTERM)
        try:
            wait_until(lambda: not os.path.exists(f'/proc/{pid}'), 10,
                       what=f'daemon {pid} to exit on SIGTERM')
        finally:
            if os.path.exists(f'/proc/{pid}'):
                os.kill(pid, signal.SIGKILL)
            if mount_entry(mnt) is not None:
                fusermount_u(mnt)
        wait_until(lambda: mount_entry(mnt) is None, 5, what='the unmount')


def test_the_host_key_names_the_detached_daemon_and_a_second_one_is_refused(
        etcd1, prefix, detached, scratch_dir, tmp_path):
    mnt, pid = detached
    out = etcd1.etcdctl('get', f'{prefix}.hosts/h1', '-w', 'json').stdout
    [kv] = json.loads(out)['kvs']
    assert json.loads(base64.b64decode(kv['value']))['pid'] == pid

    mnt2, backing2 = os.path.join(scratch_dir, 'm2'), str(tmp_path / 'b2')
    os.mkdir(mnt2)
    os.mkdir(backing2, 0o700)
    rc, err = start_refused(['backend=etcd', f'etcd={etcd1.endpoints}', 'host=h1',
                             f'prefix={prefix}'], mnt2, backing2)
    assert rc != 0
    assert f'host h1 is in use by another lockfs daemon on {prefix} (pid {pid})' in err, err
    assert mount_entry(mnt) is not None


def test_a_detached_daemon_keeps_its_session_past_ttl(etcd1, detached, procs):
    mnt, pid = detached
    a = procs.agent()
    assert a.mkdir(os.path.join(mnt, 'x')) == 0
    lease = read_owner(mnt, 'x')['lease']
    # Time passing is the subject here: three lease lifetimes, during
    # which only the daemon's keepalives can keep the lease.
    time.sleep(3 * TTL)
    out = etcd1.etcdctl('lease', 'timetolive', lease, '-w', 'json').stdout
    assert json.loads(out)['ttl'] > 0, f'lease {lease} expired: {out}'
    assert read_owner(mnt, 'x')['session'] == 'live'
    assert a.rmdir(os.path.join(mnt, 'x')) == 0


def test_a_detached_start_with_no_endpoint_fails_in_one_line(scratch_dir, tmp_path):
    [port] = free_ports(1)
    mnt, backing = os.path.join(scratch_dir, 'm'), str(tmp_path / 'b')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    url = f'http://127.0.0.1:{port}'
    r = subprocess.run([LOCKFS_BIN, '-o', f'backend=etcd,etcd={url},host=h1,backing={backing}',
                        mnt], capture_output=True, text=True, timeout=15)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f'no etcd endpoint answers ({url})' in lines[0], r.stderr
    assert mount_entry(mnt) is None
