#!/usr/bin/python3
"""bench_etcd_history: does a lock get slower the more often it is taken?

etcd keeps every key ever made in its index until a compaction (which is
off by default), and a try-lock's compare over the lock's key range walks
all of them.  This mounts lockfs on the etcd backend (one daemon per build,
each on a prefix of its own, one etcd) and takes ONE name over and over:
ROUNDS rounds of PAIRS mkdir+rmdir pairs, builds interleaved round by round.
Printed per round: the mean pair in µs for each build, and how many times
the name had been taken before the round.  A daemon that writes a fresh key
per acquire gets slower round after round; one that writes its freed key
again (docs/etcd.md, "A daemon writes the same key again") stays flat.

  tools/bench/bench_etcd_history.py [--smoke] [--rounds R] [--pairs N] \\
      [--base OLD_BUILD] BUILD

As root.  Starts its own etcd on free 127.0.0.1 ports (it runs itself again
under tests/fixtures/etcd_fixtures.py exec) unless LOCKFS_ETCD_ENDPOINTS
names one.  Exit 77 ("skipped") without etcd, or with a lockfs built without
the etcd backend.
--smoke: 2 rounds of 50 pairs (for CI: does it still run?).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time


def is_mounted(path):
    with open('/proc/self/mountinfo') as f:
        return any(line.split()[4] == path for line in f)


def mount(work, label, build, endpoints):
    mnt = os.path.join(work, label)
    backing = mnt + '.backing'
    os.mkdir(mnt)
    os.mkdir(backing, 0o700)
    err = open(mnt + '.err', 'wb')
    proc = subprocess.Popen(
        [os.path.join(build, 'lockfs'), '-f', '-o', f'backing={backing}', '-o', 'backend=etcd',
         '-o', f'etcd={endpoints}', '-o', f'host={label}', '-o', f'prefix=/history-{label}-{os.getpid()}/',
         '-o', 'ttl=10', mnt], stdout=subprocess.DEVNULL, stderr=err)
    err.close()
    deadline = time.monotonic() + 10
    while not is_mounted(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(mnt + '.err') as f:
                err = f.read().strip()
            if 'etcd support not built' in err:
                print(f'SKIP: bench_etcd_history: this lockfs has no etcd backend: {err}')
                sys.exit(77)
            sys.exit(f'bench_etcd_history: lockfs ({label}) did not mount: {err}')
        time.sleep(0.05)
    return mnt, proc


def unmount(mnt, proc):
    subprocess.run(['fusermount3', '-u', mnt], check=False)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()      # by PID: the daemon this script started
        proc.wait()
    subprocess.run(['chattr', '-i', mnt], check=False, stderr=subprocess.DEVNULL)


def pairs(mnt, n):
    path = os.path.join(mnt, 'history')
    t0 = time.perf_counter()
    for _ in range(n):
        os.mkdir(path)
        os.rmdir(path)
    return (time.perf_counter() - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--smoke', action='store_true')
    ap.add_argument('--rounds', type=int, default=8)
    ap.add_argument('--pairs', type=int, default=500)
    ap.add_argument('--base', help='another build directory, measured alongside')
    ap.add_argument('build')
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.pairs = 2, 50
    if a.rounds < 1 or a.pairs < 1:
        sys.exit('bench_etcd_history: --rounds and --pairs must be at least 1')
    if os.geteuid() != 0:
        sys.exit('bench_etcd_history: must run as root (it mounts lockfs)')
    endpoints = os.environ.get('LOCKFS_ETCD_ENDPOINTS')
    if not endpoints:
        # Start etcd and run again inside (exit 77 there without etcd).
        fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..',
                                'tests', 'fixtures', 'etcd_fixtures.py')
        os.execv('/usr/bin/python3', ['/usr/bin/python3', fixtures, 'exec', '--',
                                      os.path.abspath(__file__)] + sys.argv[1:])
    builds = [('new', a.build)] + ([('base', a.base)] if a.base else [])
    work = tempfile.mkdtemp(prefix='lockfs-history-', dir='/var/tmp')
    os.chmod(work, 0o700)
    mounts = []
    try:
        for label, build in builds:
            mounts.append((label,) + mount(work, label, build, endpoints))
        print(f'bench_etcd_history: {a.rounds} rounds x {a.pairs} pairs of one name; '
              f'builds: ' + ', '.join(f'{l} {b}' for l, b in builds))
        print('round  taken before  ' + '  '.join(f'{l:>8} µs' for l, _ in builds))
        rows = []
        for r in range(a.rounds):
            row = {}
            order = mounts if r % 2 == 0 else mounts[::-1]
            for label, mnt, _ in order:
                row[label] = pairs(mnt, a.pairs)
            rows.append(row)
            print(f'{r + 1:5}  {r * a.pairs:12}  ' +
                  '  '.join(f'{row[l]:11.0f}' for l, _ in builds), flush=True)
        for label, _ in builds:
            print(f'{label}: last round / first round = {rows[-1][label] / rows[0][label]:.2f}')
    finally:
        for label, mnt, proc in mounts:
            unmount(mnt, proc)
        for entry in os.listdir(work):
            p = os.path.join(work, entry)
            if os.path.isdir(p) and not is_mounted(p):
                subprocess.run(['rm', '-rf', '--one-file-system', p], check=False)
            elif os.path.isfile(p):
                os.unlink(p)
        os.rmdir(work)


if __name__ == '__main__':
    main()
