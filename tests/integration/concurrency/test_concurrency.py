"""Point 11: correct under concurrency; the seed's thundering herd, mechanical."""

import errno
import json
import os
import subprocess
import threading

import pytest

from lockfs_helpers import (PYTHON, assert_alternating, held_in_backing, log_for,
                            temp_dirs_in_backing)

AGENTS = 16
ROUNDS = 50

# One herd agent: wait for the gate, then ROUNDS times: poll mkdir until it
# succeeds (the seed's protocol: polling with a short sleep IS the waiting),
# check it really is the holder, append enter/exit to the witness file with
# O_APPEND, release.
HERD_AGENT = r'''
import errno, json, os, random, sys, time
path, witness, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.stdin.readline()  # the gate
fd = os.open(witness, os.O_WRONLY | os.O_APPEND)
me = os.getpid()
rng = random.Random(me)
polls = 0
for r in range(rounds):
    while True:
        try:
            os.mkdir(path)
            break
        except FileExistsError:
            polls += 1
            time.sleep(rng.uniform(0.001, 0.004))
    os.write(fd, b'enter %d\n' % me)
    with open(path + '/owner', 'rb') as f:
        holder = json.loads(f.read())['holder']['pid']
    if holder != me:
        os.write(fd, b'WRONG-HOLDER %d %d\n' % (me, holder))
    os.write(fd, b'exit %d\n' % me)
    os.rmdir(path)
print(json.dumps({'pid': me, 'polls': polls}))
'''


