"""Point 9: no stale views (no positive or negative caching)."""

import os
import shutil

import pytest


def test_release_then_immediate_mkdir_by_other_process(mnt, procs):
    a, b = procs.agent(), procs.agent()
    for i in range(100):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        assert first.mkdir(mnt.path('x')) == 0, f'round {i}'
        assert first.rmdir(mnt.path('x')) == 0, f'round {i}'
        assert second.mkdir(mnt.path('x')) == 0, f'round {i}: released lock not acquirable'
        assert second.rmdir(mnt.path('x')) == 0, f'round {i}'


def test_direct_rmdir_of_foreign_lock_vanishes_at_once(mnt):
    os.mkdir(mnt.lockdir('f'))
    os.stat(mnt.path('f'))  # control: visible (and now in the kernel's cache if cached)
    assert 'f' in os.listdir(mnt.mnt)
    os.rmdir(mnt.lockdir('f'))
    with pytest.raises(FileNotFoundError):
        os.stat(mnt.path('f'))
    assert 'f' not in os.listdir(mnt.mnt)


def test_lock_removed_behind_daemons_back_vanishes_at_once(mnt):
    os.mkdir(mnt.path('x'))
    os.stat(mnt.path('x'))
    os.stat(mnt.path('x', 'owner'))
    shutil.rmtree(mnt.lockdir('x'))
    with pytest.raises(FileNotFoundError):
        os.stat(mnt.path('x'))
    assert 'x' not in os.listdir(mnt.mnt)
    # and it is free again through the mount
    os.mkdir(mnt.path('x'))
    os.rmdir(mnt.path('x'))


def test_direct_mkdir_is_visible_at_once(mnt):
    with pytest.raises(FileNotFoundError):
        os.stat(mnt.path('d'))  # a negative lookup first
    os.mkdir(mnt.lockdir('d'))
    os.stat(mnt.path('d'))
    assert 'd' in os.listdir(mnt.mnt)
    with pytest.raises(FileExistsError):
        os.mkdir(mnt.path('d'))


def test_release_is_visible_at_once_to_other_process(mnt, procs):
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    b.stat(mnt.path('x'))  # b has looked it up
    assert a.rmdir(mnt.path('x')) == 0
    with pytest.raises(OSError) as ei:
        b.stat(mnt.path('x'))
    assert ei.value.errno == 2


def test_reacquired_lock_shows_new_owner_at_once(mnt, procs):
    """A stale inode must not serve the previous holder's record."""
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    fd = os.open(mnt.path('x'), os.O_RDONLY | os.O_DIRECTORY)  # keep the old dir referenced
    try:
        o1 = b.owner(mnt.mnt, 'x')
        assert a.rmdir(mnt.path('x')) == 0
        assert b.mkdir(mnt.path('x')) == 0
        o2 = a.owner(mnt.mnt, 'x')
        assert o2['holder']['pid'] == b.pid
        assert o2['fence'] > o1['fence']
    finally:
        os.close(fd)
    assert b.rmdir(mnt.path('x')) == 0
