#!/usr/bin/python3
"""Issue 10 §5: the README's first commands work on a fresh Debian 12 machine
used as root, which has no sudo.

The README's first shell block is what a newcomer types.  These tests read
it (they do not run it: tools/test.sh would run this suite inside itself,
and tools/setup.sh installs into /usr/local):
- no line of it starts with, or contains, `sudo`;
- every script a line runs exists in the source tree and is executable;
- the text after it still says what a normal user does.
"""

import os
import re

from lockfs_helpers import SOURCE_ROOT

README = os.path.join(SOURCE_ROOT, 'README.md')


def first_block():
    """The lines of the README's first fenced block (comments stripped, blank
    lines dropped), and the text that follows the block."""
    text = open(README, encoding='utf-8').read()
    m = re.search(r'^```[a-z]*\n(.*?)^```\n', text, re.S | re.M)
    assert m, 'README.md has no fenced command block'
    lines = []
    for line in m.group(1).splitlines():
        command = line.split('#', 1)[0].strip()
        if command:
            lines.append(command)
    assert lines, 'the README\'s first block has no command in it'
    return lines, text[m.end():]


def test_readme_first_commands_do_not_use_sudo():
    lines, _ = first_block()
    for command in lines:
        assert 'sudo' not in command.split(), \
            f'README command {command!r} needs sudo, which a fresh Debian 12 root has not'


def test_readme_first_commands_name_executable_scripts():
    lines, _ = first_block()
    scripts = [c.split()[0] for c in lines if '/' in c.split()[0]]
    assert scripts, f'no script named in the README\'s first block: {lines}'
    for script in scripts:
        path = os.path.join(SOURCE_ROOT, script)
        assert os.path.isfile(path), f'README names {script}, which does not exist'
        assert os.access(path, os.X_OK), f'README names {script}, which is not executable'


def test_readme_says_what_a_normal_user_runs():
    _, after = first_block()
    paragraph = after.strip().split('\n\n', 1)[0]
    assert 'normal user' in paragraph, paragraph
    assert 'su -c' in paragraph or 'sudo' in paragraph, paragraph
