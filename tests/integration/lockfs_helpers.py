"""Helpers shared by the lockfs integration tests (no fixtures here).

Everything in this module is plain functions over paths, /proc and the
audit log format, so the test modules can import it directly.
"""

import datetime
import errno
import fcntl
import json
import math
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import time
import unicodedata

import pytest

def source_root(start=__file__):
    """The checkout START sits in: the nearest folder above it with the
    top-level meson.build (the one beside meson_options.txt; tests/ has a
    meson.build of its own).  Tests find README.md, docs/ and tools/ from
    here, whatever subfolder of tests/integration/ they sit in."""
    here = os.path.dirname(os.path.abspath(start))
    while not all(os.path.exists(os.path.join(here, f))
                  for f in ('meson.build', 'meson_options.txt')):
        up = os.path.dirname(here)
        if up == here:
            raise RuntimeError('no lockfs source tree above ' + start)
        here = up
    return here


SOURCE_ROOT = source_root()

# The build dir and the daemon: $LOCKFS_BUILD and $LOCKFS_BIN (meson test sets
# both); by hand, this checkout's build/, so that pytest-3 works in any
# checkout.
BUILD = os.environ.get('LOCKFS_BUILD') or (
    os.path.dirname(os.environ['LOCKFS_BIN']) if os.environ.get('LOCKFS_BIN')
    else os.path.join(SOURCE_ROOT, 'build'))
LOCKFS_BIN = os.environ.get('LOCKFS_BIN') or os.path.join(BUILD, 'lockfs')
def in_initial_pid_namespace():
    """True where the kernel's own threads are seen (pid 2 is kthreadd): the
    one pid namespace in which the kernel answers a subscription to process
    events.  Inside a container (tools/fresh-root.sh) it is False."""
    try:
        with open('/proc/2/comm') as f:
            return f.read().strip() == 'kthreadd'
    except OSError:
        return False


#: The daemon's one warning outside the initial pid namespace: it falls back
#: to scanning /proc for a holder's descendants (docs/holder.md).
NO_PROCESS_EVENTS = 'lockfs: warning: no process events'


def daemon_stderr(text):
    """TEXT, the daemon's stderr, without its documented warning of a
    container (no process events) where that warning is expected: a test
    that wants silence gets it on the host, and the same test in a container
    still fails on any other line."""
    if in_initial_pid_namespace():
        return text
    return ''.join(l for l in text.splitlines(True) if not l.startswith(NO_PROCESS_EVENTS))


def needs_process_events():
    """Skip, with the reason, a test of what only the kernel's process-event
    connector sees (descendants that left the holder's session)."""
    if not in_initial_pid_namespace():
        pytest.skip('not in the initial pid namespace (a container): the kernel answers a '
                    'process-event subscription only there, and the daemon falls back to '
                    'scanning /proc (docs/holder.md); the host run covers this')


# Children run Debian's python: fast to start, and its exe is a known name.
PYTHON = '/usr/bin/python3' if os.path.exists('/usr/bin/python3') else sys.executable

#: Longest lock name in bytes (NAME + ".lock" must fit in NAME_MAX).
NAME_MAX = 250

RFC3339_MS = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$')
TOKEN_RE = re.compile(r'^[0-9a-f]{32}$')
LOG_EVENTS = ('acquired', 'released', 'denied', 'recovered', 'expired', 'broken')
#: the daemon's own lines (WHO `lockfs`, NAME `-`): docs/log.md
DAEMON_EVENTS = ('daemon-started', 'daemon-stopped', 'daemon-crashed', 'daemon-taken-over')
#: the events that end an acquisition
END_EVENTS = ('released', 'recovered', 'broken')


# --------------------------------------------------------------------------
# mounts

def _unescape_mountinfo(field):
    """Undo the octal escapes (\\040 etc.) the kernel uses in mountinfo."""
    return re.sub(r'\\([0-7]{3})', lambda m: chr(int(m.group(1), 8)), field)


