"""Issue 8 §4/§5 and issue 9 §3 "Logs": the files of the audit log.

- `-o log_max=SIZE` / `-o log_keep=N`: the daemon rotates DIR/lock.log into
  lock.log.1 .. lock.log.N so that it cannot fill DIR;
- SIGHUP reopens lock.log (logrotate's move-and-HUP) and does not stop the
  daemon; M/.log shows the file the daemon writes, whatever its name;
- the logrotate snippet (tools/logrotate/lockfs);
- a lock.log that is a symlink or has other hard links is refused at start.

Rotation under a herd: agents take and release locks in a loop while the
log is rotated; afterwards every file is read in order and each agent's
acquisitions must appear exactly once as acquired and once as released
(none lost, none twice), every line whole, per name alternating.
"""

import glob
import gzip
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from lockfs_helpers import (LOCKFS_BIN, PYTHON, SOURCE_ROOT, LogLine, log_for, mount_entry, read_log,
                            run_expect_refusal, wait_until)

SNIPPET = os.path.join(SOURCE_ROOT, 'tools', 'logrotate', 'lockfs')


# --------------------------------------------------------------------------
# helpers

def lines_of(path):
    """The parsed lines of one log file (gzip'd or not); each must be whole."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rb') as f:
        data = f.read()
    assert data == b'' or data.endswith(b'\n'), f'{path} ends inside a line'
    text = data.decode('utf-8', 'surrogateescape')
    return [LogLine(l) for l in text.split('\n')[:-1]]


def rotated(m):
    """DIR/lock.log.N paths, oldest first."""
    ps = [p for p in glob.glob(m.dpath('lock.log.*')) if re.search(r'\.log\.\d+$', p)]
    return sorted(ps, key=lambda p: -int(p.rsplit('.', 1)[1]))


def log_size(m):
    try:
        return os.path.getsize(m.dpath('lock.log'))
    except FileNotFoundError:
        return 0


HERD_SRC = r'''
import os, sys
m, name, stop = sys.argv[1:4]
n = 0
while not os.path.exists(stop):
    try:
        os.mkdir(os.path.join(m, name))
    except FileExistsError:
        continue
    os.rmdir(os.path.join(m, name))
    n += 1
print(n, flush=True)
'''


class Herd:
    """AGENTS processes taking and releasing NAMES in a loop until stop()."""

    def __init__(self, m, tmp_path, agents=4, names=('h0', 'h1')):
        self.stopfile = str(tmp_path / 'herd.stop')
        self.procs = [subprocess.Popen([PYTHON, '-c', HERD_SRC, m.mnt, names[i % len(names)],
                                        self.stopfile], stdout=subprocess.PIPE)
                      for i in range(agents)]

    def stop(self):
        """{pid: pairs done}"""
        with open(self.stopfile, 'w'):
            pass
        done = {}
        for p in self.procs:
            out, _ = p.communicate(timeout=30)
            assert p.returncode == 0, f'herd agent {p.pid} failed'
            done[p.pid] = int(out)
        return done

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def herd_factory(tmp_path):
    herds = []

    def start(m, **kw):
        h = Herd(m, tmp_path, **kw)
        herds.append(h)
        return h
    yield start
    for h in herds:
        h.kill()


def check_herd(files, done):
    """Every pair each herd agent did is in FILES (read in that order) as
    exactly one acquired and one released line; nothing twice, nothing
    torn; per name, acquired and released alternate."""
    lines = [l for f in files for l in lines_of(f)]
    seen = set()
    per_pid = {}
    last = {}
    for l in lines:
        if l.event not in ('acquired', 'released'):
            continue
        key = (l.details['fence'], l.event)
        assert key not in seen, f'line written twice: {l.raw}'
        seen.add(key)
        per_pid.setdefault(int(l.details['pid']), []).append(l.event)
        if l.name.startswith(b'h'):
            assert last.get(l.name) != l.event, f'{l.event} twice in a row for {l.name}: {l.raw}'
            last[l.name] = l.event
    for pid, n in done.items():
        evs = per_pid.get(pid, [])
        assert evs.count('acquired') == n and evs.count('released') == n, \
            f'agent {pid} did {n} pairs; the log has {evs.count("acquired")} acquired, ' \
            f'{evs.count("released")} released'
    return lines


# --------------------------------------------------------------------------
# options

@pytest.mark.parametrize('opt,want', [
    ('log_max=10', 'lockfs: -o log_max=10: want a size of at least 16K (e.g. 4M), or 0 for no limit'),
    ('log_max=1T', 'lockfs: -o log_max=1T: want a size of at least 16K (e.g. 4M), or 0 for no limit'),
    ('log_max=abc', 'lockfs: -o log_max=abc: want a size of at least 16K (e.g. 4M), or 0 for no limit'),
    ('log_keep=0', 'lockfs: -o log_keep=0: want a whole number from 1 to 1000'),
    ('log_keep=1001', 'lockfs: -o log_keep=1001: want a whole number from 1 to 1000'),
    ('log_denied_interval=-1', 'lockfs: -o log_denied_interval=-1: want whole seconds from 0 to 86400'),
    ('log_denied_interval=10s', 'lockfs: -o log_denied_interval=10s: want whole seconds from 0 to 86400'),
])
def test_bad_log_option_is_refused(scratch_dir, tmp_path, opt, want):
    backing = tmp_path / 'b'
    backing.mkdir(mode=0o700)
    mnt = os.path.join(scratch_dir, 'mnt')
    os.mkdir(mnt)
    rc, err = run_expect_refusal([LOCKFS_BIN, '-f', '-o', f'backing={backing}', '-o', opt, mnt],
                                 mnt)
    assert rc != 0 and err.splitlines() == [want]
    assert not (backing / 'lock.log').exists()


@pytest.mark.parametrize('size', ['16K', '64k', '1M', '1g', '20000', '0'])
def test_log_max_takes_sizes_with_suffixes(lockfs_factory, size):
    m = lockfs_factory(options=(f'log_max={size}', 'log_keep=2'))
    os.mkdir(m.path('x'))
    os.rmdir(m.path('x'))
    assert [l.event for l in log_for(m.dir, 'x')] == ['acquired', 'released']


def test_help_lists_the_log_options_with_their_defaults():
    out = subprocess.run([LOCKFS_BIN, '--help'], capture_output=True, text=True).stdout
    assert 'log_max=SIZE' in out and 'default 4M' in out
    assert 'log_keep=N' in out and '(default 4)' in out
    assert 'log_denied_interval=SECONDS' in out and 'default 10' in out


# --------------------------------------------------------------------------
# size rotation by the daemon

def test_log_stays_within_log_max_and_keeps_log_keep_files(lockfs_factory):
    m = lockfs_factory(options=('log_max=16K', 'log_keep=2'))
    for _ in range(600):               # ~100 KB of lines
        os.mkdir(m.path('x'))
        os.rmdir(m.path('x'))
    names = sorted(n for n in os.listdir(m.dir) if n.startswith('lock.log'))
    assert names == ['lock.log', 'lock.log.1', 'lock.log.2']
    for n in names:
        assert os.path.getsize(m.dpath(n)) <= 16 * 1024, n
        lines_of(m.dpath(n))           # whole lines only
    assert [l.event for l in read_log(m.dir)][-1] == 'released'   # the newest is in lock.log


def test_rotated_files_are_made_fresh(lockfs_factory, tmp_path):
    m = lockfs_factory(options=('log_max=16K', 'log_keep=3'))
    outside = tmp_path / 'outside'
    outside.write_bytes(b'not a log\n')
    os.symlink(outside, m.dpath('lock.log.1'))   # planted where rotation will write
    first = os.stat(m.dpath('lock.log')).st_ino
    for _ in range(2000):              # until the first rotation
        if os.stat(m.dpath('lock.log')).st_ino != first:
            break
        os.mkdir(m.path('r'))
        os.rmdir(m.path('r'))
    assert outside.read_bytes() == b'not a log\n'
    st = os.lstat(m.dpath('lock.log'))
    assert st.st_ino != first and st.st_nlink == 1 and st.st_mode & 0o7777 == 0o644
    assert os.path.isfile(m.dpath('lock.log.1')) and not os.path.islink(m.dpath('lock.log.1'))
    assert os.stat(m.dpath('lock.log.1')).st_ino == first


@pytest.mark.slow
def test_rotation_by_size_loses_no_line_under_a_herd(lockfs_factory, herd_factory):
    m = lockfs_factory(options=('log_max=16K', 'log_keep=1000'))
    herd = herd_factory(m, agents=6, names=('h0', 'h1', 'h2'))
    wait_until(lambda: len(rotated(m)) >= 20, timeout=30, interval=0.05,
               what='20 rotations under the herd')
    done = herd.stop()
    files = rotated(m) + [m.dpath('lock.log')]
    for f in files:
        assert os.path.getsize(f) <= 16 * 1024
    lines = check_herd(files, done)
    assert sum(done.values()) * 2 <= len(lines)


# --------------------------------------------------------------------------
# SIGHUP and M/.log

def test_sighup_does_not_stop_the_daemon(mnt):
    os.kill(mnt.pid, signal.SIGHUP)
    os.mkdir(mnt.path('after'))        # served: the daemon is still there
    mnt.assert_alive()
    os.rmdir(mnt.path('after'))
    for _ in range(3):
        os.kill(mnt.pid, signal.SIGHUP)
    wait_until(lambda: mnt.proc.poll() is None and mnt.is_mounted(), timeout=0.5)
    os.mkdir(mnt.path('again'))
    mnt.assert_alive()


def read_view(m):
    with open(m.path('.log'), 'rb') as f:
        return f.read()


def test_log_view_follows_the_moved_file_until_sighup(mnt):
    os.mkdir(mnt.path('a'))
    os.rename(mnt.dpath('lock.log'), mnt.dpath('moved'))
    os.mkdir(mnt.path('b'))            # still written to the moved file
    view = read_view(mnt)              # today: ENOENT
    assert b' b fence=' in view and view == open(mnt.dpath('moved'), 'rb').read()
    assert os.stat(mnt.path('.log')).st_size == len(view)
    os.kill(mnt.pid, signal.SIGHUP)
    wait_until(lambda: os.path.exists(mnt.dpath('lock.log')), timeout=2,
               what='a fresh lock.log after SIGHUP')
    os.mkdir(mnt.path('c'))
    new = open(mnt.dpath('lock.log'), 'rb').read()
    assert [l.name for l in read_log(mnt.dir)] == [b'c']
    assert read_view(mnt) == new and os.stat(mnt.path('.log')).st_size == len(new)
    assert b' c fence=' not in open(mnt.dpath('moved'), 'rb').read()
    st = os.lstat(mnt.dpath('lock.log'))
    assert st.st_nlink == 1 and st.st_mode & 0o7777 == 0o644


def test_sighup_without_a_move_keeps_the_file(mnt):
    os.mkdir(mnt.path('a'))
    ino = os.stat(mnt.dpath('lock.log')).st_ino
    os.kill(mnt.pid, signal.SIGHUP)
    os.rmdir(mnt.path('a'))
    wait_until(lambda: mnt.is_mounted(), timeout=0.5)
    assert os.stat(mnt.dpath('lock.log')).st_ino == ino
    assert [l.event for l in log_for(mnt.dir, 'a')] == ['acquired', 'released']


def test_sighup_does_not_follow_a_planted_symlink(mnt, tmp_path):
    outside = tmp_path / 'outside'
    outside.write_bytes(b'')
    os.rename(mnt.dpath('lock.log'), mnt.dpath('moved'))
    os.symlink(outside, mnt.dpath('lock.log'))
    os.kill(mnt.pid, signal.SIGHUP)
    wait_until(lambda: 'cannot reopen lock.log (it is a symbolic link)' in mnt.stderr(),
               timeout=2, what='the refusal on stderr')
    os.mkdir(mnt.path('x'))
    assert outside.read_bytes() == b''
    assert b' x fence=' in open(mnt.dpath('moved'), 'rb').read()   # kept writing the old one
    os.unlink(mnt.dpath('lock.log'))
    os.kill(mnt.pid, signal.SIGHUP)
    wait_until(lambda: os.path.isfile(mnt.dpath('lock.log')), timeout=2)
    os.rmdir(mnt.path('x'))
    assert [l.event for l in read_log(mnt.dir)] == ['released']


@pytest.mark.slow
def test_mv_and_sighup_under_a_herd_loses_no_line(lockfs_factory, herd_factory):
    m = lockfs_factory()
    herd = herd_factory(m)
    moved = []
    for i in range(6):
        wait_until(lambda: log_size(m) > 4096, timeout=10, what='lines in the new lock.log')
        moved.append(m.dpath(f'lock.log.mv{i}'))
        os.rename(m.dpath('lock.log'), moved[-1])
        os.kill(m.pid, signal.SIGHUP)
        wait_until(lambda: os.path.exists(m.dpath('lock.log')), timeout=2,
                   what='lock.log reopened after SIGHUP')
    done = herd.stop()
    m.assert_alive()
    check_herd(moved + [m.dpath('lock.log')], done)
    for f in moved[1:]:
        assert lines_of(f), f'{f} is empty: the reopen did not happen'


#: <linux/time.h>; Python's time module does not name it
CLOCK_REALTIME_COARSE = 5


@pytest.mark.slow
@pytest.mark.skipif(shutil.which('logrotate') is None,
                    reason='logrotate is not installed (tools/deps.sh installs it); '
                           'test_mv_and_sighup_under_a_herd_loses_no_line covers the same')
def test_logrotate_snippet_rotates_under_a_herd(lockfs_factory, herd_factory, tmp_path):
    with open(SNIPPET) as f:
        snippet = f.read()
    # It names the default backing dir and signals the daemon of DIR/.lockfs.
    assert '/run/lockfs/lock.log {' in snippet
    assert 'cat /run/lockfs/.lockfs' in snippet and 'kill -HUP' in snippet
    m = lockfs_factory()
    conf = tmp_path / 'lockfs.logrotate'
    conf.write_text(snippet.replace('/run/lockfs', m.dir))
    os.chmod(conf, 0o644)
    state = tmp_path / 'logrotate.state'
    herd = herd_factory(m)
    for _ in range(3):
        wait_until(lambda: log_size(m) > 4096, timeout=10, what='lines to rotate')
        before = set(os.listdir(m.dir))
        r = subprocess.run(['logrotate', '-f', '-s', str(state), str(conf)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert set(os.listdir(m.dir)) - before, 'logrotate rotated nothing'
        wait_until(lambda: os.path.exists(m.dpath('lock.log')), timeout=2,
                   what='lock.log reopened after the postrotate SIGHUP')
        # dateext names carry the second: the next rotation needs a new one,
        # by logrotate's clock -- time(2), which glibc reads from the
        # kernel's coarse clock, up to a tick behind time.time().
        t = time.time()
        wait_until(lambda: int(time.clock_gettime(CLOCK_REALTIME_COARSE)) > int(t),
                   timeout=2, what="a new second on logrotate's clock")
    done = herd.stop()
    m.assert_alive()
    dated = sorted(glob.glob(m.dpath('lock.log-*')))
    assert len(dated) == 3 and [p.endswith('.gz') for p in dated] == [True, True, False]
    check_herd(dated + [m.dpath('lock.log')], done)


# --------------------------------------------------------------------------
# a lock.log that is not a file of its own

def refused_start(backing, scratch_dir):
    mnt = os.path.join(scratch_dir, 'mnt')
    os.mkdir(mnt)
    rc, err = run_expect_refusal([LOCKFS_BIN, '-f', '-o', f'backing={backing}', mnt], mnt)
    assert rc != 0 and mount_entry(mnt) is None
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize('dangling', [False, True])
def test_a_symlinked_lock_log_is_refused(scratch_dir, tmp_path, dangling):
    backing = tmp_path / 'b'
    backing.mkdir(mode=0o700)
    target = tmp_path / 'target'
    if not dangling:
        target.write_bytes(b'precious\n')
    os.symlink(target, backing / 'lock.log')
    line = refused_start(backing, scratch_dir)
    assert line == (f'lockfs: {backing}/lock.log is a symbolic link; the audit log is written '
                    'only to a file of its own: remove the link')
    assert (target.read_bytes() == b'precious\n') if not dangling else not target.exists()


def test_a_hard_linked_lock_log_is_refused(scratch_dir, tmp_path):
    backing = tmp_path / 'b'
    backing.mkdir(mode=0o700)
    other = tmp_path / 'other'
    other.write_bytes(b'precious\n')
    os.link(other, backing / 'lock.log')
    line = refused_start(backing, scratch_dir)
    assert 'lock.log has other hard links' in line
    assert other.read_bytes() == b'precious\n'


def test_a_lock_log_that_is_a_fifo_is_refused(scratch_dir, tmp_path):
    backing = tmp_path / 'b'
    backing.mkdir(mode=0o700)
    os.mkfifo(backing / 'lock.log')
    assert refused_start(backing, scratch_dir) == \
        f'lockfs: {backing}/lock.log is not a regular file: remove it'
