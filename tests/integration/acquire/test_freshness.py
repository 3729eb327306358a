"""Point 9: no stale views (no positive or negative caching)."""

import collections
import errno
import json
import os
import shutil
import subprocess

import pytest

from lockfs_helpers import PYTHON, errno_of, read_owner, wait_until


def fence_of(mnt, name):
    """NAME's fence now (each grant, a hand-off too, has a larger one)."""
    with open(mnt.path(name, 'fence'), 'rb') as f:
        return int(f.read())


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


# Two processes that hand NAME to each other through M/.flock/NAME: each
# lets go only while the other waits in line, so the lock passes straight
# from one to the other and NAME is held at every instant.
HANDOFF_SRC = r'''
import fcntl, os, sys
mnt, name = sys.argv[1], sys.argv[2]
fd = os.open(os.path.join(mnt, '.flock', name), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(1, b'held\n')
waiters = os.path.join(mnt, name, 'waiters')
for _ in range(200000):
    with open(waiters, 'rb') as f:
        if not f.read():
            continue  # the other is not in line yet
    fcntl.flock(fd, fcntl.LOCK_UN)  # a hand-off: the waiter holds it now
    fcntl.flock(fd, fcntl.LOCK_EX)
'''


def test_a_lock_handed_on_is_never_seen_free_on_the_way_to_its_files(mnt):
    """`cat M/NAME/owner` and `stat M/NAME` of a lock that is held at every
    instant always answer, even when the lock changes hands between the
    kernel's lookup of NAME and its lookup (or open) of NAME/owner: a look
    through the old directory shows NAME as it is now."""
    procs = [subprocess.Popen([PYTHON, '-c', HANDOFF_SRC, mnt.mnt, 'h'], stdout=subprocess.PIPE)
             for _ in range(2)]
    try:
        # Both have held it: from here on one holds, the other waits in
        # line, and NAME is never free.
        assert [p.stdout.readline() for p in procs] == [b'held\n'] * 2
        wait_until(lambda: fence_of(mnt, 'h') > 0, what='hand-offs under way')
        fence0 = fence_of(mnt, 'h')
        answers = collections.Counter()
        for i in range(4000):
            try:
                if i % 2:
                    os.stat(mnt.path('h'))
                else:
                    with open(mnt.path('h', 'owner'), 'rb') as f:
                        assert json.loads(f.read())['holder']['pid'] in (p.pid for p in procs)
                answers['ok'] += 1
            except OSError as e:
                answers[errno.errorcode[e.errno]] += 1
        handoffs = fence_of(mnt, 'h') - fence0
        assert all(p.poll() is None for p in procs), 'a hand-off process ended'
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert handoffs >= 100, f'only {handoffs} hand-offs during the reads'
    # ENOENT would be a held lock seen free: the lie this test is about.
    assert answers == {'ok': 4000}, f'{dict(answers)} in {handoffs} hand-offs'


def test_a_look_from_inside_a_lock_directory_shows_the_name_as_it_is_now(mnt, procs):
    """A cwd or dir fd inside M/NAME outlives the lock.  A look from there
    answers for NAME as it is now, like the same path from the mount: ENOENT
    while NAME is free, the new holder's record once it is taken again --
    never the old one's."""
    a, b = procs.agent(), procs.agent()
    fa = a.take(mnt.path('.flock', 'x'))
    fd = os.open(mnt.path('x'), os.O_RDONLY | os.O_DIRECTORY)
    try:
        with open('owner', 'rb', opener=lambda p, fl: os.open(p, fl, dir_fd=fd)) as f:
            assert json.loads(f.read())['holder']['pid'] == a.pid
        a.close(fa)
        assert errno_of(os.stat, 'owner', dir_fd=fd) == errno.ENOENT
        b.take(mnt.path('.flock', 'x'))
        with open('owner', 'rb', opener=lambda p, fl: os.open(p, fl, dir_fd=fd)) as f:
            assert json.loads(f.read())['holder']['pid'] == b.pid
        assert os.stat('owner', dir_fd=fd).st_size > 0
    finally:
        os.close(fd)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == b.pid
