#!/usr/bin/python3
"""What lookups of free names leave behind: the measurement of issue 19.

    tools/bench/bench_lookup_memory.py [--lookups N] [--uid UID] [--smoke] BUILD_DIR

Mounts lockfs (allow_other) on private directories, lets an ordinary user
(UID, default 65534) stat N distinct free names (default 500,000) under
M/.flock/ and then N under M/ (`stat M/NAME/owner`), each name 240 bytes,
and reports the daemon's RSS (VmRSS of /proc/PID/status) and the kernel's
fuse_inode objects (/proc/slabinfo, when readable) before and after each
round.  Nobody holds or waits for any of these names: what grows is what
a lookup of a free name leaves.  --smoke: 2,000 lookups.  Run as root.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                                '..', 'tests', 'integration'))
from lockfs_helpers import unguard  # noqa: E402

# The user's loop: N stats of distinct 240-byte names under DIR[/SUFFIX].
LOOKUPS = ('import os, sys\n'
           'top, n, suffix = sys.argv[1], int(sys.argv[2]), sys.argv[3]\n'
           'pad = "x" * 232\n'
           'found = 0\n'
           'for i in range(n):\n'
           '    p = "%s/%s%08d" % (top, pad, i)\n'
           '    try:\n'
           '        os.stat(p + suffix)\n'
           '        found += 1\n'
           '    except FileNotFoundError:\n'
           '        pass\n'
           'print(found)\n')


def rss(pid):
    with open(f'/proc/{pid}/status') as f:
        return int(next(l for l in f if l.startswith('VmRSS')).split()[1]) * 1024


def fuse_inodes():
    """Active fuse_inode objects in the kernel, or None when unreadable."""
    try:
        with open('/proc/slabinfo') as f:
            for line in f:
                if line.startswith('fuse_inode '):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def round_of(mnt, pid, uid, n, where, suffix):
    before = (rss(pid), fuse_inodes())
    t0 = time.monotonic()
    out = subprocess.run(['setpriv', f'--reuid={uid}', f'--regid={uid}', '--clear-groups',
                          '/usr/bin/python3', '-c', LOOKUPS, os.path.join(mnt, where), str(n),
                          suffix], check=True, stdout=subprocess.PIPE, text=True).stdout
    took = time.monotonic() - t0
    after = (rss(pid), fuse_inodes())
    return {'where': os.path.join('M', where, 'NAME' + suffix), 'n': n, 'found': int(out),
            'secs': took, 'rss0': before[0], 'rss1': after[0], 'slab0': before[1],
            'slab1': after[1]}


def mib(b):
    return b / (1 << 20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--lookups', type=int, default=500000)
    ap.add_argument('--uid', type=int, default=65534)
    ap.add_argument('--smoke', action='store_true')
    ap.add_argument('build')
    a = ap.parse_args()
    n = 2000 if a.smoke else a.lookups
    top = tempfile.mkdtemp(prefix='lockfs-lookup-')
    back, mnt = os.path.join(top, 'dir'), os.path.join(top, 'mnt')
    os.mkdir(back)
    os.mkdir(mnt)
    os.chmod(top, 0o755)
    d = subprocess.Popen([os.path.join(a.build, 'lockfs'), '-f', '-o', 'allow_other',
                          '-o', 'backing=' + back, mnt])
    rounds = []
    try:
        t_end = time.monotonic() + 10
        while not os.path.ismount(mnt):
            if d.poll() is not None or time.monotonic() > t_end:
                raise SystemExit('lockfs did not mount')
            time.sleep(0.01)
        rounds.append(round_of(mnt, d.pid, a.uid, n, '.flock', ''))
        rounds.append(round_of(mnt, d.pid, a.uid, n, '', '/owner'))
    finally:
        subprocess.call(['fusermount3', '-u', mnt])
        d.wait(120)
        unguard(mnt)  # the daemon made its mount point immutable
        os.rmdir(mnt)
        shutil.rmtree(back)  # its lock.log and marker
        os.rmdir(top)
    print(f'{a.build}: {n} lookups of distinct free 240-byte names by uid {a.uid}')
    for r in rounds:
        slab = ('' if r['slab0'] is None else
                f', kernel fuse_inode {r["slab0"]} -> {r["slab1"]} ({r["slab1"] - r["slab0"]:+d})')
        print(f'  {r["where"]}: {r["secs"]:.1f} s, {r["found"]} found; daemon RSS '
              f'{mib(r["rss0"]):.1f} -> {mib(r["rss1"]):.1f} MiB '
              f'({mib(r["rss1"] - r["rss0"]):+.1f} MiB){slab}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
