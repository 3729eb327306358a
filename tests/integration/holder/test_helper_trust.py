"""Issue 8 §3: helpers cannot be faked, and a uid boundary is never crossed.

"A process is skipped as a helper only when its executable is a genuine
system copy of that helper ... and never when its uid differs from the
process it would be skipped to unless it is a genuine set-uid helper on the
list (sudo)."  docs/holder.md, "Genuine helpers" and "The uid boundary".

Every scenario runs a root python process P (the would-be holder: a root
shell) that starts a child through `setpriv --reuid=4242`, which execs the
child in place: the child's parent is P, a process of another uid.
"""

import errno
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from lockfs_helpers import BUILD, PYTHON, log_for, read_owner, wait_free, wait_log

RUN_TIMEOUT = 30


@pytest.fixture
def user_bin(users):
    """A directory of uid 4242's own (in a root-owned, world-traversable
    parent): user_bin.put(NAME, SOURCE) copies SOURCE there under NAME,
    owned by 4242, and returns its path."""
    base = tempfile.mkdtemp(prefix='lockfs-it-ubin-')
    os.chmod(base, 0o755)
    d = os.path.join(base, 'bin')
    os.mkdir(d, 0o755)
    os.chown(d, users[0].uid, users[0].gid)

    class UserBin:
        path = d

        @staticmethod
        def put(name, source):
            p = os.path.join(d, name)
            shutil.copy(os.path.realpath(source), p)
            os.chown(p, users[0].uid, users[0].gid)
            os.chmod(p, 0o755)
            return p
    yield UserBin
    shutil.rmtree(base, ignore_errors=True)


def _as_user(u, argv):
    return ['setpriv', f'--reuid={u.uid}', f'--regid={u.gid}', '--clear-groups'] + list(argv)


# The root "shell": holds an fd lock on M/.flock/NAME (when asked), runs
# CHILD (a JSON argv), with LOCKFS_SLUG=SLUG in its environment when SLUG is
# not empty, and prints the child's output and, afterwards, what owner says.
ROOT_HOLDER = r'''
import fcntl, json, os, subprocess, sys
mnt, name, take_fd, child, slug = sys.argv[1], sys.argv[2], sys.argv[3] == '1', \
    json.loads(sys.argv[4]), sys.argv[5]
if take_fd:
    fd = os.open(os.path.join(mnt, '.flock', name), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
env = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
if slug:
    env['LOCKFS_SLUG'] = slug
r = subprocess.run(child, capture_output=True, env=env, cwd='/', timeout=20)
try:
    with open(os.path.join(mnt, name, 'owner')) as f:
        owner = json.load(f)
except OSError as e:
    owner = {'errno': e.errno}
print(json.dumps({'me': os.getpid(), 'rc': r.returncode, 'out': r.stdout.decode(),
                  'err': r.stderr.decode(), 'owner': owner}))
'''

# What the user's program does: bind the lock to its slug, then release it.
STEAL = r'''
import json, os, sys
mnt, name = sys.argv[1], sys.argv[2]
res = {'pid': os.getpid()}
try:
    with open(os.path.join(mnt, name, 'bind'), 'w') as f:
        f.write('slug')
    res['bind'] = 0
except OSError as e:
    res['bind'] = e.errno
try:
    os.rmdir(os.path.join(mnt, name))
    res['rmdir'] = 0
except OSError as e:
    res['rmdir'] = e.errno
print(json.dumps(res))
'''

# Take NAME with mkdir(2), report owner's holder, then release it.
TAKE_AND_RELEASE = r'''
import json, os, sys
mnt, name = sys.argv[1], sys.argv[2]
p = os.path.join(mnt, name)
res = {'pid': os.getpid()}
try:
    os.mkdir(p)
except OSError as e:
    res['mkdir'] = e.errno
else:
    res['mkdir'] = 0
    with open(os.path.join(p, 'owner')) as f:
        h = json.load(f)['holder']
    res['holder'] = {'pid': h['pid'], 'uid': h['uid']}
    try:
        os.rmdir(p)
        res['rmdir'] = 0
    except OSError as e:
        res['rmdir'] = e.errno
print(json.dumps(res))
'''


