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
    # and a dpkg (setup runs `dpkg --configure -a` before installing)
    with open(os.path.join(fake, 'dpkg'), 'w') as f:
        f.write(f'#!/bin/sh\necho "dpkg $@" >> {work}/apt-get.calls\n')
    os.chmod(os.path.join(fake, 'dpkg'), 0o755)
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
    # a dpkg-query that says libsystemd-dev is not installed, as on a machine
    # without it; setup asks dpkg, not whether some command is on PATH
    real = shutil.which('dpkg-query')
    with open(os.path.join(setup_env.fake, 'dpkg-query'), 'w') as f:
        f.write('#!/bin/sh\n'
                'for a; do [ "$a" = libsystemd-dev ] && '
                '{ echo "dpkg-query: no packages found matching $a" >&2; exit 1; }; done\n'
                f'exec {real} "$@"\n')
    os.chmod(os.path.join(setup_env.fake, 'dpkg-query'), 0o755)
    r = setup_env('--backing', f'{w}/dir', f'{w}/locks')
    assert r['rc'] == 0, r['err']
    assert 'installing the missing Debian packages: libsystemd-dev\n' in r['out']
    assert apt_calls(setup_env) == [
        'dpkg --configure -a', 'update -q',
        'install -y -q --no-install-recommends libsystemd-dev']


def test_setup_reads_the_one_list_of_packages():
    """issue 20 §2: tools/packages.txt is the one list; no script names the
    packages again."""
    with open(os.path.join(SOURCE_ROOT, 'tools', 'packages.txt')) as f:
        listed = [l.split() for l in f.read().splitlines() if l.strip() and not l.startswith('#')]
    assert listed and all(len(l) == 2 and l[0] in ('build', 'run', 'test') for l in listed)
    for script in ('setup.sh', 'deps.sh', 'test.sh'):
        with open(os.path.join(SOURCE_ROOT, 'tools', script)) as f:
            text = f.read()
        assert 'tools/packages.txt' in text, script
        for pkg in ('libfuse3-dev', 'libjansson-dev', 'libunistring-dev', 'libcmocka-dev'):
            assert pkg not in text, (script, pkg)


def test_setup_shows_why_meson_setup_failed_and_runs_again(setup_env):
    """issue 20 §2: `meson setup` failing (here a dependency missing) is
    shown, not sent to /dev/null; the half-made build dir it leaves is set
    up again by the next run instead of being trusted."""
    w = setup_env.work
    build = f'{w}/build'
    real = shutil.which('meson')
    with open(os.path.join(setup_env.fake, 'meson'), 'w') as f:
        f.write('#!/bin/sh\n'
                f'if [ "$1" = setup ] && [ ! -e {w}/meson-works ]; then\n'
                '  for a; do case $a in -*) ;; *) d=$a ;; esac; done\n'
                '  mkdir -p "$d/meson-logs" "$d/meson-private"\n'
                '  echo "meson.build:19:0: ERROR: Dependency \\"libunistring\\" not found"\n'
                '  exit 1\n'
                'fi\n'
                f'exec {real} "$@"\n')
    os.chmod(os.path.join(setup_env.fake, 'meson'), 0o755)
    r = setup_env.host.run([SETUP, '--no-install', '--build', build, '--share', f'{w}/share',
                            '--backing', f'{w}/dir', f'{w}/locks'], env=setup_env.env,
                           timeout=300)
    assert r['rc'] == 1
    assert 'ERROR: Dependency "libunistring" not found' in r['err'], r
    assert f'setup: meson setup {build} failed (above)' in r['err'], r
    # the dependency is there now: the same command succeeds
    open(f'{w}/meson-works', 'w').close()
    r = setup_env.host.run([SETUP, '--no-install', '--build', build, '--share', f'{w}/share',
                            '--backing', f'{w}/dir', f'{w}/locks'], env=setup_env.env,
                           timeout=900)
    assert r['rc'] == 0, r
    assert os.path.exists(f'{build}/build.ninja') and os.path.exists(f'{build}/lockfs')
    assert setup_env.host.errno_of('mkdir', f'{w}/locks/x') == 0
    assert setup_env.host.errno_of('rmdir', f'{w}/locks/x') == 0


