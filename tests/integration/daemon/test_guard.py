"""Issue 9 point 1: never a silent non-lock.

While lockfs does not serve its mount point M (stopped, killed under
`-o auto_unmount`, never started), M is a plain directory, and root's
`mkdir M/x` used to succeed: a script went on "holding" a lock that does
not exist.  The daemon now makes M's directory immutable before it mounts
(and never clears it), and `lockfs --guard M` does so before any daemon
ran.  Each case is checked on the host path and through a bind mount of M
made in another mount namespace (`unshare --mount`).

The harness clears the flag again in teardown (`unguard`), so that no test
leaves a directory in /tmp that even root cannot remove.
"""

import ctypes
import errno
import fcntl
import os
import signal
import struct
import subprocess

import pytest

from lockfs_helpers import (FS_IMMUTABLE_FL, FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, LOCKFS_BIN,
                            is_guarded, mount_entry, wait_until)


def _mkdir_errno(path):
    try:
        os.mkdir(path)
    except OSError as e:
        return e.errno
    os.rmdir(path)
    return 0


def _mkdir_through_bind_in_new_namespace(mnt, bind):
    """mkdir BIND/x in a new mount namespace where BIND is a bind mount of
    MNT; returns (exit status of mkdir, its stderr)."""
    r = subprocess.run(['unshare', '--mount', '--propagation', 'private', 'sh', '-c',
                        'mount --bind "$1" "$2" || exit 99; mkdir "$2/x"', 'sh', mnt, bind],
                       capture_output=True, text=True, timeout=10,
                       env=dict(os.environ, LC_ALL='C'))
    assert r.returncode != 99, f'bind mount failed: {r.stderr}'
    return r.returncode, r.stderr


def _stopped_by_sigterm(lockfs_factory, scratch_dir):
    m = lockfs_factory()
    assert m.signal(signal.SIGTERM) == 0
    return m.mnt


def _killed_under_auto_unmount(lockfs_factory, scratch_dir):
    m = lockfs_factory(options=['auto_unmount'])
    m.stopped = True
    m.proc.kill()
    m.proc.wait()
    wait_until(lambda: mount_entry(m.mnt) is None, timeout=15,  # fusermount3's helper, a separate process: slow under load
               what='auto_unmount to unmount the dead mount')
    return m.mnt


