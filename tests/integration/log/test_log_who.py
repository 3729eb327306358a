"""Issue 8 §4 and §6: no line of the audit log can be made to look like
someone else's, and the log tells no secrets.

WHO is a name the caller's environment may choose (LOCKFS_SLUG), so every
line also carries uid= and pid=: the uid the kernel reported for the request
(or the holder's, recorded the same way) and the process WHO stands for.
"""

import errno
import fcntl
import os
import signal
import subprocess

from lockfs_helpers import (DAEMON_EVENTS, LINE_BREAKERS, LOG_EVENTS, LogLine, agent_named, log_escape,
                            log_for, log_unescape, read_log, wait_free, wait_log, wait_until,
                            who_of)


def test_a_slug_cannot_pose_as_another_process(mnt_ao, procs, users):
    """Observed: LOCKFS_SLUG='bash[99999]' made a denial look like
    bash[99999]'s."""
    holder = procs.agent()
    assert holder.mkdir(mnt_ao.path('x')) == 0
    liar = procs.agent(user=users[0], env={'LOCKFS_SLUG': 'bash[99999]'})
    assert liar.rmdir(mnt_ao.path('x')) != 0
    d = [l for l in log_for(mnt_ao.dir, 'x') if l.event == 'denied']
    assert len(d) == 1 and d[0].who == 'bash[99999]'
    assert (d[0].details['uid'], d[0].details['pid']) == (str(users[0].uid), str(liar.pid))


def test_a_slug_named_root_logs_the_real_uid(mnt_ao, procs, users):
    """Observed: LOCKFS_SLUG=root logged uid 1002's lock as `root ... acquired`."""
    a = procs.agent(user=users[0], env={'LOCKFS_SLUG': 'root'})
    assert a.mkdir(mnt_ao.path('s')) == 0
    assert a.rmdir(mnt_ao.path('s')) == 0
    lines = log_for(mnt_ao.dir, 's')
    assert [(l.who, l.event, l.details['uid'], l.details['pid']) for l in lines] == [
        ('root', 'acquired', str(users[0].uid), str(a.pid)),
        ('root', 'released', str(users[0].uid), str(a.pid))]


def test_holder_lines_carry_the_holders_uid_and_pid(mnt_ao, procs, users):
    a = procs.agent(user=users[1])
    assert a.mkdir(mnt_ao.path('h')) == 0
    assert a.rmdir(mnt_ao.path('h')) == 0
    lines = log_for(mnt_ao.dir, 'h')
    assert [(l.details['uid'], l.details['pid']) for l in lines] == \
        [(str(users[1].uid), str(a.pid))] * 2
    # uid= and pid= come right after fence=, before the event's own details
    assert all(l.fields[3].startswith('fence=') and l.fields[4].startswith('uid=') and
               l.fields[5].startswith('pid=') for l in lines), [l.raw for l in lines]


def test_every_line_carries_uid_and_pid(lockfs_factory, procs, users):
    m = lockfs_factory(allow_other=True)
    a = procs.agent(user=users[0])
    b = procs.agent(user=users[1])
    assert a.mkdir(m.path('x')) == 0
    assert b.rmdir(m.path('x')) != 0                          # denied
    assert a.write(m.path('x', 'lease'), b'1\n') == 0
    wait_log(m.dir, 'x', 'expired')                           # expired
    assert a.rmdir(m.path('x')) == 0                          # released
    assert a.mkdir(m.path('y')) == 0
    with open(m.path('y', 'break'), 'w') as f:                # broken
        f.write('stuck\n')
    assert a.mkdir(m.path('z')) == 0
    a.kill()
    wait_free(m, 'z')                                         # recovered
    wait_log(m.dir, 'z', 'recovered')
    fd = os.open(m.path('.flock', 'f'), os.O_RDWR | os.O_CREAT)            # fd acquired, bound
    fcntl.flock(fd, fcntl.LOCK_EX)
    with open(m.path('f', 'bind'), 'w') as f:
        f.write('process\n')
    os.close(fd)
    os.rmdir(m.path('f'))
    lines = read_log(m.dir)
    events = {l.event for l in lines}
    assert {'acquired', 'released', 'denied', 'expired', 'broken', 'recovered',
            'bound'} <= events
    for l in lines:
        assert l.details['uid'].isdigit() and l.details['pid'].isdigit(), l.raw
    br = [l for l in lines if l.event == 'broken'][0]
    assert (br.details['uid'], br.details['pid']) == (str(users[0].uid), str(a.pid))
    assert br.details['by'] == who_of(os.getpid())
    assert (br.details['by_uid'], br.details['by_pid']) == ('0', str(os.getpid()))


def test_refused_and_holder_exited_lines_carry_uid_and_pid(lockfs_factory, procs, users):
    """The lines of a cap's refusals (issue 8 §2) and of a holder whose
    descendants keep its lock (issue 9 §2) name their process too."""
    m = lockfs_factory(allow_other=True, options=('max_locks_per_uid=1',))
    a = procs.agent(user=users[0])
    assert a.mkdir(m.path('x')) == 0
    assert a.mkdir(m.path('y')) == errno.EDQUOT
    ref = wait_until(lambda: [l for l in log_for(m.dir, 'y') if l.event == 'refused'],
                     timeout=10, what='the refused line')
    assert (ref[0].details['uid'], ref[0].details['pid']) == (str(users[0].uid), str(a.pid))
    # sh holds (mkdir is a helper), exits, and leaves a child behind.
    u = users[1]
    p = subprocess.Popen(['sh', '-c', 'mkdir "$1" || exit 9; sleep 60 >/dev/null & echo $!',
                          'sh', m.path('h')], stdout=subprocess.PIPE,
                         user=u.uid, group=u.gid, extra_groups=[])
    child = int(p.stdout.readline())
    try:
        assert p.wait(10) == 0
        ex = wait_log(m.dir, 'h', 'holder-exited')[0]
        assert (ex.details['uid'], ex.details['pid']) == (str(u.uid), str(p.pid)), ex.raw
    finally:
        os.kill(child, signal.SIGKILL)
        p.stdout.close()
    rec = wait_log(m.dir, 'h', 'recovered')[0]
    assert (rec.details['uid'], rec.details['pid']) == (str(u.uid), str(p.pid)), rec.raw


