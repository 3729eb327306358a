#!/usr/bin/python3
"""Issue 9 §4: lockctl-static works in any image.

The image here is the smallest there is: a root directory holding only
/bin/lockctl (the static binary), an empty /proc (for mountinfo) and /locks,
onto which a real lockfs mount is bound.  lockctl runs chrooted into it
(`unshare --mount --pid --fork --root=ROOT --mount-proc`).  The dynamically
linked lockctl in the same root cannot even start: the negative control that
shows the root really has no libraries.
"""

import json
import os
import shutil
import subprocess

import pytest

from service_helpers import BUILD, LOCKCTL_STATIC, static_lockctl_or_skip

LOCKCTL = os.path.join(BUILD, 'tools', 'lockctl')


@pytest.fixture
def image_root(tmp_path, mnt_ao):
    """run(argv) inside a root with only /bin/lockctl and MNT at /locks."""
    static_lockctl_or_skip()
    root = tmp_path / 'root'
    for d in ('bin', 'proc', 'locks'):
        (root / d).mkdir(parents=True)
    os.chmod(tmp_path, 0o755)

    def run(binary, *args, timeout=20):
        shutil.copy(binary, root / 'bin' / 'lockctl')
        script = ('m=$1; r=$2; shift 2; mount --bind "$m" "$r/locks"; '
                  'exec unshare --pid --fork --root="$r" --mount-proc /bin/lockctl "$@"')
        return subprocess.run(['unshare', '--mount', 'sh', '-c', script, 'sh',
                               mnt_ao.mnt, str(root), *args],
                              capture_output=True, text=True, timeout=timeout)
    run.mnt = mnt_ao
    return run


def test_static_lockctl_needs_no_shared_library():
    static_lockctl_or_skip()
    r = subprocess.run(['readelf', '-l', '-d', LOCKCTL_STATIC], capture_output=True, text=True)
    assert r.returncode == 0
    assert 'INTERP' not in r.stdout and '(NEEDED)' not in r.stdout


def test_dynamic_lockctl_cannot_start_in_the_bare_root(image_root):
    r = image_root(LOCKCTL, '--version')
    # the kernel finds no ld.so in the root: exec itself fails
    assert r.returncode == 127 and 'No such file or directory' in r.stderr, r.stderr
    r = image_root(LOCKCTL_STATIC, '--version')
    assert r.returncode == 0 and r.stdout.startswith('lockctl'), r


def test_static_lockctl_runs_a_command_under_a_lock_in_the_bare_root(image_root):
    r = image_root(LOCKCTL_STATIC, 'run', 'job', '--', '/bin/lockctl', 'status', 'job',
                   '--json')
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    text = json.dumps(status)
    assert '"job"' in text
    # released when CMD ended
    assert not os.path.exists(image_root.mnt.lockdir('job'))


def test_static_lockctl_status_and_exit_codes_in_the_bare_root(image_root):
    m = image_root.mnt
    os.mkdir(m.path('held'))
    try:
        r = image_root(LOCKCTL_STATIC, 'status')
        assert r.returncode == 0, r.stderr
        assert 'held' in r.stdout
        # busy: the documented exit status 75, not a crash (with a slug:
        # lockctl is the first process of its pid namespace, with no parent
        # there to bind a process lock to)
        r = image_root(LOCKCTL_STATIC, 'acquire', 'held', '--slug', 's', '--timeout', '0.2')
        assert r.returncode == 75, r.stderr
    finally:
        os.rmdir(m.path('held'))
