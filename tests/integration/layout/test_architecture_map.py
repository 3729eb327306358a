#!/usr/bin/python3
"""docs/architecture.md and README.md's file map agree with the tree
(issue 21, "A map that matches the code").  No mount, no build: the test
reads the sources as they are when it runs.

What the two maps say is checked where it can be checked by reading:

- every file they name in backticks (`queue.c`, `lock/queue.h`,
  `include/lockfs/backend.h`, `queue.{c,h}`) exists;
- every function they name as `name()` or `file.c:name` is defined in the
  sources (in that file, for the second form), and every `lockfs_...`
  identifier they name is defined somewhere (a function, a variable, a
  type, a macro; `lockfs_core_*` means some identifier with that prefix);
- every .c and .h file of core/ and fs/ is named.

A library function (fuse_reply_entry, renameat2) is written without `()`
in the maps, so that it is not taken for one of ours.  README.md's file
map is the table that begins with "| path | contents |"; a bare file name
in one of its rows is looked for under that row's folder."""

import fnmatch
import os
import re

import pytest


def _source_root():
    """The tree this file sits in: the nearest folder above it with
    docs/architecture.md and README.md (so that the test still finds it
    when tests/ is regrouped into deeper folders)."""
    here = os.path.dirname(os.path.abspath(__file__))
    while True:
        if all(os.path.exists(os.path.join(here, f))
               for f in ('README.md', 'meson.build', os.path.join('docs', 'architecture.md'))):
            return here
        up = os.path.dirname(here)
        if up == here:
            raise RuntimeError('no source tree with docs/architecture.md above ' + __file__)
        here = up


SOURCE_ROOT = _source_root()
ARCHITECTURE = os.path.join(SOURCE_ROOT, 'docs', 'architecture.md')
README = os.path.join(SOURCE_ROOT, 'README.md')

# A file name in a backtick span: optional folders, a stem, .c, .h or .{c,h}.
FILE_RE = re.compile(r'(?<![\w./*-])((?:[\w-]+/)*[\w-]+\.(?:\{c,h\}|[ch]))(?![\w.])')
GLOB_RE = re.compile(r'(?<![\w./-])((?:[\w*-]+/)*[\w-]*\*[\w*-]*\.(?:\{c,h\}|[ch]))(?![\w.])')
CALL_RE = re.compile(r'^([A-Za-z_]\w*)\(\)$')
FILE_FUNC_RE = re.compile(r'(?<![\w./-])((?:[\w-]+/)*[\w-]+\.[ch]):([A-Za-z_]\w*)')
LOCKFS_RE = re.compile(r'\b(lockfs_\w+)(\*?)')
KEYWORDS = {'if', 'for', 'while', 'switch', 'return', 'sizeof', 'do', 'else'}


def _is_build_dir(path):
    return any(os.path.exists(os.path.join(path, m)) for m in ('meson-private', 'meson-info'))


