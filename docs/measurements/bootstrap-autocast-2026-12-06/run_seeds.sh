#!/bin/bash
cd "$(git rev-parse --show-toplevel)"; OUT=${OUT:-docs/measurements/bootstrap-autocast-2026-12-06/seeds}; mkdir -p "$OUT"
for s in 0 1 2 3; do
  for arm in none auto; do
    out=$(mktemp -d)
    /usr/bin/time -f "%e" -o $OUT/time_${arm}_$s.txt .venv/bin/compassplay run --executor local run.seed=$s pipeline.steps=2 logging.progress=false bootstrap.autocast=$arm run.output_dir=$out run.name=s$s > $OUT/log_${arm}_$s.txt 2>&1
    cp $out/s$s/metrics.jsonl $OUT/metrics_${arm}_$s.jsonl
    rm -rf $out
  done
done
echo done > $OUT/DONE
