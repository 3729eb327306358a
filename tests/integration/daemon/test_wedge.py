"""Issue 8 point 1: a hard stop of the daemon never wedges the mount.

The wedge, as observed: under load (8 mkdir/rmdir loops and 8 forked flock
takers, another uid), SIGKILL or SIGTERM left the daemon `Zl`/`Sl` with a
thread in D state in fuse_reverse_inval_entry, and every client in D state
until /sys/fs/fuse/connections/N/abort.  A notification waited for a
directory lock held by a request no thread would answer; that thread kept
the process, so /dev/fuse, so the connection alive.  lockfs now sends no
notification (fs/ops.c), and a restart aborts a predecessor left in that
state (fs/takeover.c).

Every trial: the load runs (awaited by its progress in the witness file),
the daemon gets the signal, and then every client must return within 2 s
(ENOTCONN/ECONNABORTED/EIO on the dead mount; after SIGTERM the daemon
unmounts, so also EPERM from the guarded mount point and ENOENT for
M/.flock/NAME or an rmdir there), the daemon must be gone within 2 s, and
a restart on the same DIR and mount point must serve within 2 s -- after
SIGKILL without a `fusermount3 -u`: the restart detaches the dead mount of
its own DIR.  A holder (`survivor`) keeps w2 across every stop, and after
each restart a second load runs against it; the witness file, written by
every holder, must never show a lock granted twice.

Teardown kills every client and, if any of them is still stuck, aborts the
connections this module made (only those), so that a failure never leaves
D-state processes behind.
"""

import errno
import os
import signal
import subprocess
import time

import pytest

from lockfs_helpers import (LOCKFS_BIN, PYTHON, errno_of, held_in_backing, mount_dev, read_log,
                            mount_entry, read_owner, wait_until)
from wedge_load import WEDGED_SRC, Load, abort_conn, task_states, witness_overlaps

TRIALS = int(os.environ.get('LOCKFS_WEDGE_TRIALS', '10'))
BOUND_S = 2.0
ON_DEAD_MOUNT = {'ENOTCONN', 'ECONNABORTED', 'EIO'}
# After SIGTERM the daemon unmounts: M is the guarded plain directory.
ON_UNMOUNTED = ON_DEAD_MOUNT | {'EPERM', 'ENOENT'}


class Wedge:
    """What this module started that could hang: loads, FUSE connections
    and processes; cleaned up before the mounts are."""

    def __init__(self):
        self.loads, self.devs, self.procs = [], [], []

    def load(self, *args, **kw):
        ld = Load(*args, **kw)
        self.loads.append(ld)
        return ld

    def cleanup(self):
        for ld in self.loads:
            ld.kill()
        stuck = [ld for ld in self.loads if ld.proc.poll() is None]
        stuck += [p for p in self.procs if p.poll() is None]
        if stuck:
            for dev in self.devs:
                abort_conn(dev)
            for p in [ld.proc for ld in self.loads] + self.procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass


@pytest.fixture
def wedge(lockfs_factory):
    w = Wedge()
    yield w
    w.cleanup()


def _witness_lines(path):
    with open(path, 'rb') as f:
        return f.read().count(b'\n')


def _wait_progress(witness, grants=10):
    """Wait until the load has granted GRANTS more locks (2 lines each)."""
    start = _witness_lines(witness)
    wait_until(lambda: _witness_lines(witness) >= start + 2 * grants, timeout=20,
               what=f'{grants} grants by the load')


def _stuck_report(m, load):
    return (f'{load.n - len(load.ends)} of {load.n} clients still blocked {BOUND_S}s after '
            f'the signal (ended: {load.results()}); daemon threads: {task_states(m.pid)}')


