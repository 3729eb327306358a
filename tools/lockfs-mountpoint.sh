#!/bin/sh
# lockfs-mountpoint: make a lockfs mount point that containers can follow
# across daemon restarts, and clear the dead mount a crashed daemon left.
#
#   lockfs-mountpoint prepare MOUNTPOINT [LINK]
#   lockfs-mountpoint clean MOUNTPOINT
#   lockfs-mountpoint remove [MOUNTPOINT [LINK]]
#   lockfs-mountpoint start
#   lockfs-mountpoint stop
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
#   alone, and so is one whose connection systemd's descriptor store keeps
#   for the next daemon (BACKING/.lockfs-kept names its device).  The systemd unit runs this after the daemon stops (ExecStopPost).
# remove: undo prepare once nothing serves MOUNTPOINT: LINK (if it is a
#   symlink to MOUNTPOINT), the guarded MOUNTPOINT (chattr -i, rmdir), and
#   the bind mount of its parent (unless another lock tree is mounted
#   there), then the parent itself if it is empty.  Without arguments, the
#   layout of start (the unit's settings).  Removing the Debian package runs
#   this.
# start: what lockfs.service does, on a machine without systemd: read the
#   unit's settings (LOCKFS_SHARE, LOCKFS_NAME, LOCKFS_LINK, LOCKFS_BACKING,
#   LOCKFS_OPTIONS; defaults as in the unit, then /etc/default/lockfs),
#   prepare, and start lockfs detached; it returns once /locks serves.
#   A daemon already serving the backing dir is left alone.
# stop: stop the daemon that start started (the pid in BACKING/.lockfs):
#   SIGTERM, wait until it has exited (at most 10 s), clear a dead mount.
#
# Every change is said on stdout; errors are one line on stderr, exit 1.
# LOCKFS names the lockfs binary (default: the installed one);
# LOCKFS_DEFAULTS the settings file of start and stop (/etc/default/lockfs).
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
	is_mount "$1" || return 1
	if is_kept_mount "$1"; then
		# Kept: a stat waits for the next daemon (and is cut short here),
		# where a dead connection (the store let go, or never took it)
		# fails at once.
		rc=0
		timeout 0.2 stat -- "$1" >/dev/null 2>&1 || rc=$?
		[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
		return
	fi
	! timeout 5 stat -- "$1" >/dev/null 2>&1
}

