#!/bin/bash
# Install the Debian 12 packages lockfs needs to build, run and test.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends \
	gcc libc6-dev pkg-config meson ninja-build \
	libfuse3-dev fuse3 libjansson-dev libunistring-dev \
	libcmocka-dev python3 python3-pytest \
	python3-filelock python3-fasteners python3-portalocker \
	util-linux passwd procps strace busybox-static e2fsprogs \
	clang libclang-rt-14-dev \
	libcurl4-openssl-dev etcd-server etcd-client openssl \
	libsystemd-dev systemd groff-base podman runc \
	logrotate
# etcd-server enables etcd.service, which starts on 2379/2380 on a systemd
# host.  lockfs's tests never use it: they start their own etcd on other
# loopback ports (tests/integration/etcd_fixtures.py) and leave it alone.
