#!/usr/bin/python3
"""Two lockfs builds side by side: the uncontended acquire+release pair.

    tools/bench_compare.py [--rounds N] [--pairs N] [--smoke] BASE_BUILD NEW_BUILD

Mounts BASE_BUILD/lockfs and NEW_BUILD/lockfs at once, each on its own
private tmpfs backing dir, and runs BASE_BUILD/tools/bench_pairs (mkdir +
rmdir of one name, mean microseconds per pair) on each in turn, round by
round, alternating which goes first.  Prints the median and minimum per
build and the median of the per-round ratios NEW/BASE: the figure for "the
cost of a change on the uncontended pair".  --smoke: one round of 200 pairs
(seconds), to check that the script works.  Run as root; everything it
mounts or starts is undone on exit.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


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
        ratios = []
        for r in range(a.rounds):
            got = {}
            for k in (['base', 'new'] if r % 2 == 0 else ['new', 'base']):
                out = subprocess.run([client, 'pairs', os.path.join(root, k + '-mnt'),
                                      str(a.pairs)], capture_output=True, text=True, check=True)
                got[k] = float(out.stdout.split()[0])
                us[k].append(got[k])
            ratios.append(got['new'] / got['base'])
        print(f'{a.rounds} rounds x {a.pairs} pairs, us per pair:')
        for k in builds:
            print(f'  {k:4} {builds[k]}: median {statistics.median(us[k]):.1f}, '
                  f'min {min(us[k]):.1f}, max {max(us[k]):.1f}')
        print(f'  new/base, round by round: median {statistics.median(ratios):.3f} '
              f'(min {min(ratios):.3f}, max {max(ratios):.3f})')
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
        shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    main()
