#!/usr/bin/python3
"""Issue 11: the etcd backend through the mount, one and two daemons.

`lockfs -o backend=etcd,etcd=URL,prefix=/t/,host=hN` on a 1-member cluster
(etcd_fixtures.py): mkdir/owner/rmdir, EEXIST, ls, fences are revisions,
flock waiters take places in the store's line (behind an `etcdctl lock`
holder and another host's waiters, in create_revision order), and two
daemons with one prefix see each other's locks.  Skipped, with the reason,
only when the etcd binaries are absent.
"""

import base64
import datetime
import errno
import fcntl
import json
import os
import subprocess
import uuid

import pytest

from etcd_fixtures import etcd1, tcp_proxy  # noqa: F401
from flock_helpers import fpath, read_waiters, wait_waiters
from history import parse_rfc3339_ms
from lockfs_helpers import log_for, read_owner, wait_until

EX = fcntl.LOCK_EX


def _etcd_mount(lockfs_factory, cluster, prefix, host):
    return lockfs_factory(options=('backend=etcd', f'etcd={cluster.endpoints}',
                                   f'prefix={prefix}', f'host={host}', 'ttl=4',
                                   'lock_delay=1'))


@pytest.fixture
def prefix():
    return f'/t-{uuid.uuid4().hex[:8]}/'


@pytest.fixture
def h1(lockfs_factory, etcd1, prefix):
    return _etcd_mount(lockfs_factory, etcd1, prefix, 'h1')


@pytest.fixture
def h2(lockfs_factory, etcd1, prefix, h1):
    return _etcd_mount(lockfs_factory, etcd1, prefix, 'h2')


def _keys(cluster, prefix, name):
    out = cluster.etcdctl('get', '--prefix', f'{prefix}{name}/', '-w', 'json').stdout
    kvs = json.loads(out).get('kvs', [])
    return sorted(kvs, key=lambda kv: int(kv['create_revision']))


def test_mkdir_owner_rmdir_on_etcd(h1, procs):
    a = procs.agent()
    assert a.mkdir(h1.path('x')) == 0
    o = read_owner(h1.mnt, 'x')
    assert o['holder']['pid'] == a.pid and o['holder']['host'] == 'h1'
    assert a.mkdir(h1.path('x')) == errno.EEXIST
    assert 'x' in os.listdir(h1.mnt)
    assert a.rmdir(h1.path('x')) == 0
    assert 'x' not in os.listdir(h1.mnt)
    ev = [l.event for l in log_for(h1.dir, 'x')]
    assert ev == ['acquired', 'released']


def test_fence_is_the_holders_create_revision(h1, etcd1, prefix, procs):
    a = procs.agent()
    fences = []
    for _ in range(3):
        assert a.mkdir(h1.path('f')) == 0
        kvs = _keys(etcd1, prefix, 'f')
        assert len(kvs) == 1
        o = read_owner(h1.mnt, 'f')
        assert o['fence'] == int(kvs[0]['create_revision'])
        acq = [l for l in log_for(h1.dir, 'f') if l.event == 'acquired'][-1]
        assert int(acq.details['fence']) == o['fence']
        fences.append(o['fence'])
        assert a.rmdir(h1.path('f')) == 0
    assert fences == sorted(set(fences))


def test_a_lock_taken_again_writes_the_same_etcd_key(h1, etcd1, prefix, procs):
    # etcd keeps every key ever made under a name in its index until a
    # compaction; a fresh key per acquire would make the try-lock walk
    # them all.  Each life of the key is new all the same: a new
    # create_revision, so a new fence.
    a = procs.agent()
    keys, fences = [], []
    for _ in range(3):
        assert a.mkdir(h1.path('again')) == 0
        o = read_owner(h1.mnt, 'again')
        kvs = _keys(etcd1, prefix, 'again')
        assert [base64.b64decode(kv['key']).decode() for kv in kvs] == [o['key']]
        keys.append(o['key'])
        fences.append(o['fence'])
        assert a.rmdir(h1.path('again')) == 0
    assert len(set(keys)) == 1
    assert fences == sorted(set(fences))


