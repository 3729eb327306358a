#!/bin/bash
# Run a command on a brand-new Debian 12 machine, as a new user would, as root:
#
#   tools/fresh-root.sh [--keep] [--] COMMAND [ARG...]
#
# Makes (once, then cached) a minbase Debian 12 root file system with
# `mmdebstrap --variant=minbase bookworm`, copies the pristine root and this
# checkout's files (what git tracks, as they are in the work tree, plus new
# files not ignored: no build dir) into a fresh directory, and runs COMMAND
# there in /src/lockfs as a privileged podman container with /dev/fuse and
# the host's network.  Every run starts from the pristine root: nothing one
# run installs is seen by the next.  The exit status is COMMAND's.
#
# COMMAND runs under an init (catatonit, podman --init), as on a machine:
# were COMMAND pid 1 itself, lockfs would refuse a lock taken by its own
# `mkdir` (pid 1 is never a holder: docs/holder.md), and no one would reap
# the daemon setup.sh detaches.  There is no systemd as pid 1, so
# tools/setup.sh starts the daemon itself.
#
#   --keep   keep the run's root file system (its path is said) to look at
#
# The cache is $LOCKFS_FRESH_ROOT_CACHE (default /var/cache/lockfs-fresh-root),
# one root per mmdebstrap command line and ISO week, so that a new week's
# run sees the mirror's updates; older roots are removed.  The mirror is
# the one this machine's apt uses (/etc/apt/sources.list*), or
# $LOCKFS_MIRROR.  Needs mmdebstrap, podman, runc and catatonit (installed
# with apt-get when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'fresh-root: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

keep=0
while [ $# -gt 0 ]; do
	case $1 in
	--keep) keep=1; shift ;;
	--) shift; break ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) die "unknown option $1" ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || die "usage: tools/fresh-root.sh [--keep] [--] COMMAND [ARG...]"
[ "$(id -u)" = 0 ] || die "run this as root (it runs mmdebstrap and a privileged container)"

# --- the tools ---------------------------------------------------------------
need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/bin/catatonit ] || need+=(catatonit)
if [ ${#need[@]} -gt 0 ]; then
	say "installing ${need[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi

# --- the mirror: this machine's own Debian sources ---------------------------
# One "deb URI SUITE COMPONENTS" line per bookworm suite this machine uses,
# from both the one-line and the deb822 formats.
host_sources() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		awk '$1 == "deb" && $0 !~ /\[/ && $3 ~ /^bookworm/ { print $1, $2, $3, "main" }' "$f"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk '
			function flush(  i, n, s) {
				if (types ~ /(^| )deb( |$)/ && uris != "") {
					n = split(suites, s, " ")
					for (i = 1; i <= n; i++)
						if (s[i] ~ /^bookworm/) print "deb", uris, s[i], "main"
				}
				types = uris = suites = ""
			}
			/^[ \t]*$/ { flush(); next }
			/^Types:/ { sub(/^Types:[ \t]*/, ""); types = $0 }
			/^URIs:/ { sub(/^URIs:[ \t]*/, ""); uris = $1 }
			/^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
			END { flush() }' "$f"
	done
}
if [ -n "${LOCKFS_MIRROR:-}" ]; then
	sources=("deb $LOCKFS_MIRROR bookworm main" "deb $LOCKFS_MIRROR bookworm-updates main")
else
	mapfile -t sources < <(host_sources | sort -u)
	[ ${#sources[@]} -gt 0 ] || sources=("deb http://deb.debian.org/debian bookworm main")
fi
mmargs=(--variant=minbase bookworm "${sources[@]}")

# --- the cached pristine root ------------------------------------------------
cache=${LOCKFS_FRESH_ROOT_CACHE:-/var/cache/lockfs-fresh-root}
key=$(date +%G-W%V)-$(printf '%s\n' "${mmargs[@]}" | sha256sum | cut -c1-12)
pristine=$cache/$key
mkdir -p -- "$cache"
# One maker at a time: a second run waits for the first's root, rather than
# removing it half-made.
exec 9>"$cache/.lock"
flock 9
if [ ! -d "$pristine" ]; then
	# Built beside, renamed when complete: an interrupted build is never
	# taken for a root.
	rm -rf -- "$pristine.new"
	say "making a minbase Debian 12 root in $pristine: mmdebstrap ${mmargs[*]}"
	start=$SECONDS
	mmdebstrap "${mmargs[0]}" "${mmargs[1]}" "$pristine.new" "${mmargs[@]:2}"
	mv -- "$pristine.new" "$pristine"
	say "made it in $((SECONDS - start)) s"
	for old in "$cache"/*; do
		[ "$old" = "$pristine" ] || { say "removing the older root $old"; rm -rf -- "$old"; }
	done
fi
flock -u 9
exec 9>&-

# --- this run's copy -----------------------------------------------------------
run=$(mktemp -d /var/tmp/lockfs-fresh-run.XXXXXX)
cleanup() {
	if [ $keep = 1 ]; then
		say "kept the run's root file system: $run/root"
		return
	fi
	# setup.sh makes its guard immutable (chattr +i): let go of it first.
	if ! rm -rf -- "$run" 2>/dev/null; then
		chattr -R -f -i -- "$run" || true
		rm -rf -- "$run"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
cp -a --reflink=auto -- "$pristine" "$run/root"
mkdir -p -- "$run/root/src/lockfs"
git ls-files -z --cached --others --exclude-standard |
	while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
	tar --null -T - -cf - | tar -xf - -C "$run/root/src/lockfs"

say "running in a fresh Debian 12 root (${sources[*]}): $*"
set +e
podman run --rm --runtime=runc \
	--ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
	--privileged --device /dev/fuse --network=host \
	--init --init-path /usr/bin/catatonit --workdir /src/lockfs \
	--rootfs "$run/root" "$@"
rc=$?
set -e
exit $rc
