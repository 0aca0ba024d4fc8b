"""A stage that fails every time ends the run after pipeline.max_step_retries, naming the call."""

from __future__ import annotations

import pytest
import ray

from compassplay.actors.placement import ActorSet
from compassplay.bench.pipeline import StandIn, _Sleeper
from compassplay.config import load_config
from compassplay.errors import RunError
from compassplay.executors.ray.driver import Pipeline

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@ray.remote(num_cpus=0)
class _BrokenSolver(StandIn):
    def run_stage(self, call, *args):
        if call.stage == "solve":
            raise ValueError("the solver cannot parse its own config")
        return super().run_stage(call, *args)


def test_a_step_that_always_fails_stops_the_run_with_the_cause(tmp_path, ray_local):
    cfg = load_config("micro", ["pipeline.steps=3", "pipeline.max_step_retries=2"])
    stages = {}
    actors = ActorSet(_Sleeper.remote(stages), _BrokenSolver.remote(stages),
                      [_Sleeper.remote(stages)], [_Sleeper.remote(stages)],
                      _Sleeper.remote(stages))
    pipe = Pipeline(cfg, tmp_path, actors, runlog=None)
    with pytest.raises(RunError, match=r"step 0 failed 3 times; last failure in .*run_stage.*"
                                       r"ValueError: the solver cannot parse its own config"):
        pipe.run()
    assert pipe.failures == {0: 3}
    actors.shutdown()
