"""Point 3: who holds the lock."""

import json
import os
import shutil
import subprocess
import threading

import pytest

from lockfs_helpers import PYTHON, log_for, proc_start_time, read_owner, wait_log


def test_shell_script_mkdir_holder_is_the_shell(mnt):
    # mkdir is not the script's last command, so the shell forks it
    p = subprocess.Popen(['/bin/sh', '-c', 'mkdir "$1" || exit 9; cat "$1/owner"; rmdir "$1"',
                          'sh', mnt.path('x')], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    owner = json.loads(out)
    assert owner['holder']['pid'] == p.pid, 'holder is not the shell (mkdir(1) not skipped?)'
    assert owner['holder']['comm'] != 'mkdir'


def test_python_os_mkdir_holder_is_python(mnt):
    os.mkdir(mnt.path('x'))
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == os.getpid()
    os.rmdir(mnt.path('x'))


def test_python_subprocess_mkdir_holder_is_python(mnt):
    r = subprocess.run(['mkdir', mnt.path('x')], capture_output=True)
    assert r.returncode == 0, r.stderr
    owner = read_owner(mnt.mnt, 'x')
    assert owner['holder']['pid'] == os.getpid()
    assert owner['holder']['comm'] != 'mkdir'
    os.rmdir(mnt.path('x'))


def test_helper_chain_timeout_mkdir_holder_is_python(mnt):
    """Two helper processes in a row (timeout forks mkdir) are both skipped."""
    r = subprocess.run(['timeout', '20', 'mkdir', mnt.path('x')], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == os.getpid()
    os.rmdir(mnt.path('x'))


def test_non_helper_child_is_the_holder(mnt):
    """Negative control for helper skipping: a python child is itself the holder."""
    p = subprocess.Popen([PYTHON, '-c', 'import os,sys; os.mkdir(sys.argv[1]); '
                          'print(open(sys.argv[1] + "/owner").read()); os.rmdir(sys.argv[1])',
                          mnt.path('x')], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert json.loads(out)['holder']['pid'] == p.pid


def test_holder_start_time_is_proc_stat_field_22(mnt):
    os.mkdir(mnt.path('x'))
    h = read_owner(mnt.mnt, 'x')['holder']
    assert h['start_time'] == proc_start_time(os.getpid())
    os.rmdir(mnt.path('x'))


def test_thread_mkdir_holder_is_the_process_not_the_thread(mnt):
    seen = {}

    def worker():
        seen['tid'] = threading.get_native_id()
        try:
            os.mkdir(mnt.path('x'))
        except OSError as e:
            seen['err'] = e

    # keep a few other threads alive so the process is really multi-threaded
    stop = threading.Event()
    idle = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in idle:
        t.start()
    try:
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    finally:
        stop.set()
        for i in idle:
            i.join()
    assert 'err' not in seen, seen
    assert seen['tid'] != os.getpid()  # the premise: the caller was not the main thread
    h = read_owner(mnt.mnt, 'x')['holder']
    assert h['pid'] == os.getpid()
    assert h['start_time'] == proc_start_time(os.getpid())
    os.rmdir(mnt.path('x'))


def test_non_root_holder_uid_and_user(mnt_ao, users, procs):
    u = users[0]
    a = procs.agent(user=u)
    assert a.mkdir(mnt_ao.path('x')) == 0
    h = read_owner(mnt_ao.mnt, 'x')['holder']
    assert h['pid'] == a.pid
    assert h['uid'] == u.uid
    assert h['gid'] == u.gid
    assert h['user'] == u.name
    assert a.rmdir(mnt_ao.path('x')) == 0


def test_root_holder_uid_and_user(mnt):
    """Negative control for the non-root case."""
    os.mkdir(mnt.path('x'))
    h = read_owner(mnt.mnt, 'x')['holder']
    assert (h['uid'], h['gid'], h['user']) == (0, 0, 'root')
    os.rmdir(mnt.path('x'))


def test_helpers_option_replaces_the_default_list(lockfs_factory):
    """With -o helpers=rmdir, mkdir(1) is no longer skipped: it is the holder."""
    m = lockfs_factory(options=['helpers=rmdir'])
    p = subprocess.Popen(['mkdir', m.path('x')], stderr=subprocess.PIPE)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    # mkdir(1) held it, so its exit released it: the log names it as holder.
    acq = wait_log(m.dir, 'x', 'acquired')[0]
    assert acq.details['pid'] == str(p.pid) and p.pid != os.getpid()
    assert acq.who == 'mkdir[%d]' % p.pid
    rec = wait_log(m.dir, 'x', 'recovered')[0]
    assert 'exited' in rec.details['evidence']


# P makes itself a child subreaper, forks C which starts a new session and
# forks G; C exits, G (adopted by P, in C's session) waits until it has been
# re-parented, then execs mkdir(1).  Skipping the helper would make P the
# holder: an adoptive parent in another session, which must be refused.
ORPHAN = r'''
import ctypes, os, sys, time
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
me = os.getpid()
c = os.fork()
if c == 0:
    os.setsid()
    g = os.fork()
    if g == 0:
        deadline = time.monotonic() + 10
        while os.getppid() != me:
            if time.monotonic() > deadline:
                os._exit(97)
            time.sleep(0.001)
        os.execvp('mkdir', ['mkdir', sys.argv[1]])
    os._exit(0)
os.waitpid(c, 0)
_, st = os.waitpid(-1, 0)
print(os.waitstatus_to_exitcode(st))
'''


def test_orphan_mkdir_adopted_by_subreaper_is_eacces(mnt):
    r = subprocess.run([PYTHON, '-c', ORPHAN, mnt.path('x')], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == b'1', (r.stdout, r.stderr)  # mkdir(1) failed
    assert b'Permission denied' in r.stderr, r.stderr
    assert not os.path.exists(mnt.lockdir('x'))
    assert 'x' not in os.listdir(mnt.mnt)


def test_caller_in_invisible_pid_namespace_is_eacces(lockfs_factory):
    """The daemon runs in a child pid namespace, so FUSE reports our pid as 0."""
    if subprocess.run(['unshare', '--pid', '--fork', 'true']).returncode != 0:
        pytest.skip('cannot create a pid namespace here')
    m = lockfs_factory(wrapper=['unshare', '--pid', '--fork'])
    with pytest.raises(PermissionError):
        os.mkdir(m.path('x'))
    assert not os.path.exists(m.lockdir('x'))
    assert 'x' not in os.listdir(m.mnt)
    # "refused with EACCES and a log line"
    assert [l.event for l in log_for(m.dir, 'x')] == ['denied']


def test_daemon_under_a_proc_of_another_pid_namespace_sees_no_caller(lockfs_factory):
    """Its /proc is the host's while FUSE reports pids of its own namespace:
    a pid there would name a stranger on the host (pid 2 is kthreadd).  Fail
    closed: said once on stderr, and every caller, even one in the daemon's
    own namespace, gets EACCES."""
    if subprocess.run(['unshare', '--pid', '--fork', 'true']).returncode != 0:
        pytest.skip('cannot create a pid namespace here')
    m = lockfs_factory(wrapper=['unshare', '--pid', '--fork'])
    assert 'not of this pid namespace' in m.stderr()
    with open(f'/proc/{m.pid}/task/{m.pid}/children') as f:
        daemon = int(f.read().split()[0])           # unshare forked it
    r = subprocess.run(['nsenter', '-t', str(daemon), '-p', '--', 'mkdir', m.path('x')],
                       capture_output=True)
    assert r.returncode != 0 and b'Permission denied' in r.stderr, r
    assert not os.path.exists(m.lockdir('x'))
    assert [l.event for l in log_for(m.dir, 'x')] == ['denied']


@pytest.mark.parametrize('how', ['busybox-sh', 'busybox-applet'])
def test_busybox_applets_are_skipped_like_the_programs(mnt, how):
    """"for busybox/toybox the applet name": busybox's own shell runs mkdir in
    a forked child that never execs (only its comm says mkdir), and
    `busybox mkdir` names the applet in argv[1].  Either way the script's
    shell holds the lock."""
    busybox = shutil.which('busybox')
    assert busybox, 'busybox is not installed (tools/deps.sh installs busybox-static)'
    script = 'mkdir "$1" || exit 9; cat "$1/owner"; rmdir "$1" || exit 8'
    if how == 'busybox-sh':
        argv = [busybox, 'sh', '-c', script, 'sh', mnt.path('x')]
    else:
        argv = ['bash', '-c', script.replace('mkdir', 'busybox mkdir'), 'sh', mnt.path('x')]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd='/')
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, (p.returncode, err)
    assert json.loads(out)['holder']['pid'] == p.pid
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']


def test_non_root_shell_script_holder(mnt_ao, users):
    """setpriv'd shell script: the shell (uid 4242) holds, mkdir(1) is skipped."""
    u = users[0]
    p = subprocess.Popen(['setpriv', f'--reuid={u.uid}', f'--regid={u.gid}', '--clear-groups',
                          '/bin/sh', '-c', 'mkdir "$1" || exit 9; cat "$1/owner"; rmdir "$1"',
                          'sh', mnt_ao.path('x')],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd='/')
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    o = json.loads(out)
    assert o['holder']['pid'] == p.pid  # setpriv execs the shell in place
    assert (o['holder']['uid'], o['holder']['gid'], o['holder']['user']) == \
        (u.uid, u.gid, u.name)
    assert 'token' in o  # the holder's own uid sees the token
    assert not os.path.exists(mnt_ao.lockdir('x'))
