#!/usr/bin/env bash
# newcomer_proxy.sh LOG: `make run` in this checkout under the AVX2 stand-in (./env.sh), with
# an empty HOME and XDG cache (the venv kept), every line stamped with the seconds since start
set -uo pipefail
. "$(dirname "$0")/env.sh"
log="$1"; dir=$(mktemp -d)
repo="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
mkdir -p "$dir/home" "$dir/cache"
export HOME="$dir/home" XDG_CACHE_HOME="$dir/cache"
start=$(date +%s)
echo "start $(date +%T) $(git -C "$repo" rev-parse --short HEAD) proxy: $CC $ONEDNN_MAX_CPU_ISA" > "$log"
(cd "$repo" && timeout 1500 make run 2>&1) | while IFS= read -r line; do
  printf '%s +%ss %s\n' "$(date +%T)" "$(( $(date +%s) - start ))" "${line:0:400}"
done >> "$log"
echo "end +$(( $(date +%s) - start ))s" >> "$log"
