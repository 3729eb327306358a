"""The etcd test fixtures themselves (etcd_fixtures.py, tcp_proxy.py), checked
with etcdctl and raw sockets before later tests rely on them."""

import os
import select
import socket
import subprocess
import time

import pytest

from etcd_fixtures import (Cluster, etcd1, etcd3, etcd_tls, missing,  # noqa: F401
                           tcp_proxy)

FAIL_FAST = ('--dial-timeout=1s', '--command-timeout=1s')


def alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(') ')[-1][0] != 'Z'
    except FileNotFoundError:
        return False


def wait_until(cond, timeout=5.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def health_request(sock):
    sock.sendall(b'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n')


def readable(sock, timeout):
    return bool(select.select([sock], [], [], timeout)[0])


def test_one_member_serves_etcdctl_on_private_ports(etcd1):
    m = etcd1.members[0]
    assert {m.client_port, m.peer_port}.isdisjoint({2379, 2380})
    assert etcd1.endpoints == f'http://127.0.0.1:{m.client_port}'
    etcd1.etcdctl('put', '/fixture/k', 'v')
    assert etcd1.etcdctl('get', '--print-value-only', '/fixture/k').stdout == 'v\n'


def test_three_members_agree_on_one_leader(etcd3):
    assert len(etcd3.endpoints.split(';')) == 3
    leader = etcd3.wait_leader()
    ids = {m.member_id() for m in etcd3.members}
    assert len(ids) == 3
    assert {m.status()['leader'] for m in etcd3.members} == {leader.member_id()}
    assert len(etcd3.etcdctl('member', 'list').stdout.splitlines()) == 3


def test_kill9_of_the_leader_elects_another_and_the_restarted_member_catches_up(etcd3):
    old = etcd3.wait_leader()
    pid = old.pid
    old.kill9()
    assert not alive(pid)
    new = etcd3.wait_leader(exclude=old)
    assert new is not old and new.alive
    survivors = ','.join(m.url for m in etcd3.members if m is not old)
    etcd3.etcdctl('put', '/fixture/while-down', 'written', endpoints=survivors)

    old.start()
    old.wait_healthy()
    # A serializable read answers from the member's own copy.
    assert wait_until(lambda: etcd3.etcdctl(
        'get', '--consistency=s', '--print-value-only', '/fixture/while-down',
        endpoints=old.url).stdout == 'written\n')


def test_stop_leaves_no_member_running(tmp_path):
    why = missing()
    if why:
        pytest.skip(why)
    cluster = Cluster(str(tmp_path / 'c'), 3).start()
    pids = [m.pid for m in cluster.members]
    assert all(alive(p) for p in pids)
    cluster.stop()
    assert not any(alive(p) for p in pids)
    for m in cluster.members:
        s = socket.socket()
        assert s.connect_ex(('127.0.0.1', m.client_port)) != 0   # nobody listens any more
        s.close()


def test_paused_proxy_freezes_a_connection_and_resume_lets_it_through(etcd1, tcp_proxy):
    proxy = tcp_proxy(etcd1.members[0].client_port)
    etcd1.etcdctl('put', '/fixture/p', 'through', endpoints=proxy.url)
    with socket.create_connection(('127.0.0.1', proxy.port), timeout=2) as s:
        health_request(s)
        assert readable(s, 2)
        assert b'"health":"true"' in s.recv(4096)
        assert proxy.connections() == 1

        proxy.pause()
        health_request(s)
        assert not readable(s, 0.5)          # frozen: no answer, no reset
        r = etcd1.etcdctl(*FAIL_FAST, 'get', '/fixture/p', endpoints=proxy.url, check=False)
        assert r.returncode != 0             # a new connection hears nothing either

        proxy.resume()
        assert readable(s, 2)                # what was held back arrives
        assert b'"health":"true"' in s.recv(4096)
    assert etcd1.etcdctl('get', '--print-value-only', '/fixture/p',
                         endpoints=proxy.url).stdout == 'through\n'


def test_holding_proxy_lets_a_write_through_and_holds_its_answer(etcd1, tcp_proxy):
    proxy = tcp_proxy(etcd1.members[0].client_port)
    body = (b'{"key":"L2ZpeHR1cmUvaA==","value":"aGVsZA=="}')   # /fixture/h = held
    with socket.create_connection(('127.0.0.1', proxy.port), timeout=2) as s:
        proxy.hold()
        s.sendall(b'POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s'
                  % (len(body), body))
        # etcd applied it (read past the proxy) while the caller hears nothing
        assert wait_until(lambda: etcd1.etcdctl('get', '--print-value-only',
                                                '/fixture/h').stdout == 'held\n')
        assert not readable(s, 0.5)
        proxy.resume()
        assert readable(s, 2)
        assert b'"revision"' in s.recv(4096)


def test_holding_proxy_counts_the_transactions_it_passed_on(etcd1, tcp_proxy):
    # txns(): a transaction whose answer is held is known to have reached etcd
    proxy = tcp_proxy(etcd1.members[0].client_port)
    body = b'{"success":[{"requestPut":{"key":"L2ZpeHR1cmUvdA==","value":"dA=="}}]}'
    assert proxy.txns() == 0
    with socket.create_connection(('127.0.0.1', proxy.port), timeout=2) as s:
        proxy.hold()
        s.sendall(b'POST /v3/kv/txn HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s'
                  % (len(body), body))
        assert wait_until(lambda: proxy.txns() == 1)
        assert not readable(s, 0.3)          # its answer is still held
        proxy.resume()
        assert readable(s, 2)
        assert b'"succeeded":true' in s.recv(4096)
    assert etcd1.etcdctl('get', '--print-value-only', '/fixture/t').stdout == 't\n'


def test_proxy_drop_resets_every_connection(etcd1, tcp_proxy):
    proxy = tcp_proxy(etcd1.members[0].client_port)
    with socket.create_connection(('127.0.0.1', proxy.port), timeout=2) as s:
        health_request(s)
        assert readable(s, 2)
        s.recv(4096)
        proxy.drop()
        assert readable(s, 2)
        with pytest.raises(ConnectionResetError):
            s.recv(4096)
    assert wait_until(lambda: proxy.connections() == 0)


def test_tls_cluster_requires_a_trusted_client_certificate(etcd_tls):
    tls = etcd_tls.tls
    assert etcd_tls.url.startswith('https://')
    etcd_tls.etcdctl('put', '/fixture/tls', 'ok')
    assert etcd_tls.etcdctl('get', '--print-value-only', '/fixture/tls').stdout == 'ok\n'
    env = dict(os.environ, ETCDCTL_API='3')
    base = [etcd_tls.etcdctl_args()[0], '--endpoints', etcd_tls.url, '--cacert', tls.ca, *FAIL_FAST]
    no_cert = subprocess.run(base + ['get', '/fixture/tls'], env=env, capture_output=True,
                             timeout=10)
    assert no_cert.returncode != 0
    other_ca = subprocess.run(base + ['--cert', tls.bad_client, '--key', tls.bad_client_key,
                                      'get', '/fixture/tls'],
                              env=env, capture_output=True, timeout=10)
    assert other_ca.returncode != 0
