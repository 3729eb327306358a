"""Issue 4 point 11: the lockctl command-line client, on real mounts.

Every verb with its exit statuses (0, CMD's, 1, 64, 69, 75, 77), the
refusal of a directory that is not a lockfs mount, `run` releasing however
CMD or lockctl ends, timeouts that leave no waiter and no lock, acquire and
release across separate invocations (a shell, a slug), `status` as a table
and as JSON, the waiting line on a terminal, and the seed's 8-agent herd
rewritten with `lockctl run` and checked with a witness file.

lockctl is found in the meson build root: $LOCKFS_BUILD/tools/lockctl.

Processes: every lockctl (and every herd agent) started in the background
runs in its own process group, which the `bg` fixture SIGKILLs, by that
pid, before the mount is taken down; a CMD orphaned by a killed lockctl is
tracked through a pidfd.
"""

import errno
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import time

import pytest

from lockfs_helpers import (BUILD, LINE_BREAKERS, PYTHON, SOURCE_ROOT, agent_named,
                            assert_alternating, log_for, proc_comm, read_owner,
                            wait_log, wait_until)

LOCKCTL = os.path.join(BUILD, 'tools', 'lockctl')

EX_USAGE, EX_UNAVAILABLE, EX_TEMPFAIL, EX_NOPERM = 64, 69, 75, 77

RUN_TIMEOUT = 30.0


@pytest.fixture(autouse=True)
def _require_lockctl():
    if not os.access(LOCKCTL, os.X_OK):
        pytest.fail(f'{LOCKCTL} is not an executable file (build it: meson compile -C BUILD;'
                    f' LOCKFS_BUILD names the build root)')


# --------------------------------------------------------------------------
# helpers

def lc(m, *args, env=None, user=None, input=None, timeout=RUN_TIMEOUT, mount=True):
    """Run lockctl [--mount M.mnt] ARGS to completion; the CompletedProcess."""
    cmd = [LOCKCTL] + (['--mount', m.mnt] if mount and m is not None else []) + list(args)
    kw = {}
    if user is not None:
        kw = dict(user=user.uid, group=user.gid, extra_groups=[])
    return subprocess.run(cmd, env=clean_env(env), input=input, capture_output=True,
                          timeout=timeout, cwd='/', **kw)


def clean_env(extra=None):
    e = {k: v for k, v in os.environ.items() if k not in ('LOCKFS_SLUG', 'LOCKFS_MOUNT')}
    if extra:
        e.update(extra)
    return e


def one_error_line(r, *words):
    """stderr is exactly one line starting with "lockctl: " that mentions WORDS."""
    err = r.stderr.decode()
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith('\n'), f'want one stderr line, got {err!r}'
    assert lines[0].startswith('lockctl: '), lines[0]
    for w in words:
        assert w in lines[0], f'{w!r} not in {lines[0]!r}'
    return lines[0]


def waiters(m, name):
    """M/NAME/waiters as a list of dicts ([] when NAME is not held)."""
    try:
        with open(m.path(name, 'waiters'), 'rb') as f:
            text = f.read().decode()
    except FileNotFoundError:
        return []
    return [json.loads(l) for l in text.splitlines() if l]


def held(m, name):
    return os.path.lexists(m.path(name))


def wait_free(m, name, timeout=5.0):
    wait_until(lambda: not held(m, name) and not os.path.lexists(m.lockdir(name)),
               timeout=timeout, what=f'{name!r} to be free')


def assert_free_for_others(m, procs, name):
    """Nobody holds NAME, no ghost waiter gets it: another process can take it."""
    wait_free(m, name)
    a = procs.agent()
    assert a.mkdir(m.path(name)) == 0, f'{name} is not free for a newcomer'
    assert a.rmdir(m.path(name)) == 0


def table(stdout):
    """Parse `lockctl status`: (header, rows); a row is a list of 11 fields
    (OPERATION, the last, may contain spaces)."""
    lines = stdout.decode().splitlines()
    header = lines[0].split()
    rows = [l.split(None, 10) for l in lines[1:]]
    return header, rows


class Bg:
    """lockctl (or any command) in the background, in its own process group."""

    def __init__(self, cmd, env=None, **kw):
        kw.setdefault('stdout', subprocess.PIPE)
        kw.setdefault('stderr', subprocess.PIPE)
        kw.setdefault('stdin', subprocess.DEVNULL)
        self.proc = subprocess.Popen(cmd, env=clean_env(env), cwd='/', process_group=0, **kw)
        self.pid = self.proc.pid

    def wait(self, timeout=RUN_TIMEOUT, input=None):
        """Exit status (after writing INPUT to stdin, if a pipe, and closing
        it); stdout and stderr are then in .out, .err."""
        try:
            out, err = self.proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f'{self.proc.args} did not end within {timeout}s')
        self.out = out.decode() if out is not None else ''
        self.err = err.decode() if err is not None else ''
        return self.proc.returncode

    def kill_group(self):
        # only while unreaped: the pid (and so the group id) is still ours
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def bg(lockfs_factory):
    """bg(cmd, env=None, **popen) -> Bg; bg.track(pid) for an orphan.  All
    killed (SIGKILL, by pid or pidfd) before the mounts are unmounted."""
    started, pidfds = [], []

    def start(cmd, env=None, **kw):
        b = Bg(cmd, env, **kw)
        started.append(b)
        return b

    def track(pid):
        try:
            pidfds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass

    start.track = track
    yield start
    for b in started:
        b.kill_group()
        for f in (b.proc.stdout, b.proc.stderr, b.proc.stdin):
            if f:
                f.close()
    for fd in pidfds:
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(fd)


