#!/bin/bash
# tools/bench/bench_handoff.sh: the issue-4 benchmark (waiting through flock), as root.
#
#   tools/bench/bench_handoff.sh [--rounds N] [--samples N] [--poll-samples N]
#                          [--agents N] [--per-agent N] [--settle US]
#                          [--timeout S] [--without-lockfs] [--base BASE_BUILD]
#                          [--smoke] [BUILD_DIR]
#
# Side by side in one run, in rounds:
#   hand-off latency, holder releases -> the parked waiter's flock returns;
#   lockfs and kernel flock alternate sample by sample (A B, B A, ...)
#     lockfs   flock(LOCK_EX) on M/.flock/handoff, holder's flock(LOCK_UN);
#              the waiter counts as parked once M/handoff/waiters lists it
#     kernel   the same on a tmpfs file; parked once /proc/locks shows the
#              blocked request
#     poll     the seed tool's protocol: the waiter tries mkdir DIR/NAME.lock
#              every 0.05 s, the holder releases by rmdir at a random phase
#              (--poll-samples in all, spread over the rounds)
#   herd (lockfs then kernel in odd rounds, kernel then lockfs in even ones):
#     --agents processes x --per-agent rounds of
#     {flock(LOCK_EX); tiny critical section; flock(LOCK_UN)} on one lock, for
#     lockfs and for kernel flock: total time, and fairness (grants per agent
#     among the first quarter of all grants, in acquisition order).
# Every hand-off sample is measured with CLOCK_MONOTONIC in tools/bench/bench_handoff.c;
# p50/p99 are taken per round, ratios lockfs/kernel round by round (pair by
# pair), and the summary shows their medians over the rounds, plus pooled
# percentiles over all samples.
#
# --base BASE_BUILD: A/B.  A second lockfs daemon, BASE_BUILD/lockfs (e.g. main
# built in another directory), is mounted beside BUILD_DIR's on a backing dir
# of its own in the same tmpfs, and joins the hand-off samples as "base"
# (base, lockfs and kernel alternate sample by sample); the summary adds the
# ratios lockfs / base round by round.  The herd runs lockfs and kernel only.
#
# --settle US: extra wait after the waiter is seen parked, before the release
# (default 1000).  --without-lockfs measures only kernel flock and polling
# (checks the method without a lockfs that has .flock).  --timeout S: a lock
# not handed over within S seconds fails the run (default 120).  --smoke: one
# round of 20 samples, 2 poll samples and an 8 x 5 herd, to show that the
# benchmark still runs (CI; no goal asserted, the figures mean little).
#
# Binaries: BUILD_DIR/lockfs and BUILD_DIR/tools/bench/bench_handoff (default
# BUILD_DIR ./build).  lockfs is mounted under /var/tmp/lockfs-handoff.XXXXXX
# with its backing dir DIR on a private tmpfs; everything mounted or started is
# undone on exit, also on error or Ctrl-C.

set -euo pipefail

# usage, die, is_mounted, stop_daemon, the work dir and the traps
. "$(dirname "$(readlink -f "$0")")/bench_helpers.sh"

ROUNDS=7
SAMPLES=500
POLL_SAMPLES=40
AGENTS=64
PER_AGENT=100
SETTLE=1000
TIMEOUT=120
WITH_LOCKFS=1
BASE=""
SMOKE=0
BUILD=./build
PY=/usr/bin/python3

while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=${2:?}; shift 2 ;;
	--samples) SAMPLES=${2:?}; shift 2 ;;
	--poll-samples) POLL_SAMPLES=${2:?}; shift 2 ;;
	--agents) AGENTS=${2:?}; shift 2 ;;
	--per-agent) PER_AGENT=${2:?}; shift 2 ;;
	--settle) SETTLE=${2:?}; shift 2 ;;
	--timeout) TIMEOUT=${2:?}; shift 2 ;;
	--without-lockfs) WITH_LOCKFS=0; shift ;;
	--base) BASE=${2:?}; shift 2 ;;
	--smoke) ROUNDS=1; SAMPLES=20; POLL_SAMPLES=2; AGENTS=8; PER_AGENT=5; SMOKE=1; shift ;;
	-h|--help) usage ;;
	-*) echo "bench_handoff.sh: unknown option $1" >&2; usage ;;
	*) BUILD=$1; shift ;;
	esac
done

[ "$(id -u)" = 0 ] || die "must run as root (it mounts a tmpfs and lockfs)"
for v in ROUNDS SAMPLES AGENTS PER_AGENT TIMEOUT; do
	[[ ${!v} =~ ^[0-9]+$ ]] && [ "${!v}" -ge 1 ] || die "--${v,,} must be a positive integer"
