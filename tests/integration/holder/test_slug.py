"""Issue 3 point 2: slug-bound locks (LOCKFS_SLUG) for throwaway shells."""

import errno
import json
import os
import subprocess
import time

import pytest

from lockfs_helpers import (evidence, log_for, parse_rfc3339_ms, read_owner, stays_held,
                            wait_free, wait_log, wait_until)

WINDOW = 0.5


def _env(slug=None):
    e = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
    if slug is not None:
        e['LOCKFS_SLUG'] = slug
    return e


def _bash(script, m, name='x', slug=None, user=None):
    """bash -c SCRIPT with $1 = M/NAME, a fresh shell like an agent's tool call."""
    kw = {}
    if user is not None:
        kw = dict(user=user.uid, group=user.gid, extra_groups=[])
    return subprocess.run(['bash', '-c', script, 'bash', m.path(name)], env=_env(slug),
                          capture_output=True, timeout=30, cwd='/', **kw)


def _take(m, slug, name='x', user=None):
    """Acquire NAME from a bash that then exits (mkdir is not its last command)."""
    r = _bash('mkdir "$1" && true', m, name, slug=slug, user=user)
    assert r.returncode == 0, r.stderr
    return r


def _sleeper(slug, user=None):
    """A long-lived process whose exec-time environment carries SLUG."""
    kw = {}
    if user is not None:
        kw = dict(user=user.uid, group=user.gid, extra_groups=[])
    return subprocess.Popen(['sleep', '1000'], env=_env(slug), cwd='/', **kw)


def _end(p):
    p.kill()
    p.wait()


@pytest.fixture(autouse=True)
def _no_slug_in_test_process():
    assert 'LOCKFS_SLUG' not in os.environ, 'run the suite without LOCKFS_SLUG set'


def test_owner_shows_slug_binding_and_default_lease(mnt):
    t0 = time.time()
    _take(mnt, 'agent-7')
    o = read_owner(mnt.mnt, 'x')
    assert o['bound'] == 'slug'
    assert o['slug'] == 'agent-7'
    lease = o['lease']
    assert isinstance(lease, dict), o
    assert lease['ttl_s'] == 600  # the default, the seed's --stale
    exp = parse_rfc3339_ms(lease['expires_at'])
    assert t0 + 600 - 2 <= exp <= time.time() + 600 + 2
    assert abs(lease['expires_at_ms'] / 1000.0 - exp) < 0.002
    with open(mnt.path('x', 'lease'), 'rb') as f:
        assert json.loads(f.read()) == lease
    assert _bash('rmdir "$1"', mnt, slug='agent-7').returncode == 0


def test_process_bound_lock_is_not_slug_bound(mnt):
    """Negative control: without LOCKFS_SLUG the lock is bound to the process."""
    os.mkdir(mnt.path('x'))
    o = read_owner(mnt.mnt, 'x')
    assert o['bound'] == 'process'
    assert o['slug'] is None
    assert o['lease'] is None
    os.rmdir(mnt.path('x'))


def test_slug_lock_survives_its_shells_exit(mnt):
    _take(mnt, 'S')
    # positive control in the same window: a process-bound lock of a shell
    # that exited is recovered
    r = _bash('mkdir "$1" && true', mnt, 'control')
    assert r.returncode == 0, r.stderr
    wait_free(mnt, 'control')
    assert stays_held(mnt, 'x', WINDOW)
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired']
    assert read_owner(mnt.mnt, 'x')['slug'] == 'S'
    assert _bash('rmdir "$1"', mnt, slug='S').returncode == 0


def test_slug_lock_survives_kill_9_of_the_holder(mnt, procs):
    a = procs.agent(env={'LOCKFS_SLUG': 'S'})
    assert a.mkdir(mnt.path('x')) == 0
    ctl = procs.agent()
    assert ctl.mkdir(mnt.path('control')) == 0
    a.kill()
    ctl.kill()
    wait_free(mnt, 'control')
    assert stays_held(mnt, 'x', WINDOW)
    assert _bash('rmdir "$1"', mnt, slug='S').returncode == 0


def test_rmdir_by_another_shell_with_same_slug_releases(mnt):
    _take(mnt, 'agent-3')
    r = _bash('rmdir "$1"', mnt, slug='agent-3')
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(mnt.lockdir('x'))
    lines = log_for(mnt.dir, 'x')
    assert [(l.who, l.event) for l in lines] == [('agent-3', 'acquired'),
                                                  ('agent-3', 'released')]


