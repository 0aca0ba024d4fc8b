"""A run's files: resolved config, metrics.jsonl, samples.jsonl and the text log.

Every metrics.jsonl line also goes to the run's trackers (`rundir.tracking`: TensorBoard event
files in the run directory; wandb offline when asked for).

metrics.jsonl is the source of truth for plots; each line is one JSON object: a step line
(StepStats, no "kind" key) or another kind of line with a "kind" and a "step" (evaluation
results during training, see `compassplay.eval.eval_records`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import BaseModel

from compassplay.config import RunConfig, dump_config
from compassplay.errors import RunError
from compassplay.records import TIMING_FIELDS, StepStats
from compassplay.rundir.tracking import Trackers

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
CONFIG_FILE = "config.yaml"
LOG_FILE = "run.log"
LEAN_FLEET_FILE = "lean_fleet.jsonl"  # the Lean fleet's timeline (Ray executor)


def run_dir_for(cfg: RunConfig) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


class RunLog:
    """Appends StepStats to `<run_dir>/metrics.jsonl` (and to the trackers) and mirrors
    logging to `run.log`."""

    def __init__(self, run_dir: Path, cfg: RunConfig, resume: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        if not resume:
            if self.metrics_path.is_file() and self.metrics_path.stat().st_size > 0:
                raise RunError(f"{self.run_dir} holds another run's {METRICS_FILE}: a new run "
                               "never writes into it (resume it, or start in a fresh directory)")
            self.metrics_path.write_text("")
        (self.run_dir / CONFIG_FILE).write_text(dump_config(cfg))
        self.trackers = Trackers(self.run_dir, cfg)
        self._handler = logging.FileHandler(self.run_dir / LOG_FILE)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("compassplay").addHandler(self._handler)

    def write(self, stats: StepStats) -> None:
        self._append(stats)

    def write_line(self, row: BaseModel) -> None:
        """Append a line of another kind (it has "kind" and "step"), e.g. an eval result."""
        self._append(row)

    def _append(self, row: BaseModel) -> None:
        line = row.model_dump_json()
        with self.metrics_path.open("a") as f:
            f.write(line + "\n")
        self.trackers.log(json.loads(line))

    def write_samples(self, rows: list[dict]) -> None:
        """Append the proposals of a step (text, validity, reward) for people to read."""
        with (self.run_dir / SAMPLES_FILE).open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    def rewind(self, keep: int, recent: list[StepStats]) -> None:
        """Keep the first `keep` step lines, then `recent` in place of the step lines after
        them (restore from a checkpoint: steps after it are dropped, steps it remembers are
        rewritten). Lines of other kinds stay where they are unless their step is past the
        checkpoint (`keep + len(recent) - 1`)."""
        last = keep + len(recent) - 1
        out, steps = [], 0
        for line in self.metrics_path.read_text().splitlines(keepends=True):
            if not line.strip():
                continue
            row = json.loads(line)
            if "kind" in row and row["kind"] != "step":
                if int(row.get("step", 0)) <= last:
                    out.append(line)
                continue
            if steps < keep:
                out.append(line)
            elif steps - keep < len(recent):
                out.append(recent[steps - keep].model_dump_json() + "\n")
            steps += 1
        out += [s.model_dump_json() + "\n" for s in recent[max(0, steps - keep):]]
        self.metrics_path.write_text("".join(out))
        self.trackers.rewind([json.loads(line) for line in out])
        self._drop_samples_after(last)

    def _drop_samples_after(self, last: int) -> None:
        """Remove the samples.jsonl rows of steps after `last`: the steps that will be run
        again write their own (without this a rolled-back step's tasks appear twice)."""
        path = self.run_dir / SAMPLES_FILE
        if not path.exists():
            return
        lines = path.read_text().splitlines(keepends=True)
        kept = [x for x in lines if x.strip() and int(json.loads(x).get("step", 0)) <= last]
        if len(kept) != len(lines):
            path.write_text("".join(kept))

    def close(self) -> None:
        self.trackers.close()
        logging.getLogger("compassplay").removeHandler(self._handler)
        self._handler.close()


def comparable_steps(path: str | Path) -> list[dict]:
    """The step lines of a metrics.jsonl without their timing and cost fields
    (`records.TIMING_FIELDS`), which differ between runs that are otherwise equal."""
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS}
            for row in read_metrics(path)]


def read_metrics(path: str | Path, kind: str | None = "step") -> list[dict]:
    """The lines of a metrics.jsonl of one kind ("step", "eval"; None: all) as dicts."""
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if kind is None or row.get("kind", "step") == kind:
                out.append(row)
    return out