def test_configure_sets_up_again_a_build_dir_left_halfway():
    """issue 20 §2: a build dir whose setup was interrupted (coredata.dat,
    no build.ninja) is wiped and set up, not trusted (tools/test.sh used to
    skip `meson setup` because the directory existed)."""
    build = tempfile.mkdtemp(prefix='lockfs-configure-')
    try:
        configure = os.path.join(SOURCE_ROOT, 'tools', 'configure.sh')
        r = subprocess.run([configure, build], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r
        os.unlink(os.path.join(build, 'build.ninja'))
        r = subprocess.run([configure, build], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r
        assert 'was set up halfway (no build.ninja): wiping it' in r.stderr
        assert os.path.exists(os.path.join(build, 'build.ninja'))
        with open(os.path.join(SOURCE_ROOT, 'tools', 'test.sh')) as f:
            assert 'tools/configure.sh "$build"' in f.read()
    finally:
        shutil.rmtree(build)


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


def test_setup_remove_undoes_what_setup_made(setup_env):
    """issue 20 §3: `tools/setup.sh --remove MOUNTPOINT` stops the daemon,
    unmounts, drops the guard, the symlink and the shared parent, and says
    that the packages stay."""
    w = setup_env.work
    host = setup_env.host
    os.mkdir(f'{w}/dir', 0o700)
    assert setup_env('--backing', f'{w}/dir', f'{w}/locks')['rc'] == 0
    pid = daemon_pid(f'{w}/dir')
    assert host.errno_of('mkdir', f'{w}/locks/held') == 0
    r = setup_env('--remove', f'{w}/locks')
    assert r['rc'] == 0, r
    assert f'setup: unmounted lockfs from {w}/share/locks\n' in r['out']
    assert f'setup: the daemon (pid {pid}) has exited\n' in r['out']
    assert f'setup: removed the guarded mount point {w}/share/locks\n' in r['out']
    assert f'setup: removed the symlink {w}/locks\n' in r['out']
    assert f'setup: unmounted the bind mount {w}/share\n' in r['out']
    assert f'setup: removed {w}/share\n' in r['out']
    assert 'the Debian packages setup installed stay installed' in r['out']
    assert not host.run(['test', '-d', f'/proc/{pid}'])['rc'] == 0
    assert not mount_line(host, f'{w}/share/locks')
    assert not mount_line(host, f'{w}/share')
    assert not os.path.lexists(f'{w}/locks') and not os.path.exists(f'{w}/share')
    # the locks' state stays in the backing dir
    assert os.path.isdir(f'{w}/dir/held.lock')
    # and setup works again afterwards
    r = setup_env('--backing', f'{w}/dir', f'{w}/locks')
    assert r['rc'] == 0, r
    assert f'started lockfs on {w}/share/locks' in r['out']


def test_setup_remove_leaves_the_other_lock_tree(setup_env):
    w = setup_env.work
    host = setup_env.host
    assert setup_env('--backing', f'{w}/dir', f'{w}/locks')['rc'] == 0
    assert setup_env('--backing', f'{w}/dir-ci', f'{w}/ci')['rc'] == 0
    r = setup_env('--remove', f'{w}/ci')
    assert r['rc'] == 0, r
    assert f'left the bind mount {w}/share: another lock tree is mounted under it' in r['out']
    assert not os.path.lexists(f'{w}/ci')
    assert host.errno_of('mkdir', f'{w}/locks/x') == 0
    assert host.errno_of('rmdir', f'{w}/locks/x') == 0


def test_setup_remove_deletes_what_it_installed_under_usr_local(setup_env):
    w = setup_env.work
    host = setup_env.host
    host.sh('mount -t tmpfs -o mode=0755 tmpfs /usr/local', check=True)
    argv = ['/bin/bash', SETUP, '--build', BUILD, '--share', f'{w}/share',
            '--backing', f'{w}/dir', f'{w}/locks']
    r = host.run(argv, env=setup_env.env, timeout=300)
    assert r['rc'] == 0, r['err']
    installed = re.findall(r'^setup: installed (\S+)$', r['out'], re.M)
    assert '/usr/local/bin/lockfs' in installed
    r = host.run(argv[:2] + ['--remove'] + argv[2:], env=setup_env.env, timeout=300)
    assert r['rc'] == 0, r
    for path in installed:
        assert f'setup: removed {path}\n' in r['out'], (path, r['out'], r['err'])
        assert host.run(['test', '-e', path])['rc'] != 0, path
    # the directories meson made for the units go; the standard ones stay
    assert 'setup: removed the directory /usr/local/lib/systemd/system\n' in r['out']
    assert 'setup: removed the directory /usr/local/bin\n' not in r['out']
    assert host.run(['test', '-d', '/usr/local/bin'])['rc'] == 0
    assert not mount_line(host, f'{w}/share/locks')