def _never_started(lockfs_factory, scratch_dir):
    mnt = os.path.join(scratch_dir, 'locks')
    os.mkdir(mnt)
    r = subprocess.run([LOCKFS_BIN, '--guard', mnt], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and r.stderr == '', r.stderr
    return mnt


CASES = {'stopped-by-sigterm': _stopped_by_sigterm,
         'killed-under-auto_unmount': _killed_under_auto_unmount,
         'never-started': _never_started}


@pytest.mark.parametrize('case', CASES)
def test_mkdir_in_an_unserved_mount_point_fails(scratch_dir, lockfs_factory, case):
    mnt = CASES[case](lockfs_factory, scratch_dir)
    assert mount_entry(mnt) is None
    assert _mkdir_errno(os.path.join(mnt, 'x')) == errno.EPERM
    assert os.listdir(mnt) == []


@pytest.mark.parametrize('case', CASES)
def test_mkdir_through_a_bind_mount_in_another_namespace_fails(scratch_dir, lockfs_factory,
                                                                case):
    mnt = CASES[case](lockfs_factory, scratch_dir)
    bind = os.path.join(scratch_dir, 'bind')
    os.mkdir(bind)
    rc, err = _mkdir_through_bind_in_new_namespace(mnt, bind)
    assert rc != 0 and 'Operation not permitted' in err, err
    assert os.listdir(mnt) == []


def test_daemon_still_mounts_over_its_guarded_mount_point(lockfs_factory):
    m = lockfs_factory()
    os.mkdir(m.path('x'))
    os.rmdir(m.path('x'))
    assert m.unmount() == 0
    assert is_guarded(m.mnt)
    m2 = lockfs_factory(backing=m.dir, mountpoint=m.mnt)
    os.mkdir(m2.path('x'))
    assert os.path.isdir(m2.lockdir('x'))
    os.rmdir(m2.path('x'))


def _open_under_mount(path):
    """An fd on the directory under the mount at PATH (a detached copy of
    the parent's mount: open_tree(2), as `lockfs --guard` does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        tree = libc.syscall(428, parent, b'', 1 | os.O_CLOEXEC | 0x1000)  # CLONE, EMPTY_PATH
        if tree < 0:
            raise OSError(ctypes.get_errno(), 'open_tree')
    finally:
        os.close(parent)
    try:
        return os.open(os.path.basename(path), os.O_RDONLY | os.O_DIRECTORY, dir_fd=tree)
    finally:
        os.close(tree)


def test_guard_reaches_under_a_running_lockfs(lockfs_factory):
    """`lockfs --guard M` works while lockfs serves M (setup run again)."""
    m = lockfs_factory()
    fd = _open_under_mount(m.mnt)
    try:
        flags = struct.unpack('i', fcntl.ioctl(fd, FS_IOC_GETFLAGS, b'\0' * 4))[0]
        assert flags & FS_IMMUTABLE_FL, 'the daemon did not guard its mount point'
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack('i', flags & ~FS_IMMUTABLE_FL))
    finally:
        os.close(fd)
    r = subprocess.run([LOCKFS_BIN, '--guard', m.mnt], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0 and r.stderr == '', r.stderr
    m.assert_alive()
    assert m.unmount() == 0
    assert is_guarded(m.mnt)


def test_unguarded_control_mkdir_succeeds(scratch_dir):
    """The premise: without the flag root's mkdir in a plain directory works."""
    mnt = os.path.join(scratch_dir, 'plain')
    os.mkdir(mnt)
    assert not is_guarded(mnt)
    assert _mkdir_errno(os.path.join(mnt, 'x')) == 0


@pytest.mark.parametrize('arg, message', [
    ('missing', 'No such file or directory'),
    ('file', 'Not a directory'),
])
def test_guard_refuses_bad_mount_points(scratch_dir, arg, message):
    path = os.path.join(scratch_dir, arg)
    if arg == 'file':
        open(path, 'w').close()
    r = subprocess.run([LOCKFS_BIN, '--guard', path], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 1
    assert r.stderr.count('\n') == 1 and message in r.stderr, r.stderr


def test_guard_usage(scratch_dir):
    r = subprocess.run([LOCKFS_BIN, '--guard'], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and 'usage' in r.stderr, r.stderr


def test_guard_as_an_ordinary_user_says_it_needs_root(scratch_dir, users):
    u = users[0]
    mnt = os.path.join(scratch_dir, 'theirs')
    os.mkdir(mnt)
    os.chown(mnt, u.uid, u.gid)
    r = subprocess.run([LOCKFS_BIN, '--guard', mnt], capture_output=True, text=True,
                       timeout=10, user=u.uid, group=u.gid, extra_groups=[])
    assert r.returncode == 1 and 'only root' in r.stderr, r.stderr
    assert not is_guarded(mnt)


@pytest.fixture
def ramfs_dir(scratch_dir):
    """A directory on ramfs, which has no inode flags to set."""
    d = os.path.join(scratch_dir, 'ramfs')
    os.mkdir(d)
    subprocess.run(['mount', '-t', 'ramfs', 'ramfs', d], check=True)
    os.chmod(d, 0o755)
    yield d
    subprocess.run(['umount', '-l', d], stderr=subprocess.DEVNULL)


def test_daemon_says_loudly_when_it_cannot_guard(ramfs_dir, lockfs_factory):
    mnt = os.path.join(ramfs_dir, 'locks')
    os.mkdir(mnt)
    m = lockfs_factory(mountpoint=mnt)
    lines = [l for l in m.stderr().splitlines() if 'not guarded' in l]
    assert len(lines) == 1, m.stderr()
    assert lines[0] == (f'lockfs: warning: mount point {mnt} is not guarded (its file system '
                        f'cannot make a directory immutable): whenever lockfs is not mounted '
                        f'there, `mkdir {mnt}/NAME` makes a plain directory, which is no lock; '
                        f'guard it as root with `lockfs --guard {mnt}`')
    os.mkdir(m.path('x'))  # and it serves all the same
    os.rmdir(m.path('x'))
    assert m.unmount() == 0
