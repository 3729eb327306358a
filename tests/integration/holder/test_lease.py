"""Issue 3 point 3: leases on process-bound locks (fail closed on expiry)."""

import errno
import json
import os
import time

import pytest

from lockfs_helpers import (log_for, parse_rfc3339_ms, read_owner, stays_held, wait_free,
                            wait_log, who_of)


def _lease_file(m, name='x'):
    with open(m.path(name, 'lease'), 'rb') as f:
        return f.read()


def _events(m, name, event):
    return [l for l in log_for(m.dir, name) if l.event == event]


def test_lease_is_null_until_set(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    assert read_owner(mnt.mnt, 'x')['lease'] is None
    assert _lease_file(mnt) == b'null\n'
    assert a.rmdir(mnt.path('x')) == 0


def test_holder_sets_a_lease(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    t0 = time.time()
    assert a.write(mnt.path('x', 'lease'), b'30\n') == 0
    t1 = time.time()
    lease = read_owner(mnt.mnt, 'x')['lease']
    assert lease['ttl_s'] == 30
    exp = parse_rfc3339_ms(lease['expires_at'])  # RFC 3339, UTC, ms
    assert t0 + 30 - 1 <= exp <= t1 + 30 + 1
    assert abs(lease['expires_at_ms'] / 1000.0 - exp) < 0.002
    raw = _lease_file(mnt)
    assert raw.endswith(b'\n') and raw.count(b'\n') == 1, raw  # one line
    assert json.loads(raw) == lease
    # the lock itself is unchanged: still process-bound, same holder
    o = read_owner(mnt.mnt, 'x')
    assert (o['bound'], o['holder']['pid']) == ('process', a.pid)
    assert a.rmdir(mnt.path('x')) == 0


def test_lease_without_newline_is_accepted(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    assert a.write(mnt.path('x', 'lease'), b'45') == 0
    assert read_owner(mnt.mnt, 'x')['lease']['ttl_s'] == 45
    assert a.rmdir(mnt.path('x')) == 0


def test_writing_lease_again_renews(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    assert a.write(mnt.path('x', 'lease'), b'30\n') == 0
    e1 = read_owner(mnt.mnt, 'x')['lease']['expires_at_ms']
    t = time.time()
    while time.time() < t + 0.03:  # let the clock move (a condition on the clock)
        pass
    assert a.write(mnt.path('x', 'lease'), b'30\n') == 0
    e2 = read_owner(mnt.mnt, 'x')['lease']['expires_at_ms']
    assert e2 >= e1 + 25, (e1, e2)
    assert a.rmdir(mnt.path('x')) == 0


def test_zero_clears_the_lease(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    assert a.write(mnt.path('x', 'lease'), b'30\n') == 0
    assert read_owner(mnt.mnt, 'x')['lease'] is not None  # control
    assert a.write(mnt.path('x', 'lease'), b'0\n') == 0
    assert read_owner(mnt.mnt, 'x')['lease'] is None
    assert _lease_file(mnt) == b'null\n'
    assert a.rmdir(mnt.path('x')) == 0


@pytest.mark.parametrize('who', ['stranger', 'parent'])
def test_lease_write_by_non_holder_is_eperm(mnt, procs, who):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    if who == 'stranger':
        e = procs.agent().write(mnt.path('x', 'lease'), b'30\n')
    else:  # the test process is the holder's parent
        try:
            fd = os.open(mnt.path('x', 'lease'), os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, b'30\n')
            finally:
                os.close(fd)
            e = 0
        except OSError as ex:
            e = ex.errno
    assert e == errno.EPERM
    assert read_owner(mnt.mnt, 'x')['lease'] is None
    assert a.rmdir(mnt.path('x')) == 0


@pytest.mark.parametrize('data', [b'abc\n', b'-1\n', b'\n', b'1e3\n', b'99999999999999999999\n'],
                         ids=['text', 'negative', 'empty', 'float-ish', 'overflow'])
def test_bad_lease_values_are_einval(mnt, procs, data):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    assert a.write(mnt.path('x', 'lease'), b'30\n') == 0
    before = read_owner(mnt.mnt, 'x')['lease']
    e = a.write(mnt.path('x', 'lease'), data)
    if data.startswith(b'9999'):
        assert e in (errno.EINVAL, errno.ERANGE, errno.EOVERFLOW), errno.errorcode.get(e)
    else:
        assert e == errno.EINVAL, errno.errorcode.get(e)
    assert read_owner(mnt.mnt, 'x')['lease'] == before
    assert a.rmdir(mnt.path('x')) == 0


def test_lease_file_of_not_held_is_enoent(mnt):
    with pytest.raises(FileNotFoundError):
        _lease_file(mnt, 'nope')


@pytest.mark.slow
def test_expired_lease_of_live_holder_is_logged_once_and_kept(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    fence = read_owner(mnt.mnt, 'x')['fence']
    assert a.write(mnt.path('x', 'lease'), b'1\n') == 0
    exp = wait_log(mnt.dir, 'x', 'expired', timeout=6)[0]
    assert exp.who == who_of(a.pid)
    assert exp.details.get('fence') == str(fence)
    assert exp.details.get('ttl_s') == '1'
    # fail closed: kept, and logged once only
    assert stays_held(mnt, 'x', 2.5)
    assert len(_events(mnt, 'x', 'expired')) == 1
    assert not _events(mnt, 'x', 'recovered')
    o = read_owner(mnt.mnt, 'x')
    assert (o['holder']['pid'], o['fence']) == (a.pid, fence)
    assert a.rmdir(mnt.path('x')) == 0  # the holder still releases normally
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'expired', 'released']


@pytest.mark.slow
def test_renewed_or_cleared_lease_does_not_expire(mnt, procs):
    a = procs.agent()
    for n in ('renewed', 'cleared', 'control'):
        assert a.mkdir(mnt.path(n)) == 0
        assert a.write(mnt.path(n, 'lease'), b'1\n') == 0
    assert a.write(mnt.path('cleared', 'lease'), b'0\n') == 0
    t_end = time.monotonic() + 3
    while time.monotonic() < t_end:
        assert a.write(mnt.path('renewed', 'lease'), b'1\n') == 0
        time.sleep(0.25)
    wait_log(mnt.dir, 'control', 'expired', timeout=5)  # positive control
    assert not _events(mnt, 'renewed', 'expired')
    assert not _events(mnt, 'cleared', 'expired')
    for n in ('renewed', 'cleared', 'control'):
        assert a.rmdir(mnt.path(n)) == 0


def test_a_lease_does_not_delay_recovery_after_death(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('x')) == 0
    assert a.write(mnt.path('x', 'lease'), b'600\n') == 0
    a.kill()
    wait_free(mnt, 'x', timeout=2)
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'recovered']
