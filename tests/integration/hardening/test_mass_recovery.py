"""Issue 8 §2, "Recovery is not hostage to another user's volume".

Observed: with one user holding 50,000 locks and dying, another user's dead
holder was released 16.7 s after it died (the design bound is 100 ms).  A
mass death is recovered in bounded slices, one uid's todo after another's,
so every other recovery goes on meanwhile.  Here with 5,000 locks, and only
a generous bound: the other user's lock is free long before the mass
recovery is over.  The timing goal is measured by tools/bench/bench_mass_recovery.py.
"""

import os
import signal
import subprocess
import time

import pytest

from lockfs_helpers import PYTHON, held_in_backing, read_log, wait_free, wait_until

MASS = 5000
BOUND = 2.0  # generous: the design bound is 100 ms

# Takes N locks M/PREFIX-i in FORK processes (N/FORK each), says `held`,
# and waits.  Killing its process group kills every holder at once.
MASS_SRC = r'''
import os, sys
m, prefix, n, nproc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
per = n // nproc
r, w = os.pipe()
for p in range(nproc):
    if os.fork() == 0:
        for i in range(p * per, (p + 1) * per):
            os.mkdir(os.path.join(m, '%s-%d' % (prefix, i)))
        os.write(w, b'.')
        os.close(w)
        sys.stdin.read()
        os._exit(0)
for p in range(nproc):
    os.read(r, 1)
print('held', flush=True)
sys.stdin.read()
'''

HOLDER_SRC = r'''
import os, sys
os.mkdir(sys.argv[1])
print('held', flush=True)
sys.stdin.read()
'''


def _start(src, args, user):
    p = subprocess.Popen([PYTHON, '-c', src] + args, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, cwd='/', start_new_session=True,
                         user=user.uid, group=user.gid, extra_groups=[])
    assert p.stdout.readline() == b'held\n'
    return p


def _kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(30)


def _first_recovered(m, prefix):
    """Has any lock PREFIX-* been recovered yet (lock.log)?"""
    with open(os.path.join(m.dir, 'lock.log'), 'rb') as f:
        return any(l.endswith(b' recovered') and l.split(b' ')[2].startswith(prefix + b'-')
                   for l in f.read().split(b'\n'))


@pytest.mark.slow
@pytest.mark.parametrize('nproc', [1, 250], ids=['one-holder', '250-holders'])
def test_another_users_recovery_is_not_held_up_by_a_mass_death(lockfs_factory, users, nproc):
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=0', 'max_locks=0'))
    mass = _start(MASS_SRC, [m.mnt, 'mass', str(MASS), str(nproc)], users[0])
    other = _start(HOLDER_SRC, [m.path('other')], users[1])
    assert len(held_in_backing(m.dir)) == MASS + 1
    try:
        _kill_group(mass)
        wait_until(lambda: _first_recovered(m, b'mass'), timeout=BOUND,
                   what='the mass recovery to begin')
        t0 = time.monotonic()
        _kill_group(other)
        wait_free(m, 'other', timeout=BOUND, interval=0.0005)
        took = time.monotonic() - t0
    finally:
        _kill_group(mass)
        _kill_group(other)
    # Every one of them is recovered in the end, each with its line ...
    wait_until(lambda: not held_in_backing(m.dir), timeout=60, what='the mass recovery')
    # (a `recovered` line follows its lock's removal from DIR: let the last land)
    wait_until(lambda: len([l for l in read_log(m.dir) if l.event == 'recovered']) >= MASS + 1,
               timeout=10, what='a recovered line for every lock')
    rec = [l.name for l in read_log(m.dir) if l.event == 'recovered']
    assert len(rec) == MASS + 1 and len(set(rec)) == MASS + 1
    # ... and the other one's came while most of the mass was still to go.
    pos = rec.index(b'other')
    print(f'\nother recovered {took * 1000:.1f} ms after its death, '
          f'as recovery {pos + 1} of {MASS + 1}')
    assert pos < MASS // 2, f'the other lock waited for {pos} of the mass recoveries'
