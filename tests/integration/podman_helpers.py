"""podman with a private storage and a small image, for the container tests
(issue 22): busybox with its applets, util-linux `flock` with the libraries
it needs, and lockctl-static as /bin/lockctl.

`podman_storage()` is a generator for a module-scoped fixture: it yields
the podman argv prefix (private --root and --runroot, so that parallel runs
never share containers or images), or skips with the reason where podman
cannot run a container here (see the flags in FLAGS); afterwards it removes
every container and image it made, and the storage.
"""

import os
import shutil
import subprocess
import tarfile
import tempfile

import pytest

from lockfs_helpers import BUILD

PODMAN_TIMEOUT = 120
IMAGE = 'localhost/lockfs-it-pidns'
LOCKCTL_STATIC = os.path.join(BUILD, 'tools', 'lockctl-static')
#: what podman 4.3.1 needs on the test VM (runc; crun fails on its cgroups
#: and rlimits)
FLAGS = ['--runtime=runc', '--network=none', '--ulimit', 'nofile=20000:20000',
         '--ulimit', 'nproc=4096:4096']


def _add_file(t, src, arcname):
    info = t.gettarinfo(os.path.realpath(src), arcname=arcname)
    info.uid = info.gid = 0
    info.uname = info.gname = 'root'
    with open(src, 'rb') as f:
        t.addfile(info, f)


def _add_dir(t, name):
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    t.addfile(info)


def podman_storage():
    for tool in ('podman', 'runc', 'busybox', 'flock'):
        if not shutil.which(tool):
            pytest.skip(f'{tool} is not installed')
    if not os.access(LOCKCTL_STATIC, os.X_OK):
        pytest.skip(f'{LOCKCTL_STATIC} was not built (a sanitizer build, or '
                    '-Dstatic_lockctl=disabled)')
    work = tempfile.mkdtemp(prefix='lockfs-it-podman-')
    base = ['podman', '--root', f'{work}/storage', '--runroot', f'{work}/run',
            '--storage-driver', 'vfs', '--cgroup-manager', 'cgroupfs']
    try:
        tar = os.path.join(work, 'rootfs.tar')
        flock = shutil.which('flock')
        libs = subprocess.run(['ldd', flock], capture_output=True, text=True).stdout
        with tarfile.open(tar, 'w') as t:
            for d in ('bin', 'usr', 'usr/bin', 'lib', 'lib64', 'lib/x86_64-linux-gnu', 'locks',
                      'proc', 'sys', 'dev', 'tmp'):
                _add_dir(t, d)
            _add_file(t, shutil.which('busybox'), 'bin/busybox')
            for applet in ('sh', 'mkdir', 'rmdir', 'cat', 'sleep', 'true', 'timeout'):
                info = tarfile.TarInfo(f'bin/{applet}')
                info.type, info.linkname = tarfile.SYMTYPE, 'busybox'
                t.addfile(info)
            _add_file(t, flock, 'usr/bin/flock')
            _add_file(t, LOCKCTL_STATIC, 'bin/lockctl')
            for word in libs.split():
                if word.startswith('/') and os.path.exists(word):
                    _add_file(t, word, word.lstrip('/'))
        r = subprocess.run(base + ['import', tar, IMAGE], capture_output=True,
                           timeout=PODMAN_TIMEOUT)
        if r.returncode != 0:
            pytest.skip(f'podman import fails here: {r.stderr.decode()[-300:]}')
        r = subprocess.run(base + ['run', '--rm'] + FLAGS + [IMAGE, 'true'], capture_output=True,
                           timeout=PODMAN_TIMEOUT)
        if r.returncode != 0:
            pytest.skip(f'podman cannot run a container here: {r.stderr.decode()[-300:]}')
        yield base
    finally:
        subprocess.run(base + ['rm', '-f', '-a', '-t', '0'], capture_output=True,
                       timeout=PODMAN_TIMEOUT)
        subprocess.run(base + ['rmi', '-a', '-f'], capture_output=True, timeout=PODMAN_TIMEOUT)
        # vfs layers may hold files podman made read-only
        subprocess.run(['rm', '-rf', work], capture_output=True, timeout=PODMAN_TIMEOUT)


#: `podman run` on the host's own storage (for busybox_image's images)
PODMAN_RUN = ['podman', 'run', '--rm'] + FLAGS


def busybox_image(image, applets):
    """A generator for a module-scoped fixture: IMAGE, a one-binary image in
    the host's own podman storage (busybox-static with APPLETS as symlinks,
    and /locks), removed afterwards; or a skip with the reason where podman
    cannot import or run it."""
    if not shutil.which('podman'):
        pytest.skip('podman is not installed')
    busybox = shutil.which('busybox')
    if not busybox:
        pytest.skip('busybox is not installed')
    d = tempfile.mkdtemp(prefix='lockfs-it-rootfs-')
    try:
        tar = os.path.join(d, 'rootfs.tar')
        with tarfile.open(tar, 'w') as t:
            for sub in ('bin', 'locks', 'proc', 'sys', 'dev', 'tmp'):
                _add_dir(t, sub)
            t.add(os.path.realpath(busybox), arcname='bin/busybox')
            for applet in applets:
                info = tarfile.TarInfo(f'bin/{applet}')
                info.type, info.linkname = tarfile.SYMTYPE, '/bin/busybox'
                t.addfile(info)
        r = subprocess.run(['podman', 'import', tar, image], capture_output=True, timeout=120)
        if r.returncode != 0:
            pytest.skip(f'podman import fails here: {r.stderr.decode()[-300:]}')
        r = subprocess.run(PODMAN_RUN + [image, 'true'], capture_output=True, timeout=120)
        if r.returncode != 0:
            subprocess.run(['podman', 'rmi', '-f', image], capture_output=True, timeout=60)
            pytest.skip(f'podman cannot run a container here: {r.stderr.decode()[-300:]}')
        yield image
        subprocess.run(['podman', 'rmi', '-f', image], capture_output=True, timeout=60)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def pm(base, *args, timeout=PODMAN_TIMEOUT):
    """Run podman (BASE, from podman_storage) with ARGS: the CompletedProcess."""
    return subprocess.run(base + list(args), capture_output=True, timeout=timeout)


def start_container(base, mnt, *cmd):
    """A detached container of IMAGE with MNT at /locks, running CMD: its id."""
    r = pm(base, 'run', '-d', *FLAGS, '-v', f'{mnt}:/locks', IMAGE, *cmd)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()
