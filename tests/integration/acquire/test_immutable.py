"""Point 7: nothing else can be created, renamed, linked or removed: EPERM."""

import os
import stat

import pytest

from lockfs_helpers import errname, errno_of, snapshot

# Each entry: id -> function(M) performing the mutation.  'a' and 'b' are held.
MUTATIONS = {
    'touch-file-in-lock': lambda m: os.close(os.open(m.path('a', 'file'),
                                                     os.O_CREAT | os.O_WRONLY, 0o644)),
    'create-file-in-root': lambda m: os.close(os.open(m.path('newfile'),
                                                      os.O_CREAT | os.O_WRONLY | os.O_EXCL,
                                                      0o644)),
    'mkdir-in-lock': lambda m: os.mkdir(m.path('a', 'sub')),
    'rename-lock': lambda m: os.rename(m.path('a'), m.path('c')),
    'rename-lock-over-held': lambda m: os.rename(m.path('a'), m.path('b')),
    'rename-owner': lambda m: os.rename(m.path('a', 'owner'), m.path('a', 'owner2')),
    'rename-owner-to-root': lambda m: os.rename(m.path('a', 'owner'), m.path('c')),
    'rename-log': lambda m: os.rename(m.path('.log'), m.path('log2')),
    'link-owner': lambda m: os.link(m.path('a', 'owner'), m.path('a', 'owner2')),
    'link-owner-into-root': lambda m: os.link(m.path('a', 'owner'), m.path('c')),
    'symlink-in-lock': lambda m: os.symlink('owner', m.path('a', 'sym')),
    'symlink-in-root': lambda m: os.symlink('a', m.path('sym')),
    'rm-owner': lambda m: os.unlink(m.path('a', 'owner')),
    'rm-operation': lambda m: os.unlink(m.path('a', 'operation')),
    'rm-log': lambda m: os.unlink(m.path('.log')),
    'mknod-fifo-in-lock': lambda m: os.mknod(m.path('a', 'fifo'), stat.S_IFIFO | 0o644),
    'mknod-fifo-in-root': lambda m: os.mknod(m.path('fifo'), stat.S_IFIFO | 0o644),
    'mknod-reg-in-root': lambda m: os.mknod(m.path('reg'), stat.S_IFREG | 0o644),
    'chmod-lock': lambda m: os.chmod(m.path('a'), 0o700),
    'chmod-owner': lambda m: os.chmod(m.path('a', 'owner'), 0o666),
    'chmod-root': lambda m: os.chmod(m.mnt, 0o755),
    'chown-lock': lambda m: os.chown(m.path('a'), 4242, 4242),
    'utime-lock': lambda m: os.utime(m.path('a'), (0, 0)),
}


@pytest.fixture
def two_held(mnt):
    os.mkdir(mnt.path('a'))
    os.mkdir(mnt.path('b'))
    yield mnt
    for n in ('a', 'b'):
        if os.path.exists(mnt.lockdir(n)):
            os.rmdir(mnt.path(n))


def _mount_view(m):
    view = {}
    for n in sorted(os.listdir(m.mnt)):
        p = m.path(n)
        st = os.lstat(p)
        entry = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_mtime_ns]
        if stat.S_ISDIR(st.st_mode) and n != '.flock':   # .flock holds no owner
            entry.append(sorted(os.listdir(p)))
            with open(os.path.join(p, 'owner'), 'rb') as f:
                entry.append(f.read())
        view[n] = entry
    st = os.stat(m.mnt)
    view['/'] = [stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
    return view


@pytest.mark.parametrize('what', sorted(MUTATIONS))
def test_mutation_is_eperm_and_changes_nothing(two_held, what):
    m = two_held
    before, view = snapshot(m.dir), _mount_view(m)
    got = errno_of(MUTATIONS[what], m)
    assert errname(got) == 'EPERM'
    assert snapshot(m.dir) == before
    assert _mount_view(m) == view


def test_truncate_owner_fails_and_changes_nothing(two_held):
    m = two_held
    before = snapshot(m.dir)
    with open(m.path('a', 'owner'), 'rb') as f:
        owner = f.read()
    got = errno_of(os.truncate, m.path('a', 'owner'), 0)
    assert errname(got) in ('EPERM', 'EACCES')
    assert snapshot(m.dir) == before
    with open(m.path('a', 'owner'), 'rb') as f:
        assert f.read() == owner


def test_write_to_owner_fails_and_changes_nothing(two_held):
    m = two_held
    before = snapshot(m.dir)
    got = errno_of(lambda: os.close(os.open(m.path('a', 'owner'), os.O_WRONLY)))
    assert errname(got) in ('EPERM', 'EACCES')
    assert snapshot(m.dir) == before
