"""Point 1: mkdir acquires, atomically, compatible with the seed's protocol."""

import errno
import json
import os
import stat

import pytest

from lockfs_helpers import read_owner, temp_dirs_in_backing


def test_mkdir_creates_lock_dir_with_record(mnt):
    assert not os.path.exists(mnt.lockdir('build'))
    os.mkdir(mnt.path('build'))
    assert os.path.isdir(mnt.lockdir('build'))
    with open(os.path.join(mnt.lockdir('build'), 'owner.json'), 'rb') as f:
        rec = json.loads(f.read())
    assert rec['resource'] == 'build'
    assert rec['holder']['pid'] == os.getpid()
    assert os.path.isdir(mnt.path('build'))
    os.rmdir(mnt.path('build'))


def test_backing_record_is_mode_0600(mnt):
    os.mkdir(mnt.path('build'))
    st = os.stat(os.path.join(mnt.lockdir('build'), 'owner.json'))
    assert stat.S_IMODE(st.st_mode) == 0o600
    os.rmdir(mnt.path('build'))


def test_mkdir_leaves_no_temporary_in_backing_dir(mnt):
    for i in range(20):
        os.mkdir(mnt.path(f'n{i}'))
    assert temp_dirs_in_backing(mnt.dir) == []
    for i in range(20):
        os.rmdir(mnt.path(f'n{i}'))
    assert temp_dirs_in_backing(mnt.dir) == []


def test_second_mkdir_is_eexist(mnt, procs):
    os.mkdir(mnt.path('x'))
    with pytest.raises(FileExistsError):
        os.mkdir(mnt.path('x'))
    other = procs.agent()
    assert other.mkdir(mnt.path('x')) == errno.EEXIST
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == os.getpid()
    os.rmdir(mnt.path('x'))


def test_direct_lock_makes_mount_mkdir_eexist(mnt):
    os.mkdir(mnt.lockdir('seed'))  # the seed script's acquisition
    with pytest.raises(FileExistsError):
        os.mkdir(mnt.path('seed'))
    # still the seed's empty lock: not replaced, no record slipped in
    assert os.listdir(mnt.lockdir('seed')) == []


def test_mount_lock_makes_direct_mkdir_eexist(mnt):
    os.mkdir(mnt.path('seed'))
    with pytest.raises(FileExistsError):
        os.mkdir(mnt.lockdir('seed'))
    os.rmdir(mnt.path('seed'))
    # negative control: once released, the seed's mkdir succeeds
    os.mkdir(mnt.lockdir('seed'))
    os.rmdir(mnt.lockdir('seed'))


def test_direct_empty_lock_shows_as_held_with_null_holder(mnt):
    os.mkdir(mnt.lockdir('foreign'))
    assert os.path.isdir(mnt.path('foreign'))
    assert 'foreign' in os.listdir(mnt.mnt)
    owner = read_owner(mnt.mnt, 'foreign')
    assert owner['resource'] == 'foreign'
    assert 'holder' in owner and owner['holder'] is None


def test_direct_empty_lock_cannot_be_released_through_mount(mnt):
    os.mkdir(mnt.lockdir('foreign'))
    with pytest.raises(OSError) as ei:
        os.rmdir(mnt.path('foreign'))
    assert ei.value.errno == errno.EPERM
    assert os.path.isdir(mnt.lockdir('foreign'))
    assert os.listdir(mnt.lockdir('foreign')) == []
    assert os.path.isdir(mnt.path('foreign'))


def test_lock_with_invalid_record_is_held(mnt):
    """A NAME.lock whose record is garbage is held, never free."""
    os.mkdir(mnt.lockdir('garbled'))
    with open(os.path.join(mnt.lockdir('garbled'), 'owner.json'), 'w') as f:
        f.write('{"resource": "garbled", "holder": ')
    with pytest.raises(FileExistsError):
        os.mkdir(mnt.path('garbled'))
    assert os.path.isdir(mnt.path('garbled'))
    with pytest.raises(OSError) as ei:
        os.rmdir(mnt.path('garbled'))
    assert ei.value.errno == errno.EPERM
    assert os.path.isdir(mnt.lockdir('garbled'))