def blocker_cmd(d, tag='cmd'):
    """A CMD that writes its pid, the owner record it sees and its open fds
    to D, then blocks until D/TAG.go exists or stdin closes (at most 30 s)."""
    script = r'''
import json, os, sys, time
d, tag, mnt, name = sys.argv[1:5]
info = {'pid': os.getpid(), 'fds': {}}
for fd in os.listdir('/proc/self/fd'):
    try:
        info['fds'][fd] = os.readlink('/proc/self/fd/' + fd)
    except OSError:
        pass
try:
    with open(os.path.join(mnt, name, 'owner')) as f:
        info['owner'] = json.load(f)
except OSError as e:
    info['owner_errno'] = e.errno
tmp = os.path.join(d, tag + '.tmp')
with open(tmp, 'w') as f:
    json.dump(info, f)
os.rename(tmp, os.path.join(d, tag + '.json'))
deadline = time.monotonic() + 30
while not os.path.exists(os.path.join(d, tag + '.go')) and time.monotonic() < deadline:
    time.sleep(0.01)
'''
    return [PYTHON, '-c', script, str(d), tag]


def start_blocked_run(bg, m, d, name, tag='cmd', extra=(), env=None):
    """`lockctl run NAME -- blocker`; returns (Bg, info) once CMD runs."""
    b = bg([LOCKCTL, '--mount', m.mnt, 'run', name, *extra, '--',
            *blocker_cmd(d, tag), m.mnt, name], env=env)
    info_path = os.path.join(d, tag + '.json')
    wait_until(lambda: os.path.exists(info_path) or b.proc.poll() is not None,
               timeout=10, what=f'CMD of lockctl run {name} to start')
    assert os.path.exists(info_path), f'lockctl exited {b.wait()}: {b.err!r}'
    with open(info_path) as f:
        return b, json.load(f)


def go(d, tag='cmd'):
    open(os.path.join(d, tag + '.go'), 'w').close()


def hold_with_mkdir(procs, m, name):
    a = procs.agent()
    assert a.mkdir(m.path(name)) == 0
    return a


# --------------------------------------------------------------------------
# the command line

def test_help_names_every_verb_option_and_exit_status():
    r = subprocess.run([LOCKCTL, '--help'], capture_output=True, timeout=RUN_TIMEOUT)
    assert r.returncode == 0 and r.stderr == b''
    out = r.stdout.decode()
    for word in ('run', 'acquire', 'release', 'status', 'break', '--slug', '--timeout',
                 '--restart-wait', '--shared', '--json', '--reason', '--poll', '--stale',
                 '--mount', 'LOCKFS_MOUNT', 'LOCKFS_RESTART_WAIT', '/locks'):
        assert word in out, f'--help does not mention {word}'
    for status in ('0', '1', '64', '69', '75', '77'):
        assert re.search(rf'^\s+{status}\s', out, re.M), f'--help lacks exit status {status}'


def test_version_and_man_page():
    r = subprocess.run([LOCKCTL, '--version'], capture_output=True, timeout=RUN_TIMEOUT)
    assert r.returncode == 0 and r.stdout.startswith(b'lockctl ')
    page = os.path.join(SOURCE_ROOT, 'docs', 'lockctl.1')
    if shutil.which('man'):
        r = subprocess.run(['man', '-l', page], capture_output=True, timeout=RUN_TIMEOUT,
                           env=dict(os.environ, MANWIDTH='100'))
        assert r.returncode == 0, r.stderr
        text = re.sub(r'.\x08', '', r.stdout.decode())  # undo overstrike bold
    else:  # no man(1) here: the troff source, its escaped hyphens undone
        text = open(page).read().replace('\\-', '-')
    text = text.replace('\u2010', '-').replace('\u2212', '-')
    for word in ('EXIT STATUS', 'run', 'acquire', 'release', 'status', 'break',
                 '64', '69', '75', '77', 'LOCKFS_MOUNT', '--poll', '--stale',
                 '--restart-wait', 'LOCKFS_RESTART_WAIT', 'DAEMON RESTARTS'):
        assert word in text, f'the man page does not mention {word}'


@pytest.mark.parametrize('args', [
    [],
    ['frob', 'x'],
    ['run', 'x'],
    ['run', 'x', '--'],
    ['run', 'x', 'true'],
    ['run', '--', 'true'],
    ['acquire'],
    ['acquire', 'x', 'y'],
    ['acquire', 'x', '--timeout', 'abc'],
    ['acquire', 'x', '--timeout', '-1'],
    ['acquire', 'x', '--timeout'],
    ['acquire', 'x', '--shared'],
    ['acquire', 'x', '--bogus'],
    ['acquire', 'x', '--', 'true'],
    ['acquire', 'a/b'],
    ['acquire', '.flock'],
    ['acquire', 'x', '--slug', ''],
    ['release'],
    ['release', 'x', '--timeout', '1'],
    ['release', 'x', '--json'],
    ['status', '--shared'],
    ['status', '--slug', 's'],
    ['status', 'x', 'y'],
    ['break', 'x'],
    ['break', 'x', '--reason', ''],
    ['break', 'x', '--reason', 'r' * 1025],
    ['run', 'x', '--poll', 'often', '--', 'true'],
    ['run', 'x', '--restart-wait', '-1', '--', 'true'],
    ['run', 'x', '--restart-wait', '86401', '--', 'true'],
    ['acquire', 'x', '--restart-wait'],
    ['status', '--restart-wait', '1'],
    ['release', 'x', '--restart-wait', '1'],
], ids=lambda a: ' '.join(a)[:40] or 'nothing')
def test_usage_errors_exit_64(mnt, args):
    r = lc(mnt, *args)
    assert r.returncode == EX_USAGE, (r.returncode, r.stderr)
    assert r.stdout == b''
    one_error_line(r)


def test_seed_flags_poll_and_stale_are_accepted(mnt):
    # accepted and without effect: the release of a lock not held is 1, not 64
    r = lc(mnt, 'release', 'x', '--poll', '2', '--stale', '12')
    assert r.returncode == 1, r.stderr
    one_error_line(r, 'x', 'not held')


