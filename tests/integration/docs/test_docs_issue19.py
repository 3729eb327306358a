#!/usr/bin/python3
"""Issue 19 section 4: log.md, privacy.md and holder.md say the same thing
about two points, and a real mount does what they say.

- `M/NAME/waiters` never shows a command line, to anyone (not even the
  waiter's own uid or root); only `owner` does, to the holder's uid and root.
- `uid=` in the log is the holder's effective uid: the uid `owner` shows as
  `holder.uid`, that owns the lock directory, and that the holder rule
  compares a releasing caller's uid with.  A process whose real and
  effective uids differ tells the two apart.
"""

import errno
import json
import os
import re
import subprocess

from flock_helpers import fpath, wait_waiters
from lockfs_helpers import PYTHON, log_for, read_owner, wait_log
from service_helpers import SOURCE_ROOT

SECRET = '--password=hunter2'
RUN_TIMEOUT = 30


def _read(rel):
    with open(os.path.join(SOURCE_ROOT, rel)) as f:
        return f.read()


def _sentences(text):
    """TEXT's sentences, each on one line (markdown line breaks undone)."""
    flat = re.sub(r'\s*\n\s*', ' ', text)
    return re.split(r'(?<=[.!?])\s+(?=[A-Z`])', flat)


# ---- waiters: never a command line ----

def _says_waiters_show_a_command_line(doc):
    """Sentences of DOC that name `waiters` and a command line without
    saying it is not shown there."""
    return [s for s in _sentences(_read(doc))
            if '`waiters`' in s and re.search(r'command line|cmdline', s)
            and not re.search(r'\b(never|no|not)\b', s)]


def test_the_docs_say_waiters_never_show_a_command_line():
    privacy = ' '.join(_sentences(_read('docs/privacy.md')))
    assert re.search(r'No\s+command line and no token are shown, to anyone', privacy)
    for doc in ('docs/log.md', 'docs/privacy.md', 'docs/holder.md', 'docs/waiting.md'):
        assert _says_waiters_show_a_command_line(doc) == [], doc


def _as(u, argv):
    return ['setpriv', f'--reuid={u.uid}', f'--regid={u.gid}', '--clear-groups'] + argv


HOLD_SHARED = r'''
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_SH)
'''


def test_waiters_show_no_command_line_to_root_or_to_the_waiters_own_uid(mnt_ao, users, procs):
    """The readers log.md once named (the waiter's uid and root) read no
    command line in `waiters`; `owner` does show the holder's to them."""
    holder = procs.agent(user=users[0], setup=f'# {SECRET}')
    assert holder.mkdir(mnt_ao.path('w')) == 0
    waiter = subprocess.Popen(_as(users[0], [PYTHON, '-c', f'# {SECRET}\n' + HOLD_SHARED,
                                             fpath(mnt_ao, 'w')]), cwd='/')
    try:
        wait_waiters(mnt_ao, 'w', [waiter.pid])
        for reader in (None, users[0]):
            if reader is None:
                with open(mnt_ao.path('w', 'waiters')) as f:
                    waiters = f.read()
                owner = read_owner(mnt_ao.mnt, 'w')
            else:
                waiters = subprocess.run(_as(reader, ['cat', mnt_ao.path('w', 'waiters')]),
                                         capture_output=True, text=True, timeout=RUN_TIMEOUT,
                                         check=True).stdout
                owner = holder.owner(mnt_ao.mnt, 'w')
            entries = [json.loads(line) for line in waiters.splitlines()]
            assert [e['pid'] for e in entries] == [waiter.pid], waiters
            assert 'hunter2' not in waiters and 'cmdline' not in waiters, (reader, waiters)
            # The control: the same reader is shown a command line in owner.
            assert any(SECRET in a for a in owner['holder']['cmdline']), (reader, owner)
    finally:
        waiter.kill()
        waiter.wait(10)
    assert holder.rmdir(mnt_ao.path('w')) == 0


