"""Issue 22 §6: the daemon inside a container of its own.

"`container` must be relative to the daemon's own: a process in the
daemon's own container is in none, and a container inside it is named by
its own id."  Observed before: with the whole suite in a privileged podman
container, every holder's `container` was the outer container's id.

Always run: the daemon in a new pid namespace (`unshare --pid --fork
--mount-proc`) and, where a cgroup2 hierarchy takes a new cgroup, in a
cgroup named like a podman container's (libpod-OUTER.scope), as podman
would put it.  Beside it, a process of its own namespace (and cgroup) is in
no container; a nested pid namespace in the same cgroup is named by its pid
namespace (no runtime names it); one in a nested libpod-INNER.scope by INNER.
"""

import json
import os
import subprocess
import tempfile

import pytest

from lockfs_helpers import PYTHON, log_for, unguard, wait_until

RUN_TIMEOUT = 60
OUTER = 'a0' * 32
INNER = 'b1' * 32

# Run in a fresh pid namespace (pid 1 there): join cgroup OUTER_PROCS when
# given, start the daemon, let a process beside it and processes in nested
# pid namespaces take locks, unmount.  One JSON line.
IN_NAMESPACE = r'''
import json, os, subprocess, sys, time
lockfs, backing, mnt, outer_procs, inner_procs = sys.argv[1:6]
NESTED = sys.argv[6]
if outer_procs:
    with open(outer_procs, 'w') as f:
        f.write('0')

def mounted():
    with open('/proc/self/mountinfo') as f:
        return any(l.split()[4] == mnt for l in f)

daemon = subprocess.Popen([lockfs, '-f', '-o', 'backing=' + backing, mnt],
                          stdin=subprocess.DEVNULL)
deadline = time.monotonic() + 10
while not mounted():
    assert daemon.poll() is None, 'the daemon exited before mounting'
    assert time.monotonic() < deadline, 'not mounted after 10 s'
    time.sleep(0.01)
out = {}
try:
    # beside the daemon (a child of ours: pid 1, init, holds nothing), then
    # in nested pid namespaces: same cgroup, then a container's own cgroup
    for name, procs in (('beside', ''), ('nested', ''), ('inner', inner_procs)):
        if name == 'inner' and not procs:
            continue
        ns = [] if name == 'beside' else ['unshare', '--pid', '--fork', '--mount-proc']
        r = subprocess.run(ns + [sys.executable, '-c', NESTED, mnt, name, procs],
                           capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr.decode()
        out[name] = json.loads(r.stdout)
finally:
    subprocess.run(['fusermount3', '-u', mnt], check=False)
    out['daemon_rc'] = daemon.wait(30)
print(json.dumps(out))
'''

# Beside the daemon or in a nested namespace: join cgroup $3 when given,
# take $2, read its owner, release it.
NESTED = r'''
import json, os, sys
mnt, name, procs = sys.argv[1:4]
if procs:
    with open(procs, 'w') as f:
        f.write('0')
os.mkdir(os.path.join(mnt, name))
with open(os.path.join(mnt, name, 'owner')) as f:
    owner = json.load(f)
os.rmdir(os.path.join(mnt, name))
print(json.dumps({'pidns': os.readlink('/proc/self/ns/pid'), 'pid': os.getpid(),
                  'owner': owner}))
'''


def _cgroup2_root():
    """A cgroup2 hierarchy we may make a cgroup in, or None."""
    for d in ('/sys/fs/cgroup/unified', '/sys/fs/cgroup'):
        r = subprocess.run(['stat', '-f', '-c', '%T', d], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() == 'cgroup2fs':
            return d
    return None


@pytest.fixture
def podman_like_cgroups():
    """ROOT/lockfs-it-PID/libpod-OUTER.scope and, inside it,
    libpod-INNER.scope; (outer, inner) cgroup.procs paths."""
    root = _cgroup2_root()
    if root is None:
        pytest.skip('no cgroup2 hierarchy here (the relative naming is unit-tested '
                    'in tests/unit/test_procfs.c)')
    parent = os.path.join(root, f'lockfs-it-{os.getpid()}')
    outer = os.path.join(parent, f'libpod-{OUTER}.scope')
    inner = os.path.join(outer, f'libpod-{INNER}.scope')
    try:
        os.makedirs(inner)
    except OSError as e:
        pytest.skip(f'cannot make a cgroup in {root}: {e}')
    yield os.path.join(outer, 'cgroup.procs'), os.path.join(inner, 'cgroup.procs')
    for cg in (inner, outer):
        wait_until(lambda: open(os.path.join(cg, 'cgroup.procs')).read() == '', timeout=10,
                   what=f'{cg} to empty')
        os.rmdir(cg)
    os.rmdir(parent)


def _run_daemon_in_namespace(tmp_path, outer_procs='', inner_procs=''):
    backing = tmp_path / 'backing'
    backing.mkdir(mode=0o700)
    mnt = tempfile.mkdtemp(prefix='lockfs-it-nsd-')
    try:
        r = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', '--kill-child',
                            PYTHON, '-c', IN_NAMESPACE, os.path.abspath(os.environ['LOCKFS_BIN']),
                            str(backing),
                            mnt, outer_procs, inner_procs, NESTED],
                           capture_output=True, timeout=RUN_TIMEOUT, cwd='/')
    finally:
        # the mount went with the namespace's mount table; the daemon
        # guarded the directory under it (fs/guard.c)
        unguard(mnt)
        os.rmdir(mnt)
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    assert out['daemon_rc'] == 0, r.stderr.decode()
    return out, str(backing)


def _pidns(link):
    assert link.startswith('pid:[') and link.endswith(']'), link
    return 'pidns:' + link[5:-1]


def _check_beside_and_nested(out, backing):
    h = out['beside']['owner']['holder']
    assert h['container'] is None, h                  # the daemon's own: none
    assert h['ns_pid'] == h['pid'] == out['beside']['pid']
    n = out['nested']
    h = n['owner']['holder']
    assert h['container'] == _pidns(n['pidns']), h   # its own pid namespace
    assert h['ns_pid'] == 1 and h['pid'] > 1
    assert 'container' not in log_for(backing, 'beside')[0].details
    assert log_for(backing, 'nested')[0].details.get('container') == _pidns(n['pidns'])


def test_a_daemon_in_its_own_pid_namespace_names_containers_from_there(tmp_path):
    out, backing = _run_daemon_in_namespace(tmp_path)
    _check_beside_and_nested(out, backing)


def test_a_daemon_in_a_podman_like_container_names_containers_inside_it(
        tmp_path, podman_like_cgroups):
    """Observed before: everything in the daemon's container (and every
    container in there) was named by the daemon's container's id."""
    outer_procs, inner_procs = podman_like_cgroups
    out, backing = _run_daemon_in_namespace(tmp_path, outer_procs, inner_procs)
    _check_beside_and_nested(out, backing)
    assert OUTER not in [out[n]['owner']['holder']['container'] for n in ('beside', 'nested')]
    h = out['inner']['owner']['holder']
    assert (h['container'], h['ns_pid']) == (INNER, 1), h
    assert log_for(backing, 'inner')[0].details.get('container') == INNER
