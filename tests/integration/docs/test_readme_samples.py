#!/usr/bin/python3
"""Issue 20 §4: every console sample in README.md is run, and what it
prints must have the shape the README shows, so that a stale sample fails.

A console block (```console) is a list of steps: a prompt line, then the
output the command prints.  The prompt names a shell: `A$`, `B$` (two
shells of one story), `$` and `#` (a shell, root's prompt).  Each shell is a
persistent `bash -s` as root, reading the commands from a pipe, with stderr
joined to stdout, LC_ALL=C and TZ=UTC.  A comment after two spaces and `#`
on an output line (`File exists   # EEXIST`) explains the sample and is not
part of it.

The mount is the layout tools/setup.sh makes, under a temporary ROOT that
stands for `/`: the daemon serves ROOT/srv/lockfs/locks (backing directory
ROOT/run/lockfs, `-o allow_other`), and ROOT/locks is a symlink to it.  The
commands' `/locks`, `/srv/lockfs` and `/run/lockfs` are rewritten into ROOT,
and ROOT is taken out of the output again.  The real /locks is never used.

Before comparing, both sides are masked (MASKS below: times, pids, fences,
tokens, boot ids, the host name, the sizes of files whose content has those
in it) and runs of blanks inside a line become one blank (ls aligns its
columns to the widest entry).  Everything else must match line for line.

Each block starts on a fresh mount with fresh shells, unless it is listed in
CONTINUES (it goes on with the previous block's mount and shells).  A block
whose sample presumes something it does not show gets it from SETUP, keyed
by its first prompt line; a new block that needs none just works.

Issue 20 §5: each claim of the README's "Don'ts" box (in "In a script") is
checked on a real mount by a test_dont_* test, which also finds the claim
(and the number of EPERM lines `rm -rf` prints) in the box's text.
"""

import difflib
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from flock_helpers import Shell
from lockfs_helpers import SOURCE_ROOT, mount_entry, unguard, wait_until

README = os.path.join(SOURCE_ROOT, 'README.md')

PROMPT = re.compile(r'^(?P<who>[A-Z]?\$|#) (?P<cmd>.*)$')
ANNOTATION = re.compile(r'\s{2,}#\s.*$')
#: paths of the real layout that the commands are pointed away from
REAL_PATHS = re.compile(r'(?<![\w./-])/(locks|srv/lockfs|run/lockfs)(?![\w-])')

MASKS = [
    # RFC 3339 times of the record and the log; ls --time-style=full-iso; ls -l
    (re.compile(r'\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z'), '<TIME>'),
    (re.compile(r'\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{9} [+-]\d{4}'), '<TIME>'),
    (re.compile(r'\b[A-Z][a-z]{2} +\d{1,2} +(\d\d:\d\d|\d{4})\b'), '<DATE>'),
    (re.compile(r'\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b'), '<UUID>'),
    (re.compile(r'\b[0-9a-f]{32}\b'), '<TOKEN>'),
    # numbers of the record that differ from run to run
    (re.compile(r'"(pid|ns_pid|start_time|fence|acquired_at_ms|holder_session|expires_at_ms|'
                r'deadline_boottime_ms)": \d+'), r'"\1": <N>'),
    (re.compile(r'"host": "[^"]*"'), '"host": <HOST>'),
    # the log: comm[pid], and key=number
    (re.compile(r'\[\d+\]'), '[<N>]'),
    (re.compile(r'\b(fence|pid|by_pid|start)=\d+\b'), r'\1=<N>'),
    # an interactive bash, as in the README, names no line; `bash -s` does
    (re.compile(r'^bash: line \d+: '), 'bash: '),
    # a line that is one number: `cat M/NAME/fence`
    (re.compile(r'^\d+$'), '<N>'),
    # ls -l: the size of files that hold pids, fences and times
    (re.compile(r'^([-dlrwxst]{10} \d+ \S+ \S+) \d+ (<DATE> (owner|fence))$'), r'\1 <N> \2'),
]


def mask(line):
    line = re.sub(r'(?<=\S)[ \t]+', ' ', line.rstrip())
    for rx, repl in MASKS:
        line = rx.sub(repl, line)
    return line


