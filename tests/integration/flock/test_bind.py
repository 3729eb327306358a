"""Issue 4 point 9: turning a wait into a held lock (M/NAME/bind).

"The resolved holder of NAME's exclusive fd lock may write `process` to
M/NAME/bind (or `slug`, with LOCKFS_SLUG in its environment); the lock
becomes process-bound (or slug-bound) with the same fence and no release in
between, and the descriptor's later close releases nothing.  Anyone else
gets EPERM.  This is how a shell waits its turn and then keeps the lock
across several commands."
Contract: reading bind gives fd|process|slug; EINVAL for other text, for a
lock that is not an exclusive fd lock, and for `slug` without LOCKFS_SLUG;
log event `bound` with bound=process|slug.
"""

import errno
import fcntl
import json
import os
import stat
import subprocess

import pytest

from flock_helpers import (fpath, is_wouldblock, read_bind, sh_quote,  # noqa: F401
                           wait_waiters)
from lockfs_helpers import (END_EVENTS, evidence, log_for, read_owner, stays_held, wait_free,
                            wait_log)

EX, SH, NB, UN = fcntl.LOCK_EX, fcntl.LOCK_SH, fcntl.LOCK_NB, fcntl.LOCK_UN
WINDOW = 0.5


def _env(slug=None):
    e = {k: v for k, v in os.environ.items() if k != 'LOCKFS_SLUG'}
    if slug is not None:
        e['LOCKFS_SLUG'] = slug
    return e


def _control_recovery(m, procs, name='control'):
    d = procs.agent()
    assert d.mkdir(m.path(name)) == 0
    d.kill()
    wait_free(m, name, timeout=2)


@pytest.fixture(autouse=True)
def _no_slug_in_test_process():
    assert 'LOCKFS_SLUG' not in os.environ, 'run the suite without LOCKFS_SLUG set'