def test_a_refused_try_lock_leaves_its_key_to_the_next_acquire(h1, h2, etcd1, prefix, procs):
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(h1.path('busy')) == 0
    first = read_owner(h1.mnt, 'busy')['key']
    assert a.rmdir(h1.path('busy')) == 0
    wait_until(lambda: 'busy' not in os.listdir(h2.mnt), what='h2 sees the release')
    assert b.mkdir(h2.path('busy')) == 0
    wait_until(lambda: 'busy' in os.listdir(h1.mnt), what='h1 sees h2 hold it')
    for _ in range(3):
        assert a.mkdir(h1.path('busy')) == errno.EEXIST
    assert len(_keys(etcd1, prefix, 'busy')) == 1
    assert b.rmdir(h2.path('busy')) == 0
    wait_until(lambda: 'busy' not in os.listdir(h1.mnt), what='h1 sees the release')
    assert a.mkdir(h1.path('busy')) == 0
    assert read_owner(h1.mnt, 'busy')['key'] == first
    assert a.rmdir(h1.path('busy')) == 0


def test_a_waiter_and_the_holder_on_one_host_have_keys_of_their_own(h1, etcd1, prefix, procs):
    holder, w, late = procs.agent(), procs.agent(), procs.agent()
    assert holder.mkdir(h1.path('two')) == 0
    held = read_owner(h1.mnt, 'two')['key']
    assert holder.rmdir(h1.path('two')) == 0
    assert holder.mkdir(h1.path('two')) == 0       # the same key again
    assert read_owner(h1.mnt, 'two')['key'] == held
    fd = w.open(fpath(h1, 'two'))
    rid = w.flock_start(fd, EX)
    wait_waiters(h1, 'two', [w.pid])
    assert len({base64.b64decode(kv['key']) for kv in _keys(etcd1, prefix, 'two')}) == 2
    assert holder.rmdir(h1.path('two')) == 0
    assert 'errno' not in w.wait(rid, 5)
    # The holder's key is free again, the granted waiter's is not: a
    # newcomer behind the waiter queues on the freed one, behind it.
    fd2 = late.open(fpath(h1, 'two'))
    rid2 = late.flock_start(fd2, EX)
    wait_waiters(h1, 'two', [late.pid])
    kvs = _keys(etcd1, prefix, 'two')
    assert len(kvs) == 2 and base64.b64decode(kvs[1]['key']).decode() == held
    assert read_owner(h1.mnt, 'two')['holder']['pid'] == w.pid
    w.close(fd)
    assert 'errno' not in late.wait(rid2, 5)
    assert read_owner(h1.mnt, 'two')['holder']['pid'] == late.pid
    late.close(fd2)


def test_flock_waiter_is_granted_on_release(h1, procs):
    holder, w = procs.agent(), procs.agent()
    assert holder.mkdir(h1.path('q')) == 0
    fd = w.open(fpath(h1, 'q'))
    rid = w.flock_start(fd, EX)
    wait_waiters(h1, 'q', [w.pid])
    assert w.poll(rid) is None
    assert holder.rmdir(h1.path('q')) == 0
    assert 'errno' not in w.wait(rid, 5)
    assert read_owner(h1.mnt, 'q')['holder']['pid'] == w.pid


def test_flock_waiter_takes_a_place_in_the_store_line(h1, etcd1, prefix, procs):
    holder, w = procs.agent(), procs.agent()
    assert holder.mkdir(h1.path('p')) == 0
    fd = w.open(fpath(h1, 'p'))
    rid = w.flock_start(fd, EX)
    wait_waiters(h1, 'p', [w.pid])
    wait_until(lambda: len(_keys(etcd1, prefix, 'p')) == 2, what='a place key for the waiter')
    assert holder.rmdir(h1.path('p')) == 0
    assert 'errno' not in w.wait(rid, 5)
    assert w.flock(fd, fcntl.LOCK_UN) == 0
    wait_until(lambda: _keys(etcd1, prefix, 'p') == [], what='no key left')