# --------------------------------------------------------------------------
# the mount

@pytest.mark.parametrize('verb', [
    ['status'], ['status', 'x', '--json'], ['release', 'x'], ['acquire', 'x'],
    ['acquire', 'x', '--timeout', '0'], ['run', 'x', '--', 'true'],
    ['break', 'x', '--reason', 'r'],
])
def test_not_a_lockfs_mount_exits_69(tmp_path, verb):
    marker = tmp_path / 'ran'
    args = list(verb)
    if args[0] == 'run':
        args = args[:-1] + ['touch', str(marker)]
    for where, what in ((str(tmp_path), 'not a lockfs mount'),  # a plain directory
                        ('/proc', 'proc'),                       # a mount of another type
                        (str(tmp_path / 'none'), 'No such file')):
        r = subprocess.run([LOCKCTL, '--mount', where] + args, capture_output=True,
                           timeout=RUN_TIMEOUT, env=clean_env())
        assert r.returncode == EX_UNAVAILABLE, (where, r.returncode, r.stderr)
        assert r.stdout == b''
        one_error_line(r, what)
    assert not marker.exists(), 'run ran CMD without a lockfs mount'
    assert os.listdir(tmp_path) == [], 'lockctl created something in a non-lockfs directory'


@pytest.mark.parametrize('verb', [
    ['status'], ['release', 'x'], ['acquire', 'x'], ['acquire', 'x', '--timeout', '0'],
    ['run', 'x', '--', 'true'], ['break', 'x', '--reason', 'r'],
])
def test_a_mount_whose_daemon_died_exits_69_and_says_not_connected(lockfs_factory, verb):
    m = lockfs_factory()
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()                       # still mounted: every request is ENOTCONN
    try:
        # run and acquire first ride out a restart (test_lockctl_restart.py)
        r = lc(m, *verb, env={'LOCKFS_RESTART_WAIT': '0.2'})
    finally:
        m.kill9(lazy=True)              # reaped already: just unmounts
    assert r.returncode == EX_UNAVAILABLE, (r.returncode, r.stderr)
    one_error_line(r, 'not connected')


def test_mount_from_env_symlink_and_default(mnt, tmp_path, procs):
    hold_with_mkdir(procs, mnt, 'envlock')
    r = lc(None, 'status', 'envlock', env={'LOCKFS_MOUNT': mnt.mnt})
    assert r.returncode == 0, r.stderr
    assert table(r.stdout)[1][0][0] == 'envlock'
    # --mount wins over LOCKFS_MOUNT
    r = lc(mnt, 'status', 'envlock', env={'LOCKFS_MOUNT': str(tmp_path)})
    assert r.returncode == 0, r.stderr
    # a symlink to the mount point is resolved before the check
    link = tmp_path / 'link'
    os.symlink(mnt.mnt, link)
    r = lc(None, 'status', 'envlock', env={'LOCKFS_MOUNT': str(link)})
    assert r.returncode == 0, r.stderr
    # a directory inside the mount is not the mount
    r = lc(None, 'status', env={'LOCKFS_MOUNT': mnt.path('envlock')})
    assert r.returncode == EX_UNAVAILABLE
    one_error_line(r, 'not a lockfs mount')
    # without either, /locks (a lockfs mount only if this machine has one)
    r = lc(None, 'status')
    if os.path.isdir('/locks') and subprocess.run(
            ['findmnt', '-n', '-o', 'FSTYPE', '--mountpoint', '/locks'],
            capture_output=True).stdout.strip() == b'fuse.lockfs':
        assert r.returncode in (0, EX_NOPERM)
    else:
        assert r.returncode == EX_UNAVAILABLE
        one_error_line(r, '/locks')


# --------------------------------------------------------------------------
# status

COLUMNS = ['NAME', 'MODE', 'HOLDER', 'PID', 'USER', 'HOST', 'CONTAINER', 'AGE', 'LEASE',
           'WAITERS', 'OPERATION']


def test_status_table_of_mkdir_slug_and_foreign_locks(mnt, procs):
    a = hold_with_mkdir(procs, mnt, 'deploy')
    assert a.write(mnt.path('deploy', 'operation'), b'migrating the db\n') == 0
    s = procs.agent(env={'LOCKFS_SLUG': 'agent-7'})
    assert s.mkdir(mnt.path('build')) == 0
    os.mkdir(mnt.lockdir('ext'))  # the seed's own protocol: a foreign lock
    r = lc(mnt, 'status')
    assert r.returncode == 0, r.stderr
    assert r.stderr == b''
    header, rows = table(r.stdout)
    assert header == COLUMNS
    assert [row[0] for row in rows] == ['build', 'deploy', 'ext']
    build, deploy, ext = rows
    host = socket.gethostname()
    assert deploy[:7] == ['deploy', 'EX', proc_comm(a.pid), str(a.pid), 'root', host, '-']
    assert re.fullmatch(r'\d+s', deploy[7]), deploy
    assert deploy[8:] == ['-', '0', 'migrating the db']
    assert build[:7] == ['build', 'EX', 'slug:agent-7', str(s.pid), 'root', host, '-']
    assert re.fullmatch(r'(9m\d\ds|10m00s)', build[8]), f'lease left: {build}'  # -o lease=600
    assert build[9:] == ['0', '-']
    assert ext[:7] == ['ext'] + ['-'] * 6 and ext[8:] == ['-', '0', '-']
    # NAME alone
    r = lc(mnt, 'status', 'deploy')
    assert r.returncode == 0
    assert [row[0] for row in table(r.stdout)[1]] == ['deploy']


