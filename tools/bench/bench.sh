#!/bin/bash
# tools/bench/bench.sh: the lockfs benchmark (issue 2), as root.
#
#   sudo tools/bench/bench.sh [--rounds N] [--pairs N] [--seconds S] [--clients "1 2 8"] [--where]
#                             [--nice N] [--smoke] [BUILD_DIR]
#
# Measures, interleaved in one run (round 1: A B C D E, round 2: E D C B A, ...):
#   lockfs-tmpfs   mkdir+rmdir through a lockfs mount, backing dir on a private tmpfs
#   lockfs-rootfs  the same with the backing dir under /var/tmp (the root filesystem)
#   minfs          the same through tools/bench/minfs.c, the in-memory FUSE floor
#   tmpfs-direct   mkdir+rmdir directly in a tmpfs directory (no FUSE)
#   flock          flock(LOCK_EX)+flock(LOCK_UN) on a tmpfs file
# then aggregate pairs/s with 1, 2 and 8 clients on distinct names for lockfs-tmpfs
# and minfs (again alternating which goes first).
#
# --nice N adds lockfs-nice to the rate runs: a third daemon like lockfs-tmpfs
# (its own backing dir on the same tmpfs) started under `nice -n N`, to show
# what the daemon's scheduling priority does to the rates (issue 10).  Every pair figure is the mean
# over --pairs pairs of one bench_pairs run; the table shows medians over rounds,
# and ratios are taken round by round (pair by pair) before their median.
#
# --smoke: one round of 200 pairs and 1 s rates with 1 and 8 clients, to show
# that the benchmark still runs (CI; no goal asserted, the figures mean little).
#
# --where runs the "where the time goes" probes instead: FUSE opcodes per pair
# (daemons with -d), daemon and client CPU per pair, the same with 1 client
# against 8 (and the daemon's futex/epoll_ctl/getrandom/write calls per pair), the daemon's per-pair work
# replayed without FUSE (bench_pairs backing|proc|log), a perf profile of the
# lockfs daemon (when perf is installed) and its syscalls per pair (strace).
#
# Binaries: BUILD_DIR/lockfs, BUILD_DIR/tools/bench/minfs, BUILD_DIR/tools/bench/bench_pairs
# (default BUILD_DIR ./build).  Everything it mounts or starts is undone on exit,
# also on error or Ctrl-C.

set -euo pipefail

# usage, die, is_mounted, stop_daemon, the work dir and the traps
. "$(dirname "$(readlink -f "$0")")/bench_helpers.sh"

ROUNDS=7
PAIRS=2000
SECONDS_RATE=2
CLIENTS="1 2 8"
NICE=""
WHERE=0
SMOKE=0
BUILD=./build
PY=/usr/bin/python3

while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=${2:?}; shift 2 ;;
	--rounds=*) ROUNDS=${1#*=}; shift ;;
	--pairs) PAIRS=${2:?}; shift 2 ;;
	--pairs=*) PAIRS=${1#*=}; shift ;;
	--seconds) SECONDS_RATE=${2:?}; shift 2 ;;
	--seconds=*) SECONDS_RATE=${1#*=}; shift ;;
	--clients) CLIENTS=${2:?}; shift 2 ;;
	--nice) NICE=${2:?}; shift 2 ;;
	--where) WHERE=1; shift ;;
	--smoke) ROUNDS=1; PAIRS=200; SECONDS_RATE=1; CLIENTS="1 8"; SMOKE=1; shift ;;
	-h|--help) usage ;;
	-*) echo "bench.sh: unknown option $1" >&2; usage ;;
	*) BUILD=$1; shift ;;
	esac
done

