#!/usr/bin/python3
"""The request loop (fs/loop.c): one hot reader, and no stall behind a slow request.

The daemon reads and processes requests on one thread while they are quick,
and lets another thread read as soon as one request takes long.  Here a
request is made to hang for as long as the test likes: the backing dir is
on an ext4 image that is frozen (fsfreeze), so the store's rename of a
`mkdir` blocks in the kernel until it is thawed.  Meanwhile the mount must
go on answering requests that need no write.
"""

import os
import shutil
import subprocess
import tempfile
import threading

import pytest

from lockfs_helpers import wait_until

ANSWER_WITHIN = 5.0


@pytest.fixture
def frozen_capable_dir():
    """A directory (mode 0700) on a fresh, loop-mounted ext4 image."""
    if not shutil.which('mkfs.ext4') or not shutil.which('fsfreeze'):
        pytest.skip('needs mkfs.ext4 and fsfreeze (e2fsprogs, util-linux)')
    top = tempfile.mkdtemp(prefix='lockfs-it-loop-')
    img, fs = os.path.join(top, 'img'), os.path.join(top, 'fs')
    os.mkdir(fs)
    with open(img, 'wb') as f:
        f.truncate(32 << 20)
    subprocess.run(['mkfs.ext4', '-q', '-F', img], check=True, capture_output=True)
    r = subprocess.run(['mount', '-o', 'loop', img, fs], capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(top)
        pytest.skip(f'cannot loop-mount an ext4 image: {r.stderr.strip()}')
    back = os.path.join(fs, 'back')
    os.mkdir(back)
    os.chmod(fs, 0o700)
    os.chmod(back, 0o700)
    try:
        yield fs, back
    finally:
        subprocess.run(['fsfreeze', '-u', fs], capture_output=True)
        if subprocess.run(['umount', fs], capture_output=True).returncode != 0:
            subprocess.run(['umount', '-l', fs], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def _answers_within(fn, seconds):
    """Run FN in a thread; True when it returned in time (a thread left
    hanging ends once the file system is thawed)."""
    done = threading.Event()

    def run():
        fn()
        done.set()
    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


def test_a_request_stuck_in_the_store_does_not_stall_the_mount(frozen_capable_dir,
                                                                lockfs_factory):
    # (Fixtures in this order: the daemon is stopped before the image goes.)
    fs, back = frozen_capable_dir
    m = lockfs_factory(backing=back)
    os.mkdir(m.path('held'))
    os.stat(m.path('held', 'owner'))  # looked up: no directory lock needed later
    subprocess.run(['fsfreeze', '-f', fs], check=True)
    stuck = None
    try:
        # Its rename waits for the thaw, inside the daemon (and it holds
        # the mount root's directory lock in the kernel meanwhile).
        stuck = subprocess.Popen(['mkdir', m.path('stuck')], stderr=subprocess.PIPE)
        assert wait_until(lambda: _in_daemon(stuck.pid), 10), 'mkdir never reached the daemon'
        # A request that needs no write, and no lock on the root.
        assert _answers_within(lambda: open(m.path('held', 'owner')).read(), ANSWER_WITHIN), \
            'the mount stopped answering behind one slow request'
    finally:
        subprocess.run(['fsfreeze', '-u', fs], check=True)
        if stuck is not None:
            assert stuck.wait(30) == 0, stuck.stderr.read()
    assert os.path.isdir(m.path('stuck'))
    os.rmdir(m.path('stuck'))
    os.rmdir(m.path('held'))
    m.unmount()


def _in_daemon(pid):
    """Is PID waiting for a FUSE answer?"""
    try:
        with open(f'/proc/{pid}/wchan') as f:
            return f.read() == 'request_wait_answer'
    except OSError:
        return False
