"""M/.metrics and lockctl metrics (issue 24, section 3, metrics): the
Prometheus text format, as Debian's python3-prometheus-client parses it."""
import os
import subprocess

import fcntl
import pytest

from events_helpers import LOCKCTL, clean_env
from lockfs_helpers import wait_log, wait_until

parser = pytest.importorskip('prometheus_client.parser',
                             reason='python3-prometheus-client (tools/packages.txt)')


def samples(text):
    """{(name, frozenset(labels)): value} of every sample in TEXT."""
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def read_metrics(m):
    with open(m.path('.metrics')) as f:
        return samples(f.read())


def val(ss, metric, **labels):
    return ss[(metric, frozenset(labels.items()))]


def test_metrics_parse_and_count_acquisitions_and_ends(mnt, procs):
    before = read_metrics(mnt)
    assert val(before, 'lockfs_locks_held') == 0
    a = procs.agent()
    assert a.mkdir(mnt.path('m1')) == 0
    held = read_metrics(mnt)
    assert val(held, 'lockfs_locks_held') == 1
    assert val(held, 'lockfs_acquisitions_total', bound='dir') == \
        val(before, 'lockfs_acquisitions_total', bound='dir') + 1
    assert a.rmdir(mnt.path('m1')) == 0
    after = read_metrics(mnt)
    assert val(after, 'lockfs_locks_held') == 0
    assert val(after, 'lockfs_grant_ends_total', how='released') == \
        val(before, 'lockfs_grant_ends_total', how='released') + 1
    assert val(after, 'lockfs_hold_seconds_count') == val(before, 'lockfs_hold_seconds_count') + 1
    fd = os.open(mnt.path('.flock', 'm2'), os.O_RDWR | os.O_CREAT)
    try:
        assert a.take(mnt.path('.flock', 'm2')) is not None
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    busy = read_metrics(mnt)
    assert val(busy, 'lockfs_contention_total', how='refused') == \
        val(before, 'lockfs_contention_total', how='refused') + 1
    assert val(busy, 'lockfs_store_errors_total') == 0


def test_metrics_count_recoveries_by_evidence(mnt, procs):
    before = read_metrics(mnt)
    a = procs.agent()
    assert a.mkdir(mnt.path('dead')) == 0
    a.kill()
    wait_log(mnt.dir, 'dead', 'recovered')
    after = read_metrics(mnt)
    assert val(after, 'lockfs_recoveries_total', evidence='exited') == \
        val(before, 'lockfs_recoveries_total', evidence='exited') + 1
    assert val(after, 'lockfs_grant_ends_total', how='recovered') == \
        val(before, 'lockfs_grant_ends_total', how='recovered') + 1


def test_metrics_waiters_and_wait_histogram(mnt, procs):
    holder, waiter = procs.agent(), procs.agent()
    fh = holder.open(mnt.path('.flock', 'w'))
    assert holder.flock(fh, fcntl.LOCK_EX) == 0
    fw = waiter.open(mnt.path('.flock', 'w'))
    rid = waiter.flock_start(fw, fcntl.LOCK_EX)
    # The waiter is parked once the log-less `waiting` event is out: wait
    # for the gauge (the request is in flight until the daemon parks it).
    wait_until(lambda: val(read_metrics(mnt), 'lockfs_waiters') == 1, what='a parked waiter')
    ss = read_metrics(mnt)
    assert val(ss, 'lockfs_contention_total', how='waited') == 1
    assert val(ss, 'lockfs_wait_seconds_count') == 0
    assert holder.flock(fh, fcntl.LOCK_UN) == 0
    assert 'errno' not in waiter.wait(rid, timeout=5)
    ss = read_metrics(mnt)
    assert val(ss, 'lockfs_waiters') == 0
    assert val(ss, 'lockfs_wait_seconds_count') == 1
    assert val(ss, 'lockfs_wait_seconds_bucket', le='+Inf') == 1
    assert val(ss, 'lockfs_acquisitions_total', bound='fd') == 2


def test_metrics_readable_by_any_uid_and_lockctl_metrics(mnt_ao, users):
    u = users[0]
    r = subprocess.run([LOCKCTL, '--mount', mnt_ao.mnt, 'metrics'], capture_output=True,
                       env=clean_env(), cwd='/', user=u.uid, group=u.gid, extra_groups=[],
                       timeout=30)
    assert r.returncode == 0, r.stderr
    ss = samples(r.stdout.decode())
    assert ('lockfs_locks_held', frozenset()) in ss
    # Nothing about who holds: no uid, pid or name label anywhere.
    for (name, labels) in ss:
        assert not {k for k, _ in labels} & {'uid', 'pid', 'name', 'who', 'user'}


def test_per_name_series_only_for_listed_names(lockfs_factory):
    m = lockfs_factory(options=['metrics_names=gpu:seat'])
    os.mkdir(m.path('gpu'))
    os.mkdir(m.path('unlisted'))
    ss = read_metrics(m)
    assert val(ss, 'lockfs_lock_name_holders', name='gpu') == 1
    assert val(ss, 'lockfs_lock_name_holders', name='seat') == 0
    assert val(ss, 'lockfs_lock_name_waiters', name='gpu') == 0
    assert not [k for k in ss if ('name', 'unlisted') in k[1]]
    os.rmdir(m.path('gpu'))
    os.rmdir(m.path('unlisted'))