done
[[ $POLL_SAMPLES =~ ^[0-9]+$ ]] || die "--poll-samples must be a non-negative integer"
[[ $SETTLE =~ ^[0-9]+$ ]] || die "--settle must be a non-negative integer"
[ "$SAMPLES" -ge 100 ] || [ "$SMOKE" = 1 ] || echo "bench_handoff.sh: warning: under 100 samples per run, p99 is the maximum" >&2
[ "$ROUNDS" -ge 5 ] || [ "$SMOKE" = 1 ] || echo "bench_handoff.sh: warning: fewer than 5 rounds; medians are shaky" >&2

LOCKFS=$BUILD/lockfs
CLIENT=$BUILD/tools/bench/bench_handoff
[ -x "$CLIENT" ] || die "$CLIENT not found: build first (meson setup build && meson compile -C build)"
if [ "$WITH_LOCKFS" = 1 ]; then
	[ -x "$LOCKFS" ] || die "$LOCKFS not found: build first"
	command -v fusermount3 >/dev/null || die "fusermount3 not found"
fi
[ -z "$BASE" ] || [ "$WITH_LOCKFS" = 1 ] || die "--base needs lockfs (not --without-lockfs)"
[ -z "$BASE" ] || [ -x "$BASE/lockfs" ] || die "$BASE/lockfs not found: build the base first"
[ -x "$PY" ] || die "$PY not found"
export LOCKFS_BENCH_TIMEOUT=$TIMEOUT

# ---------------------------------------------------------------- cleanup ---
W=""            # work dir under /var/tmp
T=""            # our private tmpfs, $W/tmpfs
M=""            # the lockfs mount point, once mounted
DAEMON_PID=""   # the lockfs daemon we started
MB=""           # the base lockfs's mount point (--base), once mounted
BASE_PID=""     # the base lockfs daemon
CLIENT_PID=""   # the bench_handoff run in progress (its children die with it)

cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	set +e
	if [ -n "$CLIENT_PID" ] && kill -0 "$CLIENT_PID" 2>/dev/null; then
		kill -KILL "$CLIENT_PID"
		wait "$CLIENT_PID" 2>/dev/null
	fi
	unmount_fuse "$M"
	unmount_fuse "$MB"
	for pid in "$DAEMON_PID" "$BASE_PID"; do
		[ -z "$pid" ] || stop_daemon "$pid"
	done
	bench_workdir_remove "$M" "$MB"
	exit "$rc"
}
bench_traps

# ------------------------------------------------------------------ setup ---
bench_workdir lockfs-handoff 64m
DIR=$T/backing
mkdir -m 0700 "$DIR"
: > "$T/kflock-handoff"
: > "$T/kflock-herd"

mount_lockfs() { # BINARY BACKING MOUNTPOINT ERRFILE: start it, wait for the mount; sets STARTED_PID
	mkdir "$3"
	"$1" -f -o backing="$2" ${LOCKFS_OPTS:-} "$3" 2>"$4" &
	STARTED_PID=$!
	for i in $(seq 100); do
		is_mounted "$3" && break
		kill -0 "$STARTED_PID" 2>/dev/null || { cat "$4" >&2; die "$1 died before mounting"; }
		sleep 0.1
	done
	is_mounted "$3" || die "$1 did not mount $3 within 10 s"
	[ -d "$3/.flock" ] || die "$3/.flock does not exist: this lockfs has no flock waiting (issue 4)"
}

if [ "$WITH_LOCKFS" = 1 ]; then
	M=$W/m
	mount_lockfs "$LOCKFS" "$DIR" "$M" "$W/lockfs.err"
	DAEMON_PID=$STARTED_PID
fi
if [ -n "$BASE" ]; then
	DIRB=$T/backing-base
	mkdir -m 0700 "$DIRB"
	MB=$W/mb
	mount_lockfs "$BASE/lockfs" "$DIRB" "$MB" "$W/base.err"
	BASE_PID=$STARTED_PID
fi

RES=$W/results.tsv
: > "$RES"

client() { # OUTFILE ARGS...: run bench_handoff in the background, wait for it
	local out=$1 rc=0
	shift
	"$CLIENT" "$@" > "$out" &
	CLIENT_PID=$!
	wait "$CLIENT_PID" || rc=$?
	CLIENT_PID=""
	[ "$rc" = 0 ] || die "bench_handoff $* failed (status $rc)${M:+; lockfs stderr: $(tail -n 5 "$W/lockfs.err" | tr '\n' ' ')}"
	[ -z "$M" ] || : > "$DIR/lock.log"
	[ -z "$MB" ] || : > "$DIRB/lock.log"
}

