"""Issue 24 §1: slots (counting semaphores), on a real mount (docs/slots.md).

`mkdir M/.slots/NAME=N` takes one of N slots of NAME (the first taker gives
N; a taker with another N is refused ERANGE and logged `denied`),
`rmdir M/.slots/NAME` lets the caller's slot go, `M/.slots/NAME/owner`
lists every holder with its slot, and `flock` on `M/.flock/.slots/NAME=N`
waits in one FIFO line for any slot (a read of that file says which).
Each slot is its own lock `.slotKofN:NAME` in the store: holder death,
leases, fences and the log work as for any lock.
"""

import errno
import fcntl
import json
import os
import subprocess

from lockfs_helpers import read_log, wait_until, slot_owner, slot_waiters

LOCKFS_BUILD = os.environ.get('LOCKFS_BUILD', 'build')

EX, NB = fcntl.LOCK_EX, fcntl.LOCK_NB


def take(m, name):
    return m.path('.slots', name)


def flock_file(m, name):
    return m.path('.flock', '.slots', name)


def test_capacity_by_first_taker_and_the_next_taker_refused(mnt, procs):
    a, b, c = procs.agent(), procs.agent(), procs.agent()
    assert a.mkdir(take(mnt, 'gpu=2')) == 0
    assert b.mkdir(take(mnt, 'gpu=2')) == 0
    assert c.mkdir(take(mnt, 'gpu=2')) == errno.EEXIST
    o = slot_owner(mnt, 'gpu')
    assert o['resource'] == 'gpu' and o['slots'] == 2 and o['held'] == 2
    assert sorted((h['pid'], h['slot']) for h in o['holders']) == [(a.pid, 0), (b.pid, 1)]
    assert os.listdir(mnt.path('.slots')) == ['gpu']
    # ls -l M/.slots/gpu: what is there, and nothing that is not.
    assert sorted(os.listdir(mnt.path('.slots', 'gpu'))) == ['owner', 'waiters']
    for f in ('owner', 'waiters'):
        assert os.stat(mnt.path('.slots', 'gpu', f)).st_mode & 0o170000 == 0o100000
    assert os.path.isdir(mnt.path('.slots', 'gpu'))
    # The slotted name is not the lock `gpu`: old names mean what they meant.
    assert not os.path.exists(mnt.path('gpu'))
    assert c.mkdir(mnt.path('gpu')) == 0
    # Slot locks are not names of M.
    assert '.slot0of2:gpu' not in os.listdir(mnt.mnt)
    assert c.mkdir(mnt.path('.slot0of2:gpu')) == errno.EINVAL


def test_a_taker_that_disagrees_on_the_count_is_refused_and_logged(mnt, procs):
    a, c = procs.agent(), procs.agent()
    assert a.mkdir(take(mnt, 'seat=4')) == 0
    assert c.mkdir(take(mnt, 'seat=2')) == errno.ERANGE
    assert c.mkdir(take(mnt, 'seat=5')) == errno.ERANGE
    fd = c.open(flock_file(mnt, 'seat=3'))
    assert c.flock(fd, EX) == errno.ERANGE
    denied = [ln for ln in read_log(mnt.dir) if ln.event == 'denied' and ln.name == b'seat']
    assert len(denied) == 3, denied
    assert 'reason=slots-conflict' in denied[0].raw and 'has_slots=4' in denied[0].raw
    # Once every slot is free, the next first taker sets the count anew.
    assert a.rmdir(take(mnt, 'seat')) == 0
    assert c.mkdir(take(mnt, 'seat=2')) == 0


def test_rmdir_by_a_non_holder_is_eperm(mnt, procs):
    a, c = procs.agent(), procs.agent()
    assert a.mkdir(take(mnt, 'gpu=2')) == 0
    assert c.rmdir(take(mnt, 'gpu')) == errno.EPERM
    assert slot_owner(mnt, 'gpu')['held'] == 1
    assert a.rmdir(take(mnt, 'gpu')) == 0
    assert not os.path.exists(take(mnt, 'gpu'))
    assert c.rmdir(take(mnt, 'gpu')) == errno.ENOENT


