"""Issue 20 point 7: `lockctl status` tells the truth at a glance.

- With no locks, the header is a whole line (it ends with its newline).
- A process-bound lock whose holder exited while processes it started keep
  it: HOLDER says so and names what keeps it (`sh(exited,kept:sleep[PID])`;
  messages: `sh (exited; kept by sleep[PID])`).
- An fd lock whose opener exited while a child still has the descriptor:
  HOLDER names that child (`python3(gone,fd:sleep[PID])`).
- Inside a pid namespace of its own (a container's), a holder there is
  shown by the pid that namespace gives it, and a holder outside it has
  no pid there: "-", and HOLDER says it is outside.

Issue 22 §5: the same rule in messages (`held by sh[1]`, never a host
pid), a CONTAINER column, and in `--json` each holder's `pid_here` (the
PID column's value, null when the holder is not a process there) beside
the record's own `container`.  The podman cases are in
test_lockctl_status_podman.py.
"""

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lockfs_helpers import PYTHON, read_owner, wait_until  # noqa: E402
from test_lockctl import LOCKCTL, COLUMNS, clean_env, lc, table  # noqa: E402

CONTAINER = COLUMNS.index('CONTAINER')
EX_TEMPFAIL = 75


def row_of(stdout, name):
    _, rows = table(stdout)
    mine = [r for r in rows if r[0] == name]
    assert len(mine) == 1, stdout.decode()
    return mine[0]


def test_the_header_of_an_empty_table_ends_its_line(mnt):
    r = lc(mnt, 'status')
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert out.startswith('NAME ') and out.endswith('OPERATION\n'), repr(out)


def test_a_holder_that_exited_is_named_with_what_keeps_its_lock(mnt, procs):
    # sh takes the lock, starts sleep in the background and exits: the lock
    # stays for sleep (holder.md, "When the holder exits").
    sh = procs.popen(['sh', '-c', f'mkdir {mnt.path("kept")} || exit 1; '
                      'sleep 60 >/dev/null 2>&1 </dev/null & echo $!'],
                     stdout=subprocess.PIPE, text=True)
    sleep_pid = int(sh.stdout.readline())
    procs.adopt(sleep_pid)
    sh.wait(10)
    wait_until(lambda: read_owner(mnt.mnt, 'kept').get('holder_exited') is True,
               what='the lock to be kept for the holder\'s child')
    row = row_of(lc(mnt, 'status').stdout, 'kept')
    assert row[2] == f'sh(exited,kept:sleep[{sleep_pid}])', row
    # The message that quotes the holder says the same.
    r = lc(mnt, 'run', 'kept', '--timeout', '0', '--', 'true')
    assert r.returncode != 0
    assert f'kept by sleep[{sleep_pid}]' in r.stderr.decode(), r.stderr


def test_an_fd_lock_whose_opener_exited_names_who_has_the_descriptor(mnt, procs):
    # A python process opens M/.flock/fdk, takes it, starts sleep with the
    # descriptor and exits: the open file description (in sleep) holds.
    code = (f'import fcntl, os, subprocess, sys\n'
            f'fd = os.open({mnt.path(".flock", "fdk")!r}, os.O_RDWR | os.O_CREAT)\n'
            f'fcntl.flock(fd, fcntl.LOCK_EX)\n'
            f'p = subprocess.Popen(["sleep", "60"], pass_fds=(fd,),\n'
            f'                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n'
            f'print(p.pid, flush=True)\n')
    opener = procs.popen([PYTHON, '-c', code], stdout=subprocess.PIPE, text=True)
    sleep_pid = int(opener.stdout.readline())
    procs.adopt(sleep_pid)
    assert opener.wait(10) == 0
    assert read_owner(mnt.mnt, 'fdk')['bound'] == 'fd'
    row = row_of(lc(mnt, 'status').stdout, 'fdk')
    assert row[2] == f'python3(gone,fd:sleep[{sleep_pid}])', row
    assert row[3] == '-', f'the opener exited: no pid to show, got {row}'


