#!/usr/bin/python3
"""Issue 9 review: what the README and the operations docs promise about
running lockfs is what it does -- lockctl run's exit status without a
mount, flock examples that cannot go on unlocked, every daemon option in
the README's table, and umount with another mount namespace holding a copy
of the mount."""

import os
import re
import signal
import subprocess

import pytest

from lockfs_helpers import LOCKFS_BIN, mount_entry, wait_until
from service_helpers import SOURCE_ROOT

LOCKCTL = os.path.join(os.environ.get('LOCKFS_BUILD', os.path.dirname(LOCKFS_BIN)),
                       'tools', 'lockctl')
DEADLINE = 10.0


def _read(rel):
    with open(os.path.join(SOURCE_ROOT, rel)) as f:
        return f.read()


def test_readme_states_lockctl_runs_exit_status_without_a_mount(tmp_path):
    if not os.access(LOCKCTL, os.X_OK):
        pytest.fail(f'{LOCKCTL} is not built')
    said = re.search(r'safest way is `lockctl run`.*?\(exit (\d+)', _read('README.md'), re.S)
    assert said, 'the README no longer says how lockctl run fails without a mount'
    r = subprocess.run([LOCKCTL, 'run', 'x', '--mount', str(tmp_path), '--', 'true'],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == int(said.group(1)), r
    assert len(r.stderr.splitlines()) == 1, r.stderr


@pytest.mark.parametrize('doc', ['README.md', 'docs/waiting.md'])
def test_flock_examples_stop_when_the_lock_file_cannot_be_opened(doc):
    """bash goes on after a failed `exec 9>FILE` (not in POSIX mode): the
    script must say `|| exit`, or it would run unlocked."""
    opens = [l for l in _read(doc).splitlines()
             if re.match(r'\s*exec \d>[^&]*\.flock/', l)]
    assert opens, f'{doc} has no flock example any more'
    for line in opens:
        assert re.match(r'\s*exec \d>\S+ \|\| exit\b', line), line


def test_readme_option_table_lists_every_daemon_option():
    r = subprocess.run([LOCKFS_BIN, '--help'], capture_output=True, text=True, timeout=10)
    ours = r.stdout.split('FUSE options')[0] if 'FUSE options' in r.stdout else r.stdout
    options = set(re.findall(r'^\s+-o (\w+)=', ours, re.M))
    assert {'backing', 'log_max', 'log_keep', 'log_denied_interval'} <= options
    table = set(re.findall(r'^\| `-o (\w+)=', _read('README.md'), re.M))
    assert options - table == set()


def _mount_ns(pid):
    return os.readlink(f'/proc/{pid}/ns/mnt')


def test_umount_leaves_the_daemon_serving_a_copy_in_another_mount_namespace_until_sigterm(
        lockfs_factory):
    """docs/operations.md and lockfs.8: umount on the host does not stop the
    daemon while an `unshare -m` shell holds a copy of the mount; SIGTERM
    does, and the copy then gives ENOTCONN."""
    m = lockfs_factory()
    ns = subprocess.Popen(['unshare', '--mount', '--propagation', 'private',
                           'sleep', '1000'])
    try:
        wait_until(lambda: _mount_ns(ns.pid) != _mount_ns(os.getpid()), DEADLINE,
                   what='the unshared mount namespace')
        assert subprocess.run(['umount', m.mnt], timeout=DEADLINE).returncode == 0
        assert mount_entry(m.mnt) is None
        inside = ['nsenter', '-t', str(ns.pid), '-m']
        r = subprocess.run(inside + ['mkdir', os.path.join(m.mnt, 'x')],
                           capture_output=True, text=True, timeout=DEADLINE)
        assert r.returncode == 0, r
        assert m.proc.poll() is None, 'the daemon stopped although a copy is mounted'
        assert m.signal(signal.SIGTERM) == 0
        r = subprocess.run(inside + ['stat', m.mnt], capture_output=True, text=True,
                           timeout=DEADLINE)
        assert 'Transport endpoint is not connected' in r.stderr, r
    finally:
        ns.kill()
        ns.wait(DEADLINE)