def test_status_json_is_the_owner_records_with_waiters(mnt, procs):
    a = hold_with_mkdir(procs, mnt, 'deploy')
    assert a.write(mnt.path('deploy', 'operation'), b'op') == 0
    os.mkdir(mnt.lockdir('ext'))
    r = lc(mnt, 'status', '--json')
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [o['resource'] for o in out] == ['deploy', 'ext']
    for o in out:
        assert o.pop('waiters') == []
        # each holder gains its pid as lockctl's pid namespace sees it
        for h in [o['holder']] + o.get('holders', []):
            if h is not None:
                assert h.pop('pid_here') == a.pid, h
        assert o == read_owner(mnt.mnt, o['resource'])
    assert out[1]['foreign'] is True and out[1]['holder'] is None
    r = lc(mnt, 'status', 'deploy', '--json')
    assert r.returncode == 0
    assert [o['resource'] for o in json.loads(r.stdout)] == ['deploy']


def test_status_of_a_lock_not_held_exits_1(mnt):
    r = lc(mnt, 'status', 'nothing')
    assert r.returncode == 1 and r.stdout == b''
    one_error_line(r, 'nothing', 'not held')
    r = lc(mnt, 'status', 'nothing', '--json')
    assert r.returncode == 1 and json.loads(r.stdout) == []
    # an empty mount: the header only, exit 0
    r = lc(mnt, 'status')
    assert r.returncode == 0 and r.stdout.decode().split() == COLUMNS
    r = lc(mnt, 'status', '--json')
    assert r.returncode == 0 and json.loads(r.stdout) == []


def test_status_control_characters_stay_on_one_line(mnt, procs):
    a = hold_with_mkdir(procs, mnt, 'ctl')
    assert a.write(mnt.path('ctl', 'operation'), b'line1\nline2\tend') == 0
    r = lc(mnt, 'status')
    assert r.returncode == 0
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 2 and lines[1].endswith('line1?line2?end'), lines


#: issue 19 §3: a comm with CSI (U+009B), NEL (U+0085), RIGHT-TO-LEFT
#: OVERRIDE (U+202E) and LINE SEPARATOR (U+2028) between printable text
#: (an e-acute: non-ASCII text that must stay)
HOSTILE_COMM = b'a\xc2\x9b\xc2\x85\xe2\x80\xae\xe2\x80\xa8\xc3\xa9'
HOSTILE_COMM_SHOWN = 'a????\u00e9'


def assert_no_line_breakers(text):
    bad = sorted({f'U+{ord(c):04X}' for c in text if c in LINE_BREAKERS and c != '\n'})
    assert not bad, f'shown raw: {bad} in {text!r}'


def test_status_shows_c1_separators_and_bidi_controls_as_question_marks(mnt, procs):
    """Observed: `lockctl status` showed U+009B, U+0085 and U+202E from comm
    and operation raw; lockctl(1) says control characters are shown as ?."""
    a = agent_named(procs, HOSTILE_COMM)
    assert a.mkdir(mnt.path('rtl')) == 0
    op = 'op\u202e\u2028\u0085\u009b31m\u2066x\u2029y\u200e\u200f\u061c caf\u00e9\u00a0ok'
    assert a.write(mnt.path('rtl', 'operation'), op.encode()) == 0
    s = procs.agent(env={'LOCKFS_SLUG': 's\u2028\u202e\u0085'})
    assert s.mkdir(mnt.path('slugged')) == 0
    r = lc(mnt, 'status')
    assert r.returncode == 0 and r.stderr == b'', r.stderr
    out = r.stdout.decode()                     # strict UTF-8
    assert_no_line_breakers(out)
    assert len(out.splitlines()) == 3 and out.count('\n') == 3, out
    header, rows = table(r.stdout)
    assert header == COLUMNS
    rtl, slugged = rows
    assert rtl[:4] == ['rtl', 'EX', HOSTILE_COMM_SHOWN, str(a.pid)], rtl
    assert rtl[10] == 'op????31m?x?y??? caf\u00e9\u00a0ok', rtl
    assert slugged[:3] == ['slugged', 'EX', 'slug:s???'], slugged
    # --json escapes them (all but ASCII) and parses back to the same text
    r = lc(mnt, 'status', '--json')
    assert r.returncode == 0 and r.stdout.isascii(), r.stdout
    recs = {o['resource']: o for o in json.loads(r.stdout)}
    assert recs['rtl']['holder']['comm'] == HOSTILE_COMM.decode()
    assert recs['rtl']['operation'] == op


def test_messages_that_quote_a_holder_show_the_same_set_as_question_marks(mnt_ao, procs,
                                                                          users):
    a = agent_named(procs, HOSTILE_COMM)
    assert a.mkdir(mnt_ao.path('q')) == 0
    r = lc(mnt_ao, 'release', 'q', user=users[0])
    assert r.returncode == EX_NOPERM
    line = one_error_line(r, 'q', f'held by {HOSTILE_COMM_SHOWN}[{a.pid}]')
    assert_no_line_breakers(line)
    r = lc(mnt_ao, 'run', 'q', '--timeout', '0', '--', 'true', user=users[0])
    assert r.returncode == EX_TEMPFAIL
    assert_no_line_breakers(one_error_line(r, 'q', f'{HOSTILE_COMM_SHOWN}[{a.pid}]'))


# --------------------------------------------------------------------------
# release and break (mkdir locks)

def test_release_by_the_holder_shell_then_not_held(mnt):
    r = subprocess.run(['sh', '-c', f'mkdir {mnt.path("rel")} || exit 9; '
                        f'{LOCKCTL} --mount {mnt.mnt} release rel; echo "rc=$?"; '
                        f'{LOCKCTL} --mount {mnt.mnt} release rel; echo "rc=$?"'],
                       capture_output=True, timeout=RUN_TIMEOUT, env=clean_env())
    assert r.stdout.decode().split() == ['rc=0', 'rc=1'], r.stderr
    one_error_line(r, 'rel', 'not held')
    assert not held(mnt, 'rel')


def test_release_by_a_stranger_exits_77_and_keeps_the_lock(mnt, procs):
    a = hold_with_mkdir(procs, mnt, 'mine')
    r = lc(mnt, 'release', 'mine')
    assert r.returncode == EX_NOPERM
    one_error_line(r, 'mine')
    assert read_owner(mnt.mnt, 'mine')['holder']['pid'] == a.pid