def mount_entry(mnt):
    """Return (fstype, source) of the topmost mount at MNT, or None."""
    mnt = os.fspath(mnt)
    found = None
    with open('/proc/self/mountinfo') as f:
        for line in f:
            pre, _, post = line.rstrip('\n').partition(' - ')
            fields = pre.split(' ')
            if len(fields) < 5:
                continue
            if _unescape_mountinfo(fields[4]) != mnt:
                continue
            post_f = post.split(' ')
            found = (post_f[0], _unescape_mountinfo(post_f[1]) if len(post_f) > 1 else '')
    return found


def mount_dev(mnt):
    """The device ("MAJOR:MINOR") of the topmost mount at MNT, or None: read
    from mountinfo, never by stat(), which a hung FUSE mount would hang."""
    mnt = os.fspath(mnt)
    dev = None
    with open('/proc/self/mountinfo') as f:
        for line in f:
            fields = line.split(' ')
            if len(fields) > 4 and _unescape_mountinfo(fields[4]) == mnt:
                dev = fields[2]
    return dev


def proc_mounts_type(mnt):
    """Filesystem type of MNT as /proc/mounts shows it (last entry), or None."""
    mnt = os.fspath(mnt)
    found = None
    with open('/proc/mounts') as f:
        for line in f:
            fields = line.split(' ')
            if len(fields) >= 3 and _unescape_mountinfo(fields[1]) == mnt:
                found = fields[2]
    return found


def is_lockfs_mounted(mnt):
    e = mount_entry(mnt)
    return e is not None and e[0] == 'fuse.lockfs'


# --------------------------------------------------------------------------
# processes

def proc_start_time(pid):
    """Field 22 (starttime, clock ticks after boot) of /proc/PID/stat."""
    with open(f'/proc/{pid}/stat', 'rb') as f:
        data = f.read()
    rest = data[data.rindex(b')') + 2:].split()
    # rest[0] is field 3 (state), so field N is rest[N - 3]
    return int(rest[22 - 3])


def proc_comm(pid):
    with open(f'/proc/{pid}/comm', 'rb') as f:
        return f.read().rstrip(b'\n').decode('utf-8', 'surrogateescape')


def proc_cmdline(pid):
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
        data = f.read()
    return [a.decode('utf-8', 'surrogateescape') for a in data.split(b'\0')[:-1]]


def boot_id():
    with open('/proc/sys/kernel/random/boot_id') as f:
        return f.read().strip()


# --------------------------------------------------------------------------
# the name rule, reimplemented from docs/names.md (issue 2 point 2, issue 8 §6)

#: Unicode's White_Space property (PropList.txt; stable since Unicode 6.3)
WHITE_SPACE = frozenset([*range(0x09, 0x0e), 0x20, 0x85, 0xa0, 0x1680, *range(0x2000, 0x200b),
                         0x2028, 0x2029, 0x202f, 0x205f, 0x3000])


def expected_name_errno(name):
    """What `mkdir M/NAME` must fail with (0 = must succeed).

    1..250 bytes of strict UTF-8 (Python's codec already refuses overlongs,
    surrogates and code points above U+10FFFF), no '/', no control
    character (C0, DEL, C1), no line or paragraph separator (Zl, Zp: U+2028,
    U+2029), not beginning with '.'; in Unicode NFC, with no format character
    (general category Cf), and not only whitespace.  Too
    long is ENAMETOOLONG whatever else is wrong; anything else wrong is
    EINVAL.  Python's unicodedata (Unicode 14 on Debian 12) stands in for
    libunistring: the fuzz checks that the two agree.
    """
    if isinstance(name, str):
        name = name.encode('utf-8', 'surrogateescape')
    if len(name) > NAME_MAX:
        return errno.ENAMETOOLONG
    if len(name) == 0 or name.startswith(b'.') or b'/' in name:
        return errno.EINVAL
    try:
        text = name.decode('utf-8', 'strict')
    except UnicodeDecodeError:
        return errno.EINVAL
    for ch in text:
        o = ord(ch)
        if o < 0x20 or o == 0x7f or 0x80 <= o <= 0x9f:
            return errno.EINVAL
        if unicodedata.category(ch) in ('Cf', 'Zl', 'Zp'):
            return errno.EINVAL
    if all(ord(ch) in WHITE_SPACE for ch in text):
        return errno.EINVAL
    if unicodedata.normalize('NFC', text) != text:
        return errno.EINVAL
    return 0


