#!/usr/bin/python3
"""Issue 9 review: a detached start (no -f) returns only once the daemon
serves and its pid is in DIR/.lockfs, so a script may read the pid the
moment `lockfs` returns; a start that fails still says why and exits
non-zero."""

import os
import signal
import subprocess
import tempfile

import pytest

from lockfs_helpers import (LOCKFS_BIN, daemon_stderr, fusermount_u, is_lockfs_mounted, mount_entry,
                            read_owner, rmtree_unguarded, wait_until)

ROUNDS = 5          # the race it guards against was lost about every other time


@pytest.fixture
def work():
    d = tempfile.mkdtemp(prefix='lockfs-it-daemonize-')
    os.chmod(d, 0o755)
    os.mkdir(os.path.join(d, 'mnt'))
    os.mkdir(os.path.join(d, 'dir'), 0o700)
    yield d
    mnt = os.path.join(d, 'mnt')
    if mount_entry(mnt) is not None:
        fusermount_u(mnt)
    rmtree_unguarded(d)   # the daemon made mnt immutable (its guard)
    assert not os.path.exists(d), f'{d} left behind'


def _live_lockfs(pid):
    """PID is a live lockfs process with /dev/fuse open."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            stat = f.read()
        fds = [os.readlink(f'/proc/{pid}/fd/{n}') for n in os.listdir(f'/proc/{pid}/fd')]
    except OSError:
        return False
    return ('(lockfs)' in stat and stat.rsplit(')', 1)[1].split()[0] != 'Z'
            and '/dev/fuse' in fds)


def _stop(pid, mnt):
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not os.path.exists(f'/proc/{pid}'), 10, what=f'daemon {pid} to exit')
    wait_until(lambda: mount_entry(mnt) is None, 5, what='the unmount')


def test_detached_start_returns_after_the_daemon_recorded_its_pid_and_serves(work):
    mnt, backing = os.path.join(work, 'mnt'), os.path.join(work, 'dir')
    for _ in range(ROUNDS):
        # capture_output: also proves the daemon lets go of the caller's pipes
        r = subprocess.run([LOCKFS_BIN, '-o', f'backing={backing}', mnt],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 0 and daemon_stderr(r.stderr) == '', r
        with open(os.path.join(backing, '.lockfs')) as f:
            recorded = f.read()
        assert recorded.strip().isdigit(), f'no pid in .lockfs yet: {recorded!r}'
        pid = int(recorded)
        assert _live_lockfs(pid), f'{pid} from .lockfs is not the serving daemon'
        assert is_lockfs_mounted(mnt)
        os.mkdir(os.path.join(mnt, 'x'))
        assert read_owner(mnt, 'x')['holder']['pid'] == os.getpid()
        os.rmdir(os.path.join(mnt, 'x'))
        _stop(pid, mnt)


def test_detached_daemon_leads_its_own_session_and_left_the_callers_directory(work):
    mnt, backing = os.path.join(work, 'mnt'), os.path.join(work, 'dir')
    r = subprocess.run([LOCKFS_BIN, '-o', f'backing={backing}', mnt], cwd=work,
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r
    with open(os.path.join(backing, '.lockfs')) as f:
        pid = int(f.read())
    assert os.getsid(pid) == pid
    assert os.readlink(f'/proc/{pid}/cwd') == '/'
    _stop(pid, mnt)


@pytest.mark.parametrize('bad', ['option', 'mountpoint'])
def test_failed_detached_start_exits_nonzero_with_one_line(work, bad):
    mnt, backing = os.path.join(work, 'mnt'), os.path.join(work, 'dir')
    if bad == 'option':
        args = ['-o', f'backing={backing},lease=0', mnt]
    else:
        args = ['-o', f'backing={backing}', os.path.join(work, 'missing')]
    r = subprocess.run([LOCKFS_BIN, *args], capture_output=True, text=True, timeout=10)
    assert r.returncode != 0
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(('lockfs: ', 'fuse: ')), r.stderr
    assert not is_lockfs_mounted(mnt)
