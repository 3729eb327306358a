#!/usr/bin/python3
"""Issue 20 §8: docs/operations.md's offline image recipe works as written.

The section "An image without a registry" has two ```sh blocks: the
recipe (busybox-static, lockctl-static, util-linux's flock with its
libraries, `podman import`) and two `podman run` lines that use the image.
This test runs both blocks as the doc gives them.  What it changes is only
around them:
- `podman` on PATH is a wrapper that gives podman a private storage (the
  host's images are not touched) and adds the flags podman 4.3.1 needs on
  the test VM to `podman run` (PODMAN_FLAGS, as test_containers.py);
- IMAGE and LOCKCTL_STATIC (which the recipe reads) name a test image and
  the build's lockctl-static, and the run lines' image name is rewritten to
  it, their `/srv/lockfs` source to the test's SHARE, where a fresh lockfs
  is mounted on SHARE/locks.
It skips, with podman's reason, where podman cannot import or run an image.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from lockfs_helpers import mount_entry, unguard
from service_helpers import LOCKCTL_STATIC, SOURCE_ROOT, static_lockctl_or_skip

OPERATIONS = os.path.join(SOURCE_ROOT, 'docs', 'operations.md')
SECTION = '### An image without a registry'
DOC_IMAGE = 'localhost/lockfs-busybox'
TEST_IMAGE = 'localhost/lockfs-it-offline'
PODMAN_FLAGS = '--runtime=runc --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 ' \
               '--network=none'


def doc_blocks():
    """(recipe, [run line]) from operations.md's section."""
    with open(OPERATIONS, encoding='utf-8') as f:
        text = f.read()
    assert SECTION in text, f'docs/operations.md has no "{SECTION}" section'
    section = text.split(SECTION, 1)[1].split('\n#', 1)[0]
    blocks = re.findall(r'^```sh\n(.*?)^```$', section, re.S | re.M)
    assert len(blocks) == 2, f'want the recipe and the run lines, found {len(blocks)} blocks'
    recipe, runs = blocks
    return recipe, [l for l in runs.splitlines() if l.strip()]


def test_the_recipe_has_what_the_issue_asks_for():
    recipe, runs = doc_blocks()
    for part in ('/bin/busybox', 'lockctl-static', '/usr/bin/flock', 'ldd /usr/bin/flock',
                 'podman import'):
        assert part in recipe, f'the recipe lost {part!r}'
    assert [r.split()[:2] for r in runs] == [['podman', 'run']] * 2, runs


@pytest.fixture
def offline_work():
    """A work directory, removed after the mount in it is gone (set up
    before lockfs_factory, so torn down after it)."""
    work = tempfile.mkdtemp(prefix='lockfs-offline-')
    os.chmod(work, 0o755)
    yield work
    mnt = os.path.join(work, 'share', 'locks')
    if mount_entry(mnt) is None:
        unguard(mnt)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def offline(offline_work, lockfs_factory):
    """(env, share, mount): env runs the doc's blocks with the wrapper
    podman; a lockfs serves SHARE/locks."""
    static_lockctl_or_skip()
    if not shutil.which('podman') or not shutil.which('runc'):
        pytest.skip('podman or runc is not installed (Debian packages podman, runc)')
    work = offline_work
    share = os.path.join(work, 'share')
    os.makedirs(os.path.join(share, 'locks'))
    m = lockfs_factory(allow_other=True, mountpoint=os.path.join(share, 'locks'))
    os.makedirs(os.path.join(work, 'bin'))
    wrapper = os.path.join(work, 'bin', 'podman')
    real = shutil.which('podman')
    with open(wrapper, 'w') as f:
        f.write(f'''#!/bin/sh
store="--root {work}/storage --runroot {work}/run --storage-driver vfs --cgroup-manager cgroupfs"
if [ "$1" = run ]; then
    shift
    exec {real} $store run {PODMAN_FLAGS} "$@"
fi
exec {real} $store "$@"
''')
    os.chmod(wrapper, 0o755)
    env = dict(os.environ, PATH=f'{work}/bin:{os.environ["PATH"]}', IMAGE=TEST_IMAGE,
               LOCKCTL_STATIC=LOCKCTL_STATIC)
    yield env, share, m
    subprocess.run(['podman', 'rm', '-f', '-a', '-t', '0'], env=env, capture_output=True,
                   timeout=60)
    subprocess.run(['podman', 'rmi', '-f', '-a'], env=env, capture_output=True, timeout=60)


@pytest.mark.slow
def test_the_offline_recipe_builds_an_image_whose_flock_and_lockctl_take_locks(offline):
    env, share, m = offline
    recipe, runs = doc_blocks()
    r = subprocess.run(['sh', '-c', recipe], env=env, capture_output=True, text=True,
                       timeout=300, cwd='/')
    if r.returncode != 0 and 'podman' in r.stderr:
        pytest.skip(f'podman import fails here: {r.stderr.strip()[-300:]}')
    assert r.returncode == 0, r.stderr
    r = subprocess.run(['podman', 'run', '--rm', TEST_IMAGE, 'true'], env=env,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f'podman cannot run a container here: {r.stderr.strip()[-300:]}')
    for line in runs:
        cmd = line.replace(DOC_IMAGE, TEST_IMAGE).replace('/srv/lockfs:/srv', f'{share}:/srv')
        assert cmd != line
        r = subprocess.run(['sh', '-c', cmd], env=env, capture_output=True, text=True,
                           timeout=120, cwd='/')
        assert r.returncode == 0, (line, r.stderr)
        owner = json.loads(r.stdout)
        assert owner['resource'] == 'deploy', owner
        assert not os.path.exists(m.path('deploy')), 'released when the command ended'
    with open(m.dpath('lock.log')) as f:
        events = [l.split()[-1] for l in f if ' deploy ' in l]
    assert events == ['acquired', 'released'] * 2, events
