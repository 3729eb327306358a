"""Issue 8 §4: never a grant without its `acquired` line; never a release
stopped by a log that cannot be written.

Two ways to make the log refuse writes:
- a small tmpfs DIR filled up (the issue's case: ENOSPC);
- RLIMIT_FSIZE of the daemon lowered to the log's size with prlimit(2):
  the store still takes writes (records are small) but every log write
  fails with EFBIG, so the errno a caller gets can only be the log's.
"""

import errno
import fcntl
import os
import resource
import subprocess

import pytest

from flock_helpers import fpath, holder_pids, wait_waiters
from lockfs_helpers import (held_in_backing, log_for, read_log, wait_free, wait_log,
                            wait_until)


# --------------------------------------------------------------------------
# making the log refuse writes

@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (mode 0700) to use as DIR; unmounted at teardown
    (after the lockfs mount, which is set up later and torn down first)."""
    d = tmp_path / 'small'
    d.mkdir()
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1M,mode=0700', 'lockfs-it-small',
                    str(d)], check=True)
    yield str(d)
    if subprocess.run(['umount', str(d)], stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run(['umount', '-l', str(d)])


def fill(m, agent):
    """Fill M's tmpfs DIR until the log refuses a line: a filler file takes
    every free page, then refused rmdirs (M must log every refusal: -o
    log_denied_interval=0) use up what the log's last page still holds,
    until one leaves lock.log as it was.  AGENT holds the lock they aim at
    (this process, its parent, is outside its tree)."""
    assert agent.mkdir(m.path('fill')) == 0
    fd = os.open(os.path.join(m.dir, 'filler'), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            try:
                os.write(fd, b'\0' * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
    finally:
        os.close(fd)
    log = os.path.join(m.dir, 'lock.log')
    for _ in range(200):
        before = os.path.getsize(log)
        with pytest.raises(PermissionError):
            os.rmdir(m.path('fill'))
        if os.path.getsize(log) == before:
            return
    raise AssertionError('the log never refused a line on a full DIR')


#: tmpfs tests fill the log's last page with refusals: every one a line
FULL_OPTS = ('log_denied_interval=0',)


def unfill(m):
    os.unlink(os.path.join(m.dir, 'filler'))


def limit_log(m, extra=0):
    """Lower the daemon's RLIMIT_FSIZE to the log's size (+ EXTRA bytes):
    the next line cannot be written (EFBIG), records still can."""
    size = os.path.getsize(m.dpath('lock.log'))
    assert size > 65536, 'grow the log past any record first'
    resource.prlimit(m.pid, resource.RLIMIT_FSIZE, (size + extra, resource.RLIM_INFINITY))
    return size


def unlimit_log(m):
    resource.prlimit(m.pid, resource.RLIMIT_FSIZE,
                     (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def grow_log(m):
    """Enough lines for limit_log: past 64 KiB, more than any record (a
    holder's command line alone may take 4 KiB)."""
    name = 'g' * 240
    while os.path.getsize(m.dpath('lock.log')) <= 65536:
        os.mkdir(m.path(name))
        os.rmdir(m.path(name))


def whole_lines(m):
    """lock.log ends with a newline and every line parses (no torn line)."""
    with open(m.dpath('lock.log'), 'rb') as f:
        data = f.read()
    assert data.endswith(b'\n'), data[-200:]
    return read_log(m.dir)


def not_held(m, name):
    return not os.path.lexists(m.lockdir(name)) and not os.path.lexists(m.path(name))


# --------------------------------------------------------------------------
# grants

def test_no_acquisition_without_its_line_when_dir_is_full(lockfs_factory, small_tmpfs,
                                                          procs):
    """The issue's case: a DIR so full that no log line fits; today an
    acquisition reusing a pooled lock directory succeeds with no line.
    (Without a pooled directory the store itself could not take the lock,
    and that is EIO: backing.md.)"""
    m = lockfs_factory(backing=small_tmpfs, options=FULL_OPTS)
    os.mkdir(m.path('warm'))   # leaves two pooled lock directories for reuse:
    os.mkdir(m.path('warm2'))  # fill()'s own mkdir takes one
    os.rmdir(m.path('warm'))
    os.rmdir(m.path('warm2'))
    fill(m, procs.agent())
    assert errno_of_mkdir(m, 'x') == errno.ENOSPC
    assert not_held(m, 'x') and b'x' not in held_in_backing(m.dir)
    assert [l.event for l in log_for(m.dir, 'x')] == []
    unfill(m)
    os.mkdir(m.path('x'))   # space again: granted, with its line
    assert [l.event for l in log_for(m.dir, 'x')] == ['acquired']
    os.rmdir(m.path('x'))
    assert 'cannot write lock.log (No space left on device)' in m.stderr()


def test_mkdir_gets_the_errno_of_the_failed_log_write(mnt):
    grow_log(mnt)
    size = limit_log(mnt)
    with pytest.raises(OSError) as e:
        os.mkdir(mnt.path('x'))
    assert e.value.errno == errno.EFBIG   # the log's error, not the store's
    assert not_held(mnt, 'x')
    assert os.path.getsize(mnt.dpath('lock.log')) == size
    unlimit_log(mnt)
    os.mkdir(mnt.path('x'))
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired']
    os.rmdir(mnt.path('x'))


def test_a_line_cut_by_the_failed_write_is_taken_back(mnt):
    """A write that ends part-way into a line: the part is removed, no torn
    line stays in the file."""
    grow_log(mnt)
    size = limit_log(mnt, extra=20)   # room for 20 bytes of the next line
    assert errno_of_mkdir(mnt, 'x') == errno.EFBIG
    assert os.path.getsize(mnt.dpath('lock.log')) == size
    unlimit_log(mnt)
    os.mkdir(mnt.path('x'))
    lines = whole_lines(mnt)
    assert [l.event for l in lines if l.name == b'x'] == ['acquired']
    os.rmdir(mnt.path('x'))


def errno_of_mkdir(m, name):
    try:
        os.mkdir(m.path(name))
    except OSError as e:
        return e.errno
    return 0


@pytest.mark.parametrize('how', ['flock', 'fcntl'])
def test_fd_lock_gets_the_errno_of_the_failed_log_write(mnt, procs, how):
    grow_log(mnt)
    lk = procs.agent()
    fd = lk.open(fpath(mnt, 'x'))
    limit_log(mnt)
    if how == 'flock':
        assert lk.flock(fd, fcntl.LOCK_EX) == errno.EFBIG
    else:
        r = lk.fcntl_lock(fd, fcntl.F_SETLKW, fcntl.F_WRLCK)
        assert r.get('errno') == errno.EFBIG, r
    assert not_held(mnt, 'x')
    unlimit_log(mnt)
    assert lk.flock(fd, fcntl.LOCK_EX) == 0
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired']
    assert lk.close(fd) == 0


def test_a_refused_shared_join_leaves_the_other_readers(mnt, procs):
    grow_log(mnt)
    a, b = procs.agent(), procs.agent()
    fa, fb = a.open(fpath(mnt, 'r')), b.open(fpath(mnt, 'r'))
    assert a.flock(fa, fcntl.LOCK_SH) == 0
    limit_log(mnt)
    assert b.flock(fb, fcntl.LOCK_SH) == errno.EFBIG
    assert holder_pids(mnt, 'r') == [a.pid]
    unlimit_log(mnt)
    assert b.flock(fb, fcntl.LOCK_SH) == 0
    assert holder_pids(mnt, 'r') == sorted([a.pid, b.pid])
    assert a.close(fa) == 0 and b.close(fb) == 0
    wait_log(mnt.dir, 'r', 'released', count=2)   # (the kernel's release comes after close)
    assert [l.event for l in log_for(mnt.dir, 'r')] == ['acquired', 'acquired',
                                                        'released', 'released']


@pytest.mark.parametrize('holder', ['mkdir', 'flock'])
def test_a_handoff_whose_line_fails_releases_and_refuses_the_waiter(mnt, procs, holder):
    """The holder lets go while the log refuses writes: its release
    happens; the waiter gets the log's errno instead of a lock the log does
    not show; the lock is free, granted to nobody, and both lines that do
    happen are written once the log takes writes again."""
    grow_log(mnt)
    a, b = procs.agent(), procs.agent()
    if holder == 'mkdir':
        assert a.mkdir(mnt.path('h')) == 0
    else:
        fa = a.open(fpath(mnt, 'h'))
        assert a.flock(fa, fcntl.LOCK_EX) == 0
    fb = b.open(fpath(mnt, 'h'))
    rid = b.flock_start(fb, fcntl.LOCK_EX)
    wait_waiters(mnt, 'h', [b.pid])
    limit_log(mnt)
    if holder == 'mkdir':
        assert a.rmdir(mnt.path('h')) == 0       # the release is not stopped
    else:
        assert a.close(fa) == 0
    assert b.wait(rid).get('errno') == errno.EFBIG
    assert not_held(mnt, 'h')
    assert [l.event for l in log_for(mnt.dir, 'h')] == ['acquired']   # released is kept
    unlimit_log(mnt)
    lines = wait_log(mnt.dir, 'h', 'released')
    assert [(l.event, l.details['pid']) for l in log_for(mnt.dir, 'h')] == [
        ('acquired', str(a.pid)), ('released', str(a.pid))]
    assert lines[0].details['pid'] == str(a.pid)
    assert b.flock(fb, fcntl.LOCK_EX) == 0     # and now it can be had, with its line
    assert [l.event for l in log_for(mnt.dir, 'h')] == ['acquired', 'released', 'acquired']
    assert b.close(fb) == 0


# --------------------------------------------------------------------------
# releases

def test_release_on_a_full_dir_happens_and_is_logged_when_space_returns(
        lockfs_factory, small_tmpfs, procs):
    m = lockfs_factory(backing=small_tmpfs, options=FULL_OPTS)
    a = procs.agent()
    assert a.mkdir(m.path('z')) == 0
    fill(m, a)
    assert a.rmdir(m.path('z')) == 0           # never stopped by a full disk
    assert not_held(m, 'z')
    assert [l.event for l in log_for(m.dir, 'z')] == ['acquired']
    unfill(m)
    wait_log(m.dir, 'z', 'released', timeout=2.0)
    lines = whole_lines(m)
    assert [l.event for l in lines if l.name == b'z'] == ['acquired', 'released']
    assert 'can be written again' in m.stderr()


def test_recovery_on_a_full_dir_happens_and_is_logged_when_space_returns(
        lockfs_factory, small_tmpfs, procs):
    m = lockfs_factory(backing=small_tmpfs, options=FULL_OPTS)
    a = procs.agent()
    assert a.mkdir(m.path('dead')) == 0
    fill(m, procs.agent())
    a.kill()
    wait_free(m, 'dead')                       # recovered while nothing can be logged
    assert [l.event for l in log_for(m.dir, 'dead')] == ['acquired']
    unfill(m)
    rec = wait_log(m.dir, 'dead', 'recovered', timeout=2.0)
    assert 'exited' in rec[0].details['evidence']


def test_kept_lines_keep_their_order(lockfs_factory, small_tmpfs, procs):
    """Several releases while the log is full come out in the order they
    happened, each once."""
    m = lockfs_factory(backing=small_tmpfs, options=FULL_OPTS)
    a = procs.agent()
    names = [f'k{i}' for i in range(10)]
    for n in names:
        assert a.mkdir(m.path(n)) == 0
    fill(m, a)
    for n in names:
        assert a.rmdir(m.path(n)) == 0
    unfill(m)
    wait_until(lambda: len([l for l in read_log(m.dir) if l.event == 'released' and
                            l.name.startswith(b'k')]) == 10, timeout=2.0,
               what='the ten kept released lines')
    rel = [l.name.decode() for l in whole_lines(m) if l.event == 'released' and
           l.name.startswith(b'k')]
    assert rel == names


# --------------------------------------------------------------------------
# syslog meanwhile

@pytest.fixture
def shared_dir(tmp_path):
    """A directory bind-mounted on itself and made shared: a mount made under
    it in another mount namespace (unshare --propagation unchanged) shows
    here too.  Unmounted at teardown, after the lockfs mount."""
    d = tmp_path / 'shared'
    d.mkdir()
    os.chmod(d, 0o755)
    subprocess.run(['mount', '--bind', str(d), str(d)], check=True)
    subprocess.run(['mount', '--make-shared', str(d)], check=True)
    yield str(d)
    if subprocess.run(['umount', str(d)], stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run(['umount', '-l', str(d)])


def test_kept_lines_go_to_syslog_meanwhile(shared_dir, lockfs_factory, procs, tmp_path):
    """The daemon runs in a mount namespace of its own whose /dev/log is this
    test's datagram socket; a release whose line cannot be written reaches
    syslog at once, facility LOG_DAEMON."""
    import socket
    sock_path = str(tmp_path / 'log.sock')
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(5)
    mnt = os.path.join(shared_dir, 'mnt')
    os.mkdir(mnt)
    os.chmod(mnt, 0o755)
    # A /dev of its own (tmpfs): fuse and null, and /dev/log bound to our socket.
    setup = ('mount -t tmpfs -o mode=755 lockfs-it-dev /dev && mknod /dev/fuse c 10 229 && '
             'mknod -m 666 /dev/null c 1 3 && touch /dev/log && '
             f'mount --bind {sock_path} /dev/log && exec "$@"')
    m = lockfs_factory(mountpoint=mnt,
                       wrapper=('unshare', '--mount', '--propagation', 'unchanged',
                                'sh', '-c', setup, 'sh'))
    a = procs.agent()
    grow_log(m)
    assert a.mkdir(m.path('s')) == 0
    limit_log(m)
    assert a.rmdir(m.path('s')) == 0
    msg = sock.recv(65536).decode('utf-8', 'replace')
    pri = int(msg[1:msg.index('>')])
    assert pri >> 3 == 3 and pri & 7 == 4          # LOG_DAEMON, LOG_WARNING
    assert 'lock.log (not written yet: File too large): ' in msg
    assert ' s fence=' in msg and f'pid={a.pid} released' in msg
    unlimit_log(m)
    wait_log(m.dir, 's', 'released')
    sock.close()