def test_uid_and_pid_survive_a_line_that_is_too_long(mnt, procs):
    """A line past 4 KiB loses its details, but not uid= and pid=."""
    a = procs.agent(env={'LOCKFS_SLUG': 's' * 200})
    assert a.mkdir(mnt.path('long')) == 0
    with open(mnt.path('long', 'break'), 'w') as f:
        f.write(' ' * 1024)                                   # 4 KiB once escaped
    b = [l for l in log_for(mnt.dir, 'long') if l.event == 'broken']
    assert len(b) == 1 and b[0].details.get('details') == 'dropped', b[0].raw
    assert (b[0].details['uid'], b[0].details['pid']) == ('0', str(a.pid))


def test_the_log_carries_no_command_line(lockfs_factory, procs, users):
    """What the log shows of a process is its comm, pid and uid (and the slug
    it chose): never its command line (docs/log.md, "What the log reveals,
    and to whom")."""
    m = lockfs_factory(allow_other=True)
    secret = 'hunter2-' + os.urandom(4).hex()
    # The agent's command line (python3 -c CODE) carries the secret.
    a = procs.agent(user=users[0], setup=f'# --password={secret}\n')
    with open(f'/proc/{a.pid}/cmdline', 'rb') as f:
        assert secret.encode() in f.read()                    # control: it is there
    assert a.mkdir(m.path('p')) == 0
    assert procs.agent(user=users[1]).rmdir(m.path('p')) != 0
    assert a.write(m.path('p', 'operation'), f'deploy {secret}'.encode()) == 0
    assert a.write(m.path('p', 'lease'), b'1\n') == 0
    wait_log(m.dir, 'p', 'expired')
    assert a.rmdir(m.path('p')) == 0
    assert a.mkdir(m.path('q')) == 0
    a.kill()
    wait_log(m.dir, 'q', 'recovered')
    with open(m.dpath('lock.log'), 'rb') as f:
        text = f.read()
    assert secret.encode() not in text
    assert all(secret.encode() not in log_unescape(fld) for l in read_log(m.dir)
               for fld in l.fields)


#: issue 19 §3: the comm of the attack, NEL (U+0085) and LINE SEPARATOR
#: (U+2028) around a fake word, 11 of the 15 bytes a comm may have
FORGED_COMM = b'x\xc2\x85FAKE\xe2\x80\xa8Z'


def test_a_comm_a_slug_or_a_name_cannot_start_a_line_for_splitlines(mnt_ao, procs, users):
    """Observed: a comm of NEL and U+2028 and a name of U+2028 plus a fake
    line with NBSP for spaces made Python's splitlines() (and a terminal)
    show a forged root `released` line.  Now every line a caller can put
    text into is exactly one line to splitlines(), and each field reads
    back as the text the caller chose."""
    holder = agent_named(procs, FORGED_COMM, user=users[0])
    # NBSP is a character of names; the fake line rides in the name.
    name = 'evil\u00a0' + '\u00a0'.join(['2026-08-22T23:05:52.123Z', 'root', 'deploy',
                                          'fence=1', 'uid=0', 'pid=1', 'released'])
    assert holder.mkdir(mnt_ao.path(name)) == 0
    denier = agent_named(procs, b'\xc2\x9b31m\xe2\x80\xae', user=users[1],
                         env={'LOCKFS_SLUG': 'slug\u2029\u0085\u202e\u2066x'})
    assert denier.rmdir(mnt_ao.path(name)) == errno.EPERM
    assert holder.rmdir(mnt_ao.path(name)) == 0

    with open(mnt_ao.dpath('lock.log'), 'rb') as f:
        raw = f.read()
    text = raw.decode('utf-8')                  # strict: no stray byte either
    assert not LINE_BREAKERS.intersection(text.replace('\n', '')), text
    lines = text.splitlines()
    assert lines == text.split('\n')[:-1], 'splitlines() sees another line than awk does'
    parsed = [LogLine(l) for l in lines]
    assert all(l.event in LOG_EVENTS + DAEMON_EVENTS and 'uid' in l.details
               and 'pid' in l.details
               for l in parsed), lines
    mine = [l for l in parsed if l.name == name.encode()]
    assert [(l.who, l.event, l.details['uid']) for l in mine] == [
        (f'{FORGED_COMM.decode()}[{holder.pid}]', 'acquired', str(users[0].uid)),
        ('slug\u2029\u0085\u202e\u2066x', 'denied', str(users[1].uid)),
        (f'{FORGED_COMM.decode()}[{holder.pid}]', 'released', str(users[0].uid))]
    # escaped as the docs say, \xHH per byte of each such character
    assert mine[0].fields[1] == f'x\\xc2\\x85FAKE\\xe2\\x80\\xa8Z[{holder.pid}]'
    assert all(l.fields[1] == log_escape(l.who) and l.fields[2] == log_escape(name)
               for l in mine)
    assert not [l for l in parsed if l.who == 'root']        # nothing forged