def _stop_and_check(m, load, sig):
    """Send SIG under load; every client and the daemon end within BOUND_S."""
    t0 = time.monotonic()
    m.stopped = True
    m.proc.send_signal(sig)
    stuck = load.wait_all(BOUND_S)
    assert stuck == 0, _stuck_report(m, load)
    try:
        m.returncode = m.proc.wait(max(0.05, t0 + BOUND_S - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f'daemon {m.pid} still running {BOUND_S}s after {sig!r}: '
                    f'{task_states(m.pid)}')
    allowed = ON_DEAD_MOUNT if sig == signal.SIGKILL else ON_UNMOUNTED
    assert set(load.results()) <= allowed, load.ends


def _hard_stop_trials(scratch_dir, lockfs_factory, wedge, procs, users, sig):
    # Where the load's user (uid 4242) can write.
    witness, stop = os.path.join(scratch_dir, 'witness'), os.path.join(scratch_dir, 'stop')
    open(witness, 'wb').close()
    os.chmod(witness, 0o666)
    m = lockfs_factory(allow_other=True)
    survivor = procs.agent(user=users[0])
    assert survivor.mkdir(m.path('w2')) == 0
    with open(witness, 'ab') as w:
        w.write(b'+ w2:survivor\n')
    for trial in range(TRIALS):
        wedge.devs.append(mount_dev(m.mnt))
        load = wedge.load(m.mnt, witness, stop, users[0], names=('w0', 'w1', 'w2'))
        _wait_progress(witness)
        _stop_and_check(m, load, sig)
        if sig == signal.SIGTERM:
            assert os.listdir(m.mnt) == [], 'a client created something in the mount point'
        # The same DIR and mount point; after SIGKILL the dead mount is
        # still there, and the new daemon replaces it by itself.
        t0 = time.monotonic()
        m = lockfs_factory(backing=m.dir, allow_other=True, mountpoint=m.mnt, replacing=True)
        took = time.monotonic() - t0
        assert took < BOUND_S, f'trial {trial}: restart took {took:.2f}s'
        assert read_owner(m.mnt, 'w2')['holder']['pid'] == survivor.pid
        # Against the live survivor and whatever the stop left in DIR.
        again = wedge.load(m.mnt, witness, stop, users[0], mkdirs=6, flocks=4,
                           names=('w0', 'w1', 'w2'), flock_names=('w0', 'w1'))
        _wait_progress(witness)
        open(stop, 'w').close()
        assert again.wait_all(10) == 0, f'clients did not stop: {again.ends}'
        os.unlink(stop)
        assert set(again.results()) == {'STOP'}, again.ends
        # A flock taker's last close is released by the kernel's FUSE_RELEASE,
        # which it sends after the process has exited: await it.
        wait_until(lambda: held_in_backing(m.dir) == [b'w2'], timeout=5,
                   what='only w2 held in DIR once the clients stopped')
    with open(witness, 'ab') as w:
        w.write(b'- w2:survivor\n')
    assert survivor.rmdir(m.path('w2')) == 0
    assert witness_overlaps(witness) == []
    m.assert_alive()


@pytest.mark.parametrize('sig', [signal.SIGKILL, signal.SIGTERM], ids=['SIGKILL', 'SIGTERM'])
def test_a_stop_under_load_never_wedges(scratch_dir, lockfs_factory, wedge, procs, users, sig):
    _hard_stop_trials(scratch_dir, lockfs_factory, wedge, procs, users, sig)


def test_restart_after_sigkill_detaches_the_dead_mount(lockfs_factory):
    """No `fusermount3 -u` needed: the dead mount of its own DIR goes."""
    m = lockfs_factory()
    m.stopped = True
    m.proc.kill()
    m.proc.wait()
    assert errno_of(os.mkdir, m.path('x')) == errno.ENOTCONN
    m2 = lockfs_factory(backing=m.dir, mountpoint=m.mnt, replacing=True)
    assert 'detached the dead mount' in m2.stderr()
    os.mkdir(m2.path('x'))
    os.rmdir(m2.path('x'))


def test_restart_leaves_a_dead_mount_of_another_dir_alone(lockfs_factory, tmp_path):
    m = lockfs_factory()
    m.stopped = True
    m.proc.kill()
    m.proc.wait()
    other = tmp_path / 'other'
    other.mkdir(mode=0o700)
    r = _refused([LOCKFS_BIN, '-f', '-o', f'backing={other}', m.mnt])
    assert r.returncode == 1 and 'Transport endpoint is not connected' in r.stderr, r.stderr
    assert mount_entry(m.mnt) == ('fuse.lockfs', m.dir)


def _refused(cmd):
    """Run a daemon that must refuse to start (bounded: it must not mount)."""
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=10)


