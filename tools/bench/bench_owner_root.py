#!/usr/bin/python3
"""What root's read of `owner` costs the daemon, two builds side by side.

    tools/bench/bench_owner_root.py [--rounds N] [--reads N] [--smoke] BUILD_A BUILD_B

Issue 22 §2 made the daemon ask which container root reads from (one
readlink of /proc/TID/ns/pid per rendering: the `stat` and the `open` of
owner each render it).  Mounts BUILD_A/lockfs and BUILD_B/lockfs, takes
one lock on each, and reads M/x/owner as root (open, read, close) --reads
times per round, alternating the builds, for --rounds rounds.  Prints the
median daemon CPU µs per read (all its threads, from /proc/PID/stat: less
moved by the machine's other load than wall time) and the wall µs per read.
--smoke: 2 rounds of 200 reads.  Run as root.
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
from lockfs_helpers import unguard  # noqa: E402


def daemon_cpu_s(pid):
    with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def mount(build, top, tag):
    back, mnt = os.path.join(top, tag + '-dir'), os.path.join(top, tag + '-mnt')
    os.mkdir(back, 0o700)
    os.mkdir(mnt)
    d = subprocess.Popen([os.path.join(build, 'lockfs'), '-f', '-o', 'backing=' + back, mnt],
                         stdin=subprocess.DEVNULL)
    t_end = time.monotonic() + 10
    while not os.path.ismount(mnt):
        if d.poll() is not None or time.monotonic() > t_end:
            raise SystemExit(f'{build}/lockfs did not mount')
        time.sleep(0.01)
    os.mkdir(os.path.join(mnt, 'x'))
    return d, mnt


def unmount(d, mnt):
    os.rmdir(os.path.join(mnt, 'x'))
    subprocess.run(['fusermount3', '-u', mnt], check=False)
    d.wait(30)
    unguard(mnt)


def one_round(d, mnt, reads):
    path = os.path.join(mnt, 'x', 'owner')
    c0, t0 = daemon_cpu_s(d.pid), time.perf_counter()
    for _ in range(reads):
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 1 << 16)
        os.close(fd)
    return ((daemon_cpu_s(d.pid) - c0) / reads * 1e6,
            (time.perf_counter() - t0) / reads * 1e6)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--rounds', type=int, default=9)
    ap.add_argument('--reads', type=int, default=4000)
    ap.add_argument('--smoke', action='store_true')
    ap.add_argument('build_a')
    ap.add_argument('build_b')
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.reads = 2, 200
    top = tempfile.mkdtemp(prefix='lockfs-owner-root-')
    daemons = {}
    try:
        for tag, build in (('A', a.build_a), ('B', a.build_b)):
            daemons[tag] = mount(build, top, tag)
        cpu = {'A': [], 'B': []}
        wall = {'A': [], 'B': []}
        for r in range(a.rounds):
            for tag in (('A', 'B') if r % 2 == 0 else ('B', 'A')):
                c, w = one_round(*daemons[tag], a.reads)
                cpu[tag].append(c)
                wall[tag].append(w)
        print(f'{a.rounds} rounds x {a.reads} reads of owner as root (median):')
        for tag, build in (('A', a.build_a), ('B', a.build_b)):
            print(f'  {tag} {build}: daemon CPU {statistics.median(cpu[tag]):.1f} µs, '
                  f'wall {statistics.median(wall[tag]):.1f} µs per read')
        print(f'load average at the end: {os.getloadavg()[0]:.1f}')
    finally:
        for d, mnt in daemons.values():
            unmount(d, mnt)
        subprocess.run(['rm', '-rf', top], check=False)


if __name__ == '__main__':
    main()