# --------------------------------------------------------------------------
# the owner record

def read_owner(mnt, name):
    with open(os.path.join(os.fsencode(mnt), os.fsencode(name), b'owner'), 'rb') as f:
        return json.loads(f.read())


def slot_owner(m, name):
    """The `owner` of slotted NAME on mount M (docs/slots.md)."""
    with open(m.path('.slots', name, 'owner')) as f:
        return json.load(f)


def slot_waiters(m, name):
    """The pids in slotted NAME's line on mount M, in line order."""
    try:
        with open(m.path('.slots', name, 'waiters')) as f:
            return [json.loads(line)['pid'] for line in f if line.strip()]
    except FileNotFoundError:
        return []


def parse_rfc3339_ms(s):
    assert RFC3339_MS.match(s), f'not RFC 3339 UTC with milliseconds: {s!r}'
    dt = datetime.datetime.strptime(s, '%Y-%m-%dT%H:%M:%S.%fZ')
    return dt.replace(tzinfo=datetime.timezone.utc).timestamp()


# --------------------------------------------------------------------------
# the audit log

#: The characters that break a line or turn it around when printed raw
#: (docs/log.md, "Escaping"): the log escapes them, lockctl shows them as '?'.
#: With the C0 controls they are every character at which str.splitlines()
#: splits.
LINE_BREAKERS = frozenset([chr(c) for c in range(0x20)] + [chr(c) for c in range(0x7f, 0xa0)] +
                          ['\u2028', '\u2029', '\u061c', '\u200e', '\u200f'] +
                          [chr(c) for c in range(0x202a, 0x202f)] +
                          [chr(c) for c in range(0x2066, 0x206a)])


def log_escape(b):
    """Escape a field as docs/log format says (bytes in, str out)."""
    if isinstance(b, str):
        b = b.encode('utf-8', 'surrogateescape')
    if b == b'':
        return '-'
    if b == b'-':
        return '\\x2d'
    out = bytearray()
    i = 0
    while i < len(b):
        c = b[i]
        if c < 0x80:
            if c == 0x5c:
                out += b'\\\\'
            elif c <= 0x20 or c == 0x7f:
                out += b'\\x%02x' % c
            else:
                out.append(c)
            i += 1
            continue
        # the longest valid UTF-8 sequence here, if any
        for n in (4, 3, 2, 1):
            try:
                ch = b[i:i + n].decode('utf-8')
            except UnicodeDecodeError:
                continue
            if len(ch) == 1:
                break
        else:
            ch, n = None, 1
        if ch is None or ch in LINE_BREAKERS:
            out += b''.join(b'\\x%02x' % x for x in b[i:i + n])
        else:
            out += b[i:i + n]
        i += n
    return out.decode('utf-8', 'surrogateescape')


def agent_named(procs, comm, **kw):
    """procs.agent(**kw) whose process has renamed itself (its comm, at most
    15 bytes) to the bytes COMM with prctl(PR_SET_NAME), as any process may;
    returned once the rename is done and the kernel shows it."""
    setup = ('import ctypes\n'
             f'assert ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p({comm!r}),'
             ' 0, 0, 0) == 0\n')
    a = procs.agent(setup=setup, **kw)
    a.call('info')                              # the setup code has run
    with open(f'/proc/{a.pid}/comm', 'rb') as f:
        assert f.read() == comm + b'\n', 'the kernel did not take the new comm'
    return a


def log_unescape(field):
    """Inverse of log_escape: str field -> bytes."""
    if field == '-':
        return b''
    raw = field.encode('utf-8', 'surrogateescape')
    out = bytearray()
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x5c and i + 1 < len(raw):
            if raw[i + 1] == 0x5c:
                out.append(0x5c)
                i += 2
                continue
            if raw[i + 1] in (ord('x'), ord('X')) and i + 3 < len(raw):
                out.append(int(raw[i + 2:i + 4], 16))
                i += 4
                continue
        out.append(c)
        i += 1
    return bytes(out)


