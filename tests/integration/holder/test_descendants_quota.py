"""Issue 9 §2 under issue 8 §2: descendants keep a lock in the batched,
per-uid recovery, for a holder polled without a pidfd, and in the quotas.

A dead holder's locks are found 32 at a time and recovered in its uid's
turn; each of them is still kept while a process the holder started lives
(`holder-exited`), and released with `evidence=exited,descendants-exited`
when the last one ends.  A lock kept that way is still its uid's: it counts
against `max_locks_per_uid` until it is released.
"""

import errno
import os
import select
import signal
import subprocess

import pytest

from lockfs_helpers import (evidence, log_for, pidfds_of, stays_held, wait_free, wait_log,
                            wait_until)
from quota_helpers import Hog, nofile

DEADLINE = 5.0

# Takes $2 locks $1/$3-0 .. $1/$3-N-1, starts a child that outlives it,
# prints the child's pid and waits to be killed (exec: the same process).
HOLDER_SH = '''
i=0
while [ "$i" -lt "$2" ]; do mkdir "$1/$3-$i" || exit 9; i=$((i + 1)); done
sleep 1000 &
echo $!
exec sleep 1000
'''


class Holder:
    """A shell in a session of its own (as USER) that holds N locks and has
    a child started while it held them."""

    def __init__(self, m, prefix, n, user=None):
        kw = {}
        if user is not None:
            kw = dict(user=user.uid, group=user.gid, extra_groups=[])
        self.proc = subprocess.Popen(['/bin/sh', '-c', HOLDER_SH, 'holder', m.mnt, str(n),
                                      prefix], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, start_new_session=True,
                                     cwd='/', **kw)
        r, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if r else b''
        assert line.strip().isdigit(), f'holder of {prefix}-*: {line!r}, {self.proc.poll()}'
        self.child = int(line)
        self.names = [f'{prefix}-{i}' for i in range(n)]

    def kill(self):
        """SIGKILL the holder; its child runs on."""
        self.proc.kill()
        self.proc.wait(10)

    def end_child(self):
        try:
            os.kill(self.child, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def cleanup(self):
        self.end_child()
        if self.proc.poll() is None:
            self.kill()
        self.proc.stdout.close()


@pytest.fixture
def holders():
    made = []

    def make(*args, **kw):
        h = Holder(*args, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.cleanup()


def _kept_then_released(m, h, timeout=DEADLINE):
    """H's holder is killed: every lock is kept for its child (one
    `holder-exited` each, none released), then released when the child ends."""
    h.kill()
    for name in h.names:
        ex = wait_log(m.dir, name, 'holder-exited', timeout=timeout)
        assert ex[0].details['descendants'] == '1', ex[0].raw
        assert ex[0].details['pid'] == str(h.proc.pid)
    assert stays_held(m, h.names[-1], 0.2)
    assert all(os.path.lexists(m.lockdir(n)) for n in h.names)
    h.end_child()
    # Each tick counts a kept lock's descendants: released within a few
    # ticks (50 ms), not when the tick's turn of every stripe (5 s) comes.
    wait_until(lambda: not any(os.path.lexists(m.lockdir(n)) for n in h.names), timeout=1.0,
               interval=0.005, what=f'{h.names[0]}.. to be released')
    for name in h.names:
        rec = [l for l in log_for(m.dir, name) if l.event == 'recovered']
        assert len(rec) == 1 and evidence(rec[0]) == {'exited', 'descendants-exited'}, rec


def test_many_locks_of_a_dead_holder_are_kept_for_its_child_in_every_batch(mnt, holders):
    """More locks than one turn marks (32): each batch keeps its locks."""
    _kept_then_released(mnt, holders(mnt, 'm', 80))


def test_a_lock_kept_for_descendants_still_counts_against_its_uid(lockfs_factory, users,
                                                                   procs, holders):
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=2',))
    h = holders(m, 'k', 2, users[0])
    h.kill()
    for name in h.names:
        wait_log(m.dir, name, 'holder-exited')
    a = procs.agent(users[0])
    assert a.mkdir(m.path('other')) == errno.EDQUOT
    assert procs.agent(users[1]).mkdir(m.path('b')) == 0   # another uid is not touched
    h.end_child()
    for name in h.names:
        wait_free(m, name)
    assert a.mkdir(m.path('other')) == 0


def test_a_holder_without_a_pidfd_keeps_its_lock_for_its_child(lockfs_factory, users,
                                                                holders):
    """Root filled the daemon's descriptors up to its own floor: the holder
    gets no pidfd and is polled; its death still leaves the lock to its child."""
    m = lockfs_factory(allow_other=True, wrapper=nofile(512))
    hog = Hog()
    try:
        n, err = hog.fill(m.path('.log'))
        assert err == errno.EMFILE, (n, err)
        before = pidfds_of(m.pid)
        h = holders(m, 'p', 1, users[1])
        wait_until(lambda: os.path.lexists(m.lockdir('p-0')), timeout=DEADLINE,
                   what='p-0 to be held')
        assert pidfds_of(m.pid) == before  # watched without a pidfd
        _kept_then_released(m, h)
    finally:
        hog.stop()
