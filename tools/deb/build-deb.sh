#!/bin/sh
# Build the Debian package of lockfs: lockfs_VERSION_ARCH.deb.
#
#   tools/deb/build-deb.sh [BUILD_DIR [OUT_DIR]]
#
# BUILD_DIR (default build-deb) is a meson build dir of its own, configured
# for /usr with Debian's build flags (dpkg-buildflags, hardening=+all); it is
# made afresh each time, so a half-made one is never trusted.  The package
# goes to OUT_DIR (default BUILD_DIR) and its path is the last line printed.
# VERSION is meson.build's project version.  Needs dpkg-dev (dpkg-shlibdeps,
# dpkg-buildflags) and the build packages of tools/packages.txt.
#
# What is in it (docs/operations.md, "The Debian package"):
#   /usr/bin/lockfs, lockctl, lockctl-static; /usr/sbin/lockfs-mountpoint
#   /lib/systemd/system/lockfs.service, lockfs@.service
#   /usr/share/man/man8/lockfs.8.gz, man1/lockctl.1.gz
#   /etc/logrotate.d/lockfs (a conffile)
#   /usr/share/doc/lockfs/: README.md, docs/*.md, changelog.gz, copyright
# Depends: dpkg-shlibdeps on the binaries, and the "run" packages of
# tools/packages.txt (less those that are Essential: always there).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-build-deb}
say() { printf 'build-deb: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

for tool in dpkg-deb dpkg-shlibdeps dpkg-buildflags meson; do
	command -v "$tool" >/dev/null ||
		die "$tool is missing: apt-get install dpkg-dev meson (see tools/packages.txt)"
done
case $build in /*) ;; *) build=$PWD/$build ;; esac
out=${2:-$build}
mkdir -p -- "$out"
out=$(cd "$out" && pwd)

# A fresh build dir: only a meson build dir (or an empty one) is wiped.
if [ -e "$build" ]; then
	[ -d "$build/meson-private" ] || [ -z "$(ls -A -- "$build")" ] ||
		die "$build exists and is not a meson build dir: name another BUILD_DIR"
	rm -rf -- "$build"
fi
export DEB_BUILD_MAINT_OPTIONS=hardening=+all
CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
# --as-needed: lockctl names libm, which it may not use.
LDFLAGS="$(dpkg-buildflags --get LDFLAGS) -Wl,--as-needed"
export CFLAGS LDFLAGS
# buildtype=plain: the flags are dpkg-buildflags', as Debian's own builds.
# Units in /lib/systemd/system: where Debian 12's systemd packages put them.
meson setup "$build" "$src" --prefix=/usr --buildtype=plain \
	-Dsystemdunitdir=/lib/systemd/system -Dsystemd=enabled \
	-Dstatic_lockctl=enabled -Detcd=enabled >"$build.setup.log" 2>&1 ||
	{ cat -- "$build.setup.log" >&2; die "meson setup failed (above)"; }
rm -f -- "$build.setup.log"
# Only what is installed: the test programs are not needed here.
meson compile -C "$build" lockfs lockctl lockctl-static >&2
version=$(meson introspect --projectinfo "$build" |
	/usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
arch=$(dpkg --print-architecture)

# The package's tree, where dpkg-shlibdeps looks for it: PKG/debian/lockfs.
pkg=$build/deb
root=$pkg/debian/lockfs
rm -rf -- "$pkg"
meson install -C "$build" --no-rebuild --strip --destdir "$root" >/dev/null
# As Debian's dh_strip: the compiler's .comment and .note sections are noise.
for bin in "$root"/usr/bin/*; do
	strip --remove-section=.comment --remove-section=.note -- "$bin"
done

# Man pages: compressed, as Debian keeps them (-n: no name or time inside,
# so the same tree gives the same package).
find "$root/usr/share/man" -type f -exec gzip -9n {} +
# The programs documented in another program's page (its NAME line says so).
ln -s lockctl.1.gz "$root/usr/share/man/man1/lockctl-static.1.gz"
ln -s lockfs.8.gz "$root/usr/share/man/man8/lockfs-mountpoint.8.gz"

doc=$root/usr/share/doc/lockfs
install -d -m 0755 "$doc/docs"
install -m 0644 "$src/README.md" "$doc/"
# docs/*.md beside README.md as in the tree, so that its links work;
# docs/design/ holds plans for developers, not users.
install -m 0644 "$src"/docs/*.md "$doc/docs/"
# The years of the tree's first and last commits (the year of the build
# outside git).
years=$(git -C "$src" log --format=%cd --date=format:%Y 2>/dev/null | sort -u |
	sed -n '1h; $!d; x; G; s/\n/-/; s/^\(.*\)-\1$/\1/; p') || true
[ -n "$years" ] || years=$(date +%Y)
sed "s/@YEARS@/$years/" "$here/copyright" >"$doc/copyright"
chmod 0644 "$doc/copyright"
install -d -m 0755 "$root/usr/share/lintian/overrides"
install -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/lockfs"

maintainer=${LOCKFS_DEB_MAINTAINER:-lockfs maintainers <maintainers@users.noreply.a-seed-dfeafe90.example>}
# The date of the tree's last commit, so that rebuilding the same commit
# gives the same changelog (and now, outside git).
when=$(git -C "$src" log -1 --format=%cD 2>/dev/null) || when=$(date -R)
# A version without a Debian revision is a native package: changelog.gz.
{
	printf 'lockfs (%s) unstable; urgency=medium\n\n' "$version"
	printf '  * Built from the lockfs source tree, version %s.\n' "$version"
	printf '    See /usr/share/doc/lockfs/README.md.\n\n'
	printf ' -- %s  %s\n' "$maintainer" "$when"
} | gzip -9n >"$doc/changelog.gz"

# Depends.  dpkg-shlibdeps wants a debian/control to read: give it one.
printf 'Source: lockfs\n\nPackage: lockfs\nArchitecture: any\n' >"$pkg/debian/control"
# lockctl-static links nothing at run time: no libraries to depend on.
shlibs=$(cd "$pkg" && dpkg-shlibdeps -O -e"$root/usr/bin/lockfs" -e"$root/usr/bin/lockctl") ||
	die "dpkg-shlibdeps failed (above)"
shlibs=${shlibs#shlibs:Depends=}
run=
for pkg in $(awk '$1 == "run" { print $2 }' "$src/tools/packages.txt"); do
	# Essential packages are on every Debian system, and Debian's policy
	# (lintian: depends-on-essential-package-without-using-version) says
	# not to name them.  Asked of this machine's dpkg, which has them all.
	[ "$(dpkg-query -W -f='${Essential}' "$pkg" 2>/dev/null)" = yes ] && continue
	run="$run, $pkg"
done
depends="$shlibs$run"

install -d -m 0755 "$root/DEBIAN"
for script in postinst prerm postrm; do
	install -m 0755 "$here/$script" "$root/DEBIAN/$script"
done
# Every file under /etc is a conffile: dpkg keeps the admin's edits.
(cd "$root" && find etc -type f | sed 's|^|/|' | sort) >"$root/DEBIAN/conffiles"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' |
	sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: lockfs
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Depends: $depends
Suggests: logrotate
Section: admin
Priority: optional
Description: named locks as directories (a FUSE file system)
 lockfs serves a lock tree, /locks: mkdir /locks/NAME takes the lock NAME,
 rmdir releases it, and /locks/NAME/owner says who holds it (JSON).  Locks
 belong to processes: a holder that dies loses its lock, which is recorded
 in an audit log.  flock(1) on /locks/.flock/NAME waits for a lock.
 .
 This package has the daemon (lockfs), its client (lockctl, also statically
 linked as lockctl-static for container images), the systemd units and the
 documentation.  With systemd, lockfs.service is enabled and started;
 without it, "lockfs-mountpoint start" starts lockfs.
CONTROL
# Installed-Size's figure is what dpkg counts; the rest is ownership and
# modes: root:root, no group or other write anywhere.
chmod -R go-w "$root"
deb=$out/lockfs_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
echo "$deb"
