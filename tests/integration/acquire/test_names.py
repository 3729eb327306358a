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
    # issue 8 §6: NFC only, no format character, not only whitespace
    assert expected_name_errno('cafe\u0301') == errno.EINVAL    # NFD
    assert expected_name_errno('\u212b') == errno.EINVAL         # ANGSTROM SIGN -> U+00C5
    assert expected_name_errno('a\u200bb') == errno.EINVAL       # ZERO WIDTH SPACE (Cf)
    assert expected_name_errno('\u202eabc') == errno.EINVAL      # RIGHT-TO-LEFT OVERRIDE
    assert expected_name_errno('\ufeffx') == errno.EINVAL        # BOM
    assert expected_name_errno('   ') == errno.EINVAL
    assert expected_name_errno('\u00a0\u3000') == errno.EINVAL
    assert expected_name_errno(' a ') == 0
    assert expected_name_errno('\u3164') == 0                    # HANGUL FILLER: Lo
    # issue 19 §3: no line or paragraph separator (Zl, Zp); NBSP is text
    assert expected_name_errno('evil\u2028') == errno.EINVAL
    assert expected_name_errno('a\u2029b') == errno.EINVAL
    assert expected_name_errno('a\u00a0b') == 0


@pytest.mark.parametrize('name', [b'.hidden', b'.x.lock', b'..x'], ids=repr)
def test_leading_dot_is_einval(mnt, name):
    assert errname(_mkdir_errno(mnt, name)) == 'EINVAL'
    assert held_in_backing(mnt.dir) == []


@pytest.mark.parametrize('name', [b'a\x01b', b'tab\there', b'nl\nx', b'esc\x1b', b'del\x7f',
                                  'c1\u0085x'.encode(), 'c1\u009fx'.encode()], ids=repr)
def test_control_character_is_einval(mnt, name):
    assert errname(_mkdir_errno(mnt, name)) == 'EINVAL'
    assert held_in_backing(mnt.dir) == []


def test_the_same_looking_name_in_nfd_is_refused_not_a_second_lock(mnt):
    """Observed: `café` in NFC and in NFD were two locks that print the same."""
    nfc, nfd = 'caf\u00e9', 'cafe\u0301'
    assert _mkdir_errno(mnt, nfc.encode()) == 0
    assert errname(_mkdir_errno(mnt, nfd.encode())) == 'EINVAL'
    assert held_in_backing(mnt.dir) == [nfc.encode()]
    assert os.listdir(mnt.mnt).count(nfc) == 1 and nfd not in os.listdir(mnt.mnt)
    os.rmdir(mnt.path(nfc))


@pytest.mark.parametrize('name', ['cafe\u0301', 'e\u0301', '\u212b', '\uf900', 'A\u030a\u0323'],
                         ids=repr)
def test_a_name_not_in_nfc_is_einval(mnt, name):
    assert errname(_mkdir_errno(mnt, name.encode())) == 'EINVAL'
    assert held_in_backing(mnt.dir) == []


@pytest.mark.parametrize('name', ['\u200b', 'a\u200bb', '\u202eexe.txt', '\ufeffx', 'x\u2060',
                                  'soft\u00adhyphen', 'zw\u200dj', '\u2066iso\u2069',
                                  '\U000e0041tag'], ids=repr)
def test_a_format_character_is_einval(mnt, name):
    """Observed: names of zero-width and bidi-control characters were accepted."""
    assert errname(_mkdir_errno(mnt, name.encode())) == 'EINVAL'
    assert held_in_backing(mnt.dir) == []


#: issue 19 §3: a whole fake log line, with NBSP (U+00A0) for its spaces
FAKE_LINE = '\u00a0'.join(['2026-08-22T23:05:52.123Z', 'root', 'deploy', 'fence=1', 'uid=0',
                           'pid=1', 'released'])


@pytest.mark.parametrize('name', ['evil\u2028' + FAKE_LINE, 'evil\u2028', '\u2028x',
                                  'a\u2029b', 'x\u2029'], ids=repr)
def test_a_line_or_paragraph_separator_is_einval(mnt, name):
    """Observed: `evil\u2028` + a fake line with NBSP for spaces was a lock,
    and its log lines showed the fake line on a line of its own to Python's
    splitlines() and to a terminal."""
    assert errname(_mkdir_errno(mnt, name.encode())) == 'EINVAL'
    assert held_in_backing(mnt.dir) == []
    assert name not in os.listdir(mnt.mnt)


def test_nbsp_stays_a_character_of_names(mnt):
    """Negative control: U+00A0 is text; only the line separator made the
    fake line a line."""
    name = 'evil\u00a0' + FAKE_LINE
    assert _mkdir_errno(mnt, name.encode()) == 0
    assert name in os.listdir(mnt.mnt)
    os.rmdir(mnt.path(name))


@pytest.mark.parametrize('name', [' ', '   ', '\u00a0', '\u3000', ' \u2003 ', '\u2028'],
                         ids=repr)
def test_an_all_whitespace_name_is_einval(mnt, name):
    """Observed: a name of only spaces was accepted."""
    assert errname(_mkdir_errno(mnt, name.encode())) == 'EINVAL'
    assert held_in_backing(mnt.dir) == []


@pytest.mark.parametrize('name', [' lead', 'trail ', 'in side', '\u00e9t\u00e9', '\u1e9b\u0323',
                                  '\u3164', 'emoji\U0001f512\ufe0f'], ids=repr)
def test_names_with_some_whitespace_or_composed_letters_are_accepted(mnt, name):
    """Negative control: spaces among other characters, NFC text and
    variation selectors (Mn, not Cf) are fine."""
    assert _mkdir_errno(mnt, name.encode()) == 0
    assert name in os.listdir(mnt.mnt)
    os.rmdir(mnt.path(name))


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


_FORMAT = [0x00ad, 0x061c, 0x200b, 0x200c, 0x200d, 0x200e, 0x202a, 0x202e, 0x2060, 0x2066,
           0xfeff, 0xfff9, 0x110bd, 0xe0001, 0xe0041]
_COMBINING = [0x0300, 0x0301, 0x0308, 0x0323, 0x0327, 0x030a]
_WHITE = [0x20, 0xa0, 0x1680, 0x2000, 0x2005, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000]


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
    i = rng.randint(0, len(out))
    while i < len(out) and (out[i] & 0xc0) == 0x80:
        i += 1  # insert between characters, not inside one
    if defect < 0.42:
        pass  # probably valid
    elif defect < 0.50:
        out = b'.' + out
    elif defect < 0.60:
        out = out[:i] + bytes([rng.choice(_CONTROL)]) + out[i:]
    elif defect < 0.71:
        out = out[:i] + rng.choice(_BAD_SEQS) + out[i:]
    elif defect < 0.77:
        out = out[:i] + chr(rng.choice(_FORMAT)).encode() + out[i:]
    elif defect < 0.83:
        # a base letter and combining marks: NFC or not, as they fall
        marks = ''.join(chr(rng.choice(_COMBINING)) for _ in range(rng.randint(1, 2)))
        out = out[:i] + bytes([rng.choice(b'aeouAECn')]) + marks.encode() + out[i:]
    elif defect < 0.86:
        out = ''.join(chr(rng.choice(_WHITE)) for _ in range(rng.randint(1, 4))).encode()
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
