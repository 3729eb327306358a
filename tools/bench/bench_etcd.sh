#!/bin/bash
# tools/bench/bench_etcd.sh: the issue-11 benchmark (the etcd backend), as root.
#
#   tools/bench/bench_etcd.sh [--rounds N] [--pairs N] [--samples N] [--members N]
#                             [--base BASE_BUILD_DIR] [--smoke] [BUILD_DIR]
#
# Starts its own etcd on free 127.0.0.1 ports (tests/fixtures/etcd_fixtures.py
# exec; --members, default 1), two lockfs daemons on it (hosts h1 and h2, one
# prefix, each with its own mount point) and one on the dir backend, and
# measures, interleaved in one run (the order of a, b, d alternates round by
# round):
#   (a) etcd-mount  mkdir+rmdir through h1's mount (bench_pairs: the mean per
#                   pair over --pairs pairs)
#   (b) etcd-raw    the same two etcd transactions the backend issues (try-lock
#                   txn, guarded delete), from tools/bench/etcd_raw on one reused
#                   connection: "raw" (libcurl, prebuilt bodies) and "client"
#                   (lockfs's etcd client); --pairs pairs each
#   (c) hand-off    across hosts: the holder flocks h1's M/.flock/handoff, the
#                   waiter h2's (parked once h2's M/handoff/waiters lists it);
#                   latency from the holder's LOCK_UN to the waiter's grant
#                   (bench_handoff, --samples per round), against two raw etcd
#                   round trips (the raw pair of (b))
#   (d) dir-mount   mkdir+rmdir through a dir-backend mount (backing dir on a
#                   private tmpfs), for scale
#   (e) etcd-raw-watched  the raw pair of (b) with its keys under h1's and
#                   h2's prefix, so that etcd sends both daemons' watches
#                   its events, as it does for (a): the floor of a namespace
#                   that other hosts watch (not the goal's baseline)
#   (f) etcd-mount-solo  (a) through a third daemon (host s1) alone on a
#                   prefix of its own: no other daemon watches its keys, as
#                   nobody watches (b)'s.  The like-for-like row for the
#                   goal: (a) also pays etcd's fan-out to h2, which is there
#                   only for (c)
#   (g) etcd-raw-paced  a diagnostic, never the floor: (b)'s clients
#                   pausing after each transaction for as long as (f)'s
#                   daemon takes between its two (half of (f) - (b) in
#                   that round), the pauses left out of the figure (pair
#                   p50).  What etcd's answer and CPU per pair become when
#                   its client thinks between calls, as any daemon does:
#                   run last in each round
#   (h) etcd-raw-floor  what a FUSE daemon that did no work of its own
#                   would cost, to judge the goal by: (b)'s raw transactions
#                   with (f)'s daemon watching their keys (its watch is
#                   part of any such daemon) and the client busy after each
#                   transaction for two FUSE round trips, the least an op
#                   costs between etcd's calls (LOOKUP + MKDIR or RMDIR);
#                   a round trip is the mean negative lookup through (f)'s
#                   mount ("lookups", answered from the daemon's mirror).
#                   The floor of a pair through any such mount is this
#                   pair's p50 plus its four round trips: printed against
#                   (b)'s p50.  Run last in each round
# --base BASE_BUILD_DIR: A/B.  Two more daemons (hosts h1 and h2 of BASE's
# lockfs, on a prefix of their own, the same etcd) and (a) and (c) through
# them too ("etcd-mount-base", "base hand-off"), and a third (host s2) for
# (f) ("etcd-mount-solo-base"), interleaved in the same rounds; the clients
# are this build's.  Ratios this/base are per round.
# Beside the wall-clock figures, the CPU time per pair that etcd (a local
# member found by its client port) and the two daemons of (a) spent in each
# of (a), (b raw: etcd only), (e) and the base's (a): on a shared 2-CPU
# machine these are steadier than the wall clock, and a pair through the
# mount waits for all of it.
# Ratios are taken round by round, then their median; the goal of issue 11 is
# (f) / (b raw) <= 1.2 (and (a) / (b raw) is printed beside it).  The load average is printed at the start and the end
# (figures taken on a loaded machine are noisy).
#
# --pin: etcd on CPU 1 alone, everything else (daemons, clients) on CPU 0
# (taskset; needs 2 CPUs and one member).  On a 2-CPU machine etcd, the
# daemons and the clients otherwise compete for the same CPUs, so that
# every microsecond of a daemon's CPU also delays etcd's answers: pinned,
# etcd stands apart as it would on a host of its own, and (f) / (b) shows
# what the daemon adds to the store's round trips.
#
# --smoke: one round of 50 pairs and 10 hand-offs, to show that the benchmark
# still runs (CI; no goal asserted, the figures mean little).  Exit status 77
# (skipped) when etcd is not installed or lockfs was built without etcd.
#
# Binaries: BUILD_DIR/lockfs, BUILD_DIR/tools/bench/{bench_pairs,bench_handoff,
# etcd_raw} (default BUILD_DIR ./build).  Everything it mounts or starts is
# undone on exit, also on error or Ctrl-C.

