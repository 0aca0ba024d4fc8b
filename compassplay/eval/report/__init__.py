"""`compassplay report RUN_DIR [RUN_DIR ...] [--baseline ARM] [--group-by name|reward] --out DIR`

Writes into DIR: report.md (tables and notes a person can read without opening JSON),
summary.json (the same numbers), and PNG figures: accuracy against step and against
cumulative compute, reward distributions and distinct reward values per batch (eligible
candidates), the reference loss against step and compute, Lean coverage, copy and rename
rates. A figure whose fields are missing is skipped with a note in report.md.

Tables follow the paper: per benchmark, each run's mean accuracy over the final quarter of its
training (eval records with step >= 3/4 of the run's last step), then the mean over the arm's
runs (seeds) +- the sample s.d.; a domain Mean column (the mean of the run's benchmarks, then
over seeds); a "Base model" row from step-0 evaluations when there are any; and the gain of
each arm over the `--baseline` arm. Each arm is also compared with the baseline paired by seed
(`compassplay.eval.paired`: per-seed differences, a bootstrap interval, a sign-flip p and the
smallest p its number of seeds allows), on every benchmark, the Mean and every logged curve.
Arms: see `compassplay.eval.report.data`.
"""

from compassplay.eval.report.build import add_arguments, build_report, run

__all__ = ["add_arguments", "build_report", "run"]
