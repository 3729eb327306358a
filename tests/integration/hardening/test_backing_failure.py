"""Issue 8 point 5: DIR going wrong is loud.

"Observed: after `rm -rf DIR` while mounted, mkdir returns ENOENT forever,
even after `mkdir -m700 DIR`, and nothing is printed; after `chattr +i DIR`,
the holder's rmdir returns EPERM (the "not yours" errno) although `released`
was already logged, the holder stopped being watched, and its exit went
unnoticed for ~20 s until a stat produced a second `recovered` line for the
same fence.  A store that cannot be written gives EIO (never EPERM or
ENOENT), the lock stays held and watched, a line is logged only for what
really happened, and the daemon says on stderr/syslog what is wrong with
DIR; a DIR that vanished makes every request fail with EIO and a loud
message, not a silent ENOENT."

`chattr +i DIR` is how these tests make DIR refuse writes: renames and new
entries in DIR fail with EPERM, which is exactly the errno that must not
reach a caller as "not yours".
"""

import errno
import os
import signal
import subprocess

from lockfs_helpers import (END_EVENTS, errno_of, evidence, log_for, stays_held, wait_free,
                            wait_log, wait_until)


class _Immutable:
    """chattr +i on PATH for the block (always undone)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        subprocess.run(['chattr', '+i', self.path], check=True)
        return self

    def __exit__(self, *exc):
        subprocess.run(['chattr', '-i', self.path], check=True)


def _dir_lines(m):
    """The daemon's stderr lines about its backing directory."""
    return [l for l in m.stderr().splitlines() if 'backing dir' in l]


def _wait_dir_line(m, word, timeout=5.0):
    return wait_until(lambda: [l for l in _dir_lines(m) if word in l], timeout=timeout,
                      what=f'a line about DIR with {word!r} on stderr')


def test_rmdir_while_dir_refuses_writes_is_eio_and_keeps_the_lock(mnt, procs):
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    with _Immutable(mnt.dir):
        assert a.rmdir(mnt.path('x')) == errno.EIO
        assert os.path.isdir(mnt.lockdir('x'))
        assert a.stat(mnt.path('x'))                         # still held, still readable
        assert b.mkdir(mnt.path('x')) == errno.EEXIST
        assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired']
        assert len(_dir_lines(mnt)) == 1, mnt.stderr()
    assert a.rmdir(mnt.path('x')) == 0
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']


def test_mkdir_while_dir_refuses_writes_is_eio_and_takes_nothing(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('warm')) == 0
    assert a.rmdir(mnt.path('warm')) == 0               # a kept directory to reuse
    with _Immutable(mnt.dir):
        assert a.mkdir(mnt.path('x')) == errno.EIO
        assert a.mkdir(mnt.path('y')) == errno.EIO
    assert not os.path.lexists(mnt.lockdir('x')) and not os.path.lexists(mnt.lockdir('y'))
    assert log_for(mnt.dir, 'x') == [] and log_for(mnt.dir, 'y') == []
    assert a.mkdir(mnt.path('x')) == 0
    assert a.rmdir(mnt.path('x')) == 0


def test_a_holder_that_dies_while_dir_refuses_is_recovered_once_dir_allows(mnt, procs):
    """Still watched: its death is acted on when DIR takes writes again, with
    one `recovered` line, and nothing is logged while the removal fails."""
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    with _Immutable(mnt.dir):
        assert a.rmdir(mnt.path('x')) == errno.EIO
        a.kill()
        _wait_dir_line(mnt, 'cannot')
        assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired']
        assert os.path.isdir(mnt.lockdir('x'))
    wait_free(mnt, 'x', timeout=2)
    lines = [l for l in log_for(mnt.dir, 'x') if l.event in END_EVENTS]
    assert [l.event for l in lines] == ['recovered'], [l.raw for l in log_for(mnt.dir, 'x')]
    assert 'exited' in evidence(lines[0])


def test_a_holder_whose_rmdir_dir_refused_is_still_watched(mnt, procs):
    """The observed case: the refused rmdir must not stop the watch, so the
    holder's later exit frees the lock at once, with one line."""
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    with _Immutable(mnt.dir):
        assert a.rmdir(mnt.path('x')) == errno.EIO
    a.kill()
    wait_free(mnt, 'x', timeout=2)
    ends = [l for l in log_for(mnt.dir, 'x') if l.event in END_EVENTS]
    assert [(l.event, evidence(l)) for l in ends] == [('recovered', {'exited'})]


