#!/bin/bash
# Configure a meson build dir, whatever state an earlier run left it in:
#
#   tools/configure.sh BUILD [MESON-SETUP-ARGS...]
#
# A complete build dir (meson-private/coredata.dat and build.ninja) is
# reconfigured with the args given (and wiped and set up again if that
# fails, e.g. after a meson upgrade); one that meson set up only halfway
# (coredata.dat but no build.ninja: setup was interrupted) is wiped; any
# other (none, or what a failed `meson setup` left) is set up afresh.  A
# build dir is never trusted because it exists.  meson's output is shown.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: tools/configure.sh BUILD [MESON-SETUP-ARGS...]}
shift
if [ -f "$build/meson-private/coredata.dat" ] && [ -f "$build/build.ninja" ]; then
	meson setup --reconfigure "$build" "$@" || {
		printf 'configure: reconfiguring %s failed (above): wiping it and setting it up again\n' "$build" >&2
		meson setup --wipe "$build" "$@"
	}
elif [ -f "$build/meson-private/coredata.dat" ]; then
	printf 'configure: %s was set up halfway (no build.ninja): wiping it\n' "$build" >&2
	meson setup --wipe "$build" "$@"
else
	meson setup "$build" "$@"
fi
