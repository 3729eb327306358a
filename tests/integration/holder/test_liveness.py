"""Issue 3 point 1: holder death releases at once (pidfd watch)."""

import errno
import os
import subprocess
import threading
import time

import pytest

from lockfs_helpers import (END_EVENTS, errno_of, evidence, log_for, percentile, pidfds_of,
                            proc_start_time, read_owner, stays_held, wait_free, wait_log,
                            wait_until, who_of)

DEADLINE = 2.0      # give up waiting for a recovery after this long
BUDGET = 0.100      # the spec: released within 100 ms
WINDOW = 0.5        # negative checks: nothing may happen for this long (5x BUDGET)


def _gone_from_mount(m, name):
    return errno_of(os.stat, m.path(name)) == errno.ENOENT


def _kill_and_wait(m, agent, name):
    """SIGKILL AGENT (a holder of NAME) and wait until NAME is free."""
    agent.kill()
    wait_free(m, name, timeout=DEADLINE)


def test_killed_holder_is_released_within_100ms(mnt, procs):
    """kill -9 of the holder -> stat through the mount says ENOENT; p50 <= 100 ms."""
    lat = []
    for i in range(12):
        a = procs.agent()
        assert a.mkdir(mnt.path('x')) == 0, f'round {i}'
        assert not _gone_from_mount(mnt, 'x')  # control: held, visible
        t0 = time.monotonic()
        os.kill(a.pid, 9)
        wait_until(lambda: _gone_from_mount(mnt, 'x'), timeout=DEADLINE, interval=0.0005,
                   what=f'round {i}: lock of killed holder {a.pid} to vanish')
        lat.append(time.monotonic() - t0)
        a.kill()  # reap
        assert not os.path.lexists(mnt.lockdir('x'))
    ms = [round(x * 1000, 1) for x in lat]
    print(f'\nrecovery latency after kill -9 (ms): p50={percentile(ms, 50)} '
          f'p99={percentile(ms, 99)} max={max(ms)} all={ms}')
    assert percentile(lat, 50) <= BUDGET, f'p50 {percentile(ms, 50)} ms > 100 ms: {ms}'
    assert len([l for l in log_for(mnt.dir, 'x') if l.event == 'recovered']) == 12


