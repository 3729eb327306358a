"""Point 2: the name rule, through the mount."""

import errno
import os
import random

import pytest

from lockfs_helpers import (errname, errno_of, expected_name_errno,
                            held_in_backing, temp_dirs_in_backing)


def _mkdir_errno(m, name):
    return errno_of(os.mkdir, m.path(os.fsencode(name)))


def _check_rule_reimplementation():
    """The Python copy of the rule agrees with the documented examples."""
    assert expected_name_errno(b'build') == 0
    assert expected_name_errno('caf\u00e9 \u2603') == 0
    assert expected_name_errno(b'a' * 250) == 0
    assert expected_name_errno(b'a' * 251) == errno.ENAMETOOLONG
    assert expected_name_errno(b'.hidden') == errno.EINVAL
    assert expected_name_errno(b'a\x01') == errno.EINVAL
    assert expected_name_errno(b'a\x7f') == errno.EINVAL
    assert expected_name_errno('a\u0085'.encode()) == errno.EINVAL
    assert expected_name_errno(b'\xc0\x80') == errno.EINVAL  # overlong NUL
    assert expected_name_errno(b'\xed\xa0\x80') == errno.EINVAL  # surrogate
    assert expected_name_errno(b'\xf4\x90\x80\x80') == errno.EINVAL  # > U+10FFFF
    assert expected_name_errno(b'\xff') == errno.EINVAL


@pytest.mark.parametrize('name', [b'.hidden', b'.x.lock', b'..x'], ids=repr)
def test_leading_dot_is_einval(mnt, name):
    assert errname(_mkdir_errno(mnt, name)) == 'EINVAL'
    assert held_in_backing(mnt.dir) == []


@pytest.mark.parametrize('name', [b'a\x01b', b'tab\there', b'nl\nx', b'esc\x1b', b'del\x7f',
                                  'c1\u0085x'.encode(), 'c1\u009fx'.encode()], ids=repr)
def test_control_character_is_einval(mnt, name):
    assert errname(_mkdir_errno(mnt, name)) == 'EINVAL'
    assert held_in_backing(mnt.dir) == []


@pytest.mark.parametrize('name', [b'\xff', b'a\xc3', b'\xc0\x80', b'\xe0\x80\xaf',
                                  b'\xed\xa0\x80', b'\xf4\x90\x80\x80', b'\x80abc'], ids=repr)
def test_invalid_utf8_is_einval(mnt, name):
    assert errname(_mkdir_errno(mnt, name)) == 'EINVAL'
    assert held_in_backing(mnt.dir) == []


def test_251_bytes_is_enametoolong(mnt):
    assert errname(_mkdir_errno(mnt, b'n' * 251)) == 'ENAMETOOLONG'
    assert held_in_backing(mnt.dir) == []


def test_250_bytes_is_accepted(mnt):
    name = b'n' * 250
    assert _mkdir_errno(mnt, name) == 0
    assert os.path.isdir(mnt.lockdir(name))
    os.rmdir(mnt.path(name))
    assert held_in_backing(mnt.dir) == []


def test_250_bytes_multibyte_is_accepted(mnt):
    name = ('\u00e9' * 125).encode()  # 250 bytes, 125 characters
    assert len(name) == 250
    assert _mkdir_errno(mnt, name) == 0
    os.rmdir(mnt.path(name))


@pytest.mark.parametrize('name', ['build', 'with space', 'caf\u00e9', '\u2603-snow',
                                  'a.b.c', 'x.lock', '-dash', 'back\\slash', '\U0001f512'],
                         ids=repr)
def test_valid_names_are_accepted(mnt, name):
    assert _mkdir_errno(mnt, name.encode()) == 0
    assert os.path.isdir(mnt.lockdir(name))
    assert name in os.listdir(mnt.mnt)
    os.rmdir(mnt.path(name))
    assert not os.path.exists(mnt.lockdir(name))


# --------------------------------------------------------------------------
# fuzz

