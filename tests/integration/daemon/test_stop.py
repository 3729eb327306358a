"""Issue 9 point 3, "Fast stop": how the daemon ends.

The stop times themselves are measured by tools/bench/bench_stop.py (figures in
docs/performance.md); these tests hold generous bounds and the rules:

- SIGTERM or SIGINT ends the daemon, with status 0, within 2 s: also when
  it arrives while the daemon is starting its loop (libfuse 3.14 can miss
  a signal there; fs/stop.c wakes the loop until it has ended).
- `fusermount3 -u` in one mount namespace ends the daemon only when no
  other namespace still has a copy of the mount: the kernel keeps the
  connection for that copy, and the daemon serves it.  SIGTERM ends it
  everywhere.
"""

import errno
import signal
import subprocess
import time

import pytest

from lockfs_helpers import PYTHON, mount_entry

BOUND_S = 2.0


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT], ids=['SIGTERM', 'SIGINT'])
def test_stop_signal_right_after_start_ends_the_daemon(lockfs_factory, sig):
    for _ in range(10):
        m = lockfs_factory()
        t0 = time.monotonic()
        m.stopped = True
        m.proc.send_signal(sig)
        try:
            assert m.proc.wait(BOUND_S) == 0
        except subprocess.TimeoutExpired:
            pytest.fail(f'daemon {m.pid} still running {BOUND_S}s after {sig!r}')
        assert time.monotonic() - t0 < BOUND_S
        assert mount_entry(m.mnt) is None


# A process in its own mount namespace (a copy of ours, made while M was
# mounted): on request it tries mkdir M/x and rmdir M/x and prints the errno.
COPY_SRC = r'''
import os, sys
path = os.path.join(sys.argv[1], 'x')
print('READY', flush=True)
for line in sys.stdin:
    try:
        os.mkdir(path)
        os.rmdir(path)
        print(0, flush=True)
    except OSError as e:
        print(e.errno, flush=True)
'''


def test_unmount_leaves_the_daemon_serving_a_copy_in_another_namespace(lockfs_factory):
    m = lockfs_factory()
    copy = subprocess.Popen(['unshare', '--mount', '--propagation', 'private',
                             PYTHON, '-c', COPY_SRC, m.mnt],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert copy.stdout.readline() == 'READY\n'

        def ask():
            copy.stdin.write('go\n')
            copy.stdin.flush()
            return int(copy.stdout.readline())
        assert subprocess.run(['fusermount3', '-u', m.mnt]).returncode == 0
        assert mount_entry(m.mnt) is None
        assert ask() == 0, 'the copy in the other namespace is not served'
        assert m.proc.poll() is None
        assert m.signal(signal.SIGTERM) == 0
        assert ask() == errno.ENOTCONN
    finally:
        copy.stdin.close()
        copy.wait(10)
