#!/usr/bin/python3
"""Restarts nobody sees (issue 22 part 3): what a client sees of a kill -9
or an upgrade of the serving process, and what the keeper costs the pair.

    tools/bench/bench_restart.py [--trials N] [--agents N] [--rounds N]
                                 [--pairs N] [--base BUILD0] [--smoke] BUILD

Mounts BUILD/lockfs detached (with its keeper) on a private tmpfs backing
dir and starts a herd of --agents client processes (default 16): half loop
mkdir/rmdir of one lock, half take flock(2) on M/.flock/NAME, each holding
for 2 ms with a witness file (O_EXCL) that proves nobody else holds it at
the same time.  Every agent times every call it makes (CLOCK_MONOTONIC,
shared by all processes).  Then --trials times (default 20) each: kill -9 of
the serving process (2.6 s apart: faster is a crash loop to the keeper),
and `lockfs --upgrade M` (a copy of BUILD/lockfs at a
path of its own, replaced by a new copy before each upgrade).

Per trial, the stall is the longest time any call took that was under way
when the event came or started before the successor served (from DIR/.lockfs);
printed: p50, p99 and max over the trials of each kind, the calls that failed
(with their errno; a mkdir's EEXIST is contention, not counted), and the overlaps the
witness saw.  The baseline: the same figure over windows of the same length
without an event.

Then the pair: the uncontended mkdir+rmdir pair (bench_pairs) on two
detached mounts of BUILD, with the keeper (default) and with -o keeper=off,
(and one of BUILD0/lockfs with --base, e.g. main's build), in alternating
order for --rounds rounds of --pairs pairs: µs per pair, the daemon's CPU
time per pair (all its threads; the machine's other load moves it less),
and the per-round ratios keeper/off and keeper/base (the goal: <= 1.03).

--smoke: 4 agents, 2 trials of each kind, 2 rounds of 200 pairs.  Run as
root.  Prints figures only; asserts no goal.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                                '..', 'tests', 'integration'))
from keeper_helpers import alive, keepers_of, recorded_pid  # noqa: E402
from lockfs_helpers import unguard  # noqa: E402

# Kill trials are spaced so that they are no crash loop to the keeper (5
# deaths within 10 s make it give up); --smoke runs only 2.
KILL_SPACING_S = 2.6

AGENT = r'''
import errno, fcntl, json, os, sys, time
kind, mnt, witness, stop, out = sys.argv[1:6]
now = time.monotonic
ops = []          # [start, end, what, errno name or ""]
overlaps = 0

def call(what, fn, *a):
    t0 = now()
    try:
        r = fn(*a)
        ops.append([t0, now(), what, ''])
        return r
    except OSError as e:
        ops.append([t0, now(), what, errno.errorcode.get(e.errno, str(e.errno))])
        raise

def hold():
    global overlaps
    try:
        fd = os.open(witness, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    except FileExistsError:
        overlaps += 1
        time.sleep(0.002)
        return
    time.sleep(0.002)
    os.unlink(witness)

path = os.path.join(mnt, 'herd') if kind == 'mkdir' else os.path.join(mnt, '.flock', 'herd')
while not os.path.exists(stop):
    try:
        if kind == 'mkdir':
            try:
                call('mkdir', os.mkdir, path)
            except FileExistsError:
                time.sleep(0.001)
                continue
            hold()
            call('rmdir', os.rmdir, path)
        else:
            fd = call('open', os.open, path, os.O_RDWR | os.O_CREAT)
            call('flock', fcntl.flock, fd, fcntl.LOCK_EX)
            hold()
            call('close', os.close, fd)
    except OSError:
        time.sleep(0.01)
with open(out, 'w') as f:
    json.dump({'ops': ops, 'overlaps': overlaps}, f)
'''


def mount(binary, top, tag, options=()):
    back, mnt = os.path.join(top, tag + '-dir'), os.path.join(top, tag + '-mnt')
    os.mkdir(back)
    os.mkdir(mnt)
    subprocess.check_call(['mount', '-t', 'tmpfs', '-o', 'size=256m,mode=0700', 'tmpfs', back])
    cmd = [binary, '-o', 'backing=' + back]
    for o in options:
        cmd += ['-o', o]
    subprocess.check_call(cmd + [mnt])
    return back, mnt


def unmount(back, mnt):
    pids = [recorded_pid(back)] + keepers_of(mnt)
    subprocess.call(['fusermount3', '-u', mnt])
    deadline = time.monotonic() + 10
    for pid in pids:
        while pid and alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
    if os.path.ismount(mnt):
        subprocess.call(['fusermount3', '-uz', mnt])
    subprocess.call(['umount', back])
    os.rmdir(back)
    unguard(mnt)
    os.rmdir(mnt)


def wait_successor(back, old, bound=10.0):
    t_end = time.monotonic() + bound
    while time.monotonic() < t_end:
        pid = recorded_pid(back)
        if pid and pid != old and alive(pid):
            return pid
        time.sleep(0.001)
    raise SystemExit(f'no successor of pid {old} within {bound} s')


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def herd(a, build, top):
    binary = os.path.join(top, 'lockfs')
    shutil.copy2(os.path.join(build, 'lockfs'), binary)
    back, mnt = mount(binary, top, 'herd')
    stop = os.path.join(top, 'stop')
    witness = {k: os.path.join(top, k + '.witness') for k in ('mkdir', 'flock')}
    agents, outs = [], []
    events = []   # (kind, t_event, t_served)
    try:
        for i in range(a.agents):
            kind = 'mkdir' if i % 2 == 0 else 'flock'
            out = os.path.join(top, f'agent{i}.json')
            outs.append(out)
            agents.append(subprocess.Popen([sys.executable, '-c', AGENT, kind, mnt,
                                            witness[kind], stop, out]))
        time.sleep(0.5)
        for kind in ('kill', 'upgrade'):
            for _ in range(a.trials):
                old = recorded_pid(back)
                if kind == 'upgrade':
                    shutil.copy2(os.path.join(build, 'lockfs'), binary + '.new')
                    os.rename(binary + '.new', binary)
                t_event = time.monotonic()
                if kind == 'kill':
                    os.kill(old, signal.SIGKILL)
                else:
                    up = subprocess.Popen([binary, '--upgrade', mnt])
                wait_successor(back, old)
                t_served = time.monotonic()
                if kind == 'upgrade' and up.wait(30) != 0:
                    raise SystemExit('lockfs --upgrade failed')
                events.append((kind, t_event, t_served))
                # The keeper gives up after 5 deaths within 10 s (a crash
                # loop): kills come no faster than that.
                time.sleep(KILL_SPACING_S if kind == 'kill' else 0.4)
        # A window of the same length without an event: the baseline.
        quiet = []
        for _ in range(a.trials):
            t0 = time.monotonic()
            time.sleep(0.05)
            quiet.append(('quiet', t0, time.monotonic()))
            time.sleep(0.35)
    finally:
        with open(stop, 'w'):
            pass
        for p in agents:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        unmount(back, mnt)
    ops, overlaps = [], 0
    for out in outs:
        try:
            with open(out) as f:
                r = json.load(f)
        except OSError:
            continue
        ops += r['ops']
        overlaps += r['overlaps']
    errors = {}
    for op in ops:
        if op[3] and not (op[2] == 'mkdir' and op[3] == 'EEXIST'):  # contention
            errors[f'{op[2]}:{op[3]}'] = errors.get(f'{op[2]}:{op[3]}', 0) + 1

    def stall(t_event, t_served):
        return max((end - start for start, end, _, _ in ops
                    if start < t_served and end > t_event), default=0.0)

    print(f'herd: {a.agents} agents (half mkdir/rmdir, half flock), {len(ops)} calls')
    for kind in ('kill', 'upgrade', 'quiet'):
        rows = events if kind != 'quiet' else quiet
        s = [stall(t0, t1) * 1000 for k, t0, t1 in rows if k == kind]
        gap = [(t1 - t0) * 1000 for k, t0, t1 in rows if k == kind]
        if not s:
            continue
        label = {'kill': 'kill -9', 'upgrade': 'upgrade', 'quiet': 'no event'}[kind]
        print(f'  {label:9s} x{len(s)}: stall ms p50 {pct(s, 50):.0f}  p99 {pct(s, 99):.0f}  '
              f'max {max(s):.0f};  until the successor served: median '
              f'{statistics.median(gap):.0f} ms')
    # Which call made the longest stall of all, for the record.
    worst = max(((end - start, what) for start, end, what, _ in ops), default=(0, '-'))
    print(f'  longest call of the run: {worst[1]} {worst[0] * 1000:.0f} ms')
    print(f'  client errors: {sum(errors.values())} {errors if errors else ""}')
    print(f'  overlaps (witness): {overlaps}')


def daemon_cpu_s(pid):
    """User + system CPU seconds of process PID, all its threads."""
    with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def pair_cost(a, build, top):
    client = os.path.join(build, 'tools', 'bench', 'bench_pairs')
    binary = os.path.join(build, 'lockfs')
    mounts = {'keeper': mount(binary, top, 'keep'),
              'off': mount(binary, top, 'off', ['keeper=off'])}
    if a.base:
        mounts['base'] = mount(os.path.join(a.base, 'lockfs'), top, 'base')
    tags = list(mounts)
    res = {t: [] for t in tags}
    cpu = {t: [] for t in tags}
    try:
        if not keepers_of(mounts['keeper'][1]):
            print('pair: no keeper started (kernel without FUSE_NOTIFY_RESEND?)')
        for r in range(a.rounds):
            for tag in tags if r % 2 == 0 else reversed(tags):
                pid = recorded_pid(mounts[tag][0])
                cpu0 = daemon_cpu_s(pid)
                out = subprocess.run([client, 'pairs', mounts[tag][1], str(a.pairs)],
                                     stdout=subprocess.PIPE, check=True).stdout
                cpu[tag].append((daemon_cpu_s(pid) - cpu0) * 1e6 / a.pairs)
                res[tag].append(float(out))
                with open(os.path.join(mounts[tag][0], 'lock.log'), 'w'):
                    pass
    finally:
        for m in mounts.values():
            unmount(*m)
    print(f'pair: {a.rounds} rounds x {a.pairs} uncontended mkdir+rmdir pairs, medians:')
    for tag in tags:
        name = {'keeper': 'keeper (default)', 'off': '-o keeper=off',
                'base': f'base {a.base}'}[tag]
        print(f'  {name:18s} {statistics.median(res[tag]):7.1f} µs per pair, daemon CPU '
              f'{statistics.median(cpu[tag]):5.1f} µs per pair')
    for other in [t for t in tags if t != 'keeper']:
        for what, d in (('µs per pair', res), ('daemon CPU', cpu)):
            ratios = [k / o for k, o in zip(d['keeper'], d[other]) if o > 0]
            if ratios:
                print(f'  keeper/{other} {what} per round: median '
                      f'{statistics.median(ratios):.3f} (min {min(ratios):.3f}, '
                      f'max {max(ratios):.3f})')


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('build')
    ap.add_argument('--trials', type=int, default=20)
    ap.add_argument('--agents', type=int, default=16)
    ap.add_argument('--rounds', type=int, default=11)
    ap.add_argument('--pairs', type=int, default=2000)
    ap.add_argument('--smoke', action='store_true')
    ap.add_argument('--no-herd', action='store_true')
    ap.add_argument('--no-pair', action='store_true')
    ap.add_argument('--base', metavar='BUILD', help='also a detached mount of BUILD/lockfs '
                    '(e.g. main\'s build) in the pair comparison')
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit('bench_restart: run as root (it mounts)')
    if a.smoke:
        a.trials, a.agents, a.rounds, a.pairs = 2, 4, 2, 200
    top = tempfile.mkdtemp(prefix='lockfs-restart-')
    os.chmod(top, 0o755)
    try:
        if not a.no_herd:
            herd(a, os.path.abspath(a.build), top)
        if not a.no_pair:
            pair_cost(a, os.path.abspath(a.build), top)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(f'load average at the end: {os.getloadavg()[0]:.1f}')


if __name__ == '__main__':
    main()