[ "$(id -u)" = 0 ] || die "must run as root (it mounts a tmpfs and FUSE filesystems)"
[[ $ROUNDS =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] || die "--rounds must be a positive integer"
[[ $PAIRS =~ ^[0-9]+$ ]] && [ "$PAIRS" -ge 1 ] || die "--pairs must be a positive integer"
[ "$ROUNDS" -ge 5 ] || [ "$SMOKE" = 1 ] || echo "bench.sh: warning: fewer than 5 rounds; medians are shaky" >&2

LOCKFS=$BUILD/lockfs
MINFS=$BUILD/tools/bench/minfs
CLIENT=$BUILD/tools/bench/bench_pairs
for b in "$LOCKFS" "$MINFS" "$CLIENT"; do
	[ -x "$b" ] || die "$b not found: build first (meson setup build && meson compile -C build)"
done
[ -x "$PY" ] || die "$PY not found"
command -v fusermount3 >/dev/null || die "fusermount3 not found"

# ---------------------------------------------------------------- cleanup ---
W=""             # work dir under /var/tmp (root filesystem)
T=""             # our private tmpfs, $W/tmpfs
MOUNTS=()        # everything we mounted, in mount order
PIDS=()          # every daemon we started

unmount_one() { # MOUNTPOINT
	local m=$1
	is_mounted "$m" || return 0
	case "$(awk -v m="$m" '$2 == m { t = $3 } END { print t }' /proc/mounts)" in
	fuse*) fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true ;;
	*) umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true ;;
	esac
}

cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	set +e
	# FUSE mounts first, then their daemons (which hold files in the
	# backing dirs), then the tmpfs.
	for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
		[ "${MOUNTS[i]}" = "$T" ] || unmount_one "${MOUNTS[i]}"
	done
	for pid in "${PIDS[@]}"; do stop_daemon "$pid"; done
	[ -z "$T" ] || unmount_one "$T"
	bench_workdir_remove "${MOUNTS[@]}"
	exit "$rc"
}
bench_traps

# ------------------------------------------------------------------ setup ---
bench_workdir lockfs-bench 256m
MOUNTS+=("$T")
mkdir -m 0700 "$T/backing" "$T/backing-nice" "$T/direct"
: > "$T/flock"
mkdir -m 0700 "$W/backing-root"
[ "$(stat -f -c %T "$W/backing-root")" != tmpfs ] || die "/var/tmp is a tmpfs here; no root-fs backing available"
M_LT=$W/m-lockfs-tmpfs
M_LR=$W/m-lockfs-rootfs
M_MIN=$W/m-minfs
M_LN=$W/m-lockfs-nice
mkdir "$M_LT" "$M_LR" "$M_MIN" "$M_LN"

DAEMON_PID=""
start_daemon() { # LOGFILE MOUNTPOINT CMD...: start CMD in the foreground, wait for the mount
	local log=$1 m=$2 i
	shift 2
	"$@" 2>"$log" &
	DAEMON_PID=$!
	PIDS+=("$DAEMON_PID")
	MOUNTS+=("$m")
	for i in $(seq 100); do
		is_mounted "$m" && return 0
		kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$log" >&2; die "daemon '$*' died before mounting"; }
		sleep 0.1
	done
	die "daemon '$*' did not mount $m within 10 s"
}

stop_mount() { # MOUNTPOINT PID: unmount and reap one daemon now
	unmount_one "$1"
	stop_daemon "$2"
	local p keep=()
	for p in "${PIDS[@]}"; do [ "$p" = "$2" ] || keep+=("$p"); done
	PIDS=("${keep[@]}")
}

trim_logs() { # keep the audit logs from filling the tmpfs / disk
	local f
	for f in "$T/backing/lock.log" "$T/backing-nice/lock.log" "$W/backing-root/lock.log"; do
		[ -f "$f" ] && : > "$f"
	done
	return 0
}

sanity() { # MOUNTPOINT: one pair must work and leave nothing behind
	"$CLIENT" pairs "$1" 1 >/dev/null || die "mkdir+rmdir does not work on $1"
	# Every entry the daemon itself shows in the root (.flock, .log, ...)
	# starts with a dot; a lock left behind does not.
	[ -z "$(find "$1" -mindepth 1 -maxdepth 1 ! -name '.*' -print -quit)" ] || die "$1 is not empty after a pair"
}

