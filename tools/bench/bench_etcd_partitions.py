#!/usr/bin/python3
"""bench_etcd_partitions: the etcd backend under real partitions, Jepsen-style.

Three etcd members and three lockfs hosts, each in a network namespace of
its own (veths on a bridge in one more namespace; nothing of the machine's
network is touched), 16 agents contending for two locks (`flock` on
M/.flock/fl, `mkdir`/`rmdir` of M/mk), and a nemesis that, from a seeded
schedule, cuts a holder's host off from etcd, cuts a member off, isolates
the leader, SIGSTOPs a member past the election timeout, kills and restarts
members, and makes links slow and lossy.  Then a history checker reads every
daemon's lock.log and every agent's record and prints the faults injected,
the grants, the lost grants and sessions, the longest unavailability per
lock and every violation found (overlap among holders that were not lost,
fences not strictly increasing, a lost holder's rmdir not ESTALE, a grant
with no end, an agent that hung).  See tests/integration/partition_herd.py.

  tools/bench/bench_etcd_partitions.py [--smoke] [--seed N] [--minutes M] \\
      [--agents N] [--keep] BUILD
  tools/bench/bench_etcd_partitions.py --recheck WORKDIR

As root.  Exit 0: no violation; 1: violations (printed); 77 ("skipped"):
network namespaces, etcd or the etcd backend not available here.
--smoke: 30 s (for CI: does it still run?  Like every bench's smoke round
it asserts no goal: it exits 0 once the run and its check are done, with
any violation printed).  --seed: the schedule's seed
(default: random, printed).  --keep: leave the work directory (logs,
agents' records) for a look; it is printed.  --recheck: run the checker
again over a kept WORKDIR and print its report.
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'tests', 'integration'))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'tests', 'fixtures'))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--smoke', action='store_true')
    ap.add_argument('--seed', type=int)
    ap.add_argument('--minutes', type=float, default=10.0)
    ap.add_argument('--agents', type=int, default=16)
    ap.add_argument('--keep', action='store_true')
    ap.add_argument('--recheck', metavar='WORKDIR')
    ap.add_argument('build', nargs='?')
    a = ap.parse_args()
    if a.recheck:
        from partition_herd import recheck
        report = recheck(a.recheck)
        print(report.text())
        sys.exit(1 if report.violations else 0)
    if not a.build:
        ap.error('BUILD is needed')
    if os.geteuid() != 0:
        sys.exit('bench_etcd_partitions: must run as root (namespaces, mounts)')
    os.environ.setdefault('LOCKFS_BUILD', os.path.abspath(a.build))
    from netns_helpers import netns_missing
    from partition_herd import run_partition_herd
    why = netns_missing()
    if why:
        print(f'SKIP: bench_etcd_partitions: {why}')
        sys.exit(77)
    lockfs = os.path.join(os.path.abspath(a.build), 'lockfs')
    probe = subprocess.run([lockfs, '--help'], capture_output=True, text=True)
    if 'etcd' not in probe.stdout + probe.stderr:
        print('SKIP: bench_etcd_partitions: this lockfs has no etcd backend')
        sys.exit(77)
    seconds = 30.0 if a.smoke else a.minutes * 60
    if seconds < 20 or a.agents < 2:
        sys.exit('bench_etcd_partitions: at least 20 s and 2 agents')
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1, 2**31)
    work = tempfile.mkdtemp(prefix='lockfs-partitions-', dir='/var/tmp')
    os.chmod(work, 0o755)
    print(f'bench_etcd_partitions: seed {seed}; rerun with --seed {seed}'
          + (' --smoke' if a.smoke else f' --minutes {a.minutes:g}') + f'; work dir {work}',
          flush=True)
    ok = done = False
    try:
        report = run_partition_herd(work, lockfs, seed, seconds, agents=a.agents,
                                    log=lambda s: print(s, flush=True))
        print(report.text())
        done, ok = True, not report.violations
    finally:
        if a.keep or not (ok or (a.smoke and done)):
            print(f'bench_etcd_partitions: logs and records left in {work}')
        else:
            # never into a mount left behind
            subprocess.run(['rm', '-rf', '--one-file-system', work], check=False)
    sys.exit(0 if ok or a.smoke else 1)


if __name__ == '__main__':
    main()
