"""Start a run with the chosen executor; resolves the run directory and resume."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from compassplay.config import RunConfig
from compassplay.executors.interrupt import StopRequest, graceful_stop, interrupted
from compassplay.models.loading import prepare_model
from compassplay.rundir.claim import claim_run_dir, open_run_dir
from compassplay.rundir.runlog import run_dir_for
from compassplay.warmup.bootstrap import prepare_bootstrap

log = logging.getLogger(__name__)


def resume_command(run_dir: Path, executor: str) -> str:
    """The command line that continues the run in `run_dir` from its latest checkpoint."""
    flag = " --executor local" if executor == "local" else ""
    return f"compassplay run{flag} --resume {shlex.quote(str(run_dir))}"


def launch_run(cfg: RunConfig, executor: str = "ray", resume: str | None = None,
               overwrite: bool = False) -> Path:
    """Run `cfg` to completion; returns the run directory (metrics.jsonl, config, log).

    A new run gets a directory of its own (`rundir.claim`: `runs/NAME`, or `runs/NAME-2`, ...
    when that holds another run; `overwrite` empties `runs/NAME` instead); `resume` continues
    the run in that directory. The run's name becomes its directory's name. The model is
    prepared here, once, before any role starts (a first run converts and caches SmolLM2 in
    the driver instead of in every actor). Ctrl-C stops the run cleanly (see
    `compassplay.executors.interrupt`) and raises RunInterrupted naming the resume command."""
    if resume:
        run_dir = open_run_dir(resume)
    else:
        run_dir = claim_run_dir(run_dir_for(cfg), overwrite=overwrite)
        cfg.run.name = run_dir.name
    log.info("run directory: %s", run_dir)
    hint = resume_command(run_dir, executor)
    with graceful_stop(hint) as stop:
        try:
            prepare_model(cfg.model)
            prepare_bootstrap(cfg)  # the format bootstrap, once, before any role starts
            _execute(cfg, executor, run_dir, resume, stop)
        except KeyboardInterrupt:  # Ray's blocking calls turn a signal into KeyboardInterrupt
            raise interrupted(hint) from None
    return run_dir


def _execute(cfg: RunConfig, executor: str, run_dir: Path, resume: str | None,
             stop: StopRequest) -> None:
    if executor == "local":
        from tqdm import tqdm

        from compassplay.executors.local import LocalExecutor  # lazy: pulls prometheus_client

        ex = LocalExecutor(cfg, run_dir, resume=bool(resume))
        bar = tqdm(total=cfg.pipeline.steps, initial=ex.start_step, desc="self-play steps",
                   disable=not cfg.logging.progress)

        def progress(stats):
            bar.update(1)
            bar.set_postfix(valid=stats.valid, eligible=stats.eligible,
                            reward=f"{stats.reward_mean:.3f}", loss=f"{stats.loss:.3f}")

        try:
            ex.run(progress)
        finally:
            bar.close()
    else:
        from compassplay.executors.ray.pipeline_runner import run_pipeline  # lazy: pulls ray

        with stop.deferred():
            run_pipeline(cfg, run_dir, resume=bool(resume), stop=stop)
