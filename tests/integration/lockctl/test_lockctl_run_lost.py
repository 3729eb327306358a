"""Issue 23 part 4 and issue 24 section 2: `lockctl run` as `consul lock`
runs a command, on real mounts (docs/lockctl.1, "run").

- CMD gets the fence of its grant in LOCKFS_FENCE: the fence `owner` shows
  (on the directory store and on etcd, where it is the key's
  create_revision);
- when the lock is lost while CMD runs (on etcd: its key removed behind it,
  or the daemon's session lost to a partition; anywhere: broken by root),
  CMD and its descendants get --lost-signal (SIGTERM), then SIGKILL after
  --lost-grace, and lockctl exits 76;
- `lockctl run a b c -- CMD` takes its names in byte order, so that runs
  that name the same locks in other orders never deadlock, and releases
  what it took when one cannot be taken.

Every lockctl runs under its own `sh` (the process the daemon records as
the fd lock's holder, lockctl being a helper) in a new session; at teardown
each such process group (sh, lockctl, CMD and CMD's child) is SIGKILLed by
its id, before the mounts are taken down.
"""

import datetime
import json
import os
import signal
import subprocess
import time

import pytest

from etcd_fixtures import etcd1, tcp_proxy  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from lockfs_helpers import BUILD, PYTHON, read_owner, wait_until

LOCKCTL = os.path.join(BUILD, 'tools', 'lockctl')
EX_USAGE, EX_TEMPFAIL, EX_LOST = 64, 75, 76

# CMD: writes {"pid", "fence"} to OUT once it runs, notes every SIGTERM or
# SIGUSR1 in OUT.sig (with the monotonic and the wall time), and then exits 3 ("exit")
# or carries on ("ignore"); its child (a sleep) shows what happens to
# CMD's descendants.
CMD = r'''
import json, os, signal, subprocess, sys, time
out, mode = sys.argv[1], sys.argv[2]
def noted(sig, frame):
    with open(out + '.sig', 'a') as f:
        f.write('%d %f %f\n' % (sig, time.monotonic(), time.time()))
    if mode == 'exit':
        os._exit(3)
signal.signal(signal.SIGTERM, noted)
signal.signal(signal.SIGUSR1, noted)
ign = lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == 'ignore' else signal.SIG_DFL)
child = subprocess.Popen(['sleep', '300'], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, preexec_fn=ign)
with open(out + '.tmp', 'w') as f:
    json.dump({'pid': os.getpid(), 'child': child.pid,
               'fence': os.environ.get('LOCKFS_FENCE')}, f)
os.rename(out + '.tmp', out)
while True:
    time.sleep(1)
'''


@pytest.fixture(autouse=True)
def _require_lockctl():
    if not os.access(LOCKCTL, os.X_OK):
        pytest.fail(f'{LOCKCTL} is not an executable file (meson compile -C BUILD)')


@pytest.fixture
def groups(procs):
    """The process groups run_bg started (their leaders' pids), killed at
    teardown (before procs' own cleanup and the unmount)."""
    started = []
    yield started
    for pg in started:
        try:
            os.killpg(pg, signal.SIGKILL)
        except ProcessLookupError:
            continue
    for pg in started:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(pg, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)


def clean_env(extra=None):
    e = {k: v for k, v in os.environ.items()
         if k not in ('LOCKFS_SLUG', 'LOCKFS_MOUNT', 'LOCKFS_LOST_SIGNAL', 'LOCKFS_LOST_GRACE')}
    e.update(extra or {})
    return e


def run_bg(procs, groups, m, args, env=None):
    """`sh -c 'lockctl --mount M ARGS; exit $?'` in the background: sh is the
    fd lock's recorded holder, and its status is lockctl's."""
    p = procs.popen(['sh', '-c', '"$@"; exit $?', 'sh', LOCKCTL, '--mount', m.mnt] + args,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(env),
                    start_new_session=True)
    groups.append(p.pid)
    return p


def run_cmd(procs, groups, m, names, out, mode='exit', opts=(), env=None):
    args = ['run'] + list(names) + list(opts) + ['--', PYTHON, '-c', CMD, str(out), mode]
    return run_bg(procs, groups, m, args, env=env)


