#!/usr/bin/python3
"""Recovery latency: how long after `kill -9` of a holder is its lock free?

    tools/bench/bench_recovery.py [--rounds N] [--seed-rounds K] [--smoke] BUILD_DIR

Mounts lockfs on a private tmpfs backing dir, and for each round starts a
holder process that takes M/x with mkdir(2) and waits; kills it with
SIGKILL, then polls mkdir(M/x) every 0.1 ms until it succeeds.  Prints the
latency p50/p99/max.  Side by side, it runs the seed tool's rule -- a lock
directory is broken once its mtime is older than --stale, checked every
--poll seconds -- with the seed's fast-herd settings (stale 12 s, poll 2 s)
for K rounds (default 1; each takes ~12-14 s), and states its default
(stale 600 s).  --smoke: 5 lockfs rounds and no seed round (seconds; CI
runs it to show that the benchmark still runs, no goal asserted).  Run as
root.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def holder(path):
    """Fork a process that takes PATH and waits; return its pid once held."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.mkdir(path)
            os.write(w, b'1')
        except OSError:
            os.write(w, b'0')
        signal.pause()
        os._exit(0)
    os.close(w)
    ok = os.read(r, 1) == b'1'
    os.close(r)
    if not ok:
        raise SystemExit('holder could not take %s' % path)
    return pid


def wait_free(path, timeout):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        try:
            os.mkdir(path)
            return time.monotonic()
        except FileExistsError:
            time.sleep(0.0001)
    raise SystemExit('lock %s still held after %.0f s' % (path, timeout))


def lockfs_rounds(build, rounds):
    top = tempfile.mkdtemp(prefix='lockfs-recovery-')
    back, mnt = os.path.join(top, 'dir'), os.path.join(top, 'mnt')
    os.mkdir(back)
    os.mkdir(mnt)
    subprocess.check_call(['mount', '-t', 'tmpfs', '-o', 'size=16m,mode=0700', 'tmpfs', back])
    daemon = subprocess.Popen([os.path.join(build, 'lockfs'), '-f', '-o', 'backing=' + back, mnt])
    lat = []
    try:
        t_end = time.monotonic() + 10
        while not os.path.ismount(mnt):
            if daemon.poll() is not None or time.monotonic() > t_end:
                raise SystemExit('lockfs did not mount')
            time.sleep(0.01)
        path = os.path.join(mnt, 'x')
        for _ in range(rounds):
            pid = holder(path)
            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            t1 = wait_free(path, 10)
            lat.append((t1 - t0) * 1000.0)
            os.waitpid(pid, 0)
            os.rmdir(path)
    finally:
        subprocess.call(['fusermount3', '-u', mnt])
        daemon.wait(10)
        subprocess.call(['umount', back])
        os.rmdir(back)
        # lockfs made its mount point immutable (the guard): chattr -i
        subprocess.call(['chattr', '-i', mnt])
        os.rmdir(mnt)
        os.rmdir(top)
    return lat


def seed_rounds(rounds, stale=12.0, poll=2.0):
    """The seed tool's rule on a plain directory: break a lock whose mtime
    is older than STALE, looking every POLL seconds."""
    lat = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'x.lock')
        for _ in range(rounds):
            pid = holder(path)
            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            os.waitpid(pid, 0)
            while True:
                try:
                    os.mkdir(path)
                    break
                except FileExistsError:
                    if time.time() - os.stat(path).st_mtime > stale:
                        os.rmdir(path)
                        continue
                    time.sleep(poll)
            lat.append((time.monotonic() - t0) * 1000.0)
            os.rmdir(path)
    return lat


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('build', nargs='?', default='build')
    ap.add_argument('--rounds', type=int, default=200)
    ap.add_argument('--seed-rounds', type=int, default=1)
    ap.add_argument('--smoke', action='store_true')
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.seed_rounds = 5, 0
    if os.geteuid() != 0:
        sys.exit('bench_recovery: run as root (it mounts)')
    lat = lockfs_rounds(a.build, a.rounds)
    print('lockfs  kill -9 -> lock free: n=%d p50=%.2f ms p99=%.2f ms max=%.2f ms'
          % (len(lat), statistics.median(lat), pct(lat, 99), max(lat)))
    if a.seed_rounds:
        s = seed_rounds(a.seed_rounds)
        print('seed    (stale 12 s, poll 2 s): n=%d p50=%.0f ms max=%.0f ms'
              % (len(s), statistics.median(s), max(s)))
    print('seed    (default stale 600 s): >= 600000 ms by its rule')
    print('ratio   seed(stale 12 s) p50 / lockfs p50 = %.0fx'
          % ((statistics.median(s) if a.seed_rounds else 12000.0) / statistics.median(lat)))


if __name__ == '__main__':
    main()
