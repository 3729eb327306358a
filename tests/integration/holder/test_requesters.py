"""Issue 10 §4: a repeat requester's /proc facts are kept until it execs.

The daemon reads a process that takes lock after lock in full once per
exec (docs/holder.md, "Repeat requesters").  These tests pin that what it
keeps never outlives an exec: the same pid running a new program is read
anew -- its executable (the holder rule), its LOCKFS_SLUG and its command
line.
"""

import json
import os
import subprocess

from lockfs_helpers import PYTHON, read_owner

# A process that takes and releases lock A (so that it is known), then
# execs ARGV in the same pid.  Output: its pid, before the exec.
_THEN_EXEC = r'''
import os, sys
m, argv = sys.argv[1], sys.argv[2:]
for i in range(3):
    os.mkdir(os.path.join(m, 'a'))
    os.rmdir(os.path.join(m, 'a'))
print(os.getpid(), flush=True)
os.execve(argv[0], argv, dict(os.environ, LOCKFS_SLUG=os.environ.get('NEXT_SLUG', '')))
'''

# After the exec: take lock NAME, print the owner record, release it.
_TAKE_AND_SHOW = r'''
import os, sys
m, name = sys.argv[1], sys.argv[2]
os.mkdir(os.path.join(m, name))
with open(os.path.join(m, name, 'owner')) as f:
    print(f.read(), flush=True)
os.rmdir(os.path.join(m, name))
'''


def _env(**kw):
    e = {k: v for k, v in os.environ.items() if k not in ('LOCKFS_SLUG', 'NEXT_SLUG')}
    e.update(kw)
    return e


def test_exec_into_a_helper_makes_the_parent_the_holder(mnt):
    # The same pid held lock A as python; after it execs mkdir(1), a
    # genuine helper, the holder of B is its parent (this test process).
    p = subprocess.run([PYTHON, '-c', _THEN_EXEC, mnt.mnt, '/usr/bin/mkdir', mnt.path('b')],
                       capture_output=True, text=True, timeout=30, env=_env())
    assert p.returncode == 0, p.stderr
    try:
        owner = read_owner(mnt.mnt, 'b')
        assert owner['holder']['pid'] == os.getpid(), \
            f'holder is {owner["holder"]["pid"]} (the exec\'d mkdir {p.stdout.strip()}?)'
    finally:
        os.rmdir(mnt.path('b'))


def test_exec_with_another_slug_binds_to_the_new_slug(mnt):
    p = subprocess.run([PYTHON, '-c', _THEN_EXEC, mnt.mnt, PYTHON, '-c', _TAKE_AND_SHOW,
                        mnt.mnt, 'b'],
                       capture_output=True, text=True, timeout=30,
                       env=_env(LOCKFS_SLUG='before', NEXT_SLUG='after'))
    assert p.returncode == 0, p.stderr
    pid, record = p.stdout.split('\n', 1)
    owner = json.loads(record)
    assert owner['holder']['pid'] == int(pid), 'not the same process after its exec'
    assert owner.get('slug') == 'after'


def test_exec_shows_the_new_command_line(mnt):
    p = subprocess.run([PYTHON, '-c', _THEN_EXEC, mnt.mnt, PYTHON, '-c', _TAKE_AND_SHOW,
                        mnt.mnt, 'b', 'second-program'],
                       capture_output=True, text=True, timeout=30, env=_env())
    assert p.returncode == 0, p.stderr
    pid, record = p.stdout.split('\n', 1)
    owner = json.loads(record)
    assert owner['holder']['pid'] == int(pid)
    # The first program's argv ends the same way: tell them apart by -c.
    assert owner['holder']['cmdline'][1:3] == ['-c', _TAKE_AND_SHOW]
    assert owner['holder']['cmdline'][-1] == 'second-program'


def test_a_repeat_requester_is_still_shown_as_itself(mnt):
    # Lock after lock from one process: every record names it alike.
    seen = []
    for i in range(5):
        os.mkdir(mnt.path('x'))
        try:
            h = read_owner(mnt.mnt, 'x')['holder']
            seen.append((h['pid'], h['start_time'], h['comm'], tuple(h['cmdline'])))
        finally:
            os.rmdir(mnt.path('x'))
    assert seen[0][0] == os.getpid()
    assert len(set(seen)) == 1, seen


# A process that takes and releases lock A (so that it is known), then
# changes what /proc/PID/stat shows of it without an exec -- HOW is
# "rename" (prctl PR_SET_NAME) or "setsid" -- and prints the owner record
# of lock B taken afterwards.
_THEN_CHANGE = r'''
import ctypes, os, sys
m, how = sys.argv[1], sys.argv[2]
for i in range(3):
    os.mkdir(os.path.join(m, 'a'))
    os.rmdir(os.path.join(m, 'a'))
if how == 'rename':
    assert ctypes.CDLL(None, use_errno=True).prctl(15, b'renamed-agent', 0, 0, 0) == 0
else:
    os.setsid()
os.mkdir(os.path.join(m, 'b'))
with open(os.path.join(m, 'b', 'owner')) as f:
    print(f.read(), flush=True)
os.rmdir(os.path.join(m, 'b'))
'''


def _then_change(mnt, how):
    p = subprocess.Popen([PYTHON, '-c', _THEN_CHANGE, mnt.mnt, how], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env())
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    return p.pid, json.loads(out)


def test_a_repeat_requester_that_renames_itself_is_shown_by_its_new_name(mnt):
    pid, owner = _then_change(mnt, 'rename')
    assert owner['holder']['pid'] == pid
    assert owner['holder']['comm'] == 'renamed-agent', owner['holder']


def test_a_repeat_requester_that_starts_a_session_is_shown_in_it(mnt):
    pid, owner = _then_change(mnt, 'setsid')
    assert owner['holder']['pid'] == pid
    assert owner.get('holder_session') == pid, owner
