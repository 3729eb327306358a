"""Issue 11: lockfs hosts on an etcd that speaks only TLS and demands client
certificates (a CA, server and client certificates made with openssl by
the fixture): the mount works; a wrong CA or a refused client certificate
fails at start, in one line."""

import errno
import os

import pytest

from etcd_fixtures import etcd_tls  # noqa: F401
from etcd_mounts import etcd_mounts, start_refused  # noqa: F401
from lockfs_helpers import wait_until


def one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, f'want one line on stderr, got: {err!r}'
    return lines[0]


@pytest.mark.slow
def test_two_hosts_share_a_lock_over_tls(etcd_tls, etcd_mounts, procs):
    hosts = etcd_mounts(etcd_tls, hosts=('h1', 'h2'), ttl=10)
    h1, h2 = hosts
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(h1.path('x')) == 0
    assert b.mkdir(h2.path('x')) == errno.EEXIST
    assert len(hosts.lock_keys('x')) == 1
    assert a.rmdir(h1.path('x')) == 0
    # h2 follows h1's release at its watch's next event
    wait_until(lambda: b.mkdir(h2.path('x')) == 0, timeout=5, what='h2 gets x')
    assert b.rmdir(h2.path('x')) == 0
    assert hosts.check_history(held=set()) == []


def refused(cluster, tmp_path, scratch_dir, cacert, cert, key):
    mnt, backing = os.path.join(scratch_dir, 'm'), str(tmp_path / 'b')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    rc, err = start_refused(['backend=etcd', f'etcd={cluster.url}', 'host=h1', 'prefix=/t/',
                             f'etcd_cacert={cacert}', f'etcd_cert={cert}', f'etcd_key={key}'],
                            mnt, backing, timeout=10)
    assert rc != 0
    return one_line(err)


def test_a_wrong_ca_fails_at_start(etcd_tls, tmp_path, scratch_dir):
    tls = etcd_tls.tls
    line = refused(etcd_tls, tmp_path, scratch_dir, os.path.join(tls.dir, 'other-ca.pem'),
                   tls.client, tls.client_key)
    assert 'etcd refused our credentials' in line, line


def test_a_refused_client_certificate_fails_at_start(etcd_tls, tmp_path, scratch_dir):
    tls = etcd_tls.tls
    line = refused(etcd_tls, tmp_path, scratch_dir, tls.ca, tls.bad_client, tls.bad_client_key)
    assert 'etcd refused our credentials' in line, line
