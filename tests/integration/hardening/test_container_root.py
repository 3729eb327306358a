"""Issue 22 §2: root in a container is root only over its own container's locks.

"A caller in another pid namespace than the daemon's has root's powers
(break, others' tokens and command lines) only over locks held from its own
container, unless an option the host sets grants more; every log line names
the caller's container when it has one (container=ID)."

A container here is what the daemon sees of a process (docs/holder.md,
"Containers"): a process in another pid namespace than the daemon's is in
one, named by the id its cgroup path gives (podman, docker, ...) or else by
its pid namespace, `pidns:INODE`.  Root's own container is the one whose id
it has.  `-o container_root=host` gives root in any container root's powers
over every lock, as before.

Always run with `unshare --pid --fork --mount-proc` (root in a new pid
namespace, no user namespace); with podman where it runs (else skipped with
the reason).
"""

import errno
import json
import os
import shutil
import subprocess
import tempfile

import pytest

import podman_helpers
from podman_helpers import PODMAN_RUN

from lockfs_helpers import PYTHON, log_for, read_owner, wait_free, wait_log

SECRET = '--db-password=hunter2'
RUN_TIMEOUT = 60

# Run as root in a new pid namespace: read M/HOST/owner, try to break
# M/HOST; then a child of ours takes M/OWN (it holds it itself: python's
# mkdir, no helper) and we read its owner and break it.  One JSON line.
IN_CONTAINER = r'''
import errno, json, os, subprocess, sys
mnt, host, own = sys.argv[1:4]

def owner(name):
    with open(os.path.join(mnt, name, 'owner')) as f:
        return json.load(f)

def brk(name):
    try:
        fd = os.open(os.path.join(mnt, name, 'break'), os.O_WRONLY)
    except OSError as e:
        return e.errno
    try:
        os.write(fd, b'from the container\n')
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)

def rmdir(name):
    try:
        os.rmdir(os.path.join(mnt, name))
        return 0
    except OSError as e:
        return e.errno

out = {'pidns': os.readlink('/proc/self/ns/pid'), 'host_owner': owner(host)}
out['host_rmdir'] = rmdir(host)
out['host_break'] = brk(host)
child = subprocess.Popen([sys.executable, '-c',
                          'import os, sys, time\n'
                          'os.mkdir(sys.argv[1]); print("held", flush=True)\n'
                          'sys.stdin.read()',
                          os.path.join(mnt, own), '--own-secret=s3cret'],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
assert child.stdout.readline() == b'held\n'
out['own_owner'] = owner(own)
out['own_break'] = brk(own)
out['own_gone'] = not os.path.exists(os.path.join(mnt, own))
child.stdin.close()
child.wait()
print(json.dumps(out))
'''


def _in_new_pid_namespace(m, host, own):
    r = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', PYTHON, '-c',
                        IN_CONTAINER, m.mnt, host, own],
                       capture_output=True, timeout=RUN_TIMEOUT, cwd='/')
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def _pidns_id(link):
    # "pid:[4026532198]" -> "pidns:4026532198", as the daemon names it
    assert link.startswith('pid:[') and link.endswith(']'), link
    return 'pidns:' + link[5:-1]


@pytest.fixture(scope='module')
def new_pid_namespaces():
    r = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', 'true'],
                       capture_output=True)
    if r.returncode != 0:
        pytest.fail('cannot create a pid namespace here (unshare --pid --fork --mount-proc): '
                    + r.stderr.decode())


