"""`compassplay bench pipeline`: how much of the work the Ray pipeline overlaps.

Stand-in mode (default): the real driver (`executors.ray.driver.Pipeline`) runs actors whose stages sleep
for set durations per step: generation (split evenly between proposer and solver), verification
(split between validate and grade), scoring and learning. Reported:
- serial_s: steps x (sum of stage durations), no overlap at all;
- ideal_s: (steps - 1) x slowest stage + one full step (the pipeline fill), the bound when the
  slowest stage never idles;
- pipelined_s: measured wall time; efficiency = ideal_s / pipelined_s.
With staleness s, rollout k waits for learn(k-s-1), so a step can never take less than
sum / (s + 1); `staleness_bound_s` reports that bound as well.

`--real`: the micro model through the real actors; reports seconds per stage per step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ray

from compassplay.actors.placement import ActorSet
from compassplay.config import load_config
from compassplay.executors.ray.driver import Pipeline
from compassplay.executors.ray.pipeline_runner import run_pipeline
from compassplay.executors.ray.session import init_ray
from compassplay.records import StepStats
from compassplay.step.graph import StageCall
from compassplay.step.messages import StepResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--generation-s", type=float, default=0.5)
    parser.add_argument("--verification-s", type=float, default=0.1)
    parser.add_argument("--scoring-s", type=float, default=0.2)
    parser.add_argument("--learning-s", type=float, default=0.2)
    parser.add_argument("--real", action="store_true", help="micro model, real actors")
    parser.add_argument("--config", default="micro")


class StandIn:
    """Stands in for every role: each stage sleeps its set duration (0 for the bookkeeping
    stages update_buffer, collect, env_state and candidates) and passes a token on."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.s, self.done = seconds, 0

    def run_stage(self, call: StageCall, *args):
        time.sleep(self.s.get(call.stage, 0.0))
        if call.stage != "learn":
            return call.step
        self.done += 1
        stats = StepStats(step=call.step, weight_version=self.done, proposals=0, valid=0,
                          eligible=0, solve_rate_mean=0.0, reward_mean=0.0, reward_std=0.0,
                          reward_distinct=0, loss=0.0, grad_norm=0.0, solver_accuracy=0.0)
        return StepResult(stats, self.done)

    def snapshot(self, role="solver"):
        return self.done, {}

    def load_env_state(self, state):
        return None

    def incarnation(self):
        return "stand-in"

    def weight_version(self):
        return self.done

    def steps_done(self):
        return self.done

    def restored_state(self):
        return None

    def stats(self):
        return {}


_Sleeper = ray.remote(num_cpus=0)(StandIn)


def stand_in_bench(args: argparse.Namespace) -> dict:
    gen, ver = args.generation_s, args.verification_s
    stages = {"propose": gen / 2, "validate": ver / 2, "solve": gen / 2, "grade": ver / 2,
              "score": args.scoring_s, "learn": args.learning_s}
    cfg = load_config(args.config, [f"pipeline.steps={args.steps}",
                                    f"pipeline.staleness={args.staleness}"])
    init_ray(cfg)
    actors = ActorSet(*(_Sleeper.remote(stages) for _ in range(2)), [_Sleeper.remote(stages)],
                      [_Sleeper.remote(stages)], _Sleeper.remote(stages))
    ray.get([a.incarnation.remote() for a in actors.all()])
    with tempfile.TemporaryDirectory(prefix="compassplay-bench-") as run_dir:
        t0 = time.perf_counter()
        Pipeline(cfg, Path(run_dir), actors, runlog=None).run()
        pipelined = time.perf_counter() - t0
    total = sum(stages.values())
    slowest = max(gen, ver, args.scoring_s, args.learning_s)
    ideal = (args.steps - 1) * slowest + total
    actors.shutdown()
    return {"bench": "pipeline", "mode": "stand-in", "steps": args.steps,
            "staleness": args.staleness, "stage_s": stages,
            "serial_s": round(args.steps * total, 4), "pipelined_s": round(pipelined, 4),
            "ideal_s": round(ideal, 4),
            "staleness_bound_s": round((args.steps - 1) * max(slowest, total /
                                                              (args.staleness + 1)) + total, 4),
            "efficiency": round(ideal / pipelined, 4),
            "speedup_vs_serial": round(args.steps * total / pipelined, 4)}


def real_bench(args: argparse.Namespace) -> dict:
    cfg = load_config(args.config, [f"pipeline.steps={args.steps}",
                                    f"pipeline.staleness={args.staleness}",
                                    "logging.progress=false"])
    with tempfile.TemporaryDirectory(prefix="compassplay-bench-") as tmp:  # checkpoints too
        t0 = time.perf_counter()
        pipe = run_pipeline(cfg, Path(tmp) / "bench")
        wall = time.perf_counter() - t0
    stats, at = pipe.recorded, pipe.recorded_at
    stage_names = sorted({k for s in stats for k in s.stage_seconds})
    per_stage = {k: round(statistics.median(s.stage_seconds.get(k, 0.0) for s in stats), 4)
                 for k in stage_names}
    serial = statistics.median(sum(s.stage_seconds.values()) for s in stats)
    return {"bench": "pipeline", "mode": "real", "config": args.config, "steps": args.steps,
            "staleness": args.staleness, "wall_s": round(wall, 3),
            "step_s_median_serial_sum": round(serial, 4), "stage_s_median": per_stage,
            "startup_s": round(at[0] - t0 - sum(stats[0].stage_seconds.values()), 3),
            "pipelined_step_s": round((at[-1] - at[0]) / max(1, len(at) - 1), 4)}


def run(args: argparse.Namespace) -> dict:
    return real_bench(args) if args.real else stand_in_bench(args)


if __name__ == "__main__":
    import json

    p = argparse.ArgumentParser()
    add_arguments(p)
    print(json.dumps(run(p.parse_args())))