# ------------------------------------------------------------ --where mode ---
if [ "$WHERE" = 1 ]; then
	command -v strace >/dev/null || die "--where needs strace (apt-get install strace)"
	N=100
	echo "== FUSE requests per pair ($N timed + $(( N / 10 )) warm-up pairs, daemons with -d)"
	for kind in lockfs minfs; do
		if [ $kind = lockfs ]; then
			start_daemon "$W/$kind.dbg" "$M_LT" "$LOCKFS" -d -o backing="$T/backing" "$M_LT"
			m=$M_LT
		else
			start_daemon "$W/$kind.dbg" "$M_MIN" "$MINFS" -d "$M_MIN"
			m=$M_MIN
		fi
		pid=$DAEMON_PID
		sleep 0.3
		before=$(grep -c 'opcode:' "$W/$kind.dbg" || true)
		"$CLIENT" pairs "$m" "$N" >/dev/null
		sleep 0.3
		tail -n +1 "$W/$kind.dbg" | grep -o 'opcode: [A-Z_]*' | tail -n +"$(( before + 1 ))" |
			awk -v n=$(( N + N / 10 )) -v k=$kind '{ c[$2]++; t++ }
				END { printf "%-7s", k; for (o in c) printf "  %s %.2f", o, c[o] / n;
				      printf "  (total %.2f requests/pair)\n", t / n }'
		stop_mount "$m" "$pid"
	done

	echo
	NC=5000
	TCK=$(getconf CLK_TCK)
	echo "== CPU per pair ($NC pairs; daemon utime+stime from /proc/PID/stat, client from getrusage)"
	printf '  %-16s%10s%12s%12s%12s\n' daemon 'wall us' 'daemon us' 'client sys' 'client usr'
	for kind in lockfs-tmpfs lockfs-rootfs minfs; do
		case $kind in
		lockfs-tmpfs) m=$M_LT; start_daemon "$W/$kind.err" "$m" "$LOCKFS" -f -o backing="$T/backing" "$m" ;;
		lockfs-rootfs) m=$M_LR; start_daemon "$W/$kind.err" "$m" "$LOCKFS" -f -o backing="$W/backing-root" "$m" ;;
		minfs) m=$M_MIN; start_daemon "$W/$kind.err" "$m" "$MINFS" -f "$m" ;;
		esac
		pid=$DAEMON_PID
		"$CLIENT" pairs "$m" 1000 >/dev/null
		a=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
		TIMEFORMAT='%U %S'
		{ time "$CLIENT" pairs "$m" "$NC" > "$W/wall" 2>/dev/null; } 2> "$W/times"
		b=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
		n=$(( NC + (NC / 10 > 200 ? 200 : NC / 10) ))
		read -r cu cs < "$W/times"
		awk -v k=$kind -v w="$(cat "$W/wall")" -v d=$(( b - a )) -v t="$TCK" -v n=$n -v cu="$cu" -v cs="$cs" \
			'BEGIN { printf "  %-16s%10.1f%12.1f%12.1f%12.1f\n", k, w, d / t * 1e6 / n, cs * 1e6 / n, cu * 1e6 / n }'
		stop_mount "$m" "$pid"
		trim_logs
	done

	echo
	echo "== the first daemon's per-pair work (commit 55734f6) replayed without FUSE (bench_pairs backing|proc|log; us/pair, median of 5); the current protocol reuses lock directories, see docs/performance.md"
	mkdir -m 0700 "$T/replay" "$W/replay"
	for part in "backing $T/replay" "backing $W/replay" "proc" "log $T/replay" "pairs $T/replay"; do
		set -- $part
		vals=$(for i in 1 2 3 4 5; do "$CLIENT" "$@" 3000; done | sort -g | sed -n 3p)
		case "$part" in
		"backing $T/replay") label="backing protocol, tmpfs" ;;
		"backing $W/replay") label="backing protocol, rootfs" ;;
		proc) label="/proc reads" ;;
		log*) label="2 log lines" ;;
		pairs*) label="(plain mkdir+rmdir, tmpfs)" ;;
		esac
		printf '  %-28s %8.1f\n' "$label" "$vals"
	done

	if command -v perf >/dev/null; then
		echo
		echo "== lockfs daemon CPU by object (perf record, backing dir on tmpfs, 1 client)"
		start_daemon "$W/lockfs.err" "$M_LT" "$LOCKFS" -f -o backing="$T/backing" "$M_LT"
		pid=$DAEMON_PID
		"$CLIENT" pairs "$M_LT" 500 >/dev/null
		perf record -q -g -p "$pid" -o "$W/perf.data" -- sleep 2 >/dev/null 2>&1 &
		ppid=$!
		sleep 0.2
		"$CLIENT" rate "$M_LT" 1 2.5 >/dev/null
		wait "$ppid" || true
		perf report -i "$W/perf.data" --stdio --no-children --sort dso -g none 2>/dev/null |
			awk '/%/ && !/^#/ && n++ < 8 { printf "    %7s  %s\n", $1, $2 }'
		echo "  kernel entry points (share of daemon samples, callees included):"
		perf report -i "$W/perf.data" --stdio --children --sort sym -g none 2>/dev/null |
			grep -E '\] (__x64_sys_[a-z0-9_]+|vfs_fstatat|ksys_write|fuse_dev_do_read|fuse_dev_do_write|seq_read_iter|do_task_stat)$' |
			awk 'n++ < 20 { printf "    %7s  %s\n", $1, $NF }'
		stop_mount "$M_LT" "$pid"
		trim_logs
	fi

	echo
	echo "== 1 client against 8 (issue 10): per pair, daemon CPU (all threads), the clients' CPU, the daemon's context switches; then the daemon's futex, epoll_ctl, getrandom, write calls per pair (strace -f -c)"
	start_daemon "$W/lockfs.err" "$M_LT" "$LOCKFS" -f -o backing="$T/backing" "$M_LT"
	pid=$DAEMON_PID
	"$CLIENT" pairs "$M_LT" 500 >/dev/null
	daemon_cpu() { local t s=0; for t in /proc/"$pid"/task/*/stat; do s=$(( s + $(awk '{ print $14 + $15 }' "$t") )); done; echo "$s"; }
	daemon_cs() { cat /proc/"$pid"/task/*/status | awk '/^voluntary_ctxt/ { v += $2 } /^nonvoluntary_ctxt/ { n += $2 } END { print v, n }'; }
	printf '  %-8s%10s%12s%12s%12s%10s%10s\n' clients 'pairs/s' 'daemon us' 'client sys' 'client usr' 'vol cs' 'invol cs'
	for n in 1 8 1 8; do
		a=$(daemon_cpu); read -r v0 n0 < <(daemon_cs)
		TIMEFORMAT='%U %S'
		{ time "$CLIENT" rate "$M_LT" "$n" "$SECONDS_RATE" > "$W/rate"; } 2> "$W/times"
		b=$(daemon_cpu); read -r v1 n1 < <(daemon_cs)
		read -r cu cs < "$W/times"
		awk -v n="$n" -v r="$(cat "$W/rate")" -v s="$SECONDS_RATE" -v d=$(( b - a )) -v t="$TCK" -v cu="$cu" -v cs="$cs" \
			-v vv=$(( v1 - v0 )) -v nv=$(( n1 - n0 )) \
			'BEGIN { p = r * s; printf "  %-8d%10.0f%12.1f%12.1f%12.1f%10.2f%10.2f\n", n, r, d / t * 1e6 / p, cs * 1e6 / p, cu * 1e6 / p, vv / p, nv / p }'
		trim_logs
	done
	for n in 1 8; do
		strace -qq -f -c -o "$W/strace-n.txt" -p "$pid" &
		spid=$!
		sleep 1
		"$CLIENT" rate "$M_LT" "$n" "$SECONDS_RATE" > "$W/rate"
		kill -INT "$spid"; wait "$spid" || true
		awk -v n="$n" -v p="$(awk -v r="$(cat "$W/rate")" -v s="$SECONDS_RATE" 'BEGIN { print r * s }')" '
			$NF ~ /^(futex|epoll_ctl|getrandom|write|pidfd_open)$/ && $4 ~ /^[0-9]+$/ { c[$NF] = $4 }
			END { printf "  %d client(s), %d pairs (slowed by strace):", n, p;
			      split("futex epoll_ctl getrandom write pidfd_open", k, " ");
			      for (i = 1; i <= 5; i++) printf "  %s %.3f", k[i], c[k[i]] / p; printf " per pair\n" }' "$W/strace-n.txt"
		trim_logs
	done
	stop_mount "$M_LT" "$pid"

	echo
	echo "== lockfs daemon syscalls per pair (strace -f -c, backing dir on tmpfs)"
	trim_logs
	start_daemon "$W/lockfs.err" "$M_LT" "$LOCKFS" -f -o backing="$T/backing" "$M_LT"
	pid=$DAEMON_PID
	sanity "$M_LT"
	NS=2000
	strace -qq -f -c -o "$W/strace-c.txt" -p "$pid" &
	spid=$!
	sleep 1
	"$CLIENT" pairs "$M_LT" "$NS" >/dev/null
	kill -INT "$spid"; wait "$spid" || true
	awk -v n=$(( NS + NS / 10 > NS + 200 ? NS + 200 : NS + NS / 10 )) '
		/^------/ { sep++; next }
		sep == 1 && NF >= 5 { name = $NF; calls = $4; if (calls ~ /^[0-9]+$/ && calls / n >= 0.01)
			printf "  %-16s %7.2f /pair  %s\n", name, calls / n, ($5 ~ /^[0-9]+$/ ? "(" $5 " errors)" : "") }
		' "$W/strace-c.txt"
	echo "  (rows under 0.01/pair left out; raw strace -c output below)"
	cat "$W/strace-c.txt"

	echo
	echo "== lockfs daemon file accesses per pair (strace -f, 50 pairs)"
	NT=50
	strace -f -qq -e trace=%file,%desc -o "$W/strace-t.txt" -p "$pid" &
	spid=$!
	sleep 1
	"$CLIENT" pairs "$M_LT" "$NT" >/dev/null
	kill -INT "$spid"; wait "$spid" || true
	# warm-up = NT/10 = 5 pairs
	"$PY" - "$W/strace-t.txt" $(( NT + NT / 10 )) "$T/backing" <<'EOF'