def test_root_in_a_new_pid_namespace_is_root_over_its_own_locks_only(
        lockfs_factory, procs, new_pid_namespaces):
    """Observed before: root under `unshare --pid --fork --mount-proc` read
    the host holder's command line and token, and its break returned 0."""
    mnt = lockfs_factory(options=('log_denied_interval=0',))  # every refusal a line
    holder = procs.agent(setup=f'# {SECRET}')
    assert holder.mkdir(mnt.path('x')) == 0
    token = read_owner(mnt.mnt, 'x')['token']     # the host's root sees it

    r = _in_new_pid_namespace(mnt, 'x', 'y')
    ns = _pidns_id(r['pidns'])

    # the host's lock: its holder's secrets hidden, no break, no rmdir
    o = r['host_owner']
    assert o['holder']['cmdline'] is None and 'token' not in o, o
    assert [h['cmdline'] for h in o['holders']] == [None]
    assert SECRET not in json.dumps(o) and token not in json.dumps(o)
    assert o['holder']['pid'] == holder.pid and o['holder']['comm'] == 'python3'
    assert r['host_break'] == errno.EPERM, errno.errorcode.get(r['host_break'])
    assert r['host_rmdir'] == errno.EPERM
    assert os.path.isdir(mnt.path('x')), 'the host lock must still be held'
    assert read_owner(mnt.mnt, 'x')['token'] == token

    # its own container's lock: root there sees it all and breaks it
    own = r['own_owner']
    assert own['holder']['container'] == ns, own['holder']
    assert any('--own-secret=s3cret' in a for a in own['holder']['cmdline']), own
    assert len(own['token']) == 32
    assert r['own_break'] == 0 and r['own_gone']

    # the log names the container of each caller that has one
    lines = log_for(mnt.dir, 'x')
    assert [l.event for l in lines] == ['acquired', 'denied', 'denied'], lines
    assert 'container' not in lines[0].details       # the host's own holder
    for d in lines[1:]:
        assert d.details.get('container') == ns, d
    assert {d.details['reason'] for d in lines[1:]} == {'not-holder', 'other-container'}
    y = log_for(mnt.dir, 'y')
    assert [l.event for l in y] == ['acquired', 'broken'], y
    assert y[0].details.get('container') == ns
    assert y[1].details.get('container') == ns and y[1].details.get('by_container') == ns
    assert holder.rmdir(mnt.path('x')) == 0


def test_container_root_host_gives_root_in_a_container_every_lock(
        lockfs_factory, procs, new_pid_namespaces):
    """-o container_root=host: the powers of before, on the host's say."""
    m = lockfs_factory(options=('container_root=host',))
    holder = procs.agent(setup=f'# {SECRET}')
    assert holder.mkdir(m.path('x')) == 0
    r = _in_new_pid_namespace(m, 'x', 'y')
    o = r['host_owner']
    assert any(SECRET in a for a in o['holder']['cmdline']) and len(o['token']) == 32
    assert r['host_break'] == 0
    wait_free(m, 'x')
    b = [l for l in log_for(m.dir, 'x') if l.event == 'broken']
    assert len(b) == 1 and b[0].details.get('by_container') == _pidns_id(r['pidns'])
    assert r['own_break'] == 0 and r['own_gone']


def test_root_on_the_host_still_breaks_a_containers_lock(mnt, procs, new_pid_namespaces):
    """The host's root keeps its powers over every container's locks."""
    p = procs.popen(['unshare', '--pid', '--fork', '--mount-proc', '--kill-child', PYTHON,
                     '-c', 'import os, sys\nos.mkdir(sys.argv[1]); print("held", flush=True)\n'
                     'sys.stdin.read()', mnt.path('c'), SECRET],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout.readline() == b'held\n'
    o = read_owner(mnt.mnt, 'c')
    assert o['holder']['container'].startswith('pidns:') and o['holder']['ns_pid'] == 1
    assert any(SECRET in a for a in o['holder']['cmdline']) and len(o['token']) == 32
    with open(mnt.path('c', 'break'), 'w') as f:
        f.write('host root\n')
    wait_free(mnt, 'c')
    b = [l for l in log_for(mnt.dir, 'c') if l.event == 'broken']
    assert len(b) == 1 and 'by_container' not in b[0].details
    p.stdin.close()
    p.wait(RUN_TIMEOUT)


def test_lines_about_a_holder_in_a_container_name_its_container(mnt, new_pid_namespaces):
    """acquired and recovered: the holder's container, as `owner` names it."""
    r = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', PYTHON, '-c',
                        'import os, sys\nos.mkdir(sys.argv[1])\n'
                        'print(os.readlink("/proc/self/ns/pid"))', mnt.path('r')],
                       capture_output=True, timeout=RUN_TIMEOUT)
    assert r.returncode == 0, r.stderr
    ns = _pidns_id(r.stdout.decode().strip())
    wait_log(mnt.dir, 'r', 'recovered')
    lines = log_for(mnt.dir, 'r')
    assert [l.event for l in lines] == ['acquired', 'recovered'], lines
    assert [l.details.get('container') for l in lines] == [ns, ns], lines


