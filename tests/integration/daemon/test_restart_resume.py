"""Issue 22 part 3, what a successor keeps: after a kill -9 of the serving
process (a keeper holds the connection, docs/recovery.md "A restart that
keeps the connection"):

- an fd lock stays an fd lock of the same open file: `owner` still says
  `bound: fd`, and the holder's close releases it at once while the holder
  lives on -- also across two kills in a row;
- flock waiters keep their places: they are granted in the order they
  asked, whatever order the kernel resends them in;
- a `mkdir` lock keeps its holder and fence.
"""

import fcntl
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from keeper_helpers import Detached  # noqa: E402
from lockfs_helpers import PYTHON, wait_until  # noqa: E402


@pytest.fixture
def detached():
    made = []

    def make(**kw):
        d = Detached(**kw)
        made.append(d)
        d.start()
        wait_until(d.keeper, 5, what='the keeper')
        return d

    yield make
    left = [d.cleanup() for d in made]
    assert not any(left), f'processes still alive after the unmount: {left}'


# A process that takes NAME's flock through its own open file, says so,
# closes it when told, says so, and lingers until told again.
HOLDER = ('import fcntl, os, sys\n'
          'fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n'
          'fcntl.flock(fd, fcntl.LOCK_EX)\n'
          'print("held", flush=True)\n'
          'sys.stdin.readline()\n'
          'os.close(fd)\n'
          'print("closed", flush=True)\n'
          'sys.stdin.readline()\n')


def holder(path):
    p = subprocess.Popen([PYTHON, '-c', HOLDER, path], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == 'held\n'
    return p


def tell(p, want):
    p.stdin.write('\n')
    p.stdin.flush()
    assert p.stdout.readline() == want


def owner(d, name):
    with open(os.path.join(d.mnt, name, 'owner')) as f:
        return json.load(f)


def is_free(d, name):
    return not os.path.exists(os.path.join(d.mnt, name))


def ends_of(d, name):
    """The end lines (released, recovered, ...) of NAME in the log."""
    return [l for l in d.log().splitlines()
            if f' {name} ' in l and any(w in l for w in (' released', ' recovered',
                                                         ' rebound', ' lost'))]


@pytest.mark.parametrize('kills', [1, 2])
def test_fd_lock_stays_the_open_files_and_its_close_releases(detached, kills):
    d = detached()
    h = holder(os.path.join(d.mnt, '.flock', 'fdl'))
    try:
        before = owner(d, 'fdl')
        assert before['bound'] == 'fd', before
        for _ in range(kills):
            d.kill9()
        after = owner(d, 'fdl')
        assert (after['bound'], after['fence']) == ('fd', before['fence']), after
        tell(h, 'closed\n')
        # The holder lives on: only the close can end the lock, and it must.
        wait_until(lambda: is_free(d, 'fdl'), 5, what='the close to release the lock')
        assert h.poll() is None
        ends = ends_of(d, 'fdl')
        assert len(ends) == 1 and ' released' in ends[0], ends
    finally:
        h.kill()
        h.wait()


def test_flock_waiters_keep_their_places_across_kill9(detached, tmp_path):
    d = detached()
    path = os.path.join(d.mnt, '.flock', 'line')
    order = tmp_path / 'order'
    h = holder(path)
    waiters = []
    try:
        for i in range(6):
            waiters.append(subprocess.Popen(
                ['flock', path, 'sh', '-c', f'echo {i} >> {order}']))
            # Each asks only once the one before waits: the order asked.
            wait_until(lambda: len(open(os.path.join(d.mnt, 'line', 'waiters'))
                                    .read().splitlines()) == i + 1,
                       5, what=f'waiter {i} in line')
        d.kill9()
        d.kill9()
        tell(h, 'closed\n')
        for w in waiters:
            assert w.wait(timeout=30) == 0
        assert order.read_text().split() == [str(i) for i in range(6)]
    finally:
        for w in waiters:
            if w.poll() is None:
                w.kill()
                w.wait()
        h.kill()
        h.wait()


def test_mkdir_lock_keeps_its_holder_and_fence_across_kill9(detached):
    d = detached()
    sh = subprocess.Popen(['sh', '-c', 'mkdir "$1/m" && echo ok && read x && rmdir "$1/m"',
                           'sh', d.mnt], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
    try:
        assert sh.stdout.readline() == 'ok\n'
        before = owner(d, 'm')
        d.kill9()
        after = owner(d, 'm')
        assert (after['holder']['pid'], after['fence']) == (before['holder']['pid'],
                                                           before['fence']), after
        sh.stdin.write('\n')
        sh.stdin.flush()
        assert sh.wait(timeout=10) == 0
        assert is_free(d, 'm')
    finally:
        if sh.poll() is None:
            sh.kill()
            sh.wait()


def test_a_client_in_its_own_namespaces_sees_nothing_of_kill9(detached):
    """A client in pid and mount namespaces of its own (as a container that
    binds the lock tree) loops mkdir/rmdir through two kills of the serving
    process: every call succeeds, nothing is remounted under it."""
    d = detached()
    script = ('i=0; echo started; while [ $i -lt 2000 ]; do '
              'mkdir "$1/c" || exit 1; rmdir "$1/c" || exit 2; i=$((i+1)); done; echo done')
    c = subprocess.Popen(['unshare', '--mount', '--pid', '--fork', '--mount-proc',
                          'sh', '-c', script, 'sh', d.mnt],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert c.stdout.readline() == 'started\n'
        d.kill9()
        d.kill9()
        out, err = c.communicate(timeout=60)
        assert (c.returncode, out, err) == (0, 'done\n', ''), (c.returncode, out, err)
    finally:
        if c.poll() is None:
            c.kill()
            c.wait()
