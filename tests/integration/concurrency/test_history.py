"""The history checker (history.py): it accepts sound histories and catches
every kind of unsound one, then judges a real herd on the dir store."""

import datetime
import subprocess

import pytest

import history
from history import check_history, grants_of, parse_lines, read_histories
from lockfs_helpers import read_log
from witness_herd import check_witness, names_in, run_herd


def L(*lines):
    return parse_lines(''.join(l + '\n' for l in lines))


def T(ms):
    """A timestamp MS milliseconds after a fixed second."""
    return f'2026-12-01T15:00:{ms // 1000:02d}.{ms % 1000:03d}Z'


def acq(ms, fence, name='x', who='a[1]', extra=''):
    return f'{T(ms)} {who} {name} fence={fence} uid=0 pid=1 {extra}acquired'


def end(ms, fence, event='released', name='x', who='a[1]'):
    return f'{T(ms)} {who} {name} fence={fence} uid=0 pid=1 {event}'


# ---- sound histories ----

def test_alternating_grants_across_hosts_are_sound():
    logs = {'h1': L(acq(0, 5), end(10, 5), acq(30, 9), end(40, 9)),
            'h2': L(acq(10, 7), end(20, 7, 'recovered'), acq(50, 11), end(60, 11, 'broken'))}
    assert check_history(logs, held=set()) == []


def test_hand_off_in_the_same_millisecond_is_sound():
    logs = {'h1': L(acq(0, 5), end(10, 5)), 'h2': L(acq(10, 6, extra='bound=fd mode=exclusive '))}
    assert check_history(logs, held={'x'}) == []
    assert check_history(logs, held={('x', 6)}) == []


def test_a_lost_grant_may_overlap_its_successor():
    # h1's session expired: h2 was granted before h1's daemon logged `lost`.
    logs = {'h1': L(acq(0, 5), end(3000, 5, 'lost')), 'h2': L(acq(2500, 8), end(2600, 8))}
    assert check_history(logs, held=set()) == []


def test_a_break_from_another_host_and_the_holders_lost_end_one_grant():
    # root broke h1's x on h2; h1's daemon saw the key go and logged `lost`
    lost = f'{T(40)} a[1] x fence=5 uid=0 pid=1 evidence=removed-in-store session=1 lost'
    brk = f'{T(30)} a[1] x fence=5 uid=0 pid=1 by=r[2] by_uid=0 by_pid=2 reason=r broken'
    for h1 in (L(acq(0, 5), lost), L(acq(0, 5), lost, acq(60, 9), end(70, 9))):
        logs = {'h1': h1, 'h2': L(brk, acq(35, 7), end(50, 7))}
        assert check_history(logs, held=set()) == []
        # the logs of the hosts come in either order
        assert check_history(dict(reversed(list(logs.items()))), held=set()) == []


def test_a_removed_in_store_lost_is_no_excuse_for_a_second_end_on_its_own_host():
    lost = f'{T(40)} a[1] x fence=5 uid=0 pid=1 evidence=removed-in-store session=1 lost'
    logs = {'h1': L(acq(0, 5), end(30, 5), lost)}
    assert any('ended twice' in p for p in check_history(logs, held=set()))
    # and a break on another host after which h2 was granted before the
    # break: still two holders at once
    brk = f'{T(30)} a[1] x fence=5 uid=0 pid=1 by=r[2] by_uid=0 by_pid=2 reason=r broken'
    logs = {'h1': L(acq(0, 5), lost), 'h2': L(acq(20, 7), brk, end(50, 7))}
    assert any('two holders' in p for p in check_history(logs, held=set()))


def test_a_retried_release_ends_when_its_holder_asked():
    # h1's rmdir was refused during an election (EIO) at 10 ms; etcd had
    # applied the delete, h2 was granted at 20 ms, and h1's daemon logged
    # the completed release at 900 ms with asked= the refused rmdir's time.
    retried = f'{T(900)} a[1] x fence=5 uid=0 pid=1 retried=1 asked={T(10)} released'
    logs = {'h1': L(acq(0, 5), retried), 'h2': L(acq(20, 7), end(30, 7))}
    assert check_history(logs, held=set()) == []
    # without asked= the same line is an overlap
    plain = f'{T(900)} a[1] x fence=5 uid=0 pid=1 retried=1 released'
    problems = check_history({'h1': L(acq(0, 5), plain), 'h2': L(acq(20, 7), end(30, 7))},
                             held=set())
    assert any('two holders at once' in p for p in problems), problems
    # asked= after the next grant is still an overlap
    late = f'{T(900)} a[1] x fence=5 uid=0 pid=1 retried=1 asked={T(25)} released'
    problems = check_history({'h1': L(acq(0, 5), late), 'h2': L(acq(20, 7), end(30, 7))},
                             held=set())
    assert any('two holders at once' in p for p in problems), problems


def test_shared_holders_may_overlap_each_other():
    sh = 'bound=fd mode=shared '
    logs = {'h1': L(acq(0, 5, extra=sh), acq(1, 6, extra=sh), end(10, 5), end(12, 6),
                    acq(12, 7), end(13, 7))}
    assert check_history(logs, held=set()) == []


def test_lines_without_fence_and_other_names_are_ignored():
    logs = {'h1': L(acq(0, 5), f'{T(1)} ? x uid=0 pid=- by=b[2] by_uid=0 by_pid=2 reason=r broken',
                    f'{T(2)} lockfs - uid=0 pid=9 count=3 lost',
                    acq(3, 5, name='y'), end(4, 5, name='y'),
                    f'{T(5)} a[1] x fence=5 uid=0 pid=1 ttl_s=2 evidence=holder-alive expired',
                    end(6, 5))}
    assert check_history(logs, held=set()) == []
    assert [g.fence for g in grants_of(logs, 'x')] == [5]


