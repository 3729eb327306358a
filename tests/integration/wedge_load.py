"""The load under which a hard stop of the daemon used to wedge the mount
(issue 8 point 1), as plain helpers (no fixtures): test_wedge.py and
tools/bench/bench_stop.py use them.

- `Load(mnt, witness, stopfile, user, mkdirs=8, flocks=8)`: MKDIRS clients
  that loop `mkdir M/wN` / `rmdir M/wN`, and FLOCKS clients that loop
  forking a child that opens `M/.flock/wN`, takes flock(LOCK_EX) and exits,
  all forked by one launcher running as USER.  Every holder appends
  `+ TAG` when it got the lock and `- TAG` before it lets go to the WITNESS
  file (one write(2) each, O_APPEND), so `witness_overlaps()` tells whether
  a lock was ever granted twice.  A client ends when STOPFILE exists or on
  the first error but EEXIST/EINTR; `Load.wait_all(T)` counts the clients
  still running after T seconds (stuck), `Load.results()` the others' ends.
- `abort_conn(dev)`: write /sys/fs/fuse/connections/NN/abort (only for a
  connection the caller made), mounting fusectl when needed.
- `task_states(pid)`: state and kernel stack/wchan of every thread.
- `WEDGED_SRC`: a stand-in for a daemon that died wedged.
"""

import json
import os
import select
import signal
import subprocess
import time

from lockfs_helpers import PYTHON

NAMES = ('w0', 'w1')

# One process (as the load's user) forks every client, so that starting 16
# of them costs one python start-up.  A client loops until STOPFILE exists
# (it checks only between two acquisitions) or a request fails with
# anything but EEXIST/EINTR; the launcher prints `END KIND PID ERR` as
# each one exits, ERR being STOP, the errno name, or KILLED.
LAUNCHER_SRC = r"""
import errno, fcntl, json, os, signal, sys
mnt, witness, stopfile = sys.argv[1], sys.argv[2], sys.argv[3]
kinds = json.loads(sys.argv[4])        # [["mkdir", "w0"], ["flock", "w1"], ...]

def name_of(e):
    return errno.errorcode.get(e, str(e))

def mkdir_client(name):
    w = os.open(witness, os.O_WRONLY | os.O_APPEND)
    path = os.path.join(mnt, name)
    while not os.path.exists(stopfile):
        try:
            os.mkdir(path)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.EINTR):
                continue
            return name_of(e.errno)
        tag = '%s:%d' % (name, os.getpid())
        os.write(w, ('+ %s\n' % tag).encode())
        os.write(w, ('- %s\n' % tag).encode())
        try:
            os.rmdir(path)
        except OSError as e:
            return name_of(e.errno)
    return 'STOP'

def flock_client(name):
    path = os.path.join(mnt, '.flock', name)
    while not os.path.exists(stopfile):
        pid = os.fork()
        if pid == 0:
            try:
                w = os.open(witness, os.O_WRONLY | os.O_APPEND)
                fd = os.open(path, os.O_RDWR | os.O_CREAT)
                fcntl.flock(fd, fcntl.LOCK_EX)
                tag = '%s:%d' % (name, os.getpid())
                os.write(w, ('+ %s\n' % tag).encode())
                os.write(w, ('- %s\n' % tag).encode())
                os.close(fd)
            except OSError as e:
                os._exit(e.errno if 0 < e.errno < 256 else 255)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, errno.EINTR):
            return name_of(code) if code > 0 else 'KILLED'
    return 'STOP'

pids = {}
for kind, name in kinds:
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        r = mkdir_client(name) if kind == 'mkdir' else flock_client(name)
        os.write(1, ('END %s %d %s\n' % (kind, os.getpid(), r)).encode())
        os._exit(0)
    pids[pid] = kind
os.write(1, b'READY\n')
while pids:
    pid, status = os.wait()
    kind = pids.pop(pid, None)
    if kind and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        os.write(1, ('END %s %d KILLED\n' % (kind, pid)).encode())
"""