set -euo pipefail

# usage, die, is_mounted, stop_daemon, the work dir and the traps
. "$(dirname "$(readlink -f "$0")")/bench_helpers.sh"

ROUNDS=7
PAIRS=500
SAMPLES=200
MEMBERS=1
SETTLE=1000
SMOKE=0
PIN=0
BUILD=./build
BASE=""
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
FIXTURES=$HERE/../../tests/fixtures/etcd_fixtures.py

ARGS=("$@")
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=${2:?}; shift 2 ;;
	--pairs) PAIRS=${2:?}; shift 2 ;;
	--samples) SAMPLES=${2:?}; shift 2 ;;
	--members) MEMBERS=${2:?}; shift 2 ;;
	--pin) PIN=1; shift ;;
	--base) BASE=${2:?}; shift 2 ;;
	--smoke) ROUNDS=1; PAIRS=50; SAMPLES=10; SMOKE=1; shift ;;
	-h|--help) usage ;;
	-*) echo "bench_etcd.sh: unknown option $1" >&2; usage ;;
	*) BUILD=$1; shift ;;
	esac
done

skip() { echo "SKIP: bench_etcd.sh: $*"; exit 77; }

[ "$(id -u)" = 0 ] || die "must run as root (it mounts a tmpfs and lockfs)"
for v in ROUNDS PAIRS SAMPLES MEMBERS; do
	[[ ${!v} =~ ^[0-9]+$ ]] && [ "${!v}" -ge 1 ] || die "--${v,,} must be a positive integer"
done
[ "$ROUNDS" -ge 5 ] || [ "$SMOKE" = 1 ] || echo "bench_etcd.sh: warning: fewer than 5 rounds; medians are shaky" >&2

LOCKFS=$BUILD/lockfs
PAIRS_BIN=$BUILD/tools/bench/bench_pairs
HANDOFF_BIN=$BUILD/tools/bench/bench_handoff
RAW_BIN=$BUILD/tools/bench/etcd_raw
for b in "$LOCKFS" "$PAIRS_BIN" "$HANDOFF_BIN"; do
	[ -x "$b" ] || die "$b not found: build first (meson setup build && meson compile -C build)"
done
[ -z "$BASE" ] || [ -x "$BASE/lockfs" ] || die "$BASE/lockfs not found: build the base first"
[ -x "$RAW_BIN" ] || skip "$RAW_BIN not built (lockfs built without libcurl: -Detcd=disabled)"
[ -x "$PY" ] || die "$PY not found"
command -v fusermount3 >/dev/null || die "fusermount3 not found"

if [ "$PIN" = 1 ]; then
	command -v taskset >/dev/null || die "--pin needs taskset (util-linux)"
	[ "$(nproc --all)" -ge 2 ] || die "--pin needs 2 CPUs"
	[ "$MEMBERS" = 1 ] || die "--pin takes one etcd member"
fi
PIN_CPU0=()
[ "$PIN" = 0 ] || PIN_CPU0=(taskset -c 0)

# Outside the fixtures: start etcd and run this script again inside (with
# --pin, all of it on CPU 0 at first; etcd moves to CPU 1 below).
if [ -z "${LOCKFS_ETCD_ENDPOINTS:-}" ]; then
	rc=0
	"${PIN_CPU0[@]}" "$PY" "$FIXTURES" exec --members "$MEMBERS" -- "$0" "${ARGS[@]}" || rc=$?
	exit "$rc"
fi

