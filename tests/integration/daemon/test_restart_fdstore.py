"""Issue 22 part 3 under systemd: the service manager's file descriptor
store keeps the FUSE connection across a restart of the daemon.

No systemd here: the test plays the service manager.  It owns the
NOTIFY_SOCKET, keeps the descriptors the daemon stores there (FDSTORE=1,
FDNAME=lockfs-fuse and lockfs-state), and starts the next daemon with them
as $LISTEN_FDS/$LISTEN_FDNAMES/$LISTEN_PID, as Restart= would.
"""

import errno
import fcntl
import os
import signal
import socket
import subprocess
import tempfile

import pytest

from keeper_helpers import alive, fuse_waiting, mount_id, recorded_pid
from lockfs_helpers import LOCKFS_BIN, fusermount_u, mount_entry, rmtree_unguarded, wait_until

EXEC_WITH_FDS = ('LISTEN_PID=$$ LISTEN_FDS=2 LISTEN_FDNAMES=lockfs-fuse:lockfs-state '
                 'exec "$0" "$@" 3<&{fuse} 4<&{state} {fuse}<&- {state}<&-')


class Manager:
    """A fake service manager: the notify socket and the descriptor store."""

    def __init__(self, base):
        self.path = os.path.join(base, 'notify')
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(10)
        self.store = {}        # FDNAME -> our descriptor
        self.messages = []

    def receive_until(self, cond):
        while not cond():
            data, fds, _, _ = socket.recv_fds(self.sock, 4096, 4)
            text = data.decode()
            self.messages.append(text)
            fields = dict(l.split('=', 1) for l in text.split('\n') if '=' in l)
            if fields.get('FDSTOREREMOVE') == '1':
                old = self.store.pop(fields.get('FDNAME'), None)
                if old is not None:
                    os.close(old)
            if fields.get('FDSTORE') == '1':
                for fd in fds:
                    old = self.store.pop(fields['FDNAME'], None)
                    if old is not None:
                        os.close(old)
                    self.store[fields['FDNAME']] = fd

    def start(self, cmd, with_fds):
        env = dict(os.environ, NOTIFY_SOCKET=self.path)
        if not with_fds:
            return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
        # Copies at 10 or above, which the shell (bash: dash takes single
        # digits only) makes 3 and 4 for the daemon.
        fuse = fcntl.fcntl(self.store['lockfs-fuse'], fcntl.F_DUPFD, 10)
        state = fcntl.fcntl(self.store['lockfs-state'], fcntl.F_DUPFD, 10)
        script = EXEC_WITH_FDS.format(fuse=fuse, state=state)
        try:
            return subprocess.Popen(['bash', '-c', script] + cmd, env=env,
                                    pass_fds=(fuse, state), stdin=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
        finally:
            os.close(fuse)
            os.close(state)

    def close(self):
        for fd in self.store.values():
            os.close(fd)
        self.store = {}
        self.sock.close()


@pytest.fixture
def setup():
    base = tempfile.mkdtemp(prefix='lockfs-it-fdstore-')
    os.chmod(base, 0o755)
    mnt, backing = os.path.join(base, 'mnt'), os.path.join(base, 'dir')
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    mgr = Manager(base)
    procs = []
    yield mgr, mnt, backing, procs
    if mount_entry(mnt) is not None:
        fusermount_u(mnt)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    mgr.close()
    if mount_entry(mnt) is not None:
        subprocess.run(['fusermount3', '-uz', mnt], stderr=subprocess.DEVNULL)
    rmtree_unguarded(base)


def test_fdstore_keeps_the_connection_across_a_kill9_and_an_upgrade(setup):
    mgr, mnt, backing, procs = setup
    cmd = [LOCKFS_BIN, '-f', '-o', f'backing={backing}', mnt]
    first = mgr.start(cmd, with_fds=False)
    procs.append(first)
    mgr.receive_until(lambda: 'lockfs-fuse' in mgr.store and 'lockfs-state' in mgr.store
                      and any(m.startswith('READY=1') for m in mgr.messages))
    wait_until(lambda: recorded_pid(backing) == first.pid, 5, what='the pid in DIR/.lockfs')
    assert os.path.exists(os.path.join(backing, '.lockfs-kept'))
    before = mount_id(mnt)
    os.mkdir(os.path.join(mnt, 'held'))

    # A crash: the connection lives on in the store; a client waits.
    first.kill()
    first.wait()
    stat = subprocess.Popen(['stat', os.path.join(mnt, 'probe')], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    wait_until(lambda: (fuse_waiting(mnt) or 0) >= 1, 5, what='the waiting stat')
    second = mgr.start(cmd, with_fds=True)
    procs.append(second)
    try:
        _, err = stat.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        second.kill()
        pytest.fail(f'the successor does not serve: {second.communicate()[1]}')
    assert stat.returncode == 1 and 'No such file or directory' in err, err
    wait_until(lambda: recorded_pid(backing) == second.pid, 5, what='the successor')
    assert mount_id(mnt) == before
    assert 'held' in os.listdir(mnt)
    with open(os.path.join(backing, 'lock.log')) as f:
        log = f.read()
    assert f'prev_pid={first.pid} cause=restart' in log, log

    # An upgrade: the daemon hands over with its exit status, the manager
    # restarts it (Restart=), `lockfs --upgrade` sees the successor serve.
    up = subprocess.Popen([LOCKFS_BIN, '--upgrade', mnt], stderr=subprocess.PIPE, text=True)
    assert second.wait(timeout=10) == 75
    third = mgr.start(cmd, with_fds=True)
    procs.append(third)
    _, err = up.communicate(timeout=20)
    assert up.returncode == 0, err
    assert recorded_pid(backing) == third.pid and mount_id(mnt) == before
    with open(os.path.join(backing, 'lock.log')) as f:
        assert f'prev_pid={second.pid} cause=upgrade' in f.read()
    os.rmdir(os.path.join(mnt, 'held'))

    # A clean stop: the store lets go, the note goes.
    assert fusermount_u(mnt)
    assert third.wait(timeout=10) == 0
    mgr.receive_until(lambda: 'lockfs-fuse' not in mgr.store and
                      'lockfs-state' not in mgr.store)
    assert not os.path.exists(os.path.join(backing, '.lockfs-kept'))


def test_keeper_off_under_systemd_stores_nothing(setup):
    mgr, mnt, backing, procs = setup
    p = mgr.start([LOCKFS_BIN, '-f', '-o', f'backing={backing}', '-o', 'keeper=off', mnt],
                  with_fds=False)
    procs.append(p)
    mgr.receive_until(lambda: any(m.startswith('READY=1') for m in mgr.messages))
    assert not mgr.store and not any('FDSTORE=1' in m for m in mgr.messages)
    p.kill()
    p.wait()
    with pytest.raises(OSError) as e:
        os.stat(os.path.join(mnt, 'x'))
    assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