# --------------------------------------------------------------------------
# the README's console blocks

class Step:
    def __init__(self, lineno, who, cmd):
        self.lineno, self.who, self.cmd = lineno, who, cmd
        self.expected = []

    def key(self):
        return f'{self.who} {self.cmd}'


def console_blocks(text):
    """[(line number of the fence, [Step])] of every ```console block."""
    blocks, steps, start = [], None, 0
    for n, line in enumerate(text.splitlines(), 1):
        if steps is None:
            if line.strip() == '```console':
                steps, start = [], n
            continue
        if line.strip() == '```':
            blocks.append((start, steps))
            steps = None
            continue
        m = PROMPT.match(line)
        if m:
            steps.append(Step(n, m.group('who'), m.group('cmd')))
        else:
            assert steps, f'README.md:{n}: output before the first prompt: {line!r}'
            steps[-1].expected.append(ANNOTATION.sub('', line))
    assert steps is None, f'README.md:{start}: console block is not closed'
    return blocks


def read_blocks():
    with open(README, encoding='utf-8') as f:
        return console_blocks(f.read())


#: blocks that go on with the previous block's mount and shells (its story)
CONTINUES = {
    'B$ mkdir /locks/deploy',        # "Shell B is a separate process"
    'A$ rmdir /locks/deploy',        # "Shell A releases the lock"
}


def scenes(blocks):
    """Blocks grouped into runs on one mount: [[(lineno, steps)]]."""
    out = []
    for block in blocks:
        lineno, steps = block
        assert steps, f'README.md:{lineno}: a console block without a prompt line'
        if out and steps[0].key() in CONTINUES:
            out[-1].append(block)
        else:
            out.append([block])
    return out


# --------------------------------------------------------------------------
# running them

class SampleShell(Shell):
    """Shell (flock_helpers.py), started as `bash -s` like the README's
    shells (their `cmdline` is in the sample)."""

    def __init__(self, env):
        self.proc = subprocess.Popen(['bash', '-s'], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     cwd='/', env=env)
        self.pid = self.proc.pid
        self._n = 0
        self._buf = b''
        self._done = {}


class Stage:
    """The fresh layout of one scene: .root stands for `/`."""

    def __init__(self, root, mount, procs):
        self.root = root
        self.mount = mount
        self.procs = procs
        self.shells = {}
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith('LOCKFS_') and not k.startswith('LC_')}
        self.env.update(LC_ALL='C', TZ='UTC')

    def shell(self, who):
        if who not in self.shells:
            s = SampleShell(self.env)
            self.procs.shells.append(s)       # stopped by the procs fixture
            self.shells[who] = s
        return self.shells[who]

    def rewrite(self, cmd):
        return REAL_PATHS.sub(lambda m: self.root + m.group(0), cmd)

    def run(self, who, cmd, timeout=30):
        """The output lines of CMD in shell WHO, with ROOT taken out."""
        _, out = self.shell(who).run(self.rewrite(cmd), timeout)
        return out.replace(self.root, '').splitlines()

    def locks(self, *parts):
        return os.path.join(self.root, 'locks', *parts)

    def log(self):
        with open(os.path.join(self.root, 'run', 'lockfs', 'lock.log')) as f:
            return f.read()


def _after_a_holder_exited(stage):
    """`cat /locks/.log` showing `recovered`: a shell took deploy and exited."""
    subprocess.run(['bash', '-c', f'mkdir {stage.locks("deploy")}; true'], check=True,
                   env=stage.env)
    wait_until(lambda: 'recovered' in stage.log(), 5, what='the recovered line')


def _while_another_shell_holds_deploy(stage):
    """`echo reason > .../break`: someone else's shell holds deploy."""
    stage.run('holder', 'mkdir /locks/deploy')
    assert os.path.isdir(stage.locks('deploy'))


SETUP = {
    '$ cat /locks/.log': _after_a_holder_exited,
    '# echo "holder hung, paging ops" > /locks/deploy/break': _while_another_shell_holds_deploy,
}


