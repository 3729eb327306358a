"""Issue 22 §1: the walk past helpers never leaves the caller's pid namespace.

"A process whose parent is outside its pid namespace is the holder
itself": `flock`, `mkdir` or `lockctl` started as the first process of a
namespace (`unshare --pid --fork`, `podman run`, `podman exec`) holds for
itself, never `unshare`, `conmon` or `runc`, which are nobody's holders in
there and answer for every container at once.  A verb that binds a lock to
a parent it cannot have (`lockctl acquire` whose parent is outside its pid
namespace) fails with one line and exit status 64.  docs/holder.md, "The
pid namespace boundary"; docs/lockctl.1, EXIT STATUS.

The podman cases are in test_pidns_podman.py.
"""

import json
import os
import subprocess
import tempfile

import pytest

from flock_helpers import fpath
from lockfs_helpers import BUILD, log_for, rmtree_unguarded, wait_free

RUN_TIMEOUT = 30
LOCKCTL = os.path.join(BUILD, 'tools', 'lockctl')
EX_USAGE = 64

UNSHARE = ['unshare', '--pid', '--fork', '--mount-proc']


@pytest.fixture(scope='module', autouse=True)
def _pid_namespaces():
    if subprocess.run(UNSHARE + ['true']).returncode != 0:
        pytest.fail('cannot create a pid namespace here (unshare --pid --fork --mount-proc)')


def unshared(argv, **kw):
    """Run ARGV as the first process of a new pid namespace."""
    return subprocess.run(UNSHARE + argv, capture_output=True, timeout=RUN_TIMEOUT, cwd='/',
                          **kw)


def test_flock_first_in_a_pid_namespace_holds_for_itself(mnt):
    """The issue's case: `unshare ... flock M/.flock/nsx cat M/nsx/owner`
    named `unshare`, a process outside the namespace."""
    r = unshared(['flock', fpath(mnt, 'nsx'), 'cat', mnt.path('nsx', 'owner')])
    assert r.returncode == 0, r.stderr
    h = json.loads(r.stdout)['holder']
    assert (h['comm'], h['ns_pid']) == ('flock', 1), h
    wait_free(mnt, 'nsx', timeout=5)


def test_a_shell_first_in_a_pid_namespace_still_holds_for_its_helpers(mnt):
    """Negative control: inside one namespace the walk goes on to the
    shell, as everywhere."""
    r = unshared(['/bin/sh', '-c', 'flock "$1" cat "$2"; true', 'sh', fpath(mnt, 'nsx'),
                  mnt.path('nsx', 'owner')])
    assert r.returncode == 0, r.stderr
    h = json.loads(r.stdout)['holder']
    assert (h['comm'], h['ns_pid']) == ('sh', 1), h


def test_mkdir_first_in_a_pid_namespace_is_its_own_holder(mnt):
    """`mkdir` as the first process holds, and with its exit the lock
    goes: the log names mkdir, not unshare."""
    r = unshared(['mkdir', mnt.path('nsm')])
    assert r.returncode == 0, r.stderr
    wait_free(mnt, 'nsm', timeout=5)
    acquired = [l for l in log_for(mnt.dir, 'nsm') if l.event == 'acquired']
    assert len(acquired) == 1 and acquired[0].who.startswith('mkdir['), acquired


def test_lockctl_run_first_in_a_pid_namespace_holds_while_cmd_runs(mnt):
    r = unshared([LOCKCTL, '--mount', mnt.mnt, 'run', 'nsr', '--', 'cat',
                  mnt.path('nsr', 'owner')])
    assert r.returncode == 0, r.stderr
    h = json.loads(r.stdout)['holder']
    assert (h['comm'], h['ns_pid']) == ('lockctl', 1), h
    wait_free(mnt, 'nsr', timeout=5)


def test_lockctl_acquire_without_a_parent_in_its_namespace_fails_with_64(mnt):
    """`lockctl acquire` binds the lock to its parent; as the first process
    of a namespace it has none there (getppid() is 0).  It used to exit 0
    and the lock, bound to `unshare`, went when unshare exited."""
    r = unshared([LOCKCTL, '--mount', mnt.mnt, 'acquire', 'nsa'])
    err = r.stderr.decode()
    assert r.returncode == EX_USAGE, (r.returncode, err)
    assert err.count('\n') == 1 and err.startswith('lockctl: nsa: '), err
    assert 'pid namespace' in err, err
    assert 'nsa' not in os.listdir(mnt.mnt)
    assert log_for(mnt.dir, 'nsa') == []  # it never took the lock


