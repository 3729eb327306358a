#!/usr/bin/python3
"""Deadlock detection: how soon does the wait that closes a cycle get EDEADLK,
and does a crowd taking locks in random order ever deadlock for long?

    tools/bench/bench_deadlock.py [--rounds N] [--length K] [--background G]
                                  [--agents A] [--locks L] [--seconds S]
                                  [--smoke] BUILD_DIR

Mounts lockfs (BUILD_DIR/lockfs) on a private tmpfs backing dir, then:

1. Latency, N rounds (default 500) of a cycle of K processes (default 2),
   all siblings: the closer holds L0 with flock(2); worker i (1..K-1) holds
   Li and waits for L(i-1) (each seen in M/L(i-1)/waiters before the next
   starts); then the closer asks for L(K-1) -- the request that closes the
   cycle -- and the time from the call to its EDEADLK answer is one sample.  Side by
   side, the same call with LOCK_NB on a held lock (EWOULDBLOCK: the same
   round trip through FUSE, no check).  With --background G, G more
   processes are parked on a lock of an unrelated holder the whole time:
   the graph every check walks holds G + K - 1 waits.
2. Random agents (default 32 agents, 8 locks, 300 s): each agent in a loop
   picks two different locks A and B at random, flock(A), holds 0-2 ms,
   flock(B), holds 0-2 ms, releases both; an EDEADLK on B releases A and
   goes on.  Every agent records what it held and waited for, and when
   (CLOCK_MONOTONIC).  Afterwards: every EDEADLK is checked against the
   daemon's `deadlock` line (same count, the agent is hop 1) and against
   the other agents' own records (each hop of the logged cycle held the
   lock before it and waited for its own during the refused wait); and
   the cycles of the wait-for graph are rebuilt from the records
   (standing_cycles()): how long each stood, none 1 s or more.  A wait that is not answered within
   --stuck seconds (default 10) is given up (SIGALRM) and counted as stuck.

--smoke: 20 latency rounds and 3 s of 8 agents (CI: the benchmark runs, no
goal asserted).  Run as root.  Exit status 1 when a check of part 2 fails.

random_agents() is also the suite's randomized test
(tests/integration/flock/test_deadlock_random.py), on the test's own mount.
"""
import argparse
import errno
import fcntl
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'lib'))
import tmpfs_mount  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def fpath(mnt, name):
    return os.path.join(mnt, '.flock', name)


