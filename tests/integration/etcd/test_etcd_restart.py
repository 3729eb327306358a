"""Issue 11, daemon restarts and start-up: a restarted daemon re-adopts its
live holders' keys (fd locks too) without a moment in which the lock is
free, releases its dead holders' and drops its dead waiters' places; one
restarted after its old session expired tells the live holders their locks
were lost; a restart is told from a second daemon with a used host name
(refused); a daemon that cannot reach etcd fails at once."""

import errno
import fcntl
import os
import signal

import pytest

from etcd_fixtures import etcd1, free_ports  # noqa: F401
from etcd_mounts import (HOLD, etcd_mounts, etcd_options, etcdctl_lock,  # noqa: F401
                         line_within, start_refused)
from flock_helpers import proc_state
from lockfs_helpers import fusermount_u, wait_until


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
    assert 'lockfs: etcd' not in n.stderr(), n.stderr()

    # the holder releases through the new daemon; etcdctl gets x after it
    assert live.rmdir(n.path('x')) == 0
    line = line_within(p, 10)
    assert line and int(line.split()[1]) > rev, line
    assert p.wait(15) == 0


@pytest.mark.slow
def test_restarted_daemon_rebinds_and_adopts_an_fd_lock_held_across_the_crash(
        etcd1, etcd_mounts, procs):
    """flock(2) on M/.flock/x: the new daemon binds the lock to the process
    that still holds its old descriptor (as on dir), adopts its key, and
    releases it once that descriptor is closed."""
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=10)
    h1 = hosts[0]
    lk = procs.agent()
    fd = lk.take(h1.path('.flock', 'x'))
    [(key, _, rev, lease)] = hosts.lock_keys('x')

    h1.kill9(lazy=True)
    n = hosts.restart(h1)
    hosts.wait_log(n, 'x', 'rebound')
    [ad] = hosts.wait_log(n, 'x', 'adopted')
    [k] = hosts.lock_keys('x')
    assert (k[0], k[2]) == (key, rev) and k[3] != lease, (k, key, rev, lease)
    assert int(ad.details['session'], 16) == k[3], ad.raw
    assert procs.agent().owner(n.mnt, 'x')['holder']['pid'] == lk.pid

    # the close the old mount cannot carry is seen in /proc: released
    assert lk.close(fd) == errno.ENOTCONN
    wait_until(lambda: hosts.lock_keys('x') == [], timeout=10, what='x released')
    [rec] = hosts.wait_log(n, 'x', 'recovered')
    assert rec.details['evidence'] == 'closed', rec.raw


@pytest.mark.slow
def test_restarted_daemon_deletes_the_places_of_its_dead_waiters(etcd1, etcd_mounts, procs):
    """A flock waiter's request dies with the daemon: its key in x's line
    goes at the restart, the holder's key stays (adopted)."""
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=10)
    h1 = hosts[0]
    holder, waiter = procs.agent(), procs.agent()
    assert holder.mkdir(h1.path('x')) == 0
    fd = waiter.open(h1.path('.flock', 'x'))
    rid = waiter.flock_start(fd, fcntl.LOCK_EX)
    wait_until(lambda: len(hosts.lock_keys('x')) == 2, timeout=10, what="the waiter's key")
    [(key, _, rev, lease), place] = hosts.lock_keys('x')
    assert place[3] == lease

    h1.kill9(lazy=True)
    assert waiter.wait(rid, 10).get('errno') in (errno.ECONNABORTED, errno.ENOTCONN)
    n = hosts.restart(h1)
    hosts.wait_log(n, 'x', 'adopted')
    wait_until(lambda: len(hosts.lock_keys('x')) == 1, timeout=10, what="the place's delete")
    [k] = hosts.lock_keys('x')
    assert (k[0], k[2]) == (key, rev) and k[3] != lease, (k, key, rev, lease)
    assert holder.rmdir(n.path('x')) == 0
    wait_until(lambda: hosts.lock_keys('x') == [], timeout=10, what='x released')


@pytest.mark.slow
def test_restart_after_the_old_session_expired_tells_the_live_holder_its_lock_was_lost(
        etcd1, etcd_mounts, procs):
    """Too late to adopt: the keys went with the lease.  The holder is told
    as for a lost session (`lost`, rmdir ESTALE), never that it holds x."""
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=2)
    h1 = hosts[0]
    live = procs.agent()
    assert live.mkdir(h1.path('x')) == 0
    [(key, _, rev, lease)] = hosts.lock_keys('x')

    h1.kill9()
    wait_until(lambda: hosts.keys() == [], timeout=10, what='the old lease to expire')
    n = hosts.restart(h1)
    [lost] = hosts.wait_log(n, 'x', 'lost')
    assert (lost.details['evidence'], lost.details['fence'], lost.details['pid'],
            int(lost.details['session'], 16)) == ('session-expired', str(rev), str(live.pid),
                                                  lease), lost.raw
    assert live.rmdir(n.path('x')) == errno.ESTALE
    assert hosts.log_lines(n, 'x', 'adopted') == []
    assert 'lockfs: etcd' not in n.stderr(), n.stderr()
    # x is free: nothing of the old session is held again
    other = procs.agent()
    assert other.mkdir(n.path('x')) == 0
    assert other.rmdir(n.path('x')) == 0


