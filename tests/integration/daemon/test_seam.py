"""Issue 10 §2: the seam.  What the store behind `-o backend=` decides, seen
through the mount: the backend is chosen by name, a stale foreign lock is
taken in the same mkdir, the dir store watches DIR for changes made outside
the daemon, and a holder on another host is never judged by pid or boot id."""

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import threading
import time

from lockfs_helpers import (LOCKFS_BIN, errno_of, evidence, log_for, mount_entry, read_owner,
                            run_expect_refusal, stays_held, wait_free, wait_log, wait_until)

OTHER_BOOT = '00000000-0000-4000-8000-000000000000'
DEAD_PID = 4194303          # pid_max on x86_64 is at most 2^22: never a live pid here


def _refusal(scratch_dir, *options):
    backing = os.path.join(scratch_dir, 'dir')
    mnt = os.path.join(scratch_dir, 'mnt')
    os.makedirs(backing, mode=0o700, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    argv = [LOCKFS_BIN, '-f', '-o', f'backing={backing}']
    for o in options:
        argv += ['-o', o]
    rc, err = run_expect_refusal(argv + [mnt], mnt)
    lines = err.splitlines()
    assert rc != 0, f'{options}: exited 0; stderr {err!r}'
    assert len(lines) == 1, f'{options}: expected one line on stderr, got {err!r}'
    assert mount_entry(mnt) is None
    return lines[0]


# ---- choosing the store ----

def test_an_unknown_backend_is_refused_in_one_line_naming_the_known_ones(scratch_dir):
    line = _refusal(scratch_dir, 'backend=nope')
    assert 'nope' in line and 'dir' in line, line


def test_backend_dir_is_the_default_store(lockfs_factory):
    m = lockfs_factory(options=['backend=dir'])
    os.mkdir(m.path('x'))
    with open(os.path.join(m.lockdir('x'), 'owner.json'), 'rb') as f:
        assert json.loads(f.read())['holder']['pid'] == os.getpid()
    assert read_owner(m.mnt, 'x')['resource'] == 'x'
    os.rmdir(m.path('x'))
    assert not os.path.lexists(m.lockdir('x'))


def test_an_etcd_option_without_backend_etcd_is_refused(scratch_dir):
    line = _refusal(scratch_dir, 'etcd=http://127.0.0.1:2379')
    assert 'etcd' in line and 'backend' in line, line


def test_help_lists_the_options_of_each_backend():
    out = subprocess.run([LOCKFS_BIN, '--help'], capture_output=True, text=True, timeout=10)
    text = out.stdout + out.stderr
    assert 'backend=' in text
    for opt in ('fence_file=', 'stale='):
        assert opt in text, f'{opt} missing from --help'


# ---- stale foreign locks: checked on contact ----

def test_a_stale_foreign_lock_is_taken_by_the_mkdir_that_meets_it(lockfs_factory):
    """A script's `mkdir DIR/old.lock`, older than -o stale: the first mkdir
    through the mount recovers it and acquires, in one request."""
    m = lockfs_factory(options=['stale=3600'])
    os.mkdir(m.lockdir('old'))
    os.mkdir(m.lockdir('young'))
    t_old, t_young = time.time() - 7200, time.time() - 60
    os.utime(m.lockdir('old'), (t_old, t_old))
    os.utime(m.lockdir('young'), (t_young, t_young))
    assert errno_of(os.mkdir, m.path('old')) == 0, 'the first mkdir must take the stale lock'
    assert read_owner(m.mnt, 'old')['holder']['pid'] == os.getpid()
    events = [l.event for l in log_for(m.dir, 'old')]
    assert events == ['recovered', 'acquired'], events
    rec = [l for l in log_for(m.dir, 'old') if l.event == 'recovered'][0]
    assert 'foreign-stale' in evidence(rec), rec.raw
    # a foreign lock younger than `stale` is still someone's
    assert errno_of(os.mkdir, m.path('young')) == errno.EEXIST
    assert os.path.isdir(m.lockdir('young'))
    os.rmdir(m.path('old'))


# ---- changes made outside the daemon ----

def _inotify_watches(pid):
    """The inodes (ints) watched by the inotify fds of process PID."""
    inos = set()
    fddir = f'/proc/{pid}/fd'
    for fd in os.listdir(fddir):
        try:
            target = os.readlink(os.path.join(fddir, fd))
        except OSError:
            continue
        if target != 'anon_inode:inotify':
            continue
        with open(f'/proc/{pid}/fdinfo/{fd}') as f:
            for line in f:
                if line.startswith('inotify wd:'):
                    ino = [w for w in line.split() if w.startswith('ino:')][0]
                    inos.add(int(ino[4:], 16))
    return inos


def test_the_dir_store_watches_DIR_for_changes(lockfs_factory):
    """The dir backend learns of `mkdir/rmdir DIR/NAME.lock` by other programs
    from inotify on DIR, not by polling."""
    m = lockfs_factory()
    # The mount shows before the daemon serves; the watch is there once it
    # answers a request (the store starts reporting before the loop runs).
    os.listdir(m.mnt)
    assert os.stat(m.dir).st_ino in _inotify_watches(m.pid)


def test_a_flock_waiter_behind_a_script_lock_is_granted_when_the_script_releases(mnt):
    """`mkdir DIR/x.lock` by a script; a blocked flock on M/.flock/x goes as
    soon as the script's `rmdir DIR/x.lock` (awaited, not timed)."""
    os.mkdir(mnt.lockdir('x'))
    fd = os.open(mnt.path('.flock', 'x'), os.O_RDWR | os.O_CREAT, 0o666)
    granted = threading.Event()

    def waiter():
        fcntl.flock(fd, fcntl.LOCK_EX)
        granted.set()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    wait_until(lambda: os.path.exists(mnt.path('x', 'waiters'))
               and os.path.getsize(mnt.path('x', 'waiters')) > 0,
               what='the flock waiter to be queued behind the script lock')
    assert not granted.is_set()
    os.rmdir(mnt.lockdir('x'))
    assert granted.wait(10), 'the waiter was not granted after the script released'
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == os.getpid()
    os.close(fd)
    wait_free(mnt, 'x')


# ---- liveness by host ----

def test_a_holder_on_another_host_is_never_judged_by_pid_or_boot_id(lockfs_factory):
    """Two records of dead-looking holders at start: the one of this host with
    another boot id is recovered (the positive control); the one naming another
    host is that host's, and stays held."""
    m = lockfs_factory()
    os.mkdir(m.path('remote'))
    os.mkdir(m.path('oldboot'))
    assert m.kill9() == -signal.SIGKILL

    def edit(name, **holder):
        p = os.path.join(m.lockdir(name), 'owner.json')
        with open(p, 'rb') as f:
            rec = json.loads(f.read())
        rec['holder'].update(holder)
        with open(p, 'wb') as f:
            f.write((json.dumps(rec, separators=(',', ':')) + '\n').encode())

    other = 'elsewhere-' + socket.gethostname()
    edit('remote', host=other, boot_id=OTHER_BOOT, pid=DEAD_PID)
    edit('oldboot', boot_id=OTHER_BOOT)
    m2 = lockfs_factory.restart(m)
    wait_free(m2, 'oldboot', timeout=2)
    assert 'boot-changed' in evidence(wait_log(m2.dir, 'oldboot', 'recovered')[0])
    assert stays_held(m2, 'remote', 1.0)
    assert not [l for l in log_for(m2.dir, 'remote') if l.event == 'recovered']
    assert errno_of(os.mkdir, m2.path('remote')) == errno.EEXIST
    assert read_owner(m2.mnt, 'remote')['holder']['host'] == other


def test_a_lock_of_another_host_is_refused_to_rmdir_and_yields_to_break(lockfs_factory):
    """Nobody here acts for another host's holder: rmdir is EPERM, logged
    `reason=other-host`; root's break still ends it."""
    m = lockfs_factory()
    os.mkdir(m.path('remote'))
    assert m.kill9() == -signal.SIGKILL
    p = os.path.join(m.lockdir('remote'), 'owner.json')
    with open(p, 'rb') as f:
        rec = json.loads(f.read())
    rec['holder'].update(host='elsewhere-' + socket.gethostname())
    with open(p, 'wb') as f:
        f.write((json.dumps(rec, separators=(',', ':')) + '\n').encode())
    m2 = lockfs_factory.restart(m)
    assert errno_of(os.rmdir, m2.path('remote')) == errno.EPERM
    denied = wait_log(m2.dir, 'remote', 'denied')[0]
    assert denied.details.get('reason') == 'other-host', denied.raw
    with open(m2.path('remote', 'break'), 'w') as f:
        f.write('host gone for good\n')
    wait_free(m2, 'remote', timeout=2)
    assert wait_log(m2.dir, 'remote', 'broken')
