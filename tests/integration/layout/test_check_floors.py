#!/usr/bin/python3
"""tools/check_floors.py (issue 10 §1): it refuses an include that points up
or sideways, a cycle among core/lock/ headers, and accepts the arrows the
plan allows.  Each case builds a small source tree in a temporary folder
and runs the checker on it (includes only: no build, no mount)."""

import os
import subprocess
import sys

import pytest

from lockfs_helpers import SOURCE_ROOT

CHECK = os.path.join(SOURCE_ROOT, 'tools', 'check_floors.py')
PUBLIC = ['core.h', 'backend.h', 'etcd_client.h', 'name.h', 'utf8.h', 'limits.h', 'record.h',
          'holder.h', 'proc.h', 'log.h', 'descendants.h', 'procevents.h']


def tree(root, files):
    """Make ROOT/include/lockfs/*.h and FILES {path: [included names]}."""
    for h in PUBLIC:
        files.setdefault(os.path.join('include', 'lockfs', h), [])
    for path, includes in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, 'w') as f:
            f.writelines(f'#include "{i}"\n' for i in includes)


def check(root, floors):
    return subprocess.run([sys.executable, CHECK, '--source', str(root), '--floors', floors],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize('floors,files', [
    ('fs', {'fs/ops.c': ['fs.h', 'lockfs/core.h'], 'fs/fs.h': [],
            'fs/main.c': ['lockfs/backend.h', '../core/lock/backend_v1.h'],
            'core/lock/backend_v1.h': []}),
    ('tools', {'tools/lockctl/args.c': ['lockctl.h', 'lockfs/name.h', 'lockfs/limits.h'],
               'tools/lockctl/lockctl.h': []}),
    ('tools', {'tools/bench/bench_desc_ops.c': ['lockfs/descendants.h', 'lockfs/procevents.h'],
               'tools/bench/etcd_raw.c': ['lockfs/etcd_client.h']}),
    ('core', {'core/engine.c': ['lock/table.h', 'proc/liveness.h', 'lockfs/core.h',
                               'engine_test.h'], 'core/engine_test.h': [],
              'core/lock/table.h': ['queue.h', 'proc/liveness.h', 'lockfs/backend.h'],
              'core/lock/queue.h': ['lockfs/record.h'], 'core/proc/liveness.h': ['fds.h'],
              'core/proc/fds.h': [], 'core/base/name.c': ['lockfs/name.h', 'lockfs/utf8.h'],
              'core/base/record_encode.c': ['lockfs/record.h', 'record_compact.h', 'clock.h'],
              'core/base/record_compact.h': ['lockfs/record.h'], 'core/base/clock.h': [],
              'core/backend/dir.c': ['statedir.h', 'lockfs/backend.h', 'lockfs/record.h'],
              'core/backend/statedir.h': []}),
    ('core', {'core/backend/etcd.c': ['lockfs/proc.h'], 'core/proc/holder.c': ['lockfs/holder.h',
                                                                              'helpers.h'],
              'core/proc/helpers.h': ['lockfs/holder.h'],
              'core/lock/caller.c': ['lockfs/holder.h', 'lockfs/proc.h']}),
], ids=['fs', 'tools', 'bench', 'core', 'proc-public'])
def test_arrows_down_pass(tmp_path, floors, files):
    tree(tmp_path, files)
    r = check(tmp_path, floors)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ''


@pytest.mark.parametrize('floors,files,culprit', [
    ('fs', {'fs/ops.c': ['../core/lock/table.h'], 'core/lock/table.h': []}, 'fs/ops.c'),
    ('fs', {'fs/ops.c': ['lockfs/backend.h']}, 'backend.h outside fs/main.c'),
    ('fs', {'fs/ops.c': ['lockfs/etcd_client.h']}, 'fs/ops.c'),
    ('tools', {'tools/lockctl/main.c': ['lockfs/record.h']}, 'tools/lockctl/main.c'),
    # A benchmark measures through the public interfaces, like any client.
    ('tools', {'tools/bench/bench_desc_ops.c': ['../../core/proc/descendants_state.h'],
               'core/proc/descendants_state.h': []}, 'tools/bench/ may use only the public'),
    ('core', {'core/proc/fds.c': ['lock/table.h'], 'core/lock/table.h': []}, 'core/proc/fds.c'),
    ('core', {'core/base/name.c': ['lockfs/record.h']}, 'core/base/name.c'),
    ('core', {'core/base/record_parse.c': ['log_line.h'], 'core/base/log_line.h': []},
     'core/base/record_parse.c'),
    ('core', {'core/lock/queue.c': ['../engine.h'], 'core/engine.h': []}, 'core/lock/queue.c'),
    ('core', {'core/lock/a.h': ['b.h'], 'core/lock/b.h': ['a.h']}, 'header cycle'),
    ('fs', {'fs/ops.c': ['nowhere.h']}, 'not found'),
    # The holder rule and the /proc readers live in core/proc/, above base:
    # a store reads /proc (proc.h), never the holder rule.
    ('core', {'core/backend/etcd.c': ['lockfs/holder.h']}, 'core/backend/etcd.c'),
    ('core', {'core/base/record.c': ['lockfs/proc.h']}, 'core/base/record.c'),
], ids=['fs-core', 'fs-backend', 'fs-etcd', 'lockctl-record', 'bench-internal', 'proc-lock', 'base-record',
        'base-other-family', 'lock-engine', 'lock-cycle', 'missing', 'backend-holder',
        'base-proc'])
def test_arrows_up_fail(tmp_path, floors, files, culprit):
    tree(tmp_path, files)
    r = check(tmp_path, floors)
    assert r.returncode == 1, r.stdout + r.stderr
    assert culprit in r.stdout, r.stdout


def test_engine_files_share_their_header(tmp_path):
    """The files at core/'s top level are one floor, the engine: they share
    core/engine.h (struct lockfs_core), which no floor below may include
    (the 'lock-engine' case above)."""
    tree(tmp_path, {'core/engine.c': ['engine.h', 'lock/table.h'],
                    'core/views.c': ['engine.h', 'lock/queue.h'],
                    'core/engine.h': ['lockfs/core.h', 'lock/table.h', 'proc/fds.h'],
                    'core/lock/table.h': ['queue.h'], 'core/lock/queue.h': [],
                    'core/proc/fds.h': []})
    r = check(tmp_path, 'core')
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ''


def test_v1_files_are_exempt(tmp_path):
    tree(tmp_path, {'core/backend/dir_v1.c': ['../lock/backend_v1.h', '../engine.h'],
                    'core/lock/backend_v1.h': [], 'core/engine.h': []})
    r = check(tmp_path, 'core')
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_tree_passes_for_fs_and_tools():
    r = check(SOURCE_ROOT, 'fs,tools')
    assert r.returncode == 0, r.stdout + r.stderr


def test_unknown_floor_is_refused(tmp_path):
    r = check(tmp_path, 'fs,nope')
    assert r.returncode != 0 and 'unknown floor nope' in r.stderr


# ---- calls: no circle of .c files by the functions they name (--build) ----

BUILD = os.environ.get('LOCKFS_BUILD', os.path.dirname(
    os.environ.get('LOCKFS_BIN', '/work/main/build/lockfs')))


def built_tree(root, files):
    """A source tree of .c FILES {path: text} under ROOT/src and, under
    ROOT/build, their objects where meson puts them: core/X/F.c in
    build/core/liblockfs-X.a.p/X_F.c.o (with the archive, for the symbol
    check), fs/F.c in build/lockfs.p/fs_F.c.o, tools/lockctl/F.c in
    build/tools/lockctl.p/lockctl_F.c.o.  Returns (src, build)."""
    src, build = root / 'src', root / 'build'
    tree(src, {})
    libs = {}
    for path, text in files.items():
        full = src / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)
        parts = path.split('/')
        if parts[0] == 'core':
            lib = parts[1] if len(parts) == 3 else 'core'
            odir = build / 'core' / f'liblockfs-{lib}.a.p'
            obj = odir / ('_'.join(parts[1:]) + '.o')
            libs.setdefault(lib, []).append(obj)
        elif parts[0] == 'fs':
            obj = build / 'lockfs.p' / ('_'.join(parts) + '.o')
        else:
            obj = build / 'tools' / 'lockctl.p' / ('_'.join(parts[1:]) + '.o')
        obj.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(['cc', '-c', '-O0', '-o', str(obj), str(full)], check=True,
                       capture_output=True, timeout=60)
    for lib, objs in libs.items():
        subprocess.run(['ar', 'rcs', str(build / 'core' / f'liblockfs-{lib}.a')] +
                       [str(o) for o in objs], check=True, timeout=60)
    return src, build