# ---------------------------------------------------------------- cleanup ---
W=""             # work dir under /var/tmp
T=""             # private tmpfs for the dir backend's backing dir
MOUNTS=()        # lockfs mount points we mounted
PIDS=()          # their daemons
CLIENT_PID=""    # a benchmark client in progress

cleanup() {
	local rc=$? m p
	trap - EXIT INT TERM
	set +e
	if [ -n "$CLIENT_PID" ] && kill -0 "$CLIENT_PID" 2>/dev/null; then
		kill -KILL "$CLIENT_PID"
		wait "$CLIENT_PID" 2>/dev/null
	fi
	for m in "${MOUNTS[@]}"; do unmount_fuse "$m"; done
	for p in "${PIDS[@]}"; do stop_daemon "$p"; done
	bench_workdir_remove "${MOUNTS[@]}"
	exit "$rc"
}
bench_traps

# ------------------------------------------------------------------ setup ---
bench_workdir lockfs-etcd-bench 64m
PREFIX=/bench-$$-$RANDOM/

mount_one() { # NAME OPTIONS...: mount lockfs on $W/NAME with -o OPTIONS; echoes nothing
	local name=$1 m=$W/$1 b=$W/$1.backing i bin=$LOCKFS
	shift
	case "$name" in base-*) bin=$BASE/lockfs ;; esac
	mkdir "$m"
	case "$name" in dir) b=$T/backing ;; esac
	mkdir -m 0700 "$b"
	local opts=(-o "backing=$b")
	for o in "$@"; do opts+=(-o "$o"); done
	"$bin" -f "${opts[@]}" "$m" 2>"$W/$name.err" &
	PIDS+=($!)
	MOUNTS+=("$m")
	for i in $(seq 100); do
		is_mounted "$m" && return 0
		if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then
			if grep -q "etcd support not built\|unknown (built" "$W/$name.err"; then
				skip "this lockfs has no etcd backend: $(head -n 1 "$W/$name.err")"
			fi
			die "lockfs ($name) died before mounting: $(head -n 3 "$W/$name.err")"
		fi
		sleep 0.1
	done
	die "lockfs ($name) did not mount $m within 10 s"
}

# ttl 10: a loaded machine must not lose a session during the run
for h in h1 h2; do
	mount_one "$h" backend=etcd "etcd=$LOCKFS_ETCD_ENDPOINTS" "host=$h" "prefix=$PREFIX" ttl=10
done
mount_one dir
M1=$W/h1 M2=$W/h2 MD=$W/dir
mount_one solo backend=etcd "etcd=$LOCKFS_ETCD_ENDPOINTS" host=s1 "prefix=${PREFIX%/}-solo/" ttl=10
SOLO_PID=${PIDS[-1]} MS=$W/solo
if [ -n "$BASE" ]; then
	for h in h1 h2; do
		mount_one "base-$h" backend=etcd "etcd=$LOCKFS_ETCD_ENDPOINTS" "host=$h" \
			"prefix=${PREFIX%/}-base/" ttl=10
	done
fi
MB1=$W/base-h1 MB2=$W/base-h2
if [ -n "$BASE" ]; then
	mount_one base-solo backend=etcd "etcd=$LOCKFS_ETCD_ENDPOINTS" host=s2 \
		"prefix=${PREFIX%/}-solo-base/" ttl=10
	SOLO_BASE_PID=${PIDS[-1]}
fi
MSB=$W/base-solo

RES=$W/results.tsv
: > "$RES"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

run() { # OUTFILE CMD...: run a client in the background, wait for it
	local out=$1 rc=0
	shift
	"$@" > "$out" &
	CLIENT_PID=$!
	wait "$CLIENT_PID" || rc=$?
	CLIENT_PID=""
	if [ "$rc" != 0 ]; then
		for h in h1 h2; do
			echo "bench_etcd.sh: lockfs $h stderr:" >&2; tail -n 5 "$W/$h.err" >&2
			echo "bench_etcd.sh: lockfs $h lock.log:" >&2; tail -n 5 "$W/$h.backing/lock.log" >&2
		done
		die "$* failed (status $rc)"
	fi
}

# CPU accounting: clock ticks (utime+stime) of etcd and the daemons.
ETCD_PID=$(ss -ltnpH "sport = :${LOCKFS_ETCD_URL##*:}" 2>/dev/null |
	grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2 || true)