class LogLine:
    """One parsed line of lock.log: TIMESTAMP WHO NAME [k=v ...] EVENT."""

    def __init__(self, raw):
        self.raw = raw
        fields = raw.split(' ')
        if len(fields) < 4:
            raise ValueError(f'log line has fewer than 4 fields: {raw!r}')
        self.fields = fields
        self.timestamp = fields[0]
        self.who = log_unescape(fields[1]).decode('utf-8', 'surrogateescape')
        self.name = log_unescape(fields[2])
        self.details = {}
        for d in fields[3:-1]:
            if '=' not in d:
                raise ValueError(f'detail without "=" in {raw!r}')
            k, v = d.split('=', 1)
            self.details[k] = v
        self.event = fields[-1]

    def __repr__(self):
        return f'LogLine({self.raw!r})'


def read_log(backing, whole_only=False):
    """All lines of DIR/lock.log, parsed ([] when there is none yet).

    The file must end with a newline -- unless WHOLE_ONLY: then a part of a
    line at its end is left out.  That is for reading while the daemon may
    be failing to write: a write that a full file system cuts short is
    taken back at once (log.md), but a reader can catch it in between."""
    try:
        with open(os.path.join(backing, 'lock.log'), 'rb') as f:
            data = f.read()
    except FileNotFoundError:
        return []
    text = data.decode('utf-8', 'surrogateescape')
    if whole_only:
        text = text[:text.rfind('\n') + 1]
    assert text == '' or text.endswith('\n'), 'lock.log does not end with a newline'
    return [LogLine(l) for l in text.split('\n')[:-1]]


def log_for(backing, name):
    if isinstance(name, str):
        name = name.encode('utf-8', 'surrogateescape')
    return [l for l in read_log(backing) if l.name == name]


def assert_alternating(lines, name=''):
    """acquired/released strictly alternate, starting with acquired."""
    events = [l.event for l in lines if l.event in ('acquired', 'released')]
    for i, ev in enumerate(events):
        want = 'acquired' if i % 2 == 0 else 'released'
        assert ev == want, (f'lock.log for {name!r}: event #{i} is {ev}, expected {want}'
                            f' (two holders at once or a release without acquisition)')
    return events


# --------------------------------------------------------------------------
# the backing directory

def snapshot(path):
    """Everything observable in a backing dir except access times:
    relative path -> (type, mode, uid, gid, size, mtime_ns, content)."""
    path = os.fsencode(path)
    out = {}
    st = os.lstat(path)
    out[b'.'] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_uid, st.st_gid,
                 None, st.st_mtime_ns, None)
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            p = os.path.join(root, n)
            st = os.lstat(p)
            content = None
            if stat.S_ISREG(st.st_mode):
                with open(p, 'rb') as f:
                    content = f.read()
            size = st.st_size if not stat.S_ISDIR(st.st_mode) else None
            out[os.path.relpath(p, path)] = (stat.S_IFMT(st.st_mode), st.st_mode,
                                             st.st_uid, st.st_gid, size,
                                             st.st_mtime_ns, content)
    return out


def held_in_backing(backing):
    """Names of NAME.lock entries in DIR (bytes, sorted)."""
    return sorted(n[:-5] for n in os.listdir(os.fsencode(backing)) if n.endswith(b'.lock'))


def temp_dirs_in_backing(backing):
    """Directories in DIR that are not NAME.lock (leftover temporaries).
    Released lock directories the daemon keeps for reuse (.lockfs-free.*)
    are not leftovers while it runs; the harness checks that none remain
    after a clean exit."""
    b = os.fsencode(backing)
    return sorted(n for n in os.listdir(b)
                  if os.path.isdir(os.path.join(b, n)) and not n.endswith(b'.lock')
                  and not n.startswith(b'.lockfs-free.'))


def errno_of(fn, *args, **kw):
    """Run FN; 0 if it succeeds, else the OSError's errno."""
    try:
        fn(*args, **kw)
    except OSError as e:
        return e.errno
    return 0


def errname(e):
    return errno.errorcode.get(e, str(e)) if e else '0'


# --------------------------------------------------------------------------
# waiting and unmounting

