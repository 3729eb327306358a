#!/bin/bash
# Install the Debian 12 packages lockfs needs to build, run and test.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends \
	gcc libc6-dev pkg-config meson ninja-build \
	libfuse3-dev fuse3 libjansson-dev \
	libcmocka-dev python3 python3-pytest \
	python3-filelock python3-fasteners python3-portalocker \
	util-linux passwd procps strace busybox-static \
	clang libclang-rt-14-dev \
	logrotate
