#!/bin/bash
# Set up lockfs on this machine (Debian 12), as root:
#
#   tools/setup.sh [--backing DIR] [-o OPTIONS] [--share DIR] [--name NAME]
#                  [--no-install] [--build DIR] [MOUNTPOINT]
#   tools/setup.sh --remove [--share DIR] [--name NAME] [--no-install]
#                  [--build DIR] [MOUNTPOINT]
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
#   --remove        undo what setup made for MOUNTPOINT: stop its unit or
#                   daemon, unmount, drop the guard, the symlink, the
#                   shared parent (once empty) and the /etc/default file it
#                   wrote; once no other lock tree it made is left, the
#                   files it installed (the build dir's install log).  The
#                   Debian packages it installed and the backing dir (the
#                   locks' state and lock.log) stay.
set -eEuo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }
# A step that fails without saying why still says where it stopped.
trap 'rc=$?; printf "setup: failed (exit %s) at line %s: %s\n" "$rc" "$LINENO" "$BASH_COMMAND" >&2; exit $rc' ERR
usage() { sed -n '2,/^set -eEuo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "$1"; }

mnt=/locks backing= opts= share=/srv/lockfs name= install=1 build=build remove=0
args="$*"
while [ $# -gt 0 ]; do
	case $1 in
	--backing) backing=${2:?--backing needs a directory}; shift 2 ;;
	-o) opts=${opts:+$opts,}${2:?-o needs options}; shift 2 ;;
	--share) share=${2:?--share needs a directory}; shift 2 ;;
	--name) name=${2:?--name needs a name}; shift 2 ;;
	--no-install) install=0; shift ;;
	--build) build=${2:?--build needs a directory}; shift 2 ;;
	--remove) remove=1; shift ;;
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

if [ $default_instance = 1 ]; then
	unit=lockfs.service conf=/etc/default/lockfs
else
	unit=lockfs@$name.service conf=/etc/default/lockfs-$name
fi