# ---- unsound histories ----

def test_overlapping_grants_are_caught():
    logs = {'h1': L(acq(0, 5), end(20, 5)), 'h2': L(acq(10, 7), end(30, 7))}
    problems = check_history(logs, held=set())
    assert len(problems) == 1 and 'two holders at once' in problems[0], problems


def test_a_fence_that_goes_backwards_is_caught():
    logs = {'h1': L(acq(0, 9), end(10, 9)), 'h2': L(acq(20, 7), end(30, 7))}
    problems = check_history(logs, held=set())
    assert any('fence went backwards' in p for p in problems), problems


def test_a_fence_granted_twice_is_caught():
    logs = {'h1': L(acq(0, 5), end(10, 5)), 'h2': L(acq(20, 5), end(30, 5))}
    assert any('granted twice' in p for p in check_history(logs, held=set()))


def test_an_acquisition_without_end_is_caught_unless_held():
    logs = {'h1': L(acq(0, 5), end(10, 5), acq(20, 6))}
    assert any('has no end and is not held' in p for p in check_history(logs, held=set()))
    assert check_history(logs, held={b'x'}) == []
    assert check_history(logs, held={('x', 6)}) == []
    assert check_history(logs, held={('x', 5)}) != []
    assert check_history(logs) == []      # held unknown: only what ended is judged


def test_an_open_grant_followed_by_another_is_caught_even_when_held():
    logs = {'h1': L(acq(0, 5)), 'h2': L(acq(10, 6))}
    assert any('never ended' in p for p in check_history(logs, held={'x'}))


def test_an_end_without_acquisition_or_twice_is_caught():
    assert any('without an acquired line' in p
               for p in check_history({'h1': L(end(10, 5))}, held=set()))
    logs = {'h1': L(acq(0, 5), end(10, 5)), 'h2': L(end(11, 5, 'recovered'))}
    assert any('ended twice' in p for p in check_history(logs, held=set()))


def test_an_end_before_its_acquisition_is_caught():
    logs = {'h1': L(acq(10, 5)), 'h2': L(end(5, 5))}
    assert any('ended before it was acquired' in p for p in check_history(logs, held=set()))


def test_a_torn_log_is_refused():
    with pytest.raises(ValueError):
        parse_lines(acq(0, 5))


# ---- on a real herd: the dir store ----

AGENTS = 16
ROUNDS = 10


@pytest.mark.slow
def test_dir_herd_history_is_sound_and_a_forged_overlap_is_caught(mnt, tmp_path):
    """16 agents on one dir mount, half the rounds by mkdir, half by flock
    (hand-offs): the checker passes on the real log; then one release moved
    after the next acquisition makes it fail."""
    witness = tmp_path / 'witness'
    results = run_herd([(mnt.mnt, '-')], 'herd', witness, agents=AGENTS, rounds=ROUNDS,
                       mode='mix')
    check_witness(witness, results, ROUNDS)
    assert names_in(mnt.mnt) == []
    logs = read_histories([('dir', mnt.dir)])
    assert check_history(logs, held=set()) == []
    grants = grants_of(logs, 'herd')
    assert len(grants) == AGENTS * ROUNDS
    assert sum(1 for g in grants if g.line.details.get('bound') == 'fd') == AGENTS * ROUNDS // 2

    # Forge: the first grant's release is written 1 ms after the second
    # grant's acquisition.
    lines = read_log(mnt.dir)
    first, second = grants[0], grants[1]
    i = next(k for k, l in enumerate(lines) if l.raw == first.end[1].raw)
    late = second.t * 1000 + 1
    forged = list(lines)
    forged[i] = parse_lines(_ts(late) + first.end[1].raw[len(first.end[1].timestamp):]
                            + '\n')[0]
    problems = check_history({'dir': forged}, held=set())
    assert any('two holders at once' in p for p in problems), problems
    mnt.assert_alive()


def _ts(ms):
    dt = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return dt.strftime('%Y-%m-%dT%H:%M:%S.') + f'{int(ms) % 1000:03d}Z'


def test_history_command_line(tmp_path):
    good, bad = tmp_path / 'good.log', tmp_path / 'bad.log'
    good.write_text(acq(0, 5) + '\n' + end(10, 5) + '\n')
    bad.write_text(acq(0, 5) + '\n' + acq(5, 6) + '\n' + end(10, 5) + '\n' + end(11, 6) + '\n')
    script = history.__file__   # the checker, run as its own command
    ok = subprocess.run(['/usr/bin/python3', script, str(good)],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and 'OK' in ok.stdout, ok
    no = subprocess.run(['/usr/bin/python3', script, str(bad)],
                        capture_output=True, text=True, timeout=30)
    assert no.returncode == 1 and 'two holders at once' in no.stdout, no


def test_cross_host_lag_is_allowed_only_across_hosts_and_only_as_much_as_asked():
    # h1's released line was written 7 ms after h2's acquired: a log lag
    logs = {'h1': L(acq(0, 10), end(507, 10)), 'h2': L(acq(500, 11), end(520, 11))}
    assert any('two holders at once' in p for p in check_history(logs, held=set()))
    assert check_history(logs, held=set(), cross_host_ms=10) == []
    assert check_history(logs, held=set(), cross_host_ms=5) != []
    same = {'h1': L(acq(0, 10), end(507, 10), acq(500, 11), end(520, 11))}
    assert check_history(same, held=set(), cross_host_ms=10) != []
