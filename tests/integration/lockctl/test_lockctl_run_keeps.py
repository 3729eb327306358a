"""Issue 22 point 4: a lock taken by `lockctl run` protects CMD for as long
as CMD runs, whatever happens to lockctl.

CMD shares lockctl's open file of M/.flock/NAME (as `flock(1)` does), so the
lock, which belongs to that open file description, lasts while CMD has it:
SIGKILL of lockctl releases nothing, and CMD's end (the last close) ends it,
logged `released`.  The daemon never recovers it meanwhile, also when the
recorded holder is lockctl itself (a uid boundary makes it so) and is dead.
While lockctl lives, its own unlock after CMD ends ends the lock at once,
even if CMD left a process behind that still has the descriptor.
"""

import errno
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lockfs_helpers import log_for, read_owner, stays_held, wait_until  # noqa: E402
from test_lockctl import (EX_TEMPFAIL, LOCKCTL, bg, blocker_cmd, go, lc,  # noqa: E402,F401
                          start_blocked_run, wait_free)

# How long the negative checks watch for a release that must not come.
WATCH_S = 1.0


def lock_events(m, name):
    return [(l.event, l.details.get('fence')) for l in log_for(m.dir, name)
            if l.event in ('acquired', 'released', 'recovered', 'broken', 'rebound')]