import re, sys, collections
path, n, backing = sys.argv[1], int(sys.argv[2]), sys.argv[3]
calls = collections.Counter(); paths = collections.Counter()
for line in open(path):
    m = re.match(r'\d+\s+(\w+)\((.*)', line)
    if not m:
        continue
    name, rest = m.groups()
    calls[name] += 1
    p = re.search(r'"([^"]*)"', rest)
    if p and name in ('openat', 'open', 'readlink', 'readlinkat', 'mkdir', 'mkdirat',
                      'renameat2', 'rename', 'unlink', 'unlinkat', 'rmdir', 'newfstatat',
                      'statx', 'stat', 'lstat', 'access', 'faccessat', 'faccessat2'):
        s = p.group(1) or '(fd itself: AT_EMPTY_PATH)'
        s = re.sub(r'/proc/\d+', '/proc/PID', s)
        s = re.sub(r'bench-\d+-x', 'NAME', s)
        s = s.replace(backing, 'DIR')
        s = re.sub(r'\.([A-Za-z_-]+)\.[0-9a-f]{6,}', r'.\1.XXX', s)
        paths[name + ' ' + s] += 1
print("  syscalls/pair:", ", ".join(f"{k} {v / n:.2f}" for k, v in calls.most_common()))
print("  paths/pair:")
for k, v in sorted(paths.items(), key=lambda kv: -kv[1]):
    print(f"    {v / n:6.2f}  {k}")
