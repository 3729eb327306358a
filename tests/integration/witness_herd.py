"""The witness herd: AGENTS processes contend for one lock through one or
more mounts (one lockfs host each), and write what they saw to a shared
witness file, so that two holders at once cannot go unnoticed.

Each agent waits for the gate, then ROUNDS times: takes the lock -- by
polling `mkdir M/NAME` (the seed's protocol, a short random sleep between
tries) or by a blocking `flock(LOCK_EX)` on `M/.flock/NAME`, alternating
round by round when the mode is `mix` -- appends `enter PID` to the witness
file (O_APPEND), reads `M/NAME/owner` and checks that it names itself (and
its host, when given), appends `exit PID` and releases.  It prints one JSON
line: its pid, how often its mkdir found the lock taken, its grants.

    results = run_herd([(m.mnt, 'h1'), ...], 'herd', witness, agents=16, rounds=20)
    check_witness(witness, results, rounds)
"""

import json
import os
import subprocess

from lockfs_helpers import PYTHON

AGENT = r'''
import errno, fcntl, json, os, random, sys, time
mnt, host, name, witness, rounds, mode, tolerant = sys.argv[1:8]
rounds, tolerant = int(rounds), tolerant == '1'
eio = 0
path = os.path.join(mnt, name)
sys.stdin.readline()  # the gate
w = os.open(witness, os.O_WRONLY | os.O_APPEND)
me = os.getpid()
rng = random.Random(me)
polls = 0
for r in range(rounds):
    by_flock = mode == 'flock' or (mode == 'mix' and r % 2 == 1)
    if by_flock:
        fd = os.open(os.path.join(mnt, '.flock', name), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    else:
        while True:
            try:
                os.mkdir(path)
                break
            except FileExistsError:
                polls += 1
                time.sleep(rng.uniform(0.001, 0.004))
            except OSError as e:
                if not (tolerant and e.errno == errno.EIO):
                    raise
                eio += 1
                time.sleep(rng.uniform(0.01, 0.04))
    os.write(w, b'enter %d\n' % me)
    with open(path + '/owner', 'rb') as f:
        rec = json.loads(f.read())
    holder = (rec.get('holder') or {}).get('pid')
    if holder != me:
        os.write(w, b'WRONG-HOLDER %d %r\n' % (me, holder))
    rec_host = rec.get('host', (rec.get('holder') or {}).get('host'))
    if host != '-' and rec_host is not None and rec_host != host:
        os.write(w, b'WRONG-HOST %d %s %s\n' % (me, host.encode(), str(rec_host).encode()))
    os.write(w, b'exit %d\n' % me)
    if by_flock:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    else:
        try:
            os.rmdir(path)
        except OSError as e:
            # EIO: the store did not answer; the daemon completes the
            # release once it does (docs/etcd.md)
            if not (tolerant and e.errno == errno.EIO):
                raise
            eio += 1
print(json.dumps({'pid': me, 'polls': polls, 'host': host, 'eio': eio}))
'''


def run_herd(mounts, name, witness, agents=16, rounds=20, mode='mkdir', timeout=240,
             tolerant=False):
    """Start AGENTS agents spread round-robin over MOUNTS ([(mountpoint,
    host or '-')]), open the gate for all at once, wait (TIMEOUT) and return
    their JSON results.  Any agent that fails fails the herd; all are
    reaped, also on error.  TOLERANT: mkdir retries on EIO, and an rmdir
    that answers EIO counts as done (the store was unavailable: a leader
    election); the results count them ('eio')."""
    with open(witness, 'wb'):
        pass
    procs = []
    try:
        for i in range(agents):
            mnt, host = mounts[i % len(mounts)]
            procs.append(subprocess.Popen(
                [PYTHON, '-c', AGENT, mnt, host, name, str(witness), str(rounds), mode,
                 '1' if tolerant else '0'],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd='/'))
        for p in procs:
            p.stdin.write(b'go\n')
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, f'agent {p.pid} failed: {err.decode()[-2000:]}'
            results.append(json.loads(out))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def check_witness(witness, results, rounds):
    """The witness file shows strictly one holder at a time, each agent
    entered ROUNDS times, and owner always named the holder (and its host)."""
    pids = {r['pid'] for r in results}
    with open(witness) as f:
        lines = f.read().splitlines()
    wrong = [l for l in lines if l.startswith('WRONG')]
    assert not wrong, f'owner named another holder inside a critical section: {wrong[:5]}'
    assert len(lines) == 2 * len(results) * rounds, f'{len(lines)} witness lines'
    inside = None
    for i, l in enumerate(lines):
        word, pid = l.split()
        pid = int(pid)
        assert pid in pids, l
        if word == 'enter':
            assert inside is None, f'witness line {i}: {pid} entered while {inside} was inside'
            inside = pid
        else:
            assert word == 'exit' and inside == pid, f'witness line {i}: {l!r} while {inside} inside'
            inside = None
    assert inside is None
    entered = {}
    for l in lines:
        if l.startswith('enter'):
            entered[l] = entered.get(l, 0) + 1
    assert sorted(entered.values()) == [rounds] * len(results)


def names_in(mnt):
    """The lock names listed in MNT (no dot entries)."""
    return sorted(n for n in os.listdir(mnt) if not n.startswith('.'))
