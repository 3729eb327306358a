"""Issue 8 point 5: nothing in DIR is trusted.

"Observed: a hard link planted by root in DIR/.lockfs-free.X/owner.json
pointing to a file elsewhere made the next mkdir overwrite that file with the
record, token included.  Create every file in DIR fresh
(O_CREAT|O_EXCL|O_NOFOLLOW), never reuse one with a link count above one."

What is planted here is what only DIR's owner (root) could plant: the point
is that the daemon never writes through it to anything outside DIR, never
hands a lock directory that is not its own to a holder, and never blocks on
it.  A kept (pooled) directory that was tampered with is dropped, not reused.
The daemon's own files in DIR (`.lockfs`, a fence file) are refused at start
when they are not plain files of the daemon's own with one link.
"""

import json
import os
import stat
import subprocess
import time

import pytest

from lockfs_helpers import LOCKFS_BIN, read_owner, run_expect_refusal

VICTIM_TEXT = b'precious: nothing of lockfs may land here\n'


def _victim(tmp_path):
    p = tmp_path / 'victim'
    p.write_bytes(VICTIM_TEXT)
    os.chmod(p, 0o644)
    return str(p)


def _pooled(m):
    """The one released lock directory the daemon keeps for reuse."""
    kept = [n for n in os.listdir(m.dir) if n.startswith('.lockfs-free.')]
    assert len(kept) == 1, f'expected one kept directory in DIR, found {kept}'
    return os.path.join(m.dir, kept[0])


def _mkdir_bounded(m, name, fifo=None, timeout=5.0):
    """mkdir M/NAME in a child; errno (0 = success).  A daemon stuck opening a
    planted FIFO is freed by opening its read end, and the test fails."""
    p = subprocess.Popen(['mkdir', m.path(name)], stderr=subprocess.PIPE)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        if fifo:
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)
        p.wait(10)
        pytest.fail(f'mkdir {name} hung for {timeout}s (the daemon opened a planted FIFO?)')
    return p.returncode


def _plant_record(pooled, kind, victim, users):
    rec = os.path.join(pooled, 'owner.json')
    if os.path.lexists(rec):
        os.unlink(rec)
    if kind == 'hard-link':
        os.link(victim, rec)
    elif kind == 'symlink':
        os.symlink(victim, rec)
    elif kind == 'fifo':
        os.mkfifo(rec, 0o600)
        return rec
    elif kind == 'foreign-file':
        with open(rec, 'wb') as f:
            f.write(b'{}\n')
        os.chown(rec, users[0].uid, users[0].gid)
        os.chmod(rec, 0o666)
    return None


def _assert_fresh_lock(m, name):
    """DIR/NAME.lock is a directory of the daemon's own holding nothing but a
    fresh record file (one link, mode 0600, the daemon's uid)."""
    d = m.lockdir(name)
    st = os.lstat(d)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid(), (st, d)
    assert not st.st_mode & 0o022, f'{d} is writable by others: {oct(st.st_mode)}'
    assert os.listdir(d) == ['owner.json'], os.listdir(d)
    rst = os.lstat(os.path.join(d, 'owner.json'))
    assert stat.S_ISREG(rst.st_mode) and rst.st_nlink == 1, rst
    assert (rst.st_uid, stat.S_IMODE(rst.st_mode)) == (os.geteuid(), 0o600), rst
    assert read_owner(m.mnt, name)['resource'] == name


@pytest.mark.parametrize('kind', ['hard-link', 'symlink', 'fifo', 'foreign-file'])
def test_a_record_planted_in_a_kept_directory_is_never_written_through(mnt, tmp_path,
                                                                        users, kind):
    victim = _victim(tmp_path)
    os.mkdir(mnt.path('x'))
    os.rmdir(mnt.path('x'))
    pooled = _pooled(mnt)
    fifo = _plant_record(pooled, kind, victim, users)
    assert _mkdir_bounded(mnt, 'y', fifo) == 0
    with open(victim, 'rb') as f:
        assert f.read() == VICTIM_TEXT, 'the record was written through the planted file'
    _assert_fresh_lock(mnt, 'y')
    assert not os.path.lexists(pooled), 'a tampered kept directory must be dropped'
    assert os.stat(victim).st_nlink == 1
    os.rmdir(mnt.path('y'))


