#!/usr/bin/python3
"""Recovery latency of one lock while another user's mass death is recovered.

    tools/bench/bench_mass_recovery.py [--locks N] [--samples N] [--compare OLD_BUILD] [--smoke] BUILD

Mounts lockfs on a private tmpfs backing dir.  One process of uid 4242
takes N locks (default 50,000) and is killed with SIGKILL.  While the
daemon recovers them, processes of uid 4343 each take the lock `sample`
and are killed, one after another; each sample is the time from the kill
until `DIR/sample.lock` is gone (polled every 0.2 ms, so the poll adds no
FUSE requests).  Prints p50/p99/max of the samples and the same latency on
the idle daemon (no mass death) side by side, and how long the mass
recovery took: with the samples, and once more alone (its throughput).  --compare runs the whole thing again with another build
(an older daemon, started without the quota options it may not know).
--smoke: 2,000 locks and 10 samples (seconds).  Run as root.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                                '..', 'tests', 'integration'))
from lockfs_helpers import unguard  # noqa: E402

MASS_UID, SAMPLE_UID = 4242, 4343


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def as_uid(uid):
    def f():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return f


def holder(path, uid, n=1):
    """A process of UID holding PATH (N > 1: PATH-0..N-1); its pid once held."""
    code = ('import os, sys\n'
            'p, n = sys.argv[1], int(sys.argv[2])\n'
            'if n == 1:\n'
            '    os.mkdir(p)\n'
            'else:\n'
            '    for i in range(n): os.mkdir("%s-%d" % (p, i))\n'
            'sys.stdout.write("held\\n"); sys.stdout.flush(); sys.stdin.read()\n')
    p = subprocess.Popen(['/usr/bin/python3', '-c', code, path, str(n)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, preexec_fn=as_uid(uid))
    if p.stdout.readline() != b'held\n':
        raise SystemExit(f'holder of {path} (uid {uid}) could not take it')
    return p


def sample(mnt, back):
    """Kill a holder of M/sample; ms until DIR/sample.lock is gone."""
    p = holder(os.path.join(mnt, 'sample'), SAMPLE_UID)
    lock = os.path.join(back, 'sample.lock')
    os.kill(p.pid, signal.SIGKILL)
    t0 = time.monotonic()
    t_end = t0 + 120
    while os.path.lexists(lock):
        if time.monotonic() > t_end:
            raise SystemExit('sample lock still held after 120 s')
        time.sleep(0.0002)
    ms = (time.monotonic() - t0) * 1000.0
    p.wait()
    return ms


def left(back):
    return sum(1 for n in os.listdir(back) if n.startswith('mass-'))


def run(build, locks, samples, options):
    top = tempfile.mkdtemp(prefix='lockfs-mass-')
    os.chmod(top, 0o755)
    back, mnt = os.path.join(top, 'dir'), os.path.join(top, 'mnt')
    os.mkdir(back)
    os.mkdir(mnt)
    subprocess.check_call(['mount', '-t', 'tmpfs', '-o', 'size=2g,mode=0700', 'tmpfs', back])
    cmd = [os.path.join(build, 'lockfs'), '-f', '-o', 'backing=' + back, '-o', 'allow_other']
    for o in options:
        cmd += ['-o', o]
    daemon = subprocess.Popen(cmd + [mnt])
    res = {}
    mass = None
    try:
        t_end = time.monotonic() + 10
        while not os.path.ismount(mnt):
            if daemon.poll() is not None or time.monotonic() > t_end:
                raise SystemExit('lockfs did not mount')
            time.sleep(0.01)
        res['idle'] = [sample(mnt, back) for _ in range(samples)]
        t0 = time.monotonic()
        mass = holder(os.path.join(mnt, 'mass'), MASS_UID, locks)
        res['take_s'] = time.monotonic() - t0
        os.kill(mass.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        mass.wait()
        lat = []
        while len(lat) < samples and left(back) > 0:
            lat.append(sample(mnt, back))
        res['during'] = lat
        res['left_after_samples'] = left(back)
        while left(back) > 0:
            time.sleep(0.01)
        res['mass_s'] = time.monotonic() - t_kill
        # The same mass death again with nobody else about: throughput.
        mass = holder(os.path.join(mnt, 'mass'), MASS_UID, locks)
        os.kill(mass.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        mass.wait()
        while left(back) > 0:
            time.sleep(0.01)
        res['alone_s'] = time.monotonic() - t_kill
    finally:
        if mass and mass.poll() is None:
            mass.kill()
            mass.wait()
        subprocess.call(['fusermount3', '-u', mnt])
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        subprocess.call(['umount', back])
        os.rmdir(back)
        unguard(mnt)  # the daemon made its mount point immutable
        os.rmdir(mnt)
        os.rmdir(top)
    return res


def report(label, r, locks):
    idle, during = r['idle'], r['during']
    print(f'{label}: {locks} locks taken in {r["take_s"]:.1f} s; mass recovery took '
          f'{r["mass_s"]:.1f} s with the samples, {r["alone_s"]:.1f} s alone '
          f'({locks / r["alone_s"]:.0f} locks/s)')
    print(f'  idle daemon          n={len(idle):4d} p50={statistics.median(idle):8.2f} ms '
          f'p99={pct(idle, 99):8.2f} ms max={max(idle):8.2f} ms')
    if during:
        print(f'  during mass recovery n={len(during):4d} p50={statistics.median(during):8.2f} ms '
              f'p99={pct(during, 99):8.2f} ms max={max(during):8.2f} ms '
              f'({r["left_after_samples"]} mass locks left after the last sample)')
    else:
        print('  during mass recovery: no sample (it was over before the first)')


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('build', nargs='?', default='build')
    ap.add_argument('--locks', type=int, default=50000)
    ap.add_argument('--samples', type=int, default=300)
    ap.add_argument('--compare', metavar='OLD_BUILD')
    ap.add_argument('--compare-samples', type=int, default=5)
    ap.add_argument('--smoke', action='store_true')
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit('bench_mass_recovery: run as root (it mounts and takes other uids)')
    if a.smoke:
        a.locks, a.samples, a.compare_samples = 2000, 10, 3
    r = run(a.build, a.locks, a.samples, ['max_locks_per_uid=0', 'max_locks=0'])
    report(a.build, r, a.locks)
    if a.compare:
        o = run(a.compare, a.locks, a.compare_samples, [])
        report(a.compare, o, a.locks)
        if r['during'] and o['during']:
            print(f'ratio   p50 during, {a.compare} / {a.build} = '
                  f'{statistics.median(o["during"]) / statistics.median(r["during"]):.0f}x')


if __name__ == '__main__':
    main()
