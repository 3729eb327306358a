"""Issue 3 point 4: breaking a lock on purpose (M/NAME/break)."""

import errno
import os
import shutil
import signal
import stat
import subprocess
import tempfile

import pytest

from lockfs_helpers import (PYTHON, errno_of, log_for, log_unescape, read_owner, wait_free,
                            wait_until, who_of)


def _usr1_setup(marker):
    """Agent setup: a SIGUSR1 handler that appends a line to MARKER."""
    return ('import os, signal\n'
            f'_m = os.open({str(marker)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)\n'
            "signal.signal(signal.SIGUSR1, lambda s, f: os.write(_m, b'USR1\\n'))\n")


def _marker(path):
    try:
        with open(path, 'rb') as f:
            return f.read()
    except FileNotFoundError:
        return b''


def _broken_line(m, name):
    ls = [l for l in log_for(m.dir, name) if l.event == 'broken']
    assert len(ls) == 1, log_for(m.dir, name)
    return ls[0]


def test_root_breaks_a_lock_with_a_reason(mnt, procs):
    holder, admin = procs.agent(), procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    fence = read_owner(mnt.mnt, 'x')['fence']
    holder_who = who_of(holder.pid)
    assert admin.write(mnt.path('x', 'break'), b'holder wedged, see INC-42\n') == 0
    # gone at once, through the mount and in DIR
    assert errno_of(os.stat, mnt.path('x')) == errno.ENOENT
    assert not os.path.lexists(mnt.lockdir('x'))
    lines = log_for(mnt.dir, 'x')
    assert [l.event for l in lines] == ['acquired', 'broken']
    b = lines[1]
    assert b.who == holder_who
    assert b.details.get('fence') == str(fence)
    assert log_unescape(b.details['reason']) == b'holder wedged, see INC-42'
    assert b.details.get('by') == who_of(admin.pid)
    # and it is free for anyone
    assert admin.mkdir(mnt.path('x')) == 0
    assert admin.rmdir(mnt.path('x')) == 0