@pytest.mark.slow
def test_thundering_herd_has_no_overlap(mnt, tmp_path):
    witness = tmp_path / 'witness'
    witness.write_bytes(b'')
    path = mnt.path('herd')
    procs = [subprocess.Popen([PYTHON, '-c', HERD_AGENT, path, str(witness), str(ROUNDS)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd='/')
             for _ in range(AGENTS)]
    try:
        for p in procs:  # open the gate for everyone at once
            p.stdin.write(b'go\n')
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, f'agent {p.pid} failed: {err.decode()[-2000:]}'
            results.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    pids = {p.pid for p in procs}

    # the witness: strictly enter/exit pairs of one process at a time
    lines = witness.read_text().splitlines()
    assert not [l for l in lines if l.startswith('WRONG-HOLDER')], \
        'owner named another holder inside a critical section'
    assert len(lines) == 2 * AGENTS * ROUNDS
    inside = None
    for i, l in enumerate(lines):
        word, pid = l.split()
        pid = int(pid)
        assert pid in pids
        if word == 'enter':
            assert inside is None, f'line {i}: {pid} entered while {inside} was inside'
            inside = pid
        else:
            assert word == 'exit' and inside == pid, f'line {i}: {l!r} while {inside} inside'
            inside = None
    assert inside is None
    counts = {}
    for l in lines:
        if l.startswith('enter'):
            counts[l] = counts.get(l, 0) + 1
    assert sorted(counts.values()) == [ROUNDS] * AGENTS
    # the herd really contended (otherwise this proved nothing)
    assert sum(r['polls'] for r in results) > 0

    # the audit log: strictly alternating, one holder at a time, all counted
    log = log_for(mnt.dir, 'herd')
    events = assert_alternating(log, 'herd')
    assert events.count('acquired') == AGENTS * ROUNDS
    assert events.count('released') == AGENTS * ROUNDS
    for acq, rel in zip(log[0::2], log[1::2]):
        assert acq.who == rel.who, (acq, rel)
    # nothing left
    assert held_in_backing(mnt.dir) == []
    assert temp_dirs_in_backing(mnt.dir) == []
    assert 'herd' not in os.listdir(mnt.mnt)
    mnt.assert_alive()


THREADS = 8
OPS = 200
SHARED = ['shared-0', 'shared-1', 'shared-2']


@pytest.mark.slow
def test_threads_on_distinct_and_shared_names(mnt):
    errors = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def err(msg):
        with lock:
            errors.append(msg)

    def read_owner_checked(name, allow_enoent):
        try:
            with open(mnt.path(name, 'owner'), 'rb') as f:
                data = f.read()
        except FileNotFoundError:
            if not allow_enoent:
                err(f'owner of {name}: ENOENT while held')
            return
        except OSError as e:
            err(f'owner of {name}: {errno.errorcode.get(e.errno)}')
            return
        try:
            o = json.loads(data)
        except ValueError:
            err(f'owner of {name}: torn/invalid JSON {data[:200]!r}')
            return
        if o.get('resource') != name:
            err(f'owner of {name} names {o.get("resource")!r}')

    def worker(t):
        try:
            work(t)
        except Exception as e:  # e.g. ENOTCONN if the daemon died
            err(f'thread {t}: {e!r}')

    def work(t):
        start.wait()
        own = f'distinct-{t}'
        for i in range(OPS):
            k = i % 4
            if k == 0:  # own name: full cycle, no error allowed
                for op, fn in (('mkdir', os.mkdir), ('read', None), ('rmdir', os.rmdir)):
                    if fn is None:
                        read_owner_checked(own, allow_enoent=False)
                        continue
                    try:
                        fn(mnt.path(own))
                    except OSError as e:
                        err(f'{op} {own}: {errno.errorcode.get(e.errno)}')
            else:
                name = SHARED[(t + i) % len(SHARED)]
                if k == 1:
                    try:
                        os.mkdir(mnt.path(name))
                    except FileExistsError:
                        pass
                    except OSError as e:
                        err(f'mkdir {name}: {errno.errorcode.get(e.errno)}')
                elif k == 2:
                    read_owner_checked(name, allow_enoent=True)
                else:
                    try:
                        os.rmdir(mnt.path(name))
                    except FileNotFoundError:
                        pass
                    except OSError as e:
                        err(f'rmdir {name}: {errno.errorcode.get(e.errno)}')
                    os.listdir(mnt.mnt)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), 'a worker thread hung'
    assert not errors, f'{len(errors)} errors:\n' + '\n'.join(errors[:30])

    for name in SHARED:  # release what is still held (all by this process)
        try:
            os.rmdir(mnt.path(name))
        except FileNotFoundError:
            pass
    for name in SHARED + [f'distinct-{t}' for t in range(THREADS)]:
        assert_alternating(log_for(mnt.dir, name), name)
    assert held_in_backing(mnt.dir) == []
    assert temp_dirs_in_backing(mnt.dir) == []
    assert sorted(os.listdir(mnt.mnt)) == ['.flock', '.log']
    mnt.assert_alive()


CHURN_AGENT = r'''
import os, sys
path, rounds = sys.argv[1], int(sys.argv[2])
sys.stdin.readline()
n = 0
while n < rounds:
    try:
        os.mkdir(path)
    except FileExistsError:
        continue
    os.rmdir(path)
    n += 1
'''


@pytest.mark.slow
def test_owner_reads_during_churn_are_never_torn(mnt):
    """Several processes take and release one name while we read owner."""
    path = mnt.path('churn')
    procs = [subprocess.Popen([PYTHON, '-c', CHURN_AGENT, path, '200'], stdin=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd='/') for _ in range(4)]
    reads = enoent = 0
    bad = []
    try:
        for p in procs:
            p.stdin.write(b'go\n')
            p.stdin.flush()
        while any(p.poll() is None for p in procs):
            try:
                with open(os.path.join(path, 'owner'), 'rb') as f:
                    data = f.read()
            except FileNotFoundError:
                enoent += 1
                continue
            reads += 1
            try:
                o = json.loads(data)
                if o['resource'] != 'churn' or o['holder']['pid'] not in \
                        {p.pid for p in procs}:
                    bad.append(data)
            except (ValueError, KeyError, TypeError):
                bad.append(data)
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not bad, bad[:5]
    assert reads > 0
    assert_alternating(log_for(mnt.dir, 'churn'), 'churn')
    assert held_in_backing(mnt.dir) == []
