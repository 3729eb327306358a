#!/usr/bin/python3
"""Issue 10 §1 (tools/): lockctl checks a lock name with the daemon's own
rule (lockfs_name_check, include/lockfs/name.h), so a name the mount would
refuse gets lockctl's own one-line usage error (exit 64) before lockctl
touches the mount, instead of an error from a failed flock or mkdir.

Each name below passed lockctl's old, weaker check (1 to 250 bytes, no '/',
no leading '.') and is refused by the daemon (docs/names.md).
"""

import os
import subprocess

import pytest

from lockfs_helpers import BUILD

LOCKCTL = os.path.join(BUILD, 'tools', 'lockctl')
EX_USAGE = 64
RUN_TIMEOUT = 30.0

REFUSED = {
    'not NFC (e + combining acute)': 'cafe\u0301',
    'format character (zero-width space)': 'a\u200bb',
    'format character (right-to-left override)': 'a\u202eb',
    'only whitespace': '   ',
    'control character': 'a\tb',
}

VERBS = [
    ['acquire', '--timeout', '0'],
    ['run', '--timeout', '0', '--', 'true'],
    ['release'],
    ['status'],
    ['break', '--reason', 'r'],
]


def lockctl(mnt, verb, name):
    """lockctl VERB[0] NAME VERB[1:] on the mount; the CompletedProcess."""
    cmd = [LOCKCTL, '--mount', mnt, verb[0], name.encode()] + verb[1:]
    env = {k: v for k, v in os.environ.items() if k not in ('LOCKFS_SLUG', 'LOCKFS_MOUNT')}
    return subprocess.run(cmd, capture_output=True, timeout=RUN_TIMEOUT, env=env, cwd='/')


@pytest.fixture(autouse=True)
def _require_lockctl():
    if not os.access(LOCKCTL, os.X_OK):
        pytest.fail(f'{LOCKCTL} is not an executable file (build it: meson compile -C BUILD;'
                    f' LOCKFS_BUILD names the build root)')


@pytest.mark.parametrize('name', REFUSED.values(), ids=REFUSED.keys())
def test_mount_refuses_the_name(mnt, name):
    # the premise: the daemon refuses it with EINVAL
    with pytest.raises(OSError) as e:
        os.mkdir(os.path.join(mnt.mnt, name))
    assert e.value.errno == 22, e.value


@pytest.mark.parametrize('verb', VERBS, ids=lambda v: v[0])
@pytest.mark.parametrize('name', REFUSED.values(), ids=REFUSED.keys())
def test_lockctl_refuses_a_name_the_daemon_refuses_with_one_usage_line(mnt, name, verb):
    r = lockctl(mnt.mnt, verb, name)
    err = r.stderr.decode(errors='replace')
    assert r.returncode == EX_USAGE, (r.returncode, err)
    assert r.stdout == b''
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith('\n'), f'want one stderr line, got {err!r}'
    assert lines[0].startswith('lockctl: ') and 'not a valid lock name' in lines[0], lines[0]
    assert [e for e in os.listdir(mnt.mnt) if not e.startswith('.')] == []


def test_lockctl_names_the_length_limit_for_a_long_name(mnt):
    r = lockctl(mnt.mnt, ['acquire', '--timeout', '0'], 'x' * 251)
    err = r.stderr.decode()
    assert r.returncode == EX_USAGE, (r.returncode, err)
    assert len(err.splitlines()) == 1 and '250 bytes' in err, err


def test_lockctl_accepts_an_nfc_name_with_accents(mnt):
    name = 'caf\u00e9'
    r = lockctl(mnt.mnt, ['run', '--timeout', '5', '--', 'true'], name)
    assert r.returncode == 0, r.stderr