def gone(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(') ', 1)[1].startswith('Z')
    except FileNotFoundError:
        return True


def assert_held_for_others(m, name):
    """A newcomer finds NAME taken, by mkdir and by lockctl run."""
    with pytest.raises(FileExistsError):
        os.mkdir(m.path(name))
    r = lc(m, 'run', name, '--timeout', '0.3', '--', 'true')
    assert r.returncode == EX_TEMPFAIL, (r.returncode, r.stderr)


@pytest.mark.parametrize('extra', [(), ('--slug', 'agent-9')], ids=['plain', 'slug'])
def test_sigkill_of_lockctl_leaves_the_lock_with_cmd(mnt, tmp_path, bg, extra):
    b, info = start_blocked_run(bg, mnt, tmp_path, 'deploy', extra=extra)
    bg.track(info['pid'])
    owner = info['owner']
    assert (owner['bound'], owner['holder']['pid']) == ('fd', os.getpid())
    if extra:
        assert owner['slug'] == 'agent-9'

    os.kill(b.pid, signal.SIGKILL)
    assert b.proc.wait(10) == -signal.SIGKILL
    assert not gone(info['pid'])
    assert stays_held(mnt, 'deploy', WATCH_S), 'released while CMD still runs'
    assert_held_for_others(mnt, 'deploy')
    assert read_owner(mnt.mnt, 'deploy')['fence'] == owner['fence']
    assert [e for e, _ in lock_events(mnt, 'deploy')] == ['acquired']
    # what keeps it: CMD shares lockctl's open file of the lock
    assert mnt.path('.flock', 'deploy') in info['fds'].values(), info['fds']

    go(tmp_path)                       # CMD ends: its close is the last one
    wait_until(lambda: gone(info['pid']), timeout=10, what='CMD to exit')
    wait_free(mnt, 'deploy')
    fence = str(owner['fence'])
    assert lock_events(mnt, 'deploy') == [('acquired', fence), ('released', fence)]
    r = lc(mnt, 'run', 'deploy', '--timeout', '0', '--', 'true')
    assert r.returncode == 0, r.stderr


def fd_targets(pid):
    """What PID's descriptors name (one closed meanwhile is left out)."""
    out = []
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            out.append(os.readlink(f'/proc/{pid}/fd/{fd}'))
        except FileNotFoundError:
            pass
    return out


def test_lockctl_alive_ends_the_lock_when_cmd_ends_even_if_cmd_left_a_child(mnt, tmp_path,
                                                                              bg):
    """A background child that CMD leaves behind with the descriptor does not
    keep the lock: lockctl unlocks the shared open file when CMD exits."""
    pidfile = tmp_path / 'child'
    b = bg([LOCKCTL, '--mount', mnt.mnt, 'run', 'leak', '--', 'sh', '-c',
            f'sleep 30 </dev/null >/dev/null 2>&1 & echo $! > {pidfile}'],
           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert b.wait() == 0, b.err
    child = int(pidfile.read_text())
    bg.track(child)
    assert not gone(child)
    # The child may still be between fork and exec (sh sets up its
    # redirections there, closing descriptors as we read them): look until
    # it runs sleep, then at what it holds.
    wait_until(lambda: open(f'/proc/{child}/comm').read().strip() == 'sleep', 10,
               what='the background child to run sleep')
    assert mnt.path('.flock', 'leak') in fd_targets(child)
    wait_free(mnt, 'leak')
    assert [e for e, _ in lock_events(mnt, 'leak')] == ['acquired', 'released']


def test_a_dead_lockctl_recorded_as_holder_is_not_recovered_while_cmd_runs(mnt_ao, scratch_dir,
                                                                             bg, users):
    """Across a uid boundary lockctl is the holder itself (`setpriv` is no
    helper, and lockctl's parent runs as another uid).  Its death is not a
    reason to recover the lock while CMD holds the descriptor."""
    u = users[0]
    d = pathlib.Path(scratch_dir, 'shared')
    d.mkdir()
    os.chmod(d, 0o777)
    pre = ['setpriv', f'--reuid={u.uid}', f'--regid={u.gid}', '--clear-groups']
    b = bg(pre + [LOCKCTL, '--mount', mnt_ao.mnt, 'run', 'nobody', '--',
                  *blocker_cmd(d), mnt_ao.mnt, 'nobody'])
    info_path = d / 'cmd.json'
    wait_until(lambda: info_path.exists() or b.proc.poll() is not None, timeout=10,
               what='CMD to start')
    assert info_path.exists(), (b.wait(), b.err)
    info = json.loads(info_path.read_text())
    bg.track(info['pid'])
    owner = info['owner']
    assert owner['holder']['comm'] == 'lockctl' and owner['holder']['uid'] == u.uid
    assert owner['holder']['pid'] == b.pid      # setpriv execs lockctl

    os.kill(b.pid, signal.SIGKILL)
    assert b.proc.wait(10) == -signal.SIGKILL
    assert stays_held(mnt_ao, 'nobody', WATCH_S), 'recovered while CMD still runs'
    assert_held_for_others(mnt_ao, 'nobody')
    assert [e for e, _ in lock_events(mnt_ao, 'nobody')] == ['acquired']
    # lockctl status says who keeps it now
    r = lc(mnt_ao, 'status', 'nobody')
    assert r.returncode == 0, r.stderr
    assert f'lockctl(gone,fd:python3[{info["pid"]}])' in r.stdout.decode(), r.stdout

    (d / 'cmd.go').touch()
    wait_until(lambda: gone(info['pid']), timeout=10, what='CMD to exit')
    wait_free(mnt_ao, 'nobody')
    assert [e for e, _ in lock_events(mnt_ao, 'nobody')] == ['acquired', 'released']


def host_pid_of(argv):
    """The pid (here) of the one process whose command line is ARGV."""
    want = b'\0'.join(os.fsencode(a) for a in argv) + b'\0'
    found = []
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                with open(f'/proc/{p}/cmdline', 'rb') as f:
                    if f.read() == want:
                        found.append(int(p))
            except OSError:
                pass
    assert len(found) == 1, found
    return found[0]


def test_in_a_pid_namespace_a_killed_lockctl_leaves_the_lock_with_cmd(mnt, tmp_path, bg):
    """The same in a pid namespace of its own (a container's): lockctl runs
    under the namespace's init (bash), which adopts CMD when lockctl dies."""
    argv = [LOCKCTL, '--mount', mnt.mnt, 'run', 'ns', '--', *blocker_cmd(tmp_path), mnt.mnt, 'ns']
    # bash, the namespace's init, outlives lockctl (until its stdin closes):
    # when init exits, the kernel kills the whole namespace, CMD included
    script = shlex.join(argv) + '; echo "lockctl: $?"; read -r _'
    b = bg(['unshare', '--pid', '--fork', '--mount-proc', 'bash', '-c', script],
           stdin=subprocess.PIPE)
    info_path = tmp_path / 'cmd.json'
    wait_until(lambda: info_path.exists() or b.proc.poll() is not None, timeout=10,
               what='CMD to start in the namespace')
    assert info_path.exists(), (b.wait(), b.err)
    lockctl = host_pid_of(argv)
    os.kill(lockctl, signal.SIGKILL)
    wait_until(lambda: gone(lockctl), timeout=10, what='lockctl to die')
    assert stays_held(mnt, 'ns', WATCH_S), 'released while CMD still runs'
    assert_held_for_others(mnt, 'ns')
    go(tmp_path)
    wait_free(mnt, 'ns')
    assert [e for e, _ in lock_events(mnt, 'ns')] == ['acquired', 'released']
    assert b.wait(input=b'\n') == 0
    assert b.out == f'lockctl: {128 + signal.SIGKILL}\n'