def test_inside_a_pid_namespace_pids_are_its_own(mnt, procs):
    outside = procs.agent()
    assert outside.mkdir(mnt.path('host')) == 0
    # A shell in a pid namespace of its own (pid 1 there is unshare's
    # child) takes `inner` and runs lockctl status there.
    script = (f'mkdir {mnt.path("inner")} && echo "$$" && '
              f'"{LOCKCTL}" --mount {mnt.mnt} status && rmdir {mnt.path("inner")}')
    r = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', 'sh', '-c', script],
                       capture_output=True, env=clean_env(), timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    ns_pid = lines[0]
    status = '\n'.join(lines[1:]).encode()
    inner, host = row_of(status, 'inner'), row_of(status, 'host')
    assert inner[3] == ns_pid, f'want the namespace\'s pid {ns_pid}: {inner}'
    assert host[3] == '-', f'a host pid shown inside the namespace: {host}'
    assert host[2] == 'python3(outside)', host


# A shell first in a pid namespace of its own takes `inner`, then runs the
# lockctl commands given, each after a line "@@" (its $$ comes first).
def _in_pid_namespace(mnt, *commands):
    script = f'mkdir {mnt.path("inner")} || exit 9; echo "$$"; '
    for c in commands:
        script += f'echo @@; "{LOCKCTL}" --mount {mnt.mnt} {c} 2>&1; '
    script += f'rmdir {mnt.path("inner")}'
    r = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', 'sh', '-c', script],
                       capture_output=True, env=clean_env(), timeout=30)
    assert r.returncode == 0, r.stderr
    first, *outs = r.stdout.decode().split('@@\n')
    return first.strip(), outs


def test_status_has_a_container_column_dash_for_none(mnt, procs):
    """A bare pid namespace is a container named by its namespace
    (pidns:INODE); a holder beside the daemon is in none ("-")."""
    outside = procs.agent()
    assert outside.mkdir(mnt.path('host')) == 0
    ns_pid, (status,) = _in_pid_namespace(mnt, 'status')
    header, _ = table(status.encode())
    assert header == COLUMNS and header[CONTAINER] == 'CONTAINER', header
    assert row_of(status.encode(), 'inner')[CONTAINER].startswith('pidns:')
    assert row_of(status.encode(), 'host')[CONTAINER] == '-'


def test_inside_a_pid_namespace_messages_name_its_own_pids(mnt, procs):
    """`held by sh[1]` for the namespace's own holder; a holder outside is
    said to be outside, with no pid (a host pid means nothing in there)."""
    outside = procs.agent()
    assert outside.mkdir(mnt.path('host')) == 0
    ns_pid, (inner, host) = _in_pid_namespace(
        mnt, 'run inner --timeout 0 -- true', 'run host --timeout 0 -- true')
    assert f'held by sh[{ns_pid}] for ' in inner, inner
    assert 'held by python3 (outside this pid namespace) for ' in host, host
    assert str(outside.pid) not in host, host


def test_inside_a_pid_namespace_json_gives_each_holder_its_pid_here(mnt, procs):
    outside = procs.agent()
    assert outside.mkdir(mnt.path('host')) == 0
    ns_pid, (out,) = _in_pid_namespace(mnt, 'status --json')
    by_name = {o['resource']: o for o in json.loads(out)}
    inner, host = by_name['inner']['holder'], by_name['host']['holder']
    assert inner['pid_here'] == int(ns_pid) == inner['ns_pid'], inner
    assert inner['pid'] != inner['pid_here']    # the record's pid is the daemon's
    assert host['pid_here'] is None and host['pid'] == outside.pid, host
    assert inner['container'].startswith('pidns:'), inner
    assert host['container'] is None, host
    # and on the host, the host's pids
    r = lc(mnt, 'status', 'host', '--json')
    assert json.loads(r.stdout)[0]['holder']['pid_here'] == outside.pid
