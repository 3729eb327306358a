#!/usr/bin/python3
"""Check that every arrow between the source folders points down (issue 10 §1).

    tools/check_floors.py [--floors fs,tools,core] [--source DIR] [--build BUILD]

Floors, top to bottom: fs/ (the FUSE adapter), the engine (the files at
core/'s top level: engine.c and its siblings, sharing engine.h), core/lock/,
core/proc/ and core/backend/, core/base/ (with the public headers of the
ground floor: name.h, utf8.h, record.h, log.h, limits.h).  core/proc/'s
public headers are proc.h (processes as /proc describes them), holder.h
(the holder rule), descendants.h and procevents.h; core/backend/ may use
proc.h (a daemon's start time), never the other way.
tools/lockctl/ stands apart and uses only the name rule and the limits;
tools/bench/'s programs use only the public headers (include/lockfs/).

Checks, for each floor named in --floors (default: all three):
- includes: every `#include "..."` in a .c or .h file of the floor names a
  header the floor may use (the ALLOWED table below);
- core: no cycle among the headers of core/lock/;
- symbols (with --build): every global function (`nm` type T) of the
  floor's objects starts with `lockfs_` (core: the static libraries
  BUILD/core/liblockfs-*.a; fs: the daemon's fs/ objects; tools: lockctl's);
- calls (with --build): no circle of .c files by the functions and data
  they name, in any folder (core/*, core/*/*, fs/, tools/): file A names a
  global that file B defines (`nm`: U in A's object, T/D/B/R in B's) draws
  A -> B, and a circle A -> B -> ... -> A is a problem line.  A call that
  has to go up goes through a function pointer the floor above sets (as
  docs/architecture.md says): the floor above names the function, the one
  below only calls the pointer, so no arrow points up.  Each program is its
  own graph: the daemon (fs/ and core/'s libraries), lockctl, each bench
  program (with the libraries it may link).
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
# (proc.h), the holder rule (holder.h), the descendants of holders
# (descendants.h) and the kernel's process events (procevents.h).
PROC_PUBLIC = {'proc.h', 'holder.h', 'descendants.h', 'procevents.h'}


def floor_of(src, path):
    """The floor of source file PATH (relative to SRC), as a label."""
    rel = os.path.relpath(path, src)
    parts = rel.split(os.sep)
    if parts[0] == 'fs':
        return 'fs'
    if parts[:2] == ['tools', 'lockctl']:
        return 'lockctl'
    if parts[:2] == ['tools', 'bench']:
        return 'bench'
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
    if me == 'bench':
        # A benchmark is a client of the code it measures, like fs/ or a
        # user: the interfaces in include/lockfs/, never a floor's inside.
        if to == 'bench' or public:
            return None
        return 'tools/bench/ may use only the public headers (include/lockfs/)'
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
        roots = ['tools/lockctl', 'tools/bench']
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


# The objects of the programs the call check reads, as globs under BUILD:
# core/'s static libraries (the engine's floors, linked into the daemon and
# into the bench programs that use them), then each program's own objects.
LIBRARY_OBJECTS = ('core/liblockfs-*.a.p/*.o', 'core/*/liblockfs-*.a.p/*.o')
PROGRAMS = {
    'lockfs': ('lockfs.p/*.o',),
    'lockctl': ('tools/lockctl.p/*.o',),
    'bench': ('tools/bench/*.p/*.o',),
}


def object_source(src, build, obj, cache):
    """The source file (relative to SRC) that object OBJ was compiled from.
    meson names BUILD/D/TARGET.p/X.o after the source's path relative to
    SRC/D, its separators made '_' (lock/queue.c -> lock_queue.c.o,
    ../core/base/name.c -> .._core_base_name.c.o).  None if no .c matches."""
    d = os.path.relpath(os.path.dirname(os.path.dirname(obj)), build)
    if d not in cache:
        here = os.path.normpath(os.path.join(src, d))
        names = {}
        for root in ('core', 'fs', 'tools'):
            for dirpath, _, files in os.walk(os.path.join(src, root)):
                for f in files:
                    if f.endswith('.c'):
                        full = os.path.join(dirpath, f)
                        mangled = os.path.relpath(full, here).replace(os.sep, '_')
                        names[mangled + '.o'] = os.path.relpath(full, src)
        cache[d] = names
    return cache[d].get(os.path.basename(obj))


def object_symbols(objs):
    """{object: (globals it defines, symbols it names undefined)}, by nm."""
    out = {o: (set(), set()) for o in objs}
    if not objs:
        return out
    r = subprocess.run(['nm', '-A'] + objs, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f'nm failed: {r.stderr.strip()}')
    for line in r.stdout.splitlines():
        where, _, rest = line.rpartition(':')   # "file.o:0000 T name", "file.o: U name"
        f = rest.split()
        if where not in out:
            continue
        if len(f) == 3 and f[1] in 'TDBRC':
            out[where][0].add(f[2])
        elif len(f) == 2 and f[0] == 'U':
            out[where][1].add(f[1])
    return out


def call_graph(src, build, objs, symbols=None, cache=None):
    """{file: {file it names: [symbols]}} among the .c files of OBJS
    (paths relative to SRC).  Objects of one source (name.c compiled into
    lockctl and into lockfs-base) are one file."""
    symbols = symbols if symbols is not None else object_symbols(objs)
    cache = cache if cache is not None else {}
    defs, uses = {}, {}
    for o in objs:
        f = object_source(src, build, o, cache) or os.path.relpath(o, build)
        defs.setdefault(f, set()).update(symbols[o][0])
        uses.setdefault(f, set()).update(symbols[o][1])
    owners = {}
    for f, syms in defs.items():
        for s in syms:
            owners.setdefault(s, set()).add(f)
    graph = {f: {} for f in defs}
    for f, used in uses.items():
        for s in sorted(used):
            own = owners.get(s, set())
            if len(own) == 1 and f not in own:   # two definers: not ours to judge
                graph[f].setdefault(next(iter(own)), []).append(s)
    return graph


def cycles(graph):
    """The strongly connected components of GRAPH with more than one file
    (each sorted; Tarjan's algorithm): every circle lies inside one."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def explain(graph, comp):
    """COMP's arrows, each with the symbols that draw it."""
    return '; '.join(f'{a} -> {b} ({", ".join(sorted(graph[a][b]))})'
                     for a in comp for b in sorted(graph.get(a, {})) if b in comp)


def program_graphs(src, build):
    """{program: call graph} for each program whose objects are under BUILD."""
    libs = sorted(o for g in LIBRARY_OBJECTS for o in glob.glob(os.path.join(build, g)))
    own = {p: sorted(o for g in globs for o in glob.glob(os.path.join(build, g)))
           for p, globs in PROGRAMS.items()}
    every = sorted(set(libs).union(*own.values()))
    symbols = object_symbols(every)
    cache = {}
    graphs = {}
    if libs:
        graphs['core'] = call_graph(src, build, libs, symbols, cache)
    for p, objs in own.items():
        if objs:
            graphs[p] = call_graph(src, build, objs + libs, symbols, cache)
    return graphs


def check_calls(src, build):
    """One line per circle of files by the functions they call."""
    try:
        graphs = program_graphs(src, build)
    except RuntimeError as e:
        return [f'calls: {e}']
    if not graphs:
        return [f'calls: no objects under {build} (build first)']
    errors, seen = [], set()
    for prog, graph in graphs.items():
        for comp in cycles(graph):
            if tuple(comp) in seen:      # the libraries' circles, once
                continue
            seen.add(tuple(comp))
            errors.append(f'call cycle ({prog}): {" <-> ".join(comp)}: {explain(graph, comp)}')
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
    if a.build:
        errors += check_calls(src, os.path.normpath(a.build))
    for e in errors:
        print(e)
    print(f'check_floors: {", ".join(floors)}: {len(errors)} problem(s)', file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == '__main__':
    main()
