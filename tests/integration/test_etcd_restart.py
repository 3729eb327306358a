"""Issue 11, daemon restarts and start-up: a restarted daemon re-adopts its
live holders' keys without a moment in which the lock is free and releases
its dead holders'; a second daemon with a used host name is refused; a
daemon that cannot reach etcd fails at once."""

import os

import pytest

from etcd_fixtures import etcd1, free_ports  # noqa: F401
from etcd_mounts import (HOLD, etcd_mounts, etcd_options, etcdctl_lock,  # noqa: F401
                         line_within, start_refused)
from lockfs_helpers import wait_until


def one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, f'want one line on stderr, got: {err!r}'
    return lines[0]


@pytest.mark.slow
def test_restarted_daemon_readopts_live_holders_and_releases_dead_ones(
        etcd1, etcd_mounts, procs, tmp_path):
    # ttl 10: the restart must come before the old lease expires
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=10)
    h1 = hosts[0]
    live, dead = procs.agent(), procs.agent()
    assert live.mkdir(h1.path('x')) == 0
    assert dead.mkdir(h1.path('y')) == 0
    [(key, _, rev, lease)] = hosts.lock_keys('x')
    assert len(hosts.lock_keys('y')) == 1

    h1.kill9()
    dead.kill()
    # etcdctl lock queues behind x; it must never get x in between
    go = tmp_path / 'go'
    go.touch()
    p = etcdctl_lock(procs, etcd1, hosts.prefix + 'x', HOLD, go)
    wait_until(lambda: len(hosts.lock_keys('x')) == 2, timeout=10, what="etcdctl's key")

    n = hosts.restart(h1)
    # the dead holder's lock is released, the live one's key moved to the
    # new lease with its create_revision kept
    wait_until(lambda: hosts.lock_keys('y') == [], timeout=10, what='y released')
    wait_until(lambda: hosts.lock_keys('x')[0][3] != lease, timeout=10, what='x adopted')
    k = hosts.lock_keys('x')[0]
    assert (k[0].rsplit('/', 1)[0], k[2]) == (key.rsplit('/', 1)[0], rev), k
    assert line_within(p, 0.5) is None and p.poll() is None, 'etcdctl got x during the restart'
    assert procs.agent().owner(n.mnt, 'x')['holder']['pid'] == live.pid
    [ad] = hosts.wait_log(n, 'x', 'adopted')
    assert (ad.details['key'], ad.details['fence'], ad.details['pid']) == \
        (key, str(rev), str(live.pid)), ad.raw
    assert (int(ad.details['from'], 16), int(ad.details['session'], 16)) == (lease, k[3]), ad.raw
    [rec] = hosts.wait_log(n, 'y', 'recovered')
    assert rec.details['evidence'] == 'exited-while-down', rec.raw
    assert hosts.log_lines(n, 'y', 'adopted') == []

    # the holder releases through the new daemon; etcdctl gets x after it
    assert live.rmdir(n.path('x')) == 0
    line = line_within(p, 10)
    assert line and int(line.split()[1]) > rev, line
    assert p.wait(15) == 0


@pytest.mark.slow
def test_second_daemon_with_the_same_host_and_prefix_is_refused(
        etcd1, etcd_mounts, scratch_dir, tmp_path):
    hosts = etcd_mounts(etcd1, hosts=('h1',))
    mnt, backing = os.path.join(scratch_dir, 'm'), str(tmp_path / 'other')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    rc, err = start_refused(etcd_options(etcd1, 'h1', hosts.prefix, 2, 1), mnt, backing)
    assert rc != 0
    line = one_line(err)
    assert f'host h1 is in use by another lockfs daemon on {hosts.prefix}' in line, line
    hosts[0].assert_alive()


def test_start_fails_fast_when_no_endpoint_answers(scratch_dir, tmp_path):
    [port] = free_ports(1)
    mnt, backing = os.path.join(scratch_dir, 'm'), str(tmp_path / 'b')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    url = f'http://127.0.0.1:{port}'
    rc, err = start_refused(['backend=etcd', f'etcd={url}', 'host=h1', 'prefix=/t/'],
                            mnt, backing, timeout=10)
    assert rc != 0
    line = one_line(err)
    assert f'no etcd endpoint answers ({url})' in line, line


def test_start_fails_fast_on_an_unreadable_certificate(scratch_dir, tmp_path):
    [port] = free_ports(1)
    mnt, backing = os.path.join(scratch_dir, 'm'), str(tmp_path / 'b')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    missing = str(tmp_path / 'no-such-ca.pem')
    rc, err = start_refused(['backend=etcd', f'etcd=https://127.0.0.1:{port}', 'host=h1',
                             f'etcd_cacert={missing}'], mnt, backing, timeout=10)
    assert rc != 0
    line = one_line(err)
    assert f'cannot read TLS file {missing}' in line, line
