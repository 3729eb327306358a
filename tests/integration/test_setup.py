#!/usr/bin/python3
"""Issue 9 §3 "setup script" and issue 10 §5: tools/setup.sh.

setup.sh runs in a private mount namespace (its binds and mounts vanish with
it), with --no-install (nothing goes to /usr/local in a test) and temporary
SHARE, backing dirs and MOUNTPOINTs.  This machine has no systemd as pid 1,
so setup builds the unit's layout and starts the daemon itself.  A fake
apt-get first on PATH records whether setup tried to install anything.
"""

import errno
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from service_helpers import BUILD, SOURCE_ROOT, NsAgent, daemon_pid, mount_line

SETUP = os.path.join(SOURCE_ROOT, 'tools', 'setup.sh')


@pytest.fixture
def setup_env():
    work = tempfile.mkdtemp(prefix='lockfs-setup-')
    os.chmod(work, 0o755)
    fake = os.path.join(work, 'fakebin')
    os.mkdir(fake)
    with open(os.path.join(fake, 'apt-get'), 'w') as f:
        f.write(f'#!/bin/sh\necho "$@" >> {work}/apt-get.calls\n')
    os.chmod(os.path.join(fake, 'apt-get'), 0o755)
    host = NsAgent(['unshare', '--mount'])
    env = {'PATH': f'{fake}:{os.environ["PATH"]}'}

    def setup(*args, as_user=None):
        argv = [SETUP, '--no-install', '--build', BUILD, '--share', f'{work}/share', *args]
        if as_user is not None:
            argv = ['setpriv', f'--reuid={as_user.uid}', f'--regid={as_user.gid}',
                    '--clear-groups', *argv]
        return host.run(argv, env=env, timeout=300)

    setup.work = work
    setup.host = host
    setup.fake = fake
    setup.env = env
    yield setup
    # stop every daemon this test started, then drop the namespace
    r = host.run(['cat', '/proc/self/mountinfo'])
    for line in r['out'].splitlines():
        if ' - fuse.lockfs ' in line and work in line:
            mp = line.split(' ')[4]
            pid = None
            src = line.split(' - ')[1].split(' ')[1]
            try:
                pid = int(open(os.path.join(src, '.lockfs')).read())
            except (OSError, ValueError):
                pass
            host.run(['umount', '-l', mp])
            if pid:
                host.wait(pid, 10)
    host.close()
    for root, dirs, _ in os.walk(work):
        for d in dirs:
            subprocess.run(['chattr', '-i', os.path.join(root, d)], stderr=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)


def apt_calls(setup):
    try:
        with open(os.path.join(setup.work, 'apt-get.calls')) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def test_setup_starts_lockfs_with_the_container_layout_and_says_what_it_changed(setup_env):
    w = setup_env.work
    os.mkdir(f'{w}/dir', 0o700)
    r = setup_env('--backing', f'{w}/dir', f'{w}/locks')
    assert r['rc'] == 0, r['err']
    out = r['out']
    assert 'the packages lockfs needs are installed already' in out
    assert apt_calls(setup_env) == [], 'nothing was missing: no apt-get'
    assert f'bound {w}/share onto itself' in out
    assert f'made {w}/share a shared mount' in out
    assert f'created the symlink {w}/locks -> {w}/share/locks' in out
    assert f'started lockfs on {w}/share/locks (backing dir {w}/dir)' in out
    assert f'setup: guarded {w}/share/locks (immutable underneath' in out
    host = setup_env.host
    assert mount_line(host, f'{w}/share/locks')[:2] == ('fuse.lockfs', f'{w}/dir')
    assert host.errno_of('mkdir', f'{w}/locks/x') == 0
    assert host.errno_of('mkdir', f'{w}/locks/x') == errno.EEXIST
    assert host.errno_of('rmdir', f'{w}/locks/x') == 0
    # the guard under the mount: while lockfs is not mounted, mkdir fails
    pid = daemon_pid(f'{w}/dir')
    assert host.run(['umount', f'{w}/share/locks'])['rc'] == 0
    assert host.wait(pid, 10) == 0
    assert host.errno_of('mkdir', f'{w}/locks/x') == errno.EPERM


def test_setup_again_changes_nothing(setup_env):
    w = setup_env.work
    os.mkdir(f'{w}/dir', 0o700)
    assert setup_env('--backing', f'{w}/dir', f'{w}/locks')['rc'] == 0
    pid = daemon_pid(f'{w}/dir')
    r = setup_env('--backing', f'{w}/dir', f'{w}/locks')
    assert r['rc'] == 0, r['err']
    assert f'lockfs is serving {w}/share/locks already' in r['out']
    assert not re.search(r'setup: (bound|made|created|started|guarded)', r['out']), r['out']
    assert daemon_pid(f'{w}/dir') == pid


