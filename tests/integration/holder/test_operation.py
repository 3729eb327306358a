"""Point 6: M/NAME/operation, written by the holder, shown in owner."""

import errno
import json
import os
import subprocess

import pytest

from lockfs_helpers import errname, read_owner


def _write(path, data):
    """Write DATA in one write(2) with O_TRUNC; 0 or errno (open/write/close)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as e:
        return e.errno
    try:
        n = os.write(fd, data)
        assert n == len(data), f'short write {n}/{len(data)}'
    except OSError as e:
        return e.errno
    finally:
        try:
            os.close(fd)
        except OSError as e:
            return e.errno
    return 0


def _op(m, name='x'):
    return m.path(name, 'operation')


def test_holder_write_shows_in_owner(mnt):
    os.mkdir(mnt.path('x'))
    assert read_owner(mnt.mnt, 'x')['operation'] is None  # control
    assert _write(_op(mnt), b'rendering frame 12\n') == 0
    assert read_owner(mnt.mnt, 'x')['operation'] == 'rendering frame 12'
    os.rmdir(mnt.path('x'))


def test_operation_file_reads_back_text_with_newline(mnt):
    os.mkdir(mnt.path('x'))
    with open(_op(mnt), 'rb') as f:
        assert f.read() == b''
    assert _write(_op(mnt), b'deploying') == 0
    with open(_op(mnt), 'rb') as f:
        assert f.read() == b'deploying\n'
    os.rmdir(mnt.path('x'))


def test_only_one_trailing_newline_is_dropped(mnt):
    os.mkdir(mnt.path('x'))
    assert _write(_op(mnt), b'two lines\nsecond\n\n') == 0
    assert read_owner(mnt.mnt, 'x')['operation'] == 'two lines\nsecond\n'
    os.rmdir(mnt.path('x'))


def test_shell_echo_into_operation(mnt):
    """The documented shell usage: the script's shell holds, echo writes."""
    r = subprocess.run(['/bin/sh', '-c',
                        'mkdir "$1" || exit 9; echo "migrating db" > "$1/operation" || exit 8;'
                        ' cat "$1/owner"; rmdir "$1"', 'sh', mnt.path('x')],
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    assert b'"migrating db"' in r.stdout


def test_write_by_other_process_is_eperm_and_unchanged(mnt, procs):
    holder, stranger = procs.agent(), procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    assert holder.write(_op(mnt), b'original') == 0
    assert errname(stranger.write(_op(mnt), b'hijacked')) == 'EPERM'
    assert read_owner(mnt.mnt, 'x')['operation'] == 'original'
    assert holder.rmdir(mnt.path('x')) == 0


def test_write_by_holders_parent_is_eperm(mnt, procs):
    holder = procs.agent()
    assert holder.mkdir(mnt.path('x')) == 0
    assert errname(_write(_op(mnt), b'parent')) == 'EPERM'
    assert read_owner(mnt.mnt, 'x')['operation'] is None
    assert holder.rmdir(mnt.path('x')) == 0


def test_write_by_holders_child_is_allowed(mnt):
    os.mkdir(mnt.path('x'))
    r = subprocess.run(['/bin/sh', '-c', 'printf child > "$1"', 'sh', _op(mnt)],
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    assert read_owner(mnt.mnt, 'x')['operation'] == 'child'
    os.rmdir(mnt.path('x'))


def test_non_root_holder_may_write_operation(mnt_ao, users, procs):
    holder = procs.agent(user=users[0])
    assert holder.mkdir(mnt_ao.path('x')) == 0
    assert holder.write(_op(mnt_ao), b'as lockfs-test') == 0
    assert read_owner(mnt_ao.mnt, 'x')['operation'] == 'as lockfs-test'
    assert holder.rmdir(mnt_ao.path('x')) == 0


def test_write_by_other_uid_is_eperm(mnt_ao, users, procs):
    holder = procs.agent(user=users[0])
    other = procs.agent(user=users[1])
    assert holder.mkdir(mnt_ao.path('x')) == 0
    assert holder.write(_op(mnt_ao), b'original') == 0
    e = other.write(_op(mnt_ao), b'hijacked')
    # the kernel may refuse first (EACCES on a 0644 file of another uid);
    # either way it must fail and change nothing
    assert errname(e) in ('EPERM', 'EACCES')
    assert read_owner(mnt_ao.mnt, 'x')['operation'] == 'original'
    assert holder.rmdir(mnt_ao.path('x')) == 0


@pytest.mark.parametrize('text, error', [(b'a' * 1025, 'EFBIG'),
                                         (b'bad \xff\xfe bytes', 'EINVAL')],
                         ids=['1025-bytes-efbig', 'invalid-utf8-einval'])
def test_a_refused_operation_leaves_it_unchanged(mnt, text, error):
    os.mkdir(mnt.path('x'))
    assert _write(_op(mnt), b'original') == 0
    assert errname(_write(_op(mnt), text)) == error
    # O_TRUNC may or may not have cleared it, but it must not hold the new text
    assert read_owner(mnt.mnt, 'x')['operation'] in ('original', None)
    os.rmdir(mnt.path('x'))


@pytest.mark.parametrize('text', ['b' * 1023 + 'c', '\u20ac' * 341 + 'z'],  # 1023 + 1 bytes
                         ids=['ascii', 'multibyte'])
def test_exactly_1024_bytes_is_accepted(mnt, text):
    os.mkdir(mnt.path('x'))
    assert len(text.encode()) == 1024
    assert _write(_op(mnt), text.encode()) == 0
    assert read_owner(mnt.mnt, 'x')['operation'] == text
    os.rmdir(mnt.path('x'))


def test_shell_truncate_clears_operation(mnt):
    os.mkdir(mnt.path('x'))
    assert _write(_op(mnt), b'something') == 0
    assert read_owner(mnt.mnt, 'x')['operation'] == 'something'  # control
    r = subprocess.run(['/bin/sh', '-c', ': > "$1"', 'sh', _op(mnt)], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert read_owner(mnt.mnt, 'x')['operation'] is None
    with open(_op(mnt), 'rb') as f:
        assert f.read() == b''
    os.rmdir(mnt.path('x'))


def test_operation_of_not_held_is_enoent(mnt):
    try:
        os.open(mnt.path('nope', 'operation'), os.O_WRONLY)
    except OSError as e:
        assert e.errno == errno.ENOENT
    else:
        raise AssertionError('opened operation of a lock that is not held')


def test_operation_write_is_kept_in_backing_record(mnt):
    """The text is in the record in DIR (other tools and restarts see it)."""
    os.mkdir(mnt.path('x'))
    assert _write(_op(mnt), b'persisted') == 0
    with open(os.path.join(mnt.lockdir('x'), 'owner.json'), 'rb') as f:
        assert json.loads(f.read())['operation'] == 'persisted'
    os.rmdir(mnt.path('x'))


def test_refused_write_after_truncating_open_keeps_old_text(mnt):
    """`cmd > operation` opens with O_TRUNC; if the write is then refused
    (too long, not UTF-8), the old text stays -- even when the shell's copy
    of the descriptor is closed before the command writes."""
    os.mkdir(mnt.path('x'))
    op = mnt.path('x', 'operation')
    assert _write(op, b'first task\n') == 0
    r = subprocess.run(['bash', '-c', 'head -c 1500 /dev/zero | tr "\\0" a > "$0"', op],
                       stderr=subprocess.PIPE)
    assert r.returncode != 0 and b'File too large' in r.stderr, r.stderr
    assert read_owner(mnt.mnt, 'x')['operation'] == 'first task'
    assert _write(op, b'\xff\n') == errno.EINVAL
    assert read_owner(mnt.mnt, 'x')['operation'] == 'first task'
    # a text that ends inside a character is refused at close: the same
    assert _write(op, b'ab\xc3') == errno.EINVAL
    assert read_owner(mnt.mnt, 'x')['operation'] == 'first task'
    # bash ignores the close's error of a builtin's redirection; the text stays
    subprocess.run(['bash', '-c', 'printf "ab\\303" > "$0"', op], check=True)
    assert read_owner(mnt.mnt, 'x')['operation'] == 'first task'
    os.rmdir(mnt.path('x'))


def test_character_split_across_writes_is_accepted(mnt):
    os.mkdir(mnt.path('x'))
    fd = os.open(mnt.path('x', 'operation'), os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.write(fd, b'caf\xc3') == 4
        assert os.write(fd, b'\xa9 ok\n') == 5
    finally:
        os.close(fd)
    assert read_owner(mnt.mnt, 'x')['operation'] == 'café ok'
    os.rmdir(mnt.path('x'))
