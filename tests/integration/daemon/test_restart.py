"""Issue 3 point 6: kill -9 of the daemon, restart on the same DIR, no double grant."""

import errno
import json
import os
import signal

import pytest

from lockfs_helpers import (END_EVENTS, evidence, log_for, mount_entry, read_owner, stays_held,
                            wait_free, wait_log, wait_until, who_of)

OTHER_BOOT = '00000000-0000-4000-8000-000000000000'


def _crash_and_restart(factory, m):
    assert m.kill9() == -signal.SIGKILL
    return factory.restart(m)


def _edit_record(m, name, fn):
    p = os.path.join(m.lockdir(name), 'owner.json')
    with open(p, 'rb') as f:
        rec = json.loads(f.read())
    fn(rec)
    with open(p, 'wb') as f:
        f.write((json.dumps(rec, separators=(',', ':')) + '\n').encode())


def test_kill9_leaves_the_mount_dead_until_unmounted(lockfs_factory, procs):
    """The premise of the other tests: SIGKILL really crashes it (ENOTCONN)."""
    m = lockfs_factory()
    a = procs.agent()
    assert a.mkdir(m.path('x')) == 0
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()
    assert a.mkdir(m.path('y')) == errno.ENOTCONN
    m2 = _crash_and_restart(lockfs_factory, m)
    assert a.rmdir(m2.path('x')) == 0


def test_live_holders_lock_is_still_its_own_after_restart(lockfs_factory, procs):
    m = lockfs_factory()
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(m.path('x')) == 0
    o1 = read_owner(m.mnt, 'x')
    m2 = _crash_and_restart(lockfs_factory, m)
    o2 = read_owner(m2.mnt, 'x')
    assert (o2['holder']['pid'], o2['fence'], o2['token']) == \
        (a.pid, o1['fence'], o1['token'])
    assert b.mkdir(m2.path('x')) == errno.EEXIST    # no double grant
    assert b.rmdir(m2.path('x')) == errno.EPERM     # still the holder rule
    assert not [l for l in log_for(m2.dir, 'x') if l.event in END_EVENTS]
    assert a.rmdir(m2.path('x')) == 0                # the holder's rmdir works
    assert [l.event for l in log_for(m2.dir, 'x')] == ['acquired', 'denied', 'released']


def test_live_holders_death_is_noticed_after_restart(lockfs_factory, procs):
    """The pidfd watch is re-armed at startup."""
    m = lockfs_factory()
    a = procs.agent()
    assert a.mkdir(m.path('x')) == 0
    m2 = _crash_and_restart(lockfs_factory, m)
    assert stays_held(m2, 'x', 0.3)  # alive: kept after the restart
    who = who_of(a.pid)
    a.kill()
    wait_free(m2, 'x', timeout=2)
    rec = wait_log(m2.dir, 'x', 'recovered')[0]
    assert rec.who == who
    assert 'exited' in evidence(rec)


def test_holder_that_died_while_the_daemon_was_down_is_recovered(lockfs_factory, procs):
    m = lockfs_factory()
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(m.path('x')) == 0
    fence = read_owner(m.mnt, 'x')['fence']
    who = who_of(a.pid)
    assert m.kill9() == -signal.SIGKILL
    a.kill()                              # dies while nobody watches
    assert os.path.isdir(m.lockdir('x'))  # premise: still in DIR
    m2 = lockfs_factory.restart(m)
    wait_free(m2, 'x', timeout=2)
    rec = wait_log(m2.dir, 'x', 'recovered')
    assert len(rec) == 1, log_for(m2.dir, 'x')
    assert rec[0].who == who
    assert rec[0].details.get('fence') == str(fence)
    assert evidence(rec[0]) & {'exited-while-down', 'exited'}, rec[0].raw
    assert b.mkdir(m2.path('x')) == 0
    assert read_owner(m2.mnt, 'x')['fence'] > fence
    assert b.rmdir(m2.path('x')) == 0


def test_record_from_another_boot_is_recovered(lockfs_factory, procs):
    m = lockfs_factory()
    a = procs.agent()
    assert a.mkdir(m.path('x')) == 0
    assert a.mkdir(m.path('control')) == 0
    assert m.kill9() == -signal.SIGKILL
    _edit_record(m, 'x', lambda r: r['holder'].update(boot_id=OTHER_BOOT))
    m2 = lockfs_factory.restart(m)
    wait_free(m2, 'x', timeout=2)
    rec = wait_log(m2.dir, 'x', 'recovered')[0]
    assert 'boot-changed' in evidence(rec), rec.raw
    # negative control: the unedited record of the same (live) holder stays
    assert stays_held(m2, 'control', 0.3)
    assert a.rmdir(m2.path('control')) == 0
    # and the (alive) process named in the other-boot record cannot release it
    assert a.rmdir(m2.path('x')) == errno.ENOENT