def test_setup_a_second_instance_beside_a_running_one(setup_env):
    w = setup_env.work
    host = setup_env.host
    r = setup_env('--backing', f'{w}/dir', f'{w}/locks')
    assert r['rc'] == 0, r['err']
    first = daemon_pid(f'{w}/dir')
    assert host.errno_of('mkdir', f'{w}/locks/shared-name') == 0
    r = setup_env('--backing', f'{w}/dir-ci', '-o', 'lease=60', f'{w}/ci')
    assert r['rc'] == 0, r['err']
    assert f'created the backing dir {w}/dir-ci (mode 0700)' in r['out']
    assert f'started lockfs on {w}/share/ci (backing dir {w}/dir-ci)' in r['out']
    assert 'bound' not in r['out'], 'the shared parent is there already'
    # two lock trees: a name held in one is free in the other
    assert host.errno_of('mkdir', f'{w}/ci/shared-name') == 0
    assert os.path.isdir(f'{w}/dir/shared-name.lock') and os.path.isdir(
        f'{w}/dir-ci/shared-name.lock')
    assert daemon_pid(f'{w}/dir') == first
    assert host.errno_of('rmdir', f'{w}/ci/shared-name') == 0
    assert host.errno_of('rmdir', f'{w}/locks/shared-name') == 0
    # the options reached the second daemon
    ci = daemon_pid(f'{w}/dir-ci')
    r = host.run(['cat', f'/proc/{ci}/cmdline'])
    assert 'lease=60' in r['out']


def test_setup_installs_only_the_missing_packages(setup_env):
    w = setup_env.work
    # a pkg-config that does not know libsystemd: as on a machine without
    # libsystemd-dev
    real = shutil.which('pkg-config')
    with open(os.path.join(setup_env.fake, 'pkg-config'), 'w') as f:
        f.write('#!/bin/sh\n'
                'for a; do [ "$a" = libsystemd ] && exit 1; done\n'
                f'exec {real} "$@"\n')
    os.chmod(os.path.join(setup_env.fake, 'pkg-config'), 0o755)
    r = setup_env('--backing', f'{w}/dir', f'{w}/locks')
    assert r['rc'] == 0, r['err']
    assert 'installing the missing Debian packages: libsystemd-dev' in r['out']
    assert apt_calls(setup_env) == [
        'update -q', 'install -y -q --no-install-recommends libsystemd-dev']


def test_setup_as_a_normal_user_says_how_to_run_it_as_root(setup_env, users):
    w = setup_env.work
    r = setup_env(f'{w}/locks', as_user=users[0])
    assert r['rc'] == 1
    assert 'run this as root' in r['err'] and 'su -c' in r['err'], r['err']
    assert not os.path.lexists(f'{w}/locks') and not os.path.exists(f'{w}/share')
    assert apt_calls(setup_env) == []


def test_readme_setup_commands_need_no_sudo():
    """issue 10 §5: a fresh Debian 12 machine has no sudo; the README's
    first commands run as root as they are."""
    with open(os.path.join(SOURCE_ROOT, 'README.md')) as f:
        readme = f.read()
    first_block = readme.split('```sh', 1)[1].split('```', 1)[0]
    commands = [l.split('#')[0].strip() for l in first_block.splitlines() if l.strip()]
    assert any(c.startswith('tools/setup.sh') for c in commands), commands
    assert not [c for c in commands if c.startswith('sudo')], commands


def test_setup_installs_under_usr_local_and_serves_from_there(setup_env):
    """The README's first command as it is (no --no-install), with a tmpfs
    over /usr/local in the test's namespace so that nothing really lands
    there."""
    w = setup_env.work
    host = setup_env.host
    host.sh('mount -t tmpfs -o mode=0755 tmpfs /usr/local', check=True)
    r = host.run(['/bin/bash', SETUP, '--build', BUILD, '--share', f'{w}/share',
                  '--backing', f'{w}/dir', f'{w}/locks'], env=setup_env.env, timeout=300)
    assert r['rc'] == 0, r['err']
    for path in ('/usr/local/bin/lockfs', '/usr/local/bin/lockctl',
                 '/usr/local/sbin/lockfs-mountpoint',
                 '/usr/local/lib/systemd/system/lockfs.service',
                 '/usr/local/share/man/man8/lockfs.8'):
        assert f'setup: installed {path}\n' in r['out'], (path, r['out'])
    pid = daemon_pid(f'{w}/dir')
    exe = host.run(['readlink', f'/proc/{pid}/exe'])['out'].strip()
    assert exe == '/usr/local/bin/lockfs'
    assert host.errno_of('mkdir', f'{w}/locks/x') == 0
    assert host.errno_of('rmdir', f'{w}/locks/x') == 0
    # again: the same files are there, so nothing is said to be installed
    r = host.run(['/bin/bash', SETUP, '--build', BUILD, '--share', f'{w}/share',
                  '--backing', f'{w}/dir', f'{w}/locks'], env=setup_env.env, timeout=300)
    assert r['rc'] == 0, r['err']
    assert 'setup: installed' not in r['out'], r['out']
    assert 'setup: the installed files are up to date\n' in r['out']
    assert daemon_pid(f'{w}/dir') == pid
