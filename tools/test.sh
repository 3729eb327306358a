#!/bin/bash
# Run the whole test suite (unit + real-mount integration tests), as root.
# BUILD names the build dir (default build); extra args go to meson setup.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
command -v meson >/dev/null && command -v pytest-3 >/dev/null && pkg-config --exists fuse3 jansson cmocka libcurl && command -v clang etcd >/dev/null \
	|| tools/deps.sh
[ -d "$build" ] || meson setup "$build" "$@"
meson compile -C "$build"
meson test -C "$build" --print-errorlogs
