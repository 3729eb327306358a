"""Issue 24 §1 with podman: slots taken from containers.

Two containers share the mount at /locks: a `mkdir /locks/.slots/NAME=N` in
one shows its holder as that container's process, and `lockctl run NAME
--slots N` in the other gets the other slot in LOCKFS_SLOT.  Skipped, with
the reason, where podman cannot run a container (../shared
containers-measured.md: runc, ulimits).  The module's own podman storage is
removed afterwards, with its containers.
"""

import json
import os

import pytest

from lockfs_helpers import wait_until
from podman_helpers import pm, podman_storage, start_container


@pytest.fixture(scope='module')
def podman():
    yield from podman_storage()


@pytest.fixture
def two_containers(podman, mnt_ao):
    cids = [start_container(podman, mnt_ao.mnt, 'sleep', '600') for _ in range(2)]
    yield cids
    for cid in cids:
        pm(podman, 'rm', '-f', '-t', '0', cid)


@pytest.mark.slow
def test_two_containers_share_the_slots_of_one_name(podman, mnt_ao, two_containers):
    c1, c2 = two_containers
    # c1 holds slot 0 for as long as its shell lives (it execs sleep).
    r = pm(podman, 'exec', '-d', c1, 'sh', '-c',
           'mkdir /locks/.slots/gpu=2 && exec sleep 600')
    assert r.returncode == 0, r.stderr
    wait_until(lambda: os.path.exists(mnt_ao.path('.slots', 'gpu')),
               timeout=30, what='c1 holds a slot')
    with open(mnt_ao.path('.slots', 'gpu', 'owner')) as f:
        [h] = json.load(f)['holders']
    assert (h['slot'], h['container']) == (0, c1), h
    assert h['ns_pid'] != h['pid'], h
    r = pm(podman, 'exec', c2, 'lockctl', '--mount', '/locks', 'run', 'gpu', '--slots', '2',
           '--', 'sh', '-c', 'echo "$LOCKFS_SLOT"; cat /locks/.slots/gpu/owner')
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    slot, rest = out.split('\n', 1)
    assert slot == '1'
    hs = json.loads(rest)['holders']
    assert sorted((x['slot'], x['container']) for x in hs) == [(0, c1), (1, c2)]
    # lockctl let slot 1 go with its CMD: c2's shell takes it, and then
    # finds both held.
    r = pm(podman, 'exec', c2, 'sh', '-c',
           'mkdir /locks/.slots/gpu=2 && mkdir /locks/.slots/gpu=2')
    assert r.returncode != 0 and b'exists' in r.stderr, r.stderr
    # c1's container goes: its slot is recovered.
    pm(podman, 'rm', '-f', '-t', '0', c1)
    wait_until(lambda: not os.path.exists(mnt_ao.path('.slots', 'gpu')),
               timeout=30, what="c1's slot recovered")
