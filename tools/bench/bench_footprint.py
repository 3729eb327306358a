#!/usr/bin/python3
"""What one held lock costs: the measurement behind the quota defaults.

    tools/bench/bench_footprint.py [--locks N] [--smoke] BUILD_DIR

Mounts lockfs on a private tmpfs backing dir (the default DIR, /run/lockfs,
is a tmpfs on systemd hosts) with the per-uid caps off, lets one process
take N locks (default 10,000) and keep them, and reports per lock: bytes
and inodes used in DIR (statvfs), daemon RSS (/proc/PID/status), and the
time of `ls -l M`.  Twice: a holder with a short command line, and one
whose command line is 4 KiB (the most a record keeps), the worst case.
--smoke: 300 locks.  Run as root.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                                '..', 'tests', 'integration'))
from lockfs_helpers import unguard  # noqa: E402

HOLD = ('import os, sys\n'
        'for i in range(int(sys.argv[2])): os.mkdir("%s/l-%06d" % (sys.argv[1], i))\n'
        'sys.stdout.write("held\\n"); sys.stdout.flush(); sys.stdin.read()\n')


def usage(back, pid):
    s = os.statvfs(back)
    with open(f'/proc/{pid}/status') as f:
        rss = int(next(l for l in f if l.startswith('VmRSS')).split()[1])
    return (s.f_blocks - s.f_bfree) * s.f_frsize, s.f_files - s.f_ffree, rss * 1024


def measure(build, n, long_cmdline):
    top = tempfile.mkdtemp(prefix='lockfs-foot-')
    back, mnt = os.path.join(top, 'dir'), os.path.join(top, 'mnt')
    os.mkdir(back)
    os.mkdir(mnt)
    subprocess.check_call(['mount', '-t', 'tmpfs', '-o', 'size=4g,mode=0700', 'tmpfs', back])
    d = subprocess.Popen([os.path.join(build, 'lockfs'), '-f', '-o', 'backing=' + back,
                          '-o', 'max_locks_per_uid=0', '-o', 'max_locks=0', mnt])
    holder = None
    try:
        t_end = time.monotonic() + 10
        while not os.path.ismount(mnt):
            if d.poll() is not None or time.monotonic() > t_end:
                raise SystemExit('lockfs did not mount')
            time.sleep(0.01)
        before = usage(back, d.pid)
        argv = ['/usr/bin/python3', '-c', HOLD, mnt, str(n)] + (['x' * 4000] if long_cmdline else [])
        t0 = time.monotonic()
        holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if holder.stdout.readline() != b'held\n':
            raise SystemExit('the holder could not take its locks')
        took = time.monotonic() - t0
        after = usage(back, d.pid)
        t0 = time.monotonic()
        subprocess.run(['ls', '-l', mnt], stdout=subprocess.DEVNULL, check=True)
        ls = time.monotonic() - t0
        rec = os.path.getsize(os.path.join(back, 'l-000000.lock', 'owner.json'))
    finally:
        if holder:
            holder.kill()
            holder.wait()
        subprocess.call(['fusermount3', '-u', mnt])
        d.wait(120)
        subprocess.call(['umount', back])
        os.rmdir(back)
        unguard(mnt)  # the daemon made its mount point immutable
        os.rmdir(mnt)
        os.rmdir(top)
    return {'bytes': (after[0] - before[0]) / n, 'inodes': (after[1] - before[1]) / n,
            'rss': (after[2] - before[2]) / n, 'ls_us': ls / n * 1e6, 'ls_s': ls,
            'mkdir_us': took / n * 1e6, 'record': rec}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('build', nargs='?', default='build')
    ap.add_argument('--locks', type=int, default=10000)
    ap.add_argument('--smoke', action='store_true')
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit('bench_footprint: run as root (it mounts)')
    n = 300 if a.smoke else a.locks
    print(f'{n} locks held by one process, DIR on tmpfs; per lock:')
    for long_cmdline in (False, True):
        r = measure(a.build, n, long_cmdline)
        print(f'  {"4 KiB" if long_cmdline else "short"} command line (record {r["record"]} B): '
              f'DIR {r["bytes"]:.0f} B, {r["inodes"]:.2f} inodes; daemon RSS '
              f'{r["rss"] / 1024:.2f} KiB; ls -l {r["ls_us"]:.0f} us ({r["ls_s"]:.2f} s in all); '
              f'mkdir {r["mkdir_us"]:.0f} us')


if __name__ == '__main__':
    main()