def check_built(src, build, floors='core'):
    return subprocess.run([sys.executable, CHECK, '--source', str(src), '--floors', floors,
                           '--build', str(build)], capture_output=True, text=True, timeout=60)


# table.c -> session.c -> queue.c -> table.c, the circle issue 21 cut.
CIRCLE = {
    'core/lock/table.c': 'void lockfs_session_vanished(void);\n'
                         'void lockfs_table_load(void) { lockfs_session_vanished(); }\n',
    'core/lock/session.c': 'void lockfs_queue_rejoin(void);\n'
                           'void lockfs_session_vanished(void) { lockfs_queue_rejoin(); }\n',
    'core/lock/queue.c': 'void lockfs_table_load(void);\n'
                         'void lockfs_queue_rejoin(void) { lockfs_table_load(); }\n',
}


def test_a_circle_of_files_by_their_calls_fails(tmp_path):
    src, build = built_tree(tmp_path, dict(CIRCLE))
    r = check_built(src, build)
    assert r.returncode == 1, r.stdout + r.stderr
    line, = [x for x in r.stdout.splitlines() if x.startswith('call cycle')]
    assert 'core/lock/queue.c <-> core/lock/session.c <-> core/lock/table.c' in line
    assert 'core/lock/table.c -> core/lock/session.c (lockfs_session_vanished)' in line


