"""Point 4: rmdir releases, only for the holder's process tree."""

import errno
import json
import os
import subprocess

import pytest

from lockfs_helpers import log_for, proc_comm, read_owner


def _held(m, name):
    return os.path.isdir(m.lockdir(name)) and os.path.isdir(m.path(name))


def test_rmdir_by_holder_releases(mnt):
    os.mkdir(mnt.path('x'))
    assert _held(mnt, 'x')
    os.rmdir(mnt.path('x'))
    assert not os.path.exists(mnt.lockdir('x'))
    assert not os.path.exists(mnt.path('x'))
    assert 'x' not in os.listdir(mnt.mnt)


def test_rmdir_by_unrelated_process_is_eperm(mnt, procs):
    holder, stranger = procs.agent(), procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    assert stranger.rmdir(mnt.path('x')) == errno.EPERM
    assert _held(mnt, 'x')
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == holder.pid
    assert holder.rmdir(mnt.path('x')) == 0  # control: the holder still can


def test_rmdir_by_holders_parent_is_eperm(mnt, procs):
    """The test process is the holder's parent: ancestors may not release."""
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    with pytest.raises(OSError) as ei:
        os.rmdir(mnt.path('x'))
    assert ei.value.errno == errno.EPERM
    assert _held(mnt, 'x')
    assert holder.rmdir(mnt.path('x')) == 0


@pytest.mark.parametrize('holder_is_root', [True, False],
                         ids=['root-holder-by-another-uid', 'non-root-holder-by-root'])
def test_rmdir_by_another_uid_is_eperm(mnt_ao, users, procs, holder_is_root):
    """Either way round: root is not special, it is not the holder."""
    holder = procs.agent(user=None if holder_is_root else users[0])
    other = procs.agent(user=users[0] if holder_is_root else None)
    assert holder.mkdir(mnt_ao.path('x')) == 0
    assert other.rmdir(mnt_ao.path('x')) == errno.EPERM
    assert _held(mnt_ao, 'x')
    assert holder.rmdir(mnt_ao.path('x')) == 0


def test_rmdir_by_holders_forked_child_releases(mnt):
    os.mkdir(mnt.path('x'))
    pid = os.fork()
    if pid == 0:
        try:
            os.rmdir(mnt.path('x'))
            os._exit(0)
        except OSError as e:
            os._exit(e.errno or 99)
        except BaseException:
            os._exit(98)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, \
        f'child rmdir failed with errno {os.waitstatus_to_exitcode(status)}'
    assert not os.path.exists(mnt.lockdir('x'))


def test_rmdir_by_holders_grandchild_via_rmdir1_releases(mnt):
    """python (holder) -> sh -> rmdir(1): a descendant two levels down."""
    os.mkdir(mnt.path('x'))
    r = subprocess.run(['/bin/sh', '-c', 'rmdir "$1"; echo done', 'sh', mnt.path('x')],
                       capture_output=True)
    assert r.returncode == 0 and b'done' in r.stdout, r.stderr
    assert not os.path.exists(mnt.lockdir('x')), r.stderr


def test_shell_mkdir_and_rmdir_works(mnt):
    r = subprocess.run(['/bin/sh', '-c', 'mkdir "$1" && rmdir "$1"', 'sh', mnt.path('x')],
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(mnt.lockdir('x'))
    assert not os.path.exists(mnt.path('x'))


def test_bash_mkdir_and_exec_rmdir_works(mnt):
    """bash execs the last command in place: rmdir runs in the holder's own process."""
    r = subprocess.run(['bash', '-c', 'mkdir "$1" && exec rmdir "$1"', 'bash',
                        mnt.path('x')], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(mnt.lockdir('x'))


def test_rmdir_of_not_held_is_enoent(mnt):
    with pytest.raises(FileNotFoundError):
        os.rmdir(mnt.path('never-held'))


def test_rmdir_after_release_is_enoent(mnt):
    os.mkdir(mnt.path('x'))
    os.rmdir(mnt.path('x'))
    with pytest.raises(FileNotFoundError):
        os.rmdir(mnt.path('x'))


def test_denied_rmdir_is_logged(mnt, procs):
    holder, stranger = procs.agent(), procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    assert not [l for l in log_for(mnt.dir, 'x') if l.event == 'denied']  # control
    assert stranger.rmdir(mnt.path('x')) == errno.EPERM
    denied = [l for l in log_for(mnt.dir, 'x') if l.event == 'denied']
    assert len(denied) == 1, log_for(mnt.dir, 'x')
    # WHO is the caller (no LOCKFS_SLUG in its environment)
    assert denied[0].who == f'{proc_comm(stranger.pid)}[{stranger.pid}]'
    assert holder.rmdir(mnt.path('x')) == 0


def test_rmdir_refuses_a_record_rewritten_behind_the_daemons_back(mnt):
    """Release only what you own: a record in DIR whose token is no longer
    the one the daemon issued is kept, the rmdir refused, and the refusal
    logged -- also when the forged record was read (ls, owner) meanwhile."""
    os.mkdir(mnt.path('x'))
    rec = os.path.join(mnt.lockdir('x'), 'owner.json')
    with open(rec) as f:
        r = json.load(f)
    r['token'] = '0' * 32
    with open(rec + '.new', 'w') as f:
        f.write(json.dumps(r) + '\n')
    os.rename(rec + '.new', rec)
    assert read_owner(mnt.mnt, 'x')['token'] == '0' * 32   # read, not adopted
    with pytest.raises(PermissionError):
        os.rmdir(mnt.path('x'))
    assert os.path.isdir(mnt.lockdir('x'))
    assert [l for l in log_for(mnt.dir, 'x')
            if l.event == 'denied' and l.details.get('reason') == 'token-mismatch']


def test_rmdir_by_holders_child_running_as_another_uid_is_eperm(mnt_ao, users):
    """The holder's descendants may release -- but not one that runs as
    another (non-root) user: it does not act for the holder."""
    os.mkdir(mnt_ao.path('x'))          # this test process holds x
    u = users[0]
    r = subprocess.run(['setpriv', '--reuid=%d' % u.uid, '--regid=%d' % u.gid,
                        '--clear-groups', 'rmdir', mnt_ao.path('x')], stderr=subprocess.PIPE)
    assert r.returncode != 0 and b'Operation not permitted' in r.stderr, r.stderr
    assert _held(mnt_ao, 'x')
    # negative control: the same child as root (the holder's uid) may
    r = subprocess.run(['setpriv', '--reuid=0', '--regid=0', '--clear-groups', 'rmdir',
                        mnt_ao.path('x')], stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    assert not _held(mnt_ao, 'x')