def tree_sources():
    """Every .c and .h file of the tree, as paths relative to its root
    (build directories and hidden ones left out)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(SOURCE_ROOT):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith('.')
                             and not _is_build_dir(os.path.join(dirpath, d)))
        for f in filenames:
            if f.endswith(('.c', '.h')):
                out.append(os.path.relpath(os.path.join(dirpath, f), SOURCE_ROOT))
    return sorted(out)


def _strip_comments(text):
    text = re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)
    return re.sub(r'//[^\n]*', ' ', text)


def _definitions(text):
    """The identifiers TEXT (C, comments removed) defines: functions,
    tags, typedefs, file-scope variables, macros."""
    found = set()
    for m in re.finditer(r'\b([A-Za-z_]\w*)\s*\(((?:[^;{}()]|\([^()]*\))*)\)\s*'
                         r'(?:__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)\s*)?\{', text):
        if m.group(1) not in KEYWORDS:
            found.add(m.group(1))
    found.update(re.findall(r'\b(?:struct|union|enum)\s+(\w+)\s*\{', text))
    found.update(re.findall(r'^\s*#\s*define\s+(\w+)', text, flags=re.M))
    for m in re.finditer(r'\btypedef\b([^;]*);', text):
        body = m.group(1)
        fp = re.search(r'\(\s*\*\s*(\w+)\s*\)\s*\(', body)
        found.add(fp.group(1) if fp else re.findall(r'(\w+)\s*(?:\[[^\]]*\])*\s*$', body)[-1])
    found.update(re.findall(r'^[A-Za-z_][\w \t*]*?\b(\w+)\s*(?:\[[^\]]*\])*\s*=', text, flags=re.M))
    return found


@pytest.fixture(scope='module')
def tree():
    files = tree_sources()
    defs = {}
    for f in files:
        with open(os.path.join(SOURCE_ROOT, f), encoding='utf-8', errors='replace') as fh:
            defs[f] = _definitions(_strip_comments(fh.read()))
    every = set().union(*defs.values())
    return files, defs, every


def spans(text):
    """The backtick spans of markdown TEXT, code blocks left out."""
    text = re.sub(r'^```.*?^```', '', text, flags=re.S | re.M)
    return re.findall(r'`([^`\n]+)`', text)


def _expand(token):
    if token.endswith('.{c,h}'):
        stem = token[:-len('.{c,h}')]
        return [stem + '.c', stem + '.h']
    return [token]


def resolve(token, files, folder=None):
    """The tree's files that file name TOKEN (no brace form) may mean: the
    ones it is a path suffix of; a bare name in a row of FOLDER, the ones
    under FOLDER."""
    if folder and '/' not in token:
        return [f for f in files if f.startswith(folder) and os.path.basename(f) == token]
    return [f for f in files if f == token or f.endswith('/' + token)]


def check_map(text, files, defs, every, folder_of=None):
    """(problems, files named) for map TEXT.  FOLDER_OF(line) gives the
    folder a line's bare names are looked for under (README's rows)."""
    problems, named = [], set()
    for line in text.splitlines():
        folder = folder_of(line) if folder_of else None
        for span in spans(line):
            for m in FILE_RE.finditer(span):
                for token in _expand(m.group(1)):
                    hits = resolve(token, files, folder)
                    if not hits:
                        where = f' under {folder}' if folder and '/' not in token else ''
                        problems.append(f'names file `{token}`, which does not exist{where}')
                    named.update(hits)
            for m in GLOB_RE.finditer(span):
                for pattern in _expand(m.group(1)):
                    if not any(fnmatch.fnmatch(f, '*' + pattern) for f in files):
                        problems.append(f'names files `{pattern}`, which match none')
            for m in FILE_FUNC_RE.finditer(span):
                path, func = m.groups()
                hits = resolve(path, files, folder)
                if hits and not any(func in defs[f] for f in hits):
                    problems.append(f'names `{path}:{func}`, which {" ".join(hits)} does not define')
            m = CALL_RE.match(span)
            if m and m.group(1) not in every:
                problems.append(f'names function `{m.group(1)}()`, which no source file defines')
            for m in LOCKFS_RE.finditer(span):
                name, star = m.groups()
                known = any(d.startswith(name) for d in every) if star else name in every
                if not known:
                    problems.append(f'names `{name}{star}`, which no source file defines')
    return problems, named


def unnamed(files, named):
    return [f for f in files
            if f.split('/', 1)[0] in ('core', 'fs') and f not in named]


def architecture_problems(text, tree):
    files, defs, every = tree
    problems, named = check_map(text, files, defs, every)
    problems += [f'leaves `{f}` unnamed' for f in unnamed(files, named)]
    return problems


def readme_file_map(text):
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip().startswith('| path | contents |')),
                 None)
    assert start is not None, 'README.md has no file map ("| path | contents |")'
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith('|'):
            break
        rows.append(line)
    return '\n'.join(rows)


def _row_folder(line):
    m = re.match(r'\|\s*`([\w./-]+/)`\s*\|', line)
    return m.group(1) if m else None


def readme_problems(text, tree):
    files, defs, every = tree
    problems, named = check_map(readme_file_map(text), files, defs, every, _row_folder)
    problems += [f'leaves `{f}` unnamed' for f in unnamed(files, named)]
    return problems


def _read(path):
    with open(path, encoding='utf-8') as fh:
        return fh.read()


def test_architecture_names_only_what_exists_and_every_file(tree):
    problems = architecture_problems(_read(ARCHITECTURE), tree)
    assert not problems, 'docs/architecture.md ' + '\n  '.join(problems)


def test_readme_file_map_names_only_what_exists_and_every_file(tree):
    problems = readme_problems(_read(README), tree)
    assert not problems, "README.md's file map " + '\n  '.join(problems)


# Negative controls: the checks can fail.

def test_a_missing_file_a_missing_function_and_an_unnamed_file_are_found(tree):
    files, _, _ = tree
    some = next(f for f in files if f.startswith('core/'))
    text = ('`core/backend/dir_v1.c` and `ops.c:reply_lock_entry`, `no_such_function()`,'
            ' `lockfs_no_such_thing`, `lockfs_core_*`')
    problems = architecture_problems(text, tree)
    assert any('dir_v1.c' in p for p in problems)
    assert any('reply_lock_entry' in p for p in problems)
    assert any('no_such_function()' in p for p in problems)
    assert any('lockfs_no_such_thing' in p for p in problems)
    assert not any('lockfs_core_*' in p for p in problems)
    assert f'leaves `{some}` unnamed' in problems


def test_a_definition_is_told_from_a_call(tree):
    _, _, every = tree
    assert 'lockfs_core_acquire' in every          # defined in core/dirlocks.c
    assert 'lfs_mkdir' in every                    # static, in fs/ops.c
    assert 'fuse_reply_entry' not in every         # libfuse's: only called
    assert 'renameat2' not in every


def test_readme_bare_names_are_looked_for_under_their_row(tree):
    text = ('| path | contents |\n|---|---|\n'
            '| `core/backend/` | `queue.c` |\n')
    problems = readme_problems(text, tree)
    assert any('`queue.c`' in p and 'core/backend/' in p for p in problems)
