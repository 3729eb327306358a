"""A Jepsen-style run of the etcd backend (issue 23 part 3): a herd of agents
on three lockfs hosts, a nemesis injecting real network and process faults
from a seeded schedule, and a history checker.

    from partition_herd import run_partition_herd
    report = run_partition_herd(workdir, lockfs_bin, seed=7, seconds=60)
    print(report.text())
    assert report.violations == []

The cluster: etcd members e1 e2 e3 and lockfs hosts h1 h2 h3 in network
namespaces of their own (netns_helpers.Lab), daemons with `ttl=3
lock_delay=1`.  The herd: AGENTS agents spread round-robin over the hosts'
mounts, half taking lock `fl` with a blocking flock(2) on M/.flock/fl, half
taking lock `mk` by polling mkdir M/mk.  After each grant an agent reads
M/NAME/owner for the grant's fence, holds the lock a few milliseconds and
releases it (LOCK_UN and close, or rmdir); it writes every step, with its
wall-clock time and errno, to its own JSON-lines file.

The nemesis, one fault at a time with a quiet spell between (all drawn
from random.Random(SEED), so a seed gives the same schedule):
  partition-host    the host of the current holder (or a random host) cut
                    off from every member: it is on the minority side
  partition-member  one member cut off from the other members and the hosts
  isolate-leader    the current leader reaches nobody
  pause-member      SIGSTOP of a member (the leader half the time) for longer
                    than the election timeout, then SIGCONT
  kill-member       kill -9 of a member, restarted on its data after a while
  slow-lossy        a host's or member's link at 64-256 kbit/s (tbf: 50-200
                    ms per round trip under load) with 2-15 % of its incoming
                    packets dropped (iptables statistic)

The checker (check()): from the daemons' lock.log lines (acquired,
released, lost, with fence=) and the agents' records:
  overlap      no two holders at once among grants that did not end `lost`:
               history.check_history over the logs (a cross-host allowance
               for the order in which two daemons write their lines; a
               release its agent saw succeed ended when the agent asked for
               it, as Jepsen takes an operation at its invocation: the
               daemon writes `released` when etcd's answer comes), and the
               agents' own intervals [grant returned, release called], which
               lie inside the real ones and need no allowance
  fences       strictly increasing in grant order (the logs, and the order
               in which agents saw their grants)
  lost         every `lost` mkdir holder's later rmdir answers ESTALE; an
               ESTALE only for a lost grant; a lost holder told once
               (a later mkdir answering ESTALE is reported)
  ends         every grant has exactly one end line
  undone       a grant whose owner read failed (the grant was gone at once)
  hang         an agent that does not stop within STOP_GRACE of being told
  stall        a lock with no holder for more than STALL_S while agents
               wanted it (the longest fault, ttl and lock_delay fit in it)
"""

import collections
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

from history import check_history, read_histories
from lockfs_helpers import PYTHON, parse_rfc3339_ms
from netns_helpers import Lab

HOSTS = ('h1', 'h2', 'h3')
MEMBERS = ('e1', 'e2', 'e3')
NAMES = {'flock': 'fl', 'mkdir': 'mk'}
TTL = 3
LOCK_DELAY = 1
# two daemons write their lines after etcd confirmed each step: a
# `released` on one host may carry a time after the next host's `acquired`
LOG_LAG_MS = 250
STOP_GRACE = 30.0          # agents told to stop must exit within this
# No holder for longer than this while agents want the lock is a stall:
# the longest fault (8 s) + ttl + lock_delay, with room to spare.
STALL_S = 15.0
FLOCK_WAIT = 3.0           # one blocking flock call, then retry (stop check)

