"""Issue 22 point 3, last bullet: where a daemon restart is still seen by
clients, `lockctl run` and `lockctl acquire` ride out the restart window
(ENOTCONN, ECONNABORTED, nothing mounted on the guarded mount point) and
fail with one line only after a bound (`--restart-wait`, default 30 s).

A lock `run` already holds when the connection dies stays held in DIR, the
restarted daemon rebinds it to lockctl's process, CMD is left to finish,
and lockctl says so in one line.

The daemon options of every daemon started here are in RESTART_OPTS, so
that a mode in which restarts are seen can be chosen in one place.
"""

import errno
import json
import os
import re
import signal
import sys
import time
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lockfs_helpers import SOURCE_ROOT, evidence, log_for, read_owner, wait_until  # noqa: E402
from test_lockctl import (EX_UNAVAILABLE, LOCKCTL, bg, go, lc, one_error_line,  # noqa: E402,F401
                          start_blocked_run, wait_free, waiters)

# Daemon options of every daemon these tests start and restart: without a
# keeper, as on a kernel older than 6.9 (no FUSE_NOTIFY_RESEND), clients see
# the restart.  (These daemons run in the foreground, which has no keeper
# anyway; the option says it where it matters.)
RESTART_OPTS = ['keeper=off']


def start(factory):
    return factory(options=RESTART_OPTS)


def crash(m, how):
    """Stop M's daemon the way HOW says and leave nothing mounted."""
    if how == 'sigkill':
        assert m.kill9() == -signal.SIGKILL
    else:
        assert m.signal(signal.SIGTERM) == 0


def waiting_lockctl(bg, m, verb, name, marker, extra=()):
    cmd = [LOCKCTL, '--mount', m.mnt, verb, name, *extra]
    if verb == 'run':
        cmd += ['--', 'touch', str(marker)]
    b = bg(cmd)
    wait_until(lambda: len(waiters(m, name)) == 1 or b.proc.poll() is not None, timeout=10,
               what='lockctl to wait in line')
    assert b.proc.poll() is None, (b.wait(), b.err)
    return b


@pytest.mark.parametrize('how', ['sigkill', 'sigterm'])
@pytest.mark.parametrize('verb', ['run', 'acquire'])
def test_a_waiter_gets_the_lock_from_the_restarted_daemon(lockfs_factory, procs, bg, tmp_path,
                                                          verb, how):
    m = start(lockfs_factory)
    holder = procs.agent()
    assert holder.mkdir(m.path('x')) == 0            # a process-bound lock: kept
    marker = tmp_path / 'ran'
    b = waiting_lockctl(bg, m, verb, 'x', marker)
    crash(m, how)
    m2 = lockfs_factory.restart(m)
    # lockctl did not give up: it is back in line on the new mount
    wait_until(lambda: len(waiters(m2, 'x')) == 1 or b.proc.poll() is not None, timeout=10,
               what='lockctl to queue again on the restarted daemon')
    assert b.proc.poll() is None, (b.wait(), b.err)
    assert holder.rmdir(m2.path('x')) == 0
    assert b.wait() == 0, b.err
    assert b.err == ''
    if verb == 'run':
        assert marker.exists()
        wait_free(m2, 'x')
    else:
        o = read_owner(m2.mnt, 'x')
        assert (o['bound'], o['holder']['pid']) == ('process', os.getpid())
        assert lc(m2, 'release', 'x').returncode == 0


def test_a_start_while_nothing_is_mounted_waits_for_the_daemon(lockfs_factory, bg, tmp_path):
    """The guarded mount point with nothing on it is a restart in progress."""
    m = start(lockfs_factory)
    crash(m, 'sigkill')
    marker = tmp_path / 'ran'
    b = bg([LOCKCTL, '--mount', m.mnt, 'run', 'y', '--', 'touch', str(marker)])
    with pytest.raises(AssertionError, match='did not end'):
        b.wait(timeout=0.5)                          # still waiting, not exit 69
    m2 = lockfs_factory.restart(m)
    assert b.wait() == 0, b.err
    assert marker.exists()
    wait_free(m2, 'y')


