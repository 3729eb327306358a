"""Issue 22 §5 with podman: `lockctl status` in a container shows the
container's view.

A lock held by the container's own shell shows its pid there (1) and the
container (CONTAINER: the id's first 12 characters); a lock held on the
host shows no pid ("-") and `(outside)`; messages say `held by sh[1]` and
`(outside this pid namespace)`, never a host pid; `--json` gives each
holder its `pid_here`.  The unshare cases are in test_lockctl_status.py.

Skipped, with the reason, where podman cannot run a container.
"""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lockfs_helpers import wait_until  # noqa: E402
from podman_helpers import pm, podman_storage, start_container  # noqa: E402
from test_lockctl import COLUMNS, table  # noqa: E402

PID, CONTAINER, HOLDER = COLUMNS.index('PID'), COLUMNS.index('CONTAINER'), COLUMNS.index('HOLDER')


@pytest.fixture(scope='module')
def podman():
    yield from podman_storage()


@pytest.fixture
def held_in_and_out(podman, mnt_ao, procs):
    """`in` held by a container's main shell, `host` by a process here:
    (container id, the host holder)."""
    outside = procs.agent()
    assert outside.mkdir(mnt_ao.path('host')) == 0
    cid = start_container(podman, mnt_ao.mnt, 'sh', '-c', 'mkdir /locks/in && exec sleep 600')
    try:
        wait_until(lambda: os.path.isdir(mnt_ao.path('in')), timeout=30,
                   what="the container's lock")
        yield cid, outside
    finally:
        pm(podman, 'rm', '-f', '-t', '0', cid)


def in_container(podman, cid, *args):
    r = pm(podman, 'exec', cid, 'lockctl', '--mount', '/locks', *args)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def rows_by_name(out):
    header, rows = table(out.encode())
    assert header == COLUMNS, header
    return {r[0]: r for r in rows}


@pytest.mark.slow
def test_podman_status_shows_the_containers_pids_and_container(podman, held_in_and_out):
    cid, outside = held_in_and_out
    rc, out, err = in_container(podman, cid, 'status')
    assert rc == 0, err
    rows = rows_by_name(out)
    # sh is the container's pid 1, not `sleep`'s host pid
    assert rows['in'][PID] == '1', rows['in']
    assert rows['in'][CONTAINER] == cid[:12], rows['in']
    assert rows['host'][PID] == '-' and rows['host'][HOLDER].endswith('(outside)'), rows['host']
    assert rows['host'][CONTAINER] == '-', rows['host']
    assert str(outside.pid) not in out


@pytest.mark.slow
def test_podman_messages_name_the_containers_pids(podman, held_in_and_out):
    cid, outside = held_in_and_out
    rc, _, err = in_container(podman, cid, 'run', 'in', '--timeout', '0', '--', 'true')
    assert rc == 75 and 'held by sh[1] for ' in err, (rc, err)
    rc, _, err = in_container(podman, cid, 'run', 'host', '--timeout', '0', '--', 'true')
    assert rc == 75 and '(outside this pid namespace)' in err, (rc, err)
    assert str(outside.pid) not in err, err


@pytest.mark.slow
def test_podman_status_json_gives_pid_here_and_container(podman, held_in_and_out):
    cid, outside = held_in_and_out
    rc, out, err = in_container(podman, cid, 'status', '--json')
    assert rc == 0, err
    by_name = {o['resource']: o['holder'] for o in json.loads(out)}
    assert (by_name['in']['pid_here'], by_name['in']['container']) == (1, cid), by_name['in']
    assert by_name['host']['pid_here'] is None and by_name['host']['container'] is None