# Is the topmost mount on PATH a lockfs connection that the service
# manager's descriptor store keeps for the next daemon (a restart or an
# upgrade under way)?  The daemon notes the mount's device in
# BACKING/.lockfs-kept (the backing dir is the mount's source) while the
# store holds it.  Not dead then, only waiting: a stat would wait with it.
is_kept_mount() {
	kept=$(E=$(escape "$1") awk '$5 == ENVIRON["E"] {
		for (i = 7; i <= NF && $i != "-"; i++) ;
		dev = $3; type = $(i + 1); src = $(i + 2)
	} END { if (type == "fuse.lockfs") print dev " " src }' /proc/self/mountinfo)
	[ -n "$kept" ] || return 1
	dev=${kept%% *} src=${kept#* }
	[ -r "$src/.lockfs-kept" ] && [ "$(cat -- "$src/.lockfs-kept")" = "$dev" ]
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

# Undo prepare.  Only what prepare makes is removed: a symlink that points
# elsewhere, a non-empty directory and a parent that is a mount of its own
# (not a bind of itself) are left, and said.
remove() {
	mp=$1 link=${2:-}
	case $mp in /*) ;; *) die "MOUNTPOINT must be an absolute path: $mp" ;; esac
	share=$(dirname -- "$mp")
	if [ -d "$share" ]; then
		share=$(realpath -- "$share")
		mp=$share/$(basename -- "$mp")
		clean "$mp"
		is_mount "$mp" &&
			die "$mp is mounted (a lockfs daemon serves it): stop it first" \
			    "(systemctl stop lockfs, or lockfs-mountpoint stop)"
	fi
	if [ -n "$link" ] && [ -L "$link" ]; then
		if [ "$(readlink -- "$link")" = "$mp" ]; then
			rm -f -- "$link"
			say "removed the symlink $link"
		else
			say "left the symlink $link: it points to $(readlink -- "$link"), not $mp"
		fi
	fi
	[ -d "$share" ] || return 0
	if [ -d "$mp" ]; then
		# The guard: immutable, so rmdir needs the flag off first.
		chattr -i -- "$mp" 2>/dev/null || true
		rmdir -- "$mp" || die "cannot remove $mp (see the line above)"
		say "removed the guarded mount point $mp"
	fi
	if is_mount "$share"; then
		# prepare binds the parent onto itself: such a mount's root (field 4
		# of mountinfo) is a directory inside its file system, not "/".
		if ! E=$(escape "$share") awk '$5 == ENVIRON["E"] && $4 != "/" { b = 1 }
				END { exit !b }' /proc/self/mountinfo; then
			say "left $share mounted: it is a file system of its own, not prepare's bind mount"
			return 0
		fi
		if E=$(escape "$share")/ awk 'index($5, ENVIRON["E"]) == 1 { m = 1 }
				END { exit !m }' /proc/self/mountinfo; then
			say "left the bind mount $share: another lock tree is mounted under it"
			return 0
		fi
		umount -- "$share" || die "cannot unmount $share (see the line above)"
		say "unmounted the bind mount $share"
	fi
	if rmdir -- "$share" 2>/dev/null; then
		say "removed $share"
	else
		say "left $share: it is not empty"
	fi
}

# start and stop: the unit's settings, as systemd would give them.
settings() {
	LOCKFS_SHARE=@share@ LOCKFS_NAME=locks LOCKFS_LINK=/locks
	LOCKFS_BACKING=/run/lockfs LOCKFS_OPTIONS=allow_other
	defaults=${LOCKFS_DEFAULTS:-/etc/default/lockfs}
	# KEY=VALUE lines, as systemd's EnvironmentFile= reads them.
	# shellcheck disable=SC1090
	[ ! -f "$defaults" ] || . "$defaults"
	mp=$LOCKFS_SHARE/$LOCKFS_NAME
}

# The pid of the live lockfs daemon serving the backing dir, or nothing.
daemon_pid() {
	pid=$(cat -- "$LOCKFS_BACKING/.lockfs" 2>/dev/null) || return 0
	case $pid in ''|*[!0-9]*) return 0 ;; esac
	[ "$(cat "/proc/$pid/comm" 2>/dev/null)" = lockfs ] && echo "$pid"
	return 0
}

start() {
	settings
	pid=$(daemon_pid)
	if [ -n "$pid" ]; then
		say "lockfs is running already on $mp (backing dir $LOCKFS_BACKING), pid $pid"
		return 0
	fi
	prepare "$mp" "$LOCKFS_LINK"
	# As the unit's RuntimeDirectory= makes /run/lockfs: mode 0700, for its
	# owner.json files name the holders.
	if [ ! -d "$LOCKFS_BACKING" ]; then
		mkdir -p -m 0700 -- "$LOCKFS_BACKING"
		say "created the backing dir $LOCKFS_BACKING"
	fi
	# Detached: it returns once the mount serves, or with its error line.
	"$LOCKFS" -o "backing=$LOCKFS_BACKING,$LOCKFS_OPTIONS" "$mp" ||
		die "lockfs did not start (see the line above)"
	say "started lockfs on $mp (backing dir $LOCKFS_BACKING), pid $(daemon_pid)"
}

stop() {
	settings
	pid=$(daemon_pid)
	if [ -z "$pid" ]; then
		clean "$mp"
		say "no lockfs daemon serves $LOCKFS_BACKING"
		return 0
	fi
	kill -TERM "$pid" || die "cannot signal lockfs (pid $pid)"
	# The daemon unmounts and exits within its stop bound: wait for that,
	# so that whoever runs this next (a new start, a removal) finds it gone.
	i=0
	while [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = lockfs ]; do
		[ $i -lt 100 ] || die "lockfs (pid $pid) has not exited 10 s after SIGTERM"
		sleep 0.1
		i=$((i + 1))
	done
	clean "$mp"
	say "stopped lockfs on $mp (pid $pid)"
}

case ${1:-} in
prepare) [ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $prog prepare MOUNTPOINT [LINK]"
	 shift; prepare "$@" ;;
clean)	 [ $# -eq 2 ] || die "usage: $prog clean MOUNTPOINT"
	 clean "$2" ;;
remove)	 [ $# -le 3 ] || die "usage: $prog remove [MOUNTPOINT [LINK]]"
	 shift
	 if [ $# -eq 0 ]; then settings; remove "$mp" "$LOCKFS_LINK"; else remove "$@"; fi ;;
start)	 [ $# -eq 1 ] || die "usage: $prog start"
	 start ;;
stop)	 [ $# -eq 1 ] || die "usage: $prog stop"
	 stop ;;
*)	 die "usage: $prog prepare MOUNTPOINT [LINK] | clean MOUNTPOINT |" \
	     "remove [MOUNTPOINT [LINK]] | start | stop" ;;
esac
