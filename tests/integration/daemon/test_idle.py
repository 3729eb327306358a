#!/usr/bin/python3
"""An idle daemon wakes for nothing (issue 23 §2, "no wake-ups while nothing
it watches changes").

With no lock held, no waiter, no lease and nothing to retry, no thread of
the daemon is woken: the liveness thread's tick sleeps until something
needs it, the request loop's watchdog sleeps until a request comes.  Wake-ups
are counted per thread (voluntary context switches in
/proc/PID/task/*/status) over a few seconds of quiet after some work.
The etcd backend's periodic ones (the lease keepalive, the watch stream's
ping) are in etcd/test_etcd_idle.py.
"""

import errno
import os

from lockfs_helpers import idle_wakeups, log_for, read_owner, wait_free, wait_until

QUIET_S = 3.0


def some_work(mnt, name):
    """What a script does: take a lock, read its owner, list, release."""
    os.mkdir(os.path.join(mnt.mnt, name))
    read_owner(mnt.mnt, name)
    os.listdir(mnt.mnt)
    os.rmdir(os.path.join(mnt.mnt, name))


def test_an_idle_mount_wakes_no_thread(mnt):
    some_work(mnt, 'idle-1')
    woke, settled = idle_wakeups(mnt.pid, QUIET_S)
    assert settled and not woke, \
        f'an idle daemon woke over {QUIET_S} s, by thread: {woke}'


def test_a_holder_death_is_still_seen_at_once_and_then_it_sleeps_again(mnt, procs):
    # The tick sleeps; a holder's death is an event (its pidfd), which
    # still frees the lock at once, and the daemon goes back to sleep.
    some_work(mnt, 'idle-2')
    woke, settled = idle_wakeups(mnt.pid, 1.0)
    assert settled and not woke, woke
    a = procs.agent()
    assert a.mkdir(mnt.path('idle-3')) == 0
    a.kill()
    wait_free(mnt, 'idle-3', timeout=2.0)
    assert log_for(mnt.dir, 'idle-3')[-1].event == 'recovered'
    woke, settled = idle_wakeups(mnt.pid, QUIET_S)
    assert settled and not woke, \
        f'after a recovery the daemon woke over {QUIET_S} s, by thread: {woke}'


def test_a_dir_path_replaced_while_idle_is_found_at_the_next_lock(lockfs_factory, procs,
                                                                   tmp_path):
    # inotify on DIR does not see its parent renamed; the tick's look at
    # DIR's path does.  A sleeping tick is woken by the next lock taken, so
    # the daemon still finds out at once, and fails closed (EIO).
    parent = tmp_path / 'parent'
    parent.mkdir()
    (parent / 'back').mkdir(mode=0o700)
    m = lockfs_factory(backing=str(parent / 'back'))
    some_work(m, 'idle-4')
    woke, settled = idle_wakeups(m.pid, 1.0)
    assert settled and not woke, woke
    os.rename(parent, tmp_path / 'parent-moved')
    parent.mkdir()
    (parent / 'back').mkdir(mode=0o700)
    a = procs.agent()
    n = iter(range(10 ** 6))
    wait_until(lambda: a.mkdir(m.path(f'x{next(n)}')) == errno.EIO, timeout=2,
               what='mkdir to fail with EIO once DIR names another directory')
    assert 'removed or replaced' in m.stderr()
