#!/usr/bin/env bash
# make run under the AVX2 proxy with an empty HOME and XDG cache (venv kept), lines stamped
set -uo pipefail
. "$(dirname "$0")/env.sh"
log="$1"; dir=$(mktemp -d)
rm -rf "$dir"; mkdir -p "$dir/home" "$dir/cache"
export HOME="$dir/home" XDG_CACHE_HOME="$dir/cache"
start=$(date +%s)
echo "start $(date +%T) $(git -C /work/main rev-parse --short HEAD) proxy: $CC $ONEDNN_MAX_CPU_ISA" > "$log"
(cd /work/main && timeout 1500 make run 2>&1) | while IFS= read -r line; do
  printf '%s +%ss %s\n' "$(date +%T)" "$(( $(date +%s) - start ))" "${line:0:400}"
done >> "$log"
echo "end +$(( $(date +%s) - start ))s" >> "$log"
