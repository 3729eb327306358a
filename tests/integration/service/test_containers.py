#!/usr/bin/python3
"""Issue 9 §4: a running container keeps using the lock tree across a
restart of the daemon and across a crash that the service manager restarts.

The layout the unit builds (tools/systemd/lockfs.service): the daemon mounts on
SHARE/locks, SHARE is a shared bind mount of itself, the host's path (here
LINK, /locks by default) is a symlink to SHARE/locks, and a container gets
SHARE with rslave propagation.  The tests run the unit's own ExecStartPre,
ExecStart (with a NOTIFY_SOCKET, awaiting READY=1) and ExecStopPost lines,
with LOCKFS_SHARE/LOCKFS_LINK/LOCKFS_BACKING pointing at temporary paths, in
a private mount namespace standing for the host; "containers" are
`unshare --mount --pid --fork --propagation slave` below it, which bind
SHARE (`mount --rbind`, then rslave) as podman's `-v SHARE:SHARE:rslave`
does.  Each container is a long-lived process that takes locks itself, as a
container's main shell would.  A podman test runs the same where podman can.
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import tempfile

import pytest

from conftest import stderr_problems
from lockfs_helpers import LOCKFS_BIN, wait_until
from service_helpers import (LOCKCTL_STATIC, static_lockctl_or_skip, DgramSocket, NsAgent, mount_line,
                             mounts_in, unit_commands, unit_environment)


class Service:
    """What systemd does with the unit, with the unit's own command lines.
    Runs in HOST (an NsAgent)."""

    def __init__(self, host, work):
        self.host = host
        self.work = work
        self.share = f'{work}/share'
        self.link = f'{work}/link'
        self.backing = f'{work}/dir'
        self.mnt = f'{self.share}/locks'
        self.env = unit_environment(overrides={
            'LOCKFS_SHARE': self.share, 'LOCKFS_LINK': self.link,
            'LOCKFS_BACKING': self.backing})
        self.tool_env = {'LOCKFS': LOCKFS_BIN}
        self.notify = DgramSocket(f'{work}/notify')
        self.pid = None
        self.log = []

    def start(self):
        for argv in unit_commands('ExecStartPre', self.env):
            r = self.host.run(argv, env=self.tool_env, check=True)
            self.log.append(r['out'])
        [argv] = unit_commands('ExecStart', self.env)
        self.pid = self.host.spawn(argv, env={'NOTIFY_SOCKET': self.notify.path},
                                   stderr=f'{self.work}/daemon.stderr')
        self.notify.recv_until(lambda m: 'READY=1' in m.split('\n'), 10, 'READY=1')

    def stop_post(self):
        for argv in unit_commands('ExecStopPost', self.env):
            r = self.host.run(argv, env=self.tool_env, check=True)
            self.log.append(r['out'])

    def stop(self, sig=signal.SIGTERM):
        """The main process ends (SIGTERM: systemctl stop; SIGKILL: a crash);
        returns its exit status (negative: the signal)."""
        self.host.run(['kill', f'-{sig.value}', str(self.pid)], check=True)
        status = self.host.wait(self.pid, 10)
        assert status is not None, f'daemon {self.pid} did not end after {sig.name}'
        self.pid = None
        return status

    def stderr(self):
        try:
            with open(f'{self.work}/daemon.stderr') as f:
                return f.read()
        except FileNotFoundError:
            return ''


@pytest.fixture
def service():
    work = tempfile.mkdtemp(prefix='lockfs-ctr-')
    os.chmod(work, 0o755)
    os.mkdir(f'{work}/dir', 0o700)
    host = NsAgent(['unshare', '--mount'])
    svc = Service(host, work)
    containers = []

    def container(view_of='share'):
        """A container bound to SHARE (the layout) or, with view_of='mount',
        to the lockfs mount itself.  Its locks are at .locks."""
        view = f'{work}/view{len(containers)}'
        os.mkdir(view)
        src = svc.share if view_of == 'share' else svc.mnt
        c = NsAgent(['nsenter', '-t', str(host.host_pid), '-m', '--',
                     'unshare', '--mount', '--pid', '--fork', '--propagation', 'slave',
                     '--mount-proc'],
                    setup=f'mount --rbind {src} {view}; mount --make-rslave {view}')
        c.locks = f'{view}/locks' if view_of == 'share' else view
        containers.append(c)
        return c

    svc.container = container
    yield svc
    for c in containers:
        c.close()
    if svc.pid is not None:
        host.run(['umount', '-l', svc.mnt])
        host.wait(svc.pid, 10)
    # what podman left behind (conmon, its `podman container cleanup`) was
    # re-parented to the agent: let it finish before the files go
    host.call(op='wait_children', timeout=30)
    host.close()  # the namespace, with its binds, goes with it
    bad = stderr_problems(svc.stderr())
    svc.notify.close()
    subprocess.run(['chattr', '-i', svc.mnt], stderr=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)
    assert not bad, 'daemon stderr reports errors:\n' + '\n'.join(bad[:20])


def holder_pid(c, name):
    return json.loads(c.call(op='read', path=f'{c.locks}/{name}/owner')['data'])['holder']['pid']


def test_unit_layout_puts_the_mount_under_a_shared_parent(service):
    service.start()
    host = service.host
    fstype, source, tags = mount_line(host, service.mnt)
    assert (fstype, source) == ('fuse.lockfs', service.backing)
    assert any(t.startswith('shared:') for t in mount_line(host, service.share)[2])
    assert os.readlink(service.link) == service.mnt
    # the host's path is the link
    assert host.errno_of('mkdir', f'{service.link}/a') == 0
    assert host.errno_of('mkdir', f'{service.link}/a') == errno.EEXIST
    assert host.errno_of('rmdir', f'{service.link}/a') == 0


def test_container_keeps_the_lock_tree_across_a_restart(service):
    service.start()
    c = service.container()
    assert c.errno_of('mkdir', f'{c.locks}/held') == 0
    me = c.host_pid
    assert holder_pid(c, 'held') == me
    assert service.stop(signal.SIGTERM) == 0
    service.stop_post()
    service.start()
    # the container reaches the new daemon without being restarted
    assert c.errno_of('mkdir', f'{c.locks}/new') == 0
    assert c.errno_of('rmdir', f'{c.locks}/new') == 0
    # and the lock it held across the restart is still its own
    assert c.errno_of('mkdir', f'{c.locks}/held') == errno.EEXIST
    assert holder_pid(c, 'held') == me
    assert c.errno_of('rmdir', f'{c.locks}/held') == 0


def test_container_keeps_the_lock_tree_across_a_crash_and_the_units_restart(service):
    service.start()
    c = service.container()
    other = service.container()
    assert c.errno_of('mkdir', f'{c.locks}/held') == 0
    me = c.host_pid
    assert service.stop(signal.SIGKILL) == -signal.SIGKILL
    # while it is down: loud errors, never a plain directory
    assert c.errno_of('mkdir', f'{c.locks}/x') == errno.ENOTCONN
    service.stop_post()
    assert 'detached the dead mount' in ''.join(service.log)
    assert c.errno_of('mkdir', f'{c.locks}/x') == errno.EPERM  # the guard
    assert other.errno_of('mkdir', f'{other.locks}/x') == errno.EPERM
    service.start()
    assert c.call(op='listdir', path=c.locks)['names'] == ['.flock', '.log', 'held']
    assert other.errno_of('mkdir', f'{other.locks}/held') == errno.EEXIST
    assert other.errno_of('rmdir', f'{other.locks}/held') == errno.EPERM
    assert holder_pid(c, 'held') == me
    assert c.errno_of('rmdir', f'{c.locks}/held') == 0
    assert other.errno_of('mkdir', f'{other.locks}/held') == 0


def test_binding_the_lockfs_mount_itself_does_not_survive_a_restart(service):
    """The measured fact the layout exists for (negative control)."""
    service.start()
    c = service.container(view_of='mount')
    assert c.errno_of('mkdir', f'{c.locks}/a') == 0
    assert c.errno_of('rmdir', f'{c.locks}/a') == 0
    assert service.stop(signal.SIGTERM) == 0
    service.stop_post()
    service.start()
    assert c.errno_of('mkdir', f'{c.locks}/a') == errno.ENOTCONN


def test_host_path_refuses_mkdir_while_the_daemon_is_down(service):
    service.start()
    assert service.stop(signal.SIGTERM) == 0
    service.stop_post()
    host = service.host
    assert host.errno_of('mkdir', f'{service.link}/x') == errno.EPERM
    assert host.call(op='listdir', path=service.link)['names'] == []


def test_a_second_start_prepares_nothing_twice(service):
    service.start()
    first = service.log[:]
    assert service.stop(signal.SIGTERM) == 0
    service.stop_post()
    service.start()
    assert 'bound' in first[0] and 'symlink' in first[0]
    assert service.log[-1] == '', f'the second prepare changed something: {service.log[-1]}'
    binds = [m for m in mounts_in(service.host, service.share) if m == service.share]
    assert len(binds) == 1


# --------------------------------------------------------------------------
# podman, where this machine allows it

PODMAN_FLAGS = ['--runtime=runc', '--ulimit', 'nofile=20000:20000',
                '--ulimit', 'nproc=4096:4096', '--network=none']


@pytest.fixture
def podman(service):
    """(podman argv prefix, image) with a private storage, in the host
    namespace of SERVICE; skips with the reason when podman cannot run."""
    if not shutil.which('podman') or not shutil.which('runc'):
        pytest.skip('podman or runc is not installed (Debian packages podman, runc)')
    work = service.work
    rootfs = f'{work}/rootfs'
    os.makedirs(f'{rootfs}/bin')
    os.makedirs(f'{rootfs}/srv/lockfs')
    shutil.copy('/bin/busybox', f'{rootfs}/bin/busybox')
    for a in ('sh', 'mkdir', 'rmdir', 'cat', 'ls', 'sleep'):
        os.symlink('busybox', f'{rootfs}/bin/{a}')
    # the image keeps the path /locks: a symlink into the bound SHARE
    os.symlink('/srv/lockfs/locks', f'{rootfs}/locks')
    base = ['podman', '--root', f'{work}/storage', '--runroot', f'{work}/run',
            '--storage-driver', 'vfs', '--cgroup-manager', 'cgroupfs']
    host = service.host
    r = host.sh(f'tar -C {rootfs} -c . | {" ".join(base)} import - localhost/lockfs-test-bb',
                timeout=60)
    if r['rc'] != 0:
        pytest.skip(f'podman import failed here: {r["err"].strip()[-300:]}')
    r = host.run(base + ['run', '--rm', *PODMAN_FLAGS, 'localhost/lockfs-test-bb', 'sh', '-c', ':'],
                 timeout=60)
    if r['rc'] != 0:
        pytest.skip(f'podman cannot run a container here: {r["err"].strip()[-300:]}')
    yield base, 'localhost/lockfs-test-bb'
    host.run(base + ['rm', '-f', '-a', '-t', '0'], timeout=60)


def test_podman_container_keeps_its_lock_across_restart_and_crash(service, podman):
    base, image = podman
    host = service.host
    service.start()
    # exactly the flags docs/operations.md gives, with the test's SHARE
    r = host.run(base + ['run', '-d', '--name', 'c1', *PODMAN_FLAGS,
                         '-v', f'{service.share}:/srv/lockfs:rslave', image,
                         'sh', '-c', 'mkdir /locks/held && exec sleep 120'], timeout=60)
    assert r['rc'] == 0, r['err']
    wait_until(lambda: host.errno_of('stat', f'{service.mnt}/held') == 0, 10,
               what='the container\'s lock')

    def in_c(script):
        return host.run(base + ['exec', 'c1', 'sh', '-c', script], timeout=30)

    for sig in (signal.SIGTERM, signal.SIGKILL):
        service.stop(sig)
        service.stop_post()
        service.start()
        r = in_c('mkdir /locks/held')
        assert r['rc'] != 0 and 'File exists' in r['err'], (sig, r)
        r = in_c('mkdir /locks/new && rmdir /locks/new')
        assert r['rc'] == 0, (sig, r)
    # still the container's main shell's lock: the container's end frees it
    assert host.run(base + ['rm', '-f', '-t', '0', 'c1'], timeout=60)['rc'] == 0
    wait_until(lambda: host.errno_of('stat', f'{service.mnt}/held') == errno.ENOENT, 5,
               what='the lock to go with its container')


def test_podman_static_lockctl_works_in_a_busybox_image(service, podman):
    static_lockctl_or_skip()
    base, image = podman
    host = service.host
    service.start()
    r = host.run(base + ['run', '--rm', *PODMAN_FLAGS,
                         '-v', f'{service.share}:/srv/lockfs:rslave',
                         '-v', f'{LOCKCTL_STATIC}:/bin/lockctl:ro', image,
                         'lockctl', 'run', 'job', '--', 'cat', '/locks/job/owner'], timeout=60)
    assert r['rc'] == 0, r['err']
    assert json.loads(r['out'])['resource'] == 'job'
    assert host.errno_of('stat', f'{service.mnt}/job') == errno.ENOENT