def wait_until(cond, timeout=5.0, interval=0.005, what='condition'):
    """Poll COND until it returns a true value or TIMEOUT passes."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out after {timeout}s waiting for {what}')
        time.sleep(interval)


def fusermount_u(mnt):
    """Unmount MNT: fusermount3 -u, retried briefly while busy, then -uz."""
    deadline = time.monotonic() + 5.0
    while True:
        r = subprocess.run(['fusermount3', '-u', os.fspath(mnt)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if r.returncode == 0 or mount_entry(mnt) is None:
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    subprocess.run(['fusermount3', '-uz', os.fspath(mnt)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return False


def run_expect_refusal(cmd, mnt, timeout=10.0):
    """Run a daemon command that must refuse to start.

    Returns (returncode, stderr_text).  If it is still running after
    TIMEOUT (it mounted instead of refusing), unmount and kill it, and fail.
    """
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if mount_entry(mnt) is not None:
            fusermount_u(mnt)
        p.kill()
        out, err = p.communicate()
        pytest.fail(f'{cmd} did not exit within {timeout}s (mounted: it should have refused);'
                    f' stderr: {err!r}')
    finally:
        if mount_entry(mnt) is not None:
            fusermount_u(mnt)
    return p.returncode, err.decode('utf-8', 'replace')


# --------------------------------------------------------------------------
# issue 3: liveness, leases, recovery

def log_settled(backing, name):
    """True when every acquisition of NAME in lock.log has the line that
    ends it (released, recovered, broken).  Only whole lines count: this
    polls while the log may be refusing writes (read_log)."""
    if isinstance(name, str):
        name = name.encode('utf-8', 'surrogateescape')
    lines = [l for l in read_log(backing, whole_only=True) if l.name == name]
    return (sum(1 for l in lines if l.event in END_EVENTS) >=
            sum(1 for l in lines if l.event == 'acquired'))


def wait_free(m, name, timeout=2.0, interval=0.001):
    """Poll until DIR/NAME.lock is gone; return the seconds it took.

    Then wait (at most a second more, not counted) for lock.log to say why:
    the daemon writes the line that ends a lock just after DIR let it go --
    never before, so that no line tells of a release that failed -- so DIR
    may show NAME free a few microseconds before the line is there."""
    t0 = time.monotonic()
    wait_until(lambda: not os.path.lexists(m.lockdir(name)), timeout=timeout,
               interval=interval, what=f'{name!r} to be released in {m.dir}')
    took = time.monotonic() - t0
    deadline = time.monotonic() + 1.0
    while not log_settled(m.dir, name) and time.monotonic() < deadline:
        time.sleep(0.001)
    return took


def stays_held(m, name, seconds, interval=0.01):
    """True if DIR/NAME.lock exists during the whole of SECONDS (a window for
    negative checks: something must NOT happen)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not os.path.lexists(m.lockdir(name)):
            return False
        time.sleep(interval)
    return os.path.lexists(m.lockdir(name))


def wait_log(backing, name, event, count=1, timeout=5.0):
    """Poll lock.log until NAME has at least COUNT EVENT lines; return them."""
    def found():
        ls = [l for l in log_for(backing, name) if l.event == event]
        return ls if len(ls) >= count else None
    return wait_until(found, timeout=timeout, interval=0.005,
                      what=f'{count} {event!r} line(s) for {name!r} in lock.log')


def evidence(line):
    """The set of evidence words of a recovered line (evidence=a,b)."""
    return set(line.details.get('evidence', '').split(',')) - {''}


def pidfds_of(pid):
    """Number of pidfds the process PID has open."""
    n = 0
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            if os.readlink(f'/proc/{pid}/fd/{fd}') == 'anon_inode:[pidfd]':
                n += 1
        except OSError:
            pass
    return n


def percentile(values, p):
    """Nearest-rank percentile (P in 0..100) of a non-empty list."""
    v = sorted(values)
    k = max(0, min(len(v) - 1, math.ceil(p / 100.0 * len(v)) - 1))
    return v[k]


def who_of(pid):
    return f'{proc_comm(pid)}[{pid}]'


FUSECTL = '/sys/fs/fuse/connections'