AGENT = r'''
import errno, fcntl, json, os, random, signal, sys, time
mnt, host, name, mode, stop_path, out_path, seed, max_rounds = sys.argv[1:9]
flock_wait, deadline = float(sys.argv[9]), float(sys.argv[10])
rng = random.Random(int(seed))
max_rounds = int(max_rounds)
max_tries = 100 * max_rounds     # attempts, counted with the failed ones
out = open(out_path, 'a', buffering=1)
me = os.getpid()

def rec(ev, **kw):
    kw.setdefault('t', time.time())
    kw.update(ev=ev, pid=me, host=host, name=name, mode=mode)
    out.write(json.dumps(kw) + '\n')

class Waited(Exception):
    pass

def on_alarm(sig, frame):
    raise Waited()
signal.signal(signal.SIGALRM, on_alarm)
path = os.path.join(mnt, name)
flock_path = os.path.join(mnt, '.flock', name)
rec('start')
rounds = tries = 0
# bounded three ways: rounds, attempts, and a deadline of its own (besides
# the stop file the runner writes)
while rounds < max_rounds and tries < max_tries and time.time() < deadline \
        and not os.path.exists(stop_path):
    tries += 1
    t0 = time.time()
    fd = None
    if mode == 'mkdir':
        try:
            os.mkdir(path)
        except OSError as e:
            if e.errno != errno.EEXIST:
                rec('acq_err', errno=e.errno)
                time.sleep(rng.uniform(0.02, 0.06))
            else:
                time.sleep(rng.uniform(0.002, 0.010))
            continue
    else:
        try:
            fd = os.open(flock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            rec('acq_err', errno=e.errno, op='open')
            time.sleep(rng.uniform(0.02, 0.06))
            continue
        try:
            signal.setitimer(signal.ITIMER_REAL, flock_wait)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except Waited:
            os.close(fd)
            continue
        except OSError as e:
            rec('acq_err', errno=e.errno, op='flock')
            os.close(fd)
            time.sleep(rng.uniform(0.02, 0.06))
            continue
    tg = time.time()
    fence, owner_err, owner_pid = None, None, None
    try:
        with open(os.path.join(path, 'owner'), 'rb') as f:
            r = json.loads(f.read())
        fence = r.get('fence')
        owner_pid = (r.get('holder') or {}).get('pid')
    except OSError as e:
        owner_err = e.errno
    except ValueError:
        owner_err = -1
    rec('grant', t=tg, t_asked=t0, t_owner=time.time(), fence=fence, owner_err=owner_err,
        owner_pid=owner_pid)
    time.sleep(rng.uniform(0.005, 0.030))
    tr = time.time()
    rc, rc_close = 0, None
    if mode == 'mkdir':
        try:
            os.rmdir(path)
        except OSError as e:
            rc = e.errno
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as e:
            rc = e.errno
        try:
            os.close(fd)
            rc_close = 0
        except OSError as e:
            rc_close = e.errno
    rec('release', t_rel=tr, fence=fence, rc=rc, rc_close=rc_close)
    rounds += 1
rec('stop', rounds=rounds)
'''


# ---------------------------------------------------------------- nemesis

KINDS = (('partition-host', 25), ('partition-member', 10), ('isolate-leader', 15),
         ('pause-member', 15), ('kill-member', 15), ('slow-lossy', 20))


def schedule(seed, seconds, quiet=(1.0, 4.0)):
    """The faults of a run: [(start_s, kind, duration_s, params)], from
    random.Random(SEED), filling SECONDS (a fault starts only if it ends
    before SECONDS - 5, so that the herd ends healed)."""
    rng = random.Random(seed)
    kinds = [k for k, _ in KINDS]
    weights = [w for _, w in KINDS]
    out, t = [], rng.uniform(*quiet)
    while True:
        kind = rng.choices(kinds, weights)[0]
        if kind == 'partition-host':
            dur, params = rng.uniform(1.0, 6.0), {'pick': rng.random()}
        elif kind == 'partition-member':
            dur, params = rng.uniform(1.0, 5.0), {'member': rng.choice(MEMBERS)}
        elif kind == 'isolate-leader':
            dur, params = rng.uniform(1.5, 5.0), {}
        elif kind == 'pause-member':
            dur, params = rng.uniform(0.8, 4.0), {'leader': rng.random() < 0.5,
                                                  'member': rng.choice(MEMBERS)}
        elif kind == 'kill-member':
            dur, params = rng.uniform(0.5, 4.0), {'leader': rng.random() < 0.3,
                                                  'member': rng.choice(MEMBERS)}
        else:
            dur, params = rng.uniform(3.0, 8.0), {
                'node': rng.choice(HOSTS + MEMBERS), 'rate_kbit': rng.choice((64, 96, 128, 192, 256)),
                'loss': round(rng.uniform(0.02, 0.15), 3)}
        if t + dur > seconds - 5:
            return out
        out.append((round(t, 3), kind, round(dur, 3), params))
        t += dur + rng.uniform(*quiet)


