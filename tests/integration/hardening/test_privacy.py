"""Issue 8 §6: what one user may learn about another.

"Show `cmdline` only to the holder's uid and root (others see `comm`);
same for ... `waiters`."  docs/privacy.md.  Others read `"cmdline": null`;
`stat` shows each reader the size of what that reader reads.
"""

import fcntl
import json
import os
import subprocess

import pytest

from flock_helpers import fpath, read_waiters, wait_waiters  # noqa: F401
from lockfs_helpers import PYTHON, read_owner

SECRET = '--password=hunter2'
RUN_TIMEOUT = 30

# Read M/NAME/owner (argv[1]) and say whether /proc/PID (argv[2]) is visible.
READER = r'''
import json, os, sys
with open(sys.argv[1], 'rb') as f:
    data = f.read()
print(json.dumps({'owner': data.decode(), 'size': os.stat(sys.argv[1]).st_size,
                  'sees_pid': os.path.exists('/proc/' + sys.argv[2])}))
'''


def _as(u, argv):
    return ['setpriv', f'--reuid={u.uid}', f'--regid={u.gid}', '--clear-groups'] + argv


def _read_as(u, path, pid, hidepid=False):
    """What user U reads at PATH (dict: owner text, stat size, and whether
    /proc/PID is visible to U), under a /proc mounted with hidepid=2 in a
    private mount namespace when HIDEPID."""
    argv = _as(u, [PYTHON, '-c', READER, path, str(pid)])
    if hidepid:
        argv = ['unshare', '--mount', '--propagation', 'private', '/bin/sh', '-c',
                'mount -t proc -o hidepid=2 proc /proc && exec "$@"', 'sh'] + argv
    r = subprocess.run(argv, capture_output=True, timeout=RUN_TIMEOUT, cwd='/')
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_another_user_under_hidepid_does_not_see_the_holders_command_line(
        mnt_ao, users, procs):
    """Observed: under hidepid=2, uid 4343 read uid 4242's --password=hunter2
    from M/NAME/owner."""
    holder = procs.agent(user=users[0], setup=f'# {SECRET}')
    assert holder.mkdir(mnt_ao.path('x')) == 0
    r = _read_as(users[1], mnt_ao.path('x', 'owner'), holder.pid, hidepid=True)
    assert not r['sees_pid'], 'premise: hidepid=2 hides the holder from uid 4343'
    assert SECRET not in r['owner'] and 'hunter2' not in r['owner']
    o = json.loads(r['owner'])
    h = o['holder']
    assert h['cmdline'] is None and h['comm'] == 'python3' and h['pid'] == holder.pid
    assert [x['cmdline'] for x in o['holders']] == [None]
    assert r['size'] == len(r['owner'].encode())
    assert holder.rmdir(mnt_ao.path('x')) == 0


def test_the_holders_own_uid_sees_its_command_line(mnt_ao, users, procs):
    holder = procs.agent(user=users[0], setup=f'# {SECRET}')
    assert holder.mkdir(mnt_ao.path('x')) == 0
    other_of_same_uid = procs.agent(user=users[0])
    o = other_of_same_uid.owner(mnt_ao.mnt, 'x')
    assert any(SECRET in a for a in o['holder']['cmdline']), o['holder']
    assert holder.rmdir(mnt_ao.path('x')) == 0


def test_root_sees_every_command_line(mnt_ao, users, procs):
    holder = procs.agent(user=users[0], setup=f'# {SECRET}')
    assert holder.mkdir(mnt_ao.path('x')) == 0
    o = read_owner(mnt_ao.mnt, 'x')
    assert any(SECRET in a for a in o['holder']['cmdline'])
    assert holder.rmdir(mnt_ao.path('x')) == 0


def test_stat_size_is_what_each_reader_reads(mnt_ao, users, procs):
    """Root (token, cmdline), the holder's uid (token, cmdline) and another
    uid (neither) read three sizes; each one's stat says its own."""
    holder = procs.agent(user=users[0], setup=f'# {SECRET}')
    assert holder.mkdir(mnt_ao.path('x')) == 0
    p = mnt_ao.path('x', 'owner')
    with open(p, 'rb') as f:
        mine = f.read()
    assert os.stat(p).st_size == len(mine)
    theirs = _read_as(users[1], p, holder.pid)
    own = _read_as(users[0], p, holder.pid)
    assert theirs['size'] == len(theirs['owner'].encode()) < len(mine)
    assert own['size'] == len(own['owner'].encode())
    assert 'token' in json.loads(own['owner']) and 'token' not in json.loads(theirs['owner'])
    assert holder.rmdir(mnt_ao.path('x')) == 0


HOLD_SHARED = r'''
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_SH)
print('held', flush=True)
sys.stdin.read()
'''


def test_shared_holders_each_show_their_command_line_to_their_own_uid(mnt_ao, users):
    ps = []
    try:
        for u in users:
            p = subprocess.Popen(_as(u, [PYTHON, '-c', f'# {SECRET}-{u.uid}\n' + HOLD_SHARED,
                                         fpath(mnt_ao, 's')]),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd='/')
            assert p.stdout.readline() == b'held\n'
            ps.append(p)
        for i, u in enumerate(users):
            o = json.loads(_read_as(u, mnt_ao.path('s', 'owner'), ps[i].pid)['owner'])
            shown = {h['uid']: h['cmdline'] for h in o['holders']}
            other = users[1 - i].uid
            assert shown[other] is None, o['holders']
            assert any(f'{SECRET}-{u.uid}' in a for a in shown[u.uid]), o['holders']
        o = read_owner(mnt_ao.mnt, 's')          # root: all of them
        assert all(h['cmdline'] for h in o['holders'])
    finally:
        for p in ps:
            p.stdin.close()
            p.wait(10)


def test_waiters_never_show_a_command_line(mnt_ao, users, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt_ao.path('w')) == 0
    p = subprocess.Popen(_as(users[0], [PYTHON, '-c', f'# {SECRET}\n' + HOLD_SHARED,
                                        fpath(mnt_ao, 'w')]),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd='/')
    try:
        wait_waiters(mnt_ao, 'w', [p.pid])
        for reader in (None, users[0], users[1]):
            if reader is None:
                with open(mnt_ao.path('w', 'waiters')) as f:
                    text = f.read()
            else:
                r = subprocess.run(_as(reader, ['cat', mnt_ao.path('w', 'waiters')]),
                                   capture_output=True, timeout=RUN_TIMEOUT, check=True)
                text = r.stdout.decode()
            assert 'hunter2' not in text and 'cmdline' not in text, text
            assert json.loads(text.splitlines()[0])['comm'] == 'python3'
    finally:
        p.kill()
        p.wait(10)
    assert holder.rmdir(mnt_ao.path('w')) == 0
