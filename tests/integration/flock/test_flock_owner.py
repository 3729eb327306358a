"""Issue 4 point 3: an fd lock belongs to its open file description.

"An fd lock belongs to its open file description (fi->lock_owner), not to a
process: it ends on LOCK_UN, on the release that the kernel sends with
flock_release when the last descriptor closes (including when the process
dies), on `rmdir M/NAME` by its resolved holder, or on a break.  It is never
released because the process that called flock exited (`flock 9` in a shell
exits at once while the shell keeps the lock).  After a daemon restart no
close can ever arrive for descriptors of the old mount: rebind such locks to
their recorded holder process (pidfd), and log it."
"""

import contextlib
import errno
import json
import fcntl
import os
import signal
import subprocess

import pytest

from flock_helpers import children_of, fpath, is_wouldblock, sh_quote  # noqa: F401
from lockfs_helpers import (PYTHON, END_EVENTS, evidence, log_for, read_owner, stays_held, wait_free,
                            wait_until,
                            wait_log, who_of)

EX, SH, NB, UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_NB, fcntl.LOCK_UN
WINDOW = 0.5


def _control_recovery(m, procs, name='control'):
    """Positive control for a negative window: a holder that dies IS released."""
    d = procs.agent()
    assert d.mkdir(m.path(name)) == 0
    d.kill()
    # 5 s, not 2: where the kernel's process events cannot be had (a
    # container), a death is seen by polling and /proc scans, and a loaded
    # brand-new machine took longer than 2 s once.
    wait_free(m, name, timeout=5)


def _is_held_by_other(m, procs, name='x'):
    """A fresh process's LOCK_EX|LOCK_NB is refused."""
    probe = procs.agent()
    fd = probe.open(fpath(m, name))
    rc = probe.flock(fd, EX | NB)
    if rc == 0:
        probe.flock(fd, UN)
    probe.exit()
    return is_wouldblock(rc)


def test_shell_flock_9_keeps_the_lock_after_flock1_exits(mnt, procs):
    sh = procs.shell()
    sh.ok(f'exec 9>{sh_quote(fpath(mnt, "x"))}')
    sh.ok('flock 9')
    assert children_of(sh.pid) == []                  # flock(1) is gone
    o = read_owner(mnt.mnt, 'x')
    assert (o['holder']['pid'], o['holder']['comm'], o['bound']) == (sh.pid, 'bash', 'fd')
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert _is_held_by_other(mnt, procs)
    assert procs.agent().mkdir(mnt.path('x')) == errno.EEXIST
    sh.ok('exec 9>&-')                                  # the shell closes fd 9
    wait_free(mnt, 'x')
    ends = [l for l in log_for(mnt.dir, 'x') if l.event in END_EVENTS]
    assert [l.event for l in ends] == ['released'], ends
    assert ends[0].details.get('pid') == str(sh.pid)


def test_shell_flock_u_releases(mnt, procs):
    sh = procs.shell()
    sh.ok(f'exec 9>{sh_quote(fpath(mnt, "x"))}; flock 9')
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == sh.pid
    sh.ok('flock -u 9')
    wait_free(mnt, 'x')
    assert _is_held_by_other(mnt, procs) is False


def test_shell_exit_releases(mnt, procs):
    sh = procs.shell()
    sh.ok(f'exec 9>{sh_quote(fpath(mnt, "x"))}; flock 9')
    assert sh.exit() == 0
    wait_free(mnt, 'x', timeout=2)


