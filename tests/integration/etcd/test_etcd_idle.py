"""Issue 23 §2: an idle daemon on etcd wakes only for its session.

With nothing held or waited for on its host, the only periodic wake-ups
are the session's (docs/etcd.md, "At fleet scale"): the lease keepalive
(thread `lockfs-session`, every ttl/6) and the watch stream's ping
(`lockfs-watch`).  Nothing else wakes: not the liveness thread's tick, not
locks taken and released on another host, not names it looked at and
stopped watching (their records stay cached, and are not walked).
Wake-ups are counted per thread (voluntary context switches in
/proc/PID/task/*/status).
"""

import fcntl
import os
import threading
import time

from etcd_fixtures import etcd1  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from lockfs_helpers import idle_wakeups, read_owner, thread_wakeups

TTL = 30
QUIET_S = 3.0
# The session's own threads, and how often they may wake in QUIET_S: the
# keepalive at ttl/6 (5 s here) and the stream's ping are seconds apart.
PERIODIC = ('lockfs-session', 'lockfs-watch')
PERIODIC_MAX = 4


def test_an_idle_host_wakes_only_for_its_session(etcd1, etcd_mounts, procs):
    h1, h2 = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=1)
    a = procs.agent()
    # h2 has worked: a lock taken and released, a listing, an owner read
    # of a lock held on h1 (a name it then watches for a few seconds).
    assert a.mkdir(h2.path('mine')) == 0
    assert a.rmdir(h2.path('mine')) == 0
    assert a.mkdir(h1.path('theirs')) == 0
    assert read_owner(h2.mnt, 'theirs')['holder']['host'] == 'h1'
    os.listdir(h2.mnt)

    # Meanwhile h1 takes and releases locks h2 never looked at.
    stop = threading.Event()
    b = procs.agent()

    def churn():
        i = 0
        while not stop.is_set() and i < 2000:
            b.mkdir(h1.path(f'c{i % 50}'))
            b.rmdir(h1.path(f'c{i % 50}'))
            i += 1
    t = threading.Thread(target=churn)
    periodic0 = thread_wakeups(h2.pid)
    t.start()
    try:
        woke, settled = idle_wakeups(h2.pid, QUIET_S, allowed=PERIODIC)
    finally:
        stop.set()
        t.join(timeout=30)
    assert settled and not woke, \
        f'an idle etcd daemon woke over {QUIET_S} s, by thread: {woke}'
    periodic = {}
    for key, n in thread_wakeups(h2.pid).items():
        if key[0] in PERIODIC:
            periodic[key] = n - periodic0.get(key, 0)
    assert all(n <= PERIODIC_MAX * 4 for n in periodic.values()), periodic


def cpu_ms(pid):
    """utime + stime of PID, in ms."""
    with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf('SC_CLK_TCK')


def test_names_looked_at_cost_nothing_once_looked_at(etcd1, etcd_mounts, procs):
    # `ls -l` of many locks held on another host: every name looked at
    # (its record read, and cached).  Once the looks are over, the idle
    # daemon's cost does not depend on how many there were: no tick walks
    # them (issue 23: 10,000 such names cost 5 % of a CPU before).
    h1, h2 = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=TTL, lock_delay=1)
    a = procs.agent()
    names = [f'n{i}' for i in range(600)]
    for n in names:
        assert a.mkdir(h1.path(n)) == 0
    for n in names:
        assert os.stat(h2.path(n)).st_mode
        assert read_owner(h2.mnt, n)['holder']['host'] == 'h1'
    # A waiter on h2 keeps its tick going meanwhile, long enough for the
    # tick to have walked every stripe of its table in turn (once in 5 s,
    # recovery.c): those cached names must not make it due.
    k, w = procs.agent(), procs.agent()
    kfd = k.open(h2.path('.flock', 'keeper'))
    assert k.flock(kfd, fcntl.LOCK_EX) == 0
    wfd = w.open(h2.path('.flock', 'keeper'))
    rid = w.flock_start(wfd, fcntl.LOCK_EX)
    woke, _ = idle_wakeups(h2.pid, 6.0, allowed=PERIODIC, settle=0)
    assert woke.get('lockfs-liveness'), 'the tick runs while a waiter waits here'
    assert k.close(kfd) == 0
    assert w.wait(rid).get('errno', 0) == 0
    assert w.close(wfd) == 0
    cpu0 = cpu_ms(h2.pid)
    woke, settled = idle_wakeups(h2.pid, QUIET_S, allowed=PERIODIC)
    assert settled and not woke, \
        f'with {len(names)} names looked at, h2 woke over {QUIET_S} s: {woke}'
    # (the settling itself is in the figure: it is bounded too)
    assert cpu_ms(h2.pid) - cpu0 < 100


# The liveness thread's tick while a lock is held here (core/engine.c).
TICK_S = 0.05
PAIRS = 200


def test_a_hosts_own_mkdir_and_rmdir_wake_no_thread_for_their_echo(etcd1, etcd_mounts, procs):
    """The watch brings back every write of this host to a name it watches.
    For an uncontended mkdir or rmdir that echo is no news -- the engine has
    the result already, or will have once etcd's answer to the write is in,
    which the echo usually beats -- so the liveness thread is not woken for
    it: it wakes only for its ticks while the lock is held."""
    h1, = etcd_mounts(etcd1, hosts=('h1',), ttl=TTL)
    a = procs.agent()
    assert a.mkdir(h1.path('p')) == 0  # from here on h1 watches p
    assert a.rmdir(h1.path('p')) == 0
    before = thread_wakeups(h1.pid)
    t0 = time.monotonic()
    for i in range(PAIRS):
        assert a.mkdir(h1.path('p')) == 0, f'pair {i}'
        assert a.rmdir(h1.path('p')) == 0, f'pair {i}'
    elapsed = time.monotonic() - t0
    after = thread_wakeups(h1.pid)
    woke = sum(n - before.get(key, 0) for key, n in after.items() if key[0] == 'lockfs-liveness')
    # Its ticks, with room for the odd round of work; one wake per echo
    # would be 2 per pair.
    assert woke <= elapsed / TICK_S * 1.5 + 10, \
        f'the liveness thread woke {woke} times in {PAIRS} pairs ({elapsed:.2f} s)'
