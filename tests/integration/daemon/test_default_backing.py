#!/usr/bin/python3
"""Issue 9 review: the default backing dir /run/lockfs, when the daemon
creates it itself (no systemd RuntimeDirectory=), is mode 0700: its
owner.json files name the holders.  One that exists keeps its mode.

Run in a private mount namespace with a tmpfs of its own on /run, so the
host's /run/lockfs is never touched."""

import os
import subprocess
import tempfile

import pytest

from lockfs_helpers import LOCKFS_BIN, rmtree_unguarded

# $1 lockfs, $2 mount point, $3 the mode to make /run/lockfs with first
# ('' for none).  Prints the mode of /run/lockfs while the daemon serves.
SCRIPT = r'''
set -e
mount -t tmpfs -o mode=0755,size=1m lockfs-it-run /run
if [ -n "$3" ]; then mkdir -m "$3" /run/lockfs; fi
"$1" "$2"
pid=$(cat /run/lockfs/.lockfs)
mkdir "$2/x" && rmdir "$2/x"
echo "mode=$(stat -c %a /run/lockfs)"
kill -TERM "$pid"
n=0
while kill -0 "$pid" 2>/dev/null; do
    n=$((n + 1)); [ $n -lt 1000 ] || { echo "daemon $pid did not stop" >&2; exit 1; }
    sleep 0.01
done
'''


@pytest.fixture
def mnt():
    d = tempfile.mkdtemp(prefix='lockfs-it-defdir-')
    os.chmod(d, 0o755)
    os.mkdir(os.path.join(d, 'mnt'))
    yield os.path.join(d, 'mnt')
    rmtree_unguarded(d)   # the daemon made mnt immutable (its guard)
    assert not os.path.exists(d), f'{d} left behind'


def _serve_default(mnt, premade=''):
    try:
        r = subprocess.run(['unshare', '--mount', '--propagation', 'private',
                            'sh', '-c', SCRIPT, 'sh', LOCKFS_BIN, mnt, premade],
                           capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip('no unshare(1)')
    if 'Operation not permitted' in r.stderr and 'unshare' in r.stderr:
        pytest.skip(f'cannot make a mount namespace here: {r.stderr.strip()}')
    assert r.returncode == 0, r
    return r.stdout.split('mode=')[1].strip()


def test_default_backing_dir_the_daemon_creates_is_mode_0700(mnt):
    assert _serve_default(mnt) == '700'


def test_default_backing_dir_that_exists_keeps_its_mode(mnt):
    assert _serve_default(mnt, premade='750') == '750'