class Nemesis:
    """Carries out a schedule on a Lab; keeps the timeline of what was done."""

    def __init__(self, lab, cluster, daemons, log=print):
        self.lab, self.cluster, self.daemons, self.log = lab, cluster, daemons, log
        self.timeline = []          # dicts: kind, target, start, end (wall), detail
        self.errors = []

    def _holder_host(self, pick):
        """The host holding a lock now (read from owner on any mount), else
        a host chosen by PICK."""
        names = sorted(NAMES.values())
        name = names[int(pick * 1000) % len(names)]
        try:
            with open(os.path.join(self.daemons[0].mnt, name, 'owner'), 'rb') as f:
                host = (json.loads(f.read()).get('holder') or {}).get('host')
            if host in HOSTS:
                return host
        except (OSError, ValueError):
            pass
        return HOSTS[int(pick * 3) % 3]

    def _member(self, params):
        if params.get('leader'):
            m = self.cluster.leader()
            if m is not None:
                return m
        return self.cluster.member(params['member'])

    def apply(self, kind, params):
        """Inject one fault; (target, undo) where undo() ends it beyond heal()."""
        lab = self.lab
        if kind == 'partition-host':
            host = self._holder_host(params['pick'])
            lab.partition([host], MEMBERS)
            return host, None
        if kind == 'partition-member':
            m = params['member']
            lab.partition([m], [n for n in MEMBERS + HOSTS if n != m])
            return m, None
        if kind == 'isolate-leader':
            m = self.cluster.leader()
            if m is None:
                return None, None
            lab.isolate(m.name)
            return m.name, None
        if kind == 'pause-member':
            m = self._member(params)
            m.pause()
            return m.name, None
        if kind == 'kill-member':
            m = self._member(params)
            m.kill9()

            def restart():
                m.start()
                m.wait_healthy()
            return m.name, restart
        lab.slow(params['node'], params['rate_kbit'], params['loss'])
        return params['node'], None

    def run(self, plan, t0, stop_at):
        """Carry out PLAN (schedule()) from wall time T0; stop (healed) by
        STOP_AT whatever happens."""
        for start, kind, dur, params in plan:
            if time.time() >= stop_at:
                break
            delay = t0 + start - time.time()
            if delay > 0:
                time.sleep(min(delay, max(0.0, stop_at - time.time())))
            began = time.time()
            undo = None
            entry = {'kind': kind, 'start': began, 'planned': dur, 'params': params}
            try:
                entry['target'], undo = self.apply(kind, params)
            except Exception as e:   # noqa: BLE001 - logged, the run goes on healed
                self.errors.append(f'{kind}: {e}')
                entry['target'] = None
            if entry['target'] is not None:
                time.sleep(max(0.0, min(dur, stop_at - time.time())))
            try:
                self.lab.heal()
                if undo:
                    undo()
            except Exception as e:   # noqa: BLE001
                self.errors.append(f'heal after {kind}: {e}')
            entry['end'] = time.time()
            if entry['target'] is not None:
                self.timeline.append(entry)
                self.log(f'nemesis: {kind} {entry["target"]} '
                         f'{entry["end"] - began:.1f}s {params}')
        self.lab.heal()
        for m in self.cluster.members:
            if not m.alive:
                m.start()
                m.wait_healthy()

    def active_at(self, t):
        """The faults in progress at wall time T (or healed under 1 s before)."""
        return [f'{e["kind"]} {e["target"]}' for e in self.timeline
                if e['start'] <= t <= e['end'] + 1.0]