_PRINTABLE = [c for c in range(0x20, 0x7f) if c != 0x2f]
_CONTROL = [c for c in range(0x01, 0x20)] + [0x7f]
_BAD_SEQS = [b'\xc0\x80', b'\xc1\xbf', b'\xe0\x80\x80', b'\xed\xa0\x80', b'\xed\xbf\xbf',
             b'\xf4\x90\x80\x80', b'\xf8\x88\x80\x80\x80', b'\xfe', b'\xff', b'\x80', b'\xbf',
             b'\xc3', b'\xe2\x82', 'a\u0080'.encode(), '\u009f'.encode()]
_FORBIDDEN_EXACT = {b'.', b'..', b'.log', b'.flock'}


def _valid_char(rng):
    r = rng.random()
    if r < 0.6:
        return bytes([rng.choice(_PRINTABLE)])
    while True:
        if r < 0.8:
            cp = rng.randint(0xa0, 0x7ff)
        elif r < 0.95:
            cp = rng.randint(0x800, 0xffff)
        else:
            cp = rng.randint(0x10000, 0x10ffff)
        if not (0xd800 <= cp <= 0xdfff):
            return chr(cp).encode()


def _random_name(rng):
    kind = rng.random()
    if kind < 0.1:
        target = rng.randint(240, 260)
    else:
        target = rng.randint(1, 40)
    out = b''
    while len(out) < target:
        out += _valid_char(rng)
    if len(out) > 260:
        out = out[:260]
    defect = rng.random()
    if defect < 0.45:
        pass  # probably valid
    elif defect < 0.55:
        out = b'.' + out
    elif defect < 0.7:
        i = rng.randint(0, len(out))
        out = out[:i] + bytes([rng.choice(_CONTROL)]) + out[i:]
    elif defect < 0.85:
        i = rng.randint(0, len(out))
        out = out[:i] + rng.choice(_BAD_SEQS) + out[i:]
    else:
        # raw random bytes, anything but '/' and NUL
        n = rng.randint(1, 30)
        out = bytes(rng.choice([c for c in range(1, 256) if c != 0x2f]) for _ in range(n))
    return out


def _fuzz_names(seed, count):
    rng = random.Random(seed)
    names = []
    while len(names) < count:
        n = _random_name(rng)
        if n and b'/' not in n and b'\0' not in n and n not in _FORBIDDEN_EXACT:
            names.append(n)
    return names


@pytest.mark.slow
def test_fuzz_random_names(mnt):
    _check_rule_reimplementation()  # the oracle itself first
    seed = int(os.environ.get('LOCKFS_FUZZ_SEED', '20260823'))
    names = _fuzz_names(seed, 1200)
    expected = [expected_name_errno(n) for n in names]
    nvalid = sum(1 for e in expected if e == 0)
    ninval = sum(1 for e in expected if e == errno.EINVAL)
    nlong = sum(1 for e in expected if e == errno.ENAMETOOLONG)
    # the fuzz is not vacuous: plenty of every kind
    assert nvalid >= 300 and ninval >= 300 and nlong >= 30, (nvalid, ninval, nlong)

    bad = []
    for name, want in zip(names, expected):
        got = _mkdir_errno(mnt, name)
        if got != want:
            bad.append(f'mkdir {name!r}: got {errname(got)}, expected {errname(want)}')
            if got == 0:
                os.rmdir(mnt.path(name))
            continue
        if want == 0:
            if not os.path.isdir(mnt.lockdir(name)):
                bad.append(f'{name!r}: acquired but no {name!r}.lock in DIR')
            got = errno_of(os.rmdir, mnt.path(name))
            if got != 0:
                bad.append(f'rmdir {name!r}: {errname(got)}')
            elif os.path.exists(mnt.lockdir(name)):
                bad.append(f'{name!r}: released but still in DIR')
        elif os.path.exists(mnt.lockdir(name)):
            bad.append(f'{name!r}: refused but a lock appeared in DIR')
    assert not bad, f'seed {seed}: {len(bad)} mismatches:\n' + '\n'.join(bad[:30])

    # nothing leaked, and the daemon still answers
    assert held_in_backing(mnt.dir) == []
    assert temp_dirs_in_backing(mnt.dir) == []
    assert sorted(os.listdir(mnt.mnt)) == ['.flock', '.log']
    os.mkdir(mnt.path('after-fuzz'))
    os.rmdir(mnt.path('after-fuzz'))
    mnt.assert_alive()
