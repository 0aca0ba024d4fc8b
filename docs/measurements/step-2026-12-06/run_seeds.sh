#!/usr/bin/env bash
# The default job, 2 steps, local executor, for each seed given, run from checkout CHECKOUT
# (default: this one) and saved as arm ARM: metrics into seeds/metrics_${ARM}_seedS.jsonl
# beside this script. `before` is commit 140c4d9 (this session's start) in a worktree:
#   git worktree add /tmp/before 140c4d9
#   for s in 0 1 2 3; do ARM=before CHECKOUT=/tmp/before ./run_seeds.sh $s; ARM=after ./run_seeds.sh $s; done
# SEEDS_DIR: where the metrics go (default: seeds/ beside this script); EXTRA: more overrides.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
checkout="${CHECKOUT:-$(cd "$here/../../.." && pwd)}"
seeds="${SEEDS_DIR:-$here/seeds}"
mkdir -p "$seeds"
for s in "$@"; do
  out="$(mktemp -d)"
  (cd "$checkout" && PYTHONPATH="$checkout" python -m compassplay.cli run --executor local \
    run.seed="$s" pipeline.steps=2 logging.progress=false run.output_dir="$out" \
    run.name=s"$s" ${EXTRA:-} > "$out/log.txt" 2>&1)
  cp "$out/s$s/metrics.jsonl" "$seeds/metrics_${ARM}_seed$s.jsonl"
  grep -h "decoding in\|autocast" "$out/log.txt" | head -4 || true
  rm -rf "$out"
done