# ---------------------------------------------------------------- checker

def read_records(paths):
    recs = []
    for p in paths:
        try:
            with open(p) as f:
                for line in f:
                    if line.endswith('\n'):
                        recs.append(json.loads(line))
        except FileNotFoundError:
            pass
    return recs


def _ms(line):
    return parse_rfc3339_ms(line.timestamp)


def check(logs, recs, stderr_texts=(), hung=(), active_at=lambda t: [], run_end=None):
    """The findings of a run: a dict of counts and a list of violations,
    each a string with the log lines or records that show it (module doc)."""
    out = {'violations': [], 'notes': []}
    v = out['violations']
    # -- the logs: every end, overlap, fences (history.py); a release its
    # agent saw succeed ended when the agent asked for it (its daemon logs
    # the line when etcd's answer comes, late on a slow link)
    asked = {(r['host'], r['name'].encode(), r['fence']): r['t_rel'] for r in recs
             if r['ev'] == 'release' and r.get('fence') is not None and r['rc'] == 0}

    def let_go_at(host, line):
        return asked.get((host, line.name, int(line.details['fence'])))
    for p in check_history(logs, held=set(), cross_host_ms=LOG_LAG_MS, let_go_at=let_go_at):
        kind = ('no-end' if 'has no end' in p or 'never ended' in p else
                'overlap' if 'two holders' in p else
                'fence' if 'fence went backwards' in p or 'granted twice' in p else
                'ends' if 'ended twice' in p or 'without an acquired' in p else 'log')
        v.append(f'[{kind}] {p}')
    grants = {}                     # (name, fence) -> {'acq': (host, line), 'end': (host, line)}
    lost_sessions = 0
    for host, lines in logs.items():
        for l in lines:
            if 'fence' not in l.details:
                continue
            key = (l.name.decode(), int(l.details['fence']))
            g = grants.setdefault(key, {})
            if l.event == 'acquired':
                g['acq'] = (host, l)
            elif l.event in ('released', 'lost', 'broken', 'recovered'):
                g.setdefault('end', (host, l))
    for text in stderr_texts:
        lost_sessions += sum(1 for l in text.splitlines() if l.endswith(' is lost'))
    # -- the agents' records
    by_pid = collections.defaultdict(list)
    for r in recs:
        by_pid[r['pid']].append(r)
    held = []                       # agent grants: dicts with grant and release
    acq_errs = collections.Counter()
    for pid, rs in by_pid.items():
        rs.sort(key=lambda r: r['t'])
        cur = None
        told_stale = False
        for r in rs:
            if r['ev'] == 'grant':
                cur = dict(r)
                told_stale = False
            elif r['ev'] == 'release' and cur is not None:
                cur['release'] = r
                held.append(cur)
                if cur['mode'] == 'mkdir' and r['rc'] == errno.ESTALE:
                    told_stale = True
                cur = None
            elif r['ev'] == 'acq_err':
                acq_errs[(r['mode'], errno.errorcode.get(r['errno'], str(r['errno'])))] += 1
                if r['errno'] == errno.ESTALE and r['mode'] == 'mkdir':
                    what = (f'agent {pid} on {r["host"]}: mkdir {r["name"]} answered ESTALE at '
                            f'{r["t"]:.3f} (faults: {active_at(r["t"])})')
                    if told_stale:
                        v.append(f'[told-twice] {what}, after its rmdir was told ESTALE')
                    else:
                        out['notes'].append(f'[estale-mkdir] {what}, its last rmdir was not')
            elif r['ev'] == 'start':
                told_stale = False
        if cur is not None:
            held.append(cur)        # the agent stopped while holding (a hang)
    # undone grants: the owner read failed right after the grant.  A grant
    # that its daemon logged `lost` meanwhile may answer ESTALE or ENOENT
    # (the holder is told at its first look); anything else is a grant
    # undone behind its holder.
    for h in held:
        if h.get('owner_err') is not None:
            g = _grant_of(grants, h)
            err = errno.errorcode.get(h['owner_err'], h['owner_err'])
            what = (f'agent {h["pid"]} on {h["host"]} ({h["mode"]} {h["name"]}) was granted at '
                    f'{h["t"]:.3f} but reading owner answered {err} at '
                    f'{h.get("t_owner", h["t"]):.3f}; its release: {_rc(h.get("release"))}')
            if g and 'end' in g and g['end'][1].event == 'lost' \
                    and _ms(g['end'][1]) <= h.get('t_owner', h['t']) + 0.05:
                out['notes'].append(f'[lost-before-owner] {what}: the grant ended '
                                    f'{g["end"][1].raw!r}')
                # told at the owner read (ESTALE), or else at its rmdir
                rel = h.get('release')
                if h['mode'] == 'mkdir' and h['owner_err'] != errno.ESTALE and rel \
                        and rel['rc'] != errno.ESTALE:
                    v.append(f'[lost-rmdir] {h["name"]}: {what}: the grant ended '
                             f'{g["end"][1].raw!r}, and its holder was never told ESTALE '
                             f'(faults: {active_at(h["t"])})')
            else:
                v.append(f'[undone] {what}; the grant in the log: '
                         f'{g["acq"][1].raw if g else "none found"!r} '
                         f'(faults: {active_at(h["t"])})')
        elif h.get('owner_pid') not in (None, h['pid']):
            v.append(f'[owner] agent {h["pid"]} granted {h["name"]} fence={h["fence"]} but '
                     f'owner names pid {h["owner_pid"]}')
    # agent-side overlap and fence order, per name
    for name in sorted({h['name'] for h in held}):
        hs = sorted((h for h in held if h['name'] == name), key=lambda h: h['t'])
        for a, b in zip(hs, hs[1:]):
            if a.get('fence') is not None and b.get('fence') is not None \
                    and b['fence'] <= a['fence']:
                v.append(f'[fence] {name}: agent {b["pid"]} got fence {b["fence"]} at '
                         f'{b["t"]:.3f} after agent {a["pid"]} got {a["fence"]} at {a["t"]:.3f}')
        live = [h for h in hs if h.get('fence') is not None and 'release' in h
                and not _ended_lost(grants, name, h['fence'])]
        for a, b in zip(live, live[1:]):
            if a['release']['t_rel'] > b['t']:
                v.append(f'[overlap] {name}: agent {a["pid"]}@{a["host"]} fence {a["fence"]} '
                         f'released at {a["release"]["t_rel"]:.3f}, after agent '
                         f'{b["pid"]}@{b["host"]} was granted fence {b["fence"]} at '
                         f'{b["t"]:.3f} (faults: {active_at(b["t"])})')
    # lost holders and ESTALE
    lost = {k: g for k, g in grants.items() if 'end' in g and g['end'][1].event == 'lost'}
    lost_rmdir = collections.Counter()
    by_fence = {(h['name'], h['fence']): h for h in held if h.get('fence') is not None}
    for key, g in sorted(lost.items()):
        h = by_fence.get(key)
        if h is None or key[0] != NAMES['mkdir']:
            continue
        rel = h.get('release')
        if rel is None:
            continue
        lost_t = _ms(g['end'][1])
        rc = rel['rc']
        if rc == errno.ESTALE:
            lost_rmdir['ESTALE'] += 1
        elif rc == errno.EIO and rel['t_rel'] <= lost_t:
            lost_rmdir['EIO before the loss'] += 1     # documented: release pending
        else:
            lost_rmdir[_rc(rel)] += 1
            v.append(f'[lost-rmdir] {key[0]} fence={key[1]}: the grant ended '
                     f'{g["end"][1].raw!r} on {g["end"][0]} but its holder\'s rmdir at '
                     f'{rel["t_rel"]:.3f} answered {_rc(rel)}, not ESTALE '
                     f'(faults: {active_at(rel["t_rel"])})')
    for h in held:
        rel = h.get('release')
        if rel and h['mode'] == 'mkdir' and rel['rc'] == errno.ESTALE \
                and (h['name'], h.get('fence')) not in lost:
            end = grants.get((h['name'], h.get('fence')), {}).get('end')
            v.append(f'[estale-live] {h["name"]} fence={h.get("fence")}: rmdir answered ESTALE '
                     f'but the grant ended {end[1].raw if end else "nowhere"!r}')
    # -- hangs
    for pid, last in hung:
        v.append(f'[hang] agent {pid} did not stop within {STOP_GRACE:.0f} s; its last '
                 f'record: {last}')
    # -- figures
    acquired = [(k, g) for k, g in grants.items() if 'acq' in g]
    out['grants'] = len(acquired)
    out['grants_by_name'] = dict(collections.Counter(k[0] for k, _ in acquired))
    out['lost_grants'] = len(lost)
    out['lost_sessions'] = lost_sessions
    out['lost_rmdir'] = dict(lost_rmdir)
    out['acq_errors'] = {f'{m} {e}': n for (m, e), n in sorted(acq_errs.items())}
    out['release_errors'] = dict(collections.Counter(
        f'{h["mode"]} {_rc(h["release"])}' for h in held
        if h.get('release') and (h['release']['rc'] or h['release'].get('rc_close'))))
    out['unavailable'] = _unavailability(grants, active_at, run_end)
    for name, u in sorted(out['unavailable'].items()):
        for gap, t_end, fence, after in u.pop('stalls'):
            v.append(f'[stall] {name}: no holder for {gap:.1f} s (more than {STALL_S:.0f} s) '
                     f'after {after!r}, until fence {fence} (faults: {active_at(t_end)})')
    return out