def test_record_with_reused_pid_is_recovered(lockfs_factory, procs):
    """Same pid, other start time: a different process, so the holder is dead."""
    m = lockfs_factory()
    a = procs.agent()
    assert a.mkdir(m.path('x')) == 0
    assert m.kill9() == -signal.SIGKILL
    _edit_record(m, 'x', lambda r: r['holder'].update(start_time=r['holder']['start_time'] - 1))
    m2 = lockfs_factory.restart(m)
    wait_free(m2, 'x', timeout=2)
    assert wait_log(m2.dir, 'x', 'recovered')
    assert a.rmdir(m2.path('x')) == errno.ENOENT


def test_slug_lock_survives_restart(lockfs_factory, procs):
    m = lockfs_factory()
    a = procs.agent(env={'LOCKFS_SLUG': 'S'})
    assert a.mkdir(m.path('x')) == 0
    a.kill()
    m2 = _crash_and_restart(lockfs_factory, m)
    assert stays_held(m2, 'x', 0.5)
    o = read_owner(m2.mnt, 'x')
    assert (o['bound'], o['slug']) == ('slug', 'S')
    assert procs.agent(env={'LOCKFS_SLUG': 'S'}).rmdir(m2.path('x')) == 0


def test_fences_keep_increasing_across_crashes(lockfs_factory):
    m = lockfs_factory()
    fences = []
    for _ in range(3):
        for _ in range(3):
            os.mkdir(m.path('x'))
            fences.append(read_owner(m.mnt, 'x')['fence'])
            os.rmdir(m.path('x'))
        m = _crash_and_restart(lockfs_factory, m)
    os.mkdir(m.path('x'))
    fences.append(read_owner(m.mnt, 'x')['fence'])
    os.rmdir(m.path('x'))
    assert all(a < b for a, b in zip(fences, fences[1:])), fences


def test_no_double_grant_across_a_crash_with_many_holders(lockfs_factory, procs):
    m = lockfs_factory()
    holders = [procs.agent() for _ in range(6)]
    for i, h in enumerate(holders):
        assert h.mkdir(m.path(f'n{i}')) == 0
    for h in holders[:3]:
        h.kill()
    for i in range(3):
        wait_free(m, f'n{i}')
    m2 = _crash_and_restart(lockfs_factory, m)
    others = [procs.agent() for _ in range(6)]
    for i, o in enumerate(others):
        want = 0 if i < 3 else errno.EEXIST
        assert o.mkdir(m2.path(f'n{i}')) == want, i
    for i in range(3):
        assert others[i].rmdir(m2.path(f'n{i}')) == 0
    for i in range(3, 6):
        assert holders[i].rmdir(m2.path(f'n{i}')) == 0
    assert sorted(os.listdir(m2.mnt)) == ['.flock', '.log']


@pytest.mark.parametrize('how', ['sigkill', 'unmount'])
def test_restart_recovers_and_keeps_the_right_ones(lockfs_factory, procs, how):
    """A mixed DIR at startup: live, dead, other-boot; clean and crashed stops."""
    m = lockfs_factory()
    live, dead = procs.agent(), procs.agent()
    assert live.mkdir(m.path('live')) == 0
    assert dead.mkdir(m.path('dead')) == 0
    assert live.mkdir(m.path('oldboot')) == 0
    if how == 'sigkill':
        assert m.kill9() == -signal.SIGKILL
    else:
        assert m.unmount() == 0
    dead.kill()
    _edit_record(m, 'oldboot', lambda r: r['holder'].update(boot_id=OTHER_BOOT))
    m2 = lockfs_factory.restart(m)
    wait_free(m2, 'dead', timeout=2)
    wait_free(m2, 'oldboot', timeout=2)
    assert stays_held(m2, 'live', 0.3)
    assert sorted(os.listdir(m2.mnt)) == ['.flock', '.log', 'live']
    assert live.rmdir(m2.path('live')) == 0


def test_auto_unmount_detaches_a_killed_daemon(lockfs_factory, procs):
    """-o auto_unmount (documented for unattended use): no fusermount3 -u needed."""
    m = lockfs_factory(options=['auto_unmount'])
    a = procs.agent()
    assert a.mkdir(m.path('x')) == 0
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()
    wait_until(lambda: mount_entry(m.mnt) is None, timeout=15,  # fusermount3's helper, a separate process: slow under load
               what='auto_unmount to detach the dead mount')
    m.kill9()  # bookkeeping only: already dead and unmounted
    m2 = lockfs_factory.restart(m)
    assert read_owner(m2.mnt, 'x')['holder']['pid'] == a.pid
    assert a.rmdir(m2.path('x')) == 0