if [ "$PIN" = 1 ]; then
	[ -n "$ETCD_PID" ] || die "--pin: etcd's pid not found"
	taskset -a -c -p 1 "$ETCD_PID" >/dev/null || die "--pin: cannot move etcd to CPU 1"
fi
TICK_US=$((1000000 / $(getconf CLK_TCK)))
ticks() { # PID: its utime+stime, 0 when unknown
	[ -n "$1" ] && [ -r "/proc/$1/stat" ] || { echo 0; return; }
	sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}
cpu_snap() { # DAEMON_PIDS...: "etcd daemons" ticks now
	local d=0 p
	for p in "$@"; do d=$((d + $(ticks "$p"))); done
	echo "$(ticks "$ETCD_PID") $d"
}
cpu_row() { # CONFIG ROUND N "BEFORE" "AFTER": the µs of CPU per pair
	local a=($4) b=($5)
	printf 'cpu\t%s\t%s\t%s %s\n' "$1" "$2" \
		"$(( (b[0] - a[0]) * TICK_US / $3 ))" "$(( (b[1] - a[1]) * TICK_US / $3 ))" >> "$RES"
}

run_config() { # CONFIG ROUND
	local out=$W/out c0 h=("${PIDS[0]}" "${PIDS[1]}")
	[ "$1" = etcd-mount-base ] && h=("${PIDS[4]}" "${PIDS[5]}")
	[ "$1" = etcd-mount-solo ] && h=("$SOLO_PID")
	[ "$1" = etcd-raw-floor ] && h=("$SOLO_PID")
	[ "$1" = etcd-mount-solo-base ] && h=("$SOLO_BASE_PID")
	c0=$(cpu_snap "${h[@]}")
	case "$1" in
	etcd-mount)
		run "$out" "$PAIRS_BIN" pairs "$M1" "$PAIRS"
		printf 'pair\tetcd-mount\t%s\t%s\n' "$2" "$(cat "$out")" >> "$RES" ;;
	dir-mount)
		run "$out" "$PAIRS_BIN" pairs "$MD" "$PAIRS"
		printf 'pair\tdir-mount\t%s\t%s\n' "$2" "$(cat "$out")" >> "$RES" ;;
	etcd-mount-base)
		run "$out" "$PAIRS_BIN" pairs "$MB1" "$PAIRS"
		printf 'pair\tetcd-mount-base\t%s\t%s\n' "$2" "$(cat "$out")" >> "$RES" ;;
	etcd-mount-solo)
		run "$out" "$PAIRS_BIN" pairs "$MS" "$PAIRS"
		printf 'pair\tetcd-mount-solo\t%s\t%s\n' "$2" "$(cat "$out")" >> "$RES" ;;
	solo-lookups)
		run "$out" "$PAIRS_BIN" lookups "$MS" "$PAIRS"
		printf 'lookup\tetcd-mount-solo\t%s\t%s\n' "$2" "$(cat "$out")" >> "$RES" ;;
	etcd-mount-solo-base)
		run "$out" "$PAIRS_BIN" pairs "$MSB" "$PAIRS"
		printf 'pair\tetcd-mount-solo-base\t%s\t%s\n' "$2" "$(cat "$out")" >> "$RES" ;;
	etcd-raw)
		run "$out" "$RAW_BIN" --rounds 1 --pairs "$PAIRS" "${LOCKFS_ETCD_URL}"
		# "raw acquire p50 A p99 B | release p50 C p99 D | pair p50 E p99 F us | R pairs/s"
		awk -v r="$2" '$1 == "raw" || $1 == "client" {
			print "pair\tetcd-" $1 "\t" r "\t" 1e6 / $(NF - 1)
			print "rawp50\tetcd-" $1 "\t" r "\t" $16 }' "$out" >> "$RES" ;;
	etcd-raw-paced)
		local gap
		gap=$(awk -v r="$2" '$1 == "pair" && $3 == r { v[$2] = $4 }
			END { g = (v["etcd-mount-solo"] - v["etcd-raw"]) / 2; printf "%d", (g > 0 ? g : 0) }' "$RES")
		run "$out" "$RAW_BIN" --rounds 1 --pairs "$PAIRS" --gap-us "$gap" "${LOCKFS_ETCD_URL}"
		awk -v r="$2" -v g="$gap" '$1 == "raw" {
			print "rawp50\tetcd-raw-paced\t" r "\t" $16
			print "gap\tetcd-raw-paced\t" r "\t" g }' "$out" >> "$RES" ;;
	etcd-raw-floor)
		local gap
		gap=$(awk -v r="$2" '$1 == "lookup" && $3 == r { printf "%d", 2 * $4 + 0.5 }' "$RES")
		run "$out" "$RAW_BIN" --rounds 1 --pairs "$PAIRS" --gap-us "$gap" --spin \
			--prefix "${PREFIX%/}-solo/" "${LOCKFS_ETCD_URL}"
		awk -v r="$2" '$1 == "raw" { print "rawp50\tetcd-raw-floor\t" r "\t" $16 }' "$out" >> "$RES" ;;
	etcd-raw-watched)
		run "$out" "$RAW_BIN" --rounds 1 --pairs "$PAIRS" --prefix "$PREFIX" "${LOCKFS_ETCD_URL}"
		awk -v r="$2" '$1 == "raw" {
			print "pair\tetcd-raw-watched\t" r "\t" 1e6 / $(NF - 1) }' "$out" >> "$RES" ;;
	esac
	# etcd_raw runs two clients (raw, client) with a warm-up each
	case "$1" in
	etcd-raw*) cpu_row "$1" "$2" $((2 * (PAIRS + 20))) "$c0" "$(cpu_snap "${h[@]}")" ;;
	etcd-mount*) cpu_row "$1" "$2" "$PAIRS" "$c0" "$(cpu_snap "${h[@]}")" ;;
	esac
}

