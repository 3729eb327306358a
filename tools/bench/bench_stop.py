#!/usr/bin/python3
"""Stop time: from SIGTERM or `fusermount3 -u` to the daemon's exit.

    tools/bench/bench_stop.py [--rounds N] [--smoke] [BUILD_DIR]

For each case, starts BUILD_DIR/lockfs (default build/) on a fresh backing
dir and mount point, in the foreground (-f, a child of this script) or
detached (no -f: re-parented to init), idle or under the load of issue 8
(8 mkdir/rmdir loops and 8 forked flock takers as uid 4242,
tests/integration/wedge_load.py), stops it and measures:

- exit: until the daemon's last thread has ended, seen through a pidfd.
  Its files are closed then: DIR/.lockfs is free for the next daemon, and
  every request on the mount has been answered or aborted.
- reaped (detached only): until the pid is gone from /proc, i.e. until its
  new parent (init) has reaped the zombie.  `ps` and `kill -0` see the
  process until then; that is init's latency, not the daemon's.

Prints n, median, p90 and max per case.  --smoke runs one round of each
case and exits 1 if any exit took longer than 2 s (for CI).  Run as root.
"""
import argparse
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                                '..', 'tests', 'integration'))
from lockfs_helpers import (is_lockfs_mounted, mount_entry, rmtree_unguarded,  # noqa: E402
                            unguard)
from wedge_load import Load, task_states  # noqa: E402

SMOKE_BOUND_S = 2.0


class User:
    def __init__(self, uid):
        import pwd
        pw = pwd.getpwuid(uid)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid


def load_user():
    try:
        return User(4242)
    except KeyError:
        return None  # the load then runs as root


def wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f'bench_stop: timed out waiting for {what}')
        time.sleep(0.002)


def recorded_pid(backing):
    try:
        with open(os.path.join(backing, '.lockfs')) as f:
            return int(f.readline() or 0)
    except (OSError, ValueError):
        return 0


def one_round(lockfs, detached, trigger, loaded):
    """Returns (exit_ms, reaped_ms or None)."""
    top = tempfile.mkdtemp(prefix='lockfs-stop-')
    os.chmod(top, 0o755)
    backing, mnt = os.path.join(top, 'dir'), os.path.join(top, 'mnt')
    os.mkdir(backing, 0o700)
    os.mkdir(mnt)
    cmd = [lockfs, '-o', 'backing=' + backing, '-o', 'allow_other', mnt]
    proc = load = None
    try:
        if detached:
            subprocess.run(cmd, check=True, timeout=10)
        else:
            proc = subprocess.Popen(cmd[:1] + ['-f'] + cmd[1:])
        wait(lambda: is_lockfs_mounted(mnt) and recorded_pid(backing), 10, 'the mount')
        pid = recorded_pid(backing)
        pidfd = os.pidfd_open(pid)
        if loaded:
            witness, stop = os.path.join(top, 'witness'), os.path.join(top, 'stop')
            open(witness, 'wb').close()
            os.chmod(witness, 0o666)
            load = Load(mnt, witness, stop, load_user())
            wait(lambda: os.path.getsize(witness) > 400, 20, 'the load to run')
        t0 = time.monotonic()
        if trigger == 'SIGTERM':
            os.kill(pid, signal.SIGTERM)
        else:
            subprocess.run(['fusermount3', '-u', mnt], check=True)
        r, _, _ = select.select([pidfd], [], [], 10)
        t_exit = time.monotonic()
        os.close(pidfd)
        if not r:
            raise SystemExit(f'bench_stop: daemon {pid} did not exit within 10 s; its threads: '
                             f'{task_states(pid)}')
        reaped = None
        if detached:
            wait(lambda: not os.path.exists(f'/proc/{pid}'), 10, 'init to reap the daemon')
            reaped = (time.monotonic() - t0) * 1000.0
        return (t_exit - t0) * 1000.0, reaped
    finally:
        if load:
            load.wait_all(5)
            load.kill()
        if proc:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if mount_entry(mnt) is not None:
            subprocess.run(['fusermount3', '-uz', mnt], stderr=subprocess.DEVNULL)
        unguard(mnt)
        rmtree_unguarded(top)


CASES = [  # (detached, trigger, loaded)
    (False, 'SIGTERM', False),
    (True, 'SIGTERM', False),
    (False, 'umount', False),
    (True, 'umount', False),
    (False, 'SIGTERM', True),
    (True, 'SIGTERM', True),
]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('build', nargs='?', default='build')
    ap.add_argument('--rounds', type=int, default=20)
    ap.add_argument('--smoke', action='store_true', help='one round of each case')
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit('bench_stop: run as root (it mounts)')
    lockfs = os.path.join(a.build, 'lockfs')
    rounds = 1 if a.smoke else a.rounds
    worst = 0.0
    print(f'{"case":34s} {"n":>3s} {"exit p50":>9s} {"p90":>7s} {"max":>7s}'
          f' {"reaped p50":>11s}   (ms)')
    for detached, trigger, loaded in CASES:
        exits, reaps = [], []
        for _ in range(rounds):
            e, r = one_round(lockfs, detached, trigger, loaded)
            exits.append(e)
            if r is not None:
                reaps.append(r)
        worst = max(worst, max(exits))
        name = '%s, %s, %s' % ('detached' if detached else 'foreground',
                               'fusermount3 -u' if trigger == 'umount' else trigger,
                               'under load' if loaded else 'idle')
        print(f'{name:34s} {len(exits):3d} {statistics.median(exits):9.1f}'
              f' {pct(exits, 90):7.1f} {max(exits):7.1f}'
              f' {statistics.median(reaps) if reaps else float("nan"):11.1f}')
    if a.smoke and worst > SMOKE_BOUND_S * 1000:
        sys.exit(f'bench_stop: an exit took {worst:.0f} ms (> {SMOKE_BOUND_S} s)')


if __name__ == '__main__':
    main()
