#!/bin/sh
# lockfs-mountpoint: make a lockfs mount point that containers can follow
# across daemon restarts, and clear the dead mount a crashed daemon left.
#
#   lockfs-mountpoint prepare MOUNTPOINT [LINK]
#   lockfs-mountpoint clean MOUNTPOINT
#
# prepare: the parent of MOUNTPOINT (P) becomes a shared mount of its own
#   (mount --bind P P; mount --make-shared P), MOUNTPOINT a directory that
#   refuses everything while nothing is mounted on it (lockfs --guard), and
#   LINK (e.g. /locks) a symlink to MOUNTPOINT.  A container given P with
#   rslave propagation (podman/docker -v P:P:rslave) then sees every later
#   mount and unmount of MOUNTPOINT: a restarted daemon reaches it without
#   restarting the container.  A dead mount on MOUNTPOINT is cleared first.
# clean: if MOUNTPOINT is a mount whose daemon is gone (ENOTCONN), detach it
#   (umount -l); the detach reaches the containers too.  A live mount is left
#   alone.  The systemd unit runs this after the daemon stops (ExecStopPost).
#
# Every change is said on stdout; errors are one line on stderr, exit 1.
# LOCKFS names the lockfs binary (default: the installed one).
set -eu
LOCKFS=${LOCKFS:-@bindir@/lockfs}
prog=lockfs-mountpoint

say() { printf '%s: %s\n' "$prog" "$*"; }
die() { printf '%s: %s\n' "$prog" "$*" >&2; exit 1; }

# mountinfo's escaping of a path (octal for space, tab, newline, backslash)
escape() { printf '%s' "$1" | sed 's/\\/\\134/g; s/ /\\040/g; s/	/\\011/g'; }

# Is PATH the mount point of something?  Read mountinfo, not stat(2): a dead
# FUSE mount answers stat with ENOTCONN.
is_mount() {
	E=$(escape "$1") awk '$5 == ENVIRON["E"] { found = 1 } END { exit !found }' \
		/proc/self/mountinfo
}

# Is the topmost mount on PATH shared (a "shared:N" optional field)?
is_shared() {
	E=$(escape "$1") awk '$5 == ENVIRON["E"] {
		s = 0
		for (i = 7; i <= NF && $i != "-"; i++) if ($i ~ /^shared:/) s = 1
	} END { exit !s }' /proc/self/mountinfo
}

# A mount on PATH whose daemon is gone: stat fails (ENOTCONN, ECONNABORTED).
# Bounded: a daemon that hangs instead must not hang us.
is_dead_mount() {
	is_mount "$1" && ! timeout 5 stat -- "$1" >/dev/null 2>&1
}

clean() {
	[ -d "$(dirname -- "$1")" ] || return 0
	mp=$(realpath -- "$(dirname -- "$1")")/$(basename -- "$1")
	if is_dead_mount "$mp"; then
		umount -l -- "$mp" || die "cannot detach the dead mount on $mp"
		say "detached the dead mount on $mp (its daemon is gone)"
	fi
}

guard() {
	mp=$1
	if "$LOCKFS" --help 2>/dev/null | grep -q -- '--guard'; then
		"$LOCKFS" --guard "$mp" || die "cannot guard $mp (see the line above)"
	else
		# A lockfs without --guard: the same flag by hand.
		chattr +i -- "$mp" 2>/dev/null ||
			die "cannot make $mp immutable (chattr +i): while lockfs is not mounted there," \
			    "mkdir in it would make plain directories, no locks"
	fi
}

prepare() {
	mp=$1 link=${2:-}
	case $mp in /*) ;; *) die "MOUNTPOINT must be an absolute path: $mp" ;; esac
	share=$(dirname -- "$mp")
	if [ ! -d "$share" ]; then
		mkdir -p -m 0755 -- "$share"
		say "created $share"
	fi
	# mountinfo has canonical paths: resolve the (live) parent, not MOUNTPOINT,
	# which may be a dead mount.
	share=$(realpath -- "$share")
	[ "$share" != / ] || die "$mp is directly under /: its parent cannot be the shared mount"
	mp=$share/$(basename -- "$mp")
	if ! is_mount "$share"; then
		mount --bind -- "$share" "$share"
		say "bound $share onto itself (containers bind it with rslave propagation)"
	fi
	if ! is_shared "$share"; then
		mount --make-shared -- "$share"
		say "made $share a shared mount"
	fi
	clean "$mp"
	if is_mount "$mp"; then
		say "$mp is mounted already; not guarding it"
	else
		if [ ! -d "$mp" ]; then
			mkdir -m 0755 -- "$mp"
			say "created $mp"
		fi
		guard "$mp"
	fi
	[ -n "$link" ] || return 0
	if [ -L "$link" ]; then
		[ "$(readlink -- "$link")" = "$mp" ] && return 0
		ln -sfn -- "$mp" "$link"
		say "pointed the symlink $link to $mp"
		return 0
	fi
	if [ -e "$link" ]; then
		is_mount "$link" &&
			die "$link is a mount point (lockfs mounted there by an older setup?):" \
			    "unmount it first (umount $link), then run this again"
		[ -d "$link" ] || die "$link exists and is not a directory: move it away first"
		[ -z "$(ls -A -- "$link")" ] || die "$link is a non-empty directory: move it away first"
		# An older setup guarded the directory itself.
		chattr -i -- "$link" 2>/dev/null || true
		rmdir -- "$link"
		say "removed the empty directory $link"
	fi
	ln -s -- "$mp" "$link"
	say "created the symlink $link -> $mp"
}

case ${1:-} in
prepare) [ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $prog prepare MOUNTPOINT [LINK]"
	 shift; prepare "$@" ;;
clean)	 [ $# -eq 2 ] || die "usage: $prog clean MOUNTPOINT"
	 clean "$2" ;;
*)	 die "usage: $prog prepare MOUNTPOINT [LINK] | clean MOUNTPOINT" ;;
esac