run_handoff() { # ROUND: lockfs and kernel flock, alternating sample by sample
	local out=$W/out args=() c
	for c in "${HANDOFF_CONFIGS[@]}"; do
		case "$c" in
		lockfs) args+=("$M/.flock/handoff" "$M/handoff/waiters") ;;
		base) args+=("$MB/.flock/handoff" "$MB/handoff/waiters") ;;
		kernel) args+=("$T/kflock-handoff" proc) ;;
		esac
	done
	client "$out" handoff "$SAMPLES" "$SETTLE" "${args[@]}"
	awk -v r="$1" -v cfgs="${HANDOFF_CONFIGS[*]}" '
		BEGIN { n = split(cfgs, c, " ") }
		{ for (i = 1; i <= n; i++) print "handoff\t" c[i] "\t" r "\t" $i }' "$out" >> "$RES"
}

run_poll() { # ROUND N
	local out=$W/out
	client "$out" poll "$DIR/seedpoll.lock" "$2" 50
	awk -v r="$1" '{ print "handoff\tpoll\t" r "\t" $1 }' "$out" >> "$RES"
}

run_herd() { # CONFIG ROUND
	local out=$W/out
	case "$1" in
	lockfs) client "$out" herd "$M/.flock/herd" "$AGENTS" "$PER_AGENT" ;;
	kernel) client "$out" herd "$T/kflock-herd" "$AGENTS" "$PER_AGENT" ;;
	esac
	printf 'herd\t%s\t%s\t%s\n' "$1" "$2" "$(cat "$out")" >> "$RES"
}