def run_scene(stage, scene):
    """The differences between the samples of SCENE and what they print:
    [] when every step matches."""
    problems = []
    for lineno, steps in scene:
        setup = SETUP.get(steps[0].key())
        if setup:
            setup(stage)
        for step in steps:
            got = [mask(l) for l in stage.run(step.who, step.cmd)]
            want = [mask(l) for l in step.expected]
            if got != want:
                diff = '\n'.join(difflib.unified_diff(want, got, 'README', 'ran', lineterm=''))
                problems.append(f'README.md:{step.lineno}: {step.who} {step.cmd}\n{diff}')
    return problems


@pytest.fixture
def stage_root():
    """ROOT, world-traversable; removed after the mount is gone (this
    fixture is set up before lockfs_factory, so it is torn down after it)."""
    root = tempfile.mkdtemp(prefix='lockfs-readme-')
    os.chmod(root, 0o755)
    yield root
    mnt = os.path.join(root, 'srv', 'lockfs', 'locks')
    if mount_entry(mnt) is None:
        unguard(mnt)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def stage(stage_root, lockfs_factory, procs):
    """The layout tools/setup.sh makes, under ROOT."""
    root = stage_root
    mnt = os.path.join(root, 'srv', 'lockfs', 'locks')
    backing = os.path.join(root, 'run', 'lockfs')
    os.makedirs(mnt, 0o755)
    os.makedirs(backing, 0o700)
    os.chmod(backing, 0o700)
    os.symlink(mnt, os.path.join(root, 'locks'))
    m = lockfs_factory(backing=backing, mountpoint=mnt, allow_other=True)
    return Stage(root, m, procs)


SCENES = scenes(read_blocks())


def test_the_readme_has_console_samples():
    assert len(SCENES) >= 4, SCENES


@pytest.mark.parametrize('scene', SCENES, ids=[f'README.md:{s[0][0]}' for s in SCENES])
def test_readme_console_sample(stage, scene):
    problems = run_scene(stage, scene)
    assert not problems, 'the README sample is stale:\n' + '\n\n'.join(problems)


def test_a_stale_sample_fails(stage):
    """Negative control: the first sample with one line of its output
    changed no longer passes."""
    scene = scenes(read_blocks())[0]
    lineno, steps = scene[0]
    step = next(s for s in steps if '"operation": "migrating db",' in
                [l.strip() for l in s.expected])
    i = [l.strip() for l in step.expected].index('"operation": "migrating db",')
    step.expected[i] = step.expected[i].replace('migrating db', 'migrating the db')
    problems = run_scene(stage, scene)
    assert len(problems) == 1 and f'README.md:{step.lineno}:' in problems[0], problems


# --------------------------------------------------------------------------
# issue 20 §5: the README's "Don'ts" box, claim by claim

def dont_box():
    """The text of the README's Don'ts box, one line, blanks collapsed."""
    with open(README, encoding='utf-8') as f:
        text = f.read()
    m = re.search(r"^> \*\*Don'ts\.\*\*.*?\n(?!>)", text, re.S | re.M)
    assert m, "README.md has no Don'ts box (a quote starting **Don'ts.**)"
    lines = [l[1:].strip() for l in m.group(0).splitlines()]
    return re.sub(r'\s+', ' ', ' '.join(lines))


def box_claim(pattern):
    """The match of PATTERN in the box: the box still says it."""
    m = re.search(pattern, dont_box())
    assert m, f'the Don\'ts box no longer says {pattern!r}'
    return m


def owner_of(mnt, name):
    with open(mnt.path(name, 'owner')) as f:
        return json.load(f)


C_LOCALE = {'LC_ALL': 'C'}


def test_dont_mkdir_p_succeeds_on_someone_elses_lock(mnt_ao, procs):
    box_claim(r'`mkdir -p /locks/x`\*\* exits 0 while someone else holds `x`')
    a, b = procs.shell(env=C_LOCALE), procs.shell(env=C_LOCALE)
    x = mnt_ao.path('x')
    a.ok(f'mkdir {x}')
    assert b.run(f'mkdir -p {x}') == (0, '')
    assert owner_of(mnt_ao, 'x')['holder']['pid'] == a.pid     # still a's
    # the control: plain mkdir tells
    rc, out = b.run(f'mkdir {x}')
    assert rc == 1 and 'File exists' in out, out