EOF
	stop_mount "$M_LT" "$pid"
	exit 0
fi

# ------------------------------------------------------------- benchmark ---
start_daemon "$W/lockfs-tmpfs.err" "$M_LT" "$LOCKFS" -f -o backing="$T/backing" "$M_LT"
start_daemon "$W/lockfs-rootfs.err" "$M_LR" "$LOCKFS" -f -o backing="$W/backing-root" "$M_LR"
start_daemon "$W/minfs.err" "$M_MIN" "$MINFS" -f "$M_MIN"
for m in "$M_LT" "$M_LR" "$M_MIN" "$T/direct"; do sanity "$m"; done
if [ -n "$NICE" ]; then
	[[ $NICE =~ ^-?[0-9]+$ ]] || die "--nice must be an integer"
	start_daemon "$W/lockfs-nice.err" "$M_LN" nice -n "$NICE" "$LOCKFS" -f -o backing="$T/backing-nice" "$M_LN"
	sanity "$M_LN"
fi

RES=$W/results.tsv
: > "$RES"

run_pairs() { # CONFIG ROUND
	local v
	case "$1" in
	lockfs-tmpfs) v=$("$CLIENT" pairs "$M_LT" "$PAIRS") ;;
	lockfs-rootfs) v=$("$CLIENT" pairs "$M_LR" "$PAIRS") ;;
	minfs) v=$("$CLIENT" pairs "$M_MIN" "$PAIRS") ;;
	tmpfs-direct) v=$("$CLIENT" pairs "$T/direct" "$PAIRS") ;;
	flock) v=$("$CLIENT" flock "$T/flock" "$PAIRS") ;;
	esac
	printf 'pair\t%s\t%s\t-\t%s\n' "$2" "$1" "$v" >> "$RES"
	trim_logs
}

