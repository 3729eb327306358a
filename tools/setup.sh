#!/bin/bash
# Set up lockfs on this machine (Debian 12), as root:
#
#   tools/setup.sh [--backing DIR] [-o OPTIONS] [--share DIR] [--name NAME]
#                  [--no-install] [--build DIR] [MOUNTPOINT]
#
# Installs the Debian packages that are missing (only those), builds into
# build/, installs lockfs, lockctl, lockctl-static, lockfs-mountpoint, the
# man pages and the systemd units under /usr/local, and starts lockfs so
# that MOUNTPOINT (default /locks) holds the locks.
#
# Layout (docs/operations.md): the daemon mounts on SHARE/NAME (default
# /srv/lockfs/locks), SHARE is a shared bind mount of itself, MOUNTPOINT is
# a symlink to SHARE/NAME, and SHARE/NAME refuses mkdir while nothing is
# mounted on it.  Containers given `-v SHARE:SHARE:rslave` keep their locks
# across a restart of the daemon.  Where systemd is pid 1 the unit
# (lockfs.service, or lockfs@NAME.service for another MOUNTPOINT) does all
# this and supervises the daemon; elsewhere this script does it and starts
# the daemon itself.
#
# Run it again with another MOUNTPOINT (and --backing) for a second lock
# tree beside the first.  Every change is said on stdout.
#
#   --backing DIR   backing dir (default /run/lockfs, or /run/lockfs-NAME
#                   for a MOUNTPOINT other than /locks)
#   -o OPTIONS      more lockfs options (comma-separated; allow_other is set)
#   --share DIR     the shared parent (default /srv/lockfs)
#   --name NAME     the mount's name in SHARE (default: MOUNTPOINT's basename)
#   --no-install    use the build dir as it is: install nothing under
#                   /usr/local and no unit; start the daemon directly
#   --build DIR     the build dir (default build)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "$1"; }

mnt=/locks backing= opts= share=/srv/lockfs name= install=1 build=build
args="$*"
while [ $# -gt 0 ]; do
	case $1 in
	--backing) backing=${2:?--backing needs a directory}; shift 2 ;;
	-o) opts=${opts:+$opts,}${2:?-o needs options}; shift 2 ;;
	--share) share=${2:?--share needs a directory}; shift 2 ;;
	--name) name=${2:?--name needs a name}; shift 2 ;;
	--no-install) install=0; shift ;;
	--build) build=${2:?--build needs a directory}; shift 2 ;;
	-h|--help) usage 0 ;;
	-*) die "unknown option $1 (see tools/setup.sh --help)" ;;
	*) mnt=$1; shift ;;
	esac
done
case $mnt in /*) ;; *) die "MOUNTPOINT must be an absolute path: $mnt" ;; esac
mnt=${mnt%/}
name=${name:-$(basename -- "$mnt")}
case $name in ''|*/*|.*) die "bad name '$name' (use --name)" ;; esac
share=${share%/}
if [ "$(dirname -- "$mnt")" = "$share" ]; then
	target=$mnt link=              # MOUNTPOINT is in SHARE already
else
	target=$share/$name link=$mnt
fi
default_instance=0
[ "$name" = locks ] && [ "$share" = /srv/lockfs ] && default_instance=1
if [ -z "$backing" ]; then
	if [ $default_instance = 1 ]; then backing=/run/lockfs; else backing=/run/lockfs-$name; fi
fi

if [ "$(id -u)" != 0 ]; then
	die "run this as root: it installs packages, mounts and writes under /usr/local." \
	    "As a normal user: su -c 'tools/setup.sh $args' (or sudo tools/setup.sh, where sudo is installed)"
fi

# --- packages: only the missing ones -------------------------------------
missing=()
want() { case " ${missing[*]} " in *" $1 "*) ;; *) missing+=("$1") ;; esac; }
command -v cc >/dev/null || want gcc
[ -e /usr/include/stdio.h ] || want libc6-dev
command -v pkg-config >/dev/null || want pkg-config
command -v meson >/dev/null || want meson
command -v ninja >/dev/null || want ninja-build
command -v fusermount3 >/dev/null || want fuse3
command -v chattr >/dev/null || want e2fsprogs
command -v mount >/dev/null || want util-linux
for pc in fuse3:libfuse3-dev jansson:libjansson-dev libsystemd:libsystemd-dev; do
	if ! command -v pkg-config >/dev/null || ! pkg-config --exists "${pc%%:*}"; then
		want "${pc#*:}"
	fi
