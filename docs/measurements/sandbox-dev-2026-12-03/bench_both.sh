#!/bin/bash
# Issue 34: old code (c7ba736, a `git worktree` in /tmp/cp-old) and new code (/work/main)
# interleaved old, new, old, new per mode; the same .venv interpreter, the old package first on
# PYTHONPATH. Default bench size (3,000 runs, 4 workers, best of 3 per side).
# Run as `./bench_both.sh` (rounds 1-2, old first) and `ROUNDS=3 ORDER="new old" ./bench_both.sh`.
out=${OUT:-/tmp/dev34_bench}; mkdir -p "$out"
for round in ${ROUNDS:-1 2}; do
for mode in bwrap-userns bwrap-root; do
  for side in ${ORDER:-old new}; do
    dir=/work/main; [ $side = old ] && dir=/tmp/cp-old
    start=$(date -u +%H:%M:%S)
    (cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python -m compassplay.cli bench sandbox \
        --json --isolation $mode > "$out/${side}_${mode}_r$round.json" \
        2> "$out/${side}_${mode}_r$round.err")
    echo "$round $mode $side $start-$(date -u +%H:%M:%S) $(python3 -c "import json; d = json.load(open('$out/${side}_${mode}_r$round.json')); print(d['runs_per_s'], d['fork_per_run_unisolated_runs_per_s'], d['ratio_to_fork_per_run_unisolated'], round(d['cpu_s_per_run'] * 1e3, 3), d['loadavg_before'][0], d['loadavg_after'][0])" 2>&1 | tail -1)"
  done
done
done
