"""Issue 11: waiting is strict FIFO across hosts, in etcd create_revision
order, and a try-lock (mkdir) on any host never barges ahead of a waiter."""

import errno
import fcntl
import json
import threading
import time

import pytest

from etcd_fixtures import etcd1, etcd3  # noqa: F401
from etcd_mounts import etcd_mounts  # noqa: F401
from lockfs_helpers import wait_until

ORDER = ('h1', 'h2', 'h3', 'h1', 'h2', 'h3')


class Barger:
    """An agent per host trying `mkdir M/NAME` in a loop, from its own thread,
    until stopped: counts its tries and any success (a barge)."""

    def __init__(self, procs, hosts, name):
        self.agents = [(m, procs.agent()) for m in hosts]
        self.name = name
        self.stop = threading.Event()
        self.tries, self.answers = 0, {}
        self.won_at = []     # monotonic time each successful mkdir returned
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            for m, a in self.agents:
                rc = a.mkdir(m.path(self.name))
                if rc == 0:
                    self.won_at.append(time.monotonic())
                self.tries += 1
                self.answers[rc] = self.answers.get(rc, 0) + 1
                if rc == 0:          # give it back (a barge if it was early)
                    a.rmdir(m.path(self.name))
            time.sleep(0.003)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


@pytest.mark.slow
def test_waiters_on_three_hosts_are_granted_in_arrival_order(etcd3, etcd_mounts, procs):
    hosts = etcd_mounts(etcd3, ttl=10)
    h = {m.host: m for m in hosts}
    holder = procs.agent()
    assert holder.mkdir(h['h1'].path('q')) == 0

    # Waiters arrive one at a time, h1 h2 h3 h1 h2 h3: each is in line (its
    # key in etcd) before the next asks.
    waiters = []
    for i, host in enumerate(ORDER):
        a = procs.agent()
        fd = a.open(h[host].path('.flock', 'q'))
        rid = a.flock_start(fd, fcntl.LOCK_EX)
        wait_until(lambda: len(hosts.lock_keys('q')) == 2 + i, timeout=10,
                   what=f'waiter {i} on {host} in line in etcd')
        assert a.poll(rid) is None, f'waiter {i} on {host} was granted while q was held'
        waiters.append((host, a, fd, rid))

    with Barger(procs, hosts, 'q') as barger:
        assert holder.rmdir(h['h1'].path('q')) == 0
        for i, (host, a, fd, rid) in enumerate(waiters):
            # the next in line is granted, and nobody after it
            ans = a.wait(rid, timeout=15)
            assert ans.get('errno', 0) == 0, f'waiter {i} on {host}: {ans}'
            for j, (h2, b, _, r2) in enumerate(waiters[i + 1:], i + 1):
                assert b.poll(r2) is None, f'waiter {j} on {h2} granted before waiter {i}'
            last_unlock = time.monotonic()
            assert a.flock(fd, fcntl.LOCK_UN) == 0
        # after the last release a barger may take q: that is no barge
    assert barger.tries > 0
    barges = [t for t in barger.won_at if t < last_unlock]
    assert barges == [], f'mkdir barged ahead of waiters {len(barges)} times: {barger.answers}'
    assert set(barger.answers) <= {0, errno.EEXIST}, barger.answers

    # the logs agree: grants in fence order are the holder, then the
    # waiters in arrival order, each on its own host
    grants = [g for g in hosts.grants('q')]
    pids = [holder.pid] + [a.pid for _, a, _, _ in waiters]
    got = [(g.host, int(g.line.details['pid'])) for g in grants][:len(pids)]
    assert got == list(zip(('h1',) + ORDER, pids)), got
    assert hosts.check_history(held=set()) == []
    wait_until(lambda: hosts.lock_keys('q') == [], timeout=10, what='q free in etcd')


def test_waiters_lists_every_hosts_waiters_in_the_stores_order_with_their_host(
        etcd1, etcd_mounts, procs):
    # Issue 23 part 5 (left from issue 11): `M/NAME/waiters` on any host is
    # the one line in etcd, every host's waiters in create_revision order,
    # each with its host -- not only this host's.
    hosts = etcd_mounts(etcd1, hosts=('h1', 'h2'), ttl=10, lock_delay=1)
    h1, h2 = hosts
    holder = procs.agent()
    assert holder.mkdir(h1.path('q')) == 0
    order = []
    for m in (h2, h1, h2):
        w = procs.agent()
        w.flock_start(w.open(m.path('.flock', 'q')), fcntl.LOCK_EX)
        order.append((w.pid, m.host))
        wait_until(lambda: len(hosts.lock_keys('q')) == 1 + len(order), timeout=10,
                   what=f'{len(order)} waiter(s) in line')
    for m in (h1, h2):
        lines = [json.loads(l) for l in
                 open(m.path('q', 'waiters'), encoding='utf-8').read().splitlines()]
        assert [(w['pid'], w['host']) for w in lines] == order, (m.host, lines)
        assert all(w['mode'] == 'exclusive' and w['kind'] == 'flock' for w in lines), lines
    assert holder.rmdir(h1.path('q')) == 0
