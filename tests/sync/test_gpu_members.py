"""`--dry-run` refuses GPU layouts NCCL or CUDA IPC cannot use (sync/gpu_members.py), and the
Ray executor's STRICT_PACK bundle of a colocated (ipc) learner and its vLLM engines."""

from __future__ import annotations

import pytest

from compassplay.commands.dry_run import dry_run
from compassplay.config import ConfigError, load_config
from compassplay.sync.channel import check_weight_sync
from compassplay.sync.gpu_members import (
    check_distinct_devices,
    check_exclusive_gpus,
    check_ipc_colocation,
    may_share,
)

NCCL = ["learner.weight_sync=nccl"]
IPC = ["learner.weight_sync=ipc", "proposer.engine=vllm", "solver.engine=vllm",
       "proposer.enable_sleep_mode=true", "solver.enable_sleep_mode=true",
       "proposer.gpu_memory_utilization=0.3", "solver.gpu_memory_utilization=0.3"]


def _gpus(**num: float) -> list[str]:
    return [f"cluster.{r}.num_gpus={g}" for r, g in num.items()]


def test_nccl_members_that_may_share_a_gpu_are_refused_at_dry_run_naming_them():
    cfg = load_config(None, NCCL + _gpus(learner=1, proposer=0.5, solver=0.5, scorer=1))
    with pytest.raises(ConfigError, match=r"proposer \+ solver may share one GPU.*"
                                          r"cluster\.proposer\.num_gpus, "
                                          r"cluster\.solver\.num_gpus"):
        dry_run(cfg)
    with pytest.raises(ConfigError, match="NCCL refuses"):
        check_weight_sync(cfg, embedded=False)  # the driver refuses it too
    two_scorers = load_config(None, NCCL + ["scorer.num_scorers=2"]
                              + _gpus(learner=1, proposer=1, solver=1, scorer=0.25))
    with pytest.raises(ConfigError, match=r"scorer-0 \+ scorer-1"):
        check_exclusive_gpus(two_scorers)
    # fractions that cannot add up to one GPU, or whole GPUs: fine
    check_exclusive_gpus(load_config(None, NCCL + _gpus(learner=0.6, proposer=0.6,
                                                        solver=1, scorer=1)))
    assert may_share([("a", 0.5), ("b", 0.6), ("c", 0.4), ("d", 1.0), ("e", 0.0)]) == [
        ("a", "c"), ("b", "c")]


def test_a_learner_group_on_shared_gpus_is_refused():
    cfg = load_config(None, ["learner.backend=deepspeed", "learner.num_ranks=2",
                             "cluster.learner.num_gpus=0.5"])
    with pytest.raises(ConfigError, match=r"cluster\.learner\.num_gpus=0\.5.*2 ranks"):
        dry_run(cfg)
    check_exclusive_gpus(load_config(None, ["learner.backend=deepspeed", "learner.num_ranks=2",
                                            "cluster.learner.num_gpus=1"]))


def test_ipc_without_one_shared_gpu_is_refused_at_dry_run():
    cfg = load_config(None, IPC + _gpus(learner=1, proposer=1, solver=1))
    with pytest.raises(ConfigError, match=r"learner, proposer, solver must share one GPU.*"
                                          r"= 3"):
        dry_run(cfg)
    over = load_config(None, IPC + _gpus(learner=0.5, proposer=0.3, solver=0.3))
    with pytest.raises(ConfigError, match=r"= 1\.1"):
        check_ipc_colocation(over)
    with pytest.raises(ConfigError, match="must share one GPU"):
        check_weight_sync(over, embedded=False)


def test_ipc_dry_run_reports_one_strict_pack_bundle_for_learner_and_engines():
    cfg = load_config(None, IPC + _gpus(learner=0.4, proposer=0.3, solver=0.3)
                      + ["cluster.placement=pack_scorers_with_learner"])
    out = dry_run(cfg)
    pg = out["placement_group"]
    assert pg["strategy"] == "STRICT_PACK"
    assert pg["roles"] == {"learner": 0, "proposer": 0, "solver": 0, "scorer-0": 1}
    assert pg["bundles"][0]["GPU"] == pytest.approx(1.0)
    assert pg["bundles"][0]["CPU"] == pytest.approx(3.0)  # 1 CPU each, summed


def test_an_hf_generator_needs_no_colocation():
    cfg = load_config(None, [*IPC, "solver.engine=hf", "solver.enable_sleep_mode=false"]
                      + _gpus(learner=0.5, proposer=0.5, solver=1))
    check_ipc_colocation(cfg)
    from compassplay.plan.resources import bundle_plan

    bundles, roles = bundle_plan(cfg)
    assert roles == {"learner": 0, "proposer": 0} and bundles[0]["GPU"] == 1.0


def test_devices_reported_when_a_group_forms_must_differ():
    check_distinct_devices(["GPU-a", "GPU-b", "GPU-c"])
    with pytest.raises(RuntimeError, match=r"ranks \[0, 2\] on GPU-a.*NCCL refuses"):
        check_distinct_devices(["GPU-a", "GPU-b", "GPU-a"])
