"""Issue 22 points 3 and 4 with podman: lockctl-static in a busybox
container, the daemon run by the unit's own command lines (the `service`
and `podman` fixtures of tests/integration/service/test_containers.py,
which skip with the reason where podman cannot run).

- A `lockctl run` in the container that is killed with SIGKILL leaves the
  lock with CMD until CMD ends.
- A `lockctl run` waiting in the container rides out a crash of the daemon
  and the unit's restart, and gets the lock from the new daemon.
"""

import errno
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'service'))
from lockfs_helpers import log_for, wait_until  # noqa: E402
from service_helpers import LOCKCTL_STATIC, static_lockctl_or_skip  # noqa: E402
from test_containers import PODMAN_FLAGS, podman, service  # noqa: E402,F401


def start_container(service, podman):
    base, image = podman
    r = service.host.run(base + ['run', '-d', '--name', 'c1', *PODMAN_FLAGS,
                                 '-v', f'{service.share}:/srv/lockfs:rslave',
                                 '-v', f'{LOCKCTL_STATIC}:/bin/lockctl:ro', image,
                                 'sleep', '120'], timeout=60)
    assert r['rc'] == 0, r['err']

    def in_c(*argv, detach=False):
        return service.host.run(base + ['exec', *(['-d'] if detach else []), 'c1', *argv],
                                timeout=30)
    return in_c


def pid_of_cmdline(prefix):
    """The one process (pid here) whose command line starts with PREFIX."""
    want = b'\0'.join(os.fsencode(a) for a in prefix) + b'\0'
    found = []
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                with open(f'/proc/{p}/cmdline', 'rb') as f:
                    if f.read().startswith(want):
                        found.append(int(p))
            except OSError:
                pass
    return found[0] if len(found) == 1 else None


def held(service, name):
    return service.host.errno_of('stat', f'{service.mnt}/{name}') == 0


def waiting(service, name):
    r = service.host.call(op='read', path=f'{service.mnt}/{name}/waiters')
    return len([l for l in r.get('data', '').splitlines() if l])


def test_podman_a_killed_lockctl_leaves_the_lock_with_cmd(service, podman):
    static_lockctl_or_skip()
    service.start()
    in_c = start_container(service, podman)
    cmd = ['sh', '-c', 'while [ ! -e /go ]; do sleep 0.05; done']
    r = in_c('lockctl', 'run', 'job', '--', *cmd, detach=True)
    assert r['rc'] == 0, r['err']
    wait_until(lambda: held(service, 'job'), 10, what='the lock of lockctl run')
    lockctl = pid_of_cmdline(['lockctl', 'run', 'job'])
    assert lockctl, 'lockctl run is not found'
    # lockctl takes the lock before it starts CMD: killed in between, it
    # leaves no CMD to hold the lock (and the lock rightly goes).
    wait_until(lambda: pid_of_cmdline(cmd), 10, what='CMD to run')
    os.kill(lockctl, signal.SIGKILL)
    wait_until(lambda: not os.path.exists(f'/proc/{lockctl}'), 10, what='lockctl to die')
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:               # a window for what must not happen
        assert held(service, 'job'), 'released while CMD still runs'
        time.sleep(0.02)
    r = in_c('mkdir', '/locks/job')
    assert r['rc'] != 0 and 'File exists' in r['err'], r
    assert in_c('sh', '-c', ': > /go')['rc'] == 0
    wait_until(lambda: service.host.errno_of('stat', f'{service.mnt}/job') == errno.ENOENT,
               10, what='the lock to end with CMD')
    assert [l.event for l in log_for(service.backing, 'job')] == ['acquired', 'released']


def test_podman_a_waiting_lockctl_rides_out_a_crash_and_restart(service, podman):
    static_lockctl_or_skip()
    service.start()
    in_c = start_container(service, podman)
    host = service.host
    assert host.call(op='mkdir', path=f'{service.mnt}/job').get('errno', 0) == 0
    r = in_c('lockctl', 'run', 'job', '--', 'sh', '-c', ': > /ran', detach=True)
    assert r['rc'] == 0, r['err']
    wait_until(lambda: waiting(service, 'job') == 1, 10, what='lockctl to wait in line')
    service.stop(signal.SIGKILL)
    service.stop_post()
    service.start()
    wait_until(lambda: waiting(service, 'job') == 1, 15,
               what='lockctl to queue again on the restarted daemon')
    assert host.call(op='rmdir', path=f'{service.mnt}/job').get('errno', 0) == 0
    wait_until(lambda: in_c('sh', '-c', '[ -e /ran ]')['rc'] == 0, 15, what='CMD to run')