# --- remove: undo the above, newest first ----------------------------------
# mountinfo's escaping of a path (octal for space, tab, newline, backslash)
escape() { printf '%s' "$1" | sed 's/\\/\\134/g; s/ /\\040/g; s/	/\\011/g'; }
# "FSTYPE SOURCE" of the topmost mount on PATH; nothing when none.
mount_of() {
	E=$(escape "$1") awk '$5 == ENVIRON["E"] {
		for (i = 7; $i != "-"; i++) ;
		m = $(i + 1) " " $(i + 2)
	} END { if (m != "") print m }' /proc/self/mountinfo
}
# Is another lock tree that setup made left: one in the shared parent, or
# a unit's settings it wrote?
other_instances() {
	[ -d "$share" ] && [ -n "$(ls -A -- "$share")" ] && return 0
	grep -ls '^# lockfs settings for .*, written by tools/setup.sh' /etc/default/lockfs /etc/default/lockfs-* >/dev/null
}
# Is PID a lockfs daemon still running?  One that exited and waits to be
# reaped by its parent (state Z) is not.
daemon_running() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>&1) || return 1
	stat=${stat##*) }
	[ "${stat%% *}" != Z ] && [ "$(cat "/proc/$1/comm" 2>&1)" = lockfs ]
}
remove() {
	if [ -d /run/systemd/system ]; then
		# systemctl answers "not-found" or "disabled" with a failing status.
		state=$(systemctl is-enabled "$unit" 2>&1) || true
		if [ "$state" = enabled ] || systemctl is-active --quiet "$unit"; then
			systemctl disable --now --quiet "$unit"
			say "stopped and disabled $unit"
		fi
	fi
	if [ -f "$conf" ]; then
		if grep -q '^# lockfs settings for .*, written by tools/setup.sh' "$conf"; then
			rm -- "$conf"
			say "removed $conf"
		else
			say "left $conf: tools/setup.sh did not write it"
		fi
	fi
	local mp found pid
	if [ -d "$share" ]; then
		mp=$(realpath -- "$share")/$name
		found=$(mount_of "$mp")
		if [ "${found%% *}" = fuse.lockfs ]; then
			# the daemon started without systemd: it exits once unmounted
			pid=$(cat -- "${found#* }/.lockfs" 2>/dev/null) || pid=
			umount -- "$mp" ||
				die "cannot unmount $mp (above): is a process working in it? (fuser -vm $mp)"
			say "unmounted lockfs from $mp"
			if [ -n "$pid" ]; then
				for _ in $(seq 500); do
					daemon_running "$pid" || break
					sleep 0.02
				done
				! daemon_running "$pid" ||
					die "the daemon (pid $pid) is still running 10 s after its unmount"
				say "the daemon (pid $pid) has exited"
			fi
		fi
	fi
	# The layout (guard, symlink, the shared parent's bind mount) is
	# lockfs-mountpoint's to undo, as it made it: the built one, else the
	# installed one.
	local tool=$build/tools/systemd/lockfs-mountpoint
	[ -x "$tool" ] || tool=/usr/local/sbin/lockfs-mountpoint
	[ -x "$tool" ] || die "no lockfs-mountpoint in $build/tools/systemd or /usr/local/sbin: build first (meson compile -C $build)"
	local removed
	removed=$("$tool" remove "$target" $link)
	[ -z "$removed" ] || printf '%s\n' "$removed" | sed 's/^lockfs-mountpoint/setup/'
	if [ $install = 1 ]; then
		if other_instances; then
			say "left the files installed under /usr/local: another lock tree still uses them" \
			    "(tools/setup.sh --remove it too)"
		else
			remove_installed
		fi
	fi
	say "left the backing dir $backing (the locks' state and lock.log): rm -r $backing to drop it"
	say "the Debian packages setup installed stay installed (tools/packages.txt lists them)"
}
# The files `meson install` wrote, from the build dir's install log.
remove_installed() {
	local log=$build/meson-logs/install-log.txt f n=0
	if [ ! -f "$log" ]; then
		say "no $log: nothing was installed from $build (or it is gone); left /usr/local alone"
		return 0
	fi
	local dirs=()
	while IFS= read -r f; do
		case $f in ''|'#'*) continue ;; esac
		if [ -d "$f" ] && [ ! -L "$f" ]; then
			dirs+=("$f")  # a directory meson made (listed innermost first)
		elif [ -e "$f" ] || [ -L "$f" ]; then
			rm -- "$f"
			say "removed $f"
			n=$((n + 1))
		fi
	done <"$log"
	# the directories meson created (it logs them too) once empty, but not
	# the standard ones a fresh /usr/local may lack (hier(7)): they are
	# the system's, not ours
	for f in "${dirs[@]}"; do
		case ${f#/usr/local} in
		/bin|/sbin|/lib|/share|/share/man|/share/man/man[1-9]|/etc|/include|/src|/games) continue ;;
		esac
		if [ -z "$(ls -A -- "$f")" ]; then
			rmdir -- "$f"
			say "removed the directory $f"
		fi
	done
	[ $n -gt 0 ] || say "the files setup installed are gone already"
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload
	fi
}
if [ $remove = 1 ]; then
	remove
	exit 0
fi

# --- packages: only the missing ones -------------------------------------
# tools/packages.txt is the one list; setup needs its build and run packages
# (tools/deps.sh installs the test packages too).  dpkg says what is
# installed: a command on PATH may come from elsewhere.
mapfile -t wanted < <(sed 's/#.*//' tools/packages.txt | awk '$1 == "build" || $1 == "run" { print $2 }')
[ ${#wanted[@]} -gt 0 ] || die "tools/packages.txt lists no build or run package"
missing=()
for pkg in "${wanted[@]}"; do
	# dpkg-query fails for a package it never heard of: that is "missing" too.
	status=$(dpkg-query -W -f='${Status}' "$pkg" 2>&1) || true
	[ "$status" = "install ok installed" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
	say "installing the missing Debian packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	# An earlier run interrupted inside dpkg left packages unpacked but not
	# configured; apt-get refuses to go on until they are.
	dpkg --configure -a || die "dpkg --configure -a failed (above)"
	apt-get update -q || die "apt-get update failed (above)"
	apt-get install -y -q --no-install-recommends "${missing[@]}" ||
		die "apt-get install failed (above); run tools/setup.sh again once it is fixed"
else
	say "the packages lockfs needs are installed already"
fi

# --- build and install ---------------------------------------------------
# The build dir as an earlier run left it, even a failed or interrupted one,
# is never trusted: tools/configure.sh reconfigures or wipes it.  Its output
# is kept in a log and shown when it fails.
mkdir -p -- "$build"
tools/configure.sh "$build" >"$build/setup-configure.log" 2>&1 ||
	{ cat "$build/setup-configure.log" >&2; die "meson setup $build failed (above)"; }
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
	mountpoint_tool=$(dirname -- "$lockfs")/tools/systemd/lockfs-mountpoint
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