def test_release_of_a_slug_lock_needs_the_slug(mnt, procs):
    s = procs.agent(env={'LOCKFS_SLUG': 'agent-7'})
    assert s.mkdir(mnt.path('gadget')) == 0
    s.exit()  # the slug lock outlives its taker
    for args in ([], ['--slug', 'agent-8']):
        r = lc(mnt, 'release', 'gadget', *args)
        assert r.returncode == EX_NOPERM, (args, r.stderr)
        one_error_line(r, 'gadget')
        assert held(mnt, 'gadget')
    # --slug re-executes lockctl with LOCKFS_SLUG set, so the daemon sees it
    r = lc(mnt, 'release', 'gadget', '--slug', 'agent-7')
    assert r.returncode == 0, r.stderr
    assert not held(mnt, 'gadget')


def test_break_by_root_with_reason(mnt, procs):
    a = hold_with_mkdir(procs, mnt, 'hung')
    r = lc(mnt, 'break', 'hung', '--reason', 'holder hung, paging ops')
    assert r.returncode == 0, r.stderr
    assert r.stdout == b'' and r.stderr == b''
    assert not held(mnt, 'hung')
    line = wait_log(mnt.dir, 'hung', 'broken')[0]
    assert line.details['reason'] == 'holder\\x20hung,\\x20paging\\x20ops'
    assert a.rmdir(mnt.path('hung')) == errno.ENOENT  # the old holder lost it
    r = lc(mnt, 'break', 'hung', '--reason', 'again')
    assert r.returncode == 1
    one_error_line(r, 'hung', 'not held')


def test_break_by_another_user_exits_77(mnt_ao, procs, users):
    hold_with_mkdir(procs, mnt_ao, 'guarded')
    r = lc(mnt_ao, 'break', 'guarded', '--reason', 'mine now', user=users[0])
    assert r.returncode == EX_NOPERM, r.stderr
    one_error_line(r, 'guarded')
    assert held(mnt_ao, 'guarded')


def test_break_of_a_foreign_lock(mnt):
    os.mkdir(mnt.lockdir('seedlock'))
    r = lc(mnt, 'break', 'seedlock', '--reason', 'stale seed lock')
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(mnt.lockdir('seedlock'))


# --------------------------------------------------------------------------
# run (flock on M/.flock/NAME)

def test_run_exits_with_cmd_status_and_releases(mnt, procs):
    for cmd, want in ((['true'], 0), (['sh', '-c', 'exit 3'], 3),
                      (['sh', '-c', 'kill -TERM $$'], 128 + signal.SIGTERM),
                      (['sh', '-c', 'kill -KILL $$'], 128 + signal.SIGKILL),
                      (['/nonexistent/cmd'], 127)):
        r = lc(mnt, 'run', 'job', '--', *cmd)
        assert r.returncode == want, (cmd, r.returncode, r.stderr)
        assert_free_for_others(mnt, procs, 'job')
        assert waiters(mnt, 'job') == []
    one_error_line(r, '/nonexistent/cmd')


def test_run_passes_stdio_and_args_and_sets_the_slug(mnt):
    r = lc(mnt, 'run', 'io', '--slug', 'agent-3', '--', 'sh', '-c',
           'cat; echo "[$1] slug=$LOCKFS_SLUG"', 'sh', 'a b', input=b'in\n')
    assert r.returncode == 0, r.stderr
    assert r.stdout == b'in\n[a b] slug=agent-3\n'


def test_run_slug_names_the_holder_in_owner_and_in_every_log_line(mnt):
    """The seed's --slug: "your agent's identity, logged with every
    transition".  The lock stays lockctl's (bound to its descriptor)."""
    r = lc(mnt, 'run', 'cam', '--slug', 'agent-3', '--', 'cat', mnt.path('cam', 'owner'))
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert (o['slug'], o['bound']) == ('agent-3', 'fd')
    assert [(l.who, l.event) for l in log_for(mnt.dir, 'cam')] == [
        ('agent-3', 'acquired'), ('agent-3', 'released')]


def test_run_holds_the_lock_while_cmd_runs(mnt, tmp_path, procs, bg):
    b, info = start_blocked_run(bg, mnt, tmp_path, 'held')
    owner = info['owner']
    assert owner['bound'] == 'fd' and owner['mode'] == 'exclusive'
    # lockctl is a helper: the holder is the process that ran it (this one)
    assert owner['holder']['pid'] == os.getpid()
    # CMD shares the lock's open file (issue 22: it keeps the lock if
    # lockctl is killed), on a descriptor above 9, clear of scripts' own
    flock_path = mnt.path('.flock', 'held')
    assert [fd for fd, p in info['fds'].items() if p == flock_path and int(fd) >= 10], \
        info['fds']
    a = procs.agent()
    assert a.mkdir(mnt.path('held')) == errno.EEXIST
    r = lc(mnt, 'run', 'held', '--timeout', '0', '--', 'true')
    assert r.returncode == EX_TEMPFAIL
    go(tmp_path)
    assert b.wait() == 0, b.err
    assert_free_for_others(mnt, procs, 'held')


def test_run_releases_when_cmd_is_killed(mnt, tmp_path, procs, bg):
    b, info = start_blocked_run(bg, mnt, tmp_path, 'victim')
    os.kill(info['pid'], signal.SIGKILL)
    assert b.wait() == 128 + signal.SIGKILL
    assert_free_for_others(mnt, procs, 'victim')


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_run_forwards_signals_and_releases(mnt, tmp_path, procs, bg, sig):
    b, info = start_blocked_run(bg, mnt, tmp_path, 'fwd')
    cmd_pid = info['pid']
    os.kill(b.pid, sig)
    rc = b.wait()
    # CMD (python) dies of each: an uncaught KeyboardInterrupt re-raises SIGINT
    assert rc == 128 + sig, (rc, b.err)
    assert not os.path.exists(f'/proc/{cmd_pid}'), 'CMD outlived lockctl'
    assert_free_for_others(mnt, procs, 'fwd')