done
if [ ${#missing[@]} -gt 0 ]; then
	say "installing the missing Debian packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}"
else
	say "the packages lockfs needs are installed already"
fi

# --- build and install ---------------------------------------------------
[ -d "$build" ] || meson setup "$build" >/dev/null
meson compile -C "$build" >"$build/setup-compile.log" 2>&1 ||
	{ cat "$build/setup-compile.log" >&2; die "the build failed (above)"; }
# Each file meson installs, a tab, and a checksum of what is there now
# ("-" when nothing): run before and after installing, to say only what
# changed.
installed_files() {
	meson introspect "$build" --installed |
		python3 -c 'import json, sys; print("\n".join(sorted(json.load(sys.stdin).values())))' |
		while IFS= read -r f; do
			if [ -f "$f" ]; then
				printf '%s\t%s\n' "$f" "$(sha256sum <"$f" | cut -d' ' -f1)"
			else
				printf '%s\t-\n' "$f"
			fi
		done
}
if [ $install = 1 ]; then
	before=$(installed_files)
	meson install -C "$build" --no-rebuild >"$build/setup-install.log" 2>&1 ||
		{ cat "$build/setup-install.log" >&2; die "meson install failed (above)"; }
	after=$(installed_files)
	new=$(paste <(printf '%s\n' "$before") <(printf '%s\n' "$after") |
		awk -F'\t' '$1 != $3 || $2 != $4 { print $3 }')
	if [ -n "$new" ]; then
		while IFS= read -r dest; do say "installed $dest"; done <<<"$new"
	else
		say "the installed files are up to date"
	fi
	prefix=$(meson introspect "$build" --buildoptions |
		python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
	lockfs=$prefix/bin/lockfs
	mountpoint_tool=$prefix/sbin/lockfs-mountpoint
else
	lockfs=$PWD/$build/lockfs
	[ "${build#/}" = "$build" ] || lockfs=$build/lockfs
	mountpoint_tool=$(dirname -- "$lockfs")/systemd/lockfs-mountpoint
	say "--no-install: using $lockfs as built, installing nothing"
fi
export LOCKFS=$lockfs

# --- start ---------------------------------------------------------------
options=allow_other${opts:+,$opts}
if [ -n "$link" ] && grep -q "^[^ ]* $link fuse\.lockfs " /proc/mounts; then
	die "lockfs is mounted on $link itself (an older setup): unmount it first" \
	    "(umount $link; its locks stay in its backing dir), then run this again"
fi
if [ $install = 1 ] && [ -d /run/systemd/system ]; then
	# systemd is pid 1: the unit builds the layout and supervises lockfs.
	if [ $default_instance = 1 ]; then
		unit=lockfs.service conf=/etc/default/lockfs
	else
		unit=lockfs@$name.service conf=/etc/default/lockfs-$name
	fi
	cat >"$conf.new" <<-EOF
	# lockfs settings for $unit, written by tools/setup.sh (see lockfs(8)).
	LOCKFS_SHARE=$share
	LOCKFS_NAME=$name
	LOCKFS_LINK=$link
	LOCKFS_BACKING=$backing
	LOCKFS_OPTIONS=$options
	EOF
	changed=0
	if cmp -s "$conf.new" "$conf"; then
		rm "$conf.new"
	else
		mv "$conf.new" "$conf"
		say "wrote $conf"
		changed=1
	fi
	systemctl daemon-reload
	if systemctl is-active --quiet "$unit"; then
		if [ $changed = 1 ]; then
			systemctl restart "$unit"
			say "restarted $unit with the new settings (holders keep their locks)"
		else
			say "$unit is running already"
		fi
	else
		systemctl enable --now --quiet "$unit"
		say "enabled and started $unit"
		say "the unit guards $target before each start (lockfs-mountpoint prepare):" \
		    "while lockfs is not mounted on it, mkdir there fails"
	fi
else
	# No systemd: build the unit's layout and start the daemon directly.
	prepared=$("$mountpoint_tool" prepare "$target" $link)
	[ -z "$prepared" ] || printf '%s\n' "$prepared" | sed 's/^lockfs-mountpoint/setup/'
	if ! grep -q 'not guarding' <<<"$prepared"; then
		say "guarded $target (immutable underneath: while lockfs is not mounted on it," \
		    "mkdir there fails instead of making a plain directory)"
	fi
	if grep -q "^[^ ]* $target fuse\.lockfs " /proc/mounts; then
		say "lockfs is serving $target already"
	else
		if [ "$backing" != /run/lockfs ] && [ ! -d "$backing" ]; then
			mkdir -p -m 0700 -- "$backing"
			say "created the backing dir $backing (mode 0700)"
		fi
		"$lockfs" -o "backing=$backing,$options" "$target"
		# lockfs returns once the detached daemon serves and has
		# written its pid (an older lockfs a moment before: wait).
		pid=
		for _ in $(seq 100); do
			pid=$(cat "$backing/.lockfs" 2>/dev/null || true)
			[ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = lockfs ] && break
			pid=
			sleep 0.02
		done
		say "started lockfs on $target (backing dir $backing)${pid:+, pid $pid}"
		say "it is not supervised (no systemd here); after a crash run:"
		say "  $mountpoint_tool prepare $target${link:+ $link} && $lockfs -o backing=$backing,$options $target"
	fi
fi

say "ready: mkdir ${link:-$target}/NAME takes the lock NAME (lockctl status lists them)"
say "containers: podman run -v $share:$share:rslave ... (the locks are at $target inside)"
