#!/usr/bin/python3
"""The etcd store's files as issue 21 left them: calls between the files of
core/backend/ go one way (the session calls nothing of the store above
it), no etcd file over 1,000 lines, one list of the etcd kind's -o keys
(options.c, below the registry and etcd.c), one say() and one parse_seconds, one header called
etcd.h, and an engine that names none of etcd's `owner` fields.  Reads the
source only (LOCKFS_SOURCE_ROOT, default this tree); the last test runs the
daemon for the message the one list of keys gives."""

import glob
import os
import re
import subprocess

from lockfs_helpers import LOCKFS_BIN, source_root

SOURCE_ROOT = os.environ.get('LOCKFS_SOURCE_ROOT', source_root())


def code(path, strings=False):
    """PATH's C text without comments (and string contents unless STRINGS)."""
    with open(os.path.join(SOURCE_ROOT, path)) as f:
        s = f.read()

    def keep(m):
        if m.group(0).startswith('"'):
            return m.group(0) if strings else '""'
        return ' '
    return re.sub(r'"(?:\\.|[^"\\\n])*"|/\*.*?\*/|//[^\n]*', keep, s, flags=re.S)


def rel(paths):
    return sorted(os.path.relpath(p, SOURCE_ROOT) for p in paths)


def test_backend_files_never_call_each_other_both_ways():
    files = rel(glob.glob(os.path.join(SOURCE_ROOT, 'core', 'backend', '*.c')))
    text = {f: code(f) for f in files}
    defined = {}
    for f, s in text.items():
        for m in re.finditer(r'^(?!static)\w[^;{}()]*?\b(lockfs_\w+)\s*\([^;{}]*\)\s*\{', s,
                             flags=re.M):
            defined[m.group(1)] = f
    calls = {f: {defined[n] for n in re.findall(r'\b(lockfs_\w+)\s*\(', s)
                 if n in defined and defined[n] != f}
             for f, s in text.items()}
    circles = sorted((a, b) for a in calls for b in calls[a] if a < b and a in calls[b])
    assert 'core/backend/etcd_session.c' in files
    assert 'core/backend/etcd_mirror.c' in calls['core/backend/etcd_session.c']
    assert circles == []


def test_no_etcd_c_file_over_1000_lines():
    paths = rel(glob.glob(os.path.join(SOURCE_ROOT, 'core', 'backend', 'etcd*.c')) +
                glob.glob(os.path.join(SOURCE_ROOT, 'core', 'etcd', '*.c')))
    assert paths
    long = []
    for p in paths:
        with open(os.path.join(SOURCE_ROOT, p)) as f:
            n = sum(1 for _ in f)
        if n > 1000:
            long.append((p, n))
    assert long == []


def test_etcd_option_keys_are_listed_once():
    where = []
    for p in rel(glob.glob(os.path.join(SOURCE_ROOT, 'core', '**', '*.c'), recursive=True) +
                 glob.glob(os.path.join(SOURCE_ROOT, 'fs', '*.c'))):
        with open(os.path.join(SOURCE_ROOT, p)) as f:
            if re.search(r'"lock_delay",\s*"etcd_cacert"', f.read()):
                where.append(p)
    assert where == ['core/backend/options.c']


def test_etcd_store_includes_no_dir_header():
    for p in rel(glob.glob(os.path.join(SOURCE_ROOT, 'core', 'backend', 'etcd*.[ch]'))):
        with open(os.path.join(SOURCE_ROOT, p)) as f:
            assert '#include "dir.h"' not in f.read(), p


def test_one_say_and_one_parse_seconds():
    paths = rel(glob.glob(os.path.join(SOURCE_ROOT, 'core', 'backend', 'etcd*.c')) +
                [os.path.join(SOURCE_ROOT, 'fs', 'main.c')])
    for p in paths:
        s = code(p)
        assert not re.search(r'^static\s[^;]*\b(say|parse_seconds)\s*\(', s, flags=re.M), p
    assert 'lockfs_backend_parse_seconds' in code('fs/main.c')
    assert re.search(r'^int lockfs_backend_parse_seconds\(', code('core/backend/options.c'),
                     flags=re.M)


def test_one_header_named_etcd_h():
    found = []
    for top in ('core', 'include', 'fs', 'tools', 'tests'):
        for dirpath, _, names in os.walk(os.path.join(SOURCE_ROOT, top)):
            found += [os.path.join(dirpath, n) for n in names if n == 'etcd.h']
    assert rel(found) == ['core/backend/etcd.h']


def test_engine_names_no_etcd_owner_field():
    s = code('core/views.c', strings=True)
    m = re.search(r'static void add_store_fields\(.*?\n\}', s, flags=re.S)
    assert m
    for word in ('"etcd_lease"', '"create_revision"', '"key"', '"lease"'):
        assert word not in m.group(0)
    assert 'create_revision' not in s


def test_etcd_option_with_another_store_says_what_it_needs(tmp_path):
    mnt = tmp_path / 'mnt'
    mnt.mkdir()
    r = subprocess.run([LOCKFS_BIN, '-f', '-o', f'backing={tmp_path}/b,ttl=5', str(mnt)],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0
    assert r.stderr == 'lockfs: -o ttl needs -o backend=etcd (the store is dir)\n'