def test_lockctl_acquire_from_a_shell_in_the_namespace_binds_to_it(mnt):
    """Negative control: with a shell of its own namespace as parent,
    acquire works and the shell holds (and releases)."""
    r = unshared(['/bin/sh', '-c', '"$1" --mount "$2" acquire nsa || exit 7; cat "$2/nsa/owner";'
                  ' rmdir "$2/nsa"', 'sh', LOCKCTL, mnt.mnt])
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert (o['bound'], o['holder']['comm'], o['holder']['ns_pid']) == ('process', 'sh', 1), o


def test_lockctl_acquire_with_a_slug_needs_no_parent(mnt):
    """A slug lock is (uid, slug)'s, not a process's: acquire --slug works
    as the first process of a namespace."""
    r = unshared([LOCKCTL, '--mount', mnt.mnt, 'acquire', '--slug', 'nsjob', 'nss'])
    assert r.returncode == 0, r.stderr
    try:
        with open(mnt.path('nss', 'owner')) as f:
            o = json.load(f)
        assert (o['bound'], o['slug']) == ('slug', 'nsjob'), o
    finally:
        r = subprocess.run([LOCKCTL, '--mount', mnt.mnt, 'release', 'nss', '--slug', 'nsjob'],
                           capture_output=True, timeout=RUN_TIMEOUT)
        assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------
# a parent the daemon cannot see (PPid 0 in its /proc)

@pytest.fixture
def daemon_in_a_pid_namespace(lockfs_factory):
    """The daemon as the first process of a pid namespace of its own, with
    its own /proc, and its mount propagated back here: the mount point is
    in a directory bound onto itself and made shared, and the daemon's
    mount namespace keeps that propagation.  (The Mount, the daemon's pid
    as seen here.)"""
    top = tempfile.mkdtemp(prefix='lockfs-it-pidns-')
    os.chmod(top, 0o755)
    subprocess.run(['mount', '--bind', top, top], check=True)
    try:
        subprocess.run(['mount', '--make-shared', top], check=True)
        os.mkdir(os.path.join(top, 'mnt'))
        m = lockfs_factory(mountpoint=os.path.join(top, 'mnt'),
                           wrapper=UNSHARE + ['--propagation', 'unchanged'])
        with open(f'/proc/{m.pid}/task/{m.pid}/children') as f:
            daemon = int(f.read().split()[0])           # unshare forked it
        yield m, daemon
        if not m.stopped:
            assert m.unmount() == 0
    finally:
        subprocess.run(['umount', top], check=True)
        rmtree_unguarded(top)  # the daemon guarded its mount point (chattr +i)


def test_a_helper_whose_parent_the_daemon_cannot_see_holds_itself(daemon_in_a_pid_namespace):
    """`nsenter --pid` into the daemon's namespace: flock's parent (nsenter)
    is outside it, and the daemon reads PPid 0.  flock holds; it used to
    be refused (EACCES, an orphan of nobody)."""
    m, daemon = daemon_in_a_pid_namespace
    r = subprocess.run(['nsenter', '-t', str(daemon), '--pid', '--', 'flock', fpath(m, 'pz'),
                        'cat', m.path('pz', 'owner')],
                       capture_output=True, timeout=RUN_TIMEOUT, cwd='/')
    assert r.returncode == 0, r.stderr
    h = json.loads(r.stdout)['holder']
    assert h['comm'] == 'flock' and h['pid'] == h['ns_pid'], h  # in the daemon's namespace
    wait_free(m, 'pz', timeout=5)


def test_a_shell_entered_into_the_daemons_namespace_holds_for_its_helpers(
        daemon_in_a_pid_namespace):
    """Negative control: below the entered shell, the walk goes on to it."""
    m, daemon = daemon_in_a_pid_namespace
    r = subprocess.run(['nsenter', '-t', str(daemon), '--pid', '--', 'sh', '-c',
                        'flock "$1" cat "$2"; true', 'sh', fpath(m, 'pz'), m.path('pz', 'owner')],
                       capture_output=True, timeout=RUN_TIMEOUT, cwd='/')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)['holder']['comm'] == 'sh'


def test_lockctl_acquire_under_a_helper_first_in_a_namespace_is_refused(mnt):
    """`timeout 5 lockctl acquire X` as the first process: lockctl has a
    parent (timeout), but the walk stops at timeout, which exits with
    lockctl.  The daemon refuses the binding (77, one line) rather than
    bind the lock to a helper; it used to bind it to `unshare`, exit 0,
    and the lock went with unshare."""
    r = unshared(['timeout', '5', LOCKCTL, '--mount', mnt.mnt, 'acquire', 'nst'])
    err = r.stderr.decode()
    assert r.returncode == 77, (r.returncode, err)
    assert err.count('\n') == 1 and 'pid namespace' in err, err
    assert 'nst' not in os.listdir(mnt.mnt)
