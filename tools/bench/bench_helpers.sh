#!/bin/bash
# tools/bench/bench_helpers.sh: two lockfs daemons side by side, as root (issue 8 §3).
#
#   sudo tools/bench/bench_helpers.sh [--rounds N] [--pairs N] [--names N] [--smoke] OLD_LOCKFS NEW_LOCKFS [BUILD_DIR]
#
# What the holder checks cost: OLD_LOCKFS and NEW_LOCKFS (two builds of the
# daemon, e.g. before and after a change) each mount a backing dir on one
# private tmpfs, and every round (order alternating) measures on each:
#   pair     mkdir+rmdir by a C caller that holds the lock itself
#            (BUILD_DIR/tools/bench/bench_pairs pairs M N): the uncontended pair;
#   helper   one /usr/bin/mkdir with --names arguments, then one /usr/bin/rmdir:
#            every acquisition resolves mkdir(1) as a genuine helper and skips
#            it to its parent; µs per name (fork+exec spread over the names).
# Each is measured twice: wall-clock µs seen by the client, and the daemon's
# CPU µs (the sum of its threads' run time in /proc/PID/task/*/schedstat),
# which other load on the machine disturbs much less.  Prints the median of
# each over the rounds, and the median of the per-round NEW/OLD ratios.
# --smoke: one round of few pairs (for CI).
# Everything it mounts or starts is undone on exit.

set -euo pipefail

# ------------------------------------------------- shared by the benchmarks ---
# bench.sh, bench_descendants.sh, bench_etcd.sh and bench_handoff.sh source
# this file for the functions below (each defines its own cleanup(); W and
# T, its work dir and private tmpfs, must be set, empty, before
# bench_traps).  Sourced, the file stops after them.
BENCH_NAME=${0##*/}

usage() { # the calling script's header comment, as its help
	sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2
	exit 2
}

die() { echo "$BENCH_NAME: $*" >&2; exit 1; }

is_mounted() { # MOUNTPOINT
	awk -v m="$1" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo
}

unmount_fuse() { # MOUNTPOINT: a FUSE mount of ours, lazily when it is busy
	is_mounted "$1" || return 0
	fusermount3 -u "$1" 2>/dev/null || fusermount3 -u -z "$1" 2>/dev/null || true
}

stop_daemon() { # PID: wait for it after its unmount, then TERM, then KILL
	local pid=$1 i
	for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || echo "$BENCH_NAME: daemon $pid exited with status $?" >&2
}

bench_workdir() { # NAME SIZE: W=/var/tmp/NAME.XXXXXX (0700) and our tmpfs of SIZE on T=$W/tmpfs
	W=$(mktemp -d "/var/tmp/$1.XXXXXX")
	chmod 0700 "$W"
	T=$W/tmpfs
	mkdir "$T"
	mount -t tmpfs -o "size=$2,mode=0700" tmpfs "$T"
}

bench_workdir_remove() { # [MOUNTPOINT...]: the last step of a cleanup, once
	# every FUSE mount is down and its daemon reaped: T unmounted, and W
	# removed unless something is still mounted under it.  lockfs makes
	# its mount points immutable once unmounted (the guard, recovery.md):
	# the MOUNTPOINTs are made mutable first.
	local m
	if [ -n "$T" ] && is_mounted "$T"; then
		umount "$T" 2>/dev/null || umount -l "$T"
	fi
	[ -n "$W" ] && [ -d "$W" ] || return 0
	if grep -q " ${W}[/ ]" /proc/self/mountinfo; then
		echo "$BENCH_NAME: something is still mounted under $W; not removing it" >&2
		return 0
	fi
	for m in "$@"; do [ -n "$m" ] && [ -d "$m" ] && chattr -i "$m" 2>/dev/null; done
	rm -rf --one-file-system "$W"
}

bench_traps() { # cleanup() on every exit, Ctrl-C and TERM included
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

# ----------------------------------------------------- the helper benchmark ---

ROUNDS=9
PAIRS=2000
NAMES=500
PY=/usr/bin/python3

while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=${2:?}; shift 2 ;;
	--pairs) PAIRS=${2:?}; shift 2 ;;
	--names) NAMES=${2:?}; shift 2 ;;
	--smoke) ROUNDS=1; PAIRS=50; NAMES=20; shift ;;
	-h|--help) usage ;;
	-*) echo "bench_helpers.sh: unknown option $1" >&2; usage ;;
	*) break ;;
	esac