def _rc(rel):
    if rel is None:
        return 'no release'
    s = 'OK' if rel['rc'] == 0 else errno.errorcode.get(rel['rc'], str(rel['rc']))
    if rel.get('rc_close'):
        s += f' (close {errno.errorcode.get(rel["rc_close"], rel["rc_close"])})'
    return s


def _grant_of(grants, h):
    """The logged grant of agent record H whose fence the owner read could
    not tell: the last `acquired` of H's name by H's pid at most H's grant
    time (and after it asked), or None."""
    best = None
    for (name, fence), g in grants.items():
        if name != h['name'] or 'acq' not in g:
            continue
        line = g['acq'][1]
        t = _ms(line)
        if line.details.get('pid') == str(h['pid']) and \
                h.get('t_asked', 0) - 0.05 <= t <= h['t'] + 0.05 and (best is None or t > best[0]):
            best = (t, g)
    return best[1] if best else None


def _ended_lost(grants, name, fence):
    g = grants.get((name, fence), {})
    return 'end' in g and g['end'][1].event == 'lost'


def _unavailability(grants, active_at, run_end=None):
    """Per name, the longest spell with no holder while the herd wanted the
    lock: from one grant's end (its end line) to the next grant's
    acquired, in fence order, or to RUN_END (when the agents were told to
    stop) after the last one; with the faults in progress."""
    out = {}
    for name in sorted({k[0] for k in grants}):
        gs = sorted((k[1], g) for k, g in grants.items() if k[0] == name and 'acq' in g)
        spells = []                 # (seconds, from, next fence, the line before)
        for (fa, a), (fb, b) in zip(gs, gs[1:]):
            last = a['end'][1] if 'end' in a else a['acq'][1]
            spells.append((_ms(b['acq'][1]) - _ms(last), _ms(last), fb, last.raw))
        if gs and run_end and 'end' in gs[-1][1]:
            last = gs[-1][1]['end'][1]
            spells.append((run_end - _ms(last), _ms(last), 'end of run', last.raw))
        best = max(spells, default=(0.0, None, None, None))
        out[name] = {'longest_s': round(best[0], 3), 'from': best[1], 'fence_after': best[2],
                     'faults': active_at(best[1]) if best[1] else [],
                     'stalls': [s for s in spells if s[0] > STALL_S]}
    return out


