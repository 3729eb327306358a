"""Command line, start-up checks and shutdown of the daemon."""

import os
import signal
import subprocess

import pytest

from lockfs_helpers import (LOCKFS_BIN, fusermount_u, is_lockfs_mounted, mount_entry,
                            proc_mounts_type, run_expect_refusal, wait_until)


def _refusal(backing, mnt):
    rc, err = run_expect_refusal([LOCKFS_BIN, '-f', '-o', f'backing={backing}', mnt], mnt)
    lines = err.splitlines()
    assert rc != 0, f'daemon exited 0 on backing={backing}; stderr: {err!r}'
    assert len(lines) == 1 and lines[0].strip(), \
        f'expected exactly one line on stderr, got {len(lines)}: {err!r}'
    assert mount_entry(mnt) is None, f'{mnt} is mounted after a refused start'
    return lines[0]


def _mountpoint(scratch_dir, name='mnt'):
    m = os.path.join(scratch_dir, name)
    os.mkdir(m)
    return m


def test_missing_backing_dir_is_refused(scratch_dir):
    _refusal(os.path.join(scratch_dir, 'does-not-exist'), _mountpoint(scratch_dir))


def test_file_as_backing_dir_is_refused(scratch_dir):
    f = os.path.join(scratch_dir, 'a-file')
    with open(f, 'w'):
        pass
    os.chmod(f, 0o600)
    _refusal(f, _mountpoint(scratch_dir))


@pytest.mark.parametrize('mode', [0o770, 0o720, 0o707, 0o702, 0o777, 0o1777],
                         ids=lambda m: oct(m))
def test_group_or_world_writable_backing_dir_is_refused(scratch_dir, mode):
    d = os.path.join(scratch_dir, 'backing')
    os.mkdir(d)
    os.chmod(d, mode)
    _refusal(d, _mountpoint(scratch_dir))


def test_backing_dir_of_another_user_is_refused(scratch_dir):
    """Mode 0755, but its owner (uid 65534 here) could write it."""
    d = os.path.join(scratch_dir, 'backing')
    os.mkdir(d)
    os.chmod(d, 0o755)
    os.chown(d, 65534, 65534)
    assert '65534' in _refusal(d, _mountpoint(scratch_dir))


def test_backing_dir_mode_0755_is_accepted(lockfs_factory, tmp_path):
    """Negative control for the mode checks: others may read, not write."""
    d = tmp_path / 'backing-0755'
    d.mkdir()
    os.chmod(d, 0o755)
    m = lockfs_factory(backing=str(d))
    os.mkdir(m.path('x'))
    os.rmdir(m.path('x'))


@pytest.fixture
def readonly_dir(scratch_dir):
    """A 0700 directory on a small tmpfs that is then remounted read-only."""
    fs = os.path.join(scratch_dir, 'rofs')
    os.mkdir(fs)
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m,mode=0755', 'tmpfs', fs],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f'cannot mount a tmpfs here: {r.stderr!r}')
    try:
        d = os.path.join(fs, 'backing')
        os.mkdir(d)
        os.chmod(d, 0o700)
        subprocess.run(['mount', '-o', 'remount,ro', fs], check=True)
        with pytest.raises(OSError):  # the premise: even root cannot write here
            os.mkdir(os.path.join(d, 'probe'))
        yield d
    finally:
        subprocess.run(['umount', fs], check=True)


def test_readonly_backing_dir_is_refused(scratch_dir, readonly_dir):
    _refusal(readonly_dir, _mountpoint(scratch_dir))


def test_second_daemon_on_same_dir_is_refused(lockfs_factory, scratch_dir):
    first = lockfs_factory()
    _refusal(first.dir, _mountpoint(scratch_dir, 'second'))
    first.assert_alive()
    os.mkdir(first.path('still-works'))
    assert os.path.isdir(first.lockdir('still-works'))
    os.rmdir(first.path('still-works'))
    assert not os.path.exists(first.lockdir('still-works'))


def test_two_daemons_on_different_dirs_both_run(lockfs_factory):
    """Negative control for the one-daemon-per-dir refusal."""
    a = lockfs_factory()
    b = lockfs_factory()
    os.mkdir(a.path('x'))
    os.mkdir(b.path('x'))
    assert os.path.isdir(a.lockdir('x')) and os.path.isdir(b.lockdir('x'))
    os.rmdir(a.path('x'))
    os.rmdir(b.path('x'))


def test_mount_type_in_proc_mounts_is_fuse_lockfs(mnt):
    assert proc_mounts_type(mnt.mnt) == 'fuse.lockfs'


def test_mount_source_is_backing_dir(mnt):
    assert mount_entry(mnt.mnt)[1] == mnt.dir


@pytest.mark.parametrize('stop', [signal.SIGTERM, signal.SIGINT, 'fusermount3 -u'],
                         ids=['SIGTERM', 'SIGINT', 'fusermount3'])
def test_stopping_unmounts_and_exits_0(lockfs_factory, stop):
    m = lockfs_factory()
    os.mkdir(m.path('held'))
    assert (m.unmount() if stop == 'fusermount3 -u' else m.signal(stop)) == 0
    assert mount_entry(m.mnt) is None, 'still mounted after the daemon exited'


def _find_daemon(argv):
    """PIDs of processes whose argv is exactly ARGV."""
    want = b'\0'.join(os.fsencode(a) for a in argv) + b'\0'
    pids = []
    for p in os.listdir('/proc'):
        if not p.isdigit():
            continue
        try:
            with open(f'/proc/{p}/cmdline', 'rb') as f:
                if f.read() == want:
                    pids.append(int(p))
        except OSError:
            pass
    return pids


def test_without_f_detaches_with_mount_ready(scratch_dir, tmp_path):
    backing = tmp_path / 'backing'
    backing.mkdir()
    os.chmod(backing, 0o700)
    mnt = _mountpoint(scratch_dir)
    argv = [LOCKFS_BIN, '-o', f'backing={backing}', mnt]
    err_path = tmp_path / 'stderr'
    try:
        with open(err_path, 'wb') as ef:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=ef, timeout=10)
        assert r.returncode == 0, f'stderr: {err_path.read_text()!r}'
        # ready when the command returns: no waiting here
        assert is_lockfs_mounted(mnt)
        os.mkdir(os.path.join(mnt, 'x'))
        assert os.path.isdir(backing / 'x.lock')
        os.rmdir(os.path.join(mnt, 'x'))
        pids = _find_daemon(argv)
        assert len(pids) == 1, f'detached daemon not found (or several): {pids}'
        pid = pids[0]
        assert subprocess.run(['fusermount3', '-u', mnt]).returncode == 0
        wait_until(lambda: not os.path.exists(f'/proc/{pid}') or _is_zombie(pid),
                   timeout=10, what=f'detached daemon {pid} to exit')
    finally:
        if mount_entry(mnt) is not None:
            fusermount_u(mnt)
    assert mount_entry(mnt) is None


def _is_zombie(pid):
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            data = f.read()
        return data[data.rindex(b')') + 2:].split()[0] == b'Z'
    except OSError:
        return True
