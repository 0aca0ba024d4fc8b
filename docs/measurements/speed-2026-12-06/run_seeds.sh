#!/usr/bin/env bash
# The default job, 2 steps, local executor, for each seed given, with learner.autocast=LEARN
# (none | auto; decode_dtype stays the default's auto): metrics into
# seeds/metrics_learn-${LEARN}_seedS.jsonl beside this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$here/seeds"
for s in "$@"; do
  out="$(mktemp -d)"
  compassplay run --executor local run.seed="$s" pipeline.steps=2 logging.progress=false \
    learner.autocast="${LEARN:-auto}" run.output_dir="$out" run.name=s"$s" > "$out/log.txt" 2>&1
  cp "$out/s$s/metrics.jsonl" "$here/seeds/metrics_learn-${LEARN:-auto}_seed$s.jsonl"
  grep -h "decoding in\|autocast" "$out/log.txt" | head -3 || true
  rm -rf "$out"
done