# ---- uid=: the effective uid ----

def test_the_docs_name_the_effective_uid_for_the_log_and_for_owner():
    log = ' '.join(_sentences(_read('docs/log.md')))
    said = re.search(r'\*\*`uid=`\*\*:(.*?)- \*\*`pid=`\*\*', log)
    assert said, 'log.md no longer describes uid='
    assert re.search(r'holder process.s effective uid', said.group(1)), said.group(1)
    assert not re.search(r'(holder|process).s real uid', said.group(1)), said.group(1)
    holder = ' '.join(_sentences(_read('docs/holder.md')))
    assert re.search(r'`holder\.uid` and `holder\.gid` are the holder.s effective uid', holder)
    assert not re.search(r'(holder|process).s real uid', holder)
    record = _read('docs/record.md')
    assert re.search(r'\| `holder\.uid` \| integer \| the holder.s effective uid', record)


# Runs as root: real uid R, effective uid E from here on.  Takes argv[1]
# through the mkdir helper (so the holder, this process, is read from
# /proc), then on each line of stdin: "rmdir-swapped" has a child with the
# uids swapped (real E, effective R) try to rmdir; "rmdir" releases.
SPLIT_UIDS = r'''
import os, subprocess, sys
r, e, g = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.setgroups([])
os.setresgid(g, g, g)
os.setresuid(r, e, e)
subprocess.run(['mkdir', sys.argv[1]], check=True)
print('held', flush=True)
for line in sys.stdin:
    if line.strip() == 'rmdir-swapped':
        pid = os.fork()
        if pid == 0:
            os.setresuid(e, r, r)
            try:
                os.rmdir(sys.argv[1])
                os._exit(0)
            except OSError as x:
                os._exit(x.errno)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    elif line.strip() == 'rmdir':
        os.rmdir(sys.argv[1])
        print('released', flush=True)
'''


def test_log_owner_and_the_rmdir_rule_use_the_holders_effective_uid(mnt_ao, users):
    real, effective = users[1].uid, users[0].uid
    p = subprocess.Popen([PYTHON, '-c', SPLIT_UIDS, mnt_ao.path('u'), str(real),
                          str(effective), str(users[0].gid)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd='/')
    try:
        assert p.stdout.readline() == 'held\n'
        with open(f'/proc/{p.pid}/status') as f:
            uids = next(l for l in f if l.startswith('Uid:')).split()[1:3]
        assert uids == [str(real), str(effective)], 'premise: real and effective uids differ'
        o = read_owner(mnt_ao.mnt, 'u')
        assert o['holder']['pid'] == p.pid, 'premise: the helper was skipped, /proc was read'
        assert o['holder']['uid'] == effective, o['holder']
        assert os.stat(mnt_ao.path('u')).st_uid == effective
        (acquired,) = wait_log(mnt_ao.dir, 'u', 'acquired')
        assert acquired.details['uid'] == str(effective), acquired
        assert acquired.details['pid'] == str(p.pid), acquired
        # A descendant whose real uid is the holder's effective one but
        # whose effective uid is not does not act for the holder.
        p.stdin.write('rmdir-swapped\n')
        p.stdin.flush()
        assert p.stdout.readline() == f'{errno.EPERM}\n'
        (denied,) = wait_log(mnt_ao.dir, 'u', 'denied')
        assert denied.details['uid'] == str(real), denied
        assert denied.details['reason'] == 'not-holder', denied
        p.stdin.write('rmdir\n')
        p.stdin.flush()
        assert p.stdout.readline() == 'released\n'
        (released,) = wait_log(mnt_ao.dir, 'u', 'released')
        assert released.details['uid'] == str(effective), released
        assert [l.event for l in log_for(mnt_ao.dir, 'u')] == ['acquired', 'denied', 'released']
    finally:
        p.stdin.close()
        p.kill()
        p.wait(10)
