"""Issue 22 §1 with podman: no holder outside the container.

`podman run IMG flock ...`, `podman exec C flock ...`, `podman exec C
lockctl run ...` and `podman exec -d C sh -c 'flock ...'` (busybox sh execs
its last command) recorded the host's `conmon` or `runc` as holder: comm
conmon, container null, a host pid, and conmon's command line with host
storage paths.  The holder is now the container's own process, named by
its container.  `podman exec C lockctl acquire X` exited 0 and the lock
went 95 ms later; it now fails with 64.  docs/holder.md, "The pid namespace
boundary".

Skipped, with the reason, where podman cannot run a container
(docs: ../shared containers-measured.md: runc, ulimits).  Each module run
uses its own podman storage (--root, --runroot) and removes its
containers.
"""

import json
import os
import shutil
import tempfile

import pytest

from lockfs_helpers import read_owner, wait_free, wait_until
from podman_helpers import FLAGS, IMAGE, pm, podman_storage, start_container

EX_USAGE = 64


@pytest.fixture(scope='module')
def podman():
    yield from podman_storage()


@pytest.fixture
def container(podman, mnt_ao):
    """A long-running container with the mount at /locks: its id."""
    cid = start_container(podman, mnt_ao.mnt, 'sleep', '600')
    yield cid
    pm(podman, 'rm', '-f', '-t', '0', cid)


def holder_of(out):
    return json.loads(out)['holder']


def assert_inside(h, cid):
    """H is a process of container CID, never podman's own machinery."""
    assert h['comm'] not in ('conmon', 'runc', 'podman'), h
    assert h['container'] == cid, h
    assert h['ns_pid'] != h['pid'], h  # a pid of the container's namespace


@pytest.mark.slow
def test_podman_run_flock_holds_in_its_container(podman, mnt_ao):
    cidfile = os.path.join(tempfile.mkdtemp(prefix='lockfs-it-cid-'), 'cid')
    try:
        r = pm(podman, 'run', '--rm', '--cidfile', cidfile, *FLAGS, '-v', f'{mnt_ao.mnt}:/locks',
               IMAGE, 'flock', '/locks/.flock/pr', 'cat', '/locks/pr/owner')
        assert r.returncode == 0, r.stderr
        with open(cidfile) as f:
            cid = f.read().strip()
    finally:
        shutil.rmtree(os.path.dirname(cidfile), ignore_errors=True)
    h = holder_of(r.stdout)
    assert_inside(h, cid)
    assert (h['comm'], h['ns_pid']) == ('flock', 1), h
    wait_free(mnt_ao, 'pr', timeout=5)


@pytest.mark.slow
def test_podman_exec_flock_holds_in_its_container(podman, mnt_ao, container):
    r = pm(podman, 'exec', container, 'flock', '/locks/.flock/pe', 'cat', '/locks/pe/owner')
    assert r.returncode == 0, r.stderr
    h = holder_of(r.stdout)
    assert_inside(h, container)
    assert h['comm'] == 'flock', h
    wait_free(mnt_ao, 'pe', timeout=5)


@pytest.mark.slow
def test_podman_exec_lockctl_run_holds_in_its_container(podman, mnt_ao, container):
    r = pm(podman, 'exec', container, 'lockctl', '--mount', '/locks', 'run', 'pl', '--',
           'cat', '/locks/pl/owner')
    assert r.returncode == 0, r.stderr
    h = holder_of(r.stdout)
    assert_inside(h, container)
    assert h['comm'] == 'lockctl', h
    wait_free(mnt_ao, 'pl', timeout=5)


@pytest.mark.slow
def test_podman_exec_detached_sh_flock_holds_in_its_container(podman, mnt_ao, container):
    """busybox sh execs its last command: flock's parent is conmon."""
    r = pm(podman, 'exec', '-d', container, 'sh', '-c', 'flock /locks/.flock/pd sleep 600')
    assert r.returncode == 0, r.stderr
    o = wait_until(lambda: os.path.isdir(mnt_ao.path('pd')) and read_owner(mnt_ao.mnt, 'pd'),
                   timeout=30,
                   what='the detached flock to hold pd')
    assert_inside(o['holder'], container)
    assert o['holder']['comm'] == 'flock', o['holder']


@pytest.mark.slow
def test_podman_exec_lockctl_acquire_fails_with_64(podman, mnt_ao, container):
    """It used to exit 0, and the lock, bound to conmon, went 95 ms later."""
    r = pm(podman, 'exec', container, 'lockctl', '--mount', '/locks', 'acquire', 'pa')
    err = r.stderr.decode()
    assert r.returncode == EX_USAGE, (r.returncode, err)
    assert err.count('\n') == 1 and 'pid namespace' in err, err
    assert 'pa' not in os.listdir(mnt_ao.mnt)


@pytest.mark.slow
def test_podman_exec_shell_script_holds_with_its_shell(podman, mnt_ao, container):
    """Negative control, and the documented way to hold from outside a
    container: a shell inside holds for its mkdir and lockctl acquire."""
    r = pm(podman, 'exec', container, 'sh', '-c',
           'mkdir /locks/ps || exit 7; cat /locks/ps/owner; rmdir /locks/ps || exit 8;'
           ' lockctl --mount /locks acquire pq || exit 9; cat /locks/pq/owner;'
           ' lockctl --mount /locks release pq')
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    dec = json.JSONDecoder()
    o1, end = dec.raw_decode(out)
    o2, _ = dec.raw_decode(out[end:].lstrip())
    h1, h2 = o1['holder'], o2['holder']
    assert_inside(h1, container)
    assert h1['comm'] == 'sh' and h2['comm'] == 'sh' and h1['pid'] == h2['pid'], (h1, h2)
