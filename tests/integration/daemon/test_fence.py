"""Issue 3 point 7: fences, M/NAME/fence, -o fence_file (the tmpfs-reboot case)."""

import os
import stat

from lockfs_helpers import read_owner, wait_free

DEFAULT_FENCE_FILE = '/var/lib/lockfs/fence'


def _fence_file(m, name):
    with open(m.path(name, 'fence'), 'rb') as f:
        return f.read()


def _counter(path):
    with open(path, 'rb') as f:
        data = f.read()
    assert data.strip().isdigit(), data
    return int(data)


def _cycle(m, name='x', n=1):
    out = []
    for _ in range(n):
        os.mkdir(m.path(name))
        out.append(read_owner(m.mnt, name)['fence'])
        assert _fence_file(m, name) == b'%d\n' % out[-1]
        os.rmdir(m.path(name))
    return out


def test_fence_file_equals_owner_fence(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    o = read_owner(mnt.mnt, 'x')
    assert _fence_file(mnt, 'x') == b'%d\n' % o['fence']
    st = os.stat(mnt.path('x', 'fence'))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444
    assert a.read(mnt.path('x', 'fence')) == b'%d\n' % o['fence']  # any reader, same line
    assert a.rmdir(mnt.path('x')) == 0


def test_fence_file_of_slug_lock(mnt, procs):
    a = procs.agent(env={'LOCKFS_SLUG': 'S'})
    assert a.mkdir(mnt.path('x')) == 0
    assert _fence_file(mnt, 'x') == b'%d\n' % read_owner(mnt.mnt, 'x')['fence']
    assert a.rmdir(mnt.path('x')) == 0


def test_fence_file_is_read_only(mnt):
    os.mkdir(mnt.path('x'))
    before = _fence_file(mnt, 'x')
    try:
        fd = os.open(mnt.path('x', 'fence'), os.O_WRONLY)
        os.close(fd)
        raise AssertionError('fence opened for writing')
    except PermissionError:
        pass
    assert _fence_file(mnt, 'x') == before
    os.rmdir(mnt.path('x'))


def test_fences_strictly_increase_per_name(mnt, procs):
    a, b = procs.agent(), procs.agent()
    seen = []
    for i in range(10):
        h = (a, b)[i % 2]
        assert h.mkdir(mnt.path('x')) == 0
        seen.append(int(h.read(mnt.path('x', 'fence'))))
        assert h.rmdir(mnt.path('x')) == 0
    assert all(x < y for x, y in zip(seen, seen[1:])), seen


def test_fences_increase_after_recovery(mnt, procs):
    """A recovered lock's successor gets a larger fence (what a resource checks)."""
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    f1 = read_owner(mnt.mnt, 'x')['fence']
    a.kill()
    wait_free(mnt, 'x')
    assert b.mkdir(mnt.path('x')) == 0
    assert read_owner(mnt.mnt, 'x')['fence'] > f1
    assert b.rmdir(mnt.path('x')) == 0


def test_fence_file_option_is_used_and_ahead(lockfs_factory, tmp_path):
    ff = tmp_path / 'state' / 'fence'
    ff.parent.mkdir()
    m = lockfs_factory(options=[f'fence_file={ff}'])
    fences = _cycle(m, n=5)
    assert ff.exists()
    assert _counter(ff) >= max(fences)


def test_fresh_backing_dir_with_same_fence_file_keeps_increasing(lockfs_factory, tmp_path):
    """DIR on tmpfs is empty after a reboot; the fence file survives."""
    ff = tmp_path / 'persistent-fence'
    m1 = lockfs_factory(options=[f'fence_file={ff}'])
    f1 = _cycle(m1, n=5)
    assert m1.unmount() == 0
    m2 = lockfs_factory(options=[f'fence_file={ff}'])  # a new, empty backing dir
    assert m2.dir != m1.dir
    f2 = _cycle(m2, n=3)
    assert min(f2) > max(f1), (f1, f2)
    # and after a crash of the second one, too
    assert m2.kill9() < 0
    m3 = lockfs_factory(options=[f'fence_file={ff}'])
    f3 = _cycle(m3)
    assert min(f3) > max(f2), (f2, f3)


def test_fence_continues_from_the_fence_file(lockfs_factory, tmp_path):
    """Control for the previous test: the number really comes from the file."""
    ff = tmp_path / 'seeded-fence'
    ff.write_bytes(b'1000000000\n')
    os.chmod(ff, 0o600)
    m = lockfs_factory(options=[f'fence_file={ff}'])
    assert _cycle(m)[0] > 1000000000


def test_default_fence_file_is_on_persistent_storage(mnt):
    f = _cycle(mnt)[0]
    assert os.path.isfile(DEFAULT_FENCE_FILE), \
        f'{DEFAULT_FENCE_FILE} missing (stderr: {mnt.stderr()!r})'
    assert _counter(DEFAULT_FENCE_FILE) >= f
