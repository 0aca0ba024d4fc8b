#!/usr/bin/env bash
# The default job, 2 steps, local executor, seeds given as arguments, with the decode dtype
# DECODE (auto | model): metrics into seeds/metrics_${DECODE}_seedS.jsonl beside this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$here/seeds"
for s in "$@"; do
  out="$(mktemp -d)"
  compassplay run --executor local run.seed="$s" pipeline.steps=2 logging.progress=false \
    proposer.decode_dtype="${DECODE:-auto}" solver.decode_dtype="${DECODE:-auto}" \
    run.output_dir="$out" run.name=s"$s" > "$out/log.txt" 2>&1
  cp "$out/s$s/metrics.jsonl" "$here/seeds/metrics_${DECODE:-auto}_seed$s.jsonl"
  grep -h "decoding in" "$out/log.txt" "$out/s$s"/*.log 2>/dev/null | head -2 || true
  rm -rf "$out"
done
