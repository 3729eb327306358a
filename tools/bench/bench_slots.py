#!/usr/bin/python3
"""Slots (docs/slots.md): is a slot's hand-off as fast as a lock's?

    tools/bench/bench_slots.py [--samples N] [--slots K] [--settle-us U]
                               [--etcd] [--smoke] BUILD_DIR

Mounts lockfs (BUILD_DIR/lockfs) on a private tmpfs backing dir and runs
bench_handoff's `handoff` with two columns, their samples alternating one
by one in one run (so they share the moments of a noisy machine):

- lock: flock(2) on M/.flock/L; the holder lets go (LOCK_UN) while the
  waiter, seen parked in M/L/waiters, waits: the time from the holder's
  LOCK_UN to the waiter's grant;
- slot: the same on M/.flock/.slots/S=K, while the other K-1 slots of S are
  held all along (taken by this script with mkdir M/.slots/S=K): the waiter,
  seen parked in M/.slots/S/waiters, gets the slot the holder let go.

--etcd: the same across hosts on one etcd member this script starts: two
daemons (hosts h1, h2), the holder on h1 and the waiter on h2, for both
columns (a slot waiter stands in the line of `.slotline:S` and learns of a
slot freed on h1 from etcd's watch).

Prints the median and p99 of each column in µs and the slot/lock ratios
(issue 24's goal: the slot's p99 within 1.2x the lock's).  --smoke: 30
samples (CI: the benchmark runs, no goal asserted), and, when etcd is
installed, 30 more across hosts.  Run as root.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'tests', 'fixtures'))
sys.path.insert(0, os.path.join(HERE, 'lib'))
import etcd_fixtures  # noqa: E402
from tmpfs_mount import mounted  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def measure(a, holder_mnt, waiter_mnt):
    """The two columns' samples, holder on HOLDER_MNT, waiter on WAITER_MNT."""
    top = os.path.dirname(waiter_mnt)
    links = []
    try:
        # The other slots stay held by this process for the whole run.
        for _ in range(a.slots - 1):
            os.mkdir(os.path.join(holder_mnt, '.slots', 'S=%d' % a.slots))
        req = 'S=%d' % a.slots
        # bench_handoff reads FILE=WAITER_FILE: the slot files go by
        # symbolic links without '=' in their paths.
        for i, m in enumerate((holder_mnt, waiter_mnt)):
            links.append(os.path.join(top, 'slotfile%d' % i))
            os.symlink(os.path.join(m, '.flock', '.slots', req), links[-1])
        lock_file = os.path.join(holder_mnt, '.flock', 'L')
        if waiter_mnt != holder_mnt:
            lock_file += '=' + os.path.join(waiter_mnt, '.flock', 'L')
        out = subprocess.run(
            [os.path.join(a.build, 'tools', 'bench', 'bench_handoff'), 'handoff',
             str(a.samples), str(a.settle_us),
             lock_file, os.path.join(waiter_mnt, 'L', 'waiters'),
             links[0] + '=' + links[1], os.path.join(waiter_mnt, '.slots', 'S', 'waiters')],
            capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            sys.exit('bench_slots: bench_handoff failed:\n' + out.stderr)
        rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
        return [float(r[0]) for r in rows], [float(r[1]) for r in rows]
    finally:
        for link in links:
            os.unlink(link)
        for _ in range(a.slots - 1):
            try:
                os.rmdir(os.path.join(holder_mnt, '.slots', 'S'))
            except OSError:
                break


def run_dir(a):
    mnt, _, done = mounted(a.build, prefix='lockfs-slots-')
    try:
        return measure(a, mnt, mnt)
    finally:
        done()


def run_etcd(a):
    work = tempfile.mkdtemp(prefix='lockfs-slots-etcd.', dir='/var/tmp')
    cluster = etcd_fixtures.Cluster(os.path.join(work, 'etcd'), 1)
    cluster.start()
    dones = []
    try:
        mnts = []
        for host in ('h1', 'h2'):
            mnt, _, done = mounted(a.build, ('backend=etcd', 'etcd=' + cluster.url,
                                             'host=' + host), prefix='lockfs-slots-')
            mnts.append(mnt)
            dones.append(done)
        return measure(a, mnts[0], mnts[1])
    finally:
        for done in dones:
            done()
        cluster.stop()
        subprocess.call(['rm', '-rf', work])


def report(what, a, lock, slot):
    lm, lp = statistics.median(lock), pct(lock, 99)
    sm, sp = statistics.median(slot), pct(slot, 99)
    print('%s hand-off, %d samples each, alternating; slot: 1 of %d, the other %d held'
          % (what, len(lock), a.slots, a.slots - 1))
    print('%-6s %10s %10s' % ('', 'median µs', 'p99 µs'))
    print('%-6s %10.1f %10.1f' % ('lock', lm, lp))
    print('%-6s %10.1f %10.1f' % ('slot', sm, sp))
    print('slot/lock: median %.2fx, p99 %.2fx (goal: p99 <= 1.20x)' % (sm / lm, sp / lp))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('build', nargs='?', default='build')
    ap.add_argument('--samples', type=int, default=2000)
    ap.add_argument('--slots', type=int, default=2)
    ap.add_argument('--settle-us', type=int, default=200)
    ap.add_argument('--etcd', action='store_true')
    ap.add_argument('--smoke', action='store_true')
    a = ap.parse_args()
    if a.smoke:
        a.samples = 30
    if os.geteuid() != 0:
        sys.exit('bench_slots: run as root (it mounts)')
    if not 1 <= a.slots <= 256:
        sys.exit('bench_slots: --slots is 1 to 256')
    if a.etcd and not etcd_fixtures.ETCD:
        sys.exit('bench_slots: --etcd: no etcd binary (apt-get install etcd-server)')
    if not a.etcd:
        report('one host:', a, *run_dir(a))
    if a.etcd or (a.smoke and etcd_fixtures.ETCD):
        report('across hosts (etcd):', a, *run_etcd(a))


if __name__ == '__main__':
    main()