def test_run_released_when_lockctl_and_cmd_are_sigkilled(mnt, tmp_path, procs, bg):
    b, info = start_blocked_run(bg, mnt, tmp_path, 'crash')
    bg.track(info['pid'])
    os.kill(b.pid, signal.SIGKILL)
    assert b.proc.wait(10) == -signal.SIGKILL
    # CMD still has the lock's open file (test_lockctl_run_keeps.py); its
    # death is the last close
    assert read_owner(mnt.mnt, 'crash')['bound'] == 'fd'
    os.kill(info['pid'], signal.SIGKILL)
    assert_free_for_others(mnt, procs, 'crash')


def test_run_sigterm_while_waiting_leaves_no_trace(mnt, tmp_path, procs, bg):
    a = hold_with_mkdir(procs, mnt, 'gone')
    marker = tmp_path / 'ran'
    b = bg([LOCKCTL, '--mount', mnt.mnt, 'run', 'gone', '--', 'touch', str(marker)])
    wait_until(lambda: len(waiters(mnt, 'gone')) == 1, timeout=10, what='the waiter')
    os.kill(b.pid, signal.SIGTERM)
    assert b.wait() == -signal.SIGTERM
    wait_until(lambda: waiters(mnt, 'gone') == [], timeout=5, what='the waiter to leave')
    assert a.rmdir(mnt.path('gone')) == 0
    assert_free_for_others(mnt, procs, 'gone')
    assert not marker.exists()


def test_run_waits_in_fifo_order(mnt, tmp_path, procs, bg):
    a = hold_with_mkdir(procs, mnt, 'fifo')
    witness = tmp_path / 'order'
    runs = []
    for i in range(5):
        runs.append(bg([LOCKCTL, '--mount', mnt.mnt, 'run', 'fifo', '--',
                        'sh', '-c', f'echo {i} >> {witness}']))
        wait_until(lambda: len(waiters(mnt, 'fifo')) == i + 1, timeout=10,
                   what=f'waiter {i} to queue')
    w = waiters(mnt, 'fifo')
    assert [x['pid'] for x in w] == [os.getpid()] * 5  # lockctl's parent
    assert all(x['mode'] == 'exclusive' for x in w)
    assert a.rmdir(mnt.path('fifo')) == 0
    for b in runs:
        assert b.wait() == 0, b.err
    assert witness.read_text().split() == [str(i) for i in range(5)]
    assert_free_for_others(mnt, procs, 'fifo')


def test_run_timeout_exits_75_and_leaves_no_trace(mnt, tmp_path, procs):
    a = hold_with_mkdir(procs, mnt, 'slow')
    marker = tmp_path / 'ran'
    t0 = time.monotonic()
    r = lc(mnt, 'run', 'slow', '--timeout', '0.5', '--', 'touch', str(marker))
    took = time.monotonic() - t0
    assert r.returncode == EX_TEMPFAIL, r.stderr
    one_error_line(r, 'slow', 'timed out')
    assert 0.45 <= took < 5, took
    assert not marker.exists()
    assert waiters(mnt, 'slow') == []
    # when the holder goes, nobody (no ghost of the timed-out waiter) gets it
    assert a.rmdir(mnt.path('slow')) == 0
    assert_free_for_others(mnt, procs, 'slow')


def test_timeout_behind_others_keeps_their_order(mnt, tmp_path, procs, bg):
    a = hold_with_mkdir(procs, mnt, 'q')
    witness = tmp_path / 'order'
    first = bg([LOCKCTL, '--mount', mnt.mnt, 'run', 'q', '--', 'sh', '-c',
                f'echo first >> {witness}'])
    wait_until(lambda: len(waiters(mnt, 'q')) == 1, timeout=10, what='first waiter')
    r = lc(mnt, 'run', 'q', '--timeout', '0.3', '--', 'sh', '-c', f'echo late >> {witness}')
    assert r.returncode == EX_TEMPFAIL
    assert len(waiters(mnt, 'q')) == 1
    assert a.rmdir(mnt.path('q')) == 0
    assert first.wait() == 0, first.err
    assert witness.read_text().split() == ['first']
    assert_free_for_others(mnt, procs, 'q')


def test_run_timeout_zero_tries_once(mnt, procs):
    r = lc(mnt, 'run', 'once', '--timeout', '0', '--', 'true')
    assert r.returncode == 0, r.stderr
    a = hold_with_mkdir(procs, mnt, 'once')
    t0 = time.monotonic()
    r = lc(mnt, 'run', 'once', '--timeout', '0', '--', 'true')
    assert r.returncode == EX_TEMPFAIL
    assert time.monotonic() - t0 < 2
    one_error_line(r, 'once', str(a.pid))
    assert waiters(mnt, 'once') == []
    assert read_owner(mnt.mnt, 'once')['holder']['pid'] == a.pid


def test_run_shared_holders_overlap_and_exclude_writers(mnt, tmp_path, procs, bg):
    b1, i1 = start_blocked_run(bg, mnt, tmp_path, 'sh', tag='r1', extra=['--shared'])
    b2, i2 = start_blocked_run(bg, mnt, tmp_path, 'sh', tag='r2', extra=['--shared'])
    owner = read_owner(mnt.mnt, 'sh')
    assert owner['mode'] == 'shared' and len(owner['holders']) == 2
    r = lc(mnt, 'status', 'sh')
    assert r.returncode == 0
    rows = table(r.stdout)[1]
    assert [row[1] for row in rows] == ['SH', 'SH']
    r = lc(mnt, 'run', 'sh', '--timeout', '0', '--', 'true')  # exclusive
    assert r.returncode == EX_TEMPFAIL
    go(tmp_path, 'r1')
    go(tmp_path, 'r2')
    assert b1.wait() == 0 and b2.wait() == 0
    assert_free_for_others(mnt, procs, 'sh')


