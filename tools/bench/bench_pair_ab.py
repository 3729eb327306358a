#!/usr/bin/python3
"""The uncontended acquire+release pair, two builds side by side.

    tools/bench/bench_pair_ab.py [--rounds N] [--pairs N] [--smoke] BUILD_A BUILD_B

Mounts BUILD_A/lockfs and BUILD_B/lockfs, each on its own private tmpfs
backing dir, and runs BUILD_B/tools/bench/bench_pairs (mkdir+rmdir of one name,
the mean µs per pair over --pairs pairs) against them in alternating
order (A B, B A, ...) for --rounds rounds.  Prints the median µs of each
and the median of the per-round ratios B/A: what a change costs the pair;
and the same for each daemon's CPU time per pair (all its threads, from
/proc/PID/stat), which the machine's other load moves less, and its
voluntary context switches per pair.
--scaling N: also, every round, each build's aggregate rate with 1 and
with N clients on distinct names (2 s each), and its N-client rate over
its own 1-client rate (issue 10's "no collapse under concurrency").
--flock: the pair is flock(LOCK_EX) + flock(LOCK_UN) on one open
descriptor of M/.flock/x instead (the fd-lock path).
--smoke: 2 rounds of 200 pairs.  Run as root.
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


def mount(build, top, tag):
    back, mnt = os.path.join(top, tag + '-dir'), os.path.join(top, tag + '-mnt')
    os.mkdir(back)
    os.mkdir(mnt)
    subprocess.check_call(['mount', '-t', 'tmpfs', '-o', 'size=256m,mode=0700', 'tmpfs', back])
    d = subprocess.Popen([os.path.join(build, 'lockfs'), '-f', '-o', 'backing=' + back, mnt])
    t_end = time.monotonic() + 10
    while not os.path.ismount(mnt):
        if d.poll() is not None or time.monotonic() > t_end:
            raise SystemExit(f'{build}/lockfs did not mount')
        time.sleep(0.01)
    return d, back, mnt


def daemon_cpu_s(pid):
    """User + system CPU seconds of process PID, all its threads."""
    with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def daemon_switches(pid):
    """Voluntary context switches of process PID, all its threads."""
    n = 0
    for tid in os.listdir(f'/proc/{pid}/task'):
        try:
            with open(f'/proc/{pid}/task/{tid}/status') as f:
                for line in f:
                    if line.startswith('voluntary_ctxt_switches:'):
                        n += int(line.split()[1])
        except OSError:
            pass  # a thread that just ended
    return n


def unmount(d, back, mnt):
    subprocess.call(['fusermount3', '-u', mnt])
    try:
        d.wait(30)
    except subprocess.TimeoutExpired:
        d.kill()
        d.wait()
    subprocess.call(['umount', back])
    os.rmdir(back)
    unguard(mnt)  # the daemon made its mount point immutable
    os.rmdir(mnt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('a')
    ap.add_argument('b')
    ap.add_argument('--rounds', type=int, default=11)
    ap.add_argument('--pairs', type=int, default=2000)
    ap.add_argument('--scaling', type=int, default=0, metavar='N')
    ap.add_argument('--flock', action='store_true')
    ap.add_argument('--smoke', action='store_true')
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit('bench_pair_ab: run as root (it mounts)')
    if a.smoke:
        a.rounds, a.pairs = 2, 200
    client = os.path.join(a.b, 'tools', 'bench', 'bench_pairs')
    top = tempfile.mkdtemp(prefix='lockfs-ab-')
    mounts = {}
    res = {'a': [], 'b': []}
    cpu = {'a': [], 'b': []}
    sw = {'a': [], 'b': []}
    scale = {'a': [], 'b': []}
    try:
        for tag, build in (('a', a.a), ('b', a.b)):
            mounts[tag] = mount(build, top, tag)
        for r in range(a.rounds):
            for tag in ('a', 'b') if r % 2 == 0 else ('b', 'a'):
                cpu0 = daemon_cpu_s(mounts[tag][0].pid)
                sw0 = daemon_switches(mounts[tag][0].pid)
                what = (['flock', os.path.join(mounts[tag][2], '.flock', 'x')] if a.flock
                        else ['pairs', mounts[tag][2]])
                out = subprocess.run([client] + what + [str(a.pairs)],
                                     stdout=subprocess.PIPE, check=True).stdout
                cpu[tag].append((daemon_cpu_s(mounts[tag][0].pid) - cpu0) * 1e6 / a.pairs)
                sw[tag].append((daemon_switches(mounts[tag][0].pid) - sw0) / a.pairs)
                res[tag].append(float(out))
                if a.scaling:
                    r1, rn = (float(subprocess.run(
                        [client, 'rate', mounts[tag][2], str(n), '1' if a.smoke else '2'],
                        stdout=subprocess.PIPE, check=True).stdout) for n in (1, a.scaling))
                    scale[tag].append(rn / r1)
                with open(os.path.join(mounts[tag][1], 'lock.log'), 'w'):
                    pass  # keep the log from growing between runs
    finally:
        for m in mounts.values():
            unmount(*m)
        os.rmdir(top)
    ratios = [b / x for x, b in zip(res['a'], res['b'])]
    kind = 'flock(LOCK_EX)+flock(LOCK_UN)' if a.flock else 'mkdir+rmdir'
    print(f'{a.rounds} rounds x {a.pairs} pairs, µs per {kind} pair (median):')
    print(f'  A {a.a}: {statistics.median(res["a"]):.1f}')
    print(f'  B {a.b}: {statistics.median(res["b"]):.1f}')
    print(f'  B/A per round: median {statistics.median(ratios):.3f}, '
          f'min {min(ratios):.3f}, max {max(ratios):.3f}')
    # The client's warm-up pairs count too: slightly more than per pair.
    ratios = [b / x for x, b in zip(cpu['a'], cpu['b']) if x > 0]
    print('daemon CPU µs per pair (median):')
    print(f'  A: {statistics.median(cpu["a"]):.1f}')
    print(f'  B: {statistics.median(cpu["b"]):.1f}')
    if ratios:
        print(f'  B/A per round: median {statistics.median(ratios):.3f}, '
              f'min {min(ratios):.3f}, max {max(ratios):.3f}')
    print(f'daemon context switches per pair (median): A {statistics.median(sw["a"]):.2f}, '
          f'B {statistics.median(sw["b"]):.2f}')
    if a.scaling:
        print(f'{a.scaling}-client rate / own 1-client rate, per round (median, min, max):')
        for tag in ('a', 'b'):
            print(f'  {tag.upper()}: {statistics.median(scale[tag]):.2f} '
                  f'({min(scale[tag]):.2f}-{max(scale[tag]):.2f})')
    print(f'load average at the end: {os.getloadavg()[0]:.1f}')


if __name__ == '__main__':
    main()
