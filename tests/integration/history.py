#!/usr/bin/python3
"""The history checker: did any lock ever have two holders at once?

Reads the audit logs (lock.log, docs/log.md) of every host that served one
lock namespace -- one daemon on a backing dir, or several daemons on one
etcd prefix -- and checks, for each lock name:

  1. fences strictly increase in grant order: sorted by the time of their
     `acquired` line, the grants' fences are strictly increasing (and no
     fence is granted twice);
  2. sorted by fence, each grant ended (`released`, `recovered`, `broken`,
     `lost`) no later than the next grant's `acquired` -- unless it ended
     `lost` (its session expired: the store gave the lock to someone else
     while the holder may not have known yet; the holder's rmdir says
     ESTALE), or both are holders of one shared lock;
  3. every `acquired` has exactly one end, or the lock is still held at the
     end of the run (the caller says which names are, or which grants).
     One more line may end it too: a `lost evidence=removed-in-store` on
     the grant's own host is that daemon noticing the store dropped the
     lock, which the host that dropped it (root's `break` there) logged as
     the end already; that other host's line is the end then.

A grant is one `acquired` line, identified by (name, fence): fences are
unique per name across hosts (the dir store's counter, etcd's revision).
Lines between (`bound`, `rebound`, `expired`, `holder-exited`, `denied`)
belong to the grant with their fence and start nothing.  Lines without a
fence (a foreign lock's `recovered` or `broken`, `refused`, the log's own
`lost` with NAME `-`) are not about a grant of ours and are skipped.

Timestamps are milliseconds (wall clock); all hosts of a test run on this
machine, so their clocks agree.  "No later than" is "<=" in milliseconds:
a hand-off writes `released` and the next `acquired` in the same
millisecond.

Across hosts a line's time is when its daemon wrote it: `released` after
the store confirmed the delete, so another host may be granted, and write
its `acquired`, a few milliseconds before the releasing host's line.
CROSS_HOST_MS (default 0: strict) is the lag allowed between an end on one
host and the next `acquired` on another; on one host the rule stays
strict.  (A lag this checker allows is still caught by a witness file,
as the herds keep one.)

    history.py LOG [LOG...]        check; prints the violations, exit 1 if any
                                   (LOG: a lock.log, or a backing dir holding one)

In a test:

    from history import check_history, read_histories
    problems = check_history(read_histories([m.dir for m in mounts]), held=set())
    assert not problems, '\\n'.join(problems)
"""

import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lockfs_helpers import LogLine, parse_rfc3339_ms  # noqa: E402

# Lines that end a grant (docs/log.md; `lost` with a fence: issue 11).
END_EVENTS = ('released', 'recovered', 'broken', 'lost')


class Grant:
    """One acquisition: its acquired line, host, and the line that ended it."""

    def __init__(self, host, line):
        self.host = host
        self.line = line
        self.name = line.name
        self.fence = int(line.details['fence'])
        self.t = parse_rfc3339_ms(line.timestamp)
        self.shared = line.details.get('mode') == 'shared'
        self.end = None        # (host, LogLine)
        self.end_t = None

    @property
    def ended_lost(self):
        return self.end is not None and self.end[1].event == 'lost'

    def __repr__(self):
        end = f'{self.end[1].event}@{self.end[0]} {self.end[1].timestamp}' if self.end else 'open'
        return (f'<{self.name.decode("utf-8", "replace")} fence={self.fence} '
                f'{self.line.who}@{self.host} acquired {self.line.timestamp}, {end}>')


def _removal_noted(g, host, line):
    """Is LINE (on HOST) G's own daemon noticing that the store dropped G's
    lock behind its back (`lost evidence=removed-in-store`)?"""
    return line.event == 'lost' and line.details.get('evidence') == 'removed-in-store' \
        and host == g.host


def parse_lines(text):
    """LogLines of one lock.log's text (which must end with a newline)."""
    if text and not text.endswith('\n'):
        raise ValueError('lock.log does not end with a newline')
    return [LogLine(l) for l in text.split('\n')[:-1]]


def read_histories(sources):
    """{host: [LogLine]} from SOURCES: paths (a lock.log, or a backing dir
    holding one) or (host, path) pairs.  A path with no log yet gives []."""
    out = {}
    for i, src in enumerate(sources):
        host, path = src if isinstance(src, tuple) else (f'log{i}', src)
        if os.path.isdir(path):
            path = os.path.join(path, 'lock.log')
        try:
            with open(path, 'rb') as f:
                text = f.read().decode('utf-8', 'surrogateescape')
        except FileNotFoundError:
            text = ''
        out[host] = parse_lines(text)
    return out


def _name(b):
    return b.decode('utf-8', 'replace')