def test_lock_un_releases(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    assert lk.flock(fd, UN) == 0
    wait_free(mnt, 'x')
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']
    assert lk.flock(fd, EX | NB) == 0                   # the same fd may lock again
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == lk.pid


def test_last_close_releases_and_holder_death_releases(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    assert lk.close(fd) == 0
    wait_free(mnt, 'x', timeout=2)
    lk2 = procs.agent()
    lk2.take(fpath(mnt, 'x'))
    lk2.kill()
    wait_free(mnt, 'x', timeout=2)
    ends = [l.event for l in log_for(mnt.dir, 'x') if l.event in END_EVENTS]
    assert len(ends) == 2, log_for(mnt.dir, 'x')


def test_a_dup_shares_the_lock_until_the_last_close(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    fd2 = lk.dup(fd)
    fence = read_owner(mnt.mnt, 'x')['fence']
    assert lk.close(fd) == 0                            # flush, but not the last close
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert _is_held_by_other(mnt, procs)
    assert read_owner(mnt.mnt, 'x')['fence'] == fence
    assert lk.flock(fd2, EX | NB) == 0                  # still ours through the dup
    assert lk.close(fd2) == 0
    wait_free(mnt, 'x', timeout=2)


def test_a_forked_child_shares_the_lock(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    child = procs.adopt(lk.fork())
    assert lk.close(fd) == 0                            # the child still has it open
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert _is_held_by_other(mnt, procs)
    os.kill(child, signal.SIGKILL)                      # its last descriptor goes
    wait_free(mnt, 'x', timeout=2)


def test_exit_of_the_flocking_process_does_not_release_while_the_fd_lives(mnt, procs):
    lk = procs.agent()
    lk.take(fpath(mnt, 'x'))
    fence = read_owner(mnt.mnt, 'x')['fence']
    child = procs.adopt(lk.fork())
    lk.kill()                                           # the holder process dies
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert _is_held_by_other(mnt, procs)
    assert read_owner(mnt.mnt, 'x')['fence'] == fence
    assert not [l for l in log_for(mnt.dir, 'x') if l.event in END_EVENTS]
    os.kill(child, signal.SIGKILL)
    wait_free(mnt, 'x', timeout=2)


def test_two_opens_in_one_process_conflict(mnt, procs):
    lk = procs.agent()
    f1 = lk.take(fpath(mnt, 'x'))
    f2 = lk.open(fpath(mnt, 'x'))
    assert is_wouldblock(lk.flock(f2, EX | NB))
    assert is_wouldblock(lk.flock(f2, SH | NB))
    assert lk.flock(f1, UN) == 0
    assert lk.flock(f2, EX | NB) == 0                   # control
    assert is_wouldblock(lk.flock(f1, EX | NB))


def test_rmdir_by_the_resolved_holder_releases(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    fence = read_owner(mnt.mnt, 'x')['fence']
    assert lk.rmdir(mnt.path('x')) == 0
    assert not os.path.lexists(mnt.lockdir('x'))
    rel = [l for l in log_for(mnt.dir, 'x') if l.event == 'released']
    assert len(rel) == 1 and rel[0].details.get('fence') == str(fence)
    # the later close of the old descriptor releases nothing of a successor's
    b = procs.agent()
    assert b.mkdir(mnt.path('x')) == 0
    assert lk.flock(fd, UN) == 0
    assert lk.close(fd) == 0
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == b.pid
    assert b.rmdir(mnt.path('x')) == 0


def test_rmdir_by_a_child_of_the_holding_shell_releases(mnt, procs):
    sh = procs.shell()
    sh.ok(f'exec 9>{sh_quote(fpath(mnt, "x"))}; flock 9')
    sh.ok(f'rmdir {sh_quote(mnt.path("x"))}')           # rmdir(1), a child of the holder
    assert not os.path.lexists(mnt.lockdir('x'))
    sh.ok('exec 9>&-')
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']


def test_rmdir_by_a_stranger_is_eperm_and_logged(mnt, procs):
    lk = procs.agent()
    lk.take(fpath(mnt, 'x'))
    s = procs.agent()
    assert s.rmdir(mnt.path('x')) == errno.EPERM
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == lk.pid
    d = [l for l in log_for(mnt.dir, 'x') if l.event == 'denied']
    assert len(d) == 1 and d[0].who == who_of(s.pid)


def test_break_ends_an_fd_lock_and_the_old_close_releases_nothing(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    with open(mnt.path('x', 'break'), 'w') as f:
        f.write('hung\n')
    assert not os.path.lexists(mnt.lockdir('x'))
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'broken']
    b = procs.agent()
    assert b.mkdir(mnt.path('x')) == 0
    assert lk.flock(fd, UN) == 0
    assert lk.close(fd) == 0
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert read_owner(mnt.mnt, 'x')['holder']['pid'] == b.pid
    assert b.rmdir(mnt.path('x')) == 0


def test_daemon_restart_rebinds_to_the_recorded_holder_then_its_death_releases(
        lockfs_factory, procs):
    m = lockfs_factory()
    lk = procs.agent()
    lk.take(fpath(m, 'x'))
    o1 = read_owner(m.mnt, 'x')
    who = who_of(lk.pid)
    m.kill9(lazy=True)          # lk still has a descriptor on the dead mount
    m2 = lockfs_factory.restart(m)
    rb = wait_log(m2.dir, 'x', 'rebound')
    assert len(rb) == 1, log_for(m2.dir, 'x')
    assert rb[0].who == who
    assert rb[0].details.get('fence', str(o1['fence'])) == str(o1['fence']), rb[0].raw
    o2 = read_owner(m2.mnt, 'x')
    assert o2['bound'] == 'process'
    assert (o2['holder']['pid'], o2['fence']) == (lk.pid, o1['fence'])
    other = procs.agent()
    assert other.mkdir(m2.path('x')) == errno.EEXIST
    assert other.rmdir(m2.path('x')) == errno.EPERM
    _control_recovery(m2, procs)
    assert stays_held(m2, 'x', WINDOW)                  # the holder lives: kept
    lk.kill()
    wait_free(m2, 'x', timeout=2)
    rec = wait_log(m2.dir, 'x', 'recovered')[0]
    assert rec.who == who and 'exited' in evidence(rec), rec.raw


def test_daemon_restart_rebound_lock_is_released_by_its_holders_rmdir(lockfs_factory, procs):
    m = lockfs_factory()
    sh = procs.shell()
    sh.ok(f'exec 9>{sh_quote(fpath(m, "x"))}; flock 9')
    m.kill9(lazy=True)
    m2 = lockfs_factory.restart(m)
    wait_log(m2.dir, 'x', 'rebound')
    o = read_owner(m2.mnt, 'x')
    assert (o['bound'], o['holder']['pid']) == ('process', sh.pid)
    sh.ok(f'rmdir {sh_quote(m2.path("x"))}')
    assert not os.path.lexists(m2.lockdir('x'))
    assert [l.event for l in log_for(m2.dir, 'x')] == ['acquired', 'rebound', 'released']


def test_the_resolved_holder_may_write_operation_others_may_not(mnt, procs):
    """"The holder" is whoever may rmdir: also for an fd lock."""
    sh = procs.shell()
    sh.ok(f'exec 9>{sh_quote(fpath(mnt, "x"))}; flock 9')
    sh.ok(f'echo "migrating" > {sh_quote(mnt.path("x", "operation"))}')
    assert read_owner(mnt.mnt, 'x')['operation'] == 'migrating'
    assert procs.agent().write(mnt.path('x', 'operation'), b'mine\n') == errno.EPERM
    assert read_owner(mnt.mnt, 'x')['operation'] == 'migrating'


READERS = r'''
import fcntl, os, sys
fds = []
for i in range(int(sys.argv[2])):
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)
    fds.append(fd)
print('held', flush=True)
sys.stdin.readline()
'''


@pytest.mark.parametrize('readers', [2, 150])
def test_daemon_restart_rebinds_a_shared_lock_with_any_number_of_readers(lockfs_factory,
                                                                        procs, readers):
    """"any number of readers" (point 2), each its own open file description,
    and after a restart the lock is rebound to the recorded holder, not left
    behind as a foreign lock that nobody can ever recover."""
    m = lockfs_factory()
    p = procs.popen([PYTHON, '-c', READERS, fpath(m, 'x'), str(readers)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout.readline() == b'held\n'
    o1 = read_owner(m.mnt, 'x')
    assert (o1['mode'], len(o1['holders'])) == ('shared', readers)
    m.kill9(lazy=True)
    m2 = lockfs_factory.restart(m)
    o2 = read_owner(m2.mnt, 'x')
    assert not o2.get('foreign') and o2['holder'] is not None, \
        (f'after the restart the lock of {readers} readers reads as foreign '
         f'(owner.json is {os.path.getsize(os.path.join(m2.lockdir("x"), "owner.json"))} bytes)')
    assert o2['bound'] == 'process' and o2['holder']['pid'] == p.pid
    assert wait_log(m2.dir, 'x', 'rebound')
    p.kill()
    p.wait()
    wait_free(m2, 'x', timeout=5)


def test_after_a_restart_a_share_recorded_on_another_boot_is_recovered_as_such(
        lockfs_factory, procs):
    """A share whose boot id is not this boot's cannot be alive: it is dropped
    with evidence boot-changed (as a holder would be), and the live share stays."""
    m = lockfs_factory()
    r1, r2 = procs.agent(), procs.agent()
    r1.take(fpath(m, 'x'), SH)
    r2.take(fpath(m, 'x'), SH)
    assert [h['pid'] for h in read_owner(m.mnt, 'x')['holders']] == [r1.pid, r2.pid]
    m.kill9(lazy=True)
    p = os.path.join(m.lockdir('x'), 'owner.json')
    with open(p, 'rb') as f:
        rec = json.loads(f.read())
    rec['holders'][1]['boot_id'] = '00000000-0000-4000-8000-000000000000'
    with open(p, 'wb') as f:
        f.write((json.dumps(rec, separators=(',', ':')) + '\n').encode())
    m2 = lockfs_factory.restart(m)
    rec = wait_log(m2.dir, 'x', 'recovered')
    assert len(rec) == 1 and evidence(rec[0]) == {'boot-changed'}, rec[0].raw
    assert (rec[0].details['pid'], rec[0].details['holder']) == (str(r2.pid), who_of(r2.pid))
    assert rec[0].details['start'].isdigit()
    assert [h['pid'] for h in read_owner(m2.mnt, 'x')['holders']] == [r1.pid]


def _wait_refused(m):
    """Until the daemon said that DIR refuses (once, when the release failed)."""
    wait_until(lambda: 'cannot' in m.stderr(), what='the refusing DIR on stderr')


class _Immutable:
    """chattr +i on DIR: renames in it fail (EPERM) -- the store cannot take
    a release -- while files inside lock directories can still be written."""

    def __init__(self, d):
        self.d = d

    def __enter__(self):
        subprocess.run(['chattr', '+i', self.d], check=True)
        return self

    def __exit__(self, *exc):
        subprocess.run(['chattr', '-i', self.d], check=True)


def test_a_last_close_the_store_cannot_take_keeps_the_lock_then_ends_it(mnt, procs):
    """Fail closed, then finish the job: the lock stays held while DIR refuses
    the release (said on stderr), and ends by itself once DIR takes it, with
    one `released` line in all."""
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    with _Immutable(mnt.dir):
        assert lk.close(fd) == 0
        _wait_refused(mnt)
        assert stays_held(mnt, 'x', WINDOW)
        assert procs.agent().mkdir(mnt.path('x')) == errno.EEXIST
        assert _is_held_by_other(mnt, procs)
    wait_free(mnt, 'x', timeout=5)
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']
    assert lk.flock(lk.open(fpath(mnt, 'x')), EX | NB) == 0          # free for anyone


def test_a_lock_kept_after_a_failed_close_goes_to_the_next_waiter(mnt, procs):
    """The retry hands it over like any release: in place, which DIR allows."""
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    with _Immutable(mnt.dir):
        assert lk.close(fd) == 0
        _wait_refused(mnt)
        w = procs.agent()
        rid = w.flock_start(w.open(fpath(mnt, 'x')), EX)
        a = w.wait(rid, 5)                  # granted by a hand-off in place
        assert 'errno' not in a, a
        assert read_owner(mnt.mnt, 'x')['holder']['pid'] == w.pid
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released', 'acquired']


def test_a_share_the_store_cannot_drop_is_dropped_once_it_can(mnt, procs):
    """The same for one holder of a shared lock: its record is rewritten in
    place, so the lock directory is what refuses here."""
    r1, r2 = procs.agent(), procs.agent()
    r1.take(fpath(mnt, 'x'), SH)
    fd2 = r2.take(fpath(mnt, 'x'), SH)
    with _Immutable(mnt.lockdir('x')):
        assert r2.close(fd2) == 0
        _wait_refused(mnt)
        assert [h['pid'] for h in read_owner(mnt.mnt, 'x')['holders']] == [r1.pid, r2.pid]
    wait_until(lambda: [h['pid'] for h in read_owner(mnt.mnt, 'x')['holders']] == [r1.pid],
               what="r2's share to be dropped")
    assert [(l.event, l.details['pid']) for l in log_for(mnt.dir, 'x')] == [
        ('acquired', str(r1.pid)), ('acquired', str(r2.pid)), ('released', str(r2.pid))]


def test_lockfs_slug_of_a_flock_caller_names_the_holder_in_owner_and_log(mnt):
    """Issue 2's WHO: "the value of LOCKFS_SLUG in the caller's environment
    when set" -- for fd locks too, each share by its own slug."""
    sh = subprocess.run(['sh', '-c', 'LOCKFS_SLUG=agent-1 flock "$1" cat "$2"', 'sh',
                         fpath(mnt, 'x'), mnt.path('x', 'owner')],
                        capture_output=True, check=True)
    o = json.loads(sh.stdout)
    assert (o['slug'], o['bound']) == ('agent-1', 'fd')
    # flock(1)'s last close reaches the daemon in the background (the
    # kernel sends RELEASE asynchronously): wait for its line.
    wait_log(mnt.dir, 'x', 'released')
    assert [(l.who, l.event) for l in log_for(mnt.dir, 'x')] == [
        ('agent-1', 'acquired'), ('agent-1', 'released')]


def test_each_share_keeps_its_own_slug(mnt, procs):
    r1 = procs.agent(env={'LOCKFS_SLUG': 'reader-1'})
    r2 = procs.agent(env={'LOCKFS_SLUG': 'reader-2'})
    r3 = procs.agent()
    f1 = r1.take(fpath(mnt, 'x'), SH)
    f2 = r2.take(fpath(mnt, 'x'), SH)
    r3.take(fpath(mnt, 'x'), SH)
    o = read_owner(mnt.mnt, 'x')
    assert [h['slug'] for h in o['holders']] == ['reader-1', 'reader-2', None]
    assert o['slug'] == 'reader-1'
    assert r1.flock(f1, UN) == 0              # the first leaves: the next moves up
    o = read_owner(mnt.mnt, 'x')
    assert o['slug'] == 'reader-2' and [h['slug'] for h in o['holders']] == ['reader-2', None]
    assert r2.flock(f2, UN) == 0
    assert [(l.who, l.event) for l in log_for(mnt.dir, 'x')][:5] == [
        ('reader-1', 'acquired'), ('reader-2', 'acquired'), (f'python3[{r3.pid}]', 'acquired'),
        ('reader-1', 'released'), ('reader-2', 'released')]


@contextlib.contextmanager
def _shell_let_go_while_refused(mnt, sh):
    """SH takes x with `exec 9>…; flock 9`, then, while DIR refuses renames,
    closes fd 9: the release fails.  DIR refuses until the block ends."""
    sh.ok(f'exec 9>{sh_quote(fpath(mnt, "x"))}; flock 9')
    with _Immutable(mnt.dir):
        sh.ok('exec 9>&-')
        _wait_refused(mnt)
        yield


def test_after_a_refused_close_the_holders_rmdir_finishes_it_without_a_second_line(mnt, procs):
    """The shell closed fd 9 while DIR refused the release, then runs rmdir:
    one `released` in all, whoever ends it in the store."""
    sh = procs.shell()
    with _shell_let_go_while_refused(mnt, sh):
        rc, _ = sh.run(f'rmdir {sh_quote(mnt.path("x"))}')
        assert rc != 0                                    # the store still refuses
    wait_free(mnt, 'x', timeout=5)
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']


def test_a_grant_let_go_while_the_store_refused_cannot_be_bound(mnt, procs):
    """bind would keep what the descriptor let go (and lose the retry)."""
    sh = procs.shell()
    with _shell_let_go_while_refused(mnt, sh):
        rc, out = sh.run(f'echo process > {sh_quote(mnt.path("x", "bind"))}')
        assert rc != 0 and 'Operation not permitted' in out, out
    wait_free(mnt, 'x', timeout=5)
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'released']


def test_a_conversion_the_store_refuses_completes_once_it_can(mnt, procs):
    """LOCK_EX -> LOCK_SH lets go of the exclusive grant first: refused by
    DIR, the request waits for that release and is then granted, with one
    `released` for the old grant (not a second at the close)."""
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    with _Immutable(mnt.dir):
        rid = lk.flock_start(fd, SH)
        a = lk.wait(rid, 5)               # handed over in place: DIR allows that
        assert 'errno' not in a, a
    o = read_owner(mnt.mnt, 'x')
    assert (o['mode'], o['holder']['pid']) == ('shared', lk.pid)
    assert lk.close(fd) == 0
    wait_free(mnt, 'x', timeout=5)
    assert [(l.event, l.details.get('mode')) for l in log_for(mnt.dir, 'x')] == [
        ('acquired', 'exclusive'), ('released', None), ('acquired', 'shared'),
        ('released', None)]