def test_a_slug_lock_of_root_is_not_root_in_a_containers(mnt, procs, new_pid_namespaces):
    """A slug is shown to everyone: root in a container with the host root's
    slug acts for that lock no more than for any other host lock."""
    env = dict(os.environ, LOCKFS_SLUG='deploy-bot')
    r = subprocess.run(['mkdir', mnt.path('s')], env=env, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert read_owner(mnt.mnt, 's')['bound'] == 'slug'
    r = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', 'rmdir', mnt.path('s')],
                       env=env, capture_output=True, timeout=RUN_TIMEOUT)
    assert r.returncode != 0 and b'Operation not permitted' in r.stderr, r
    assert os.path.isdir(mnt.path('s'))
    r = subprocess.run(['rmdir', mnt.path('s')], env=env, capture_output=True)
    assert r.returncode == 0, r.stderr


def test_container_root_takes_own_or_host_only(lockfs_factory, tmp_path):
    backing = tmp_path / 'b'
    backing.mkdir(mode=0o700)
    mnt = tempfile.mkdtemp(prefix='lockfs-it-cr-')
    try:
        r = subprocess.run([os.environ['LOCKFS_BIN'], '-f', '-o', f'backing={backing}',
                            '-o', 'container_root=all', mnt],
                           capture_output=True, timeout=RUN_TIMEOUT)
        assert r.returncode != 0
        assert b'container_root=all: want own or host' in r.stderr, r.stderr
    finally:
        os.rmdir(mnt)


# --------------------------------------------------------------------------
# podman (skipped where it cannot run)

IMAGE = 'localhost/lockfs-it-root-bb'

# In the container (root, no user namespace): the host's lock $1 and a lock
# of its own, $2, taken by its shell.
PODMAN_SCRIPT = '''
cat "/locks/$1/owner"; echo
if echo podman > "/locks/$1/break"; then echo host_break=0; else echo host_break=1; fi
mkdir "/locks/$2" || exit 9
cat "/locks/$2/owner"; echo
if echo podman > "/locks/$2/break"; then echo own_break=0; else echo own_break=1; fi
'''


@pytest.fixture(scope='module')
def busybox_image():
    """busybox-static with the applets PODMAN_SCRIPT uses."""
    yield from podman_helpers.busybox_image(IMAGE, ('sh', 'mkdir', 'rmdir', 'cat', 'echo', 'true'))


def _podman_parts(out):
    """The two owner texts and the two break results the script printed."""
    texts, results, cur = [], {}, []
    for line in out.decode().splitlines():
        if '=' in line and line.split('=')[0] in ('host_break', 'own_break'):
            k, v = line.split('=')
            results[k] = int(v)
        elif line == '' and cur:
            texts.append(json.loads('\n'.join(cur)))
            cur = []
        elif line:
            cur.append(line)
    return texts, results


@pytest.mark.slow
def test_podman_root_is_root_over_its_own_containers_locks_only(lockfs_factory, procs,
                                                               busybox_image):
    """The documented `podman run -v M:/locks` line, root without a user
    namespace: observed before, it read a host holder's --db-password and
    broke the host's lock."""
    mnt_ao = lockfs_factory(allow_other=True, options=('log_denied_interval=0',))
    holder = procs.agent(setup=f'# {SECRET}')
    assert holder.mkdir(mnt_ao.path('x')) == 0
    cidfile = os.path.join(tempfile.mkdtemp(prefix='lockfs-it-cid-'), 'cid')
    try:
        r = subprocess.run(PODMAN_RUN + ['--cidfile', cidfile, '-v', f'{mnt_ao.mnt}:/locks',
                                         busybox_image, 'sh', '-c', PODMAN_SCRIPT, 'sh', 'x',
                                         'p'],
                           capture_output=True, timeout=120)
        with open(cidfile) as f:
            cid = f.read().strip()
    finally:
        shutil.rmtree(os.path.dirname(cidfile), ignore_errors=True)
    assert r.returncode == 0, r.stderr
    (host, own), res = _podman_parts(r.stdout)
    assert host['holder']['cmdline'] is None and 'token' not in host, host
    assert SECRET not in r.stdout.decode()
    assert res['host_break'] == 1 and os.path.isdir(mnt_ao.path('x'))
    assert own['holder']['container'] == cid and len(own['token']) == 32, own
    assert own['holder']['cmdline'] is not None
    assert res['own_break'] == 0
    d = [l for l in log_for(mnt_ao.dir, 'x') if l.event == 'denied']
    assert len(d) == 1 and d[0].details.get('container') == cid, d
    b = [l for l in log_for(mnt_ao.dir, 'p') if l.event == 'broken']
    assert len(b) == 1 and b[0].details.get('by_container') == cid, b
    assert holder.rmdir(mnt_ao.path('x')) == 0