@pytest.mark.parametrize('caller', ['other-slug', 'no-slug-root', 'prefix-slug', 'empty-slug'])
def test_rmdir_without_the_same_slug_is_eperm(mnt, procs, caller):
    _take(mnt, 'agent-3')
    env = {'other-slug': {'LOCKFS_SLUG': 'agent-4'}, 'no-slug-root': None,
           'prefix-slug': {'LOCKFS_SLUG': 'agent-'}, 'empty-slug': {'LOCKFS_SLUG': ''}}[caller]
    a = procs.agent(env=env)
    assert a.rmdir(mnt.path('x')) == errno.EPERM
    assert os.path.isdir(mnt.lockdir('x'))
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'denied']
    # control: the same slug still can
    assert procs.agent(env={'LOCKFS_SLUG': 'agent-3'}).rmdir(mnt.path('x')) == 0


def test_rmdir_with_same_slug_but_other_uid_is_eperm(mnt_ao, users):
    _take(mnt_ao, 'S', user=users[0])
    o = read_owner(mnt_ao.mnt, 'x')
    assert (o['bound'], o['holder']['uid']) == ('slug', users[0].uid)
    r = _bash('rmdir "$1"', mnt_ao, slug='S', user=users[1])
    assert r.returncode != 0 and b'not permitted' in r.stderr, r.stderr
    r = _bash('rmdir "$1"', mnt_ao, slug='S')  # root with the slug: not the uid either
    assert r.returncode != 0 and b'not permitted' in r.stderr, r.stderr
    assert os.path.isdir(mnt_ao.lockdir('x'))
    r = _bash('rmdir "$1"', mnt_ao, slug='S', user=users[0])  # control
    assert r.returncode == 0, r.stderr


def test_slug_given_to_the_mkdir_command_only(mnt):
    """`LOCKFS_SLUG=S mkdir ...` in a shell without the slug: the caller's
    exec-time environment is what counts."""
    r = _bash('LOCKFS_SLUG=S mkdir "$1" && true', mnt)
    assert r.returncode == 0, r.stderr
    assert read_owner(mnt.mnt, 'x')['bound'] == 'slug'
    r = _bash('export LOCKFS_SLUG=S; rmdir "$1" && true', mnt)
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(mnt.lockdir('x'))


def test_slug_set_after_exec_is_not_seen(mnt, procs):
    """The environment is read as it was at exec: a later putenv is invisible."""
    a = procs.agent(setup="import os; os.environ['LOCKFS_SLUG'] = 'late'")
    assert a.mkdir(mnt.path('x')) == 0
    o = read_owner(mnt.mnt, 'x')
    assert o['bound'] == 'process' and o['slug'] is None, o
    assert _bash('rmdir "$1"', mnt, slug='late').returncode != 0
    assert a.rmdir(mnt.path('x')) == 0


def _expires_ms(m, name='x'):
    return read_owner(m.mnt, name)['lease']['expires_at_ms']


def _clock_moves(ms=30):
    t = time.time()
    wait_until(lambda: time.time() >= t + ms / 1000.0, what='the clock to move')


def test_touch_renews_the_lease(mnt):
    _take(mnt, 'S')
    e1 = _expires_ms(mnt)
    _clock_moves()
    r = subprocess.run(['touch', mnt.path('x')], env=_env('S'), capture_output=True)
    assert r.returncode == 0, r.stderr
    e2 = _expires_ms(mnt)
    assert e2 >= e1 + 25, (e1, e2)
    assert read_owner(mnt.mnt, 'x')['lease']['ttl_s'] == 600
    assert _bash('rmdir "$1"', mnt, slug='S').returncode == 0


@pytest.mark.parametrize('caller', ['other-slug', 'no-slug'])
def test_touch_by_others_is_eperm_and_does_not_renew(mnt, procs, caller):
    _take(mnt, 'S')
    e1 = _expires_ms(mnt)
    _clock_moves()
    a = procs.agent(env={'LOCKFS_SLUG': 'T'} if caller == 'other-slug' else None)
    assert a.utime(mnt.path('x')) == errno.EPERM
    assert _expires_ms(mnt) == e1
    assert procs.agent(env={'LOCKFS_SLUG': 'S'}).utime(mnt.path('x')) == 0  # control
    assert _expires_ms(mnt) > e1
    assert _bash('rmdir "$1"', mnt, slug='S').returncode == 0


def test_writing_lease_file_sets_ttl_and_renews(mnt):
    _take(mnt, 'S')
    t0 = time.time()
    r = _bash('echo 30 > "$1/lease"', mnt, slug='S')
    assert r.returncode == 0, r.stderr
    lease = read_owner(mnt.mnt, 'x')['lease']
    assert lease['ttl_s'] == 30
    assert t0 + 30 - 1 <= lease['expires_at_ms'] / 1000.0 <= time.time() + 30 + 1
    assert _bash('rmdir "$1"', mnt, slug='S').returncode == 0