def test_recovered_line_names_holder_and_evidence(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    o = read_owner(mnt.mnt, 'x')
    who, start = who_of(a.pid), proc_start_time(a.pid)
    _kill_and_wait(mnt, a, 'x')
    lines = log_for(mnt.dir, 'x')
    assert [l.event for l in lines] == ['acquired', 'recovered'], lines
    rec = lines[1]
    assert rec.who == who
    assert rec.details.get('fence') == str(o['fence'])
    assert rec.details.get('holder') == who
    assert rec.details.get('start') == str(start)
    assert 'exited' in evidence(rec), rec.raw
    assert rec.timestamp >= lines[0].timestamp


def test_recovered_lock_is_enoent_at_once_and_free_for_another_process(mnt, procs):
    a, b, c = procs.agent(), procs.agent(), procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    b.stat(mnt.path('x'))           # b has it in the kernel's cache
    b.stat(mnt.path('x', 'owner'))
    _kill_and_wait(mnt, a, 'x')
    # the first look after the backing dir says free must agree, no retrying
    with pytest.raises(OSError) as ei:
        b.stat(mnt.path('x'))
    assert ei.value.errno == errno.ENOENT
    assert 'x' not in os.listdir(mnt.mnt)
    assert c.mkdir(mnt.path('x')) == 0
    assert c.owner(mnt.mnt, 'x')['holder']['pid'] == c.pid
    assert c.rmdir(mnt.path('x')) == 0


def test_recovery_while_a_file_inside_is_open(mnt, procs):
    """With a file of the lock open, the kernel keeps the old entry's inode:
    the next lookup must still see the lock gone, so the next mkdir works
    and shows the new holder."""
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    fd = os.open(mnt.path('x', 'owner'), os.O_RDONLY)
    dfd = os.open(mnt.path('x'), os.O_RDONLY | os.O_DIRECTORY)
    try:
        _kill_and_wait(mnt, a, 'x')
        assert _gone_from_mount(mnt, 'x')
        assert b.mkdir(mnt.path('x')) == 0
        o = read_owner(mnt.mnt, 'x')
        assert o['holder']['pid'] == b.pid
        os.read(fd, 65536)  # the old descriptor: any answer, but no hang, no crash
    finally:
        os.close(fd)
        os.close(dfd)
    assert b.rmdir(mnt.path('x')) == 0
    mnt.assert_alive()


def test_recovery_while_a_process_has_its_cwd_inside(mnt, procs):
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    inside = subprocess.Popen(['sleep', '1000'], cwd=mnt.path('x'))
    try:
        _kill_and_wait(mnt, a, 'x')
        assert _gone_from_mount(mnt, 'x')
        assert b.mkdir(mnt.path('x')) == 0
        assert read_owner(mnt.mnt, 'x')['holder']['pid'] == b.pid
        assert b.rmdir(mnt.path('x')) == 0
    finally:
        inside.kill()
        inside.wait()
    mnt.assert_alive()


def test_exited_shell_holder_is_released(mnt):
    """sh forks mkdir(1) (not its last command): sh holds, and sh exits."""
    r = subprocess.run(['/bin/sh', '-c', 'mkdir "$1" && echo $$; true', 'sh', mnt.path('x')],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    sh_pid = int(r.stdout)
    wait_free(mnt, 'x', timeout=DEADLINE)
    rec = wait_log(mnt.dir, 'x', 'recovered')[0]
    assert rec.who == f'sh[{sh_pid}]' or rec.who.endswith(f'[{sh_pid}]'), rec.raw
    os.mkdir(mnt.path('x'))  # free for the next one
    os.rmdir(mnt.path('x'))


# A holder's children started while it held the lock keep it after the
# holder's death: test_descendants.py.


def test_live_holder_keeps_its_lock_while_another_is_recovered(mnt, procs):
    live, dying = procs.agent(), procs.agent()
    assert live.mkdir(mnt.path('keep')) == 0
    assert dying.mkdir(mnt.path('lose')) == 0
    fence = read_owner(mnt.mnt, 'keep')['fence']
    _kill_and_wait(mnt, dying, 'lose')          # positive control: recovery works
    assert stays_held(mnt, 'keep', WINDOW)      # negative: the live one stays
    o = read_owner(mnt.mnt, 'keep')
    assert (o['holder']['pid'], o['fence']) == (live.pid, fence)
    assert [l.event for l in log_for(mnt.dir, 'keep')] == ['acquired']
    assert live.rmdir(mnt.path('keep')) == 0


def test_helper_exit_does_not_release_the_holders_lock(mnt, procs):
    """subprocess mkdir(1): mkdir exits at once, the python process holds."""
    r = subprocess.run(['mkdir', mnt.path('x')], capture_output=True)
    assert r.returncode == 0, r.stderr
    dying = procs.agent()
    assert dying.mkdir(mnt.path('control')) == 0
    _kill_and_wait(mnt, dying, 'control')       # positive control in the same window
    assert stays_held(mnt, 'x', WINDOW)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == os.getpid()
    os.rmdir(mnt.path('x'))


def test_thread_exit_does_not_release_the_process_lock(mnt, procs):
    """The watch is on the thread group: the calling thread's exit is not death."""
    errs = []

    def worker():
        try:
            os.mkdir(mnt.path('x'))
        except OSError as e:
            errs.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errs, errs
    dying = procs.agent()
    assert dying.mkdir(mnt.path('control')) == 0
    _kill_and_wait(mnt, dying, 'control')
    assert stays_held(mnt, 'x', WINDOW)
    os.rmdir(mnt.path('x'))


def test_one_holder_with_several_locks_loses_all(mnt, procs):
    a, bystander = procs.agent(), procs.agent()
    names = [f'n{i}' for i in range(8)]
    for n in names:
        assert a.mkdir(mnt.path(n)) == 0
    assert bystander.mkdir(mnt.path('other')) == 0
    fences = {n: read_owner(mnt.mnt, n)['fence'] for n in names}
    a.kill()
    for n in names:
        wait_free(mnt, n, timeout=DEADLINE)
        assert _gone_from_mount(mnt, n)
    for n in names:
        lines = log_for(mnt.dir, n)
        assert [l.event for l in lines] == ['acquired', 'recovered'], (n, lines)
        assert lines[1].details.get('fence') == str(fences[n])
    assert sorted(os.listdir(mnt.mnt)) == ['.flock', '.log', 'other']
    assert bystander.rmdir(mnt.path('other')) == 0


def test_one_pidfd_per_holder_process_not_per_lock(mnt, procs):
    a, b = procs.agent(), procs.agent()
    base = pidfds_of(mnt.pid)
    for i in range(20):
        assert a.mkdir(mnt.path(f'a{i}')) == 0
    for i in range(5):
        assert b.mkdir(mnt.path(f'b{i}')) == 0
    assert pidfds_of(mnt.pid) - base == 2, 'expected one pidfd per holder process'
    a.kill()
    b.kill()
    for i in range(20):
        wait_free(mnt, f'a{i}', timeout=DEADLINE)
    for i in range(5):
        wait_free(mnt, f'b{i}', timeout=DEADLINE)
    # and they are closed again (no leak per dead holder)
    wait_until(lambda: pidfds_of(mnt.pid) == base, timeout=DEADLINE,
               what='the daemon to close the pidfds of dead holders')


def test_death_of_a_former_holder_does_not_release_the_successor(mnt, procs):
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    assert a.rmdir(mnt.path('x')) == 0
    assert b.mkdir(mnt.path('x')) == 0
    assert a.mkdir(mnt.path('control')) == 0
    a.kill()
    wait_free(mnt, 'control', timeout=DEADLINE)  # a's death was noticed
    assert stays_held(mnt, 'x', WINDOW)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == b.pid
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released', 'acquired']
    assert b.rmdir(mnt.path('x')) == 0


def test_recovery_is_logged_once(mnt, procs):
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    _kill_and_wait(mnt, a, 'x')
    assert b.mkdir(mnt.path('control')) == 0
    b.kill()
    wait_free(mnt, 'control', timeout=DEADLINE)
    ends = [l for l in log_for(mnt.dir, 'x') if l.event in END_EVENTS]
    assert [l.event for l in ends] == ['recovered'], ends


def test_daemon_keeps_running_through_many_recoveries(mnt, procs):
    agents = [procs.agent() for _ in range(16)]
    for i, a in enumerate(agents):
        assert a.mkdir(mnt.path(f'm{i}')) == 0
    for a in agents:
        os.kill(a.pid, 9)
    for i, a in enumerate(agents):
        a.kill()
        wait_free(mnt, f'm{i}', timeout=DEADLINE)
    assert sorted(os.listdir(mnt.mnt)) == ['.flock', '.log']
    mnt.assert_alive()


def test_recoveries_during_concurrent_lookups_do_not_deadlock(mnt, procs):
    """Recoveries while lookups hold the kernel's directory lock: nothing the
    daemon does on a recovery may wait for that lock (it sends the kernel no
    notification at all, see fs/ops.c)."""
    stop = threading.Event()
    errors = []

    def hammer():
        while not stop.is_set():
            try:
                for n in os.listdir(mnt.mnt):
                    try:
                        os.stat(mnt.path(n))
                        with open(mnt.path(n, 'owner'), 'rb') as f:
                            f.read()
                    except (FileNotFoundError, NotADirectoryError):
                        pass
            except FileNotFoundError:
                pass
            except OSError as e:
                errors.append(e)
                return

    threads = [threading.Thread(target=hammer) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        for round_ in range(5):
            holders = [procs.agent() for _ in range(6)]
            for i, h in enumerate(holders):
                assert h.mkdir(mnt.path(f'r{i}')) == 0
            for h in holders:
                os.kill(h.pid, 9)
            for i, h in enumerate(holders):
                h.kill()
                wait_free(mnt, f'r{i}', timeout=DEADLINE)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), 'a lookup thread hangs'
    assert not errors, errors[:5]
    assert sorted(os.listdir(mnt.mnt)) == ['.flock', '.log']
    mnt.assert_alive()
