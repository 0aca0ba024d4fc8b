"""Start a run with the chosen executor; resolves the run directory and resume."""

from __future__ import annotations

import logging
from pathlib import Path

from compassplay.config import RunConfig
from compassplay.runlog import run_dir_for

log = logging.getLogger(__name__)


def launch_run(cfg: RunConfig, executor: str = "ray", resume: str | None = None) -> Path:
    """Run `cfg` to completion; returns the run directory (metrics.jsonl, config, log)."""
    run_dir = Path(resume) if resume else run_dir_for(cfg)
    if executor == "local":
        from tqdm import tqdm

        from compassplay.local import LocalExecutor

        ex = LocalExecutor(cfg, run_dir, resume=bool(resume))
        bar = tqdm(total=cfg.pipeline.steps, initial=ex.start_step, desc="self-play steps",
                   disable=not cfg.logging.progress)

        def progress(stats):
            bar.update(1)
            bar.set_postfix(valid=stats.valid, eligible=stats.eligible,
                            reward=f"{stats.reward_mean:.3f}", loss=f"{stats.loss:.3f}")

        ex.run(progress)
        bar.close()
    else:
        from compassplay.pipeline import run_pipeline

        run_pipeline(cfg, run_dir, resume=bool(resume))
    return run_dir