def test_a_circle_across_folders_fails(tmp_path):
    """fs/ calls the engine, and the engine calls back into fs/ by name."""
    src, build = built_tree(tmp_path, {
        'fs/ops.c': 'void lockfs_core_acquire(void);\n'
                    'void lockfs_fs_reply(void) {}\n'
                    'void lockfs_fs_mkdir(void) { lockfs_core_acquire(); }\n',
        'core/engine.c': 'void lockfs_fs_reply(void);\n'
                         'void lockfs_core_acquire(void) { lockfs_fs_reply(); }\n',
    })
    r = check_built(src, build, 'fs,core')
    assert 'call cycle (lockfs): core/engine.c <-> fs/ops.c' in r.stdout, r.stdout
    assert r.returncode == 1


def test_a_call_up_through_a_pointer_the_floor_above_sets_passes(tmp_path):
    """The same three files, queue.c telling table.c through a pointer that
    the engine sets (engine.c names both; queue.c names neither): no circle.
    And every arrow is seen (the check does not pass for want of a graph)."""
    files = dict(CIRCLE)
    files['core/lock/queue.c'] = ('void (*lockfs_queue_on_load)(void);\n'
                                  'void lockfs_queue_rejoin(void) { lockfs_queue_on_load(); }\n')
    files['core/engine.c'] = ('extern void (*lockfs_queue_on_load)(void);\n'
                              'void lockfs_table_load(void);\n'
                              'void lockfs_core_open(void) { lockfs_queue_on_load = '
                              'lockfs_table_load; }\n')
    src, build = built_tree(tmp_path, files)
    r = check_built(src, build)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ''
    sys.path.insert(0, os.path.dirname(CHECK))
    try:
        import check_floors
    finally:
        sys.path.pop(0)
    graph = check_floors.program_graphs(str(src), str(build))['core']
    assert graph['core/lock/table.c'] == {'core/lock/session.c': ['lockfs_session_vanished']}
    assert set(graph['core/engine.c']) == {'core/lock/queue.c', 'core/lock/table.c'}


def test_the_tree_has_no_circle_of_files():
    """The real tree, built (LOCKFS_BUILD): every folder's .c files, the
    daemon's, lockctl's and the bench programs', call one another one way."""
    if not os.path.isfile(os.path.join(BUILD, 'lockfs')):
        pytest.fail(f'no build at {BUILD} (LOCKFS_BUILD names the build root)')
    r = check_built(SOURCE_ROOT, BUILD, 'fs,tools,core')
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'call cycle' not in r.stdout