def fuse_conn_alive(dev):
    """Does FUSE connection DEV ("0:NN") still exist (its superblock still
    mounted somewhere, maybe in another mount namespace)?"""
    if not any(l.split(' ')[4] == FUSECTL and ' - fusectl ' in l
               for l in open('/proc/self/mountinfo')):
        subprocess.run(['mount', '-t', 'fusectl', 'fusectl', FUSECTL],
                       stderr=subprocess.DEVNULL)
    return os.path.isdir(os.path.join(FUSECTL, dev.split(':')[1]))


def fuse_conn_abort(mnt):
    """Abort the FUSE connection of MNT (fusectl): every process stuck in a
    request of a hung daemon gets ENOTCONN.  True if it was aborted."""
    mnt = os.fspath(mnt)
    dev = None
    with open('/proc/self/mountinfo') as f:
        for line in f:
            fields = line.split(' ')
            if len(fields) > 4 and _unescape_mountinfo(fields[4]) == mnt:
                dev = fields[2]
    if dev is None:
        return False
    ctl = '/sys/fs/fuse/connections'
    if not os.listdir(ctl):
        subprocess.run(['mount', '-t', 'fusectl', 'none', ctl], stderr=subprocess.DEVNULL)
    path = os.path.join(ctl, dev.split(':')[1], 'abort')
    try:
        with open(path, 'w') as f:
            f.write('1')
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------
# issue 9 point 1: the daemon makes its mount point immutable (the guard)

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x10


def dir_flags(path):
    """The inode flags (chattr) of directory PATH (never a FUSE mount)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return struct.unpack('i', fcntl.ioctl(fd, FS_IOC_GETFLAGS, b'\0' * 4))[0]
    finally:
        os.close(fd)


def is_guarded(path):
    return bool(dir_flags(path) & FS_IMMUTABLE_FL)


def unguard(path):
    """chattr -i PATH (a directory with nothing mounted on it).  Tests must
    leave no directory behind that even root cannot remove."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        flags = struct.unpack('i', fcntl.ioctl(fd, FS_IOC_GETFLAGS, b'\0' * 4))[0]
        if flags & FS_IMMUTABLE_FL:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack('i', flags & ~FS_IMMUTABLE_FL))
    except OSError:
        pass
    finally:
        os.close(fd)


def rmtree_unguarded(top):
    """shutil.rmtree(TOP) after clearing the immutable flag of every
    directory under it, never entering a mount (read from mountinfo)."""
    for root, dirs, _ in os.walk(top):
        if root != top and mount_entry(root) is not None:
            dirs[:] = []
            continue
        unguard(root)
        dirs[:] = [d for d in dirs if mount_entry(os.path.join(root, d)) is None]
        for d in dirs:
            unguard(os.path.join(root, d))
    shutil.rmtree(top, ignore_errors=True)


def thread_wakeups(pid):
    """{(thread name, tid): voluntary context switches} of every thread of
    PID, from /proc/PID/task/*/status: how often each one slept and was
    woken.  Threads that end meanwhile are left out."""
    out = {}
    base = f'/proc/{pid}/task'
    for tid in os.listdir(base):
        try:
            with open(f'{base}/{tid}/status') as f:
                fields = dict(line.split(':\t', 1) for line in f if ':\t' in line)
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[(fields['Name'].strip(), int(tid))] = int(fields['voluntary_ctxt_switches'])
    return out


def idle_wakeups(pid, seconds, allowed=(), settle=10.0):
    """Wake-ups of PID's threads over SECONDS of quiet, by thread name,
    leaving out the threads named in ALLOWED (the documented periodic
    ones).  First waits (at most SETTLE s) for the end of the work that
    came before: a window of SECONDS/3 in which the other threads do not
    wake at all.  Returns ({name: wake-ups}, settled)."""
    def others(before, after):
        woke = {}
        for key, n in after.items():
            if key[0] not in allowed and n - before.get(key, n) > 0:
                woke[key[0]] = woke.get(key[0], 0) + n - before.get(key, n)
        return woke

    settled = False
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline:
        before = thread_wakeups(pid)
        time.sleep(seconds / 3)  # a window of quiet, measured
        if not others(before, thread_wakeups(pid)):
            settled = True
            break
    before = thread_wakeups(pid)
    time.sleep(seconds)  # the quiet measured
    return others(before, thread_wakeups(pid)), settled