@pytest.mark.parametrize('dead', ['unmounted', 'dead-mount'])
def test_no_daemon_comes_back_fails_after_the_bound_with_one_line(lockfs_factory, procs, bg,
                                                                  tmp_path, dead):
    m = start(lockfs_factory)
    holder = procs.agent()
    assert holder.mkdir(m.path('x')) == 0
    b = waiting_lockctl(bg, m, 'run', 'x', tmp_path / 'ran', extra=('--restart-wait', '1.5'))
    t0 = time.monotonic()
    if dead == 'unmounted':
        crash(m, 'sigkill')
    else:
        m.proc.send_signal(signal.SIGKILL)           # the dead mount stays: ENOTCONN
        m.proc.wait()
    try:
        rc = b.wait(timeout=20)
        took = time.monotonic() - t0
    finally:
        if dead != 'unmounted':
            m.kill9(lazy=True)                       # reaped already: just unmounts
    assert rc == EX_UNAVAILABLE, (rc, b.err)
    assert 1.5 <= took < 6, took
    line = one_error_line(SimpleNamespace(stderr=b.err.encode()), 'x', '1.5')
    assert ('not connected' in line) == (dead == 'dead-mount'), line
    assert not (tmp_path / 'ran').exists()


def test_the_bound_comes_from_the_environment(lockfs_factory, procs, bg, tmp_path):
    m = start(lockfs_factory)
    crash(m, 'sigkill')
    t0 = time.monotonic()
    r = lc(m, 'acquire', 'z', env={'LOCKFS_RESTART_WAIT': '0.5'})
    took = time.monotonic() - t0
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert 0.5 <= took < 5, took
    one_error_line(r, 'z', '0.5')
    r = lc(m, 'acquire', 'z', env={'LOCKFS_RESTART_WAIT': 'soon'})
    assert r.returncode == 64, r.stderr
    one_error_line(r, 'LOCKFS_RESTART_WAIT')


def test_a_lock_held_across_a_restart_stays_cmds_and_ends_with_lockctl(lockfs_factory, procs,
                                                                       bg, tmp_path):
    m = start(lockfs_factory)
    b, info = start_blocked_run(bg, m, tmp_path, 'deploy')
    bg.track(info['pid'])
    crash(m, 'sigkill')
    m2 = lockfs_factory.restart(m)
    # the lock survived in DIR and the new daemon rebound it to lockctl's
    # process, which (with CMD) still has the old descriptor
    o = read_owner(m2.mnt, 'deploy')
    assert (o['bound'], o['holder']['pid']) == ('process', b.pid)
    assert procs.agent().mkdir(m2.path('deploy')) == errno.EEXIST
    assert b.proc.poll() is None and os.path.exists(f'/proc/{info["pid"]}')  # CMD not killed
    go(tmp_path)
    assert b.wait() == 0
    line = one_error_line(SimpleNamespace(stderr=b.err.encode()), 'deploy')
    assert 'restart' in line, line
    wait_free(m2, 'deploy')
    ends = [l for l in log_for(m2.dir, 'deploy') if l.event in ('released', 'recovered')]
    assert len(ends) == 1 and ends[0].event == 'recovered', ends
    assert evidence(ends[0]) & {'exited', 'closed'}, ends[0]


# --------------------------------------------------------------------------
# the README's mkdir loop ("In a script")

def readme_loop(mnt):
    """The README's `mkdir` loop, up to its `done`, on MNT; then it prints
    the owner record of the lock it took."""
    text = open(os.path.join(SOURCE_ROOT, 'README.md')).read()
    blocks = re.findall(r'```sh\n(.*?)```', text, re.S)
    loop = [b for b in blocks if 'mkdir /locks/deploy 2>"$err"' in b]
    assert len(loop) == 1, 'the README has no single mkdir loop sample'
    body = loop[0].split('\ndone\n')[0] + '\ndone\ncat /locks/deploy/owner\n'
    return body.replace('/locks/', mnt.rstrip('/') + '/')


