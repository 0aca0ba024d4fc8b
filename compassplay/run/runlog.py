"""A run's files: resolved config, metrics.jsonl (one StepStats per line), and the text log.

metrics.jsonl is the source of truth for plots; each line is one JSON object.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from compassplay.config import RunConfig, dump_config
from compassplay.records import StepStats

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
CONFIG_FILE = "config.yaml"
LOG_FILE = "run.log"


def run_dir_for(cfg: RunConfig) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


class RunLog:
    """Appends StepStats to `<run_dir>/metrics.jsonl` and mirrors logging to `run.log`."""

    def __init__(self, run_dir: Path, cfg: RunConfig, resume: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        if not resume:
            self.metrics_path.write_text("")
        (self.run_dir / CONFIG_FILE).write_text(dump_config(cfg))
        self._handler = logging.FileHandler(self.run_dir / LOG_FILE)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("compassplay").addHandler(self._handler)

    def write(self, stats: StepStats) -> None:
        with self.metrics_path.open("a") as f:
            f.write(stats.model_dump_json() + "\n")

    def write_samples(self, rows: list[dict]) -> None:
        """Append the proposals of a step (text, validity, reward) for people to read."""
        with (self.run_dir / SAMPLES_FILE).open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    def rewind(self, keep: int, recent: list[StepStats]) -> None:
        """Keep the first `keep` metric lines, then append `recent` (restore from a checkpoint:
        steps after it are dropped, steps it remembers are rewritten)."""
        lines = self.metrics_path.read_text().splitlines(keepends=True)[:keep]
        lines += [s.model_dump_json() + "\n" for s in recent]
        self.metrics_path.write_text("".join(lines))

    def close(self) -> None:
        logging.getLogger("compassplay").removeHandler(self._handler)
        self._handler.close()


def read_metrics(path: str | Path) -> list[dict]:
    """All metric lines of a metrics.jsonl as dicts (for plots and tests)."""
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out