def test_run_waiting_line_on_a_terminal(mnt, procs, bg):
    a = hold_with_mkdir(procs, mnt, 'tty')
    master, slave = os.openpty()
    try:
        b = bg([LOCKCTL, '--mount', mnt.mnt, 'run', 'tty', '--', 'true'],
               stderr=slave, stdout=subprocess.DEVNULL)
        os.close(slave)
        slave = None
        seen = b''
        want = re.compile(rb'\r\x1b\[Klockctl: waiting for tty: held by '
                          + re.escape(f'{proc_comm(a.pid)}[{a.pid}]'.encode())
                          + rb' for \d+s; place 1 of 1 in line; waited \d+s')
        deadline = time.monotonic() + 10
        while not want.search(seen) and time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                seen += os.read(master, 4096)
        assert want.search(seen), seen
        assert a.rmdir(mnt.path('tty')) == 0
        assert b.wait() == 0
        while True:  # the rest of the output: the line is erased at the end
            r, _, _ = select.select([master], [], [], 0.2)
            if not r:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            seen += chunk
        assert seen.endswith(b'\r\x1b[K'), seen[-80:]
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)


def test_no_waiting_line_when_stderr_is_not_a_terminal(mnt, procs, bg):
    a = hold_with_mkdir(procs, mnt, 'quiet')
    b = bg([LOCKCTL, '--mount', mnt.mnt, 'run', 'quiet', '--', 'true'])
    wait_until(lambda: len(waiters(mnt, 'quiet')) == 1, timeout=10, what='the waiter')
    assert a.rmdir(mnt.path('quiet')) == 0
    assert b.wait() == 0
    assert b.err == ''


def test_status_shows_fd_lock_and_waiters(mnt, tmp_path, procs, bg):
    b, info = start_blocked_run(bg, mnt, tmp_path, 'busy')
    others = [bg([LOCKCTL, '--mount', mnt.mnt, 'run', 'busy', '--', 'true']) for _ in range(2)]
    wait_until(lambda: len(waiters(mnt, 'busy')) == 2, timeout=10, what='two waiters')
    r = lc(mnt, 'status')
    assert r.returncode == 0, r.stderr
    rows = table(r.stdout)[1]
    assert len(rows) == 1
    row = rows[0]
    assert row[:4] == ['busy', 'EX', proc_comm(os.getpid()), str(os.getpid())]
    assert row[9] == '2'
    r = lc(mnt, 'status', 'busy', '--json')
    out = json.loads(r.stdout)
    assert len(out) == 1 and out[0]['bound'] == 'fd'
    w = out[0]['waiters']
    assert len(w) == 2 and all(x['pid'] == os.getpid() for x in w)
    assert all(set(x) >= {'pid', 'comm', 'uid', 'mode', 'since'} for x in w)
    go(tmp_path)
    assert b.wait() == 0
    for o in others:
        assert o.wait() == 0
    assert_free_for_others(mnt, procs, 'busy')


# --------------------------------------------------------------------------
# acquire / release across invocations

def test_acquire_and_release_from_one_shell(mnt, tmp_path):
    o = tmp_path / 'owner.json'
    L = f'{LOCKCTL} --mount {mnt.mnt}'
    script = (f'{L} acquire sess || exit 10\n'
              f'cat {mnt.path("sess", "owner")} > {o} || exit 11\n'
              f'echo $$\n'
              f'{L} release sess || exit 12\n'
              f'test -e {mnt.path("sess")} && exit 13\n'
              f'exit 0\n')
    r = subprocess.run(['sh', '-c', script], capture_output=True, timeout=RUN_TIMEOUT,
                       env=clean_env())
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stderr == b''
    sh_pid = int(r.stdout)
    owner = json.loads(o.read_text())
    assert owner['bound'] == 'process'
    assert owner['holder']['pid'] == sh_pid and owner['holder']['comm'] == 'sh'
    assert not held(mnt, 'sess')


def test_acquired_lock_lives_as_long_as_the_shell(mnt, tmp_path, procs, bg):
    L = f'{LOCKCTL} --mount {mnt.mnt}'
    flag = tmp_path / 'acquired'
    sh = bg(['sh', '-c', f'{L} acquire life || exit 10; touch {flag}; read x; exit 0'],
            stdin=subprocess.PIPE)
    wait_until(lambda: flag.exists() or sh.proc.poll() is not None, timeout=10,
               what='the shell to acquire')
    assert flag.exists(), sh.wait()
    owner = read_owner(mnt.mnt, 'life')
    assert owner['holder']['pid'] == sh.pid and owner['bound'] == 'process'
    # lockctl has exited long ago; the lock is the shell's now
    r = lc(mnt, 'acquire', 'life', '--timeout', '0')
    assert r.returncode == EX_TEMPFAIL
    r = lc(mnt, 'release', 'life')
    assert r.returncode == EX_NOPERM
    assert sh.wait(input=b'\n') == 0  # the shell exits without releasing
    assert_free_for_others(mnt, procs, 'life')


def test_acquire_waits_in_line_then_binds(mnt, tmp_path, procs, bg):
    a = hold_with_mkdir(procs, mnt, 'line')
    L = f'{LOCKCTL} --mount {mnt.mnt}'
    flag = tmp_path / 'acquired'
    sh = bg(['sh', '-c', f'{L} acquire line || exit 10; touch {flag}; read x; '
             f'{L} release line; exit $?'], stdin=subprocess.PIPE)
    wait_until(lambda: [w['pid'] for w in waiters(mnt, 'line')] == [sh.pid], timeout=10,
               what='the shell to queue')
    assert not flag.exists()
    assert a.rmdir(mnt.path('line')) == 0
    wait_until(flag.exists, timeout=10, what='the shell to get the lock')
    assert read_owner(mnt.mnt, 'line')['holder']['pid'] == sh.pid
    assert sh.wait(input=b'\n') == 0, sh.err
    assert not held(mnt, 'line')