if [ "$WITH_LOCKFS" = 1 ]; then CONFIGS=(lockfs kernel); else CONFIGS=(kernel); fi
HANDOFF_CONFIGS=("${CONFIGS[@]}")
[ -z "$BASE" ] || HANDOFF_CONFIGS=(base lockfs kernel)
COMMIT=$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "bench_handoff.sh: $ROUNDS rounds, $SAMPLES hand-offs per run, $POLL_SAMPLES polling hand-offs," \
	"herd $AGENTS x $PER_AGENT; $(nproc) CPUs, $(uname -r), commit $COMMIT${BASE:+, base $BASE}; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ((r = 1; r <= ROUNDS; r++)); do
	echo "bench_handoff.sh: round $r/$ROUNDS" >&2
	if (( r % 2 )); then order=("${CONFIGS[@]}")
	else order=(); for ((i = ${#CONFIGS[@]} - 1; i >= 0; i--)); do order+=("${CONFIGS[i]}"); done
	fi
	run_handoff "$r"
	n=$(( POLL_SAMPLES / ROUNDS + (r <= POLL_SAMPLES % ROUNDS ? 1 : 0) ))
	[ "$n" = 0 ] || run_poll "$r" "$n"
	for c in "${order[@]}"; do run_herd "$c" "$r"; done
done
[ ! -e "$DIR/seedpoll.lock" ] || die "the polling lock was left behind"
if [ -n "$M" ]; then
	left=$(find "$M" -mindepth 1 -maxdepth 1 ! -name '.*' -printf '%f ')
	[ -z "$left" ] || die "locks left behind in $M: $left"
	left=$(ls -A "$M/.flock")
	[ -z "$left" ] || die "$M/.flock still lists: $left"
fi
if [ -n "$MB" ]; then
	left=$(find "$MB" -mindepth 1 -maxdepth 1 ! -name '.*' -printf '%f ')
	[ -z "$left" ] || die "locks left behind in $MB: $left"
fi
echo "bench_handoff.sh: load at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2

"$PY" - "$RES" "$ROUNDS" "$SAMPLES" "$POLL_SAMPLES" "$AGENTS" "$PER_AGENT" "$SETTLE" <<'EOF'
import sys, math, statistics as st, collections
res, rounds, samples, npoll, agents, per_agent, settle = sys.argv[1], *map(int, sys.argv[2:])
lat = collections.defaultdict(lambda: collections.defaultdict(list))  # cfg -> round -> [us]
herd = collections.defaultdict(dict)                                   # cfg -> round -> (ms, counts)
for line in open(res):
    f = line.split('\t')
    if f[0] == 'handoff':
        lat[f[1]][int(f[2])].append(float(f[3]))
    else:
        v = f[3].split()
        herd[f[1]][int(f[2])] = (float(v[0]), [int(x) for x in v[1:]])
R = range(1, rounds + 1)
med = st.median
cfgs = [c for c in ('base', 'lockfs', 'kernel') if c in lat]

def pct(xs, q):  # nearest rank
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]

def row(label, v, fmt='{:9.1f}'):
    each = fmt.replace('{:9', '{:')
    return f"  {label:30}" + "".join(fmt.format(x) for x in (med(v), min(v), max(v))) + \
        "   " + " ".join(each.format(x) if x < 1000 else f"{x:.0f}" for x in v)

print(f"\nissue-4 benchmark: {rounds} rounds interleaved, {samples} hand-offs per run, "
      f"settle {settle} µs, herd {agents} agents x {per_agent}")
print("\nhand-off latency, µs (per round; median / min / max over rounds, then each round)")
print(f"  {'':30}{'median':>9}{'min':>9}{'max':>9}")
for c in cfgs:
    for q in (50, 99):
        print(row(f"{c} p{q}", [pct(lat[c][r], q) for r in R]))
print("\npooled over all rounds, µs")
print(f"  {'':12}{'n':>7}{'p50':>10}{'p99':>10}{'mean':>10}{'max':>10}")
pooled = {}
for c in cfgs + (['poll'] if 'poll' in lat else []):
    xs = [x for r in lat[c] for x in lat[c][r]]
    pooled[c] = xs
    print(f"  {c:12}{len(xs):7}{pct(xs, 50):10.1f}{pct(xs, 99):10.1f}{st.mean(xs):10.1f}{max(xs):10.1f}")

goals = []
if 'lockfs' in lat:
    print("\nratios lockfs / kernel flock, round by round (median / min / max)")
    r99 = [pct(lat['lockfs'][r], 99) / pct(lat['kernel'][r], 99) for r in R]
    r50 = [pct(lat['lockfs'][r], 50) / pct(lat['kernel'][r], 50) for r in R]
    print(row("hand-off p50 ratio", r50, '{:9.2f}'))
    print(row("hand-off p99 ratio", r99, '{:9.2f}'))
    goals.append(("hand-off p99 <= 6x kernel flock p99", f"{med(r99):.2f}x (rounds {min(r99):.2f}-{max(r99):.2f})", med(r99) <= 6))
    if 'base' in lat:
        b99 = [pct(lat['base'][r], 99) / pct(lat['kernel'][r], 99) for r in R]
        b50 = [pct(lat['base'][r], 50) / pct(lat['kernel'][r], 50) for r in R]
        print(row("base / kernel p50 ratio", b50, '{:9.2f}'))
        print(row("base / kernel p99 ratio", b99, '{:9.2f}'))
        print("\nA/B: lockfs / base, round by round (median / min / max)")
        print(row("hand-off p50, lockfs / base", [pct(lat['lockfs'][r], 50) / pct(lat['base'][r], 50) for r in R], '{:9.2f}'))
        print(row("hand-off p99, lockfs / base", [pct(lat['lockfs'][r], 99) / pct(lat['base'][r], 99) for r in R], '{:9.2f}'))
    if 'poll' in pooled:
        print(f"  poll p50 / lockfs p50 (pooled): {pct(pooled['poll'], 50) / pct(pooled['lockfs'], 50):.0f}x")

print(f"\nherd: {agents} agents x {per_agent} rounds; first quarter = first {agents * per_agent // 4} grants")
print(f"  {'':30}{'median':>9}{'min':>9}{'max':>9}")
hcfgs = [c for c in cfgs if c in herd]
for c in hcfgs:
    print(row(f"{c} total ms", [herd[c][r][0] for r in R]))
for c in hcfgs:
    zs = [sum(1 for x in herd[c][r][1] if x == 0) for r in R]
    print(f"  {c} first-quarter grants per agent (min/median/max, agents with 0), per round:")
    print("    " + "  ".join(f"{min(herd[c][r][1])}/{med(herd[c][r][1]):g}/{max(herd[c][r][1])},{z}"
                             for r, z in zip(R, zs)))
    print(row(f"{c} agents with 0", zs, '{:9.0f}'))
if 'lockfs' in herd:
    hr = [herd['lockfs'][r][0] / herd['kernel'][r][0] for r in R]
    print(row("herd time lockfs / kernel", hr, '{:9.2f}'))
    zmax = max(sum(1 for x in herd['lockfs'][r][1] if x == 0) for r in R)
    goals.append(("herd within 15x kernel flock's time", f"{med(hr):.2f}x (rounds {min(hr):.2f}-{max(hr):.2f})", med(hr) <= 15))
    goals.append(("herd: every agent served in the first quarter", f"most agents with 0 in any round: {zmax}", zmax == 0))

if goals:
    print("\ngoals (issue 4)")
    for g, m, ok in goals:
        print(f"  {g}: {m} -> {'met' if ok else 'NOT met'}")
EOF
