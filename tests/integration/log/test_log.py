"""Point 10: the audit log DIR/lock.log."""

import os
import subprocess
import time

from lockfs_helpers import (LOG_EVENTS, LogLine, assert_alternating, log_escape, log_for,
                            parse_rfc3339_ms, proc_comm, read_log, read_owner)


def test_log_line_format(mnt, procs):
    a = procs.agent()
    t0 = time.time()
    assert a.mkdir(mnt.path('fmt')) == 0
    fence = a.owner(mnt.mnt, 'fmt')['fence']
    assert a.rmdir(mnt.path('fmt')) == 0
    t1 = time.time()
    lines = log_for(mnt.dir, 'fmt')
    assert [l.event for l in lines] == ['acquired', 'released']
    who = f'{proc_comm(a.pid)}[{a.pid}]'
    for l in lines:
        t = parse_rfc3339_ms(l.timestamp)  # TIMESTAMP first, RFC 3339 UTC ms
        assert t0 - 2 <= t <= t1 + 2
        assert l.who == who  # WHO = comm[pid] of the holder without LOCKFS_SLUG
        assert l.fields[1] == log_escape(who)
        assert l.fields[2] == 'fmt'
        assert l.event in LOG_EVENTS  # EVENT last
        if 'fence' in l.details:
            assert l.details['fence'] == str(fence)
    assert lines[0].timestamp <= lines[1].timestamp


def test_every_log_line_parses(lockfs_factory, procs):
    mnt = lockfs_factory(options=('log_denied_interval=0',))  # every refusal a line
    a, b = procs.agent(), procs.agent(env={'LOCKFS_SLUG': 'odd slug\\x'})
    for n in ('p', 'q r', 'caf\u00e9'):
        assert a.mkdir(mnt.path(n)) == 0
        assert b.rmdir(mnt.path(n)) != 0  # denied
        assert a.rmdir(mnt.path(n)) == 0
    lines = read_log(mnt.dir)  # raises on a malformed line
    # The daemon's own start line first (issue 20), then the locks' lines.
    assert [l.event for l in lines[:1]] == ['daemon-started']
    assert (lines[0].who, lines[0].name) == ('lockfs', b'')
    lines = lines[1:]
    assert len(lines) == 9
    assert all(l.event in LOG_EVENTS for l in lines)


def test_acquired_released_pairs(mnt):
    for _ in range(5):
        os.mkdir(mnt.path('pairs'))
        os.rmdir(mnt.path('pairs'))
    events = assert_alternating(log_for(mnt.dir, 'pairs'), 'pairs')
    assert events == ['acquired', 'released'] * 5


def test_log_is_written_in_order_of_events(mnt):
    """acquired is in the log once mkdir returns; released once rmdir returns."""
    os.mkdir(mnt.path('order'))
    assert [l.event for l in log_for(mnt.dir, 'order')] == ['acquired']
    os.rmdir(mnt.path('order'))
    assert [l.event for l in log_for(mnt.dir, 'order')] == ['acquired', 'released']


def test_slug_from_environment_is_who(mnt, procs):
    a = procs.agent(env={'LOCKFS_SLUG': 'agent-7'})
    assert a.mkdir(mnt.path('slugged')) == 0
    assert a.rmdir(mnt.path('slugged')) == 0
    lines = log_for(mnt.dir, 'slugged')
    assert [(l.who, l.event) for l in lines] == [('agent-7', 'acquired'),
                                                  ('agent-7', 'released')]


def test_slug_of_shell_mkdir_is_who(mnt):
    """The seed's usage: LOCKFS_SLUG set for a script that runs mkdir(1)."""
    env = dict(os.environ, LOCKFS_SLUG='agent-9')
    r = subprocess.run(['/bin/sh', '-c', 'mkdir "$1" && rmdir "$1"', 'sh', mnt.path('s')],
                       env=env, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert [l.who for l in log_for(mnt.dir, 's')] == ['agent-9', 'agent-9']


def test_slug_with_space_is_escaped(mnt, procs):
    a = procs.agent(env={'LOCKFS_SLUG': 'agent 7'})
    assert a.mkdir(mnt.path('x')) == 0
    assert a.rmdir(mnt.path('x')) == 0
    lines = log_for(mnt.dir, 'x')
    assert [l.who for l in lines] == ['agent 7', 'agent 7']
    assert all(l.fields[1] == 'agent\\x207' for l in lines)


def test_name_with_space_is_escaped_and_splits_the_same(mnt):
    _check_escaping_round_trips()  # the test's own escaper/parser first
    for n in ('plain', 'two words', 'back\\slash', 'tr\u00e8s  spaced '):
        os.mkdir(mnt.path(n))
        os.rmdir(mnt.path(n))
    plain = log_for(mnt.dir, 'plain')
    assert len(plain) == 2
    width = {l.event: len(l.fields) for l in plain}
    for n in ('two words', 'back\\slash', 'tr\u00e8s  spaced '):
        lines = log_for(mnt.dir, n)  # matches on the unescaped NAME field
        assert [l.event for l in lines] == ['acquired', 'released'], n
        for l in lines:
            assert ' ' not in l.fields[2]
            assert l.fields[2] == log_escape(n)
            assert len(l.fields) == width[l.event], (l.raw, plain)


def _check_escaping_round_trips():
    for s in ['', '-', 'a b', 'x\\y', 'tab\t', 'nl\n', 'caf\u00e9', '\x7f']:
        esc = log_escape(s)
        assert ' ' not in esc and '\n' not in esc and '\t' not in esc
        line = LogLine(f'2026-01-01T00:00:00.000Z {esc} {esc} acquired')
        assert line.who == s and line.name == s.encode()


def test_denied_line_names_the_caller(mnt, procs):
    holder = procs.agent()
    caller = procs.agent(env={'LOCKFS_SLUG': 'intruder'})
    assert holder.mkdir(mnt.path('d')) == 0
    assert caller.rmdir(mnt.path('d')) != 0
    assert holder.rmdir(mnt.path('d')) == 0
    lines = log_for(mnt.dir, 'd')
    assert [l.event for l in lines] == ['acquired', 'denied', 'released']
    assert lines[1].who == 'intruder'
    assert lines[0].who == lines[2].who == f'{proc_comm(holder.pid)}[{holder.pid}]'


def test_reading_owner_logs_nothing(mnt):
    os.mkdir(mnt.path('quiet'))
    n = len(read_log(mnt.dir))
    for _ in range(5):
        read_owner(mnt.mnt, 'quiet')
        os.listdir(mnt.mnt)
        os.stat(mnt.path('quiet'))
    assert len(read_log(mnt.dir)) == n
    os.rmdir(mnt.path('quiet'))
