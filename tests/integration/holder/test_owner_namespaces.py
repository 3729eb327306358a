"""Issue 9 §4: `owner` speaks the container's language.

"Each holder gains `ns_pid` (its pid in its own innermost pid namespace,
from NSpid) and `container` (an id taken from its cgroup path when that
names one, else null)."  The same two fields are in `holders` and in
`waiters`.  docs/record.md.

Issue 22 §2 and §6: a process in another pid namespace than the daemon's is
always in a container, named by the id its cgroup path gives below the
daemon's own cgroup, else by its pid namespace, `pidns:INODE`; one in the
daemon's own pid namespace is in none (null), wherever the daemon runs.

Always run: a child pid namespace (`unshare --pid --fork --mount-proc`),
and a cgroup named like podman's made in the unified hierarchy.  With
podman where it runs here (else skipped with the reason).
"""

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

import podman_helpers
from podman_helpers import PODMAN_RUN

from flock_helpers import fpath, read_waiters, wait_waiters  # noqa: F401
from lockfs_helpers import log_for, read_owner, wait_free, wait_until

RUN_TIMEOUT = 30
ID64 = 'c0ffee' + '0123456789abcdef' * 3 + '0123456789'
assert len(ID64) == 64

# In a fresh pid namespace the shell is pid 1: take NAME, show owner,
# release it.
SHOW_OWNER = 'mkdir "$1" || exit 9; cat "$1/owner"; rmdir "$1" || exit 8; true'
# The same, after a line naming the shell's pid namespace ("pid:[INODE]").
SHOW_NS_AND_OWNER = 'readlink /proc/self/ns/pid || exit 7; ' + SHOW_OWNER


def _ns_and_owner(out):
    """(the container id the daemon gives the namespace, the owner JSON)."""
    link, _, owner = out.decode().partition('\n')
    assert link.startswith('pid:[') and link.endswith(']'), link
    return 'pidns:' + link[5:-1], json.loads(owner)


def _pidns_of(pid):
    return f'pidns:{os.stat(f"/proc/{pid}/ns/pid").st_ino}'


def _unshare_pid(argv, **kw):
    return subprocess.run(['unshare', '--pid', '--fork', '--mount-proc'] + argv,
                          capture_output=True, timeout=RUN_TIMEOUT, **kw)


@pytest.fixture(scope='module')
def pid_namespaces():
    # Also inside a container (tools/fresh-root.sh): the daemon names
    # containers from its own, so the one it runs in names nobody (§6).
    if subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', 'true']).returncode != 0:
        pytest.fail('cannot create a pid namespace here (unshare --pid --fork --mount-proc)')


def test_a_holder_in_our_pid_namespace_is_its_own_ns_pid(mnt):
    os.mkdir(mnt.path('x'))
    h = read_owner(mnt.mnt, 'x')['holder']
    assert (h['pid'], h['ns_pid'], h['container']) == (os.getpid(), os.getpid(), None)
    os.rmdir(mnt.path('x'))


def test_a_holder_in_a_child_pid_namespace_shows_its_pid_there(mnt, pid_namespaces):
    r = _unshare_pid(['/bin/sh', '-c', SHOW_NS_AND_OWNER, 'sh', mnt.path('x')])
    assert r.returncode == 0, r.stderr
    ns, o = _ns_and_owner(r.stdout)
    h = o['holder']
    assert h['ns_pid'] == 1, h           # the namespace's first process: its shell
    assert h['pid'] > 1 and h['pid'] != os.getpid()  # the host's pid, as before
    assert h['comm'] == 'sh' and h['container'] == ns  # its pid namespace names it
    assert o['holders'][0]['ns_pid'] == 1


