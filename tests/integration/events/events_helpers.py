"""A `lockctl watch` run as a child, its JSON lines read with a deadline."""
import json
import os
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lockctl'))
from test_lockctl import LOCKCTL, clean_env  # noqa: E402


class Watch:
    """lockctl --mount M watch [NAMES]: lines parsed as they come."""

    def __init__(self, m, names=(), user=None):
        kw = {}
        if user is not None:
            kw = dict(user=user.uid, group=user.gid, extra_groups=[])
        self.m = m
        self.proc = subprocess.Popen([LOCKCTL, '--mount', m.mnt, 'watch', *names],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=clean_env(), cwd='/', **kw)
        self.buf = b''
        self.seen = []

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        r, _, _ = select.select([self.proc.stdout], [], [], left)
        if not r:
            return False
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        if not chunk:
            raise EOFError('lockctl watch ended: ' + self.proc.stderr.read().decode())
        self.buf += chunk
        return True

    def next(self, timeout=5.0):
        """The next event (a dict), or AssertionError after TIMEOUT."""
        deadline = time.monotonic() + timeout
        while b'\n' not in self.buf:
            if not self._fill(deadline):
                raise AssertionError(f'no event within {timeout}s; seen {self.seen}')
        line, self.buf = self.buf.split(b'\n', 1)
        ev = json.loads(line)
        self.seen.append(ev)
        return ev

    def until(self, pred, timeout=5.0, what='event'):
        """Events up to and including the first one PRED accepts."""
        deadline = time.monotonic() + timeout
        got = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f'no {what} within {timeout}s; seen {self.seen}')
            ev = self.next(left)
            got.append(ev)
            if pred(ev):
                return got

    def sync(self, timeout=10.0, name=None):
        """Wait until the watcher is attached: a lock taken and released
        here shows up in it (M/.events is opened after lockctl starts).
        NAME: the one lock to use (one the watcher watches)."""
        deadline = time.monotonic() + timeout
        n = 0
        fixed = name
        while True:
            name = fixed or f'sync-{os.getpid()}-{n}'
            os.mkdir(self.m.path(name))
            os.rmdir(self.m.path(name))
            try:
                self.until(lambda e: e.get('name') == name and e['event'] == 'released',
                           timeout=0.3)
                return
            except AssertionError:
                n += 1
                if time.monotonic() > deadline:
                    raise

    def stop(self, sig=signal.SIGINT):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc.stderr.close()