def test_flock_waiters_get_free_slots_in_arrival_order(mnt, procs):
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(take(mnt, 'gpu=2')) == 0
    assert b.mkdir(take(mnt, 'gpu=2')) == 0
    ws = []
    for _ in range(4):
        w = procs.agent()
        fd = w.open(flock_file(mnt, 'gpu=2'))
        rid = w.flock_start(fd, EX)
        ws.append((w, fd, rid))
        wait_until(lambda: slot_waiters(mnt, 'gpu') == [x.pid for x, _, _ in ws],
                   what='the waiter listed')
    # A newcomer does not barge ahead of the line.
    n = procs.agent()
    assert n.mkdir(take(mnt, 'gpu=2')) == errno.EEXIST
    assert n.mkdir(take(mnt, 'gpu=3')) == errno.ERANGE  # the count first
    nfd = n.open(flock_file(mnt, 'gpu=2'))
    assert n.flock(nfd, EX | NB) == errno.EWOULDBLOCK
    assert b.rmdir(take(mnt, 'gpu')) == 0
    w0, fd0, rid0 = ws[0]
    assert 'errno' not in w0.wait(rid0, 5)
    assert [w.poll(rid) for w, _, rid in ws[1:]] == [None, None, None]
    assert a.rmdir(take(mnt, 'gpu')) == 0
    assert 'errno' not in ws[1][0].wait(ws[1][2], 5)
    assert [w.poll(rid) for w, _, rid in ws[2:]] == [None, None]
    # Each holder reads its own slot from its descriptor; they differ.
    s0 = _read_fd(w0, fd0)
    s1 = _read_fd(ws[1][0], ws[1][1])
    assert {s0, s1} == {0, 1}
    o = slot_owner(mnt, 'gpu')
    assert sorted((h['pid'], h['slot'], h['bound']) for h in o['holders']) == sorted(
        [(w0.pid, s0, 'fd'), (ws[1][0].pid, s1, 'fd')])
    # Closing the descriptor frees the slot for the next in line.
    w0.close(fd0)
    assert 'errno' not in ws[2][0].wait(ws[2][2], 5)
    assert _read_fd(ws[2][0], ws[2][1]) == s0
    assert ws[3][0].poll(ws[3][2]) is None


def _read_fd(agent, fd):
    """The slot FD's lock holds, read through FD by the agent itself (the
    answer is for that open file's lock)."""
    a = agent.call('preadfd', fd=fd)
    assert 'errno' not in a, a
    return int(bytes.fromhex(a['data']))


def test_holder_death_frees_its_slot_for_a_waiter(mnt, procs):
    a = procs.agent()
    assert a.mkdir(take(mnt, 'cam=1')) == 0
    w = procs.agent()
    fd = w.open(flock_file(mnt, 'cam=1'))
    rid = w.flock_start(fd, EX)
    wait_until(lambda: slot_waiters(mnt, 'cam') == [w.pid], what='the waiter listed')
    dead = a.pid
    a.kill()
    assert 'errno' not in w.wait(rid, 5)
    lines = [ln for ln in read_log(mnt.dir) if ln.name == b'.slot0of1:cam']
    assert [ln.event for ln in lines] == ['acquired', 'recovered', 'acquired'], lines
    assert f'pid={dead}' in lines[1].raw
    assert slot_owner(mnt, 'cam')['holders'][0]['pid'] == w.pid


def test_each_grant_has_its_own_increasing_fence(mnt, procs):
    fences = []
    for _ in range(3):
        a = procs.agent()
        assert a.mkdir(take(mnt, 'f=2')) == 0
        fences.append(slot_owner(mnt, 'f')['holders'][-1]['fence'])
        b = procs.agent()
        assert b.mkdir(take(mnt, 'f=2')) == 0
        hs = slot_owner(mnt, 'f')['holders']
        assert len({h['fence'] for h in hs}) == 2
        fences.append(max(h['fence'] for h in hs))
        assert a.rmdir(take(mnt, 'f')) == 0 and b.rmdir(take(mnt, 'f')) == 0
    assert fences == sorted(fences) and len(set(fences)) == len(fences)
    acquired = [ln for ln in read_log(mnt.dir) if ln.event == 'acquired'
                and ln.name.endswith(b':f')]
    assert len(acquired) == 6


def test_a_slug_slot_ends_with_its_lease(lockfs_factory, procs):
    m = lockfs_factory(options=('lease=1',))
    a = procs.agent(env={'LOCKFS_SLUG': 'agent-1'})
    assert a.mkdir(take(m, 'lic=1')) == 0
    assert slot_owner(m, 'lic')['holders'][0]['slot'] == 0
    w = procs.agent()
    fd = w.open(flock_file(m, 'lic=1'))
    rid = w.flock_start(fd, EX)
    # The slug holder is gone; its slot lives on until its lease ends.
    a.exit()
    assert 'errno' not in w.wait(rid, 10)
    ends = [ln for ln in read_log(m.dir) if ln.name == b'.slot0of1:lic' and ln.event == 'recovered']
    assert ends and 'lease' in ends[0].raw