done
[ $# -ge 2 ] || usage
OLD=$1 NEW=$2 BUILD=${3:-./build}
CLIENT=$BUILD/tools/bench/bench_pairs

[ "$(id -u)" = 0 ] || die "must run as root"
for b in "$OLD" "$NEW" "$CLIENT"; do [ -x "$b" ] || die "$b is not executable"; done
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 ]] || die "--rounds must be a positive integer"

W=$(mktemp -d /var/tmp/lockfs-bench-helpers.XXXXXX)
T=$W/t
PIDS=()
cleanup() {
	local rc=$? p
	trap - EXIT INT TERM
	set +e
	unmount_fuse "$W/m-old"
	unmount_fuse "$W/m-new"
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
	bench_workdir_remove "$W/m-old" "$W/m-new"
	exit "$rc"
}
bench_traps

mkdir "$W/t" "$W/m-old" "$W/m-new"
mount -t tmpfs -o size=128m,mode=0700 tmpfs "$W/t"
mkdir -m 0700 "$W/t/old" "$W/t/new"
start() { # BINARY BACKING MOUNTPOINT
	"$1" -f -o backing="$2" -o fence_file="$2.fence" "$3" 2>>"$W/t/daemons.err" &
	PIDS+=("$!")
	for _ in $(seq 100); do
		grep -q " $3 " /proc/self/mountinfo && return 0
		kill -0 "$!" 2>/dev/null || die "$1 died before mounting: $(cat "$W/t/daemons.err")"
		sleep 0.1
	done
	die "$1 did not mount $3"
}
start "$OLD" "$W/t/old" "$W/m-old"
PID_old=${PIDS[0]}
start "$NEW" "$W/t/new" "$W/m-new"
PID_new=${PIDS[1]}

cpu_ns() { # PID: the CPU time of all its threads so far, in ns
	cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ t += $1 } END { printf "%.0f", t }'
}

helper() { # MOUNTPOINT: µs per name, mkdir(1) then rmdir(1) over NAMES names
	"$PY" - "$1" "$NAMES" <<'EOF'
import subprocess, sys, time
m, n = sys.argv[1], int(sys.argv[2])
paths = [f'{m}/h{i}' for i in range(n)]
t0 = time.perf_counter()
subprocess.run(['/usr/bin/mkdir'] + paths, check=True)
subprocess.run(['/usr/bin/rmdir'] + paths, check=True)
print(f'{(time.perf_counter() - t0) * 1e6 / n:.3f}')
EOF
}

results=()
for r in $(seq "$ROUNDS"); do
	order="old new"
	[ $((r % 2)) = 0 ] && order="new old"
	for k in $order; do
		pid=PID_$k
		c0=$(cpu_ns "${!pid}")
		p=$("$CLIENT" pairs "$W/m-$k" "$PAIRS")
		c1=$(cpu_ns "${!pid}")
		h=$(helper "$W/m-$k")
		c2=$(cpu_ns "${!pid}")
		# the pair run includes its warm-up (N/10, 1 to 200 pairs)
		w=$(( PAIRS / 10 < 1 ? 1 : PAIRS / 10 > 200 ? 200 : PAIRS / 10 ))
		results+=("$r $k $p $h $(( c1 - c0 )) $(( PAIRS + w )) $(( c2 - c1 )) $NAMES")
	done
	: > "$W/t/old/lock.log"
	: > "$W/t/new/lock.log"
done

printf '%s\n' "${results[@]}" | "$PY" -c '
import statistics, sys
rows = [l.split() for l in sys.stdin]
by = {}
for r, k, p, h, cp, np, ch, nh in rows:
    by.setdefault(k, {})[int(r)] = [float(p), float(h), int(cp) / int(np) / 1000,
                                    int(ch) / int(nh) / 1000]
rounds = sorted(by["old"])
print(f"{len(rounds)} rounds; medians in µs")
for i, what in enumerate(("pair (C caller holds), wall",
                          "mkdir(1)+rmdir(1) per name, wall",
                          "pair (C caller holds), daemon CPU",
                          "mkdir(1)+rmdir(1) per name, daemon CPU")):
    old = [by["old"][r][i] for r in rounds]
    new = [by["new"][r][i] for r in rounds]
    ratio = [n / o for n, o in zip(new, old)]
    print(f"{what:45s} old {statistics.median(old):8.1f}  new {statistics.median(new):8.1f}"
          f"  new/old {statistics.median(ratio):.3f} (rounds {min(ratio):.2f}-{max(ratio):.2f})")
'
