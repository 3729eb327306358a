#!/bin/bash
# Fuzz the record parser with libFuzzer for a bounded time (default 20 s).
#   tests/fuzz/run.sh [SECONDS] [BUILD_DIR]
# Needs clang and libclang-rt-14-dev (tools/deps.sh installs them).
# Exit status: 0 when no crash was found; libFuzzer's status otherwise,
# with the crashing input left in BUILD_DIR/fuzz/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
secs=${1:-20}
out=${2:-$top/build}/fuzz
mkdir -p "$out/corpus"
cp -n "$here"/corpus/record/* "$out/corpus/" 2>/dev/null || true
clang -g -O1 -std=gnu11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=undefined -I"$top/include" -I"$top/core/base" \
	"$top"/core/base/record*.c "$top/core/base/utf8.c" "$top/core/base/clock.c" "$here/fuzz_record.c" \
	$(pkg-config --cflags --libs jansson) -o "$out/fuzz_record"
cd "$out"
./fuzz_record -max_total_time="$secs" -max_len=70000 -timeout=5 \
	-print_final_stats=1 corpus 2>&1 | tail -n 15