def _wedged_predecessor(wedge, backing, mnt):
    """Start WEDGED_SRC on BACKING and MNT and SIGKILL it: returns its Popen
    once it is a zombie with a thread in D state, and its mount's device."""
    fake = subprocess.Popen([PYTHON, '-c', WEDGED_SRC, str(backing), mnt],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    wedge.procs.append(fake)
    line = fake.stdout.readline()
    assert line.startswith(b'WEDGED'), line
    dev = mount_dev(mnt)
    wedge.devs.append(dev)
    fake.kill()

    def wedged():
        states = [s for s, _, _ in task_states(fake.pid).values()]
        return 'Z' in states and 'D' in states
    wait_until(wedged, timeout=5, what='the killed predecessor to be a zombie with a D thread')
    return fake, dev


def test_restart_aborts_a_wedged_predecessor_and_takes_over(scratch_dir, lockfs_factory, wedge,
                                                             tmp_path):
    """A predecessor killed while a thread of it waited for an answer on its
    own connection (what the notification thread of older lockfs did): the
    zombie holds DIR/.lockfs and /dev/fuse, its clients hang.  The restart
    aborts that connection (only because the recorded pid is a zombie that
    holds DIR/.lockfs), waits for it to go and serves."""
    backing = tmp_path / 'backing'
    backing.mkdir(mode=0o700)
    mnt = os.path.join(scratch_dir, 'mnt')
    os.mkdir(mnt)
    fake, dev = _wedged_predecessor(wedge, backing, mnt)
    client = subprocess.Popen(['mkdir', os.path.join(mnt, 'x')], stderr=subprocess.PIPE,
                              env=dict(os.environ, LC_ALL='C'))
    wedge.procs.append(client)
    wait_until(lambda: any(s == 'D' for s, _, _ in task_states(client.pid).values()),
               timeout=5, what='a client stuck on the wedged mount')
    t0 = time.monotonic()
    m = lockfs_factory(backing=str(backing), mountpoint=mnt, replacing=True)
    assert time.monotonic() - t0 < BOUND_S + 0.5  # the abort, plus a 0.3 s grace
    assert client.wait(BOUND_S) == 1
    assert any(e in client.stderr.read() for e in (b'not connected', b'connection abort'))
    assert fake.wait(BOUND_S) == -signal.SIGKILL
    err = m.stderr()
    assert f'its daemon (pid {fake.pid}) has died but cannot finish exiting' in err, err
    assert f'aborting FUSE connection {dev.split(":")[1]}' in err, err
    assert f'took over backing dir {backing} from its wedged daemon (pid {fake.pid})' in err
    # The take-over is in lock.log too (issue 20 point 6), not as a crash.
    lines = [l for l in read_log(str(backing)) if l.event.startswith('daemon-')]
    assert [(l.event, int(l.details['pid'])) for l in lines[:2]] == [
        ('daemon-taken-over', fake.pid), ('daemon-started', m.pid)], lines
    assert lines[0].details['next_pid'] == str(m.pid)
    os.mkdir(m.path('y'))
    os.rmdir(m.path('y'))


def _recorded_pid(backing):
    try:
        with open(os.path.join(backing, '.lockfs')) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def test_restart_refuses_a_stopped_live_predecessor(lockfs_factory):
    """Control: a predecessor that is alive (here stopped, so its mount hangs)
    is not a zombie, so nothing is aborted and the restart is refused."""
    m = lockfs_factory()
    # A -f daemon shows its mount a moment before it records its pid: stop
    # it only once DIR/.lockfs names it, as the refusal will.
    wait_until(lambda: _recorded_pid(m.dir) == m.pid, what='the pid in DIR/.lockfs')
    os.kill(m.pid, signal.SIGSTOP)
    try:
        r = _refused([LOCKFS_BIN, '-f', '-o', f'backing={m.dir}', m.mnt])
    finally:
        os.kill(m.pid, signal.SIGCONT)
    assert r.returncode == 1, r.stderr
    assert f'already served by another lockfs daemon (pid {m.pid})' in r.stderr, r.stderr
    m.assert_alive()
    os.mkdir(m.path('x'))
    os.rmdir(m.path('x'))
