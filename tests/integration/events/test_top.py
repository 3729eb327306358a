"""lockctl top in a pseudo-terminal (issue 24, section 3, top)."""
import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import time

from events_helpers import LOCKCTL, clean_env

ANSI = re.compile(rb'\x1b\[[0-9;?]*[A-Za-z]')


class Top:
    """lockctl top on the slave side of a pty; the screen read from the master."""

    def __init__(self, m):
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([LOCKCTL, '--mount', m.mnt, 'top'], stdin=slave,
                                     stdout=slave, stderr=slave, env=clean_env(), cwd='/',
                                     start_new_session=True)
        os.close(slave)
        self.out = b''

    def read(self, timeout):
        r, _, _ = select.select([self.master], [], [], timeout)
        if r:
            try:
                self.out += os.read(self.master, 65536)
            except OSError:  # EIO: the slave side closed (top exited)
                return False
        return bool(r)

    def screen(self):
        """The last frame drawn, without escape sequences."""
        last = self.out.rsplit(b'\x1b[H\x1b[2J', 1)[-1]
        return ANSI.sub(b'', last).decode(errors='replace')

    def wait_for(self, pred, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self.screen()):
                return self.screen()
            self.read(0.2)
        raise AssertionError('screen never matched:\n' + self.screen())

    def exit_status(self, timeout=5.0):
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read(0.1)
        while self.proc.poll() is not None and self.read(0.2):
            pass  # what it wrote last, still in the pty
        return self.proc.poll()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def holder_and_waiter(mnt, procs):
    holder, waiter = procs.agent(), procs.agent()
    holder.take(mnt.path('.flock', 'gpu'))
    fw = waiter.open(mnt.path('.flock', 'gpu'))
    rid = waiter.flock_start(fw, fcntl.LOCK_EX)
    return holder, waiter, rid


def lock_row(screen, name, pid):
    return re.search(rf'^{name}\s+\S+\s+{pid}\s', screen, re.M)


def test_top_shows_a_lock_of_another_process_and_its_waiter_and_quits_on_q(mnt, procs):
    top = Top(mnt)
    try:
        top.wait_for(lambda s: 'NAME' in s and 'HOLDER' in s)
        holder, waiter, rid = holder_and_waiter(mnt, procs)
        # Redrawn from the events: the lock, its holder's pid, its waiter's.
        # (The rows may be drawn by the once-a-second redraw just before
        # the thread has read the event: wait for both.)
        s = top.wait_for(lambda s: lock_row(s, 'gpu', holder.pid) and
                         re.search(rf'waiting:\s+\S+\s+{waiter.pid}\s', s) and
                         re.search(rf'waiting\s+gpu\s+\S+\[{waiter.pid}\]',
                                   s.split('recent events:')[-1]))
        assert '1 held, 1 waiting' in s
        os.write(top.master, b'q')
        assert top.exit_status() == 0
        # The terminal is given back: alternate screen left, cursor shown.
        assert top.out.endswith(b'\x1b[?25h\x1b[?1049l')
    finally:
        top.close()


def test_top_follows_a_release_and_quits_on_sigint(mnt, procs):
    top = Top(mnt)
    try:
        top.wait_for(lambda s: 'NAME' in s)
        a = procs.agent()
        assert a.mkdir(mnt.path('seat')) == 0
        top.wait_for(lambda s: lock_row(s, 'seat', a.pid))
        assert a.rmdir(mnt.path('seat')) == 0
        top.wait_for(lambda s: not lock_row(s, 'seat', a.pid) and '0 held' in s)
        os.killpg(top.proc.pid, signal.SIGINT)
        assert top.exit_status() == 0
        assert top.out.endswith(b'\x1b[?25h\x1b[?1049l')
    finally:
        top.close()


def test_top_not_on_a_terminal_prints_one_frame(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('plain')) == 0
    r = subprocess.run([LOCKCTL, '--mount', mnt.mnt, 'top'], capture_output=True,
                       env=clean_env(), cwd='/', timeout=10, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert b'\x1b' not in r.stdout
    assert lock_row(out, 'plain', a.pid), out
    assert '1 held, 0 waiting' in out