def test_flock_waiter_queues_behind_an_etcdctl_lock_holder(h1, etcd1, prefix, procs, tmp_path):
    gate = tmp_path / 'gate'
    held = tmp_path / 'held'
    script = tmp_path / 'hold.sh'
    script.write_text(f'#!/bin/sh\ntouch {held}\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n')
    script.chmod(0o755)
    # A script, not `sh -c`: etcdctl would take -c as its own flag.
    cmd = etcd1.etcdctl_args() + ['lock', f'{prefix}e', str(script)]
    ctl = procs.popen(cmd, env=dict(os.environ, ETCDCTL_API='3'),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: held.exists(), timeout=10, what='etcdctl lock held')
    a = procs.agent()
    assert a.mkdir(h1.path('e')) == errno.EEXIST
    o = read_owner(h1.mnt, 'e')
    assert o['foreign'] is True
    fd = a.open(fpath(h1, 'e'))
    rid = a.flock_start(fd, EX)
    wait_waiters(h1, 'e', [a.pid])
    assert a.poll(rid) is None
    gate.touch()
    ctl.wait(timeout=10)
    assert 'errno' not in a.wait(rid, 5)
    assert read_owner(h1.mnt, 'e')['holder']['pid'] == a.pid


def test_two_hosts_see_each_others_locks(h1, h2, procs):
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(h1.path('s')) == 0
    wait_until(lambda: 's' in os.listdir(h2.mnt), what='h2 lists h1 lock')
    assert b.mkdir(h2.path('s')) == errno.EEXIST
    o = read_owner(h2.mnt, 's')
    assert o['holder']['host'] == 'h1'
    assert b.rmdir(h2.path('s')) == errno.EPERM
    assert any(l.event == 'denied' and l.details.get('reason') == 'other-host'
               for l in log_for(h2.dir, 's'))
    assert a.rmdir(h1.path('s')) == 0
    wait_until(lambda: 's' not in os.listdir(h2.mnt), what='h2 sees the release')
    assert b.mkdir(h2.path('s')) == 0
    assert b.rmdir(h2.path('s')) == 0


def test_waiters_on_two_hosts_are_granted_in_store_order(h1, h2, procs):
    holder = procs.agent()
    assert holder.mkdir(h1.path('o')) == 0
    wait_until(lambda: 'o' in os.listdir(h2.mnt), what='h2 lists it')
    ws = []
    for m in (h2, h1, h2):
        w = procs.agent()
        fd = w.open(fpath(m, 'o'))
        rid = w.flock_start(fd, EX)
        # every host lists the one line, in the store's order (issue 23)
        wait_waiters(m, 'o', [x.pid for x, _, _, _ in ws] + [w.pid])
        ws.append((w, fd, rid, m))
    wait_waiters(h1, 'o', [x.pid for x, _, _, _ in ws])
    assert holder.rmdir(h1.path('o')) == 0
    for k, (w, fd, rid, m) in enumerate(ws):
        assert 'errno' not in w.wait(rid, 5), f'waiter {k}'
        assert all(x.poll(r) is None for x, _, r, _ in ws[k + 1:]), f'out of turn after {k}'
        assert read_owner(m.mnt, 'o')['holder']['pid'] == w.pid
        assert w.flock(fd, fcntl.LOCK_UN) == 0


# ---- a lost session (issue 11, liveness 3) ----

@pytest.fixture
def cut_h1(lockfs_factory, etcd1, prefix, tcp_proxy):
    """h1 reaches etcd only through a proxy the test can pause (ttl=2)."""
    proxy = tcp_proxy(etcd1.members[0].client_port)
    m = lockfs_factory(options=('backend=etcd', f'etcd={proxy.url}', f'prefix={prefix}',
                                'host=h1', 'ttl=2', 'lock_delay=0', 'break_signal=USR1'))
    return m, proxy


