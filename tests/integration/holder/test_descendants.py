"""Issue 9 section 2: a holder's children keep its lock.

A process-bound lock whose holder dies is kept while a process the holder
started while it held the lock (or one those started) lives, wherever it
was re-parented; the last one's exit releases it.  The deploy script that
is SIGTERM'd while its deploy.sh runs is the case that broke mutual
exclusion.

Holders here are shell scripts started in a session of their own
(start_new_session), as a CI runner starts a job: so the session scans of
`-o descendants=scan` and of a restart look at the script's processes,
not at pytest's.
"""

import errno
import json
import os
import select
import signal
import subprocess

import pytest

from lockfs_helpers import (LOCKFS_BIN, PYTHON, errno_of, evidence, log_for, needs_process_events,
                            proc_comm,
                            proc_start_time, read_owner, run_expect_refusal, stays_held,
                            wait_free, wait_log, wait_until)

DEADLINE = 5.0   # waiting for something that must happen
WINDOW = 0.5     # watching for something that must not
LOCKCTL = os.path.join(os.environ.get('LOCKFS_BUILD', os.path.dirname(LOCKFS_BIN)),
                       'tools', 'lockctl')


# --------------------------------------------------------------------------
# helpers

def _alive(pid):
    """PID exists and is not a zombie."""
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return data[data.rindex(b')') + 2:data.rindex(b')') + 3] not in (b'Z', b'X')


def _kill(pid, sig=signal.SIGKILL):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class Scripts:
    """Shell scripts run as holders, and the processes they leave behind."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.procs = []
        self.strays = []   # pids of processes our scripts started (not our children)
        self.n = 0

    def path(self, name):
        return str(self.dir / name)

    def start(self, body, *args, **kw):
        """Run BODY with /bin/sh in a session of its own; $1... are ARGS."""
        self.n += 1
        script = self.path(f'holder{self.n}.sh')
        with open(script, 'w') as f:
            f.write(body)
        p = subprocess.Popen(['/bin/sh', script, *[str(a) for a in args]],
                             start_new_session=True, stdin=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def pid_from(self, name):
        """Wait for the pid a script writes into NAME; remember it."""
        p = self.path(name)
        wait_until(lambda: os.path.exists(p) and open(p).read().strip().isdigit(),
                   timeout=DEADLINE, what=f'a pid in {name}')
        pid = int(open(p).read())
        self.strays.append(pid)
        return pid

    def cleanup(self):
        for pid in self.strays:
            _kill(pid)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


@pytest.fixture
def scripts(tmp_path):
    s = Scripts(tmp_path)
    yield s
    s.cleanup()


# A child that says its pid and then runs until it is killed: "deploy.sh".
DEPLOY = 'sh -c \'echo $$ > "$1"; exec sleep 1000\' deploy "$2"'


def _write(path, data):
    """One write(2) of DATA with O_TRUNC: 0 or the errno of open, write or close."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as e:
        return e.errno
    rc = 0
    try:
        os.write(fd, data)
    except OSError as e:
        rc = e.errno
    try:
        os.close(fd)
    except OSError as e:
        rc = rc or e.errno
    return rc


def _stored(m, name):
    """The record in DIR (owner.json)."""
    with open(os.path.join(m.lockdir(name), 'owner.json')) as f:
        return json.load(f)


def _wait_stored_exited(m, name):
    """Wait until DIR's record says holder_exited and the log has its
    holder-exited line: the daemon stores the kept record first and logs
    right after, so a stop in between must not be what a test looks at."""
    wait_until(lambda: _stored(m, name).get('holder_exited'), timeout=DEADLINE,
               what=f'holder_exited in {name}/owner.json')
    wait_log(m.dir, name, 'holder-exited', timeout=DEADLINE)


def _events(m, name):
    return [l.event for l in log_for(m.dir, name)]


