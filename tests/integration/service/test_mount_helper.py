#!/usr/bin/python3
"""Issue 9 §3: mount(8) and fstab through mount.fuse3.

mount(8) runs `mount.fuse3 SOURCE MOUNTPOINT -o OPTS`, which runs
`lockfs SOURCE MOUNTPOINT -o OPTS` through /bin/sh with mount's cleaned
environment (no PATH: sh's default path, /usr/local/sbin first).  Each test
runs in a private mount namespace whose /usr/local/sbin is a directory
holding only a `lockfs` symlink to the binary under test, so the real
mount(8) and umount(8) find it without anything being installed.  The
namespace's agent is a child subreaper, so the daemon that mount.fuse3
starts (and that detaches) is its child, and its exit status is seen.
"""

import os
import shutil
import subprocess
import tempfile

import pytest

from lockfs_helpers import LOCKFS_BIN, daemon_stderr
from service_helpers import MOUNTPOINT_TOOL, NsAgent, mount_line
from service_helpers import daemon_pid as backing_pid


@pytest.fixture
def ns():
    """(agent in a private mount namespace with lockfs on mount's path, work dir)"""
    work = tempfile.mkdtemp(prefix='lockfs-mount-')
    os.chmod(work, 0o755)
    for d in ('bin', 'mnt'):
        os.mkdir(os.path.join(work, d))
    os.mkdir(os.path.join(work, 'dir'), 0o700)
    os.symlink(LOCKFS_BIN, os.path.join(work, 'bin', 'lockfs'))
    agent = NsAgent(['unshare', '--mount'],
                    setup=f'mount --bind {work}/bin /usr/local/sbin')
    yield agent, work
    mnt = os.path.join(work, 'mnt')
    agent.sh(f'while grep -q " {mnt} " /proc/self/mountinfo; do umount -l {mnt}; done')
    agent.close()
    for root, dirs, _ in os.walk(work):
        for d in dirs:
            subprocess.run(['chattr', '-i', os.path.join(root, d)], stderr=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)


def daemon_pid(work):
    return backing_pid(f'{work}/dir')


def assert_serves(agent, mnt):
    assert agent.errno_of('mkdir', f'{mnt}/x') == 0
    assert agent.errno_of('mkdir', f'{mnt}/x') == 17  # EEXIST: a lock, not a directory
    assert agent.errno_of('rmdir', f'{mnt}/x') == 0


def test_mount_t_fuse_lockfs_starts_the_daemon(ns):
    agent, work = ns
    mnt = f'{work}/mnt'
    r = agent.run(['mount', '-t', 'fuse.lockfs', 'lockfs', mnt,
                   '-o', f'backing={work}/dir,allow_other'])
    assert r['rc'] == 0, r['err']
    fstype, source, _ = mount_line(agent, mnt)
    assert (fstype, source) == ('fuse.lockfs', f'{work}/dir')
    assert_serves(agent, mnt)


def test_umount_stops_the_daemon_with_exit_status_0(ns):
    agent, work = ns
    mnt = f'{work}/mnt'
    r = agent.run(['mount', '-t', 'fuse.lockfs', 'lockfs', mnt, '-o', f'backing={work}/dir'])
    assert r['rc'] == 0, r['err']
    pid = daemon_pid(work)
    r = agent.run(['umount', mnt])
    assert r['rc'] == 0, r['err']
    assert agent.wait(pid, 10) == 0
    assert mount_line(agent, mnt) is None


def test_fstab_line_mounts_and_umount_stops_it(ns):
    agent, work = ns
    mnt = f'{work}/mnt'
    fstab = f'{work}/fstab'
    with open(fstab, 'w') as f:
        # the line docs/operations.md gives, with the test's paths
        f.write(f'lockfs {mnt} fuse.lockfs backing={work}/dir,allow_other,nofail 0 0\n')
    r = agent.run(['mount', '-T', fstab, mnt])
    assert r['rc'] == 0, r['err']
    assert mount_line(agent, mnt)[0] == 'fuse.lockfs'
    assert_serves(agent, mnt)
    pid = daemon_pid(work)
    assert agent.run(['umount', mnt])['rc'] == 0
    assert agent.wait(pid, 10) == 0
    # and `mount -a` of that fstab
    r = agent.run(['mount', '-T', fstab, '-a'])
    assert r['rc'] == 0, r['err']
    assert_serves(agent, mnt)
    pid = daemon_pid(work)
    assert agent.run(['umount', mnt])['rc'] == 0
    assert agent.wait(pid, 10) == 0