def test_lost_session_logs_lost_and_the_holders_rmdir_is_estale(cut_h1, procs, tmp_path):
    m, proxy = cut_h1
    marker = tmp_path / 'usr1'
    # The holder notes SIGUSR1 (-o break_signal) and lives on to rmdir.
    a = procs.agent(setup=('import os, signal\n'
                           f'_m = os.open({str(marker)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n'
                           "signal.signal(signal.SIGUSR1, lambda s, f: os.write(_m, b'USR1'))\n"))
    other = procs.agent()
    assert a.mkdir(m.path('l')) == 0
    fence = read_owner(m.mnt, 'l')['fence']
    proxy.pause()
    wait_until(lambda: any(l.event == 'lost' for l in log_for(m.dir, 'l')), timeout=10,
               what='`lost` logged')
    proxy.resume()
    lost = [l for l in log_for(m.dir, 'l') if l.event == 'lost'][0]
    assert lost.details['evidence'] == 'session-expired'
    assert int(lost.details['fence']) == fence
    assert int(lost.details['pid']) == a.pid
    assert len(lost.details['session']) == 16
    wait_until(lambda: marker.read_bytes() == b'USR1', timeout=2, what='the holder signalled')
    assert other.rmdir(m.path('l')) == errno.ENOENT
    assert a.rmdir(m.path('l')) == errno.ESTALE
    # Told once (the kernel's immediate re-lookup hears it too), then free.
    wait_until(lambda: a.rmdir(m.path('l')) == errno.ENOENT, timeout=2, what='told once')
    # Nothing is silently re-held: the name is free once etcd answers.
    wait_until(lambda: a.mkdir(m.path('l')) == 0, timeout=10, what='mkdir after the new session')
    assert a.rmdir(m.path('l')) == 0


# ---- owner on etcd (issue 11: records, interop, liveness 3 and 5) ----

def test_owner_of_this_hosts_lock_shows_session_key_lease_and_revision(h1, etcd1, prefix, procs):
    a = procs.agent()
    assert a.mkdir(h1.path('w')) == 0
    o = read_owner(h1.mnt, 'w')
    kv = _keys(etcd1, prefix, 'w')[0]
    assert o['session'] == 'live'
    assert 'state' not in o
    assert o['key'] == base64.b64decode(kv['key']).decode()
    assert o['lease'] == format(int(kv['lease']), '016x')
    assert o['create_revision'] == int(kv['create_revision']) == o['fence']
    assert a.rmdir(h1.path('w')) == 0


def test_owner_of_an_etcdctl_holder_is_foreign_with_its_key(h1, etcd1, prefix, procs, tmp_path):
    gate, held = tmp_path / 'gate', tmp_path / 'held'
    script = tmp_path / 'hold.sh'
    script.write_text(f'#!/bin/sh\ntouch {held}\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n')
    script.chmod(0o755)
    ctl = procs.popen(etcd1.etcdctl_args() + ['lock', f'{prefix}g', str(script)],
                      env=dict(os.environ, ETCDCTL_API='3'),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: held.exists(), timeout=10, what='etcdctl lock held')
    kv = _keys(etcd1, prefix, 'g')[0]
    o = read_owner(h1.mnt, 'g')
    gate.touch()
    ctl.wait(timeout=10)
    assert o['foreign'] is True and o['holder'] is None
    assert o['key'] == base64.b64decode(kv['key']).decode()
    assert o['lease'] == format(int(kv['lease']), '016x')
    assert o['create_revision'] == int(kv['create_revision'])
    assert 'session' not in o


def test_uncertain_session_owner_says_so_and_mkdir_is_eio(cut_h1, procs):
    m, proxy = cut_h1
    a = procs.agent()
    assert a.mkdir(m.path('u')) == 0
    proxy.pause()
    try:
        wait_until(lambda: read_owner(m.mnt, 'u').get('session') == 'uncertain', timeout=5,
                   what='owner says uncertain')
        o = read_owner(m.mnt, 'u')
        assert o['state'] == 'unconfirmed'
        assert o['holder']['pid'] == a.pid
        assert 'u' in os.listdir(m.mnt)            # ls answers from the last state
        assert a.mkdir(m.path('v')) == errno.EIO   # no grant while uncertain
    finally:
        proxy.resume()


def _now_rfc3339():
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime('%Y-%m-%dT%H:%M:%S.') + f'{now.microsecond // 1000:03d}Z'