class Load:
    """MKDIRS clients on NAMES and FLOCKS on FLOCK_NAMES (default NAMES),
    as USER, forked by one launcher."""

    def __init__(self, mnt, witness, stopfile, user=None, mkdirs=8, flocks=8, names=NAMES,
                 flock_names=None):
        kw = {}
        if user is not None:
            kw = dict(user=user.uid, group=user.gid, extra_groups=[])
        env = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
        kinds = ([['mkdir', names[i % len(names)]] for i in range(mkdirs)] +
                 [['flock', (flock_names or names)[i % len(flock_names or names)]]
                  for i in range(flocks)])
        self.n = len(kinds)
        self.ends = []
        self._buf = b''
        self.proc = subprocess.Popen([PYTHON, '-c', LAUNCHER_SRC, mnt, witness, stopfile,
                                      json.dumps(kinds)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     cwd='/', env=env, start_new_session=True, **kw)
        line = self._line(30.0)
        assert line == 'READY', f'load launcher: {line!r}'

    def _line(self, timeout):
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b'\n' not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b'\n', 1)
        return line.decode()

    def wait_all(self, timeout):
        """Wait up to TIMEOUT for every client to end; returns the number
        still running then (stuck).  self.ends: [(kind, pid, result)]."""
        deadline = time.monotonic() + timeout
        while len(self.ends) < self.n:
            line = self._line(max(deadline - time.monotonic(), 0))
            if line is None:
                break
            assert line.startswith("END ") and len(line.split()) == 4, line
            _, kind, pid, result = line.split()
            self.ends.append((kind, int(pid), result))
        return self.n - len(self.ends)

    def results(self):
        """{result: count} of the clients that ended."""
        out = {}
        for _, _, r in self.ends:
            out[r] = out.get(r, 0) + 1
        return out

    def kill(self):
        """SIGKILL every client (its session), then reap the launcher."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.proc.stdout.close()


def witness_overlaps(witness):
    """Lines of WITNESS where a lock was granted while another holder had it."""
    held, bad = {}, []
    with open(witness) as f:
        for n, line in enumerate(f, 1):
            op, tag = line.split()
            name = tag.split(':')[0]
            if op == '+':
                if held.get(name):
                    bad.append(f'line {n}: {tag} got {name} while {held[name]} held it')
                held[name] = tag
            elif held.get(name) == tag:
                held[name] = None
    return bad


FUSECTL = '/sys/fs/fuse/connections'


def abort_conn(dev):
    """Abort FUSE connection DEV ("0:NN"), which the caller made.  True if
    the abort file was written, False if that connection is gone."""
    if not any(l.split(' ')[4] == FUSECTL and ' - fusectl ' in l
               for l in open('/proc/self/mountinfo')):
        subprocess.run(['mount', '-t', 'fusectl', 'fusectl', FUSECTL],
                       stderr=subprocess.DEVNULL)
    try:
        with open(os.path.join(FUSECTL, dev.split(':')[1], 'abort'), 'w') as f:
            f.write('1')
    except OSError:
        return False
    return True


def task_states(pid):
    """{tid: (state, wchan, first stack lines)} of every thread of PID."""
    out = {}
    try:
        tids = os.listdir(f'/proc/{pid}/task')
    except OSError:
        return out
    for tid in tids:
        base = f'/proc/{pid}/task/{tid}'
        try:
            with open(base + '/stat') as f:
                state = f.read().rsplit(')', 1)[1].split()[0]
            with open(base + '/wchan') as f:
                wchan = f.read()
            try:
                with open(base + '/stack') as f:
                    stack = [l.split()[-1] for l in f.read().splitlines()[:6]]
            except OSError:
                stack = []
        except OSError:
            continue
        out[int(tid)] = (state, wchan, stack)
    return out


# A stand-in for a daemon that died wedged (see test_wedge.py): it takes
# DIR/.lockfs as lockfs does, mounts MNT as fuse.lockfs of DIR, answers
# INIT, then lets one thread look up MNT/x and reads that request without
# ever answering it.  SIGKILL then kills every thread but that one, which
# waits uninterruptibly for an answer that has been read already: the
# process is a zombie that keeps DIR/.lockfs and /dev/fuse open, so its
# connection stays alive and every request on MNT hangs -- the state the
# notification thread of older lockfs left behind.
WEDGED_SRC = r'''
import ctypes, fcntl, os, struct, sys, threading
dirpath, mnt = sys.argv[1], sys.argv[2]
lock = os.open(os.path.join(dirpath, '.lockfs'), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(lock, 0)
os.pwrite(lock, b'%d\n' % os.getpid(), 0)
dev = os.open('/dev/fuse', os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = b'fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other' % dev
if libc.mount(dirpath.encode(), mnt.encode(), b'fuse.lockfs', 6, opts) != 0:  # nosuid,nodev
    sys.exit('mount: ' + os.strerror(ctypes.get_errno()))
def request():
    buf = os.read(dev, 1 << 20)
    length, opcode, unique = struct.unpack_from('<IIQ', buf)
    return opcode, unique
opcode, unique = request()
assert opcode == 26, opcode                     # FUSE_INIT
init_out = struct.pack('<IIIIHHIIHHII', 7, 31, 0, 0, 16, 12, 4096, 0, 0, 0, 0, 0) + bytes(24)
os.write(dev, struct.pack('<IiQ', 16 + len(init_out), 0, unique) + init_out)
threading.Thread(target=lambda: os.path.exists(os.path.join(mnt, 'x')), daemon=True).start()
opcode, unique = request()                      # the lookup: read, never answered
print('WEDGED', opcode, flush=True)
threading.Event().wait()
'''