# ---------------------------------------------------------------- the run

class Report:
    def __init__(self, seed, seconds, agents, result, timeline, nemesis_errors, stops,
                 command=None):
        self.seed, self.seconds, self.agents = seed, seconds, agents
        self.result, self.timeline = result, timeline
        self.nemesis_errors, self.stops, self.command = nemesis_errors, stops, command

    @property
    def violations(self):
        return self.result['violations']

    def faults(self):
        return dict(collections.Counter(e['kind'] for e in self.timeline))

    def text(self):
        r = self.result
        lines = [f'seed {self.seed}, {self.seconds:.0f} s, {self.agents} agents on '
                 f'{len(HOSTS)} hosts, {len(MEMBERS)} etcd members, ttl={TTL} '
                 f'lock_delay={LOCK_DELAY}',
                 f'faults injected: {sum(self.faults().values())} '
                 + ', '.join(f'{k} {n}' for k, n in sorted(self.faults().items())),
                 f'grants: {r["grants"]} ' + ', '.join(
                     f'{n} {c}' for n, c in sorted(r['grants_by_name'].items())),
                 f'lost grants: {r["lost_grants"]}; sessions lost: {r["lost_sessions"]}; '
                 f'lost mkdir holders\' rmdir: {r["lost_rmdir"]}',
                 f'acquire errors: {r["acq_errors"]}',
                 f'release errors: {r["release_errors"]}']
        for name, u in sorted(r['unavailable'].items()):
            lines.append(f'longest unavailability of {name}: {u["longest_s"]:.3f} s '
                         f'(before fence {u["fence_after"]}; faults: {u["faults"]})')
        if self.nemesis_errors:
            lines.append(f'nemesis errors: {self.nemesis_errors}')
        lines.append(f'violations: {len(r["violations"])}')
        kinds = collections.Counter(x.split(']')[0] + ']' for x in r['violations'])
        if kinds:
            lines.append('  by kind: ' + ', '.join(f'{k} {n}' for k, n in sorted(kinds.items())))
        for x in r['violations'][:40]:
            lines.append('  ' + x)
        if r['notes']:
            lines.append(f'notes: {len(r["notes"])}')
            for x in r['notes'][:10]:
                lines.append('  ' + x)
        return '\n'.join(lines)


