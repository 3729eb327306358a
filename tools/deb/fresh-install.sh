#!/bin/bash
# Install a lockfs .deb on a brand-new Debian 12, use it, purge it:
#
#   tools/deb/fresh-install.sh DEB
#
# In a copy of a minbase Debian 12 root file system (made once with
# `mmdebstrap --variant=minbase bookworm` and cached in
# $LOCKFS_DEB_ROOT_CACHE, default /var/cache/lockfs-deb-root, one per ISO
# week), run as a privileged podman container with /dev/fuse and the host's
# network, without systemd: apt-get update; apt-get install ./DEB (timed);
# the command postinst names (lockfs-mountpoint start); mkdir, cat owner,
# rmdir on /locks; apt-get purge lockfs; then check that no mount, guard,
# symlink, unit, setting or backing dir is left; then the same install and
# purge as where systemd runs the machine (a stand-in systemctl that records
# what the maintainer scripts ask of it).  Each step is said; the
# last line is "fresh-install: OK" and the exit status 0 when all held.
# Needs root, mmdebstrap, podman and runc.  Exits 77 when podman cannot
# run a container here (inside some containers), after saying why.
set -euo pipefail
say() { printf 'fresh-install: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

[ $# -eq 1 ] && [ -f "$1" ] || die "usage: tools/deb/fresh-install.sh DEB"
deb=$(realpath -- "$1")
[ "$(id -u)" = 0 ] || die "run this as root (mmdebstrap, a privileged container)"
for tool in mmdebstrap podman runc; do
	command -v "$tool" >/dev/null || die "$tool is missing: apt-get install mmdebstrap podman runc"
done

cache=${LOCKFS_DEB_ROOT_CACHE:-/var/cache/lockfs-deb-root}
pristine=$cache/$(date +%G-W%V)
mkdir -p -- "$cache"
if [ ! -d "$pristine" ]; then
	# Made beside and renamed once whole: an interrupted run is never used.
	rm -rf -- "$pristine.new"
	say "making a minbase Debian 12 root in $pristine (mmdebstrap, a few minutes)"
	mmdebstrap --variant=minbase bookworm "$pristine.new"
	mv -- "$pristine.new" "$pristine"
	for old in "$cache"/*; do
		[ "$old" = "$pristine" ] || rm -rf -- "$old"
	done
fi

run=$(mktemp -d /var/tmp/lockfs-deb-run.XXXXXX)
cleanup() {
	# A failed run may leave the guard immutable (chattr +i).
	rm -rf -- "$run" 2>/dev/null || { chattr -R -f -i -- "$run" || true; rm -rf -- "$run"; }
}
trap cleanup EXIT
cp -a --reflink=auto -- "$pristine" "$run/root"
cp -- "$deb" "$run/root/tmp/"

# In the container: what a new user types, then the checks.
cat >"$run/root/tmp/scenario.sh" <<'SCENARIO'
set -eu
say() { printf 'fresh-install: %s\n' "$*"; }
export DEBIAN_FRONTEND=noninteractive
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
t=$(now); apt-get update -q >/tmp/update.log 2>&1 || { cat /tmp/update.log; exit 1; }
say "apt-get update took $(took "$t") s"
cd /tmp
t=$(now); apt-get install -y -q ./lockfs_*.deb
say "apt-get install ./lockfs_*.deb took $(took "$t") s"
t=$(now); lockfs-mountpoint start
say "lockfs-mountpoint start took $(took "$t") s"
mkdir /locks/x
cat /locks/x/owner | grep '"resource": "x"'
rmdir /locks/x
lockctl status
apt-get purge -y -q lockfs
left=
grep -q ' fuse.lockfs \| /srv/lockfs ' /proc/self/mountinfo && left="$left mounts"
for p in /locks /srv/lockfs /run/lockfs /var/lib/lockfs /etc/default/lockfs \
	/etc/logrotate.d/lockfs /lib/systemd/system/lockfs.service /usr/bin/lockfs; do
	[ -e "$p" ] || [ -L "$p" ] && left="$left $p"
done
found=$(find /etc /lib/systemd /usr/lib/systemd /var/lib/systemd -name '*lockfs*' 2>/dev/null || true)
[ -z "$found" ] || left="$left $found"
[ -z "$left" ] || { say "left behind after purge:$left"; grep lockfs /proc/self/mountinfo || true; exit 1; }
say "purge left nothing behind"

# The same package where systemd runs the machine.  There is no systemd
# in the container, so this part stands in for it: /run/systemd/system
# (how the maintainer scripts, and deb-systemd-invoke, tell that systemd
# runs the machine) and a systemctl that only records what it is asked.
# What is checked is the scripts' side: the unit enabled and started on
# install, stopped before removal, its enablement gone after purge.
mkdir -p /run/systemd/system
# (is-enabled answers "enabled": deb-systemd-helper made the links that say so)
printf '#!/bin/sh\necho "$*" >>/tmp/systemctl.log\ncase " $* " in *" is-enabled "*) echo enabled ;; esac\nexit 0\n' \
	>/usr/bin/systemctl
chmod 755 /usr/bin/systemctl
wants=/etc/systemd/system/multi-user.target.wants/lockfs.service
apt-get install -y -q ./lockfs_*.deb >/tmp/install2.log 2>&1 || { cat /tmp/install2.log; exit 1; }
grep -q 'start lockfs.service' /tmp/systemctl.log || { say "under systemd, install did not start lockfs.service:"; cat /tmp/systemctl.log; exit 1; }
# deb-systemd-helper enables through systemctl when it finds one (preset),
# else by making the link itself.
[ -L "$wants" ] || grep -q 'preset lockfs.service\|enable lockfs.service' /tmp/systemctl.log ||
	{ say "under systemd, install did not enable lockfs.service:"; cat /tmp/systemctl.log; exit 1; }
say "under systemd: install enabled and started lockfs.service"
apt-get purge -y -q lockfs >/tmp/purge2.log 2>&1 || { cat /tmp/purge2.log; exit 1; }
grep -q 'stop lockfs.service' /tmp/systemctl.log || { say "under systemd, removal did not stop lockfs.service:"; cat /tmp/systemctl.log; exit 1; }
found=$(find /etc/systemd /lib/systemd /var/lib/systemd -name '*lockfs*' 2>/dev/null || true)
[ -z "$found" ] || { say "under systemd, purge left: $found"; exit 1; }
say "under systemd: removal stopped lockfs.service, purge left no unit or enablement"
SCENARIO

podman_run() {
	podman run --rm --runtime=runc \
		--ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
		--privileged --device /dev/fuse --network=host \
		--rootfs "$run/root" "$@"
}
if ! err=$(podman_run true 2>&1); then
	say "podman cannot run a container here: $err"
	exit 77
fi

say "installing $(basename -- "$deb") in a fresh minbase Debian 12 root"
# The scenario's shell holds the lock: not the container's pid 1, which
# lockfs never takes as a holder (docs/holder.md).
podman_run sh -c 'sh /tmp/scenario.sh; exit $?'

say OK
