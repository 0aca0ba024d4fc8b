"""Experiment trackers fed with the lines of metrics.jsonl (which stays the source of truth).

- TensorBoard (`logging.tensorboard`, on by default): event files in the run directory
  itself, so `tensorboard --logdir runs` shows one TensorBoard run per run directory, named
  like it. Every scalar of a line is a TensorBoard scalar at the line's step: a step line's
  numeric fields under their own names (`reward_mean`, `entropy`, ...), nested dicts joined
  with "/" (`stage_seconds/learn`, `by_task_type/deduction/valid`); a line of another kind
  under `KIND/` (and `KIND/BENCHMARK/` for eval lines: `eval/humaneval/accuracy`). Lists,
  strings and nulls are not scalars and are left out.
- wandb (`logging.wandb`, off by default): the same scalars to a wandb run in offline mode
  under `RUN_DIR/wandb/` (upload later with `wandb sync`); never online. Asked for without
  wandb installed, the run stops before it starts with an error naming the field.

A rewind (restore from a checkpoint or resume, `RunLog.rewind`) writes the TensorBoard events
anew from the rewritten metrics.jsonl, so they never hold a step twice; wandb cannot rewrite
history and only receives steps past the last one it has.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from compassplay.errors import RunError

log = logging.getLogger(__name__)

EVENTS_PREFIX = "events.out.tfevents."  # TensorBoard's event file names


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The scalars of one metrics.jsonl line as {tag: value} (see the module doc)."""
    kind = row.get("kind", "step")
    skip = {"step", "kind", "benchmark", "items"}
    prefix = "" if kind == "step" else f"{kind}/"
    if kind != "step" and isinstance(row.get("benchmark"), str):
        prefix += f"{row['benchmark']}/"
    out: dict[str, float] = {}
    _flatten(prefix, {k: v for k, v in row.items() if k not in skip}, out)
    return out


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}{k}/", v, out)
    elif isinstance(value, bool | int | float) and math.isfinite(float(value)):
        out[prefix.rstrip("/")] = float(value)


def check_trackers(cfg_logging: Any) -> None:
    """Raise RunError when a tracker is asked for and its package is missing."""
    if cfg_logging.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as exc:
            raise RunError("logging.tensorboard=true needs the tensorboard package (pip install "
                           f"tensorboard), or set logging.tensorboard=false ({exc})") from None
    if cfg_logging.wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise RunError("logging.wandb=true but wandb is not installed: pip install wandb "
                           "(it logs offline, under RUN_DIR/wandb), or set "
                           "logging.wandb=false") from None


class Trackers:
    """The trackers a run asked for; `log(row)` for each metrics.jsonl line written."""

    def __init__(self, run_dir: Path, cfg: Any) -> None:
        check_trackers(cfg.logging)
        self.run_dir = Path(run_dir)
        self._tb = None
        self._wandb = None
        self._wandb_step = -1
        if cfg.logging.tensorboard:
            self._tb = self._open_tb()
        if cfg.logging.wandb:
            import wandb

            self._wandb = wandb.init(project=cfg.logging.wandb_project, name=cfg.run.name,
                                     dir=str(self.run_dir), mode="offline",
                                     config=cfg.model_dump(mode="json"))
            log.info("wandb (offline) in %s: upload with `wandb sync`", self.run_dir / "wandb")

    def _open_tb(self):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(self.run_dir))

    def log(self, row: dict[str, Any]) -> None:
        """Send one metrics.jsonl line (a dict) to every tracker."""
        step = int(row.get("step", 0))
        values = scalars(row)
        if self._tb is not None:
            for tag, v in values.items():
                self._tb.add_scalar(tag, v, global_step=step)
            self._tb.flush()
        if self._wandb is not None and step >= self._wandb_step:
            self._wandb.log(values, step=step)
            self._wandb_step = step

    def rewind(self, rows: list[dict[str, Any]]) -> None:
        """metrics.jsonl was rewritten to `rows` (all its lines, in file order): the
        TensorBoard events are written anew from them; wandb gets the steps past its last."""
        if self._tb is not None:
            self._tb.close()
            for f in self.run_dir.glob(f"{EVENTS_PREFIX}*"):
                f.unlink()
            self._tb = self._open_tb()
        for row in rows:
            self.log(row)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
