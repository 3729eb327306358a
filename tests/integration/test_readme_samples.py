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
"""

import difflib
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from flock_helpers import Shell
from lockfs_helpers import mount_entry, unguard, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.normpath(os.path.join(HERE, '..', '..', 'README.md'))

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