def test_refused_release_answers_eio_and_is_completed_once_etcd_answers(
        lockfs_factory, etcd1, prefix, tcp_proxy, procs):
    proxy = tcp_proxy(etcd1.members[0].client_port)
    m = lockfs_factory(options=('backend=etcd', f'etcd={proxy.url}', f'prefix={prefix}',
                                'host=h1', 'ttl=8', 'lock_delay=0'))
    a = procs.agent()
    assert a.mkdir(m.path('r')) == 0
    proxy.pause()
    try:
        asked = parse_rfc3339_ms(_now_rfc3339())
        assert a.rmdir(m.path('r')) == errno.EIO
        refused = parse_rfc3339_ms(_now_rfc3339())
        assert not [l for l in log_for(m.dir, 'r') if l.event == 'released']
    finally:
        proxy.resume()
    wait_until(lambda: [l for l in log_for(m.dir, 'r') if l.event == 'released'], timeout=10,
               what='the release completed')
    rel = [l for l in log_for(m.dir, 'r') if l.event == 'released']
    assert len(rel) == 1 and rel[0].details.get('retried') == '1'
    # asked= says when the holder's rmdir came (its critical section ended)
    assert asked <= parse_rfc3339_ms(rel[0].details['asked']) <= refused, rel[0]
    wait_until(lambda: _keys(etcd1, prefix, 'r') == [], what='its key deleted')
    assert 'r' not in os.listdir(m.mnt)


def test_waiter_across_a_lost_session_is_requeued_and_granted(cut_h1, lockfs_factory, etcd1,
                                                              prefix, procs):
    m, proxy = cut_h1
    h2 = _etcd_mount(lockfs_factory, etcd1, prefix, 'h2')
    holder, w = procs.agent(), procs.agent()
    assert holder.mkdir(h2.path('k')) == 0
    wait_until(lambda: 'k' in os.listdir(m.mnt), what='h1 lists it')
    fd = w.open(fpath(m, 'k'))
    rid = w.flock_start(fd, EX)
    wait_waiters(m, 'k', [w.pid])
    proxy.pause()
    try:
        # h1's session is lost (ttl=2) and a new one made once it answers.
        wait_until(lambda: 'is lost' in m.stderr(), timeout=10, what='the session lost')
    finally:
        proxy.resume()
    wait_until(lambda: [l for l in log_for(m.dir, 'k') if l.event == 'requeued'], timeout=10,
               what='`requeued` logged')
    assert w.poll(rid) is None
    assert holder.rmdir(h2.path('k')) == 0
    assert 'errno' not in w.wait(rid, 10)
    assert read_owner(m.mnt, 'k')['holder']['pid'] == w.pid
    assert w.flock(fd, fcntl.LOCK_UN) == 0


def test_a_slug_locks_own_lease_stays_in_owner_beside_its_etcd_lease(h1, etcd1, prefix, procs):
    a = procs.agent(env={'LOCKFS_SLUG': 'deploy-bot'})
    assert a.mkdir(h1.path('s')) == 0
    o = read_owner(h1.mnt, 's')
    kv = _keys(etcd1, prefix, 's')[0]
    assert isinstance(o['lease'], dict) and o['lease']['ttl_s'] > 0, o
    assert o['etcd_lease'] == format(int(kv['lease']), '016x')
    assert o['key'] == base64.b64decode(kv['key']).decode()
    assert a.rmdir(h1.path('s')) == 0


def test_a_key_named_just_the_locks_range_shows_as_a_foreign_holder(h1, etcd1, prefix, procs):
    """etcdctl put PREFIX NAME/ (nothing after the slash) is a key of
    R(NAME): mkdir is refused, so ls and owner must say by what."""
    etcd1.etcdctl('put', f'{prefix}bare/', '')
    a = procs.agent()
    assert a.mkdir(h1.path('bare')) == errno.EEXIST
    wait_until(lambda: 'bare' in os.listdir(h1.mnt), timeout=5, what='bare listed')
    o = read_owner(h1.mnt, 'bare')
    assert o['foreign'] is True and o['key'] == f'{prefix}bare/', o
    etcd1.etcdctl('del', f'{prefix}bare/')
    wait_until(lambda: a.mkdir(h1.path('bare')) == 0, timeout=5, what='bare free')
    assert a.rmdir(h1.path('bare')) == 0