def _root_holder(m, name, take_fd, child, slug=''):
    r = subprocess.run([PYTHON, '-c', ROOT_HOLDER, m.mnt, name, '1' if take_fd else '0',
                        json.dumps(child), slug], capture_output=True, timeout=RUN_TIMEOUT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_users_copy_named_env_cannot_convert_roots_fd_lock(mnt_ao, users, user_bin):
    """Observed: uid 4242's python, copied to ~/bin/env, was skipped as the
    `env` helper, so it acted as the root shell holding the fd lock: it bound
    the lock to its own slug and released it."""
    fake_env = user_bin.put('env', PYTHON)
    res = _root_holder(mnt_ao, 'x', True,
                       _as_user(users[0], [fake_env, '-c', STEAL, mnt_ao.mnt, 'x']),
                       slug='stolen')
    assert res['rc'] == 0, res['err']
    child = json.loads(res['out'])
    assert (child['bind'], child['rmdir']) == (errno.EPERM, errno.EPERM), child
    # root's lock is untouched: still root's, still bound to its descriptor
    o = res['owner']
    assert (o['bound'], o['holder']['pid'], o['holder']['uid']) == ('fd', res['me'], 0), o
    wait_log(mnt_ao.dir, 'x', 'released')   # the descriptor's close is asynchronous
    events = [l.event for l in log_for(mnt_ao.dir, 'x')]
    assert [e for e in events if e != 'denied'] == ['acquired', 'released'], events


def test_the_same_program_under_its_own_name_gets_eperm_too(mnt_ao, users):
    """Negative control for the test above: /usr/bin/python3 is no helper."""
    res = _root_holder(mnt_ao, 'x', True,
                       _as_user(users[0], [PYTHON, '-c', STEAL, mnt_ao.mnt, 'x']),
                       slug='stolen')
    child = json.loads(res['out'])
    assert (child['bind'], child['rmdir']) == (errno.EPERM, errno.EPERM), child
    assert res['owner']['bound'] == 'fd'


def test_a_users_python_named_mkdir_holds_its_own_lock(mnt_ao, users, user_bin):
    """Observed: `setpriv --reuid=U ~/bin/mkdir ...` (U's python named
    mkdir) made the root shell the holder of U's lock, which U then could not
    release.  Not a genuine mkdir: the program itself holds, as U."""
    fake_mkdir = user_bin.put('mkdir', PYTHON)
    res = _root_holder(mnt_ao, 'y', False,
                       _as_user(users[0], [fake_mkdir, '-c', TAKE_AND_RELEASE, mnt_ao.mnt, 'y']))
    assert res['rc'] == 0, res['err']
    child = json.loads(res['out'])
    assert child['mkdir'] == 0, child
    assert child['holder'] == {'pid': child['pid'], 'uid': users[0].uid}, (child, res['me'])
    assert child['rmdir'] == 0
    assert not os.path.lexists(mnt_ao.lockdir('y'))
    assert [l.event for l in log_for(mnt_ao.dir, 'y')] == ['acquired', 'released']


def test_genuine_mkdir_run_as_another_uid_is_refused(mnt_ao, users):
    """`setpriv --reuid=U mkdir M/z` from a root process: skipping mkdir(1)
    would make root the holder of U's lock (U could not release it), and mkdir
    itself exits at once.  Nobody believable holds it: EACCES, logged."""
    res = _root_holder(mnt_ao, 'z', False, _as_user(users[0], ['mkdir', mnt_ao.path('z')]))
    assert res['rc'] != 0 and 'Permission denied' in res['err'], res
    assert res['owner'] == {'errno': errno.ENOENT}
    assert not os.path.lexists(mnt_ao.lockdir('z'))
    denied = [l for l in log_for(mnt_ao.dir, 'z')]
    assert [(l.event, l.details.get('reason')) for l in denied] == \
        [('denied', 'holder-unknown')], denied


def test_genuine_mkdir_under_a_shell_of_its_own_uid_is_still_skipped(mnt_ao, users):
    """Negative control: the same setpriv, but a shell of uid U runs mkdir(1):
    no boundary between them, the shell holds."""
    res = _root_holder(mnt_ao, 'z', False, _as_user(users[0], [
        '/bin/sh', '-c', 'mkdir "$1" || exit 9; cat "$1/owner"; rmdir "$1"', 'sh',
        mnt_ao.path('z')]))
    assert res['rc'] == 0, res['err']
    h = json.loads(res['out'])['holder']
    assert h['uid'] == users[0].uid and h['comm'] == 'sh' and h['pid'] != res['me']


def test_a_copy_of_coreutils_mkdir_outside_the_system_directories_is_no_helper(
        mnt_ao, users, user_bin):
    """The very same bytes as /usr/bin/mkdir, but a copy in a user's
    directory: it is not what `mkdir` resolves to, so it is not skipped (even
    with no uid boundary): the copy holds the lock and its exit releases it."""
    copy = user_bin.put('mkdir', shutil.which('mkdir'))
    p = subprocess.Popen(_as_user(users[0], ['/bin/sh', '-c', '"$1" "$2"; echo $$', 'sh',
                                             copy, mnt_ao.path('c')]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd='/')
    out, err = p.communicate(timeout=RUN_TIMEOUT)
    assert p.returncode == 0, err
    shell = int(out)
    acq = wait_log(mnt_ao.dir, 'c', 'acquired')[0]
    assert acq.who.startswith('mkdir[') and acq.details['pid'] != str(shell), acq
    assert 'exited' in wait_log(mnt_ao.dir, 'c', 'recovered')[0].details['evidence']
    wait_free(mnt_ao, 'c')


def test_a_copy_of_busybox_is_not_a_genuine_applet(mnt_ao, users, user_bin):
    """busybox applets are judged by their real binary: a user's copy of
    busybox running `mkdir` is not the system's busybox."""
    copy = user_bin.put('busybox', shutil.which('busybox'))
    p = subprocess.Popen(_as_user(users[0], ['/bin/sh', '-c', '"$1" mkdir "$2"; echo $$', 'sh',
                                             copy, mnt_ao.path('b')]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd='/')
    out, err = p.communicate(timeout=RUN_TIMEOUT)
    assert p.returncode == 0, err
    acq = wait_log(mnt_ao.dir, 'b', 'acquired')[0]
    assert acq.details['pid'] != out.decode().strip(), acq     # not the shell
    assert 'exited' in wait_log(mnt_ao.dir, 'b', 'recovered')[0].details['evidence']


def test_a_users_slug_lock_through_genuine_mkdir_across_the_boundary_is_theirs(mnt_ao, users):
    """A slug-bound lock belongs to (uid, slug), not to a process, so the uid
    boundary refuses nothing there: `setpriv --reuid=U env LOCKFS_SLUG=S
    mkdir` still gives U a slug lock that U may release."""
    u = users[0]
    r = subprocess.run(_as_user(u, ['env', 'LOCKFS_SLUG=agent-u', 'mkdir', mnt_ao.path('s')]),
                       capture_output=True, timeout=RUN_TIMEOUT)
    assert r.returncode == 0, r.stderr
    o = read_owner(mnt_ao.mnt, 's')
    assert (o['bound'], o['slug'], o['holder']['uid']) == ('slug', 'agent-u', u.uid)
    r = subprocess.run(_as_user(u, ['env', 'LOCKFS_SLUG=agent-u', 'rmdir', mnt_ao.path('s')]),
                       capture_output=True, timeout=RUN_TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(mnt_ao.lockdir('s'))


def test_lockctl_acquire_as_another_uid_fails_instead_of_binding_to_itself(mnt_ao, users):
    """`setpriv --reuid=U lockctl acquire` run by root: lockctl (uid U) may not be
    skipped to the root process, so it holds the fd lock itself, and binding
    it to lockctl, which exits at once, would be no lock: EACCES, and lockctl
    says so.  (Until now the lock silently became the root process's.)"""
    lockctl = os.path.join(BUILD, 'tools', 'lockctl')
    r = subprocess.run(_as_user(users[0], [lockctl, '--mount', mnt_ao.mnt, 'acquire', 'l']),
                       capture_output=True, timeout=RUN_TIMEOUT,
                       env={k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'})
    assert r.returncode != 0 and b'Permission denied' in r.stderr, r
    wait_free(mnt_ao, 'l')
    assert 'bound' not in [l.event for l in log_for(mnt_ao.dir, 'l')]


def test_a_copy_of_lockctl_cannot_bind_the_lock_to_itself(mnt_ao, users, user_bin):
    """A lockctl that is not the genuine one is not skipped: it would hold the
    lock itself, and its exit would end it.  `lockctl acquire` must fail
    loudly rather than leave no lock behind."""
    copy = user_bin.put('lockctl', os.path.join(
        BUILD, 'tools', 'lockctl'))
    r = subprocess.run(_as_user(users[0], [copy, '--mount', mnt_ao.mnt, 'acquire', 'k']),
                       capture_output=True, timeout=RUN_TIMEOUT,
                       env={k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'})
    assert r.returncode != 0 and b'Permission denied' in r.stderr, r
    wait_free(mnt_ao, 'k')
    assert 'bound' not in [l.event for l in log_for(mnt_ao.dir, 'k')]
