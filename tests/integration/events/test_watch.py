"""lockctl watch and M/.events (issue 24, section 3, events)."""
import errno
import os
import signal
import time

import fcntl
import pytest

from events_helpers import Watch


@pytest.fixture
def watch(mnt):
    ws = []

    def start(names=(), m=None, user=None):
        w = Watch(m or mnt, names, user=user)
        ws.append(w)
        if not names:
            w.sync()
        return w
    yield start
    for w in ws:
        w.stop()


def test_watch_sees_acquired_and_released_by_another_process(mnt, procs, watch):
    w = watch()
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    fence = a.owner(mnt.mnt, 'x')['fence']
    assert a.rmdir(mnt.path('x')) == 0
    evs = w.until(lambda e: e.get('name') == 'x' and e['event'] == 'released')
    mine = [e for e in evs if e.get('name') == 'x']
    assert [e['event'] for e in mine] == ['acquired', 'released']
    for e in mine:
        assert e['pid'] == a.pid
        assert e['fence'] == fence
        assert e['uid'] == 0
        assert e['time'].endswith('Z') and isinstance(e['time_ms'], int)


def test_watch_sees_recovered_with_evidence_when_holder_killed(mnt, procs, watch):
    w = watch()
    a = procs.agent()
    assert a.mkdir(mnt.path('r')) == 0
    w.until(lambda e: e.get('name') == 'r' and e['event'] == 'acquired')
    pid = a.pid
    a.kill()
    ev = w.until(lambda e: e.get('name') == 'r' and e['event'] != 'acquired')[-1]
    assert ev['event'] == 'recovered'
    assert ev['evidence'] == 'exited'
    assert ev['pid'] == pid


def test_watch_sees_broken(mnt, procs, watch):
    w = watch()
    a = procs.agent()
    assert a.mkdir(mnt.path('b')) == 0
    with open(mnt.path('b', 'break'), 'w') as f:
        f.write('stuck for an hour')
    ev = w.until(lambda e: e.get('name') == 'b' and e['event'] not in ('acquired',))[-1]
    assert ev['event'] == 'broken'
    assert ev['reason'] == 'stuck for an hour'
    assert ev['pid'] == a.pid


def test_watch_sees_waiting_then_granted(mnt, procs, watch):
    w = watch()
    holder, waiter = procs.agent(), procs.agent()
    fh = holder.open(mnt.path('.flock', 'f'))
    assert holder.flock(fh, fcntl.LOCK_EX) == 0
    fw = waiter.open(mnt.path('.flock', 'f'))
    rid = waiter.flock_start(fw, fcntl.LOCK_EX)
    ev = w.until(lambda e: e.get('name') == 'f' and e['event'] == 'waiting')[-1]
    assert ev['pid'] == waiter.pid and ev['mode'] == 'exclusive'
    assert holder.flock(fh, fcntl.LOCK_UN) == 0
    assert 'errno' not in waiter.wait(rid, timeout=5)
    evs = w.until(lambda e: e.get('name') == 'f' and e['event'] == 'granted')
    names = [e['event'] for e in evs if e.get('name') == 'f']
    assert names[-3:] == ['released', 'acquired', 'granted']
    assert evs[-1]['pid'] == waiter.pid and evs[-1]['waited_ms'] >= 0


def test_watch_of_names_shows_only_those(mnt, watch):
    w = watch(['keep', 'also'])
    # No event can be awaited for a name the watcher does not get: a later
    # event of a watched name shows that the earlier ones were skipped.
    deadline = time.monotonic() + 10
    while True:
        os.mkdir(mnt.path('other'))
        os.rmdir(mnt.path('other'))
        os.mkdir(mnt.path('keep'))
        os.rmdir(mnt.path('keep'))
        try:
            ev = w.next(timeout=0.5)
            break
        except AssertionError:
            assert time.monotonic() < deadline  # never attached
    assert ev['name'] == 'keep'
    assert all(e.get('name') != 'other' for e in w.seen)
    os.mkdir(mnt.path('also'))
    w.until(lambda e: e.get('name') == 'also')
    assert all(e.get('name') in ('keep', 'also') for e in w.seen)


def test_watch_ends_cleanly_on_sigint(mnt, watch):
    w = watch()
    t0 = time.monotonic()
    assert w.stop(signal.SIGINT) == 0  # its read was parked in the daemon
    assert time.monotonic() - t0 < 5
    os.mkdir(mnt.path('after'))  # the daemon serves on
    os.rmdir(mnt.path('after'))


def test_blocked_readers_hold_up_no_other_request(mnt_ao, users, watch):
    # Another uid's watchers (any uid may read), more than the loop's threads.
    ws = [watch(['busy49'], m=mnt_ao, user=users[0]) for _ in range(8)]
    w0 = watch(m=mnt_ao)  # attached once this one is: each open is its own cursor
    t0 = time.monotonic()
    for i in range(50):
        os.mkdir(mnt_ao.path(f'busy{i}'))
        os.rmdir(mnt_ao.path(f'busy{i}'))
    assert sorted(os.listdir(mnt_ao.mnt)) == ['.flock', '.log']
    assert time.monotonic() - t0 < 5
    w0.until(lambda e: e.get('name') == 'busy49' and e['event'] == 'released')
    for w in ws:
        assert w.until(lambda e: e['event'] == 'released')[0]['name'] == 'busy49'



def test_events_file_any_uid_and_capped_per_uid(mnt_ao, users):
    mnt = mnt_ao
    u = users[0]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(u.gid)
            os.setuid(u.uid)
            fds = [os.open(mnt.path('.events'), os.O_RDONLY) for _ in range(16)]
            try:
                os.open(mnt.path('.events'), os.O_RDONLY)
                code = 2
            except OSError as e:
                code = 0 if e.errno == errno.EMFILE else 3
            for fd in fds:
                os.close(fd)
            fd = os.open(mnt.path('.events'), os.O_RDONLY)  # room again
            os.close(fd)
        except BaseException:
            code = 4
        os._exit(code)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0


def test_reader_that_falls_behind_is_told_how_many_it_lost(mnt):
    fd = os.open(mnt.path('.events'), os.O_RDONLY)
    try:
        for i in range(2100):  # 4,200 events: more than the ring's 4,096
            os.mkdir(mnt.path('o'))
            os.rmdir(mnt.path('o'))
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    import json
    lines = [json.loads(l) for l in data.decode().splitlines()]
    assert lines[0] == {'event': 'overrun', 'lost': 4200 - 4096}
    assert lines[1]['event'] == 'acquired' and lines[1]['name'] == 'o'


def test_daemon_stop_ends_a_blocked_watch(lockfs_factory):
    m = lockfs_factory()
    w = Watch(m)
    w.sync()
    assert m.signal(signal.SIGTERM) == 0
    try:
        rc = w.proc.wait(10)  # not a hang
        # A parked read ends with end of file (0); one that reached the
        # daemon after it stopped reading, with the connection (69).
        err = w.proc.stderr.read().decode()
        assert rc == 0 and err == '' or rc == 69 and 'went away' in err, (rc, err)
    finally:
        w.stop()