run_rate() { # CONFIG ROUND CLIENTS
	local v m
	case "$1" in
	lockfs-tmpfs) m=$M_LT ;;
	lockfs-nice) m=$M_LN ;;
	minfs) m=$M_MIN ;;
	esac
	v=$("$CLIENT" rate "$m" "$3" "$SECONDS_RATE")
	printf 'rate\t%s\t%s\t%s\t%s\n' "$2" "$1" "$3" "$v" >> "$RES"
	trim_logs
}

CONFIGS=(lockfs-tmpfs minfs lockfs-rootfs tmpfs-direct flock)
echo "bench.sh: $ROUNDS rounds, $PAIRS pairs per run, rates over ${SECONDS_RATE}s; $(nproc) CPUs, $(uname -r)" >&2
for ((r = 1; r <= ROUNDS; r++)); do
	echo "bench.sh: round $r/$ROUNDS" >&2
	if (( r % 2 )); then order=("${CONFIGS[@]}"); rate_order=(lockfs-tmpfs ${NICE:+lockfs-nice} minfs)
	else order=(); for ((i = ${#CONFIGS[@]} - 1; i >= 0; i--)); do order+=("${CONFIGS[i]}"); done
	     rate_order=(minfs ${NICE:+lockfs-nice} lockfs-tmpfs)
	fi
	for c in "${order[@]}"; do run_pairs "$c" "$r"; done
	for n in $CLIENTS; do
		for c in "${rate_order[@]}"; do run_rate "$c" "$r" "$n"; done
	done
done
for m in "$M_LT" "$M_LR" "$M_MIN" ${NICE:+"$M_LN"}; do
	[ -z "$(find "$m" -mindepth 1 -maxdepth 1 ! -name '.*' -print -quit)" ] || die "locks left behind in $m"
done

"$PY" - "$RES" "$ROUNDS" "$PAIRS" "$SECONDS_RATE" <<'EOF'
import sys, statistics as st, collections
res, rounds, pairs, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
pair = collections.defaultdict(dict)   # config -> round -> us
rate = collections.defaultdict(dict)   # (config, clients) -> round -> pairs/s
for line in open(res):
    kind, r, cfg, n, v = line.split()
    if kind == 'pair':
        pair[cfg][int(r)] = float(v)
    else:
        rate[(cfg, int(n))][int(r)] = float(v)
R = range(1, rounds + 1)
med = st.median

print(f"\nlockfs benchmark: {rounds} rounds interleaved, {pairs} pairs per run, rates over {secs} s")
print("\nµs per acquire+release pair (mean of one run; median / min / max over rounds)")
print(f"  {'':16}{'median':>9}{'min':>9}{'max':>9}   per round")
labels = {'lockfs-tmpfs': 'lockfs (tmpfs)', 'lockfs-rootfs': 'lockfs (rootfs)',
          'minfs': 'minfs (floor)', 'tmpfs-direct': 'tmpfs direct', 'flock': 'flock(2)'}
for cfg in ['lockfs-tmpfs', 'lockfs-rootfs', 'minfs', 'tmpfs-direct', 'flock']:
    v = [pair[cfg][r] for r in R]
    print(f"  {labels[cfg]:16}{med(v):9.1f}{min(v):9.1f}{max(v):9.1f}   " +
          " ".join(f"{x:.1f}" for x in v))

def ratio(a, b, d):
    return [d[a][r] / d[b][r] for r in R]

print("\nratios, taken round by round (median / min / max)")
ratios = {}
for a, b in [('lockfs-tmpfs', 'minfs'), ('lockfs-rootfs', 'minfs'),
             ('lockfs-rootfs', 'lockfs-tmpfs'), ('minfs', 'tmpfs-direct'),
             ('lockfs-tmpfs', 'flock')]:
    v = ratio(a, b, pair)
    ratios[(a, b)] = med(v)
    print(f"  {labels[a] + ' / ' + labels[b]:36}{med(v):8.2f}{min(v):8.2f}{max(v):8.2f}   " +
          " ".join(f"{x:.2f}" for x in v))

print("\naggregate pairs/s, distinct names (median over rounds; ratio per round, then median)")
print(f"  {'clients':>7}{'lockfs':>11}{'minfs':>11}{'ratio':>8}{'min':>7}{'max':>7}")
rate_ratio = {}
for n in sorted({n for (c, n) in rate if c == 'minfs'}):
    l = [rate[('lockfs-tmpfs', n)][r] for r in R]
    m = [rate[('minfs', n)][r] for r in R]
    q = [rate[('lockfs-tmpfs', n)][r] / rate[('minfs', n)][r] for r in R]
    rate_ratio[n] = med(q)
    print(f"  {n:7}{med(l):11.0f}{med(m):11.0f}{med(q):8.2f}{min(q):7.2f}{max(q):7.2f}")

print("\nscaling: each filesystem's N-client rate / its own 1-client rate (per round, then median)")
print(f"  {'clients':>7}{'lockfs':>9}{'min':>7}{'max':>7}{'minfs':>9}{'min':>7}{'max':>7}")
scaling = {}
if 1 in rate_ratio:
    for n in sorted(n for n in rate_ratio if n != 1):
        row = []
        for cfg in ('lockfs-tmpfs', 'minfs'):
            q = [rate[(cfg, n)][r] / rate[(cfg, 1)][r] for r in R]
            scaling[(cfg, n)] = med(q)
            row += [med(q), min(q), max(q)]
        print(f"  {n:7}{row[0]:9.2f}{row[1]:7.2f}{row[2]:7.2f}{row[3]:9.2f}{row[4]:7.2f}{row[5]:7.2f}")
if any(c == 'lockfs-nice' for (c, _) in rate):
    print("\nlockfs-nice (the same daemon under nice -n N): pairs/s, its rate / lockfs-tmpfs's, and its N-client / 1-client rate")
    print(f"  {'clients':>7}{'pairs/s':>9}{'/lockfs':>9}{'min':>7}{'max':>7}{'N/1':>7}{'min':>7}{'max':>7}")
    for n in sorted(n for (c, n) in rate if c == 'lockfs-nice'):
        v = [rate[('lockfs-nice', n)][r] for r in R]
        q = [rate[('lockfs-nice', n)][r] / rate[('lockfs-tmpfs', n)][r] for r in R]
        k = [rate[('lockfs-nice', n)][r] / rate[('lockfs-nice', 1)][r] for r in R]
        print(f"  {n:7}{med(v):9.0f}{med(q):9.2f}{min(q):7.2f}{max(q):7.2f}{med(k):7.2f}{min(k):7.2f}{max(k):7.2f}")

r1 = ratios[('lockfs-tmpfs', 'minfs')]
print("\ngoals (issue 2, restated by issue 10 section 4)")
print(f"  lockfs(tmpfs)/minfs per pair <= 2.0 (stretch 1.5): {r1:.2f} -> "
      + ("met, stretch met" if r1 <= 1.5 else "met" if r1 <= 2.0 else "NOT met"))
if 8 in rate_ratio:
    # Issue 10 replaced this goal: the kernel's per-directory lock makes
    # it unreachable.  Shown for comparison only.
    print(f"  (withdrawn) lockfs/minfs rate with 8 clients: {rate_ratio[8]:.2f}")
if ('lockfs-tmpfs', 8) in scaling:
    v = scaling[('lockfs-tmpfs', 8)]
    print(f"  issue 10: lockfs 8-client rate >= 0.90 x its own 1-client rate: {v:.2f} -> "
          + ("met" if v >= 0.9 else "NOT met"))
EOF