def test_dont_mkdir_p_of_a_path_takes_its_first_part_and_fails(mnt_ao, procs):
    box_claim(r'`mkdir -p /locks/x/y`\*\* takes `x`, then fails on `y` \(EPERM\)')
    b = procs.shell(env=C_LOCALE)
    rc, out = b.run(f'mkdir -p {mnt_ao.path("x", "y")}')
    assert rc == 1 and 'Operation not permitted' in out, out
    assert owner_of(mnt_ao, 'x')['holder']['pid'] == b.pid


def test_dont_rm_rf_prints_one_eperm_per_file_and_releases_nothing(mnt_ao, procs):
    said = int(box_claim(r'`rm -rf /locks/x`\*\* releases nothing, even run by the holder: '
                         r'it prints (\d+) "Operation not permitted" lines').group(1))
    a = procs.shell(env=C_LOCALE)
    x = mnt_ao.path('x')
    a.ok(f'mkdir {x}')
    files = os.listdir(x)
    rc, out = a.run(f'rm -rf {x}')
    lines = out.splitlines()
    assert rc == 1, out
    assert all(l.startswith('rm: cannot remove') and l.endswith('Operation not permitted')
               for l in lines), out
    assert len(lines) == len(files) == said, (said, files, out)
    assert owner_of(mnt_ao, 'x')['holder']['pid'] == a.pid     # still held
    a.ok(f'rmdir {x}')                                          # only rmdir releases
    assert not os.path.exists(x)


def test_dont_runuser_mkdir_is_eacces_holder_unknown(mnt_ao, users):
    box_claim(r'`runuser -u U -- mkdir /locks/x`\*\* .*fails with "Permission denied" '
              r'\(EACCES, logged `reason=holder-unknown`\)')
    u = users[0]
    x = mnt_ao.path('x')
    r = subprocess.run(['runuser', '-u', u.name, '--', 'mkdir', x], capture_output=True,
                       text=True, env=dict(os.environ, **C_LOCALE), cwd='/')
    assert r.returncode == 1 and 'Permission denied' in r.stderr, r
    assert not os.path.exists(x)
    with open(mnt_ao.dpath('lock.log')) as f:
        denied = [l for l in f if ' x ' in l and l.rstrip().endswith(' denied')]
    assert len(denied) == 1 and f'uid={u.uid} ' in denied[0] and \
        'reason=holder-unknown' in denied[0], denied
    # what the box says to do instead: the whole script as U
    box_claim(r'Run the whole script as U \(`runuser -u U -- \./deploy\.sh`\)')
    r = subprocess.run(['runuser', '-u', u.name, '--', 'bash', '-c',
                        f'mkdir {x} && test -d {x} && rmdir {x}'],
                       capture_output=True, text=True, cwd='/')
    assert r.returncode == 0, r


def test_dont_builtin_in_a_shell_that_exported_the_slug(mnt_ao, procs):
    box_claim(r'`export LOCKFS_SLUG=agent-7`, then a shell builtin\*\*')
    box_claim(r'a builtin runs in the shell itself, whose environment has no slug, and gets EPERM')
    s = procs.shell(env=C_LOCALE)
    x = mnt_ao.path('x')
    s.ok('export LOCKFS_SLUG=agent-7')
    s.ok(f'mkdir {x}')
    o = owner_of(mnt_ao, 'x')
    assert (o['bound'], o['slug']) == ('slug', 'agent-7'), o
    rc, out = s.run(f'echo text > {x}/operation')
    assert rc == 1 and 'Operation not permitted' in out, out
    # what the box says to do instead
    box_claim(r'Use `echo text \| tee /locks/x/operation`')
    s.ok(f'echo text | tee {x}/operation')
    with open(mnt_ao.path('x', 'operation')) as f:
        assert f.read() == 'text\n'
    s.ok(f'rmdir {x}')