def test_shell_echo_into_break(mnt, procs):
    """The documented usage: echo "reason" > M/NAME/break."""
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    r = subprocess.run(['/bin/sh', '-c', 'echo "stuck deploy" > "$1/break"', 'sh',
                        mnt.path('x')], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(mnt.lockdir('x'))
    assert log_unescape(_broken_line(mnt, 'x').details['reason']) == b'stuck deploy'


def test_break_file_is_0200_owned_by_the_mounting_uid(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    st = os.stat(mnt.path('x', 'break'))
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o200
    assert st.st_uid == os.getuid() == 0
    assert holder.rmdir(mnt.path('x')) == 0


def test_old_holders_rmdir_after_break_is_enoent(mnt, procs):
    holder, admin = procs.agent(), procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    assert admin.write(mnt.path('x', 'break'), b'test\n') == 0
    assert holder.rmdir(mnt.path('x')) == errno.ENOENT
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'broken']


def test_old_holder_never_releases_the_successors_lock(mnt, procs):
    holder, admin, successor = procs.agent(), procs.agent(), procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    assert admin.write(mnt.path('x', 'break'), b'test\n') == 0
    assert successor.mkdir(mnt.path('x')) == 0
    assert holder.rmdir(mnt.path('x')) == errno.EPERM
    assert holder.write(mnt.path('x', 'operation'), b'still mine?') == errno.EPERM
    o = read_owner(mnt.mnt, 'x')
    assert o['holder']['pid'] == successor.pid and o['operation'] is None
    assert successor.rmdir(mnt.path('x')) == 0


@pytest.mark.parametrize('who', ['holder-uid', 'other-uid'])
def test_non_root_cannot_break(mnt_ao, users, procs, who):
    holder = procs.agent(user=users[0])
    assert holder.mkdir(mnt_ao.path('x')) == 0
    breaker = holder if who == 'holder-uid' else procs.agent(user=users[1])
    assert breaker.write(mnt_ao.path('x', 'break'), b'mine now\n') == errno.EACCES
    assert os.path.isdir(mnt_ao.lockdir('x'))
    assert not [l for l in log_for(mnt_ao.dir, 'x') if l.event == 'broken']
    # control: root can
    assert procs.agent().write(mnt_ao.path('x', 'break'), b'root\n') == 0
    assert not os.path.lexists(mnt_ao.lockdir('x'))
    assert holder.rmdir(mnt_ao.path('x')) == errno.ENOENT


@pytest.mark.parametrize('data', [b'\n', b'\xff\xfe bad utf-8\n'], ids=['empty', 'bad-utf8'])
def test_bad_reason_is_einval_and_keeps_the_lock(mnt, procs, data):
    holder, admin = procs.agent(), procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    assert admin.write(mnt.path('x', 'break'), data) == errno.EINVAL
    assert os.path.isdir(mnt.lockdir('x'))
    assert holder.rmdir(mnt.path('x')) == 0


def test_reason_longer_than_1kib_is_refused(mnt, procs):
    holder, admin = procs.agent(), procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    e = admin.write(mnt.path('x', 'break'), b'r' * 1025)
    assert e in (errno.EINVAL, errno.EFBIG), errno.errorcode.get(e)
    assert os.path.isdir(mnt.lockdir('x'))
    assert admin.write(mnt.path('x', 'break'), b'r' * 1024) == 0  # control: 1 KiB is fine
    assert not os.path.lexists(mnt.lockdir('x'))


def test_reason_with_spaces_and_newlines_is_escaped_in_the_log(mnt, procs):
    holder, admin = procs.agent(), procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    assert admin.write(mnt.path('x', 'break'), 'two\nlines caf\u00e9 a=b'.encode()) == 0
    b = _broken_line(mnt, 'x')
    assert ' ' not in b.details['reason'] and '\n' not in b.raw
    assert log_unescape(b.details['reason']) == 'two\nlines caf\u00e9 a=b'.encode()


def test_break_of_slug_lock(mnt, procs):
    holder = procs.agent(env={'LOCKFS_SLUG': 'agent-5'})
    assert holder.mkdir(mnt.path('x')) == 0
    assert procs.agent().write(mnt.path('x', 'break'), b'agent-5 is lost\n') == 0
    assert not os.path.lexists(mnt.lockdir('x'))
    assert _broken_line(mnt, 'x').who == 'agent-5'
    assert holder.rmdir(mnt.path('x')) == errno.ENOENT


def test_break_of_not_held_is_enoent(mnt, procs):
    assert procs.agent().write(mnt.path('nope', 'break'), b'x\n') == errno.ENOENT


@pytest.mark.parametrize('opt', ['USR1', 'SIGUSR1', '10'])
def test_break_signal_is_sent_to_the_holder(lockfs_factory, procs, tmp_path, opt):
    assert int(signal.SIGUSR1) == 10
    m = lockfs_factory(options=[f'break_signal={opt}'])
    marker = tmp_path / 'usr1'
    holder = procs.agent(setup=_usr1_setup(marker))
    assert holder.mkdir(m.path('x')) == 0
    assert _marker(marker) == b''  # control
    assert procs.agent().write(m.path('x', 'break'), b'stop now\n') == 0
    wait_until(lambda: _marker(marker) == b'USR1\n', timeout=2,
               what='the holder to get SIGUSR1')
    assert holder.proc.poll() is None
    assert holder.rmdir(m.path('x')) == errno.ENOENT  # still alive, still answering


def test_no_signal_without_break_signal(mnt, procs, tmp_path):
    marker = tmp_path / 'usr1'
    holder = procs.agent(setup=_usr1_setup(marker))
    assert holder.mkdir(mnt.path('x')) == 0
    # positive control: the handler works
    os.kill(holder.pid, 10)
    wait_until(lambda: _marker(marker) == b'USR1\n', timeout=2, what='the handler to run')
    assert procs.agent().write(mnt.path('x', 'break'), b'quietly\n') == 0
    # a round trip after the break: a signal sent during the break would have
    # interrupted the agent's read and run the handler before it answers
    assert holder.rmdir(mnt.path('x')) == errno.ENOENT
    assert _marker(marker) == b'USR1\n'


# A holder whose lock is slug-bound although it has no slug itself:
# it ran `LOCKFS_SLUG=S mkdir M/x` (mkdir(1) is skipped, so this python
# process is the holder; the slug came from mkdir's environment).
SLUG_VIA_CHILD = r'''
import os, signal, subprocess, sys
path, marker, slug = sys.argv[1], sys.argv[2], sys.argv[3]
m = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
signal.signal(signal.SIGUSR1, lambda s, f: os.write(m, b'USR1\n'))
env = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
env['LOCKFS_SLUG'] = slug
r = subprocess.run(['mkdir', path], env=env)
print(r.returncode, flush=True)
sys.stdin.readline()
'''


@pytest.mark.slow
def test_break_signal_on_recovery_of_a_lease_bound_lock(lockfs_factory, tmp_path):
    m = lockfs_factory(options=['lease=1', 'break_signal=USR1'])
    marker = tmp_path / 'usr1'
    env = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
    p = subprocess.Popen([PYTHON, '-c', SLUG_VIA_CHILD, m.path('x'), str(marker), 'S'],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout.readline() == b'0\n'
        o = read_owner(m.mnt, 'x')
        assert (o['bound'], o['holder']['pid']) == ('slug', p.pid), o
        wait_free(m, 'x', timeout=8)
        wait_until(lambda: _marker(marker) == b'USR1\n', timeout=2,
                   what='the holder to get SIGUSR1 on recovery')
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


@pytest.fixture
def user_dirs(users):
    """(backing, mountpoint) owned by users[0], for a daemon that user runs.
    Request it before lockfs_factory so that it is removed after the unmount."""
    u = users[0]
    made = []
    for prefix, mode in (('lockfs-ub-', 0o700), ('lockfs-um-', 0o755)):
        d = tempfile.mkdtemp(prefix=prefix)
        os.chown(d, u.uid, u.gid)
        os.chmod(d, mode)
        made.append(d)
    yield made
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def test_mounting_user_may_break(user_dirs, lockfs_factory, users, procs):
    """Not only root: the user who mounted may break (the break file is theirs)."""
    if stat.S_IMODE(os.stat('/dev/fuse').st_mode) & 0o006 != 0o006:
        pytest.skip('/dev/fuse is not usable by other users here (mode '
                    f'{stat.S_IMODE(os.stat("/dev/fuse").st_mode):04o}): no non-root mounts')
    u = users[0]
    backing, mp = user_dirs
    m = lockfs_factory(backing=backing, mountpoint=mp,
                       wrapper=['setpriv', f'--reuid={u.uid}', f'--regid={u.gid}',
                                '--clear-groups'])
    holder, admin = procs.agent(user=u), procs.agent(user=u)
    assert holder.mkdir(m.path('x')) == 0
    st = admin.stat(m.path('x', 'break'))
    assert st['uid'] == u.uid and stat.S_IMODE(st['mode']) == 0o200
    assert admin.write(m.path('x', 'break'), b'by the mounting user\n') == 0
    assert not os.path.lexists(m.lockdir('x'))
    b = _broken_line(m, 'x')
    assert b.details.get('by') == who_of(admin.pid)
    assert holder.rmdir(m.path('x')) == errno.ENOENT