@pytest.mark.parametrize('caller', ['other-slug', 'no-slug'])
def test_lease_write_by_others_is_eperm(mnt, procs, caller):
    _take(mnt, 'S')
    before = read_owner(mnt.mnt, 'x')['lease']
    a = procs.agent(env={'LOCKFS_SLUG': 'T'} if caller == 'other-slug' else None)
    assert a.write(mnt.path('x', 'lease'), b'5\n') == errno.EPERM
    assert read_owner(mnt.mnt, 'x')['lease'] == before
    assert _bash('rmdir "$1"', mnt, slug='S').returncode == 0


def test_lease_zero_on_slug_lock_is_einval(mnt, procs):
    _take(mnt, 'S')
    before = read_owner(mnt.mnt, 'x')['lease']
    a = procs.agent(env={'LOCKFS_SLUG': 'S'})
    assert a.write(mnt.path('x', 'lease'), b'0\n') == errno.EINVAL
    assert read_owner(mnt.mnt, 'x')['lease'] == before
    assert a.rmdir(mnt.path('x')) == 0


# ----------------------------------------------------------------------------
# recovery: lease expired AND no process of that uid carries the slug

def _check_recovered_line(m, name, slug, uid):
    rec = wait_log(m.dir, name, 'recovered')
    assert len(rec) == 1, rec
    rec = rec[0]
    assert rec.who == slug
    assert rec.details.get('slug') == slug
    assert rec.details.get('uid') == str(uid)
    ev = evidence(rec)
    assert {'lease-expired', 'no-process-with-slug'} <= ev, rec.raw
    return rec


@pytest.mark.slow
def test_expired_slug_lock_without_process_is_recovered(lockfs_factory):
    m = lockfs_factory(options=['lease=1'])
    _take(m, 'gone')
    o = read_owner(m.mnt, 'x')
    assert o['lease']['ttl_s'] == 1
    wait_free(m, 'x', timeout=8)
    rec = _check_recovered_line(m, 'x', 'gone', 0)
    assert rec.details.get('fence') == str(o['fence'])
    # not before the lease expired
    assert parse_rfc3339_ms(rec.timestamp) >= o['lease']['expires_at_ms'] / 1000.0 - 0.002
    os.mkdir(m.path('x'))  # free for anyone
    os.rmdir(m.path('x'))


@pytest.mark.slow
def test_process_carrying_the_slug_keeps_an_expired_lock(lockfs_factory):
    m = lockfs_factory(options=['lease=1'])
    keeper = _sleeper('busy')
    try:
        _take(m, 'busy')
        exp = wait_log(m.dir, 'x', 'expired', timeout=8)  # the lease ran out ...
        assert exp[0].who == 'busy'
        assert stays_held(m, 'x', 2.5)                    # ... and the lock stays
        assert len([l for l in log_for(m.dir, 'x') if l.event == 'expired']) == 1
        assert not [l for l in log_for(m.dir, 'x') if l.event == 'recovered']
    finally:
        _end(keeper)
    # the second piece of evidence appears: now it goes
    wait_free(m, 'x', timeout=8)
    _check_recovered_line(m, 'x', 'busy', 0)


@pytest.mark.slow
@pytest.mark.parametrize('keeper', ['other-slug', 'other-uid'])
def test_process_with_other_slug_or_uid_does_not_keep_it(lockfs_factory, users, keeper):
    m = lockfs_factory(options=['lease=1'])
    p = _sleeper('busy2') if keeper == 'other-slug' else _sleeper('busy', user=users[0])
    try:
        _take(m, 'busy')
        wait_free(m, 'x', timeout=8)
        _check_recovered_line(m, 'x', 'busy', 0)
    finally:
        _end(p)


@pytest.mark.slow
def test_renewing_keeps_the_lock_past_its_first_lease(lockfs_factory):
    m = lockfs_factory(options=['lease=2'])
    _take(m, 'S')
    t_end = time.monotonic() + 5
    while time.monotonic() < t_end:  # renew twice a second for 2.5 leases
        r = _bash('touch "$1"', m, slug='S')
        assert r.returncode == 0, r.stderr
        assert os.path.isdir(m.lockdir('x'))
        time.sleep(0.5)
    assert not [l for l in log_for(m.dir, 'x') if l.event in ('recovered', 'expired')]
    t0 = time.monotonic()
    wait_free(m, 'x', timeout=10)  # stop renewing: recovered after the lease
    assert time.monotonic() - t0 >= 1.0
    _check_recovered_line(m, 'x', 'S', 0)