def waiter_pids(mnt, name):
    try:
        with open(os.path.join(mnt, name, 'waiters')) as f:
            return [json.loads(l)['pid'] for l in f.read().splitlines()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def wait_listed(mnt, name, pid, timeout=10.0):
    t_end = time.monotonic() + timeout
    while pid not in waiter_pids(mnt, name):
        if time.monotonic() > t_end:
            raise SystemExit('pid %d never listed in %s/waiters' % (pid, name))
        time.sleep(0.0002)


def child(fn):
    """Fork a child running FN(); returns (pid, read end of its pipe,
    write end of the pipe to it)."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r1)
        os.close(w2)
        try:
            fn(r2, w1)
        finally:
            os._exit(0)
    os.close(w1)
    os.close(r2)
    return pid, r1, w2


# -- part 1: latency ----------------------------------------------------------

def chain_worker(mnt, hold, want):
    """Each 'g' from the pipe: take HOLD, say 'h', wait for WANT; once
    granted release both and say 'd'.  'q' ends."""
    def run(rd, wr):
        fh = os.open(fpath(mnt, hold), os.O_RDWR | os.O_CREAT)
        fw = os.open(fpath(mnt, want), os.O_RDWR | os.O_CREAT)
        while True:
            c = os.read(rd, 1)
            if c != b'g':
                return
            fcntl.flock(fh, fcntl.LOCK_EX)
            os.write(wr, b'h')
            fcntl.flock(fw, fcntl.LOCK_EX)
            fcntl.flock(fw, fcntl.LOCK_UN)
            fcntl.flock(fh, fcntl.LOCK_UN)
            os.write(wr, b'd')
    return run


def background_waiter(mnt, name):
    def run(rd, wr):
        fd = os.open(fpath(mnt, name), os.O_RDWR | os.O_CREAT)
        os.write(wr, b'r')
        fcntl.flock(fd, fcntl.LOCK_EX)  # until the holder goes
        os.read(rd, 1)
    return run


def bg_holder(mnt, name):
    def run(rd, wr):
        fd = os.open(fpath(mnt, name), os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(wr, b'h')
        os.read(rd, 1)
    return run


def closer(mnt, hold, ask):
    """The process that closes the cycle: 'g' takes HOLD and says 'h'; 'c'
    asks for ASK with LOCK_NB (the round trip without a check), then
    blocking (the wait that closes the cycle), writes the two times in ms
    as a line, and lets HOLD go.  A sibling of the others: no process of
    the cycle descends from another (the process-tree rule would make a
    child of a holder count as that holder)."""
    def run(rd, wr):
        fh = os.open(fpath(mnt, hold), os.O_RDWR | os.O_CREAT)
        fa = os.open(fpath(mnt, ask), os.O_RDWR | os.O_CREAT)
        while True:
            c = os.read(rd, 1)
            if c == b'g':
                fcntl.flock(fh, fcntl.LOCK_EX)
                os.write(wr, b'h')
                continue
            if c != b'c':
                return
            t0 = time.perf_counter()
            try:
                fcntl.flock(fa, fcntl.LOCK_EX | fcntl.LOCK_NB)
                nb = -1.0  # granted: no cycle to measure
            except BlockingIOError:
                nb = (time.perf_counter() - t0) * 1000.0
            t0 = time.perf_counter()
            try:
                fcntl.flock(fa, fcntl.LOCK_EX)
                dl = -1.0
                fcntl.flock(fa, fcntl.LOCK_UN)
            except OSError as e:
                dl = (time.perf_counter() - t0) * 1000.0 if e.errno == errno.EDEADLK else -2.0
            fcntl.flock(fh, fcntl.LOCK_UN)
            os.write(wr, ('%f %f\n' % (nb, dl)).encode())
    return run


def latency(mnt, rounds, length, background):
    """Part 1: ROUNDS cycles of LENGTH processes; ([EDEADLK ms], [LOCK_NB ms])."""
    names = ['L%d' % i for i in range(length)]
    kids = []
    bg = []
    try:
        if background:
            h = child(bg_holder(mnt, 'bg'))
            bg.append(h)
            assert os.read(h[1], 1) == b'h'
            for _ in range(background):
                w = child(background_waiter(mnt, 'bg'))
                bg.append(w)
                assert os.read(w[1], 1) == b'r'
                wait_listed(mnt, 'bg', w[0])
        last = child(closer(mnt, names[0], names[-1]))
        for i in range(1, length):
            kids.append(child(chain_worker(mnt, names[i], names[i - 1])))
        dl, nb = [], []
        for _ in range(rounds):
            os.write(last[2], b'g')
            assert os.read(last[1], 1) == b'h'
            for i, (pid, rd, wr) in enumerate(kids):
                os.write(wr, b'g')
                assert os.read(rd, 1) == b'h'
                wait_listed(mnt, names[i], pid)
            os.write(last[2], b'c')
            line = b''
            while not line.endswith(b'\n'):
                line += os.read(last[1], 64)
            t_nb, t_dl = (float(x) for x in line.split())
            if t_nb < 0 or t_dl < 0:
                raise SystemExit('round %d: LOCK_NB %s, the closing wait %s'
                                 % (len(dl), 'granted' if t_nb < 0 else 'refused',
                                    'granted' if t_dl == -1.0 else 'not refused with EDEADLK'
                                    if t_dl < 0 else 'EDEADLK'))
            nb.append(t_nb)
            dl.append(t_dl)
            for pid, rd, wr in kids:
                assert os.read(rd, 1) == b'd'
        kids.append(last)
        return dl, nb
    finally:
        for pid, rd, wr in kids + bg:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rd)
            os.close(wr)


# -- part 2: random agents ------------------------------------------------------

class _Stuck(Exception):
    pass


def _alarm(signum, frame):
    raise _Stuck()


def _agent(mnt, locks, seconds, seed, out_path, stuck_s):
    """One agent's loop (in a forked child); records go to OUT_PATH as JSON
    lines: a, b, ta0 (asked A), ta1 (got A), tb0 (asked B), tb1 (answer),
    rel (released both), r ('ok', 'edeadlk', 'stuck' or an errno name)."""
    recs = []
    try:
        _agent_loop(mnt, locks, seconds, seed, stuck_s, recs)
    except BaseException as e:  # recorded: the check reports it
        recs.append({'r': 'crashed: %r' % (e,), 'tb0': None})
    finally:
        with open(out_path, 'w') as f:
            for r in recs:
                f.write(json.dumps(r) + '\n')


def _agent_loop(mnt, locks, seconds, seed, stuck_s, recs):
    rng = random.Random(seed)
    signal.signal(signal.SIGALRM, _alarm)
    fds = {n: os.open(fpath(mnt, n), os.O_RDWR | os.O_CREAT) for n in locks}
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        a, b = rng.sample(locks, 2)
        rec = {'a': a, 'b': b, 'ta0': time.monotonic()}
        try:
            signal.setitimer(signal.ITIMER_REAL, stuck_s)
            fcntl.flock(fds[a], fcntl.LOCK_EX)
            signal.setitimer(signal.ITIMER_REAL, 0)
        except _Stuck:
            rec.update(r='stuck-a', tb0=None)
            recs.append(rec)
            break
        rec['ta1'] = time.monotonic()
        time.sleep(rng.random() * 0.002)
        rec['tb0'] = time.monotonic()
        try:
            signal.setitimer(signal.ITIMER_REAL, stuck_s)
            fcntl.flock(fds[b], fcntl.LOCK_EX)
            signal.setitimer(signal.ITIMER_REAL, 0)
            rec['tb1'] = time.monotonic()
            rec['r'] = 'ok'
            time.sleep(rng.random() * 0.002)
            rec['rel0'] = time.monotonic()
            fcntl.flock(fds[b], fcntl.LOCK_UN)
        except _Stuck:
            rec['tb1'] = time.monotonic()
            rec['r'] = 'stuck'
            rec['rel0'] = rec['tb1']
        except OSError as e:
            signal.setitimer(signal.ITIMER_REAL, 0)
            rec['tb1'] = time.monotonic()
            rec['r'] = 'edeadlk' if e.errno == errno.EDEADLK else errno.errorcode.get(e.errno)
            rec['rel0'] = rec['tb1']
        rec['rela0'] = time.monotonic()
        fcntl.flock(fds[a], fcntl.LOCK_UN)
        rec['rel'] = time.monotonic()
        recs.append(rec)
        if rec['r'] == 'stuck':
            break


def _deadlock_lines(backing):
    """The `deadlock` lines of BACKING/lock.log: [(pid, [(pid, wait, heldby)])]."""
    out = []
    # the rotated files too (lock.log.N is the oldest), then lock.log
    rotated = sorted((int(n.rsplit('.', 1)[1]) for n in os.listdir(backing)
                      if re.fullmatch(r'lock\.log\.\d+', n)), reverse=True)
    for path in ['lock.log.%d' % k for k in rotated] + ['lock.log']:
        out += _deadlock_lines_of(os.path.join(backing, path))
    return out


def _deadlock_lines_of(path):
    out = []
    with open(path, errors='surrogateescape') as f:
        for line in f:
            fields = line.rstrip('\n').split(' ')
            if fields[-1] != 'deadlock':
                continue
            d = dict(x.split('=', 1) for x in fields[3:-1])
            hops = []
            for i in range(1, int(d['cycle']) + 1):
                hops.append((int(d['pid%d' % i]), d['wait%d' % i], int(d['heldby%d' % i])))
            out.append((int(d['pid']), hops))
    return out


def standing_cycles(recs):
    """How long each cycle of the agents' wait-for graph stood, in ms,
    from their records (RECS: {pid: [record]}).  A hold is taken from when
    flock returned to just before the unlock (within the real one: two
    holds of one lock never overlap), a wait from just before the call to
    when its answer was back (around the real one).  A cycle can only begin
    when an edge appears, so each start is followed from its agent; it ends
    with the first of its edges."""
    ev = []
    for pid, rs in recs.items():
        for r in rs:
            if r.get('ta1') is None:
                continue
            ev.append((r['ta1'], 1, 'h', pid, r['a']))
            ev.append((r['rela0'], 0, 'h', pid, r['a']))
            ev.append((r['tb0'], 1, 'w', pid, r['b']))
            ev.append((r['tb1'], 0, 'w', pid, r['b']))
            if r['r'] == 'ok':
                ev.append((r['tb1'], 1, 'h', pid, r['b']))
                ev.append((r['rel0'], 0, 'h', pid, r['b']))
    ev.sort(key=lambda e: (e[0], e[1]))
    holder, waits = {}, {}
    active, durations = [], []
    for t, start, kind, pid, name in ev:
        edge = (kind, pid, name)
        if not start:
            if kind == 'h' and holder.get(name) == pid:
                del holder[name]
            elif kind == 'w' and waits.get(pid) == name:
                del waits[pid]
            keep = []
            for t0, edges in active:
                if edge in edges:
                    durations.append((t - t0) * 1000.0)
                else:
                    keep.append((t0, edges))
            active = keep
            continue
        if kind == 'h':
            holder[name] = pid
        else:
            waits[pid] = name
        # follow the chain from the agent the new edge touches
        edges, cur = set(), pid
        for _ in range(len(recs) + 1):
            n = waits.get(cur)
            if n is None or n not in holder:
                break
            edges.add(('w', cur, n))
            edges.add(('h', holder[n], n))
            cur = holder[n]
            if cur == pid:
                active.append((t, frozenset(edges)))
                break
    end = ev[-1][0] if ev else 0.0
    durations += [(end - t0) * 1000.0 for t0, _ in active]
    return durations


def _overlaps(lo, hi, lo2, hi2):
    return lo <= hi2 and lo2 <= hi


def random_agents(mnt, backing, agents=32, nlocks=8, seconds=300.0, stuck_s=10.0, seed=None):
    """Run the agents on mount MNT (backing dir BACKING) and check them.
    Returns a dict of figures and a list of problems (empty: all good)."""
    locks = ['r%d' % i for i in range(nlocks)]
    seed = random.randrange(1 << 30) if seed is None else seed
    tmp = tempfile.mkdtemp(prefix='lockfs-dl-agents-')
    pids = {}
    for i in range(agents):
        path = os.path.join(tmp, 'agent%d.json' % i)
        pid = os.fork()
        if pid == 0:
            try:
                _agent(mnt, locks, seconds, seed * 1000 + i, path, stuck_s)
            finally:
                os._exit(0)
        pids[pid] = path
    deadline = time.monotonic() + seconds + stuck_s + 30
    left = set(pids)
    while left and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid in left:
            left.discard(pid)
        elif pid == 0:
            time.sleep(0.05)
    problems = []
    for pid in left:
        problems.append('agent %d did not finish' % pid)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    recs = {}
    for pid, path in pids.items():
        try:
            with open(path) as f:
                recs[pid] = [json.loads(l) for l in f]
            os.unlink(path)
        except FileNotFoundError:
            recs[pid] = []
    os.rmdir(tmp)
    every = [r for rs in recs.values() for r in rs]
    dls = [(pid, r) for pid, rs in recs.items() for r in rs if r['r'] == 'edeadlk']
    stuck = [r for r in every if r['r'].startswith('stuck')]
    other = [r for r in every if r['r'] not in ('ok', 'edeadlk') and not r['r'].startswith('stuck')]
    waits = [(r['tb1'] - r['tb0']) * 1000.0 for r in every if r.get('tb1') is not None]
    missing = [pid for pid, rs in recs.items() if not rs]
    if missing:
        problems.append('agents without records: %s' % missing)
    lines = [x for x in _deadlock_lines(backing) if x[0] in recs]  # not part 1's
    if stuck:
        problems.append('%d waits were never answered within %.0f s (a cycle stood)'
                        % (len(stuck), stuck_s))
    if other:
        problems.append('unexpected answers: %s' % sorted({r['r'] for r in other}))
    if len(lines) != len(dls):
        problems.append('%d EDEADLK answers but %d deadlock lines' % (len(dls), len(lines)))
    # Each EDEADLK against the log's line for it and the agents' records.
    by_pid = {}
    for pid, hops in lines:
        by_pid.setdefault(pid, []).append(hops)
    unreal = 0
    for pid, r in dls:
        cands = by_pid.get(pid) or []
        if not cands:
            problems.append('agent %d: EDEADLK without a deadlock line' % pid)
            continue
        ok_any = False
        for hops in cands:
            if hops[0][:2] != (pid, r['b']) or hops[-1][2] != pid or hops[-1][1] != r['a']:
                continue
            lo, hi = r['tb0'], r['tb1']
            good = True
            for j in range(1, len(hops)):
                q, wait, _ = hops[j]
                held = hops[j - 1][1]
                if hops[j - 1][2] != q:
                    good = False  # no process trees here: the holder is the waiter
                    break
                if not any(x['a'] == held and x['b'] == wait and
                           _overlaps(x['ta0'], x['rel'], lo, hi) and
                           _overlaps(x['tb0'], x['tb1'], lo, hi)
                           for x in recs.get(q, [])):
                    good = False
                    break
            if good:
                ok_any = True
                cands.remove(hops)
                break
        if not ok_any:
            unreal += 1
    if unreal:
        problems.append('%d EDEADLK not matched by a real cycle in the agents\' records'
                        % unreal)
    max_wait = max(waits) if waits else 0.0
    stood = standing_cycles(recs)
    if stood and max(stood) >= 1000.0:
        problems.append('a cycle stood %.0f ms' % max(stood))
    figures = {
        'agents': agents, 'locks': nlocks, 'seconds': seconds, 'seed': seed,
        'attempts': len(every), 'edeadlk': len(dls), 'deadlock_lines': len(lines),
        'cycle_lengths': sorted({len(h) for _, h in lines}),
        'wait_b_p50_ms': statistics.median(waits) if waits else 0.0,
        'wait_b_p99_ms': pct(waits, 99) if waits else 0.0,
        'wait_b_max_ms': max_wait,
        'cycles_seen': len(stood),
        'cycle_stood_p50_ms': statistics.median(stood) if stood else 0.0,
        'cycle_stood_p99_ms': pct(stood, 99) if stood else 0.0,
        'cycle_stood_max_ms': max(stood) if stood else 0.0,
    }
    return figures, problems


# -- the mount --------------------------------------------------------------------

def mounted(build):
    # the whole log is read afterwards: never rotated away
    return tmpfs_mount.mounted(build, ('max_waiters_per_uid=100000', 'log_max=0'),
                               prefix='lockfs-deadlock-', size='1g')


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('build', nargs='?', default='build')
    ap.add_argument('--rounds', type=int, default=500)
    ap.add_argument('--length', type=int, default=2)
    ap.add_argument('--background', type=int, default=0)
    ap.add_argument('--agents', type=int, default=32)
    ap.add_argument('--locks', type=int, default=8)
    ap.add_argument('--seconds', type=float, default=300.0)
    ap.add_argument('--stuck', type=float, default=10.0)
    ap.add_argument('--seed', type=int, default=None)
    ap.add_argument('--smoke', action='store_true')
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.agents, a.seconds = 20, 8, 3.0
    if os.geteuid() != 0:
        sys.exit('bench_deadlock: run as root (it mounts)')
    if a.length < 2:
        sys.exit('bench_deadlock: --length is at least 2')
    mnt, back, done = mounted(a.build)
    try:
        if a.rounds:
            dl, nb = latency(mnt, a.rounds, a.length, a.background)
            print('cycle of %d, %d other waits parked: EDEADLK n=%d p50=%.3f ms p99=%.3f ms '
                  'max=%.3f ms' % (a.length, a.background, len(dl), statistics.median(dl),
                                   pct(dl, 99), max(dl)))
            print('same round trip, LOCK_NB refused:  n=%d p50=%.3f ms p99=%.3f ms max=%.3f ms'
                  % (len(nb), statistics.median(nb), pct(nb, 99), max(nb)))
        status = 0
        if a.seconds > 0 and a.agents > 1:
            fig, problems = random_agents(mnt, back, a.agents, a.locks, a.seconds, a.stuck,
                                          a.seed)
            print('random agents: ' + json.dumps(fig))
            for p in problems:
                print('PROBLEM: ' + p)
            status = 1 if problems else 0
    finally:
        done()
    sys.exit(status)


if __name__ == '__main__':
    main()