def run_partition_herd(workdir, lockfs_bin, seed, seconds, agents=16, log=print,
                       max_rounds=100000, lab=None):
    """The whole run (module doc) in WORKDIR; a Report.  Everything it
    starts is stopped and every namespace removed before it returns, also
    when it raises."""
    t_setup, t0 = time.time(), None
    plan = schedule(seed, seconds)
    log(f'partition herd: seed {seed}, {seconds:.0f} s, {agents} agents, '
        f'{len(plan)} faults planned')
    with Lab(workdir) as lb:
        cluster = lb.etcd_cluster(len(MEMBERS))
        daemons = []
        for h in HOSTS:
            mnt, backing = os.path.join(workdir, f'{h}.mnt'), os.path.join(workdir, f'{h}.dir')
            os.mkdir(mnt)
            os.mkdir(backing, 0o700)
            daemons.append(lb.daemon(h, cluster, mnt, backing, lockfs_bin,
                                     [f'prefix=/herd-{seed}/', f'ttl={TTL}',
                                      f'lock_delay={LOCK_DELAY}']))
        stop_path = os.path.join(workdir, 'stop')
        procs, outs = [], []
        hung = []
        nemesis = Nemesis(lb, cluster, daemons, log)
        try:
            for i in range(agents):
                d = daemons[i % len(daemons)]
                mode = 'flock' if i % 2 == 0 else 'mkdir'
                out = os.path.join(workdir, f'agent{i}.jsonl')
                outs.append(out)
                procs.append(subprocess.Popen(
                    [PYTHON, '-c', AGENT, d.mnt, d.host, NAMES[mode], mode, stop_path, out,
                     str(seed * 1000 + i), str(max_rounds), str(FLOCK_WAIT),
                     str(time.time() + seconds + 120)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=open(out + '.err', 'wb'), cwd='/'))
            t0 = time.time()
            nemesis.run(plan, t0, t0 + seconds)
            left = t0 + seconds - time.time()
            if left > 0:
                time.sleep(left)
        finally:
            run_end = time.time()
            with open(stop_path, 'w'):
                pass
            deadline = time.time() + STOP_GRACE
            for p, out in zip(procs, outs):
                try:
                    p.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    recs = read_records([out])
                    hung.append((p.pid, recs[-1] if recs else None))
                    os.kill(p.pid, signal.SIGKILL)   # by PID: our agent
                    p.wait(timeout=10)
            stderr_texts = [d.stderr() for d in daemons]
            logs = read_histories([(d.host, d.backing) for d in daemons])
            for d in daemons:
                d.stop()
            exits = {d.host: d.returncode for d in daemons}
    recs = read_records(outs)
    agent_errors = []
    for out in outs:
        try:
            with open(out + '.err', errors='replace') as f:
                err = f.read().strip()
        except OSError:
            err = ''
        if err:
            agent_errors.append(f'{os.path.basename(out)}: {err[-500:]}')
    result = check(logs, recs, stderr_texts, hung, nemesis.active_at, run_end)
    for e in agent_errors:
        result['violations'].append(f'[agent] {e}')
    for h, rc in exits.items():
        if rc != 0:
            result['violations'].append(f'[daemon] lockfs {h} exited with {rc}')
    result['setup_s'] = round(t0 - t_setup, 1) if t0 else None
    report = Report(seed, seconds, agents, result, nemesis.timeline, nemesis.errors,
                    len(hung), command=' '.join(sys.argv))
    # what a later look needs besides the logs and records left in WORKDIR
    with open(os.path.join(workdir, 'report.json'), 'w') as f:
        json.dump({'seed': seed, 'seconds': seconds, 'agents': agents, 'result': result,
                   'timeline': nemesis.timeline, 'nemesis_errors': nemesis.errors}, f,
                  indent=1, default=str)
    return report


def recheck(workdir):
    """The checker again over a run's kept WORKDIR (its logs, the agents'
    records, the daemons' stderr and report.json); a Report."""
    with open(os.path.join(workdir, 'report.json')) as f:
        saved = json.load(f)
    timeline = saved['timeline']

    def active_at(t):
        return [f'{e["kind"]} {e["target"]}' for e in timeline
                if e['start'] <= t <= e['end'] + 1.0]
    logs = read_histories([(h, os.path.join(workdir, f'{h}.dir')) for h in HOSTS])
    outs = sorted(os.path.join(workdir, n) for n in os.listdir(workdir)
                  if n.startswith('agent') and n.endswith('.jsonl'))
    stderr_texts = []
    for h in HOSTS:
        with open(os.path.join(workdir, f'{h}.stderr'), errors='replace') as f:
            stderr_texts.append(f.read())
    recs = read_records(outs)
    run_end = max((r['t'] for r in recs if r['ev'] == 'stop'), default=None)
    result = check(logs, recs, stderr_texts, (), active_at, run_end)
    return Report(saved['seed'], saved['seconds'], saved['agents'], result, timeline,
                  saved['nemesis_errors'], 0)