def test_lockctl_run_slots_gives_each_run_its_own_stable_slot(mnt, procs, tmp_path):
    lockctl = os.path.join(LOCKFS_BUILD, 'tools', 'lockctl')
    fifo = tmp_path / 'go'
    os.mkfifo(fifo)
    runs = []
    for i in range(2):
        out = tmp_path / f'slot{i}'
        script = (f'echo "$LOCKFS_SLOT $LOCKFS_FENCE" > {out}.tmp && mv {out}.tmp {out}; '
                  f'read x < {fifo}; echo "$LOCKFS_SLOT" > {out}.end')
        # procs' processes are stopped at teardown, also when the test fails.
        runs.append((procs.popen([lockctl, '--mount', mnt.mnt, 'run', 'gpu', '--slots',
                                  '2', '--', 'sh', '-c', script]), out))
    released = False
    try:
        wait_until(lambda: all(o.exists() for _, o in runs), timeout=10,
                   what='both runs started')
        got = [o.read_text().split() for _, o in runs]
        assert sorted(int(s) for s, _ in got) == [0, 1]
        o = slot_owner(mnt, 'gpu')
        assert sorted((h['slot'], h['fence']) for h in o['holders']) == sorted(
            (int(s), int(f)) for s, f in got)
        # A third run with another count is refused at once.
        r = subprocess.run([lockctl, '--mount', mnt.mnt, 'run', 'gpu', '--slots', '3',
                            '--timeout', '0', '--', 'true'], capture_output=True, text=True,
                           timeout=10)
        assert r.returncode != 0
        with open(fifo, 'w') as f:
            f.write('x\nx\n')
        released = True
        for p, _ in runs:
            assert p.wait(10) == 0
        # The slot stayed the same for the whole run.
        assert [(tmp_path / (o.name + '.end')).read_text().strip() for _, o in runs] == \
            [g[0] for g in got]
        assert not os.path.exists(take(mnt, 'gpu'))
    finally:
        if not released:
            # Let the CMDs (blocked reading the FIFO) end with their runs.
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.write(fd, b'x\nx\n')
                os.close(fd)
            except OSError:
                pass


def test_lockctl_status_shows_every_slot_holder(mnt, procs):
    lockctl = os.path.join(LOCKFS_BUILD, 'tools', 'lockctl')
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(take(mnt, 'gpu=3')) == 0
    assert b.mkdir(take(mnt, 'gpu=3')) == 0
    assert a.mkdir(mnt.path('plain')) == 0
    r = subprocess.run([lockctl, '--mount', mnt.mnt, 'status'], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines()[1:] if ln.strip()]
    slot_rows = sorted((row[0], row[1] + ' ' + row[2], row[4]) for row in rows
                       if row[0] == 'gpu')
    assert slot_rows == [('gpu', 'slot 0/3', str(a.pid)), ('gpu', 'slot 1/3', str(b.pid))]
    assert any(row[0] == 'plain' for row in rows)
    r = subprocess.run([lockctl, '--mount', mnt.mnt, 'status', '--json'], capture_output=True,
                       text=True, timeout=10)
    views = [o for o in json.loads(r.stdout) if o.get('slots')]
    assert [(v['resource'], v['slots'], v['held']) for v in views] == [('gpu', 3, 2)]


def test_slots_outlive_a_daemon_restart_and_end_with_their_holder(lockfs_factory, procs):
    m = lockfs_factory()
    a, b = procs.agent(), procs.agent()
    assert a.mkdir(take(m, 'gpu=2')) == 0
    assert b.mkdir(take(m, 'gpu=2')) == 0
    m.unmount()
    m2 = lockfs_factory.restart(m)
    o = slot_owner(m2, 'gpu')
    assert sorted((h['slot'], h['pid']) for h in o['holders']) == [(0, a.pid), (1, b.pid)]
    c = procs.agent()
    assert c.mkdir(take(m2, 'gpu=2')) == errno.EEXIST
    assert c.mkdir(take(m2, 'gpu=5')) == errno.ERANGE
    # The new daemon watches the holders it found: a's death frees slot 0.
    a.kill()
    wait_until(lambda: [h['slot'] for h in slot_owner(m2, 'gpu')['holders']] == [1],
               what="a's slot recovered")
    assert c.mkdir(take(m2, 'gpu=2')) == 0
    assert sorted(h['slot'] for h in slot_owner(m2, 'gpu')['holders']) == [0, 1]


def test_a_slot_taken_in_a_pid_namespace_shows_it_and_ends_with_it(mnt):
    """As in a container: the holder shows its own pid there and its pid
    namespace, and its slot is recovered when the namespace's process exits."""
    if subprocess.run(['unshare', '--pid', '--fork', 'true']).returncode != 0:
        import pytest
        pytest.skip('unshare --pid does not work here')
    script = (f'mkdir {take(mnt, "gpu=2")} && cat {mnt.path(".slots", "gpu", "owner")}')
    out = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', '--kill-child',
                          'sh', '-c', script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    [h] = json.loads(out.stdout)['holders']
    assert h['slot'] == 0 and h['ns_pid'] == 1 and h['container'].startswith('pidns:'), h
    wait_until(lambda: not os.path.exists(take(mnt, 'gpu')), what='the slot recovered')
    lines = [ln for ln in read_log(mnt.dir) if ln.name == b'.slot0of2:gpu']
    assert [ln.event for ln in lines] == ['acquired', 'recovered']
    assert f'pid={h["pid"]}' in lines[1].raw