def started(out, p, timeout=15):
    def ready():
        if p.poll() is not None:
            pytest.fail(f'lockctl ended early ({p.returncode}): {p.stderr.read()!r}')
        return out.exists() and json.loads(out.read_text())
    return wait_until(ready, timeout=timeout, what='CMD running')


def signals_of(out):
    path = out.parent / (out.name + '.sig')
    if not path.exists():
        return []
    return [(int(s), float(t), float(w))
            for s, t, w in (l.split() for l in path.read_text().splitlines())]


def alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except FileNotFoundError:
        return False


def ended(p, timeout):
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f'lockctl did not end within {timeout} s of the loss')
    return p.returncode, p.stderr.read().decode()


def lost_to_signal_ms(lost, sigs):
    """From the `lost` line's time to CMD's first signal, in ms; bounded
    by lockctl's 200 ms look at owner (plus a loaded machine's delays)."""
    t = datetime.datetime.strptime(lost.timestamp, '%Y-%m-%dT%H:%M:%S.%fZ')
    t = t.replace(tzinfo=datetime.timezone.utc).timestamp()
    ms = (sigs[0][2] - t) * 1000
    assert ms < 2000, f'CMD signalled {ms:.0f} ms after the loss was logged'
    return ms


def finish(p, info):
    """End CMD (it exits 3 on SIGTERM: run's status) and its child."""
    os.kill(info['pid'], signal.SIGTERM)
    assert ended(p, 10)[0] == 3
    os.kill(info['child'], signal.SIGKILL)


def owner_fence(mnt, name):
    return read_owner(mnt, name)['fence']


# --------------------------------------------------------------------------
# the fence

def test_cmd_gets_its_grants_fence_on_the_directory_store(mnt, procs, groups, tmp_path):
    out = tmp_path / 'cmd'
    p = run_cmd(procs, groups, mnt, ['x'], out)
    info = started(out, p)
    assert info['fence'] is not None, 'LOCKFS_FENCE is not set'
    assert int(info['fence']) == owner_fence(mnt.mnt, 'x') > 0
    finish(p, info)


def test_cmd_gets_its_grants_fence_on_etcd(etcd1, etcd_mounts, procs, groups, tmp_path):
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=20)
    h1, = hosts
    out = tmp_path / 'cmd'
    p = run_cmd(procs, groups, h1, ['x'], out)
    info = started(out, p)
    assert info['fence'] is not None, 'LOCKFS_FENCE is not set'
    (_, _, create_revision, _), = hosts.lock_keys('x')
    assert int(info['fence']) == owner_fence(h1.mnt, 'x') == create_revision
    finish(p, info)


# --------------------------------------------------------------------------
# a lock lost while CMD runs

def test_lock_removed_in_etcd_stops_cmd_with_sigterm_and_exits_76(
        etcd1, etcd_mounts, procs, groups, tmp_path):
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=20)
    h1, = hosts
    out = tmp_path / 'cmd'
    p = run_cmd(procs, groups, h1, ['x'], out)
    info = started(out, p)
    assert signals_of(out) == []                      # control: nothing yet
    (key, _, _, _), = hosts.lock_keys('x')
    hosts.cluster.etcdctl('del', key)
    lost = hosts.wait_log(h1, 'x', 'lost')[0]
    rc, err = ended(p, 10)
    assert rc == EX_LOST, err
    sigs = signals_of(out)
    assert [s for s, _, _ in sigs] == [signal.SIGTERM]
    print(f'\nlost logged -> CMD signalled: {lost_to_signal_ms(lost, sigs):.0f} ms')
    assert 'x: the lock was lost while CMD ran' in err and f'fence {info["fence"]}' in err, err
    wait_until(lambda: not alive(info['child']), timeout=5, what="CMD's child stopped too")


