"""Issue 19 point 1: no ordinary user can wedge the mount through the
daemon's own lookups.

The attack: an ordinary user, in a user and mount namespace of its own,
makes a root (a tmpfs with the system's /usr bound in) where
/usr/local/sbin is a bind mount of M itself, and runs a *copy* of mkdir (or
rmdir) from that root on M.  The copy is named like a helper but is not the
genuine file, and its root is not the daemon's, so the daemon used to look
`usr/local/sbin/mkdir` up in the caller's root: a walk through the user's
bind mount back into M, whose directory lock the kernel holds for this very
mkdir.  The daemon's thread slept in D state for ever, and with it every
other user's `ls M`, `mkdir M/x` and `rmdir M/x`, until the FUSE connection
was aborted.

Each test: the attack runs as uid 4242, then uid 4343's `ls`, `mkdir` and
`rmdir` on M must each answer within 1 s, and the attacker must get a
documented errno (EACCES: the daemon could not establish a holder in time,
or EPERM: not the holder) or its lock.  Should the mount wedge (today's
code), the test aborts the connection it made, so no process is left in D
state, and fails.
"""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from lockfs_helpers import mount_dev, wait_until
from wedge_load import abort_conn

BOUND_S = 1.0

# Run as the attacker: $1 its empty root dir, $2 the mount, $3 the verb
# (mkdir or rmdir), $4 the lock name, and $5 (optional) a trap: a mount to
# bind on the root's /usr/local/sbin instead of M (which then is at /m).
# Prints "OK" when the copy of the verb succeeded, else its message.
ATTACK = r'''
set -u
exec unshare -Urm bash -c '
  set -e
  R=$1 M=$2 VERB=$3 NAME=$4 TRAP=${5:-}
  mount -t tmpfs none "$R"; mkdir -p "$R/usr" "$R/m"
  mount --rbind /usr "$R/usr"
  for d in bin lib lib64 sbin; do ln -s "usr/$d" "$R/$d"; done
  if [ -n "$TRAP" ]; then
    mount --bind "$TRAP" "$R/usr/local/sbin"; mount --bind "$M" "$R/m"; at=/m
  else
    mount --bind "$M" "$R/usr/local/sbin"; at=/usr/local/sbin
  fi
  cp "/usr/bin/$VERB" "$R/$VERB"
  if out=$(chroot "$R" "/$VERB" "$at/$NAME" 2>&1); then
    echo OK
  else
    echo "$out"
  fi' attack "$@"
'''