def test_options_meant_for_mount8_do_not_break_the_start(ns):
    agent, work = ns
    mnt = f'{work}/mnt'
    fstab = f'{work}/fstab'
    opts = (f'backing={work}/dir,allow_other,nofail,_netdev,defaults,noauto,rw,dev,suid,'
            'x-systemd.requires=network.target,comment=ours')
    with open(fstab, 'w') as f:
        f.write(f'lockfs {mnt} fuse.lockfs {opts} 0 0\n')
    r = agent.run(['mount', '-T', fstab, mnt])
    assert r['rc'] == 0, r['err']
    assert_serves(agent, mnt)
    pid = daemon_pid(work)
    assert agent.run(['umount', mnt])['rc'] == 0
    assert agent.wait(pid, 10) == 0
    # the same words straight to lockfs (mount.fuse3 drops only some)
    pid_opts = f'{opts},user,users,nouser,auto,owner,group,X-mount.mkdir'
    r = agent.run([LOCKFS_BIN, 'lockfs', mnt, '-o', pid_opts])
    assert r['rc'] == 0, r['err']
    assert_serves(agent, mnt)
    # dev and suid mean nothing here: the mount stays nodev,nosuid
    r = agent.run(['findmnt', '-n', '-o', 'VFS-OPTIONS', mnt])
    assert 'nodev' in r['out'] and 'nosuid' in r['out'], r['out']


def test_the_source_is_ignored_also_when_mount_makes_it_a_path(ns):
    """mount(8) canonicalises SOURCE against its working directory: run
    where a file named lockfs exists, `lockfs` arrives as its full path."""
    agent, work = ns
    mnt = f'{work}/mnt'
    r = agent.sh(f'cd {work}/bin && mount -t fuse.lockfs lockfs {mnt} -o backing={work}/dir')
    assert r['rc'] == 0, r['err']
    assert daemon_stderr(r['err']) == ''
    assert mount_line(agent, mnt)[1] == f'{work}/dir'
    assert_serves(agent, mnt)


def test_a_source_that_is_another_directory_gets_a_warning(ns):
    agent, work = ns
    mnt = f'{work}/mnt'
    os.mkdir(f'{work}/other', 0o700)
    r = agent.run([LOCKFS_BIN, f'{work}/other', mnt, '-o', f'backing={work}/dir'])
    assert r['rc'] == 0, r['err']
    assert daemon_stderr(r['err']) == (
        f'lockfs: warning: source {work}/other is ignored; the backing dir '
        f'is {work}/dir (-o backing=DIR)\n')
    assert mount_line(agent, mnt)[1] == f'{work}/dir'
    assert not os.listdir(f'{work}/other')


def test_three_positional_arguments_are_refused(ns):
    agent, work = ns
    r = agent.run([LOCKFS_BIN, 'lockfs', f'{work}/mnt', f'{work}/mnt'])
    assert r['rc'] == 1
    assert r['err'] == 'lockfs: too many arguments: want [SOURCE] MOUNTPOINT\n'


def test_fstab_default_backing_is_created_at_boot(ns):
    """At boot /run is empty: backing=/run/lockfs spelled out in fstab is
    the default, created when missing (here in a private /run)."""
    agent, work = ns
    mnt = f'{work}/mnt'
    agent.sh('mount -t tmpfs -o mode=0755 tmpfs /run', check=True)
    fstab = f'{work}/fstab'
    with open(fstab, 'w') as f:
        f.write(f'lockfs {mnt} fuse.lockfs backing=/run/lockfs,allow_other,nofail 0 0\n')
    r = agent.run(['mount', '-T', fstab, mnt])
    assert r['rc'] == 0, r['err']
    assert mount_line(agent, mnt)[1] == '/run/lockfs'
    assert_serves(agent, mnt)
    r = agent.run(['stat', '-c', '%a %U', '/run/lockfs'])
    assert r['out'].split()[1] == 'root'
    # an explicit dir other than the default is still never created
    r = agent.run([LOCKFS_BIN, '-f', '-o', 'backing=/run/other', f'{work}/dir'])
    assert r['rc'] == 1 and 'No such file or directory' in r['err']


def test_fstab_layout_lines_give_a_shared_parent_and_a_guarded_mount_point(ns):
    """docs/operations.md's two fstab lines for containers, and its one-time
    guard and symlink commands."""
    agent, work = ns
    share = f'{work}/share'
    fstab = f'{work}/fstab'
    with open(fstab, 'w') as f:
        f.write(f'{share} {share} none bind,shared 0 0\n'
                f'lockfs {share}/locks fuse.lockfs backing={work}/dir,allow_other,nofail 0 0\n')
    os.makedirs(f'{share}/locks')
    r = agent.run([MOUNTPOINT_TOOL, 'prepare', f'{share}/locks', f'{work}/link'],
                  env={'LOCKFS': LOCKFS_BIN})
    assert r['rc'] == 0, r['err']
    # prepare bound the share already; fstab does it at boot: start afresh
    agent.sh(f'umount {share}', check=True)
    r = agent.run(['mount', '-T', fstab, '-a'])
    assert r['rc'] == 0, r['err']
    assert any(t.startswith('shared:') for t in mount_line(agent, share)[2])
    assert mount_line(agent, f'{share}/locks')[0] == 'fuse.lockfs'
    assert_serves(agent, f'{work}/link')
    pid = daemon_pid(work)
    assert agent.run(['umount', f'{work}/link'])['rc'] == 0
    assert agent.wait(pid, 10) == 0
    assert agent.errno_of('mkdir', f'{work}/link/x') == 1  # EPERM: the guard