def check_history(logs, held=None, cross_host_ms=0, let_go_at=None):
    """The violations (a list of strings; empty: the history is sound).

    LOGS: {host: [LogLine]}.  HELD: what may still be held at the end of the
    run -- None (anything: only what did end is checked), a set of names
    (bytes or str: every open grant of those names is allowed), or a set of
    (name, fence) pairs.  CROSS_HOST_MS: see the module docstring.
    LET_GO_AT(host, line): when the holder asked for the release that the
    `released` LINE logged, as its client recorded it (or None), on the
    scale of the lines' times (seconds).  A `released` line is written once
    the store answered, which on a slow link may be long after the store
    applied it; as Jepsen's checkers take an operation at its invocation,
    the critical section ended when asked (the same rule as a `retried=1`
    line's asked=)."""
    problems = []
    grants = {}                                   # (name, fence) -> Grant
    by_name = collections.defaultdict(list)
    pending_ends = []
    for host, lines in logs.items():
        for line in lines:
            if 'fence' not in line.details:
                continue
            try:
                fence = int(line.details['fence'])
            except ValueError:
                problems.append(f'{host}: bad fence in {line.raw!r}')
                continue
            key = (line.name, fence)
            if line.event == 'acquired':
                if key in grants:
                    g = grants[key]
                    problems.append(f'{_name(line.name)}: fence {fence} granted twice: '
                                    f'{g.line.raw!r} on {g.host} and {line.raw!r} on {host}')
                    continue
                g = Grant(host, line)
                grants[key] = g
                by_name[line.name].append(g)
            elif line.event in END_EVENTS:
                pending_ends.append((host, line, key))
    # Ends after grants: the logs of different hosts come in any order.
    for host, line, key in pending_ends:
        g = grants.get(key)
        if g is None:
            problems.append(f'{_name(line.name)}: {line.event} of fence {key[1]} on {host} '
                            f'without an acquired line: {line.raw!r}')
            continue
        if g.end is not None and _removal_noted(g, host, line) and g.end[0] != g.host:
            continue        # the holder's host noticed the other host's break
        if g.end is not None and _removal_noted(g, *g.end) and host != g.host:
            g.end = None    # the other host's break is the end; see below
        if g.end is not None:
            problems.append(f'{_name(line.name)}: fence {key[1]} ended twice: '
                            f'{g.end[1].raw!r} on {g.end[0]} and {line.raw!r} on {host}')
            continue
        t = parse_rfc3339_ms(line.timestamp)
        if t < g.t:
            problems.append(f'{_name(line.name)}: fence {key[1]} ended before it was '
                            f'acquired: {line.raw!r}')
        # A release the store refused at first and the daemon completed
        # later (`retried=1`) names when the holder asked (`asked=`): its
        # critical section ended then, whenever the store applied it.
        if line.event == 'released' and 'asked' in line.details:
            t = min(t, max(g.t, parse_rfc3339_ms(line.details['asked'])))
        elif line.event == 'released' and let_go_at is not None:
            asked = let_go_at(host, line)
            if asked is not None:
                t = min(t, max(g.t, asked))
        g.end, g.end_t = (host, line), t

    held_names, held_pairs = set(), set()
    for h in held or ():
        if isinstance(h, tuple):
            n = h[0].encode() if isinstance(h[0], str) else h[0]
            held_pairs.add((n, int(h[1])))
        else:
            held_names.add(h.encode() if isinstance(h, str) else h)

    for name, gs in by_name.items():
        # 1. fences strictly increase in grant order (acquired time; a tie
        #    in the same millisecond is ordered by fence, which cannot fail)
        in_time = sorted(gs, key=lambda g: (g.t, g.fence))
        for a, b in zip(in_time, in_time[1:]):
            if b.fence <= a.fence:
                problems.append(f'{_name(name)}: fence went backwards: {a!r} then {b!r}')
        # 2. sorted by fence, no overlap unless the earlier one was lost
        by_fence = sorted(gs, key=lambda g: g.fence)
        for i, a in enumerate(by_fence):
            if a.end is None or a.ended_lost:
                # An open grant overlaps every later one (checked below
                # when it is not allowed to be open); a lost one may.
                later = by_fence[i + 1:i + 2]
                if a.end is None and later and not (a.shared and later[0].shared):
                    problems.append(f'{_name(name)}: {a!r} never ended, yet {later[0]!r} '
                                    f'was granted after it')
                continue
            for b in by_fence[i + 1:]:
                if a.shared and b.shared:
                    continue        # holders of one shared lock overlap
                lag = cross_host_ms / 1000 if a.end[0] != b.host else 0
                if a.end_t > b.t + lag:
                    problems.append(f'{_name(name)}: two holders at once: {a!r} ended after '
                                    f'{b!r} was acquired')
                break
        # 3. every acquired has an end, or is still held
        for g in gs:
            if g.end is None and held is not None and name not in held_names \
                    and (name, g.fence) not in held_pairs:
                problems.append(f'{_name(name)}: {g!r} has no end and is not held')
    return problems


def grants_of(logs, name=None):
    """Every Grant in LOGS (of NAME if given; str or bytes), in fence
    order, each with its end (None while open) -- for tests that look at
    who got what."""
    grants = {}
    for host, lines in logs.items():
        for line in lines:
            if 'fence' in line.details and line.event == 'acquired':
                g = Grant(host, line)
                grants.setdefault((line.name, g.fence), g)
    for host, lines in logs.items():
        for line in lines:
            if 'fence' in line.details and line.event in END_EVENTS:
                g = grants.get((line.name, int(line.details['fence'])))
                if g is not None and g.end is None:
                    g.end, g.end_t = (host, line), parse_rfc3339_ms(line.timestamp)
    if isinstance(name, str):
        name = name.encode()
    return sorted((g for g in grants.values() if name is None or g.name == name),
                  key=lambda g: (g.name, g.fence))


def main(argv):
    if not argv:
        sys.stderr.write('usage: history.py LOG|DIR [LOG|DIR...]\n')
        return 2
    logs = read_histories([(p, p) for p in argv])
    problems = check_history(logs)
    for p in problems:
        print(p)
    n = sum(1 for ls in logs.values() for l in ls if l.event == 'acquired' and 'fence' in l.details)
    print(f'history.py: {n} grants in {len(logs)} log(s): '
          f'{"OK" if not problems else f"{len(problems)} violation(s)"}')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
