#!/usr/bin/python3
"""The shape of core/lock/ and core/base/record*.c (issue 21): read from the
built objects (nm) and the sources, with no mount.

- no circle among the files of core/lock/ (and of core/base/) by the
  functions they call (a call that goes up goes through a function pointer
  the floor above sets), by tools/check_floors.py's finder, which the lint
  suite runs over every folder;
- no header of core/lock/ declares a function of the floor above
  (core/engine.c);
- the store is reached only through core/lock/store.c's wrappers;
- the lock floor's timers read core/base/clock.c (replaceable in unit
  tests), never clock_gettime of their own;
- no C file of core/lock/ or core/base/ over 1,000 lines;
- names that say what they hold (no `struct held_lock`).

LOCKFS_BUILD names the build root (default: the daemon's folder)."""

import glob
import importlib.util
import os
import re

import pytest

from lockfs_helpers import LOCKFS_BIN, SOURCE_ROOT

BUILD = os.environ.get('LOCKFS_BUILD', os.path.dirname(LOCKFS_BIN))


def _objects(lib):
    objs = sorted(glob.glob(os.path.join(BUILD, 'core', f'liblockfs-{lib}.a.p', '*.o')))
    if not objs:
        pytest.fail(f'no objects of liblockfs-{lib} under {BUILD} (build first;'
                    f' LOCKFS_BUILD names the build root)')
    return objs


def _load_check_floors():
    """tools/check_floors.py as a module: its call graph and circle finder
    (run over every folder by `meson test --suite lint`) are the ones used
    here, on one floor at a time."""
    spec = importlib.util.spec_from_file_location(
        'check_floors', os.path.join(SOURCE_ROOT, 'tools', 'check_floors.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check_floors = _load_check_floors()


def _symbols(obj):
    """(defined global symbols, undefined symbols) of object OBJ."""
    return check_floors.object_symbols([obj])[obj]


def call_graph(lib):
    """{file: {file it calls: [symbols]}} among the objects of LIB."""
    return check_floors.call_graph(SOURCE_ROOT, BUILD, _objects(lib))


cycles = check_floors.cycles


def _explain(graph, comp):
    return check_floors.explain(graph, comp)


@pytest.mark.parametrize('lib', ['lock', 'base'])
def test_no_circle_among_the_files_of_a_floor_by_the_functions_they_call(lib):
    graph = call_graph(lib)
    assert graph, 'no calls between files found: the check would pass vacuously'
    found = cycles(graph)
    assert not found, 'circles: ' + ' | '.join(_explain(graph, c) for c in found)


def test_the_cycle_finder_finds_a_circle():
    """Negative control: the finder itself sees a circle of three."""
    g = {'a.c': {'b.c': ['f']}, 'b.c': {'c.c': ['g']}, 'c.c': {'a.c': ['h']}, 'd.c': {}}
    assert cycles(g) == [['a.c', 'b.c', 'c.c']]


def test_no_header_of_core_lock_declares_a_function_of_the_engine():
    """engine.c is the floor above core/lock/: nothing there may name it."""
    engine = set()
    for o in _objects('core'):
        engine |= {s for s in _symbols(o)[0] if s.startswith('lockfs_')}
    assert 'lockfs_core_open' in engine, 'engine.c not found: the check would pass vacuously'
    found = []
    for h in sorted(glob.glob(os.path.join(SOURCE_ROOT, 'core', 'lock', '*.h'))):
        text = open(h, encoding='utf-8').read()
        found += [f'{os.path.basename(h)}: {s}' for s in sorted(engine)
                  if re.search(r'\b' + re.escape(s) + r'\s*\(', text)]
    assert not found, found


def _sources(*folders, ext=('.c', '.h')):
    out = []
    for f in folders:
        out += sorted(p for p in glob.glob(os.path.join(SOURCE_ROOT, f, '*'))
                      if p.endswith(ext))
    assert out, f'no sources under {folders}: the check would pass vacuously'
    return out


def test_the_cache_entry_is_named_after_what_it_holds():
    """`struct held_lock` (a held lock's parsed record and what the engine
    knows of it), not `struct cached`."""
    found = [os.path.relpath(p, SOURCE_ROOT) for p in _sources('core', 'core/lock')
             if re.search(r'\bstruct cached\b', open(p, encoding='utf-8').read())]
    assert not found, found
    assert any('struct held_lock {' in open(p, encoding='utf-8').read()
               for p in _sources('core/lock'))


def test_the_lock_floor_reads_the_replaceable_clocks():
    """core/base/clock.c's clocks, which a unit test replaces: no timer of
    core/lock/ reads clock_gettime (or time()) of its own."""
    found = [os.path.relpath(p, SOURCE_ROOT) for p in _sources('core/lock', ext=('.c',))
             if re.search(r'\bclock_gettime\s*\(|\btime\s*\(\s*NULL',
                          open(p, encoding='utf-8').read())]
    assert not found, found


def test_the_engine_reaches_the_store_only_through_store_c():
    """One wrapper per op (core/lock/store.c): no `be->ops->X` call in
    core/engine.c or core/lock/ besides them, and none in fs/: fs/main.c
    closes a store the engine never took (its open failed before) with
    lockfs_backend_close (backend.h), as fs/ may use no core/lock/ header."""
    found = []
    for p in _sources('core', 'core/lock', ext=('.c',)):
        if p.endswith(os.path.join('lock', 'store.c')):
            continue
        for n, line in enumerate(open(p, encoding='utf-8'), 1):
            if '->ops->' in line:
                found.append(f'{os.path.relpath(p, SOURCE_ROOT)}:{n}: {line.strip()}')
    assert not found, found
    for p in _sources('fs', ext=('.c',)):
        for n, line in enumerate(open(p, encoding='utf-8'), 1):
            assert '->ops->' not in line, f'{os.path.relpath(p, SOURCE_ROOT)}:{n}: {line.strip()}'
    store = open(os.path.join(SOURCE_ROOT, 'core', 'lock', 'store.c'), encoding='utf-8').read()
    assert store.count('be->ops->') >= 15


def test_no_c_file_of_core_lock_or_of_the_record_is_over_1000_lines():
    """One job per file (core/base/record.c was 1,087 lines: the model, two
    encoders and the parser; now record.c, record_encode.c,
    record_compact.c and record_parse.c)."""
    files = _sources('core/lock', ext=('.c',)) + \
        sorted(glob.glob(os.path.join(SOURCE_ROOT, 'core', 'base', 'record*.c')))
    long = {os.path.relpath(p, SOURCE_ROOT): n for p in files
            if (n := sum(1 for _ in open(p, encoding='utf-8'))) > 1000}
    assert not long, long
    names = {os.path.basename(p) for p in files}
    assert {'record_encode.c', 'record_compact.c', 'record_parse.c'} <= names
