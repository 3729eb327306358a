#!/bin/bash
# Install every Debian 12 package lockfs needs to build, run and test: the
# whole of tools/packages.txt (the one list; tools/setup.sh installs only
# the missing build and run ones).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t packages < <(sed 's/#.*//' tools/packages.txt | awk 'NF == 2 { print $2 }')
[ ${#packages[@]} -gt 0 ] || { echo "deps: tools/packages.txt lists no package" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${packages[@]}"
# etcd-server enables etcd.service, which starts on 2379/2380 on a systemd
# host.  lockfs's tests never use it: they start their own etcd on other
# loopback ports (tests/fixtures/etcd_fixtures.py) and leave it alone.
