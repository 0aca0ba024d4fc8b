"""Stage timings: Unix start/end, CPU seconds, device seconds, and a step's cost fields."""

import time

import pytest

from compassplay.records import TIMING_FIELDS, StepStats
from compassplay.step.timing import Timing, step_cost, timed


def test_timed_fills_wall_cpu_and_device_seconds():
    before = time.time()
    with timed() as t:
        sum(i * i for i in range(200_000))  # some CPU work
    assert before <= t.start <= t.end <= time.time()
    assert t.cpu_seconds > 0 and t.device_seconds == t.cpu_seconds
    with timed(gpus=2) as g:
        time.sleep(0.05)
    assert g.device_seconds == pytest.approx(g.seconds * 2, rel=1e-3) and g.seconds >= 0.05
    assert g.cpu_seconds < 0.05  # sleeping costs no CPU


def test_merge_spans_and_sums():
    m = Timing.merge([Timing(10, 12, 1.0, 1.0), Timing(11, 15, 2.0, 2.0, gpus=1)])
    assert (m.start, m.end, m.seconds, m.cpu_seconds, m.device_seconds) == (10, 15, 5, 3.0, 3.0)
    assert Timing.merge([]).seconds == 0.0


def test_step_cost_per_role_and_cumulative():
    timings = {"propose": Timing(100, 101, 0.5, 0.5), "validate": Timing(101, 103, 0.2, 0.2),
               "grade": Timing(104, 105, 0.1, 0.1), "learn": Timing(105, 107, 0.0, 4.0, 2)}
    roles = {"propose": "proposer", "validate": "verifier", "grade": "verifier",
             "learn": "learner"}
    cost = step_cost(timings, roles, cumulative_before=10.0)
    assert cost["device_seconds"] == {"proposer": 0.5, "verifier": pytest.approx(0.3),
                                      "learner": 4.0}
    assert cost["device_kind"] == {"proposer": "cpu", "verifier": "cpu", "learner": "gpu"}
    assert (cost["step_start"], cost["step_end"]) == (100, 107)
    assert cost["step_seconds"] == 6 and cost["stage_seconds"]["learn"] == 2
    assert cost["cumulative_device_seconds"] == 10.0 + cost["step_device_seconds"]
    stats = StepStats(step=0, weight_version=1, proposals=0, valid=0, eligible=0,
                      solve_rate_mean=0, reward_mean=0, reward_std=0, reward_distinct=0,
                      loss=0, grad_norm=0, solver_accuracy=0, **cost)
    assert set(TIMING_FIELDS) <= set(stats.model_dump())