def test_a_waiter_and_then_fd_holder_in_a_child_pid_namespace(mnt, pid_namespaces):
    """The waiters list and, once granted, the shared holders show ns_pid."""
    os.mkdir(mnt.path('w'))
    p = subprocess.Popen(['unshare', '--pid', '--fork', '--mount-proc', '--kill-child',
                          '/bin/sh', '-c', 'flock -s "$1" sleep 30; true', 'sh',
                          fpath(mnt, 'w')],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ws = wait_until(lambda: read_waiters(mnt, 'w'), timeout=10, what='a waiter')
        assert ws[0]['ns_pid'] == 1 and ws[0]['container'] == _pidns_of(ws[0]['pid']), ws
        assert ws[0]['pid'] > 1
        os.rmdir(mnt.path('w'))          # hand it on
        o = wait_until(lambda: os.path.isdir(mnt.path('w')) and read_owner(mnt.mnt, 'w'),
                       timeout=10, what='the waiter to hold w')
        assert o['bound'] == 'fd' and o['mode'] == 'shared'
        assert [h['ns_pid'] for h in o['holders']] == [1] and o['holder']['ns_pid'] == 1
    finally:
        p.kill()
        p.wait(10)
    wait_free(mnt, 'w', timeout=5)


def _cgroup2_root():
    """A cgroup2 hierarchy we may make a cgroup in, or None."""
    for d in ('/sys/fs/cgroup/unified', '/sys/fs/cgroup'):
        try:
            if os.statvfs(d) and subprocess.run(['stat', '-f', '-c', '%T', d], capture_output=True,
                                                text=True).stdout.strip() == 'cgroup2fs':
                return d
        except OSError:
            pass
    return None


@pytest.fixture
def podman_like_cgroup():
    """A cgroup named like a podman container's: ROOT/lockfs-it-PID/libpod-ID.scope."""
    root = _cgroup2_root()
    if root is None:
        pytest.skip('no cgroup2 hierarchy here (the cgroup-path parser is unit-tested '
                    'in tests/unit/test_procfs.c)')
    parent = os.path.join(root, f'lockfs-it-{os.getpid()}')
    cg = os.path.join(parent, f'libpod-{ID64}.scope')
    try:
        os.makedirs(cg)
    except OSError as e:
        pytest.skip(f'cannot make a cgroup in {root}: {e}')
    yield cg
    # the processes in it are gone by now; a cgroup dir is removed with rmdir
    wait_until(lambda: open(os.path.join(cg, 'cgroup.procs')).read() == '', timeout=10,
               what='the test cgroup to empty')
    os.rmdir(cg)
    os.rmdir(parent)


def test_a_holder_in_a_podman_like_cgroup_names_the_container(mnt, pid_namespaces,
                                                              podman_like_cgroup):
    procs = os.path.join(podman_like_cgroup, 'cgroup.procs')
    r = _unshare_pid(['/bin/sh', '-c', 'echo 0 > "$2" || exit 7; ' + SHOW_OWNER, 'sh',
                      mnt.path('c'), procs])
    assert r.returncode == 0, r.stderr
    h = json.loads(r.stdout)['holder']
    assert (h['container'], h['ns_pid']) == (ID64, 1), h


def test_the_pid_namespace_names_a_container_without_a_container_cgroup(mnt, pid_namespaces):
    """Negative control: the same namespace, in our own cgroup: no
    runtime's id, so its pid namespace's."""
    r = _unshare_pid(['/bin/sh', '-c', SHOW_NS_AND_OWNER, 'sh', mnt.path('c')])
    assert r.returncode == 0, r.stderr
    ns, o = _ns_and_owner(r.stdout)
    assert o['holder']['container'] == ns and ns != _pidns_of(os.getpid())


# --------------------------------------------------------------------------
# podman (skipped where it cannot run)

IMAGE = 'localhost/lockfs-it-holder-bb'


@pytest.fixture(scope='module')
def busybox_image():
    """A one-binary image: busybox-static with its applets as symlinks."""
    yield from podman_helpers.busybox_image(IMAGE, ('sh', 'mkdir', 'rmdir', 'cat', 'sleep', 'true'))


@pytest.mark.slow
def test_podman_container_shell_holds_with_its_ns_pid_and_container_id(mnt_ao, busybox_image):
    """`mkdir` in a container is the image's own busybox: genuine in the
    container's root, so it is skipped to the container's shell, which shows
    ns_pid 1 and podman's container id."""
    cidfile = os.path.join(tempfile.mkdtemp(prefix='lockfs-it-cid-'), 'cid')
    try:
        r = subprocess.run(PODMAN_RUN + ['--cidfile', cidfile, '-v', f'{mnt_ao.mnt}:/locks',
                                         busybox_image, 'sh', '-c', SHOW_OWNER, 'sh',
                                         '/locks/p'],
                           capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr
        with open(cidfile) as f:
            cid = f.read().strip()
    finally:
        shutil.rmtree(os.path.dirname(cidfile), ignore_errors=True)
    assert r.stdout, r.stderr
    h = json.loads(r.stdout)['holder']
    assert (h['comm'], h['ns_pid'], h['container']) == ('sh', 1, cid), h
    assert [l.event for l in log_for(mnt_ao.dir, 'p')] == ['acquired', 'released']
