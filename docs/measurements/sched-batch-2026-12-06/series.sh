#!/bin/bash
# from a checkout with sched_batch.patch applied (git apply); OUT: a folder for the results
cd "$(git rev-parse --show-toplevel)"; OUT=${OUT:-series}; mkdir -p "$OUT"
for i in 1 2 3 4 5; do
  for mode in normal batch; do
    if [ $mode = normal ]; then ov="run.sched_batch=false"; else ov=""; fi
    python3 docs/measurements/sched-batch-2026-12-06/niv.py 100 > $OUT/niv_${mode}_$i.json &
    .venv/bin/compassplay run $ov > $OUT/run_${mode}_$i.log 2>&1
    wait
    d=$(ls -td runs/*/ | head -1)
    cp $d/metrics.jsonl $OUT/metrics_${mode}_$i.jsonl
    rm -rf runs/*
  done
done
echo done > $OUT/DONE
