#!/usr/bin/python3
"""Two lockfs builds side by side: the uncontended acquire+release pair.

    tools/bench/bench_compare.py [--rounds N] [--pairs N] [--smoke] BASE_BUILD NEW_BUILD

Mounts BASE_BUILD/lockfs and NEW_BUILD/lockfs at once, each on its own
private tmpfs backing dir, and runs BASE_BUILD/tools/bench/bench_pairs (mkdir +
rmdir of one name, mean microseconds per pair) on each in turn, round by
round, alternating which goes first.  Prints the median and minimum per
build and the median of the per-round ratios NEW/BASE: the figure for "the
cost of a change on the uncontended pair"; and the same for the daemon's own
CPU time per pair (utime + stime of all its threads, in clock ticks: coarse,
but less moved by other load than wall time).  --smoke: one round of 200 pairs
(seconds), to check that the script works.  Run as root; everything it
mounts or starts is undone on exit.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                                '..', 'tests', 'integration'))
from lockfs_helpers import rmtree_unguarded  # noqa: E402


def cpu_seconds(pid):
    """utime + stime of every thread of PID, in seconds."""
    total = 0
    for t in os.listdir(f'/proc/{pid}/task'):
        with open(f'/proc/{pid}/task/{t}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf('SC_CLK_TCK')


def mounted(path):
    with open('/proc/self/mountinfo') as f:
        return any(line.split(' ')[4] == path for line in f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--rounds', type=int, default=11)
    ap.add_argument('--pairs', type=int, default=2000)
    ap.add_argument('--smoke', action='store_true')
    ap.add_argument('base')
    ap.add_argument('new')
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.pairs = 1, 200
    if os.geteuid() != 0:
        sys.exit('bench_compare: must run as root (it mounts tmpfs and FUSE filesystems)')
    builds = {'base': a.base, 'new': a.new}
    client = os.path.join(a.base, 'tools', 'bench', 'bench_pairs')
    if not os.access(client, os.X_OK):
        # a base built before the benchmarks moved to tools/bench/
        client = os.path.join(a.base, 'tools', 'bench_pairs')
    root = tempfile.mkdtemp(prefix='lockfs-compare.', dir='/var/tmp')
    daemons, tmpfs = {}, []
    try:
        for k, b in builds.items():
            d, m = os.path.join(root, k + '-dir'), os.path.join(root, k + '-mnt')
            os.mkdir(d, 0o700)
            os.mkdir(m)
            subprocess.run(['mount', '-t', 'tmpfs', '-o', 'mode=0700', 'none', d], check=True)
            tmpfs.append(d)
            daemons[k] = subprocess.Popen([os.path.join(b, 'lockfs'), '-f', '-o', f'backing={d}',
                                           '-o', f'fence_file={root}/{k}.fence', m])
            deadline = time.monotonic() + 10
            while not mounted(m):
                if daemons[k].poll() is not None or time.monotonic() > deadline:
                    sys.exit(f'bench_compare: {b}/lockfs did not mount')
                time.sleep(0.01)
        us = {k: [] for k in builds}
        cpu = {k: [] for k in builds}
        ratios, cpu_ratios = [], []
        for r in range(a.rounds):
            got, got_cpu = {}, {}
            for k in (['base', 'new'] if r % 2 == 0 else ['new', 'base']):
                c0 = cpu_seconds(daemons[k].pid)
                out = subprocess.run([client, 'pairs', os.path.join(root, k + '-mnt'),
                                      str(a.pairs)], capture_output=True, text=True, check=True)
                got_cpu[k] = (cpu_seconds(daemons[k].pid) - c0) * 1e6 / a.pairs
                got[k] = float(out.stdout.split()[0])
                us[k].append(got[k])
                cpu[k].append(got_cpu[k])
            ratios.append(got['new'] / got['base'])
            if got_cpu['base'] > 0:
                cpu_ratios.append(got_cpu['new'] / got_cpu['base'])
        print(f'{a.rounds} rounds x {a.pairs} pairs, us per pair (wall; daemon CPU):')
        for k in builds:
            print(f'  {k:4} {builds[k]}: median {statistics.median(us[k]):.1f}, '
                  f'min {min(us[k]):.1f}, max {max(us[k]):.1f}; '
                  f'CPU median {statistics.median(cpu[k]):.1f}')
        print(f'  new/base, round by round: median {statistics.median(ratios):.3f} '
              f'(min {min(ratios):.3f}, max {max(ratios):.3f})')
        if cpu_ratios:
            print(f'  new/base daemon CPU, round by round: median '
                  f'{statistics.median(cpu_ratios):.3f} (min {min(cpu_ratios):.3f}, '
                  f'max {max(cpu_ratios):.3f})')
    finally:
        for k, p in daemons.items():
            m = os.path.join(root, k + '-mnt')
            if mounted(m):
                subprocess.run(['fusermount3', '-u', m])
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for d in tmpfs:
            subprocess.run(['umount', d])
        # lockfs made its mount points immutable once unmounted (the guard).
        rmtree_unguarded(root)


if __name__ == '__main__':
    main()
