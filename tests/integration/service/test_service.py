#!/usr/bin/python3
"""Issue 9 §3: lockfs as an ordinary service.

- the systemd unit: installed by `meson install`, passes `systemd-analyze
  verify`, runs the daemon in the foreground as Type=notify;
- readiness: READY=1 on $NOTIFY_SOCKET only once the mount serves (after
  any detaching), STOPPING=1 on the way out;
- the daemon's own messages: syslog once detached (a /dev/log of the test's
  own, bound in a private mount namespace), stderr with -f, and "<N>"
  priorities when stderr is the journal.
"""

import os
import re
import shutil
import signal
import subprocess
import tempfile

import pytest

from conftest import stderr_problems
from lockfs_helpers import (LOCKFS_BIN, SOURCE_ROOT, daemon_stderr, fusermount_u,
                            is_lockfs_mounted, mount_entry, rmtree_unguarded, wait_until)
from service_helpers import (BUILD, DgramSocket, NsAgent, daemon_pid, parse_syslog,
                             unit_settings, unit_value)

LOG_DAEMON = 3
LOG_ERR, LOG_WARNING, LOG_NOTICE = 3, 4, 5


@pytest.fixture
def work():
    d = tempfile.mkdtemp(prefix='lockfs-svc-')
    os.chmod(d, 0o755)
    os.mkdir(os.path.join(d, 'mnt'))
    os.mkdir(os.path.join(d, 'dir'), 0o700)
    yield d
    mnt = os.path.join(d, 'mnt')
    if mount_entry(mnt) is not None:
        fusermount_u(mnt)
    rmtree_unguarded(d)   # the daemon made mnt immutable (its guard)
    assert not os.path.exists(d), f'{d} is left behind'


# --------------------------------------------------------------------------
# the unit

def test_unit_runs_the_daemon_in_the_foreground_as_type_notify():
    s = dict(unit_settings())
    assert s['Type'] == 'notify'
    assert s['Restart'] == 'on-failure'
    assert s['RuntimeDirectory'] == 'lockfs'
    assert s['RuntimeDirectoryMode'] == '0700'
    # a restart must not empty the backing dir that holds the locks
    assert s['RuntimeDirectoryPreserve'] == 'yes'
    start = unit_value('ExecStart').split()
    assert start[0].endswith('/bin/lockfs') and '-f' in start
    assert 'backing=${LOCKFS_BACKING}' in unit_value('ExecStart')
    env = ' '.join(v for k, v in unit_settings() if k == 'Environment')
    assert 'LOCKFS_BACKING=/run/lockfs' in env and 'allow_other' in env