run_handoff() { # ROUND [base]
	local out=$W/out a=$M1 b=$M2 kind=handoff
	[ "${2:-}" = base ] && { a=$MB1; b=$MB2; kind=handoff-base; }
	LOCKFS_BENCH_TIMEOUT=60 run "$out" "$HANDOFF_BIN" handoff "$SAMPLES" "$SETTLE" \
		"$a/.flock/handoff=$b/.flock/handoff" "$b/handoff/waiters"
	awk -v r="$1" -v k="$kind" '{ print k "\tcross-host\t" r "\t" $1 }' "$out" >> "$RES"
}

CONFIGS=(etcd-mount etcd-mount-solo etcd-raw etcd-raw-watched dir-mount)
[ -z "$BASE" ] || CONFIGS=(etcd-mount etcd-mount-solo etcd-mount-base etcd-mount-solo-base etcd-raw
	etcd-raw-watched dir-mount)
COMMIT=$(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "bench_etcd.sh: $ROUNDS rounds, $PAIRS pairs and $SAMPLES hand-offs per round," \
	"etcd $MEMBERS member(s) at $LOCKFS_ETCD_ENDPOINTS; $(nproc --all) CPUs, load $LOAD0, commit $COMMIT" >&2
[ "$PIN" = 0 ] || echo "bench_etcd.sh: pinned: etcd (pid $ETCD_PID) on CPU 1, daemons and clients on CPU 0" >&2
for ((r = 1; r <= ROUNDS; r++)); do
	echo "bench_etcd.sh: round $r/$ROUNDS" >&2
	if (( r % 2 )); then order=("${CONFIGS[@]}")
	else order=(); for ((i = ${#CONFIGS[@]} - 1; i >= 0; i--)); do order+=("${CONFIGS[i]}"); done
	fi
	for c in "${order[@]}"; do run_config "$c" "$r"; done
	run_config etcd-raw-paced "$r"
	run_config solo-lookups "$r"
	run_config etcd-raw-floor "$r"
	if [ -n "$BASE" ] && (( r % 2 == 0 )); then run_handoff "$r" base; fi
	run_handoff "$r"
	if [ -n "$BASE" ] && (( r % 2 )); then run_handoff "$r" base; fi
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
LEFT=("$M1" "$M2" "$MD" "$MS")
[ -z "$BASE" ] || LEFT+=("$MB1" "$MB2" "$MSB")
for m in "${LEFT[@]}"; do
	left=$(find "$m" -mindepth 1 -maxdepth 1 ! -name '.*' -printf '%f ')
	[ -z "$left" ] || die "locks left behind in $m: $left"
done

"$PY" - "$RES" "$ROUNDS" "$PAIRS" "$SAMPLES" "$LOAD0" "$LOAD1" "$MEMBERS" "$BASE" "$PIN" <<'EOF'
import sys, math, statistics as st, collections
res, rounds, pairs, samples = sys.argv[1], *map(int, sys.argv[2:5])
load0, load1, members, base = sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8]
pinned = sys.argv[9] == '1'
pair = collections.defaultdict(dict)      # config -> round -> µs per pair (mean)
rawp50 = collections.defaultdict(dict)    # config -> round -> pair p50 µs
lookup = {}                               # round -> µs per negative lookup on (f)
cpu = collections.defaultdict(dict)       # config -> round -> (etcd, daemons) µs per pair
gap = {}                                  # round -> etcd-raw-paced's pause, µs
ho = collections.defaultdict(list)        # round -> [µs]
hob = collections.defaultdict(list)       # round -> [µs], base's
for line in open(res):
    kind, cfg, r, v = line.rstrip('\n').split('\t')
    if kind == 'cpu':
        cpu[cfg][int(r)] = tuple(map(float, v.split()))
        continue
    r, v = int(r), float(v)
    if kind == 'pair':
        pair[cfg][r] = v
    elif kind == 'rawp50':
        rawp50[cfg][r] = v
    elif kind == 'gap':
        gap[r] = v
    elif kind == 'lookup':
        lookup[r] = v
    elif kind == 'cpu':
        pass
    elif kind == 'handoff-base':
        hob[r].append(v)
    else:
        ho[r].append(v)
R = range(1, rounds + 1)
med = st.median

def pct(xs, q):  # nearest rank
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]

def row(label, v, fmt='{:9.0f}'):
    each = fmt.replace('{:9', '{:')
    return f"  {label:34}" + "".join(fmt.format(x) for x in (med(v), min(v), max(v))) + \
        "   " + " ".join(each.format(x) for x in v)

print(f"\nissue-11 benchmark: {rounds} rounds interleaved, {pairs} pairs and {samples} "
      f"cross-host hand-offs per round; etcd {members} member(s); load {load0} -> {load1}")
if pinned:
    print("pinned (--pin): etcd on CPU 1 alone, the daemons and the clients on CPU 0")
print("\nmkdir+rmdir pair, µs (mean per pair in a round; median / min / max over rounds, then each round)")
print(f"  {'':34}{'median':>9}{'min':>9}{'max':>9}")
for c in ('etcd-mount', 'etcd-mount-solo', 'etcd-mount-base', 'etcd-mount-solo-base', 'etcd-raw',
          'etcd-client', 'etcd-raw-watched', 'dir-mount'):
    if c in pair:
        print(row(c, [pair[c][r] for r in R]))
if cpu:
    print("\nCPU per pair, µs (etcd; the two daemons of that prefix), per round")
    for c in ('etcd-mount', 'etcd-mount-solo', 'etcd-mount-base', 'etcd-mount-solo-base', 'etcd-raw',
              'etcd-raw-watched', 'etcd-raw-paced', 'etcd-raw-floor'):
        if c in cpu:
            print(row(c + " etcd", [cpu[c][r][0] for r in R]))
            if c not in ('etcd-raw', 'etcd-raw-paced', 'etcd-raw-floor'):
                print(row(c + " daemons", [cpu[c][r][1] for r in R]))
    if 'etcd-mount-base' in cpu:
        tot = lambda c, r: cpu[c][r][0] + cpu[c][r][1]
        print(row("total CPU, etcd-mount / base", [tot('etcd-mount', r) / tot('etcd-mount-base', r)
                                                   for r in R], '{:9.2f}'))
print("\ndiagnostic: the raw pair with its client pausing between transactions (pair p50, µs,"
      " pauses left out)")
print(row("etcd-raw pair p50", [rawp50['etcd-raw'][r] for r in R]))
print(row("etcd-raw-paced pair p50", [rawp50['etcd-raw-paced'][r] for r in R]))
print(row("pause after each txn", [gap[r] for r in R]))
print(row("etcd-raw-paced / etcd-raw (p50)", [rawp50['etcd-raw-paced'][r] / rawp50['etcd-raw'][r]
                                               for r in R], '{:9.2f}'))
print("\nthe floor of a daemon doing no work of its own (raw txns, (f)'s daemon watching, the client"
      " busy two FUSE round trips after each txn), µs")
print(row("FUSE round trip (lookup on (f))", [lookup[r] for r in R]))
print(row("etcd-raw-floor pair p50", [rawp50['etcd-raw-floor'][r] for r in R]))
floor = [(rawp50['etcd-raw-floor'][r] + 4 * lookup[r]) / rawp50['etcd-raw'][r] for r in R]
print(row("(floor p50 + 4 round trips) / raw p50", floor, '{:9.2f}'))
print("\ncross-host hand-off (h1 releases -> h2's waiter granted), µs, per round")
for q in (50, 99):
    print(row(f"hand-off p{q}", [pct(ho[r], q) for r in R]))
    if base:
        print(row(f"base hand-off p{q}", [pct(hob[r], q) for r in R]))
print(row("two raw round trips (raw pair p50)", [rawp50['etcd-raw'][r] for r in R]))
print("\nratios, round by round (median / min / max)")
ra = [pair['etcd-mount'][r] / pair['etcd-raw'][r] for r in R]
rc = [pair['etcd-client'][r] / pair['etcd-raw'][r] for r in R]
rh = [pct(ho[r], 50) / rawp50['etcd-raw'][r] for r in R]
rd = [pair['etcd-mount'][r] / pair['dir-mount'][r] for r in R]
rs = [pair['etcd-mount-solo'][r] / pair['etcd-raw'][r] for r in R]
print(row("etcd-mount-solo / etcd-raw", rs, '{:9.2f}'))
print(row("etcd-mount / etcd-raw", ra, '{:9.2f}'))
if base:
    rb = [pair['etcd-mount-base'][r] / pair['etcd-raw'][r] for r in R]
    print(row("etcd-mount-base / etcd-raw", rb, '{:9.2f}'))
    print(row("etcd-mount / etcd-mount-base", [pair['etcd-mount'][r] / pair['etcd-mount-base'][r]
                                               for r in R], '{:9.2f}'))
    print(row("etcd-mount-solo-base / etcd-raw", [pair['etcd-mount-solo-base'][r] / pair['etcd-raw'][r]
                                                  for r in R], '{:9.2f}'))
    print(row("etcd-mount-solo / solo-base", [pair['etcd-mount-solo'][r] /
                                              pair['etcd-mount-solo-base'][r] for r in R], '{:9.2f}'))
    tot = lambda c, r: cpu[c][r][1]
    print(row("daemon CPU, solo / solo-base", [tot('etcd-mount-solo', r) / tot('etcd-mount-solo-base', r)
                                               for r in R], '{:9.2f}'))
print(row("etcd-mount / etcd-raw-watched",
          [pair['etcd-mount'][r] / pair['etcd-raw-watched'][r] for r in R], '{:9.2f}'))
print(row("etcd-raw-watched / etcd-raw",
          [pair['etcd-raw-watched'][r] / pair['etcd-raw'][r] for r in R], '{:9.2f}'))
print(row("etcd-client / etcd-raw", rc, '{:9.2f}'))
print(row("hand-off p50 / raw pair p50", rh, '{:9.2f}'))
if base:
    print(row("hand-off p50 / base hand-off p50",
              [pct(ho[r], 50) / pct(hob[r], 50) for r in R], '{:9.2f}'))
    print(row("hand-off p99 / base hand-off p99",
              [pct(ho[r], 99) / pct(hob[r], 99) for r in R], '{:9.2f}'))
print(row("etcd-mount / dir-mount", rd, '{:9.1f}'))
allho = [x for r in R for x in ho[r]]
print(f"\npooled hand-offs: n {len(allho)}, p50 {pct(allho, 50):.0f} µs, p99 {pct(allho, 99):.0f} µs")
print("\ngoal (issue 11)")
print(f"  a pair through the mount <= 1.2x the raw pair (solo: no other daemon watching): "
      f"{med(rs):.2f}x (rounds {min(rs):.2f}-{max(rs):.2f}) -> {'met' if med(rs) <= 1.2 else 'NOT met'}")
print(f"  the floor of any FUSE daemon with its own watch, doing no work (h): "
      f"{med(floor):.2f}x (rounds {min(floor):.2f}-{max(floor):.2f})")
print(f"  the same through h1 while h2 watches the prefix (for the hand-off rows): "
      f"{med(ra):.2f}x (rounds {min(ra):.2f}-{max(ra):.2f})")
EOF
