"""Detached lockfs daemons with their keeper (issue 22 part 3): start one,
find its serving process and keeper, kill and upgrade it, and clean up
every process and mount it made.  Used by tests/integration/daemon/
test_restart_*.py and tools/bench/bench_restart.py."""

import os
import signal
import subprocess
import tempfile
import time

from lockfs_helpers import (LOCKFS_BIN, fusermount_u, mount_entry, rmtree_unguarded,
                            wait_until)

BOUND_S = 10.0


def mount_id(mnt):
    """The mount id (first field of /proc/self/mountinfo) of the topmost
    mount at MNT, or None: a remount would change it."""
    found = None
    with open('/proc/self/mountinfo') as f:
        for line in f:
            fields = line.split(' ')
            if len(fields) > 4 and fields[4] == mnt:
                found = int(fields[0])
    return found


def recorded_pid(backing):
    try:
        with open(os.path.join(backing, '.lockfs')) as f:
            text = f.read().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def alive(pid):
    """PID exists and is not a zombie."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def keepers_of(mnt):
    """Pids of `lockfs --keeper` processes whose arguments end in MNT."""
    found = []
    for d in os.listdir('/proc'):
        if not d.isdigit():
            continue
        try:
            with open(f'/proc/{d}/cmdline', 'rb') as f:
                args = f.read().split(b'\0')[:-1]
        except OSError:
            continue
        if len(args) > 2 and args[1] == b'--keeper' and args[-1] == mnt.encode():
            found.append(int(d))
    return found


def parent_of(pid):
    with open(f'/proc/{pid}/stat') as f:
        return int(f.read().rsplit(')', 1)[1].split()[1])


class Detached:
    """A detached lockfs (no -f) on a fresh backing dir and mount point
    under a temporary directory, started from BINARY (default LOCKFS_BIN)."""

    def __init__(self, binary=None, options=(), env=None):
        self.base = tempfile.mkdtemp(prefix='lockfs-it-keeper-')
        os.chmod(self.base, 0o755)
        self.mnt = os.path.join(self.base, 'mnt')
        self.dir = os.path.join(self.base, 'dir')
        os.mkdir(self.mnt)
        os.chmod(self.mnt, 0o755)
        os.mkdir(self.dir, 0o700)
        self.binary = binary or LOCKFS_BIN
        self.options = list(options)
        self.env = env
        self.pids = set()  # every serving process seen, for the cleanup

    def start(self):
        cmd = [self.binary, '-o', f'backing={self.dir}']
        for o in self.options:
            cmd += ['-o', o]
        cmd.append(self.mnt)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND_S, env=self.env)
        assert r.returncode == 0, r
        assert mount_entry(self.mnt) is not None
        self.pids.add(self.pid())
        return r

    def pid(self):
        pid = recorded_pid(self.dir)
        if pid:
            self.pids.add(pid)
        return pid

    def keeper(self):
        k = keepers_of(self.mnt)
        assert len(k) <= 1, k
        return k[0] if k else None

    def kill9(self):
        """SIGKILL the serving process; wait for the next one to serve.
        Returns (old pid, new pid)."""
        old = self.pid()
        os.kill(old, signal.SIGKILL)
        new = self.wait_successor(old)
        return old, new

    def wait_successor(self, old, timeout=BOUND_S):
        return wait_until(lambda: (lambda p: p if p and p != old and alive(p) else 0)(
            self.pid()), timeout, what=f'a successor of pid {old} in DIR/.lockfs')

    def log(self):
        try:
            with open(os.path.join(self.dir, 'lock.log'), errors='replace') as f:
                return f.read()
        except OSError:
            return ''

    def cleanup(self):
        """Unmount, wait for every serving process seen and every keeper of
        the mount to leave, SIGKILL those that did not (only ones this
        helper started), remove the directories.  Returns the pids that had
        to be killed."""
        keepers = keepers_of(self.mnt)
        if mount_entry(self.mnt) is not None:
            fusermount_u(self.mnt)
        self.pid()
        deadline = time.monotonic() + BOUND_S
        for pid in list(self.pids) + keepers:
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        left = [p for p in list(self.pids) + keepers if alive(p)]
        for pid in left:  # only processes this helper started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if mount_entry(self.mnt) is not None:
            subprocess.run(['fusermount3', '-uz', self.mnt], stderr=subprocess.DEVNULL)
        rmtree_unguarded(self.base)
        return left


FUSECTL = '/sys/fs/fuse/connections'


def fuse_waiting(mnt):
    """Requests of MNT's FUSE connection that wait for an answer (fusectl's
    `waiting`), or None when it cannot be read."""
    dev = None
    with open('/proc/self/mountinfo') as f:
        for line in f:
            fields = line.split(' ')
            if len(fields) > 4 and fields[4] == mnt:
                dev = fields[2]
    if dev is None:
        return None
    if not os.listdir(FUSECTL):
        subprocess.run(['mount', '-t', 'fusectl', 'fusectl', FUSECTL], stderr=subprocess.DEVNULL)
    try:
        with open(os.path.join(FUSECTL, dev.split(':')[1], 'waiting')) as f:
            return int(f.read())
    except OSError:
        return None