@pytest.mark.parametrize('kind', ['symlink-to-a-directory', 'directory-of-another-user',
                                  'group-writable-directory'])
def test_a_kept_directory_that_is_not_ours_any_more_is_dropped(mnt, tmp_path, users, kind):
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    os.mkdir(mnt.path('x'))
    os.rmdir(mnt.path('x'))
    pooled = _pooled(mnt)
    subprocess.run(['rm', '-rf', pooled], check=True)
    if kind == 'symlink-to-a-directory':
        os.symlink(str(elsewhere), pooled)
    elif kind == 'directory-of-another-user':
        os.mkdir(pooled, 0o755)
        os.chown(pooled, users[0].uid, users[0].gid)
    else:
        os.mkdir(pooled)
        os.chmod(pooled, 0o775)
    assert _mkdir_bounded(mnt, 'y') == 0
    assert os.listdir(elsewhere) == []
    _assert_fresh_lock(mnt, 'y')
    assert not os.path.lexists(pooled), 'a kept directory not of ours must be dropped'
    os.rmdir(mnt.path('y'))


def _refusal(tmp_path, scratch_dir, backing, options=()):
    mnt = os.path.join(scratch_dir, 'm')
    os.mkdir(mnt)
    cmd = [LOCKFS_BIN, '-f', '-o', f'backing={backing}']
    for o in options:
        cmd += ['-o', o]
    return run_expect_refusal(cmd + [mnt], mnt)


def _plant_file(path, kind, victim, users, text=None):
    if kind == 'hard-link':
        os.link(victim, path)
    elif kind == 'symlink':
        os.symlink(victim, path)
    elif kind == 'fifo':
        os.mkfifo(path, 0o600)
    elif kind == 'foreign-file':
        with open(path, 'wb') as f:
            f.write(text or b'')
        os.chown(path, users[0].uid, users[0].gid)


@pytest.mark.parametrize('kind', ['hard-link', 'symlink', 'fifo', 'foreign-file'])
def test_a_planted_daemon_lock_file_refuses_the_start(tmp_path, scratch_dir, users, kind):
    """DIR/.lockfs is truncated and rewritten with the daemon's pid: a hard
    link there would let the daemon overwrite any file."""
    victim = _victim(tmp_path)
    backing = tmp_path / 'backing'
    backing.mkdir(mode=0o700)
    _plant_file(str(backing / '.lockfs'), kind, victim, users)
    rc, err = _refusal(tmp_path, scratch_dir, str(backing))
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and '.lockfs' in lines[0], err
    with open(victim, 'rb') as f:
        assert f.read() == VICTIM_TEXT


@pytest.mark.parametrize('kind', ['hard-link', 'symlink', 'fifo', 'foreign-file'])
def test_a_planted_fence_file_refuses_the_start(tmp_path, scratch_dir, users, kind):
    """The fence counter is rewritten in place: a fence file with other links
    (or not a plain file of the daemon's own) is refused, not used."""
    victim = tmp_path / 'victim'
    victim.write_bytes(b'00000000000000000007\n')
    backing = tmp_path / 'backing'
    backing.mkdir(mode=0o700)
    _plant_file(str(backing / '.fence'), kind, str(victim), users,
                text=b'00000000000000000007\n')
    rc, err = _refusal(tmp_path, scratch_dir, str(backing), options=['fence_file=.fence'])
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and 'fence' in lines[0], err
    assert victim.read_bytes() == b'00000000000000000007\n'
