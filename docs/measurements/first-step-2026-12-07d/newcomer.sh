#!/usr/bin/env bash
# newcomer.sh REV LOG: a fresh clone of this repository at REV, `make run` with an empty HOME
# and XDG cache (so an empty pip cache and model cache), every output line stamped with the
# seconds since the start; written to LOG.
set -euo pipefail
rev="$1"; log="$2"
repo="$(git rev-parse --show-toplevel)"
dir="$(mktemp -d)"
git clone -q "$repo" "$dir/clone" && git -C "$dir/clone" checkout -q "$rev"
export HOME="$dir/home" XDG_CACHE_HOME="$dir/cache"
mkdir -p "$HOME" "$XDG_CACHE_HOME"
start=$(date +%s)
echo "start $(date +%T) $rev" > "$log"
(cd "$dir/clone" && make run 2>&1) | while IFS= read -r line; do
  printf '%s +%ss %s\n' "$(date +%T)" "$(( $(date +%s) - start ))" "${line:0:400}"
done >> "$log"
rm -rf "$dir"