def _user_run(user, argv, timeout):
    """Run ARGV as USER; the CompletedProcess, or None if it did not end
    within TIMEOUT (it is then left running: the caller must free it)."""
    p = subprocess.Popen(['setpriv', f'--reuid={user.uid}', f'--regid={user.gid}',
                          '--clear-groups', '--'] + argv,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return p
    return subprocess.CompletedProcess(argv, p.returncode, out, None)


def _answers(p):
    return isinstance(p, subprocess.CompletedProcess)


class Attack:
    """The attack and the bystander's requests: everything that could hang,
    freed (the connection aborted) if it did."""

    def __init__(self, mnt, root_dir):
        self.mnt, self.root_dir = mnt, root_dir
        self.dev = mount_dev(mnt)
        self.stuck = []

    def run(self, user, verb, name):
        p = _user_run(user, ['bash', '-c', ATTACK, 'attack', self.root_dir, self.mnt, verb,
                             name], 5.0)
        if not _answers(p):
            self.stuck.append(p)
        return p

    def bystander(self, user, argv):
        t0 = time.monotonic()
        p = _user_run(user, argv, BOUND_S)
        if not _answers(p):
            self.stuck.append(p)
        return p, time.monotonic() - t0

    def free(self):
        """Abort the connection if anything is stuck, then reap it all.
        True if the mount was wedged."""
        wedged = bool(self.stuck)
        if wedged:
            abort_conn(self.dev)
        for p in self.stuck:
            p.kill()
            p.wait(10)
        self.stuck = []
        return wedged


@pytest.fixture
def attack(mnt_ao, users, scratch_dir):
    if shutil.which('unshare') is None or shutil.which('setpriv') is None:
        pytest.skip('needs unshare and setpriv (util-linux)')
    probe = subprocess.run(['setpriv', f'--reuid={users[0].uid}', f'--regid={users[0].gid}',
                            '--clear-groups', 'unshare', '-Urm', 'true'],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f'unprivileged user namespaces are off here: {probe.stderr.strip()}')
    root_dir = os.path.join(scratch_dir, 'R')
    os.mkdir(root_dir)
    os.chown(root_dir, users[0].uid, users[0].gid)
    a = Attack(mnt_ao.mnt, root_dir)
    yield a
    a.free()


def _bystander_ops(attack, user, mnt):
    """uid 4343's ls, then mkdir and rmdir: each must answer within BOUND_S."""
    slow = []
    other = os.path.join(mnt, 'other')
    # One shell for mkdir and rmdir: it is the holder between the two.
    for cmd in (f'ls {mnt}', f'mkdir {other} && rmdir {other}'):
        p, took = attack.bystander(user, ['sh', '-c', cmd])
        if not _answers(p) or took > BOUND_S:
            slow.append(f'{cmd}: no answer within {BOUND_S} s')
        elif p.returncode != 0:
            slow.append(f'{cmd}: {p.stdout.strip()}')
    return slow


def test_a_fake_mkdir_in_a_root_that_binds_the_mount_wedges_nothing(attack, mnt_ao, users):
    got = attack.run(users[0], 'mkdir', 'dl1')
    slow = _bystander_ops(attack, users[1], mnt_ao.mnt)
    wedged = attack.free()
    assert not wedged and not slow, f'the mount wedged: {slow}'
    assert _answers(got)
    out = got.stdout.strip()
    # The copy of mkdir is no genuine helper: it either holds the lock it
    # took (and its exit ends it at once) or is told the daemon could not
    # establish a holder (EACCES).
    assert out == 'OK' or out.endswith(': Permission denied'), out


def test_a_fake_rmdir_of_another_users_lock_wedges_nothing(attack, mnt_ao, users, procs):
    holder = procs.agent(user=users[1])
    assert holder.mkdir(os.path.join(mnt_ao.mnt, 'dl2')) == 0
    got = attack.run(users[0], 'rmdir', 'dl2')
    slow = _bystander_ops(attack, users[1], mnt_ao.mnt)
    wedged = attack.free()
    assert not wedged and not slow, f'the mount wedged: {slow}'
    assert got.stdout.strip().endswith(': Operation not permitted'), got.stdout
    assert os.path.isdir(os.path.join(mnt_ao.mnt, 'dl2')), 'the lock of uid 4343 was lost'


# A root of uid 4343's own, as a container has: its own copies of bash and
# mkdir in a usr/bin it owns (so genuine there: the root's owner placed
# them), the system's libraries bound in, and M at /m.  Prints the
# `owner` record of the lock its shell takes with its own mkdir, or the
# error.
OWN_ROOT = r'''
set -u
R=$1 M=$2 NAME=$3
exec unshare -Urm bash -c '
  set -e
  R=$1 M=$2 NAME=$3
  mount -t tmpfs -o mode=755 none "$R"; mkdir -p "$R/usr/bin" "$R/usr/lib" "$R/m"
  mount --rbind /usr/lib "$R/usr/lib"
  [ -d /usr/lib64 ] && mkdir "$R/usr/lib64" && mount --rbind /usr/lib64 "$R/usr/lib64"
  for d in bin lib lib64; do ln -s "usr/$d" "$R/$d"; done
  cp /usr/bin/bash /usr/bin/mkdir /usr/bin/cat /usr/bin/rmdir "$R/usr/bin/"
  mount --bind "$M" "$R/m"
  chroot "$R" /usr/bin/bash -c "mkdir /m/$NAME && cat /m/$NAME/owner && rmdir /m/$NAME"
' own "$R" "$M" "$NAME"
'''


def test_a_root_that_never_answers_costs_its_user_alone(attack, mnt_ao, lockfs_factory,
                                                        users, scratch_dir):
    # The attacker's root binds a FUSE mount whose daemon never answers (a
    # second lockfs, stopped): the daemon's walk there never ends.
    m2 = lockfs_factory(allow_other=True)
    os.kill(m2.pid, signal.SIGSTOP)
    try:
        for i in range(2 * 2 + 1):   # more than the walks one uid may have under way
            t0 = time.monotonic()
            got = _user_run(users[0], ['bash', '-c', ATTACK, 'attack', attack.root_dir,
                                       mnt_ao.mnt, 'mkdir', f'stuck{i}', m2.mnt], 5.0)
            took = time.monotonic() - t0
            if not _answers(got):
                attack.stuck.append(got)
            assert _answers(got), f'attempt {i}: the fake mkdir got no answer'
            assert got.stdout.strip().endswith(': Permission denied'), got.stdout
            assert took < BOUND_S + 1.0, f'attempt {i} took {took:.2f} s'
            slow = _bystander_ops(attack, users[1], mnt_ao.mnt)
            assert not slow, f'attempt {i}: {slow}'
        # Meanwhile another user's own root (a container's) is still walked:
        # its copy of mkdir is genuine there, so its shell holds.
        own = os.path.join(scratch_dir, 'R2')
        os.mkdir(own)
        os.chown(own, users[1].uid, users[1].gid)
        got = _user_run(users[1], ['bash', '-c', OWN_ROOT, 'own', own, mnt_ao.mnt, 'theirs'], 10.0)
        assert _answers(got), 'the other user\'s container got no answer'
        assert got.returncode == 0, got.stdout
        rec = json.loads(got.stdout)
        assert rec['holder']['comm'] == 'bash', rec['holder']
        assert rec['holder']['uid'] == users[1].uid
    finally:
        os.kill(m2.pid, signal.SIGCONT)
    assert not attack.free()
