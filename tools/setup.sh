#!/bin/bash
# Set up and run lockfs on a fresh Debian 12 machine (as root):
# install packages, build, install lockfs and lockctl (/usr/local), and
# mount MOUNTPOINT (default /locks) with the embedded default backing dir
# (/run/lockfs).
set -euo pipefail
cd "$(dirname "$0")/.."
mnt=${1:-/locks}
tools/deps.sh
[ -d build ] || meson setup build
meson compile -C build
meson install -C build --quiet
mkdir -p "$mnt"
if grep -q " $mnt fuse.lockfs " /proc/mounts; then
	echo "lockfs: $mnt is already mounted"
else
	build/lockfs -o allow_other "$mnt"
	echo "lockfs: mounted on $mnt (backing dir /run/lockfs); unmount with: fusermount3 -u $mnt"
fi
echo "lockfs: lockctl is installed (try: lockctl status; man lockctl)"