@pytest.mark.slow
def test_restart_while_the_old_daemon_is_not_yet_reaped_is_not_refused(
        etcd1, etcd_mounts, procs):
    """/proc still shows the old daemon (a zombie) with the pid and start
    time its host key names; the pid lock of the backing dir, which the new
    daemon holds, says it is gone: a restart, not a second daemon."""
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=10)
    h1 = hosts[0]
    live = procs.agent()
    assert live.mkdir(h1.path('x')) == 0
    os.kill(h1.pid, signal.SIGKILL)
    try:
        wait_until(lambda: proc_state(h1.pid) == 'Z', timeout=10, what='the daemon a zombie')
        fusermount_u(h1.mnt)
        h1.stopped = True
        n = hosts.restart(h1)
        hosts.wait_log(n, 'x', 'adopted')
        assert proc_state(h1.pid) == 'Z'
    finally:
        h1.proc.wait(10)
    assert live.rmdir(n.path('x')) == 0


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


def _start_dirs(scratch_dir, tmp_path):
    """A mount point and a backing dir (0700) for a start that must fail."""
    mnt, backing = os.path.join(scratch_dir, 'm'), str(tmp_path / 'b')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    return mnt, backing


def test_start_fails_fast_when_no_endpoint_answers(scratch_dir, tmp_path):
    [port] = free_ports(1)
    mnt, backing = _start_dirs(scratch_dir, tmp_path)
    url = f'http://127.0.0.1:{port}'
    rc, err = start_refused(['backend=etcd', f'etcd={url}', 'host=h1', 'prefix=/t/'],
                            mnt, backing, timeout=10)
    assert rc != 0
    line = one_line(err)
    assert f'no etcd endpoint answers ({url})' in line, line


def test_start_fails_fast_on_an_unreadable_certificate(scratch_dir, tmp_path):
    [port] = free_ports(1)
    mnt, backing = _start_dirs(scratch_dir, tmp_path)
    missing = str(tmp_path / 'no-such-ca.pem')
    rc, err = start_refused(['backend=etcd', f'etcd=https://127.0.0.1:{port}', 'host=h1',
                             f'etcd_cacert={missing}'], mnt, backing, timeout=10)
    assert rc != 0
    line = one_line(err)
    assert f'cannot read TLS file {missing}' in line, line


def test_start_fails_fast_when_the_cluster_wants_a_user(etcd1, scratch_dir, tmp_path):
    """etcd with authentication on takes a user from a client certificate
    (or a password lockfs does not send): without one it refuses us."""
    etcd1.etcdctl('user', 'add', 'root:secret-pw')
    etcd1.etcdctl('auth', 'enable')
    mnt, backing = _start_dirs(scratch_dir, tmp_path)
    rc, err = start_refused(['backend=etcd', f'etcd={etcd1.endpoints}', 'host=h1',
                             'prefix=/t/'], mnt, backing, timeout=10)
    assert rc != 0
    line = one_line(err)
    assert f'etcd refused our credentials ({etcd1.endpoints})' in line, line


@pytest.mark.parametrize('host', ['web 1', 'web\n1', 'web\t1', 'caf\u00e9', 'a/b', 'a"b'])
def test_a_host_name_that_would_garble_records_or_columns_is_refused(
        etcd1, scratch_dir, tmp_path, host):
    mnt, backing = _start_dirs(scratch_dir, tmp_path)
    rc, err = start_refused(['backend=etcd', f'etcd={etcd1.endpoints}', f'host={host}',
                             'prefix=/t/'], mnt, backing, timeout=10)
    assert rc != 0
    assert '-o host=' in err and 'printable ASCII' in err, err


def test_a_prefix_inside_another_namespace_is_refused(etcd1, lockfs_factory, scratch_dir,
                                                     tmp_path):
    """prefix=/t/sub/ beside a daemon on /t/: every key of the inner one
    would be a key of the outer, its host key a lock nobody can take."""
    lockfs_factory(options=('backend=etcd', f'etcd={etcd1.endpoints}', 'prefix=/t/',
                            'host=h1', 'ttl=4', 'lock_delay=1'))
    mnt, backing = _start_dirs(scratch_dir, tmp_path)
    rc, err = start_refused(['backend=etcd', f'etcd={etcd1.endpoints}', 'host=h2',
                             'prefix=/t/sub/'], mnt, backing, timeout=10)
    assert rc != 0
    line = one_line(err)
    assert 'prefix=/t/sub/ is inside the lockfs namespace /t/' in line, line