class Acquirer:
    """A second deploy: takes NAME by polling mkdir, or by flock(2) on
    M/.flock/NAME; says 'got' when it holds it, and lets go when told."""

    SRC = r'''
import fcntl, os, sys, time
how, path = sys.argv[1], sys.argv[2]
if how == 'mkdir':
    while True:
        try:
            os.mkdir(path)
            break
        except FileExistsError:
            time.sleep(0.002)
else:
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
print('got', flush=True)
sys.stdin.read()
if how == 'mkdir':
    os.rmdir(path)
'''

    def __init__(self, m, how, name):
        path = m.path(name) if how == 'mkdir' else m.path('.flock', name)
        self.proc = subprocess.Popen([PYTHON, '-c', self.SRC, how, path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def got(self, timeout):
        """True once it says it holds the lock (within TIMEOUT)."""
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return bool(r) and self.proc.stdout.readline() == b'got\n'

    def done(self):
        self.proc.stdin.close()
        assert self.proc.wait(10) == 0
        self.proc.stdout.close()


def _sigterm_script_with_deploy_child(m, scripts):
    """The observed case: a deploy script takes the lock, runs deploy.sh in
    the foreground, and is SIGTERM'd.  Returns (script pid, deploy pid)."""
    p = scripts.start('mkdir "$1/deploy" || exit 9\n' + DEPLOY + '\necho finished\n',
                      m.mnt, scripts.path('deploy.pid'))
    child = scripts.pid_from('deploy.pid')
    wait_until(lambda: proc_comm(child) == 'sleep', timeout=DEADLINE, what='deploy.sh to run')
    assert os.path.isdir(m.lockdir('deploy'))
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == -signal.SIGTERM      # the script's shell is dead
    assert _alive(child)                      # deploy.sh runs on
    return p.pid, child


# --------------------------------------------------------------------------
# the observed case

@pytest.mark.parametrize('how', ['mkdir', 'flock'])
def test_sigterm_script_keeps_lock_until_its_deploy_child_ends(mnt, scripts, how):
    holder, child = _sigterm_script_with_deploy_child(mnt, scripts)
    wait_log(mnt.dir, 'deploy', 'holder-exited')
    second = Acquirer(mnt, how, 'deploy')
    try:
        # The second deploy waits while the first deploy.sh runs...
        assert not second.got(WINDOW)
        assert stays_held(mnt, 'deploy', 0.1)
        assert read_owner(mnt.mnt, 'deploy')['holder']['pid'] == holder
        # ... and gets the lock once it has ended.
        _kill(child, signal.SIGTERM)
        assert second.got(DEADLINE), 'the second deploy never got the lock'
        assert not _alive(child)
        assert read_owner(mnt.mnt, 'deploy')['holder']['pid'] == second.proc.pid
    finally:
        second.done()
    lines = log_for(mnt.dir, 'deploy')
    assert [l.event for l in lines][:4] == ['acquired', 'holder-exited', 'recovered', 'acquired']
    ex, rec = lines[1], lines[2]
    assert ex.who == rec.who == lines[0].who
    assert ex.details['descendants'] == '1'
    assert ex.details['evidence'] == 'exited'
    assert ex.details['pid'] == str(holder)
    assert evidence(rec) == {'exited', 'descendants-exited'}, rec.raw


def _ppid(pid):
    with open(f'/proc/{pid}/stat') as f:
        return int(f.read().rsplit(') ', 1)[1].split()[1])


def test_kill9_of_the_holder_keeps_lock_for_an_orphaned_grandchild(mnt, scripts):
    """holder -> sh -> sleep: the middle shell exits at once, so the
    grandchild is re-parented to init (or to a subreaper above the test);
    then the holder is killed."""
    p = scripts.start('mkdir "$1/x" || exit 9\n'
                      'sh -c \'sleep 1000 & echo $! > "$1"; echo $$ > "$2"\' mid "$2" "$3"\n'
                      'exec sleep 1000\n', mnt.mnt, scripts.path('gc.pid'),
                      scripts.path('mid.pid'))
    gc, mid = scripts.pid_from('gc.pid'), scripts.pid_from('mid.pid')
    wait_until(lambda: _ppid(gc) not in (mid, p.pid), timeout=DEADLINE,
               what='the grandchild to be adopted')
    p.kill()
    p.wait(10)
    wait_log(mnt.dir, 'x', 'holder-exited')
    assert stays_held(mnt, 'x', WINDOW)
    assert errno_of(os.mkdir, mnt.path('x')) == errno.EEXIST
    _kill(gc)
    wait_free(mnt, 'x', timeout=DEADLINE)
    rec = wait_log(mnt.dir, 'x', 'recovered')[0]
    assert evidence(rec) == {'exited', 'descendants-exited'}, rec.raw


SUBREAPER = r'''
import ctypes, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(36, 1, 0, 0, 0) == 0   # PR_SET_CHILD_SUBREAPER
subprocess.run(sys.argv[1:])
sys.stdin.read()
'''


def test_kill9_of_the_holder_keeps_lock_for_a_grandchild_adopted_by_a_subreaper(mnt, scripts):
    needs_process_events()
    script = scripts.path('under-reaper.sh')
    with open(script, 'w') as f:
        f.write('mkdir "$1/x" || exit 9\n'
                'sh -c \'sleep 1000 & echo $! > "$1"\' mid "$2"\n'
                'echo $$ > "$3"\n'
                'exec sleep 1000\n')
    reaper = subprocess.Popen([PYTHON, '-c', SUBREAPER, '/bin/sh', script, mnt.mnt,
                               scripts.path('gc.pid'), scripts.path('holder.pid')],
                              stdin=subprocess.PIPE, start_new_session=True)
    try:
        gc = scripts.pid_from('gc.pid')
        holder = scripts.pid_from('holder.pid')
        wait_until(lambda: _ppid(gc) == reaper.pid, timeout=DEADLINE,
                   what='the subreaper to adopt the grandchild')
        _kill(holder)
        wait_log(mnt.dir, 'x', 'holder-exited')
        assert stays_held(mnt, 'x', WINDOW)
        _kill(gc)
        wait_free(mnt, 'x', timeout=DEADLINE)
        assert evidence(wait_log(mnt.dir, 'x', 'recovered')[0]) == {'exited',
                                                                    'descendants-exited'}
    finally:
        reaper.stdin.close()
        reaper.wait(10)


# --------------------------------------------------------------------------
# background daemons, and how to avoid that they keep the lock

@pytest.mark.parametrize('start', ['nohup sleep 1000 >/dev/null 2>&1 &',
                                   'sleep 1000 >/dev/null 2>&1 &'],
                         ids=['nohup', 'plain'])
def test_background_daemon_started_while_holding_keeps_the_lock(mnt, scripts, start):
    p = scripts.start(f'mkdir "$1/x" || exit 9\n{start}\necho $! > "$2"\n',
                      mnt.mnt, scripts.path('daemon.pid'))
    assert p.wait(10) == 0
    daemon = scripts.pid_from('daemon.pid')
    line = wait_log(mnt.dir, 'x', 'holder-exited')[0]
    assert line.details['descendants'] == '1'
    assert stays_held(mnt, 'x', WINDOW)
    _kill(daemon)
    wait_free(mnt, 'x', timeout=DEADLINE)


# The holder waits until its background child leads a session of its own.
SETSID_CHILD = ('setsid sleep 1000 >/dev/null 2>&1 &\necho $! > "$2"\n'
                'while [ "$(cut -d" " -f6 /proc/$!/stat)" != "$!" ]; do :; done\n')


@pytest.mark.parametrize('mode', ['connector', 'scan'])
def test_daemon_started_with_setsid_while_holding_does_not_keep_the_lock(lockfs_factory,
                                                                         scripts, mode):
    m = lockfs_factory(options=(f'descendants={mode}',))
    p = scripts.start('mkdir "$1/x" || exit 9\n' + SETSID_CHILD, m.mnt,
                      scripts.path('daemon.pid'))
    assert p.wait(10) == 0
    daemon = scripts.pid_from('daemon.pid')
    wait_free(m, 'x', timeout=DEADLINE)
    assert _alive(daemon)
    assert _events(m, 'x') == ['acquired', 'recovered']
    assert evidence(log_for(m.dir, 'x')[1]) == {'exited'}


@pytest.mark.parametrize('mode', ['connector', 'scan'])
def test_descendant_that_starts_its_own_session_after_the_holder_exited_releases_it(
        lockfs_factory, scripts, mode):
    m = lockfs_factory(options=(f'descendants={mode}',))
    go = scripts.path('go')
    os.mkfifo(go)
    p = scripts.start('mkdir "$1/x" || exit 9\n'
                      '(read line < "$3"; exec setsid sleep 1000 >/dev/null 2>&1) &\n'
                      'echo $! > "$2"\n', m.mnt, scripts.path('daemon.pid'), go)
    assert p.wait(10) == 0
    daemon = scripts.pid_from('daemon.pid')
    assert wait_log(m.dir, 'x', 'holder-exited')[0].details['descendants'] == '1'
    assert stays_held(m, 'x', WINDOW)
    with open(go, 'w') as f:
        f.write('go\n')
    wait_free(m, 'x', timeout=DEADLINE)
    assert _alive(daemon)
    assert evidence(wait_log(m.dir, 'x', 'recovered')[0]) == {'exited', 'descendants-exited'}


@pytest.mark.parametrize('mode', ['connector', 'scan'])
def test_children_a_descendant_started_before_its_setsid_keep_the_lock(lockfs_factory,
                                                                       scripts, mode):
    """Leaving the session takes only the process that left (and what it
    starts later) out: a child it started before, still in the holder's
    session, keeps the lock."""
    m = lockfs_factory(options=(f'descendants={mode}',))
    p = scripts.start('mkdir "$1/x" || exit 9\n'
                      '(sleep 1000 >/dev/null 2>&1 & echo $! > "$3"; '
                      'exec setsid sleep 1000 >/dev/null 2>&1) &\n'
                      'echo $! > "$2"\n'
                      'while [ "$(cut -d" " -f6 /proc/$!/stat)" != "$!" ]; do :; done\n',
                      m.mnt, scripts.path('daemon.pid'), scripts.path('child.pid'))
    assert p.wait(10) == 0
    daemon = scripts.pid_from('daemon.pid')
    child = scripts.pid_from('child.pid')
    assert wait_log(m.dir, 'x', 'holder-exited')[0].details['descendants'] == '1'
    assert stays_held(m, 'x', WINDOW)
    assert [d['pid'] for d in read_owner(m.mnt, 'x')['descendants']] == [child]
    _kill(child)
    wait_free(m, 'x', timeout=DEADLINE)
    assert _alive(daemon)


def test_daemon_started_before_taking_the_lock_does_not_keep_it(mnt, scripts):
    needs_process_events()
    p = scripts.start('nohup sleep 1000 >/dev/null 2>&1 &\necho $! > "$2"\n'
                      'mkdir "$1/x" || exit 9\n', mnt.mnt, scripts.path('daemon.pid'))
    assert p.wait(10) == 0
    daemon = scripts.pid_from('daemon.pid')
    wait_free(mnt, 'x', timeout=DEADLINE)
    assert _alive(daemon)
    assert _events(mnt, 'x') == ['acquired', 'recovered']
    assert evidence(log_for(mnt.dir, 'x')[1]) == {'exited'}


def test_releasing_before_exit_leaves_the_daemon_without_the_lock(mnt, scripts):
    p = scripts.start('mkdir "$1/x" || exit 9\nnohup sleep 1000 >/dev/null 2>&1 &\n'
                      'echo $! > "$2"\nrmdir "$1/x"\n', mnt.mnt, scripts.path('daemon.pid'))
    assert p.wait(10) == 0
    daemon = scripts.pid_from('daemon.pid')
    assert not os.path.lexists(mnt.lockdir('x'))
    assert _alive(daemon)
    assert _events(mnt, 'x') == ['acquired', 'released']


def test_lockctl_run_holds_the_lock_only_while_its_command_runs(mnt, scripts):
    """lockctl run unlocks when its command ends, while lockctl lives: what
    the command leaves running in the background (with the lock's
    descriptor, which CMD inherits so that a killed lockctl leaves CMD
    protected) does not keep the lock."""
    if not os.access(LOCKCTL, os.X_OK):
        pytest.fail(f'{LOCKCTL} is not built')
    p = scripts.start(f'exec "{LOCKCTL}" --mount "$1" run x -- sh -c '
                      '\'nohup sleep 1000 >/dev/null 2>&1 & echo $! > "$1"\' cmd "$2"\n',
                      mnt.mnt, scripts.path('daemon.pid'))
    assert p.wait(10) == 0
    daemon = scripts.pid_from('daemon.pid')
    assert not os.path.lexists(mnt.lockdir('x'))
    assert _alive(daemon)
    assert 'holder-exited' not in _events(mnt, 'x')


# --------------------------------------------------------------------------
# what is and is not a descendant

def test_children_started_before_the_lock_do_not_keep_it(mnt, scripts):
    """A long-lived shell's earlier background jobs were not started while
    it held the lock."""
    needs_process_events()
    p = scripts.start('sleep 1000 &\necho $! > "$2"\nmkdir "$1/x" || exit 9\n',
                      mnt.mnt, scripts.path('old.pid'))
    assert p.wait(10) == 0
    old = scripts.pid_from('old.pid')
    wait_free(mnt, 'x', timeout=DEADLINE)
    assert _alive(old)
    assert _events(mnt, 'x') == ['acquired', 'recovered']


THREADS = r'''
import os, sys, threading, time
os.mkdir(sys.argv[1])
for _ in range(4):
    threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
print('ready', flush=True)
time.sleep(1000)
'''


def test_threads_of_the_holder_are_not_descendants(mnt):
    p = subprocess.Popen([PYTHON, '-c', THREADS, mnt.path('x')], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b'ready\n'
        p.kill()
        p.wait(10)
        wait_free(mnt, 'x', timeout=DEADLINE)
    finally:
        p.stdout.close()
    assert _events(mnt, 'x') == ['acquired', 'recovered']
    assert evidence(log_for(mnt.dir, 'x')[1]) == {'exited'}


def test_holder_whose_children_all_ended_is_released_at_once(mnt, scripts):
    p = scripts.start('mkdir "$1/x" || exit 9\nsleep 0.01\ntrue\n', mnt.mnt)
    assert p.wait(10) == 0
    wait_free(mnt, 'x', timeout=DEADLINE)
    assert _events(mnt, 'x') == ['acquired', 'recovered']


# --------------------------------------------------------------------------
# while the holder is gone and its descendants live

def test_owner_shows_the_exited_holder_and_its_live_descendants(mnt, scripts):
    needs_process_events()
    p = scripts.start('mkdir "$1/x" || exit 9\n'
                      'sleep 1000 & echo $! > "$2"\nsleep 1001 & echo $! > "$3"\n',
                      mnt.mnt, scripts.path('a.pid'), scripts.path('b.pid'))
    a, b = scripts.pid_from('a.pid'), scripts.pid_from('b.pid')
    holder_start = proc_start_time(p.pid)
    sid = p.pid  # a session of its own (start_new_session)
    assert p.wait(10) == 0
    wait_log(mnt.dir, 'x', 'holder-exited')
    wait_until(lambda: proc_comm(a) == proc_comm(b) == 'sleep', timeout=DEADLINE,
               what='both children to exec sleep')  # comm is read when owner is
    o = read_owner(mnt.mnt, 'x')
    assert o['holder']['pid'] == p.pid and o['holder']['start_time'] == holder_start
    assert o['holder_exited'] is True
    assert o['holder_session'] == sid
    assert o['descendants'] == [
        {'pid': a, 'start_time': proc_start_time(a), 'comm': 'sleep', 'via': 'tree'},
        {'pid': b, 'start_time': proc_start_time(b), 'comm': 'sleep', 'via': 'tree'}]
    assert o['bound'] == 'process' and o['fence'] >= 1
    _kill(a)
    wait_until(lambda: [d['pid'] for d in read_owner(mnt.mnt, 'x')['descendants']] == [b],
               timeout=DEADLINE, what='the list to drop the dead descendant')
    # the store's copy follows (within a second)
    wait_until(lambda: [d['pid'] for d in _stored(mnt, 'x')['descendants']] == [b],
               timeout=DEADLINE, what='owner.json to follow')
    _kill(b)
    wait_free(mnt, 'x', timeout=DEADLINE)


def test_live_holder_has_no_holder_exited_field(mnt):
    os.mkdir(mnt.path('x'))
    o = read_owner(mnt.mnt, 'x')
    assert 'holder_exited' not in o and 'descendants' not in o
    assert o['holder_session'] == os.getsid(0)
    os.rmdir(mnt.path('x'))


RMDIR_ON_CUE = ('sh -c \'echo $$ > "$1"; read cue < "$2"; rmdir "$3/x"; echo $? > "$4"\' '
                'd "$2" "$3" "$1" "$4" &\n')


def test_rmdir_by_an_orphaned_descendant_releases_and_others_get_eperm(mnt, scripts,
                                                                         procs):
    needs_process_events()
    cue, result = scripts.path('cue'), scripts.path('result')
    os.mkfifo(cue)
    p = scripts.start('mkdir "$1/x" || exit 9\n' + RMDIR_ON_CUE,
                      mnt.mnt, scripts.path('d.pid'), cue, result)
    scripts.pid_from('d.pid')
    assert p.wait(10) == 0
    wait_log(mnt.dir, 'x', 'holder-exited')
    # Nobody else: not this test's process, not another one.
    assert errno_of(os.rmdir, mnt.path('x')) == errno.EPERM
    assert procs.agent().rmdir(mnt.path('x')) == errno.EPERM
    assert os.path.isdir(mnt.lockdir('x'))
    with open(cue, 'w') as f:
        f.write('go\n')
    wait_until(lambda: os.path.exists(result) and open(result).read().endswith('\n'),
               timeout=DEADLINE, what='the descendant to rmdir')
    assert open(result).read() == '0\n'
    assert not os.path.lexists(mnt.lockdir('x'))
    # Both refusals are root's: the first is a line at once, the second is
    # counted into the count line that ends the uid's interval (log.md,
    # "Refusals are counted"), which may or may not be out yet.
    assert [l.event for l in log_for(mnt.dir, 'x') if 'count' not in l.details] == \
        ['acquired', 'holder-exited', 'denied', 'released']


def test_descendant_may_write_operation_after_the_holder_exited(mnt, scripts):
    needs_process_events()
    cue = scripts.path('cue')
    os.mkfifo(cue)
    p = scripts.start('mkdir "$1/x" || exit 9\n'
                      'sh -c \'echo $$ > "$2"; read c < "$3"; echo rolling > "$1/x/operation";'
                      ' exec sleep 1000\' d "$1" "$2" "$3" &\n',
                      mnt.mnt, scripts.path('d.pid'), cue)
    d = scripts.pid_from('d.pid')
    assert p.wait(10) == 0
    wait_log(mnt.dir, 'x', 'holder-exited')
    assert _write(mnt.path('x', 'operation'), b'mine') == errno.EPERM
    with open(cue, 'w') as f:
        f.write('go\n')
    wait_until(lambda: read_owner(mnt.mnt, 'x')['operation'] == 'rolling', timeout=DEADLINE,
               what='the descendant to set the operation')
    _kill(d)
    wait_free(mnt, 'x', timeout=DEADLINE)


def test_lease_expiry_while_descendants_hold_is_logged_and_kept(mnt, scripts):
    p = scripts.start('mkdir "$1/x" || exit 9\necho 1 > "$1/x/lease"\n'
                      'sleep 1000 & echo $! > "$2"\n', mnt.mnt, scripts.path('c.pid'))
    child = scripts.pid_from('c.pid')
    assert p.wait(10) == 0
    wait_log(mnt.dir, 'x', 'holder-exited')
    line = wait_log(mnt.dir, 'x', 'expired', timeout=DEADLINE)[0]
    assert line.details['evidence'] == 'descendants-alive', line.raw
    assert line.details['pid'] == str(p.pid)
    assert stays_held(mnt, 'x', WINDOW)
    _kill(child)
    wait_free(mnt, 'x', timeout=DEADLINE)


# --------------------------------------------------------------------------
# daemon restarts

@pytest.mark.parametrize('stop', ['sigkill', 'sigterm'])
def test_restart_while_descendants_hold_keeps_the_lock(lockfs_factory, scripts, stop):
    m = lockfs_factory()
    holder, child = _sigterm_script_with_deploy_child(m, scripts)
    _wait_stored_exited(m, 'deploy')
    if stop == 'sigkill':
        assert m.kill9() == -signal.SIGKILL
    else:
        assert m.signal(signal.SIGTERM) == 0
    m2 = lockfs_factory.restart(m)
    assert stays_held(m2, 'deploy', WINDOW)
    assert errno_of(os.mkdir, m2.path('deploy')) == errno.EEXIST
    o = read_owner(m2.mnt, 'deploy')
    assert o['holder_exited'] is True and o['holder']['pid'] == holder
    assert [d['pid'] for d in o['descendants']] == [child]
    _kill(child)
    wait_free(m2, 'deploy', timeout=DEADLINE)
    rec = wait_log(m2.dir, 'deploy', 'recovered')[0]
    assert evidence(rec) == {'exited', 'descendants-exited'}, rec.raw
    assert _events(m2, 'deploy').count('holder-exited') == 1


def test_descendants_that_ended_while_the_daemon_was_down_release_it(lockfs_factory, scripts):
    m = lockfs_factory()
    holder, child = _sigterm_script_with_deploy_child(m, scripts)
    _wait_stored_exited(m, 'deploy')
    assert m.kill9() == -signal.SIGKILL
    _kill(child)
    wait_until(lambda: not _alive(child), timeout=DEADLINE, what='deploy.sh to end')
    m2 = lockfs_factory.restart(m)
    wait_free(m2, 'deploy', timeout=DEADLINE)
    rec = wait_log(m2.dir, 'deploy', 'recovered')[0]
    assert evidence(rec) == {'exited', 'descendants-exited-while-down'}, rec.raw


def test_child_started_before_a_restart_keeps_the_lock_after_its_holder_dies(lockfs_factory,
                                                                            scripts):
    """Nothing told the new daemon of that fork: it finds the child below
    the live holder when it starts."""
    m = lockfs_factory()
    p = scripts.start('mkdir "$1/x" || exit 9\nsleep 1000 & echo $! > "$2"\nexec sleep 1000\n',
                      m.mnt, scripts.path('c.pid'))
    child = scripts.pid_from('c.pid')
    assert m.kill9() == -signal.SIGKILL
    m2 = lockfs_factory.restart(m)
    p.kill()
    p.wait(10)
    wait_log(m2.dir, 'x', 'holder-exited')
    assert stays_held(m2, 'x', WINDOW)
    assert [d['pid'] for d in read_owner(m2.mnt, 'x')['descendants']] == [child]
    _kill(child)
    wait_free(m2, 'x', timeout=DEADLINE)


# --------------------------------------------------------------------------
# without the connector: -o descendants=scan

def test_scan_mode_keeps_the_lock_for_an_orphan_of_the_holders_session(lockfs_factory,
                                                                        scripts):
    m = lockfs_factory(options=('descendants=scan',))
    holder, child = _sigterm_script_with_deploy_child(m, scripts)
    wait_log(m.dir, 'deploy', 'holder-exited')
    assert stays_held(m, 'deploy', WINDOW)
    o = read_owner(m.mnt, 'deploy')
    assert o['descendants'] == [{'pid': child, 'start_time': proc_start_time(child),
                                 'comm': 'sleep', 'via': 'session'}]
    _kill(child)
    # Nothing tells of its exit: the next look (once a second) does.
    wait_free(m, 'deploy', timeout=DEADLINE)
    assert evidence(wait_log(m.dir, 'deploy', 'recovered')[0]) == {'exited',
                                                                   'descendants-exited'}


def test_scan_mode_releases_a_holder_without_descendants_at_once(lockfs_factory, scripts):
    m = lockfs_factory(options=('descendants=scan',))
    p = scripts.start('mkdir "$1/x" || exit 9\n', m.mnt)
    assert p.wait(10) == 0
    wait_free(m, 'x', timeout=DEADLINE)
    assert _events(m, 'x') == ['acquired', 'recovered']


def test_bad_descendants_option_is_refused(scratch_dir, tmp_path):
    mnt = os.path.join(scratch_dir, 'm')
    os.mkdir(mnt)
    backing = tmp_path / 'b'
    backing.mkdir(mode=0o700)
    rc, err = run_expect_refusal([LOCKFS_BIN, '-f', '-o', f'backing={backing}',
                                  '-o', 'descendants=maybe', mnt], mnt)
    assert rc != 0
    assert 'descendants=maybe' in err and 'connector or scan' in err
