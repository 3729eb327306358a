"""Issue 8 point 5: fd locks after a daemon restart.

"Observed: a process holding `flock M/.flock/sd` across a clean restart
gets ENOTCONN on its close and is then listed as a waiter of its own
rebound lock forever.  After a restart, a rebound lock ends when its holder
exits, and no phantom waiter remains."

After a restart no request can arrive through the descriptors of the old
mount (their close gets ENOTCONN): the new daemon binds each fd lock it
finds to the process that still holds such a descriptor -- the recorded
holder, or the first of its descendants that does (`flock FILE CMD`:
flock(1), not the shell that ran it) -- and ends it when that process exits
or no longer holds one.  The same process asking again through the new
mount is a new request like any other.
"""

import errno
import fcntl
import os
import signal

from flock_helpers import children_of, fpath, sh_quote, wait_waiters  # noqa: F401
from lockfs_helpers import (END_EVENTS, evidence, log_for, read_owner, stays_held, wait_free,
                            wait_log, wait_until, who_of)

EX, NB, UN = fcntl.LOCK_EX, fcntl.LOCK_NB, fcntl.LOCK_UN
WINDOW = 0.5


def _clean_restart(factory, m):
    assert m.signal(signal.SIGTERM) == 0
    return factory.restart(m)


def _control_recovery(m, procs, name='control'):
    """Positive control for a negative window: a holder that dies IS released."""
    d = procs.agent()
    assert d.mkdir(m.path(name)) == 0
    d.kill()
    wait_free(m, name, timeout=2)


def test_after_a_clean_restart_flock1s_lock_ends_with_it_and_leaves_no_phantom_waiter(
        lockfs_factory, procs, tmp_path):
    """`flock F CMD; flock F echo again` in one shell: the second flock(1) is
    granted once the first one ends, although both resolve to the shell."""
    m = lockfs_factory()
    go = str(tmp_path / 'go')
    os.mkfifo(go)
    sh = procs.shell()
    f = sh_quote(fpath(m, 'sd'))
    tag = sh.start(f'flock {f} sh -c "read x < {go}"; flock {f} echo again')
    wait_until(lambda: os.path.isdir(m.lockdir('sd')), what='the first flock(1) to hold sd')
    first = children_of(sh.pid)
    assert len(first) == 1
    procs.adopt(first[0])
    for p in wait_until(lambda: children_of(first[0]), what="flock(1)'s command"):
        procs.adopt(p)                          # `sh -c read` must not outlive a failure
    m2 = _clean_restart(lockfs_factory, m)
    rb = wait_log(m2.dir, 'sd', 'rebound')
    assert rb[0].who == who_of(first[0]), rb[0].raw
    assert read_owner(m2.mnt, 'sd')['holder']['pid'] == first[0]
    with open(go, 'w') as w:
        w.write('go\n')
    rc, out = sh.wait(tag, timeout=5)
    assert (rc, out.strip().splitlines()[-1:]) == (0, ['again']), out
    wait_free(m2, 'sd', timeout=2)
    events = [l for l in log_for(m2.dir, 'sd')]
    assert [l.event for l in events] == ['acquired', 'rebound', 'recovered', 'acquired',
                                         'released'], [l.raw for l in events]
    # flock(1) exiting both ends the process and closes its descriptor:
    # whichever the daemon notices first is the evidence
    assert evidence(events[2]) & {'exited', 'closed'}, events[2].raw


def test_after_a_clean_restart_a_rebound_lock_ends_when_its_holder_closes_it(
        lockfs_factory, procs):
    m = lockfs_factory()
    lk = procs.agent()
    fd = lk.take(fpath(m, 'x'))
    m2 = _clean_restart(lockfs_factory, m)
    wait_log(m2.dir, 'x', 'rebound')
    assert lk.close(fd) == errno.ENOTCONN            # the old mount's close goes nowhere
    wait_free(m2, 'x', timeout=3)
    ends = [l for l in log_for(m2.dir, 'x') if l.event in END_EVENTS]
    assert [l.event for l in ends] == ['recovered'] and evidence(ends[0]) == {'closed'}, \
        [l.raw for l in log_for(m2.dir, 'x')]
    assert ends[0].who == who_of(lk.pid)
    fd2 = lk.open(fpath(m2, 'x'))
    assert lk.flock(fd2, EX | NB) == 0               # free again, for the same process too
    assert lk.flock(fd2, UN) == 0


def test_a_holder_waiting_on_the_new_mount_is_granted_once_it_closes_the_old_descriptor(
        lockfs_factory, procs):
    """Its new descriptor (on the new mount) does not count as the old one."""
    m = lockfs_factory()
    lk = procs.agent()
    old = lk.take(fpath(m, 'x'))
    m2 = _clean_restart(lockfs_factory, m)
    wait_log(m2.dir, 'x', 'rebound')
    new = lk.open(fpath(m2, 'x'))
    rid = lk.flock_start(new, EX, bg=True)
    wait_waiters(m2, 'x', [lk.pid])
    assert stays_held(m2, 'x', WINDOW)                # it still holds the old one
    assert lk.poll(rid) is None
    assert lk.close(old) == errno.ENOTCONN
    a = lk.wait(rid, 5)
    assert 'errno' not in a, a
    o = read_owner(m2.mnt, 'x')
    assert (o['bound'], o['holder']['pid']) == ('fd', lk.pid)
    assert lk.flock(new, UN) == 0
    wait_free(m2, 'x', timeout=2)


def test_a_rebound_lock_lasts_while_the_shell_keeps_its_descriptor(lockfs_factory, procs):
    m = lockfs_factory()
    sh = procs.shell()
    sh.ok(f'exec 9>{sh_quote(fpath(m, "x"))}; flock 9')
    m2 = _clean_restart(lockfs_factory, m)
    wait_log(m2.dir, 'x', 'rebound')
    assert read_owner(m2.mnt, 'x')['holder']['pid'] == sh.pid
    _control_recovery(m2, procs)
    assert stays_held(m2, 'x', 1.5)                   # longer than one check
    sh.run('exec 9>&-')
    wait_free(m2, 'x', timeout=3)
    ends = [l for l in log_for(m2.dir, 'x') if l.event in END_EVENTS]
    assert [(l.event, evidence(l)) for l in ends] == [('recovered', {'closed'})]


def test_a_lock_whose_descriptor_was_closed_while_the_daemon_was_down_ends_at_start(
        lockfs_factory, procs):
    m = lockfs_factory()
    lk = procs.agent()
    fd = lk.take(fpath(m, 'x'))
    m.kill9(lazy=True)
    assert lk.close(fd) == errno.ENOTCONN
    m2 = lockfs_factory.restart(m)
    wait_free(m2, 'x', timeout=2)
    events = log_for(m2.dir, 'x')
    assert [l.event for l in events] == ['acquired', 'recovered'], [l.raw for l in events]
    assert evidence(events[1]) == {'closed-while-down'}
    assert events[1].who == who_of(lk.pid)
