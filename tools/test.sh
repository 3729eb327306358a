#!/bin/bash
# Run the whole test suite (unit + real-mount integration tests), as root.
# BUILD names the build dir (default build); extra args go to meson setup.
# The packages of tools/packages.txt that are missing are installed first
# (tools/deps.sh), and the build dir is configured whatever state an
# earlier, perhaps interrupted, run left it in (tools/configure.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
missing=
for pkg in $(sed 's/#.*//' tools/packages.txt | awk 'NF == 2 { print $2 }'); do
	# dpkg-query fails for a package it never heard of: "missing" too.
	status=$(dpkg-query -W -f='${Status}' "$pkg" 2>&1) || true
	[ "$status" = "install ok installed" ] || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
	echo "test: installing the missing packages:$missing"
	tools/deps.sh
fi
tools/configure.sh "$build" "$@"
meson compile -C "$build"
meson test -C "$build" --print-errorlogs