@pytest.mark.slow
def test_session_lost_to_a_partition_sigkills_a_cmd_that_ignores_sigterm_after_the_grace(
        etcd1, tcp_proxy, etcd_mounts, procs, groups, tmp_path):
    proxy = tcp_proxy(etcd1.members[0].client_port)
    hosts = etcd_mounts(etcd1, hosts=('h1',), ttl=2, lock_delay=1,
                        endpoints={'h1': proxy.url})
    h1, = hosts
    out = tmp_path / 'cmd'
    grace = 1.5
    p = run_cmd(procs, groups, h1, ['x'], out, mode='ignore', opts=['--lost-grace', str(grace)])
    info = started(out, p)
    proxy.pause()
    try:
        lost = hosts.wait_log(h1, 'x', 'lost', timeout=15)[0]
        assert lost.details.get('evidence') == 'session-expired', lost
        rc, err = ended(p, 15)
        t_end = time.monotonic()
    finally:
        proxy.resume()
    assert rc == EX_LOST, err
    sigs = signals_of(out)
    assert [s for s, _, _ in sigs] == [signal.SIGTERM], sigs
    print(f'\nlost logged -> CMD signalled: {lost_to_signal_ms(lost, sigs):.0f} ms')
    # SIGKILL came after the grace, not before: CMD lived on until then
    assert t_end - sigs[0][1] >= grace - 0.1, (t_end - sigs[0][1], grace)
    assert not alive(info['pid']) and not alive(info['child'])
    assert 'SIGKILL in 1.5s' in err, err


def test_broken_lock_on_the_directory_store_uses_the_env_signal_and_grace(
        mnt, procs, groups, tmp_path):
    out = tmp_path / 'cmd'
    p = run_cmd(procs, groups, mnt, ['x'], out, mode='ignore',
                env={'LOCKFS_LOST_SIGNAL': 'USR1', 'LOCKFS_LOST_GRACE': '0.5'})
    info = started(out, p)
    r = subprocess.run([LOCKCTL, '--mount', mnt.mnt, 'break', 'x', '--reason', 'test'],
                       capture_output=True, env=clean_env(), timeout=10)
    assert r.returncode == 0, r.stderr
    rc, err = ended(p, 10)
    assert rc == EX_LOST, err
    assert [s for s, _, _ in signals_of(out)] == [signal.SIGUSR1]
    assert not alive(info['pid']) and not alive(info['child'])


def test_help_and_man_page_say_the_lost_options_the_fence_and_76():
    out = subprocess.run([LOCKCTL, '--help'], capture_output=True, timeout=10).stdout.decode()
    page = open(os.path.join(os.path.dirname(__file__), '..', '..', '..', 'docs',
                             'lockctl.1')).read().replace('\\-', '-')
    for text in (out, page):
        for word in ('--lost-signal', '--lost-grace', 'LOCKFS_LOST_SIGNAL', 'LOCKFS_LOST_GRACE',
                     'LOCKFS_FENCE', '76'):
            assert word in text, word
    assert 'NAME [NAME...]' in out and 'LOST LOCKS' in page


def test_lost_options_are_checked(mnt):
    for args in (['--lost-signal', 'NOPE'], ['--lost-grace', '-1']):
        r = subprocess.run([LOCKCTL, '--mount', mnt.mnt, 'run', 'x'] + args + ['--', 'true'],
                           capture_output=True, env=clean_env(), timeout=10)
        assert r.returncode == EX_USAGE, (args, r.stderr)
    r = subprocess.run([LOCKCTL, '--mount', mnt.mnt, 'run', 'x', '--lost-signal', 'INT', '--',
                        'true'], capture_output=True, env=clean_env(), timeout=10)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------
# several names

# CMD of the herd: checks that owner shows each of its names held by its
# lockctl's parent with the fence LOCKFS_FENCE gives in name order, and
# writes enter/leave lines to a witness file (O_APPEND).
HERD_CMD = r'''
import json, os, sys, time
mnt, witness, tag = sys.argv[1], sys.argv[2], sys.argv[3]
names = sorted(sys.argv[4:])
fences = os.environ['LOCKFS_FENCE'].split(' ')
with open('/proc/%d/stat' % os.getppid()) as f:
    holder = int(f.read().rsplit(')', 1)[1].split()[1])   # lockctl's parent
fd = os.open(witness, os.O_WRONLY | os.O_APPEND)
os.write(fd, ('enter %s\n' % tag).encode())
for name, fence in zip(names, fences):
    with open(os.path.join(mnt, name, 'owner')) as f:
        o = json.load(f)
    h = o['holders'][0]
    if len(fences) != len(names) or h['pid'] != holder or h['fence'] != int(fence):
        os.write(fd, ('BAD %s %s %r %r\n' % (tag, name, h, fences)).encode())
time.sleep(0.003)
os.write(fd, ('leave %s\n' % tag).encode())
'''


