#!/usr/bin/env bash
# The default job, 2 steps, for each seed given, with proposer/solver.decode_kernels=KERN
# (torch | c) and EXECUTOR (local | ray): metrics into
# seeds/metrics_${EXECUTOR}_${KERN}_seedS.jsonl beside this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$here/seeds"
kern="${KERN:-c}" executor="${EXECUTOR:-local}"
for s in "$@"; do
  out="$(mktemp -d)"
  compassplay run --executor "$executor" run.seed="$s" pipeline.steps=2 logging.progress=false \
    proposer.decode_kernels="$kern" solver.decode_kernels="$kern" \
    run.output_dir="$out" run.name=s"$s" > "$out/log.txt" 2>&1
  cp "$out/s$s/metrics.jsonl" "$here/seeds/metrics_${executor}_${kern}_seed$s.jsonl"
  grep -h "fused C kernels\|decoding in" "$out/log.txt" | head -2 || true
  rm -rf "$out"
done