def test_a_lock_kept_for_descendants_while_dir_refuses_is_said_once(mnt):
    """Issue 9 §2 under §5: a holder that exits while what it started lives
    on keeps its lock; while its record cannot be rewritten (chattr +i on
    the lock directory) the lock stays, and `holder-exited` is written
    once, when the store takes it -- not at every try (one per tick)."""
    p = subprocess.Popen(['sh', '-c', 'mkdir "$1" || exit 9; sleep 60 >/dev/null & echo $!; '
                          'read go; exit 0', 'sh', mnt.path('x')],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    child = int(p.stdout.readline())
    try:
        with _Immutable(mnt.lockdir('x')):
            p.stdin.close()                               # the holder exits now
            assert p.wait(10) == 0
            _wait_dir_line(mnt, 'cannot')
            assert stays_held(mnt, 'x', 0.5)              # some ten ticks of tries
            assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired']
        wait_log(mnt.dir, 'x', 'holder-exited', timeout=2)
        assert stays_held(mnt, 'x', 0.3)
        assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'holder-exited']
    finally:
        os.kill(child, signal.SIGKILL)
        p.stdout.close()
    wait_free(mnt, 'x', timeout=2)
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'holder-exited',
                                                        'recovered']


def test_what_is_wrong_with_dir_is_said_once_not_per_request(mnt, procs):
    a = procs.agent()
    for i in range(5):
        assert a.mkdir(mnt.path(f'x{i}')) == 0
    with _Immutable(mnt.dir):
        for i in range(5):
            assert a.rmdir(mnt.path(f'x{i}')) == errno.EIO
            assert a.mkdir(mnt.path(f'y{i}')) == errno.EIO
        bad = _dir_lines(mnt)
        assert len(bad) == 1, mnt.stderr()
        assert str(mnt.dir) in bad[0] and 'Operation not permitted' in bad[0], bad[0]
    for i in range(5):
        assert a.rmdir(mnt.path(f'x{i}')) == 0
    assert len(_dir_lines(mnt)) == 2, mnt.stderr()       # and once that it works again


def test_a_fence_file_that_cannot_be_written_gives_eio(lockfs_factory, tmp_path, procs):
    fence = tmp_path / 'fence'
    m = lockfs_factory(options=[f'fence_file={fence}'])
    a = procs.agent()
    with _Immutable(str(fence)):
        assert a.mkdir(m.path('x')) == errno.EIO
        assert [l for l in m.stderr().splitlines() if 'fence' in l], m.stderr()
    assert not os.path.lexists(m.lockdir('x'))
    assert a.mkdir(m.path('x')) == 0
    assert a.rmdir(m.path('x')) == 0


def test_a_removed_dir_makes_every_request_eio_and_is_said(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('held')) == 0
    subprocess.run(['rm', '-rf', mnt.dir], check=True)
    assert a.mkdir(mnt.path('x')) == errno.EIO
    assert errno_of(os.stat, mnt.path('held')) == errno.EIO
    assert errno_of(os.listdir, mnt.mnt) == errno.EIO
    assert a.rmdir(mnt.path('held')) == errno.EIO
    lines = _wait_dir_line(mnt, 'restart')
    assert len(lines) == 1, mnt.stderr()
    os.mkdir(mnt.dir, 0o700)                  # a new DIR is not adopted
    assert a.mkdir(mnt.path('x')) == errno.EIO
    assert errno_of(os.stat, mnt.path('x')) == errno.EIO
    assert os.listdir(mnt.dir) == []
    assert len(_dir_lines(mnt)) == 1, mnt.stderr()


def test_a_dir_replaced_by_another_makes_every_request_eio(mnt, procs, tmp_path):
    a = procs.agent()
    assert a.mkdir(mnt.path('held')) == 0
    os.rename(mnt.dir, str(tmp_path / 'moved-away'))
    os.mkdir(mnt.dir, 0o700)
    n = iter(range(10 ** 6))
    wait_until(lambda: a.mkdir(mnt.path(f'x{next(n)}')) == errno.EIO, timeout=2,
               what='mkdir to fail with EIO once DIR names another directory')
    assert errno_of(os.stat, mnt.path('held')) == errno.EIO
    assert a.rmdir(mnt.path('held')) == errno.EIO
    assert len(_wait_dir_line(mnt, 'restart')) == 1, mnt.stderr()
    assert os.listdir(mnt.dir) == []
