"""Issue 23 part 3: partitions as Jepsen does them.  etcd members and lockfs
hosts in network namespaces of their own (netns_helpers.Lab), real faults
(iptables DROP, tbf and random loss, SIGSTOP, kill -9), and the history
checker of partition_herd.py.  The long run is
tools/bench/bench_etcd_partitions.py; its figures are in docs/etcd.md.

Where network namespaces cannot be made (not root, no ip/iptables, a
container without CAP_NET_ADMIN) the tests that need them skip with the
reason; the checker's own cases run everywhere."""

import errno
import fcntl
import json
import os
import random
import subprocess
import time

import pytest

from history import read_histories
from lockfs_helpers import LOCKFS_BIN, LogLine, parse_rfc3339_ms, wait_until
from netns_helpers import IP, Lab, netns_missing
import partition_herd
from partition_herd import check, run_partition_herd, schedule

_MISSING = netns_missing()
needs_netns = pytest.mark.skipif(_MISSING is not None, reason=f'network namespaces: {_MISSING}')


def _our_namespaces(lab_tag):
    out = subprocess.run([IP, 'netns', 'list'], capture_output=True, text=True).stdout
    return [l.split()[0] for l in out.splitlines() if l.startswith(lab_tag + '-')]


def _mounted(path):
    with open('/proc/self/mountinfo') as f:
        return any(line.split()[4] == path for line in f)


# ---------------------------------------------------------------- the short herd

@needs_netns
@pytest.mark.slow
def test_partition_herd_for_a_minute_keeps_every_guarantee(tmp_path):
    # 16 agents on 3 hosts, a minute of faults from a printed seed; rerun a
    # failure with LOCKFS_PARTITION_SEED=N
    seed = int(os.environ.get('LOCKFS_PARTITION_SEED') or random.randrange(1, 2**31))
    print(f'partition herd seed {seed}')
    work = tmp_path / 'herd'
    work.mkdir()
    os.chmod(work, 0o755)
    report = run_partition_herd(str(work), LOCKFS_BIN, seed, 60.0, agents=16)
    print(report.text())
    # the run did what it is for: faults, grants on both locks, from every host
    assert sum(report.faults().values()) >= 3, report.text()
    assert set(report.result['grants_by_name']) == {'fl', 'mk'}, report.text()
    assert report.result['grants'] >= 100, report.text()
    # Never two holders, fences in order, nobody hung; and every grant ends
    # once, its holder told once, no lock wedged behind a key nobody holds
    # (docs/etcd.md "What the runs found": each bug found so far is fixed,
    # so every violation fails the test).
    assert report.violations == [], f'seed {seed}:\n' + report.text()


# ---------------------------------------------------------------- a lab's own behaviour

@needs_netns
def test_lab_removes_namespaces_daemons_and_mounts_after_a_failure(tmp_path):
    os.chmod(tmp_path, 0o755)
    mnt, backing = str(tmp_path / 'mnt'), str(tmp_path / 'dir')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    pids = []
    with pytest.raises(RuntimeError, match='on purpose'):
        with Lab(str(tmp_path), nodes=('e1', 'h1')) as lab:
            tag = lab.tag
            cluster = lab.etcd_cluster(1)
            d = lab.daemon('h1', cluster, mnt, backing, LOCKFS_BIN, ['ttl=3'])
            pids = [cluster.members[0].proc.pid, d.proc.pid]
            assert len(_our_namespaces(tag)) == 3        # sw, e1, h1
            os.mkdir(os.path.join(mnt, 'held'))          # through h1's netns
            lab.isolate('h1')
            cluster.members[0].pause()                   # a stopped member too
            raise RuntimeError('on purpose')
    assert _our_namespaces(tag) == []
    assert not _mounted(mnt)
    for pid in pids:
        assert not os.path.exists(f'/proc/{pid}'), pid


@needs_netns
def test_a_daemon_in_a_namespace_mounts_where_everyone_sees_it(tmp_path):
    # nsenter --net changes the network namespace only: the mount made by
    # the daemon is in ours, and in any other process's of this machine
    os.chmod(tmp_path, 0o755)
    mnt, backing = str(tmp_path / 'mnt'), str(tmp_path / 'dir')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    with Lab(str(tmp_path), nodes=('e1', 'h1')) as lab:
        cluster = lab.etcd_cluster(1)
        lab.daemon('h1', cluster, mnt, backing, LOCKFS_BIN, ['ttl=3'])
        os.mkdir(os.path.join(mnt, 'seen'))
        # another process (a shell) sees the mount and the lock
        r = subprocess.run(['cat', f'{mnt}/seen/owner'], capture_output=True, text=True,
                           timeout=10)
        assert r.returncode == 0, r.stderr
        rec = json.loads(r.stdout)
        assert rec['holder']['host'] == 'h1' and rec['holder']['pid'] == os.getpid()
        # the key is in the etcd that only the lab's namespaces reach
        got = cluster.etcdctl('get', rec['key'], '--keys-only')
        assert got.stdout.strip() == rec['key'], (got.stdout, got.stderr)
        os.rmdir(os.path.join(mnt, 'seen'))