def test_acquire_timeout_exits_75_without_trace(mnt, procs):
    a = hold_with_mkdir(procs, mnt, 'tmo')
    for t in ('0', '0.3'):
        r = lc(mnt, 'acquire', 'tmo', '--timeout', t)
        assert r.returncode == EX_TEMPFAIL, (t, r.stderr)
        one_error_line(r, 'tmo')
        assert waiters(mnt, 'tmo') == []
        assert read_owner(mnt.mnt, 'tmo')['holder']['pid'] == a.pid
    assert a.rmdir(mnt.path('tmo')) == 0
    assert_free_for_others(mnt, procs, 'tmo')


def test_acquire_with_slug_then_release_from_another_process(mnt, procs):
    r = subprocess.run(['sh', '-c', f'{LOCKCTL} --mount {mnt.mnt} acquire gadget '
                        f'--slug agent-7; echo "rc=$?"'],
                       capture_output=True, timeout=RUN_TIMEOUT, env=clean_env())
    assert r.stdout == b'rc=0\n', r.stderr
    # the shell is gone; the lock belongs to (root, agent-7)
    owner = read_owner(mnt.mnt, 'gadget')
    assert owner['bound'] == 'slug' and owner['slug'] == 'agent-7'
    assert owner['lease'] is not None
    for args in ([], ['--slug', 'agent-8']):
        r = lc(mnt, 'release', 'gadget', *args)
        assert r.returncode == EX_NOPERM, args
        one_error_line(r, 'gadget')
    r = lc(mnt, 'status', 'gadget')
    assert table(r.stdout)[1][0][2] == 'slug:agent-7'
    r = lc(mnt, 'release', 'gadget', '--slug', 'agent-7')
    assert r.returncode == 0, r.stderr
    assert_free_for_others(mnt, procs, 'gadget')


def test_acquire_and_release_with_a_slug_as_another_user_through_setpriv(mnt_ao, users):
    """lockctl is a helper, so the fd lock's holder is the root shell that ran
    setpriv; lockctl, writing bind as uid U for that holder, may still
    convert it, and the slug lock is U's, as `setpriv ... mkdir` would make it."""
    u = users[0]
    pre = ['setpriv', f'--reuid={u.uid}', f'--regid={u.gid}', '--clear-groups', LOCKCTL,
           '--mount', mnt_ao.mnt]
    r = subprocess.run(pre + ['acquire', 'g', '--slug', 'agent-u'], capture_output=True,
                       timeout=RUN_TIMEOUT, env=clean_env())
    assert r.returncode == 0, r.stderr
    o = read_owner(mnt_ao.mnt, 'g')
    assert (o['bound'], o['slug'], o['holder']['uid']) == ('slug', 'agent-u', u.uid)
    r = subprocess.run(pre + ['release', 'g', '--slug', 'agent-u'], capture_output=True,
                       timeout=RUN_TIMEOUT, env=clean_env())
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(mnt_ao.lockdir('g'))
    assert [l.event for l in log_for(mnt_ao.dir, 'g')] == ['acquired', 'bound', 'released']


def test_acquire_binds_to_the_slug_in_the_environment(mnt):
    r = lc(mnt, 'acquire', 'envslug', env={'LOCKFS_SLUG': 'agent-9'})
    assert r.returncode == 0, r.stderr
    owner = read_owner(mnt.mnt, 'envslug')
    assert owner['bound'] == 'slug' and owner['slug'] == 'agent-9'
    r = lc(mnt, 'release', 'envslug', env={'LOCKFS_SLUG': 'agent-9'})
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------
# the seed's herd, with lockctl run

HERD_AGENTS = 8
HERD_ROUNDS = 5


def test_seed_herd_with_lockctl_run(mnt, tmp_path, bg):
    """The seed's 8-agent thundering herd: every agent runs its critical
    section HERD_ROUNDS times through `lockctl run`, appending enter/exit
    lines with its pid to a witness file; no two sections overlap, every
    agent is served every round, and no lock or waiter is left."""
    witness = tmp_path / 'witness'
    witness.write_bytes(b'')
    crit = (f'echo "enter $1 $$" >> {witness}; sleep 0.02; '
            f'echo "exit $1 $$" >> {witness}')
    agents = []
    for i in range(1, HERD_AGENTS + 1):
        loop = (f'for r in $(seq {HERD_ROUNDS}); do '
                f'{LOCKCTL} --mount {mnt.mnt} run herd --slug agent-{i} --poll 2 --stale 12 '
                f'-- sh -c \'{crit}\' sh agent-{i} || exit $?; done')
        agents.append(bg(['sh', '-c', loop]))
    for b in agents:
        assert b.wait(timeout=120) == 0, b.err
    lines = witness.read_text().splitlines()
    assert len(lines) == 2 * HERD_AGENTS * HERD_ROUNDS
    served = {}
    inside = None
    for l in lines:
        kind, agent, pid = l.split()
        if kind == 'enter':
            assert inside is None, f'{agent}[{pid}] entered while {inside} was inside'
            inside = (agent, pid)
        else:
            assert inside == (agent, pid), f'exit of {agent}[{pid}] while {inside} was inside'
            inside = None
            served[agent] = served.get(agent, 0) + 1
    assert inside is None
    assert served == {f'agent-{i}': HERD_ROUNDS for i in range(1, HERD_AGENTS + 1)}
    assert not held(mnt, 'herd') and waiters(mnt, 'herd') == []
    events = assert_alternating(log_for(mnt.dir, 'herd'), 'herd')
    assert events.count('acquired') == HERD_AGENTS * HERD_ROUNDS
