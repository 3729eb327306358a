#!/usr/bin/python3
"""Check that every arrow between the source folders points down (issue 10 §1).

    tools/check_floors.py [--floors fs,tools,core] [--source DIR] [--build BUILD]

Floors, top to bottom: fs/ (the FUSE adapter), the engine (the files at
core/'s top level: engine.c and its siblings, sharing engine.h), core/lock/,
core/proc/ and core/backend/, core/base/ (with the public headers of the
ground floor: name.h, utf8.h, record.h, log.h, limits.h).  core/proc/'s
public headers are proc.h (processes as /proc describes them) and holder.h
(the holder rule); core/backend/ may use proc.h (a daemon's start time),
never the other way.
tools/lockctl/ stands apart and uses only the name rule and the limits.

Checks, for each floor named in --floors (default: all three):
- includes: every `#include "..."` in a .c or .h file of the floor names a
  header the floor may use (the ALLOWED table below);
- core: no cycle among the headers of core/lock/;
- symbols (with --build): every global function (`nm` type T) of the
  floor's objects starts with `lockfs_` (core: the static libraries
  BUILD/core/liblockfs-*.a; fs: the daemon's fs/ objects; tools: lockctl's).
Files named *_v1.[ch] are exempt until the engine leaves backend v1.

Prints one line per violation and exits 1 if there is any, else 0.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

ALL_FLOORS = ('fs', 'tools', 'core')
# The fs/ files that may include backend.h (see allowed()).
FS_BACKEND_USERS = ('main.c', 'stop.c', 'lifecycle.c')
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# The public headers (include/lockfs/) of the ground floor: its leaves'.
BASE_PUBLIC = {'name.h', 'utf8.h', 'record.h', 'log.h', 'limits.h'}
# The public headers of core/proc/: processes as /proc describes them
# (proc.h), and the holder rule (holder.h).
PROC_PUBLIC = {'proc.h', 'holder.h'}


def floor_of(src, path):
    """The floor of source file PATH (relative to SRC), as a label."""
    rel = os.path.relpath(path, src)
    parts = rel.split(os.sep)
    if parts[0] == 'fs':
        return 'fs'
    if parts[:2] == ['tools', 'lockctl']:
        return 'lockctl'
    if parts[0] == 'core':
        if len(parts) == 2:
            return 'engine'
        return parts[1]           # lock, proc, backend, base, etcd
    if parts[:2] == ['include', 'lockfs']:
        return 'public'
    return None


def resolve(src, path, name):
    """The file an include NAME in PATH names: its folder first, then core/
    (for core files), then include/.  None when not found."""
    here = os.path.dirname(path)
    tries = [os.path.join(here, name)]
    if os.path.relpath(path, src).startswith('core' + os.sep):
        tries.append(os.path.join(src, 'core', name))
    tries.append(os.path.join(src, 'include', name))
    for t in tries:
        if os.path.isfile(t):
            return os.path.normpath(t)
    return None


def exempt(path):
    return re.search(r'_v1\.[ch]$', path) is not None


def allowed(src, path, target):
    """Why the include of TARGET from PATH is refused, or None when allowed."""
    me = floor_of(src, path)
    to = floor_of(src, target)
    base = os.path.basename(target)
    public = to == 'public'
    if me == 'fs':
        # fs/ -> fs/ and the public headers but etcd_client.h; backend.h
        # only in main.c (the registry) and the two files that act on the
        # store's state directory for the daemon's own life: stop.c (a
        # stopping daemon says so) and lifecycle.c (a predecessor's end,
        # for the log); never a core/ header.
        if to == 'fs':
            return None
        if public and base == 'backend.h':
            return None if os.path.basename(path) in FS_BACKEND_USERS \
                else 'backend.h outside fs/main.c, stop.c and lifecycle.c'
        if public and base != 'etcd_client.h':
            return None
        return 'fs/ may use fs/ and include/lockfs/ (not etcd_client.h), never core/'
    if me == 'lockctl':
        if to == 'lockctl' or (public and base in ('name.h', 'utf8.h', 'limits.h')):
            return None
        return 'tools/lockctl/ may use only name.h, utf8.h and limits.h'
    if me == 'engine':
        # Its own headers (engine.h: struct lockfs_core, shared by the
        # files at core/'s top level; engine_test.h) and every floor below: lock/,
        # proc/, base/, and the public headers.
        if to in ('engine', 'lock', 'proc', 'base', 'public'):
            return None
        return "core/'s top level may use its own headers, lock/, proc/, base/ and include/"
    if me == 'lock':
        # core.h: the API's types (struct lockfs_caller, lockfs_wait, ...).
        if to in ('lock', 'proc', 'base') or \
                (public and (base in BASE_PUBLIC or base in PROC_PUBLIC or
                             base in ('backend.h', 'core.h'))):
            return None
        return 'core/lock/ may use lock/, proc/, base/ and backend.h'
    if me == 'backend':
        # proc.h: the real /proc's readers (a daemon's start time); core/proc/
        # never includes a backend header, so this arrow makes no circle.
        if to in ('backend', 'base', 'etcd') or \
                (public and (base in BASE_PUBLIC or base in ('backend.h', 'etcd_client.h', 'proc.h'))):
            return None
        return 'core/backend/ may use backend/, base/, etcd/, backend.h and proc.h'
    if me == 'etcd':
        if to in ('etcd', 'base') or \
                (public and (base in BASE_PUBLIC or base == 'etcd_client.h')):
            return None
        return 'core/etcd/ may use etcd/, base/ and etcd_client.h'
    if me == 'proc':
        if to in ('proc', 'base') or (public and (base in BASE_PUBLIC or base in PROC_PUBLIC)):
            return None
        return 'core/proc/ may use proc/ and base/'
    if me == 'base':
        # A leaf: its own header, limits.h, utf8.h and clock.h (the
        # clocks and the time format, which depend on nothing), and
        # log_line.h (log.c).
        own = os.path.splitext(os.path.basename(path))[0] + '.h'
        if base == own or base in ('limits.h', 'utf8.h'):
            return None
        # A leaf split in files (record.c, record_encode.c, ...): its
        # family's header (record.h) and internal ones (record_compact.h).
        family = os.path.basename(path).split('_')[0].split('.')[0]
        if base == family + '.h' or (to == 'base' and base.startswith(family + '_')):
            return None
        if base == 'clock.h' and to == 'base':
            return None
        if base == 'log_line.h' and os.path.basename(path) == 'log.c':
            return None
        if base == 'log.h' and os.path.basename(path) == 'log_line.c':
            return None  # log_line.c is log.h's other half
        return 'core/base/ files are leaves: own header, limits.h, utf8.h, clock.h'
    return None


def sources(src, floor):
    if floor == 'fs':
        roots = ['fs']
    elif floor == 'tools':
        roots = ['tools/lockctl']
    else:
        roots = ['core']
    out = []
    for r in roots:
        for dirpath, _, files in os.walk(os.path.join(src, r)):
            out += [os.path.join(dirpath, f) for f in files if f.endswith(('.c', '.h'))]
    return sorted(out)


def check_includes(src, floor):
    errors = []
    lock_graph = {}
    for path in sources(src, floor):
        if exempt(path):
            continue
        rel = os.path.relpath(path, src)
        text = open(path, encoding='utf-8', errors='replace').read()
        for name in INCLUDE.findall(text):
            target = resolve(src, path, name)
            if target is None:
                errors.append(f'{rel}: #include "{name}": not found in the tree')
                continue
            if exempt(target):
                continue
            why = allowed(src, path, target)
            if why:
                errors.append(f'{rel}: #include "{name}": {why}')
            if path.endswith('.h') and floor_of(src, path) == 'lock' and \
                    floor_of(src, target) == 'lock':
                lock_graph.setdefault(rel, set()).add(os.path.relpath(target, src))
    if floor == 'core':
        errors += lock_cycles(lock_graph)
    return errors


def lock_cycles(graph):
    """One line per cycle found among core/lock/ headers (depth-first)."""
    errors, state = [], {}

    def visit(node, stack):
        state[node] = 'open'
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 'open':
                cyc = stack[stack.index(nxt):] + [nxt]
                errors.append('core/lock/ header cycle: ' + ' -> '.join(cyc))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 'done'

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    return errors


def objects(build, floor):
    if floor == 'core':
        return sorted(glob.glob(os.path.join(build, 'core', 'liblockfs-*.a')))
    if floor == 'fs':
        return sorted(glob.glob(os.path.join(build, 'lockfs.p', 'fs_*.o')))
    return sorted(glob.glob(os.path.join(build, 'tools', 'lockctl.p', 'lockctl_*.o')))


def check_symbols(build, floor):
    objs = objects(build, floor)
    if not objs:
        return [f'{floor}: no objects under {build} (build first)']
    r = subprocess.run(['nm', '-A', '--defined-only'] + objs, capture_output=True, text=True)
    if r.returncode != 0:
        return [f'{floor}: nm failed: {r.stderr.strip()}']
    errors = []
    for line in r.stdout.splitlines():
        # "lib.a:member.o:0000 T name" or "file.o:0000 T name"
        where, _, rest = line.rpartition(':')
        fields = rest.split()
        if len(fields) != 3 or fields[1] != 'T':
            continue
        sym = fields[2]
        if exempt(where.replace('.c.o', '.c')) or '_v1.c.o' in where:
            continue
        if sym.startswith('lockfs_') or sym == 'main':
            continue
        obj = ':'.join(os.path.basename(w) for w in where.split(':'))
        errors.append(f'{obj}: global function {sym} has no lockfs_ prefix (make it static,'
                      f' or name it lockfs_<module>_...)')
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--floors', default=','.join(ALL_FLOORS),
                    help='comma-separated: fs, tools, core (default: all)')
    ap.add_argument('--source', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     '..'))
    ap.add_argument('--build', help='the build dir, for the symbol check (nm)')
    a = ap.parse_args()
    floors = [f for f in a.floors.split(',') if f]
    bad = [f for f in floors if f not in ALL_FLOORS]
    if bad:
        sys.exit(f'check_floors: unknown floor {bad[0]} (want {", ".join(ALL_FLOORS)})')
    src = os.path.normpath(a.source)
    errors = []
    for f in floors:
        errors += check_includes(src, f)
        if a.build:
            errors += check_symbols(a.build, f)
    for e in errors:
        print(e)
    print(f'check_floors: {", ".join(floors)}: {len(errors)} problem(s)', file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == '__main__':
    main()