def test_several_names_in_opposite_orders_never_deadlock(mnt, procs, groups, tmp_path):
    witness = tmp_path / 'witness'
    witness.write_text('')
    rounds = 40
    orders = {'A': ['a', 'b', 'c'], 'B': ['c', 'b', 'a']}
    loops = []
    for tag, names in orders.items():
        script = ('i=0; while [ $i -lt %d ]; do "$@" || exit $?; i=$((i+1)); done' % rounds)
        args = [LOCKCTL, '--mount', mnt.mnt, 'run'] + names + [
            '--', PYTHON, '-S', '-c', HERD_CMD, mnt.mnt, str(witness), tag] + names
        loops.append(procs.popen(['sh', '-c', script, 'sh'] + args, stderr=subprocess.PIPE,
                                 env=clean_env(), start_new_session=True))
        groups.append(loops[-1].pid)
    deadline = time.monotonic() + 120
    for p in loops:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail('the two runs did not finish: deadlocked?')
        assert p.returncode == 0, p.stderr.read()
    lines = witness.read_text().splitlines()
    assert len(lines) == 2 * rounds * 2
    assert not [l for l in lines if l.startswith('BAD')], lines
    # one CMD at a time: enter and leave alternate, each leave its enter's
    for enter, leave in zip(lines[0::2], lines[1::2]):
        assert enter.startswith('enter ') and leave == 'leave ' + enter[6:], (enter, leave)
    for name in orders['A']:
        assert not os.path.exists(mnt.path(name)), f'{name} still held'


def test_several_names_one_busy_releases_those_taken(mnt, procs, groups, tmp_path):
    other = procs.agent()
    assert other.mkdir(mnt.path('b')) == 0
    r = subprocess.run([LOCKCTL, '--mount', mnt.mnt, 'run', 'c', 'b', 'a', '--timeout', '0.3',
                        '--', 'true'], capture_output=True, env=clean_env(), timeout=10)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert b'b: timed out' in r.stderr, r.stderr
    # a was taken first (byte order) and given back; c was never taken
    assert not os.path.exists(mnt.path('a')) and not os.path.exists(mnt.path('c'))
    assert other.mkdir(mnt.path('a')) == 0 and other.mkdir(mnt.path('c')) == 0
    for n in 'abc':
        assert other.rmdir(mnt.path(n)) == 0


def test_several_names_fences_in_name_order_and_duplicates_refused(mnt, procs, groups, tmp_path):
    r = subprocess.run([LOCKCTL, '--mount', mnt.mnt, 'run', 'zeta', 'alpha', 'mid', '--',
                        'sh', '-c', 'echo "$LOCKFS_FENCE"; for n in alpha mid zeta; do'
                        ' cat "$0/$n/owner"; done', mnt.mnt],
                       capture_output=True, env=clean_env(), timeout=10)
    assert r.returncode == 0, r.stderr
    first, rest = r.stdout.decode().split('\n', 1)
    dec, owners, i = json.JSONDecoder(), [], 0
    while rest[i:].strip():
        while rest[i].isspace():
            i += 1
        o, i = dec.raw_decode(rest, i)
        owners.append(o)
    assert [o['resource'] for o in owners] == ['alpha', 'mid', 'zeta']
    assert first.split(' ') == [str(o['fence']) for o in owners]
    r = subprocess.run([LOCKCTL, '--mount', mnt.mnt, 'run', 'a', 'b', 'a', '--', 'true'],
                       capture_output=True, env=clean_env(), timeout=10)
    assert r.returncode == EX_USAGE and b"'a' is given twice" in r.stderr, r.stderr