def _install(destdir):
    r = subprocess.run(['meson', 'install', '-C', BUILD, '--destdir', destdir, '--quiet',
                        '--no-rebuild'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    units = [os.path.join(root, n) for root, _, names in os.walk(destdir) for n in names
             if n.endswith('.service')]
    return units


def test_meson_install_installs_both_units_and_the_man_page(tmp_path):
    _install(str(tmp_path))
    names = {os.path.relpath(os.path.join(r, n), tmp_path)
             for r, _, ns in os.walk(tmp_path) for n in ns}
    assert any(n.endswith('lib/systemd/system/lockfs.service') for n in names), names
    assert any(n.endswith('lib/systemd/system/lockfs@.service') for n in names), names
    assert any(n.endswith('sbin/lockfs-mountpoint') for n in names), names
    assert any(n.endswith('share/man/man8/lockfs.8') for n in names), names


def test_installed_units_pass_systemd_analyze_verify(tmp_path):
    if not shutil.which('systemd-analyze'):
        pytest.skip('systemd-analyze is not installed (Debian package systemd)')
    units = _install(str(tmp_path))
    unit = [u for u in units if u.endswith('/lockfs.service')][0]
    prefix = unit[len(str(tmp_path)):].split('/lib/systemd/system/')[0]
    if prefix in ('', '/', '/usr'):
        pytest.skip(f'prefix {prefix!r}: cannot shadow it with the install in a namespace')
    # Verify the installed files where they would be, without installing:
    # the destdir's PREFIX is bound over PREFIX in a private mount namespace.
    man = '--man=yes' if shutil.which('man') else '--man=no'
    r = subprocess.run(
        ['unshare', '--mount', 'sh', '-ec',
         'mount --bind "$1$2" "$2"; shift 2; exec systemd-analyze verify "$@"', 'sh',
         str(tmp_path), prefix, man,
         f'{prefix}/lib/systemd/system/lockfs.service',
         f'{prefix}/lib/systemd/system/lockfs@ci.service'],
        capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == '', r.stderr
    # a negative control: the same check does catch a broken unit
    with open(unit) as f:
        text = f.read()
    with open(unit, 'w') as f:
        f.write(text.replace('Type=notify', 'Type=notifyy'))
    r = subprocess.run(
        ['unshare', '--mount', 'sh', '-ec',
         'mount --bind "$1$2" "$2"; exec systemd-analyze verify "$3"', 'sh',
         str(tmp_path), prefix, f'{prefix}/lib/systemd/system/lockfs.service'],
        capture_output=True, text=True, timeout=60)
    assert 'service type' in r.stderr, r.stderr


# --------------------------------------------------------------------------
# readiness

class Daemon:
    """lockfs started by the test with a NOTIFY_SOCKET of the test's own."""

    def __init__(self, work, args=('-f',), env=None):
        self.work = work
        self.mnt = os.path.join(work, 'mnt')
        self.dir = os.path.join(work, 'dir')
        self.notify = DgramSocket(os.path.join(work, 'notify'))
        self.stderr_path = os.path.join(work, 'stderr')
        e = dict(os.environ, NOTIFY_SOCKET=self.notify.path)
        e.update(env or {})
        with open(self.stderr_path, 'wb') as err:
            self.proc = subprocess.Popen([LOCKFS_BIN, *args, '-o', f'backing={self.dir}',
                                          self.mnt], env=e, stdin=subprocess.DEVNULL,
                                         stdout=err, stderr=err)

    def stderr(self):
        with open(self.stderr_path) as f:
            return f.read()

    def stop(self):
        if mount_entry(self.mnt) is not None:
            fusermount_u(self.mnt)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.notify.close()
        bad = stderr_problems(self.stderr())
        assert not bad, 'daemon stderr reports errors:\n' + '\n'.join(bad[:20])


@pytest.fixture
def daemon(work):
    started = []

    def start(*a, **kw):
        d = Daemon(work, *a, **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def test_ready_is_sent_only_once_the_mount_serves(daemon):
    d = daemon()
    msg, _ = d.notify.recv_until(lambda m: 'READY=1' in m.split('\n'), 10, 'READY=1')
    # at the moment READY=1 arrives, the mount is there and answers
    assert is_lockfs_mounted(d.mnt), 'READY=1 came before the mount'
    os.mkdir(os.path.join(d.mnt, 'x'))
    os.rmdir(os.path.join(d.mnt, 'x'))
    fields = dict(l.split('=', 1) for l in msg.split('\n'))
    assert fields['MAINPID'] == str(d.proc.pid)
    assert d.mnt in fields['STATUS'] and d.dir in fields['STATUS']
    # exactly once
    assert not [m for m in d.notify.drain(0.3) if 'READY=1' in m]


def test_ready_names_the_detached_daemon_as_main_pid(daemon):
    d = daemon(args=())
    msg, _ = d.notify.recv_until(lambda m: 'READY=1' in m.split('\n'), 10, 'READY=1')
    assert is_lockfs_mounted(d.mnt)
    assert d.proc.wait(10) == 0, 'the starting process returns once the mount is ready'
    fields = dict(l.split('=', 1) for l in msg.split('\n'))
    pid = daemon_pid(d.dir)
    assert pid != d.proc.pid
    assert fields['MAINPID'] == str(pid), 'READY=1 must come from the detached daemon'
    fusermount_u(d.mnt)
    d.notify.recv_until(lambda m: 'STOPPING=1' in m, 10, 'STOPPING=1')


def test_stopping_is_sent_on_unmount_and_the_exit_is_clean(daemon):
    d = daemon()
    d.notify.recv_until(lambda m: 'READY=1' in m.split('\n'), 10, 'READY=1')
    fusermount_u(d.mnt)
    d.notify.recv_until(lambda m: 'STOPPING=1' in m.split('\n'), 10, 'STOPPING=1')
    assert d.proc.wait(10) == 0


def test_stopping_is_sent_on_sigterm(daemon):
    d = daemon()
    d.notify.recv_until(lambda m: 'READY=1' in m.split('\n'), 10, 'READY=1')
    d.proc.send_signal(signal.SIGTERM)
    d.notify.recv_until(lambda m: 'STOPPING=1' in m.split('\n'), 10, 'STOPPING=1')
    assert d.proc.wait(10) == 0
    wait_until(lambda: mount_entry(d.mnt) is None, 5, what='the unmount')


def test_a_refused_start_sends_no_ready(daemon, work):
    os.chmod(os.path.join(work, 'dir'), 0o777)
    d = daemon()
    assert d.proc.wait(10) == 1
    assert 'writable by all users' in d.stderr()
    assert not [m for m in d.notify.drain(0.2) if 'READY=1' in m]


# --------------------------------------------------------------------------
# where messages go

def private_dev_with_log(work, sock):
    """Shell for a private mount namespace whose /dev holds only fuse, null
    and log, the last being the test's own syslog socket SOCK."""
    dev = os.path.join(work, 'dev')
    os.makedirs(dev, exist_ok=True)
    return (f'for n in fuse null; do : > {dev}/$n; mount --bind /dev/$n {dev}/$n; done\n'
            f': > {dev}/log; mount --bind {sock} {dev}/log\n'
            f'mount --rbind {dev} /dev\n')


@pytest.fixture
def syslog_ns(work):
    """(agent in a mount namespace whose /dev/log is ours, the socket)."""
    sock = DgramSocket(os.path.join(work, 'log.sock'))
    agent = NsAgent(['unshare', '--mount'], setup=private_dev_with_log(work, sock.path))
    yield agent, sock
    mnt = os.path.join(work, 'mnt')
    agent.sh(f'grep -q " {mnt} " /proc/self/mountinfo && umount -l {mnt} || true')
    agent.close()
    sock.close()


def test_detached_daemon_messages_go_to_syslog(work, syslog_ns):
    agent, sock = syslog_ns
    mnt, backing = os.path.join(work, 'mnt'), os.path.join(work, 'dir')
    r = agent.run([LOCKFS_BIN, '-o', f'backing={backing}', mnt])
    assert r['rc'] == 0 and daemon_stderr(r['err']) == '', r
    pid = daemon_pid(backing)
    # the daemon's fprintf(stderr) after detaching: one syslog line
    msg, _ = sock.recv_until(lambda m: 'serving' in m, 10, 'the serving notice')
    facility, severity, ident, mpid, text = parse_syslog(msg)
    assert (facility, severity, ident, mpid) == (LOG_DAEMON, LOG_NOTICE, 'lockfs', pid)
    assert text == f'notice: serving {mnt} (backing dir {backing})'
    r = agent.run(['umount', mnt])
    assert r['rc'] == 0, r
    assert agent.wait(pid, 10) == 0, 'umount must stop the daemon with exit status 0'


def test_errors_before_detaching_stay_on_the_terminal(work, syslog_ns):
    agent, sock = syslog_ns
    r = agent.run([LOCKFS_BIN, '-o', f'backing={work}/dir,lease=0', f'{work}/mnt'])
    assert r['rc'] == 1
    assert r['err'] == 'lockfs: -o lease=0: want a whole number of seconds > 0\n'
    assert sock.drain(0.2) == []


def test_foreground_warnings_stay_on_stderr(work, syslog_ns):
    agent, sock = syslog_ns
    mnt, backing = os.path.join(work, 'mnt'), os.path.join(work, 'dir')
    err = os.path.join(work, 'fg.stderr')
    # a pid namespace without its own /proc: the daemon warns at start
    pid = agent.spawn(['unshare', '--pid', '--fork', LOCKFS_BIN, '-f', '-o',
                       f'backing={backing}', mnt], stderr=err)
    wait_until(lambda: 'warning: /proc is not of this pid namespace' in open(err).read(),
               10, what='the warning on stderr')
    wait_until(lambda: ' fuse.lockfs ' in agent.run(['cat', '/proc/self/mountinfo'])['out'],
               10, what='the mount')
    # (the mount shows while the daemon may still be busy starting: a busy
    # umount on a loaded machine is retried, within the bound)
    wait_until(lambda: agent.run(['umount', mnt])['rc'] == 0, 10, what='umount to succeed')
    assert agent.wait(pid, 10) == 0
    assert sock.drain(0.2) == [], 'with -f nothing goes to syslog'


def test_journal_stderr_lines_carry_their_priority(work):
    err = os.path.join(work, 'journal')
    with open(err, 'wb') as f:
        st = os.fstat(f.fileno())
        env = dict(os.environ, JOURNAL_STREAM=f'{st.st_dev}:{st.st_ino}')
        r = subprocess.run([LOCKFS_BIN, '-f', '-o', f'backing={work}/dir,lease=0',
                            f'{work}/mnt'], stdout=f, stderr=f, env=env, timeout=10)
    assert r.returncode == 1
    assert open(err).read() == '<3>lockfs: -o lease=0: want a whole number of seconds > 0\n'
    # a warning
    with open(err, 'wb') as f:
        st = os.fstat(f.fileno())
        env = dict(os.environ, JOURNAL_STREAM=f'{st.st_dev}:{st.st_ino}')
        r = subprocess.run(['unshare', '--pid', '--fork', LOCKFS_BIN, '-f', '-o',
                            f'backing={work}/none', f'{work}/mnt'],
                           stdout=f, stderr=f, env=env, timeout=10)
    lines = open(err).read().splitlines()
    assert lines[0].startswith('<4>lockfs: warning: /proc is not of this pid namespace')
    assert lines[1:] == [f'<3>lockfs: backing dir {work}/none: No such file or directory']


def test_stderr_that_is_not_the_journal_gets_no_prefix(work):
    err = os.path.join(work, 'plain')
    with open(err, 'wb') as f:
        env = dict(os.environ, JOURNAL_STREAM='1:2')
        r = subprocess.run([LOCKFS_BIN, '-f', '-o', f'backing={work}/dir,lease=0',
                            f'{work}/mnt'], stdout=f, stderr=f, env=env, timeout=10)
    assert r.returncode == 1
    assert open(err).read() == 'lockfs: -o lease=0: want a whole number of seconds > 0\n'


# --------------------------------------------------------------------------
# the man page

MAN_PAGE = os.path.join(SOURCE_ROOT, 'docs', 'lockfs.8')


def test_man_page_documents_every_option_of_help():
    r = subprocess.run([LOCKFS_BIN, '--help'], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0
    options = set(re.findall(r'-o ([a-z_]+)', r.stdout)) - {'debug'}
    assert {'backing', 'helpers', 'allow_other', 'auto_unmount'} <= options
    with open(MAN_PAGE) as f:
        page = f.read().replace('\\-', '-')
    # each as an entry: .TP then .B NAME or .BI NAME= ARG
    entries = set(re.findall(r'^\.TP\n\.BI? ([a-z_]+)', page, re.M))
    assert options - entries == set(), 'lockfs --help options missing from lockfs(8)'


def test_man_page_renders_without_warnings():
    if not shutil.which('groff'):
        pytest.skip('groff is not installed (Debian package groff-base)')
    r = subprocess.run(['groff', '-man', '-Tutf8', '-ww', '-z', MAN_PAGE],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == '', r.stderr
