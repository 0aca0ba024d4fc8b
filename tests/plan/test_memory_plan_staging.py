"""The memory plan's weight-sync staging at Qwen2.5-Coder-7B's shape (issue 37): a tensor
larger than a bucket travels alone, and vLLM's layerwise loader holds it until its layer is
done, so a vLLM receiver stages max(bucket, largest tensor) + one bucket."""

from __future__ import annotations

import pytest

from compassplay.config import load_config
from compassplay.plan.memory import plan_memory
from compassplay.plan.role_memory import GiB, MiB, learner_role
from compassplay.plan.shapes import QWEN25_CODER_7B

EMBED = 152064 * 3584 * 2  # bytes of the bf16 embedding (and of the untied head)


def test_the_largest_tensor_of_the_7b_shape_is_the_embedding():
    assert QWEN25_CODER_7B.largest_tensor_params() * 2 == EMBED
    assert EMBED / (256 * MiB) == pytest.approx(4.06, abs=0.01)


def test_nccl_staging_counts_the_embedding_bucket_plus_one():
    plan = plan_memory(load_config("paper_coding_7b", ["learner.weight_sync=nccl"]))
    staging = {r.name: r.parts["sync_staging"] for r in plan.roles}
    assert staging["proposer"] == staging["solver"] == EMBED + 256 * MiB  # 1.27 GiB, not 0.25
    assert staging["scorer-0"] == EMBED  # copied out to the CPU bucket by bucket
    assert staging["learner-0"] == 2 * EMBED  # the bucket and the copies it is made of
    proposer = next(r for r in plan.roles if r.name == "proposer")
    held = proposer.parts["reserved"] if proposer.phases["learn"] else proposer.parts["weights"]
    assert proposer.phases["sync"] == held + EMBED + 256 * MiB  # counted in the sync phase


def test_a_bucket_larger_than_every_tensor_is_what_is_staged():
    plan = plan_memory(load_config("paper_coding_7b", ["learner.weight_sync=nccl",
                                                       "learner.sync_bucket_mb=2048"]))
    proposer = next(r for r in plan.roles if r.name == "proposer")
    assert proposer.parts["sync_staging"] == 4 * GiB


def test_ipc_shares_the_live_parameters_no_copy_except_zero3():
    over = ["learner.weight_sync=ipc", "proposer.engine=vllm", "solver.engine=vllm",
            "proposer.enable_sleep_mode=true", "solver.enable_sleep_mode=true",
            "learner.num_ranks=1"]
    cfg = load_config("paper_coding_7b", over + ["learner.zero_stage=2"])
    assert learner_role(cfg, QWEN25_CODER_7B, 0).parts["sync_staging"] == 0
    cfg3 = load_config("paper_coding_7b", over + ["learner.zero_stage=3"])
    assert learner_role(cfg3, QWEN25_CODER_7B, 0).parts["sync_staging"] == \
        QWEN25_CODER_7B.params() * 2