def start_loop(bg, m, tmpdir, env=None):
    """The loop in bash, its mktemp file in TMPDIR; (Bg, the err file)."""
    b = bg(['bash', '-c', readme_loop(m.mnt)], env=dict(env or {}, TMPDIR=str(tmpdir)))
    return b


def loop_saw(tmpdir, words):
    for n in os.listdir(tmpdir):
        try:
            with open(os.path.join(tmpdir, n)) as f:
                if words in f.read():
                    return True
        except OSError:
            pass
    return False


@pytest.mark.parametrize('dead', ['unmounted', 'dead-mount'])
def test_the_readme_mkdir_loop_waits_through_a_restart(lockfs_factory, procs, bg, tmp_path,
                                                       dead):
    m = start(lockfs_factory)
    holder = procs.agent()
    assert holder.mkdir(m.path('deploy')) == 0
    t = tmp_path / 'tmp'
    t.mkdir()
    b = start_loop(bg, m, t)
    wait_until(lambda: loop_saw(t, 'File exists'), timeout=10, what='the loop to meet EEXIST')
    if dead == 'unmounted':
        crash(m, 'sigkill')
        seen = 'not permitted'
    else:
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
        seen = 'not connected'
    # the loop meets the outage, and must not give up on it
    wait_until(lambda: loop_saw(t, seen) or b.proc.poll() is not None, timeout=10,
               what=f'the loop to meet {seen!r}')
    if dead != 'unmounted':
        m.kill9(lazy=True)                           # reaped already: just unmounts
    assert b.proc.poll() is None, (b.wait(), b.err)
    m2 = lockfs_factory.restart(m)
    assert holder.rmdir(m2.path('deploy')) == 0
    assert b.wait() == 0, b.err
    assert b.err == ''
    assert json.loads(b.out)['holder']['pid'] == b.pid


def test_the_readme_mkdir_loop_gives_up_after_its_bound(lockfs_factory, bg, tmp_path):
    m = start(lockfs_factory)
    crash(m, 'sigkill')
    t = tmp_path / 'tmp'
    t.mkdir()
    t0 = time.monotonic()
    b = start_loop(bg, m, t, env={'LOCKFS_RESTART_WAIT': '2'})
    assert b.wait() == 1
    assert time.monotonic() - t0 >= 2
    assert b.out == '' and b.err.count('\n') == 1 and 'not permitted' in b.err, b.err


def test_every_option_of_run_together_across_a_restart(lockfs_factory, procs, bg, tmp_path):
    """--slug (a re-exec), --timeout, --restart-wait and --shared at once: the
    timeout counts the restart, the slug names the holder on the new mount."""
    m = start(lockfs_factory)
    holder = procs.agent()
    assert holder.mkdir(m.path('x')) == 0
    b = bg([LOCKCTL, '--mount', m.mnt, 'run', 'x', '--slug', 'agent-5', '--timeout', '60',
            '--restart-wait', '20', '--shared', '--', 'cat', m.path('x', 'owner')])
    wait_until(lambda: len(waiters(m, 'x')) == 1 or b.proc.poll() is not None, timeout=10,
               what='lockctl to wait in line')
    crash(m, 'sigkill')
    m2 = lockfs_factory.restart(m)
    wait_until(lambda: len(waiters(m2, 'x')) == 1 or b.proc.poll() is not None, timeout=10,
               what='lockctl to queue again')
    assert holder.rmdir(m2.path('x')) == 0
    assert b.wait() == 0, b.err
    o = json.loads(b.out)
    assert (o['mode'], o['slug'], o['bound']) == ('shared', 'agent-5', 'fd')


def test_the_timeout_counts_the_time_the_daemon_is_away(lockfs_factory, bg):
    m = start(lockfs_factory)
    crash(m, 'sigkill')
    t0 = time.monotonic()
    r = lc(m, 'run', 'x', '--timeout', '0.5', '--restart-wait', '20', '--', 'true')
    assert r.returncode == 75, r.stderr
    assert 0.5 <= time.monotonic() - t0 < 5
    one_error_line(r, 'timed out', 'away')