# ---------------------------------------------------------------- asked= after an outage

def _released_line(backing, name, fence, timeout=20.0):
    def found():
        for l in read_histories([('h', backing)])['h']:
            if l.name == name.encode() and l.event == 'released' \
                    and l.details.get('fence') == str(fence):
                return l
        return None
    return wait_until(found, timeout=timeout, interval=0.05,
                      what=f'the released line of {name} fence {fence}')


@needs_netns
@pytest.mark.parametrize('how', ['rmdir', 'flock-close'])
def test_a_release_completed_after_a_partition_says_when_the_holder_let_go(tmp_path, how):
    # The holder lets go while its host is cut off from etcd: the release
    # fails after the 1 s bound (rmdir: EIO) and is completed once etcd
    # answers, logged `released ... retried=1 asked=T`.  T is when the
    # holder let go -- its critical section ended then -- not when the
    # store gave up on the first try: a checker that trusts T must not see
    # the next holder (granted once etcd applied the delete) overlap it.
    os.chmod(tmp_path, 0o755)
    mnt, backing = str(tmp_path / 'mnt'), str(tmp_path / 'dir')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    with Lab(str(tmp_path), nodes=('e1', 'h1')) as lab:
        cluster = lab.etcd_cluster(1)
        # ttl 30: the session outlives the cut
        lab.daemon('h1', cluster, mnt, backing, LOCKFS_BIN, ['ttl=30'])
        if how == 'rmdir':
            os.mkdir(os.path.join(mnt, 'job'))
        else:
            fd = os.open(os.path.join(mnt, '.flock', 'job'), os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        with open(os.path.join(mnt, 'job', 'owner')) as f:
            fence = json.load(f)['fence']
        lab.partition(['h1'], ['e1'])
        let_go = time.time()
        if how == 'rmdir':
            with pytest.raises(OSError) as e:
                os.rmdir(os.path.join(mnt, 'job'))
            assert e.value.errno == errno.EIO
        else:
            os.close(fd)            # returns at once; the daemon releases later
        answered = time.time()
        time.sleep(1.5)             # past the 1 s bound: the first try failed
        lab.heal()
        line = _released_line(backing, 'job', fence)
    assert line.details.get('retried') == '1', line.raw
    asked = parse_rfc3339_ms(line.details['asked'])
    # the request reached the daemon within a few ms of the call; the
    # store's bound is 1 s: allow a loaded machine 300 ms
    assert let_go - 0.05 <= asked <= let_go + 0.3, \
        f'asked={line.details["asked"]} but the holder let go at {let_go:.3f} ' \
        f'(its call returned at {answered:.3f}): {line.raw}'


# ---------------------------------------------------------------- the checker's own cases

def _line(t_ms, who_pid, name, fence, event, **kw):
    ts = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t_ms // 1000)) + f'.{t_ms % 1000:03d}Z'
    extra = ''.join(f' {k}={v}' for k, v in kw.items())
    return LogLine(f'{ts} python3[{who_pid}] {name} fence={fence} uid=0 pid={who_pid}{extra} '
                   f'{event}')


def _grant(pid, host, name, fence, t, t_rel, rc=0, mode='mkdir'):
    return [{'ev': 'grant', 't': t, 'pid': pid, 'host': host, 'name': name, 'mode': mode,
             'fence': fence, 'owner_err': None, 'owner_pid': pid},
            {'ev': 'release', 't': t_rel + 0.001, 't_rel': t_rel, 'pid': pid, 'host': host,
             'name': name, 'mode': mode, 'fence': fence, 'rc': rc, 'rc_close': None}]


T = 1_800_000_000_000     # ms


def test_checker_passes_a_sound_history_and_finds_each_violation():
    logs = {'h1': [_line(T, 1, 'mk', 5, 'acquired'), _line(T + 20, 1, 'mk', 5, 'released')],
            'h2': [_line(T + 30, 2, 'mk', 7, 'acquired'), _line(T + 50, 2, 'mk', 7, 'released')]}
    recs = _grant(1, 'h1', 'mk', 5, T / 1000 + 0.001, T / 1000 + 0.019) \
        + _grant(2, 'h2', 'mk', 7, T / 1000 + 0.031, T / 1000 + 0.049)
    r = check(logs, recs)
    assert r['violations'] == [] and r['grants'] == 2

    # two agents hold at once (the agents' own intervals overlap)
    bad = _grant(1, 'h1', 'mk', 5, T / 1000 + 0.001, T / 1000 + 0.040) \
        + _grant(2, 'h2', 'mk', 7, T / 1000 + 0.031, T / 1000 + 0.049)
    assert any(v.startswith('[overlap]') for v in check(logs, bad)['violations'])

    # fences go backwards in grant order
    back = {'h1': logs['h1'],
            'h2': [_line(T + 30, 2, 'mk', 4, 'acquired'), _line(T + 50, 2, 'mk', 4, 'released')]}
    rb = _grant(1, 'h1', 'mk', 5, T / 1000 + 0.001, T / 1000 + 0.019) \
        + _grant(2, 'h2', 'mk', 4, T / 1000 + 0.031, T / 1000 + 0.049)
    assert any(v.startswith('[fence]') for v in check(back, rb)['violations'])

    # a lost holder's later rmdir answers 0 instead of ESTALE
    lost = {'h1': [_line(T, 1, 'mk', 5, 'acquired'),
                   _line(T + 10, 1, 'mk', 5, 'lost', evidence='session-expired')]}
    rl = _grant(1, 'h1', 'mk', 5, T / 1000 + 0.001, T / 1000 + 0.030, rc=0)
    assert any(v.startswith('[lost-rmdir]') for v in check(lost, rl)['violations'])
    rl = _grant(1, 'h1', 'mk', 5, T / 1000 + 0.001, T / 1000 + 0.030, rc=errno.ESTALE)
    assert check(lost, rl)['violations'] == []
    assert check(lost, rl)['lost_grants'] == 1

    # told twice: ESTALE again at the next mkdir
    twice = rl + [{'ev': 'acq_err', 't': T / 1000 + 0.040, 'pid': 1, 'host': 'h1', 'name': 'mk',
                   'mode': 'mkdir', 'errno': errno.ESTALE}]
    assert any(v.startswith('[told-twice]') for v in check(lost, twice)['violations'])

    # h1's `released` written 800 ms after its agent let go (etcd's answer
    # came late over a slow link), h2 granted in between: sound, since the
    # holder asked before h2's grant -- but not when it asked after
    late = {'h1': [_line(T, 1, 'mk', 5, 'acquired'), _line(T + 820, 1, 'mk', 5, 'released')],
            'h2': [_line(T + 30, 2, 'mk', 7, 'acquired'), _line(T + 50, 2, 'mk', 7, 'released')]}
    assert check(late, recs)['violations'] == []
    asked_late = _grant(1, 'h1', 'mk', 5, T / 1000 + 0.001, T / 1000 + 0.600) \
        + _grant(2, 'h2', 'mk', 7, T / 1000 + 0.031, T / 1000 + 0.049)
    assert any(v.startswith('[overlap]') and 'two holders' in v
               for v in check(late, asked_late)['violations'])
    # (the rule is only for a release the agent saw succeed)
    failed = _grant(1, 'h1', 'mk', 5, T / 1000 + 0.001, T / 1000 + 0.019, rc=errno.EIO) \
        + _grant(2, 'h2', 'mk', 7, T / 1000 + 0.031, T / 1000 + 0.049)
    assert any('two holders' in v for v in check(late, failed)['violations'])

    # a lock with nobody holding it for 20 s while agents wanted it
    slow = {'h1': logs['h1'],
            'h2': [_line(T + 20_030, 2, 'mk', 7, 'acquired'),
                   _line(T + 20_050, 2, 'mk', 7, 'released')]}
    rs = _grant(1, 'h1', 'mk', 5, T / 1000 + 0.001, T / 1000 + 0.019) \
        + _grant(2, 'h2', 'mk', 7, T / 1000 + 20.031, T / 1000 + 20.049)
    r = check(slow, rs)
    assert [v for v in r['violations'] if v.startswith('[stall]')], r['violations']
    assert r['unavailable']['mk']['longest_s'] == 20.01

    # a grant with no end line, and an agent that never stopped
    open_ = {'h1': [_line(T, 1, 'mk', 5, 'acquired')]}
    r = check(open_, [], hung=[(1, None)])
    assert any(v.startswith('[no-end]') for v in r['violations'])
    assert any(v.startswith('[hang]') for v in r['violations'])


def test_the_nemesis_schedule_is_the_seeds_and_ends_healed():
    a, b = schedule(42, 600), schedule(42, 600)
    assert a == b and a != schedule(43, 600)
    kinds = {k for _, k, _, _ in a}
    assert kinds == {k for k, _ in partition_herd.KINDS}, kinds
    for start, _, dur, _ in a:
        assert start + dur <= 600 - 5
    for _, kind, _, p in a:
        if kind == 'slow-lossy':
            assert 64 <= p['rate_kbit'] <= 256 and 0 < p['loss'] <= 0.15
