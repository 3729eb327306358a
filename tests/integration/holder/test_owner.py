"""Point 5: M/NAME/owner, the JSON record."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from lockfs_helpers import (PYTHON, TOKEN_RE, boot_id, parse_rfc3339_ms, proc_cmdline, proc_comm,
                            proc_start_time, read_owner, snapshot)


def _is_int(v):
    return type(v) is int


def test_owner_has_all_fields_with_right_types(mnt):
    os.mkdir(mnt.path('x'))
    o = read_owner(mnt.mnt, 'x')
    for k in ('resource', 'holder', 'acquired_at', 'operation', 'lease', 'fence', 'token'):
        assert k in o, f'missing {k!r} in {o}'
    assert o['resource'] == 'x'
    h = o['holder']
    assert isinstance(h, dict)
    for k in ('pid', 'start_time', 'uid', 'user', 'gid', 'comm', 'cmdline', 'host', 'boot_id'):
        assert k in h, f'missing holder.{k} in {h}'
    assert _is_int(h['pid']) and _is_int(h['start_time'])
    assert _is_int(h['uid']) and _is_int(h['gid'])
    assert isinstance(h['user'], str) and isinstance(h['comm'], str)
    assert isinstance(h['cmdline'], list) and all(isinstance(a, str) for a in h['cmdline'])
    assert isinstance(h['host'], str) and isinstance(h['boot_id'], str)
    assert isinstance(o['acquired_at'], str)
    assert o['operation'] is None
    assert o['lease'] is None
    assert _is_int(o['fence'])
    assert isinstance(o['token'], str)
    os.rmdir(mnt.path('x'))


def test_owner_holder_values_match_proc(mnt):
    os.mkdir(mnt.path('x'))
    h = read_owner(mnt.mnt, 'x')['holder']
    me = os.getpid()
    assert h['pid'] == me
    assert h['start_time'] == proc_start_time(me)
    assert h['comm'] == proc_comm(me)
    assert h['cmdline'] == proc_cmdline(me)
    assert h['host'] == socket.gethostname()
    assert h['boot_id'] == boot_id()
    os.rmdir(mnt.path('x'))


def test_owner_resource_is_the_name(mnt):
    name = 'caf\u00e9 with space'
    os.mkdir(mnt.path(name))
    assert read_owner(mnt.mnt, name)['resource'] == name
    os.rmdir(mnt.path(name))


def test_acquired_at_is_rfc3339_utc_ms_and_now(mnt):
    before = time.time()
    os.mkdir(mnt.path('x'))
    after = time.time()
    o = read_owner(mnt.mnt, 'x')
    t = parse_rfc3339_ms(o['acquired_at'])  # asserts the format
    assert before - 2 <= t <= after + 2, (o['acquired_at'], before, after)
    os.rmdir(mnt.path('x'))


def test_fence_strictly_increases_across_acquisitions(mnt):
    fences = []
    for _ in range(10):
        os.mkdir(mnt.path('x'))
        fences.append(read_owner(mnt.mnt, 'x')['fence'])
        os.rmdir(mnt.path('x'))
    assert all(a < b for a, b in zip(fences, fences[1:])), fences


def test_fence_increases_across_names_interleaved(mnt):
    """One counter for all names is enough, but per name it must increase."""
    seen = {'a': [], 'b': []}
    for i in range(6):
        n = 'ab'[i % 2]
        os.mkdir(mnt.path(n))
        seen[n].append(read_owner(mnt.mnt, n)['fence'])
        os.rmdir(mnt.path(n))
    for n, f in seen.items():
        assert all(a < b for a, b in zip(f, f[1:])), (n, f)


@pytest.mark.parametrize('stop, rounds', [('unmount', 1), ('SIGTERM', 3)],
                         ids=['unmount', 'sigterm'])
def test_fence_increases_across_daemon_restart(lockfs_factory, stop, rounds):
    """However the daemon was stopped (a signal too), it never hands out a
    fence twice."""
    m1 = lockfs_factory()
    fences = []
    for _ in range(rounds):
        os.mkdir(m1.path('x'))
        fences.append(read_owner(m1.mnt, 'x')['fence'])
        os.rmdir(m1.path('x'))
    assert (m1.unmount() if stop == 'unmount' else m1.signal(signal.SIGTERM)) == 0
    m2 = lockfs_factory(backing=m1.dir)
    os.mkdir(m2.path('x'))
    f2 = read_owner(m2.mnt, 'x')['fence']
    os.rmdir(m2.path('x'))
    assert f2 > max(fences), (fences, f2)


def test_lock_survives_daemon_restart(lockfs_factory):
    """The backing dir is the truth: a held lock is still held after a restart."""
    m1 = lockfs_factory()
    os.mkdir(m1.path('x'))
    o1 = read_owner(m1.mnt, 'x')
    assert m1.unmount() == 0
    m2 = lockfs_factory(backing=m1.dir)
    with pytest.raises(FileExistsError):
        os.mkdir(m2.path('x'))
    o2 = read_owner(m2.mnt, 'x')
    assert (o2['fence'], o2['token'], o2['holder']['pid']) == \
        (o1['fence'], o1['token'], o1['holder']['pid'])
    os.rmdir(m2.path('x'))  # the same, still living holder may release
    assert not os.path.exists(m2.lockdir('x'))


def _stored_token(m, name):
    with open(os.path.join(m.lockdir(name), 'owner.json'), 'rb') as f:
        return json.loads(f.read())['token']


@pytest.mark.parametrize('reader', ['root', 'holder_uid', 'other_uid'])
def test_token_shown_only_to_holder_uid_and_root(mnt_ao, users, procs, reader):
    holder = procs.agent(user=users[0])
    assert holder.mkdir(mnt_ao.path('x')) == 0
    stored = _stored_token(mnt_ao, 'x')
    assert TOKEN_RE.match(stored), stored
    if reader == 'root':
        o = procs.agent().owner(mnt_ao.mnt, 'x')
    elif reader == 'holder_uid':
        o = procs.agent(user=users[0]).owner(mnt_ao.mnt, 'x')  # another process, same uid
    else:
        o = procs.agent(user=users[1]).owner(mnt_ao.mnt, 'x')
    if reader == 'other_uid':
        assert 'token' not in o, o
        assert o['holder']['pid'] == holder.pid  # the rest is still there
    else:
        assert o.get('token') == stored
    assert holder.rmdir(mnt_ao.path('x')) == 0


def test_token_is_fresh_per_acquisition(mnt):
    tokens = set()
    for _ in range(5):
        os.mkdir(mnt.path('x'))
        tokens.add(read_owner(mnt.mnt, 'x')['token'])
        os.rmdir(mnt.path('x'))
    assert len(tokens) == 5
    assert all(TOKEN_RE.match(t) for t in tokens)


def test_reading_owner_is_idempotent_and_changes_nothing(mnt, procs):
    os.mkdir(mnt.path('x'))
    reader = procs.agent()
    before = snapshot(mnt.dir)
    listing = sorted(os.listdir(mnt.mnt))
    p = mnt.path('x', 'owner')
    with open(p, 'rb') as f:
        first = f.read()
    with open(p, 'rb') as f:
        second = f.read()
    third = reader.read(p)
    assert first == second == third
    assert snapshot(mnt.dir) == before
    assert sorted(os.listdir(mnt.mnt)) == listing
    os.rmdir(mnt.path('x'))


def test_owner_read_in_small_chunks_is_consistent(mnt):
    """direct_io content read piecewise (offsets) gives the same bytes."""
    os.mkdir(mnt.path('x'))
    p = mnt.path('x', 'owner')
    with open(p, 'rb') as f:
        whole = f.read()
    fd = os.open(p, os.O_RDONLY)
    try:
        parts = []
        while True:
            b = os.read(fd, 7)
            if not b:
                break
            parts.append(b)
    finally:
        os.close(fd)
    assert b''.join(parts) == whole
    json.loads(whole)
    os.rmdir(mnt.path('x'))


def _sendfile_all(path):
    """PATH's content as sendfile(2) copies it (it stops at the file's size)."""
    fd = os.open(path, os.O_RDONLY)
    out = os.open('/dev/shm', os.O_TMPFILE | os.O_RDWR)
    try:
        while os.sendfile(out, fd, None, 1 << 20) > 0:
            pass
        os.lseek(out, 0, os.SEEK_SET)
        return os.read(out, 1 << 24)
    finally:
        os.close(fd)
        os.close(out)


@pytest.mark.parametrize('file', ['owner', 'operation', 'fence', 'lease', 'bind', 'waiters'])
def test_size_is_what_a_read_gives_so_sendfile_and_busybox_cat_read_it_all(mnt, file):
    """A size of 0 made sendfile(2), splice(2) and busybox cat (which uses
    sendfile: Alpine containers) read these files as empty."""
    busybox = shutil.which('busybox')
    assert busybox, 'busybox is not installed (tools/deps.sh installs busybox-static)'
    os.mkdir(mnt.path('x'))
    with open(mnt.path('x', 'operation'), 'w') as f:
        f.write('deploying v2\n')
    p = mnt.path('x', file)
    with open(p, 'rb') as f:
        want = f.read()
    assert os.stat(p).st_size == len(want)
    assert _sendfile_all(p) == want
    r = subprocess.run([busybox, 'cat', p], capture_output=True, check=True)
    assert r.stdout == want
    os.rmdir(mnt.path('x'))


def test_size_of_owner_is_that_readers_record(mnt_ao, users, procs):
    """The record depends on the reader (the token): so does its size, and a
    reader without the token reads all of its own record through sendfile."""
    holder = procs.agent(user=users[0])
    assert holder.mkdir(mnt_ao.path('x')) == 0
    p = mnt_ao.path('x', 'owner')
    with open(p, 'rb') as f:
        mine = f.read()                                       # root: with the token
    assert os.stat(p).st_size == len(mine)
    code = ('import os, sys\n'
            'fd = os.open(sys.argv[1], os.O_RDONLY)\n'
            'out = os.open("/dev/shm", os.O_TMPFILE | os.O_RDWR)\n'
            'while os.sendfile(out, fd, None, 1 << 20) > 0: pass\n'
            'os.lseek(out, 0, 0)\n'
            'sys.stdout.buffer.write(os.read(out, 1 << 24))\n'
            'print(os.stat(sys.argv[1]).st_size, file=sys.stderr)\n')
    u = users[1]
    r = subprocess.run(['setpriv', f'--reuid={u.uid}', f'--regid={u.gid}', '--clear-groups',
                        PYTHON, '-c', code, p], capture_output=True, check=True)
    theirs = json.loads(r.stdout)
    assert 'token' not in theirs and theirs['holder']['pid'] == holder.pid
    assert int(r.stderr) == len(r.stdout) < len(mine)
    assert holder.rmdir(mnt_ao.path('x')) == 0
