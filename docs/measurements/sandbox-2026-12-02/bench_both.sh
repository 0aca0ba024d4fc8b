#!/bin/bash
# old (26e167c) and new (HEAD) code back to back, both modes; default runs/workers/repeats
out=/tmp/bench_out; mkdir -p $out
for round in 1 2; do
for mode in bwrap-userns bwrap-root; do
  for side in old new; do
    dir=/work/main; [ $side = old ] && dir=/tmp/bench-old
    (cd $dir && /tmp/fresh/.venv/bin/python -m compassplay.cli bench sandbox --json --isolation $mode > $out/${side}_${mode}_r$round.json 2> $out/${side}_${mode}_r$round.err)
    echo "$round $mode $side $(python3 -c "import json;d=json.load(open('$out/${side}_${mode}_r$round.json'));print({k:d[k] for k in d if isinstance(d[k],(int,float))})" 2>&1 | cut -c1-400) load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
done