def test_bind_reads_the_binding_and_is_0666(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'f'))
    assert read_bind(mnt, 'f') == b'fd\n'
    st = os.stat(mnt.path('f', 'bind'))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666, oct(st.st_mode)
    os.mkdir(mnt.path('p'))
    assert read_bind(mnt, 'p') == b'process\n'
    r = subprocess.run(['bash', '-c', 'mkdir "$1" && true', 'bash', mnt.path('s')],
                       env=_env('agent-3'), capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert read_bind(mnt, 's') == b'slug\n'
    assert lk.close(fd) == 0


def test_holder_binds_to_its_process_with_the_same_fence_and_no_release(mnt, procs):
    lk = procs.agent()
    fd = lk.take(fpath(mnt, 'x'))
    o1 = read_owner(mnt.mnt, 'x')
    assert lk.write(mnt.path('x', 'bind'), b'process\n') == 0
    o2 = read_owner(mnt.mnt, 'x')
    assert o2['bound'] == 'process'
    assert (o2['fence'], o2['holder']['pid'], o2['token']) == (o1['fence'], lk.pid, o1['token'])
    assert read_bind(mnt, 'x') == b'process\n'
    ev = [l for l in log_for(mnt.dir, 'x')]
    assert [l.event for l in ev] == ['acquired', 'bound'], ev
    assert ev[1].details.get('bound') == 'process'
    assert ev[1].details.get('fence') == str(o1['fence'])
    # the descriptor's close releases nothing now
    assert lk.close(fd) == 0
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    probe = procs.agent()
    assert is_wouldblock(probe.flock(probe.open(fpath(mnt, 'x')), EX | NB))
    assert read_owner(mnt.mnt, 'x')['fence'] == o1['fence']
    assert lk.rmdir(mnt.path('x')) == 0
    assert [l.event for l in log_for(mnt.dir, 'x')] == ['acquired', 'bound', 'released']


def test_a_bound_lock_is_released_when_its_process_exits(mnt, procs):
    lk = procs.agent()
    lk.take(fpath(mnt, 'x'))
    assert lk.write(mnt.path('x', 'bind'), b'process') == 0
    lk.kill()
    wait_free(mnt, 'x', timeout=2)
    rec = wait_log(mnt.dir, 'x', 'recovered')[0]
    assert 'exited' in evidence(rec), rec.raw


def test_a_shell_waits_its_turn_then_keeps_the_lock_across_commands(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    sh = procs.shell()
    tag = sh.start(f'exec 9>{sh_quote(fpath(mnt, "x"))}; flock 9')
    wait_waiters(mnt, 'x', [sh.pid])
    assert holder.rmdir(mnt.path('x')) == 0
    assert sh.wait(tag, 10)[0] == 0
    fence = read_owner(mnt.mnt, 'x')['fence']
    sh.ok(f'echo process > {sh_quote(mnt.path("x", "bind"))}')
    sh.ok('exec 9>&-')
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    o = read_owner(mnt.mnt, 'x')
    assert (o['bound'], o['holder']['pid'], o['fence']) == ('process', sh.pid, fence)
    sh.ok(f'echo "step 2" > {sh_quote(mnt.path("x", "operation"))}')
    assert read_owner(mnt.mnt, 'x')['operation'] == 'step 2'
    sh.ok(f'rmdir {sh_quote(mnt.path("x"))}')
    assert not os.path.lexists(mnt.lockdir('x'))
    ev = [l.event for l in log_for(mnt.dir, 'x')]
    assert ev == ['acquired', 'released', 'acquired', 'bound', 'released'], ev


def test_flock1_with_a_command_binds_for_the_calling_shell(mnt):
    """flock(1) M/.flock/x sh -c 'echo process > M/x/bind': the outer bash
    keeps the lock after flock(1) and its descriptor are gone."""
    script = ('flock "$1" sh -c \'echo process > "$1"\' sh "$2/x/bind" || exit 9; '
              'echo "$$"; cat "$2/x/owner"; true')
    r = subprocess.run(['bash', '-c', script, 'bash', fpath(mnt, 'x'), mnt.mnt],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid, rec = r.stdout.decode().split('\n', 1)
    o = json.loads(rec)
    assert (o['bound'], o['holder']['pid'], o['holder']['comm']) == ('process', int(pid), 'bash')
    wait_free(mnt, 'x', timeout=2)             # that bash has exited since
    assert [l.event for l in log_for(mnt.dir, 'x')][-1] == 'recovered'


def test_a_child_of_the_holder_may_bind_for_it(mnt, procs):
    sh = procs.shell()
    sh.ok(f'exec 9>{sh_quote(fpath(mnt, "x"))}; flock 9')
    sh.ok(f'sh -c \'echo process > "$1"\' sh {sh_quote(mnt.path("x", "bind"))}')
    o = read_owner(mnt.mnt, 'x')
    assert (o['bound'], o['holder']['pid']) == ('process', sh.pid)


def test_slug_binding_survives_the_shell(mnt, procs):
    sh = procs.shell(env={'LOCKFS_SLUG': 'agent-9'})
    sh.ok(f'exec 9>{sh_quote(fpath(mnt, "x"))}; flock 9')
    fence = read_owner(mnt.mnt, 'x')['fence']
    sh.ok(f'echo slug > {sh_quote(mnt.path("x", "bind"))}')
    sh.ok('exec 9>&-')
    o = read_owner(mnt.mnt, 'x')
    assert (o['bound'], o['slug'], o['fence']) == ('slug', 'agent-9', fence)
    assert isinstance(o['lease'], dict) and o['lease']['ttl_s'] == 600
    assert read_bind(mnt, 'x') == b'slug\n'
    b = [l for l in log_for(mnt.dir, 'x') if l.event == 'bound']
    assert len(b) == 1 and b[0].details.get('bound') == 'slug'
    assert sh.exit() == 0
    _control_recovery(mnt, procs)
    assert stays_held(mnt, 'x', WINDOW)
    assert procs.agent().rmdir(mnt.path('x')) == errno.EPERM        # no slug
    r = subprocess.run(['bash', '-c', 'rmdir "$1"', 'bash', mnt.path('x')],
                       env=_env('agent-9'), capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(mnt.lockdir('x'))
    ends = [l.event for l in log_for(mnt.dir, 'x') if l.event in END_EVENTS]
    assert ends == ['released']


def test_slug_without_lockfs_slug_is_einval(mnt, procs):
    lk = procs.agent()
    lk.take(fpath(mnt, 'x'))
    assert lk.write(mnt.path('x', 'bind'), b'slug\n') == errno.EINVAL
    assert read_owner(mnt.mnt, 'x')['bound'] == 'fd'


def test_anyone_but_the_holder_gets_eperm(mnt_ao, users, procs):
    lk = procs.agent()
    lk.take(fpath(mnt_ao, 'x'))
    o = read_owner(mnt_ao.mnt, 'x')
    stranger = procs.agent()
    assert stranger.write(mnt_ao.path('x', 'bind'), b'process\n') == errno.EPERM
    other_uid = procs.agent(user=users[0])
    assert other_uid.write(mnt_ao.path('x', 'bind'), b'process\n') == errno.EPERM
    slugged = procs.agent(env={'LOCKFS_SLUG': 'agent-9'})
    assert slugged.write(mnt_ao.path('x', 'bind'), b'slug\n') == errno.EPERM
    assert read_owner(mnt_ao.mnt, 'x') == o
    assert not [l for l in log_for(mnt_ao.dir, 'x') if l.event == 'bound']
    assert lk.write(mnt_ao.path('x', 'bind'), b'process\n') == 0     # control


@pytest.mark.parametrize('text', [b'fd\n', b'Process\n', b'process\n\n', b'proc', b'x' * 64,
                                  b'process slug\n'])
def test_other_text_is_einval(mnt, procs, text):
    lk = procs.agent()
    lk.take(fpath(mnt, 'x'))
    assert lk.write(mnt.path('x', 'bind'), text) == errno.EINVAL
    assert read_owner(mnt.mnt, 'x')['bound'] == 'fd'


def test_bind_of_a_lock_that_is_not_an_exclusive_fd_lock_is_einval(mnt, procs):
    a = procs.agent()
    assert a.mkdir(mnt.path('m')) == 0                        # mkdir: already process-bound
    assert a.write(mnt.path('m', 'bind'), b'process\n') == errno.EINVAL
    r1, r2 = procs.agent(), procs.agent()
    r1.take(fpath(mnt, 's'), SH)
    r2.take(fpath(mnt, 's'), SH)
    assert r1.write(mnt.path('s', 'bind'), b'process\n') == errno.EINVAL   # shared
    assert read_owner(mnt.mnt, 's')['mode'] == 'shared'
    lk = procs.agent()
    lk.take(fpath(mnt, 'b'))
    assert lk.write(mnt.path('b', 'bind'), b'process\n') == 0
    assert lk.write(mnt.path('b', 'bind'), b'process\n') == errno.EINVAL  # no longer fd
