"""The vLLM weight-update protocol against a fake engine (tests/engines/fake_vllm.py) that
encodes RPC arguments and wraps worker errors as vLLM does; the NCCL group runs over gloo.
The same protocol against real vLLM (CPU build): tests/engines/generation/test_vllm.py."""

from __future__ import annotations

import threading

import pytest
import torch

from compassplay.config import load_config
from compassplay.engines.generation.base import SamplingParams, StaleWeightsError
from compassplay.engines.generation.vllm import VLLMGenerationEngine
from compassplay.engines.training.dist import free_port
from compassplay.sync.buckets import NCCLBroadcastSync
from compassplay.sync.channel import NcclChannel
from compassplay.sync.ipc import publish
from compassplay.sync.ranks import receiver_sizes, weight_sync_ranks
from tests.engines.fake_vllm import FakeLLM, FakeLLMNoTags, fake_sampling_params

P = SamplingParams(max_new_tokens=2, seed=0)


def _state(seed: float) -> dict[str, torch.Tensor]:
    return {"embed.weight": torch.full((4, 3), seed), "layer.0.w": torch.full((5,), seed),
            "layer.0.b16": torch.full((2, 2), seed).to(torch.bfloat16)}


def _engine(llm: FakeLLM, **kw) -> VLLMGenerationEngine:
    return VLLMGenerationEngine("unused", tokenizer=object(), llm=llm,
                                sampling_params_cls=fake_sampling_params, **kw)


def _held(llm: FakeLLM) -> list[dict[str, torch.Tensor]]:
    return [w.model.params for w in llm.workers]


def _equal(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k].to(a[k].dtype)) for k in a)


def _rpcs(llm: FakeLLM) -> list[str]:
    return [e[1] for e in llm.log if e[0] == "rpc"]


def test_missing_vllm_is_a_clear_config_error(monkeypatch):
    import sys

    from compassplay.config import ConfigError
    from compassplay.engines import make_generation_engine

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ConfigError, match="engine 'vllm'.*make setup"):
        make_generation_engine("vllm", "/nonexistent/model")
    with pytest.raises(ValueError, match="unknown generation engine"):
        make_generation_engine("tgi", None)


def test_tensors_travel_in_rpc_args_and_worker_errors_come_back_wrapped():
    llm = FakeLLM(_state(0.0))
    assert llm.collective_rpc("compassplay_set_version", args=(3,)) == [3]
    with pytest.raises(AssertionError, match="object in collective_rpc"):
        llm.collective_rpc("compassplay_set_version", args=(object(),))
    # a tensor is legal, but arrives as vLLM's schema-less decoding leaves it: not a tensor
    seen = []
    llm.workers[0].compassplay_echo = lambda x: seen.append(x) or 0
    llm.collective_rpc("compassplay_echo", args=(torch.ones(100),))
    assert seen == [["float32", [100], 1]]
    with pytest.raises(RuntimeError, match="Worker failed with error 'RuntimeError: bucket"):
        llm.collective_rpc("compassplay_load_tensors", args=([], 1, False, True))


def test_object_store_path_sends_tensors_in_buckets_in_one_reload():
    """load_weights (object store, local executor): the tensors go in the RPC, in buckets;
    one layerwise reload spans them; the version changes once, after the last bucket."""
    llm = FakeLLM(_state(0.0), tp=2)
    eng = _engine(llm, bucket_bytes=40)  # 48, then 20 + 8 bytes: two buckets
    assert eng.generate([[1]], P)[0].weight_version == 0
    eng.load_weights(_state(1.0), 1)
    assert eng.weight_version == 1
    assert all(_equal(h, _state(1.0)) for h in _held(llm))
    assert _rpcs(llm)[-3:] == ["compassplay_load_tensors"] * 2 + ["compassplay_device_id"]
    assert [(w.begun, w.finished) for w in llm.workers] == [(1, 1), (1, 1)]
    assert eng.generate([[1]], P)[0].weight_version == 1
    with pytest.raises(StaleWeightsError):
        eng.load_weights(_state(0.5), 0)
    assert eng.weight_version == 1 and all(_equal(h, _state(1.0)) for h in _held(llm))


def test_failed_load_keeps_old_version_and_blocks_generation_until_a_good_load():
    llm = FakeLLM(_state(0.0), tp=2)
    eng = _engine(llm, bucket_bytes=40)
    llm.workers[1].model.fail_on = {"layer.0.b16"}  # the last bucket fails
    with pytest.raises(RuntimeError, match="injected"):
        eng.load_weights(_state(1.0), 1)
    assert eng.weight_version == 0
    with pytest.raises(RuntimeError, match="partly loaded"):
        eng.generate([[1]], P)  # worker 1 holds part of version 1
    assert llm.workers[1].finished == 1  # the failed reload was ended (old layers kept)
    llm.workers[1].model.fail_on = set()
    eng.load_weights(_state(2.0), 2)
    assert eng.weight_version == 2 and eng.generate([[1]], P)[0].weight_version == 2


def test_a_worker_reporting_another_version_is_not_taken():
    llm = FakeLLM(_state(0.0), tp=2)
    eng = _engine(llm)
    llm.workers[1].compassplay_load_tensors = lambda named, version, first, final: 7
    with pytest.raises(RuntimeError, match="expected weight version 1"):
        eng.load_weights(_state(1.0), 1)
    assert eng.weight_version == 0


def test_nccl_path_tp2_over_gloo_ranks_versions_and_stale_refusal():
    """Learner = rank 0 (NcclChannel over gloo, standing in for NCCL); a TP=2 engine takes
    ranks 1 and 2. Per update: one RPC with the version, the bytes through the group."""
    sizes = [2]
    offsets, world = weight_sync_ranks(sizes)
    assert (offsets, world) == ([1], 3)
    port = free_port()
    llm = FakeLLM(_state(0.0), tp=2)
    eng = _engine(llm)
    learner: dict = {}
    t = threading.Thread(target=lambda: learner.setdefault("ch", NcclChannel(
        "127.0.0.1", port, 0, world, bucket_bytes=40, backend="gloo", timeout_s=60)))
    t.start()
    assert eng.init_weight_broadcast("127.0.0.1", port, offsets[0], world) == [1, 2]
    t.join(60)
    ch = learner["ch"]
    assert [w.joined for w in llm.workers] == [(1, 3), (2, 3)]

    def update(version: int, state, send=None) -> threading.Thread:
        th = threading.Thread(target=send or (lambda: ch.send(state, version)))
        th.start()
        return th

    th = update(1, _state(1.0))
    eng.receive_weights_broadcast(1, bucket_bytes=40)
    th.join(60)
    assert eng.weight_version == 1 and all(_equal(h, _state(1.0)) for h in _held(llm))
    # a stale broadcast (a sender bypassing its own check): drained, refused, old version
    th = update(0, None, lambda: NCCLBroadcastSync(ch.sync.comm, 0, 40, "cpu").send(
        _state(0.5), 0))
    with pytest.raises(StaleWeightsError):
        eng.receive_weights_broadcast(0, bucket_bytes=40)
    th.join(60)
    assert eng.weight_version == 1 and all(_equal(h, _state(1.0)) for h in _held(llm))
    # the group is still in step; an unexpected version is refused too
    th = update(3, _state(3.0))
    with pytest.raises(RuntimeError, match="expected weight version 2"):
        eng.receive_weights_broadcast(2, bucket_bytes=40)
    th.join(60)
    assert eng.weight_version == 1
    th = update(4, _state(4.0))
    eng.receive_weights_broadcast(4, bucket_bytes=40)
    th.join(60)
    assert eng.weight_version == 4 and eng.generate([[1]], P)[0].weight_version == 4
    rpcs = _rpcs(llm)
    assert rpcs.count("compassplay_join_group") == 1
    assert rpcs.index("compassplay_join_group") < rpcs.index("compassplay_receive_broadcast")


def test_colocated_ipc_wakes_weights_then_loads_then_kv_cache():
    llm = FakeLLM(_state(0.0))
    eng = _engine(llm, enable_sleep_mode=True, sleep_level=1)
    eng.generate([[1]], P)
    eng.sleep()
    assert eng.asleep
    with publish({"fake-gpu-0": list(_state(1.0).items())}, 1) as update:
        eng.load_weights_ipc(update.path, 1)
    tail = [e for e in llm.log if e[0] != "rpc" or e[1] == "compassplay_load_ipc"][-5:]
    assert tail == [("sleep", 1), ("wake_up", ["weights"]), ("rpc", "compassplay_load_ipc"),
                    ("wake_up", ["kv_cache"]), ("reset_prefix_cache",)]
    assert eng.weight_version == 1 and not eng.asleep
    assert eng.generate([[1]], P)[0].weight_version == 1


def test_colocated_ipc_without_wake_up_tags_wakes_all_before_loading():
    llm = FakeLLMNoTags(_state(0.0))
    eng = _engine(llm, enable_sleep_mode=True)
    eng.sleep()
    with publish({"fake-gpu-0": list(_state(1.0).items())}, 1) as update:
        eng.load_weights_ipc(update.path, 1)
    assert [e for e in llm.log if e[0] != "rpc" or e[1] == "compassplay_load_ipc"][-4:] == [
        ("sleep", 1), ("wake_up", None), ("rpc", "compassplay_load_ipc"),
        ("reset_prefix_cache",)]
    assert eng.weight_version == 1


def test_ipc_for_another_gpu_and_stale_ipc_are_refused():
    llm = FakeLLM(_state(0.0))
    eng = _engine(llm)
    with publish({"some-other-gpu": list(_state(1.0).items())}, 1) as update:
        with pytest.raises(RuntimeError, match="share the learner's GPU"):
            eng.load_weights_ipc(update.path, 1)
    assert eng.weight_version == 0 and eng.generate([[1]], P)[0].weight_version == 0
    with publish({"fake-gpu-0": list(_state(2.0).items())}, 2) as update:
        eng.load_weights_ipc(update.path, 2)
    with publish({"fake-gpu-0": list(_state(1.0).items())}, 1) as update:
        with pytest.raises(StaleWeightsError):
            eng.load_weights_ipc(update.path, 1)
    assert eng.weight_version == 2 and _equal(_held(llm)[0], _state(2.0))


def test_sleep_level_2_needs_a_load_before_generating():
    llm = FakeLLM(_state(0.0))
    eng = _engine(llm, enable_sleep_mode=True, sleep_level=2)
    eng.sleep()
    with pytest.raises(RuntimeError, match="level 2"):
        eng.generate([[1]], P)
    eng.load_weights(_state(1.0), 1)
    assert eng.generate([[1]], P)[0].weight_version == 1
    eng.sleep(level=1)
    assert eng.generate([[1]], P)[0].weight_version == 1  # level 1: wakes itself


def test_weight_sync_rank_offsets_never_collide():
    assert weight_sync_ranks([2, 1, 1, 1]) == ([1, 3, 4, 5], 6)
    assert weight_sync_ranks([4, 2]) == ([1, 5], 7)
    offsets, world = weight_sync_ranks([3, 1, 2, 1])
    blocks = [set(range(o, o + s)) for o, s in zip(offsets, [3, 1, 2, 1], strict=True)]
    assert set().union(*blocks) == set(range(1, world)) and sum(map(len, blocks)) == world - 1
    with pytest.raises(ValueError):
        weight_sync_ranks([1, 0])
    cfg = load_config(None, ["proposer.engine=vllm", "proposer.tensor_parallel_size=2",
                             "solver.engine=vllm", "solver.tensor_parallel_size=4",
                             "scorer.num_scorers=2"])
    assert receiver_sizes(cfg) == [2, 4, 1, 1]
    assert weight_sync_ranks(receiver_sizes(cfg)) == ([1, 3, 7, 8], 9)


def test_make_generator_passes_vllm_options_and_role_needs_only_a_tokenizer(tmp_path,
                                                                          monkeypatch):
    from compassplay.models.byte_tokenizer import build_byte_tokenizer
    from compassplay.workers import builders

    build_byte_tokenizer().save_pretrained(tmp_path)  # no model weights: none are loaded
    (tmp_path / "config.json").write_text("{}")
    cfg = load_config(None, [
        "model.source=local", f"model.name_or_path={tmp_path}", "model.dtype=bfloat16",
        "run.seed=7", "solver.engine=vllm", "solver.tensor_parallel_size=2",
        "solver.max_model_len=4096", "solver.enable_sleep_mode=true", "solver.sleep_level=2",
        "solver.gpu_memory_utilization=0.7", "solver.kv_cache_mb=64"])
    tok = builders.load_tokenizer(cfg)
    assert tok.encode("ab", add_special_tokens=False)
    seen = {}
    monkeypatch.setattr(builders, "make_generation_engine",
                        lambda kind, model, tokenizer, **kw: seen.update(kind=kind, model=model,
                                                                         **kw))
    builders.make_generator(cfg, cfg.solver, None, tok)
    assert seen == {"kind": "vllm", "model": str(tmp_path), "dtype": "bfloat16", "seed": 7,
                    "gpu_memory_utilization": 0.7, "tensor_parallel_size": 2,
                    "enable_sleep_mode": True, "sleep_level": 2, "max_model_len": 4096,
                    "role": "solver", "bucket_bytes": cfg.learner.sync_bucket_mb << 20,
                    "kv_cache_bytes": 64 << 20}


def test_generator_role_receives_ipc_and_sleeps_after_generation():
    from compassplay.workers.generator_workers import SolverWorker

    cfg = load_config(None, ["solver.engine=vllm", "solver.enable_sleep_mode=true",
                             "learner.weight_sync=ipc"])
    role = SolverWorker.__new__(SolverWorker)  # no model, no environment needed here
    llm = FakeLLM(_state(0.0))
    role.cfg, role.section = cfg, cfg.solver
    role.engine = _engine(llm, enable_sleep_mode=True)
    role.after_generation()
    assert role.engine.asleep
    with publish({"fake-gpu-0": list(_state(1.0).items())}, 1) as update:
        assert role.receive_ipc((1, update.path)) == 1
        assert role.receive_ipc((1, update.path)) == 1  # already held: no second load
    assert role.weight_version == 1 and not role.engine.asleep
    assert _rpcs(llm).count("compassplay_load_ipc") == 1


def test_ipc_config_checks():
    from compassplay.config import ConfigError
    from compassplay.sync.channel import check_weight_sync

    with pytest.raises(ConfigError, match="learner.weight_sync=ipc.*proposer.engine=vllm"):
        load_config(None, ["learner.weight_sync=ipc"])
    with pytest.raises(ConfigError, match="solver.tensor_parallel_size must be 1"):
        load_config(None, ["learner.weight_sync=ipc", "solver.engine=vllm",
                           "solver.enable_sleep_mode=true", "solver.tensor_parallel_size=2"])
    with pytest.raises(ConfigError, match="tensor_parallel_size.*vllm options"):
        load_config(None, ["proposer.tensor_parallel_size=2"])
    # a vLLM role loads the bootstrap in place (tests/warmup/test_bootstrap.py)
    assert load_config(None, ["solver.engine=vllm", "bootstrap.enabled=true"]).bootstrap.enabled
    with pytest.raises(ConfigError, match="weight_sync=ipc: needs learner.num_ranks=1"):
        load_config(None, ["learner.weight_sync=ipc", "solver.engine=vllm",
                           "solver.enable_sleep_mode=true", "learner.backend=deepspeed",
                           "learner.num_ranks=2"])
    cfg = load_config(None, ["learner.weight_sync=ipc", "solver.engine=vllm",
                             "solver.enable_sleep_mode=true"])
    with pytest.raises(ConfigError, match=r"cluster\.learner\.num_gpus, cluster\.solver"):
        check_weight_sync(cfg, embedded=False)
    check_weight_sync(load_config(None, [
        "learner.weight_sync=ipc", "solver.engine=vllm", "solver.enable_sleep_mode=true",
        "cluster.learner.num_gpus=0.5", "cluster.solver.num_gpus=0.5"]), embedded=False)


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_abort_and_error_finish_reasons_are_failures(reason):
    llm = FakeLLM(_state(0.0))
    llm.finish_reason = reason
    gen = _engine(llm).generate([[1]], P)[0]
    assert gen.finish_reason == "error" and gen.failed and reason in gen.error


def test_sleep_mode_and_gpu_transports_are_refused_on_cpu():
    from compassplay.config import ConfigError

    with pytest.raises(ConfigError, match="proposer.enable_sleep_mode=true"):
        _engine(FakeLLM(_state(0.0)), device="cpu", enable_sleep_mode=True, role="proposer")
    eng = _engine(FakeLLM(_state(0.0)), device="cpu")
    with pytest.raises(ConfigError, match="learner.weight_sync=nccl"):
        eng.receive_weights_broadcast(1)
    eng.load_weights(_state(1.0), 1)  # tensors in the RPC: every platform
    assert eng.weight_version == 1


def test_disabled_pynccl_is_an_error():
    from types import SimpleNamespace

    from compassplay.sync.pynccl import check_enabled

    check_enabled(SimpleNamespace(disabled=False, available=True), 1, 3)
    with pytest.raises(RuntimeError, match="PyNcclCommunicator is disabled on weight-sync rank 2"):
        check_enabled(SimpleNamespace(disabled=True, available=False), 2, 3)


def test_templated_requests_carry_the_regex_and_the_model_logprobs_of_a_rescoring():
    """A templated request goes out with structured outputs (the template's regex) and a
    length that leaves a token of the context for the re-scoring; the reply's log-probs are
    the re-scoring's (the prompt log-probs of prompt + reply), not the masked ones."""
    import re

    from compassplay.engines.generation.base import Segment
    from compassplay.engines.generation.template_regex import template_regex
    from tests.engines.fake_vllm import fake_structured_outputs

    tpl = (Segment("```", "\n```input\n", 8, ends=("\n\n",)), Segment("```", "", 4, ("\n",)))
    llm = FakeLLM(_state(0.0))
    llm.model_config = type("C", (), {"max_model_len": 10})()
    eng = _engine(llm, structured_outputs_cls=fake_structured_outputs)
    gens = eng.generate([[1, 2, 3], [4] * 9, [5] * 8],
                        SamplingParams(max_new_tokens=40, template=tpl))
    (sent, rescore) = llm.requests
    assert [len(p["prompt_token_ids"]) for p, _ in sent] == [3, 8]  # 9 leaves no room
    assert gens[1].finish_reason == "rejected" and gens[2].finish_reason == "stop"
    assert "templated reply and its re-scoring" in gens[1].error
    assert sent[1][1]["max_tokens"] == 1
    params = sent[0][1]
    assert params["structured_outputs"] == {"structured_outputs": {"regex": template_regex(tpl)}}
    assert re.fullmatch(params["structured_outputs"]["structured_outputs"]["regex"],
                        "x\n```\n```input\n3\n```")
    assert params["max_tokens"] == 10 - 1 - 3 and params["stop"] is None
    assert rescore[0][0]["prompt_token_ids"] == [1, 2, 3, *gens[0].completion_ids]
    assert rescore[0][1]["prompt_logprobs"] == 0 and rescore[0][1]["max_tokens"] == 1
    assert gens[0].logprobs == [-0.25] * len(gens[0].completion_ids)
    free = eng.generate([[1, 2, 3], [4] * 9], SamplingParams(max_new_tokens=40))
    assert [g.logprobs for g in free] == [[-0.5]] * 2  # 9 tokens leave room for a free reply
    assert "structured_outputs" not in llm.requests[-1][0][1]
    assert len(llm.requests) == 3  # no re-scoring without a template


def test_a_template_without_structured_outputs_is_a_config_error():
    from compassplay.config import ConfigError
    from compassplay.engines.generation.base import Segment

    eng = _engine(FakeLLM(_state(0.0)), role="proposer")
    with pytest.raises(ConfigError, match=r"proposer\.template=true with engine vllm"):
        eng.generate([[1]], SamplingParams(template=(Segment("```"),)))


def test_structured_outputs_need_the_params_class_and_a_grammar_backend(monkeypatch):
    import importlib.util
    import sys
    from types import ModuleType

    from compassplay.engines.generation.vllm import structured_outputs_of

    fake = ModuleType("vllm")
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", ModuleType("vllm.sampling_params"))
    assert structured_outputs_of()[2].startswith("this vLLM has no StructuredOutputsParams")
    sp = sys.modules["vllm.sampling_params"]
    sp.StructuredOutputsParams = dict  # type: ignore[attr-defined]
    real = importlib.util.find_spec
    have = {"xgrammar": False, "llguidance": True}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if have.get(name, False) else
                        (None if name in have else real(name, *a)))
    assert structured_outputs_of() == (dict, "guidance", "")
    have["xgrammar"] = True
    assert structured_outputs_of()[1] == "xgrammar"
    have.update(xgrammar=False, llguidance=False)
    cls, backend, why = structured_outputs_of()
    assert cls is None and backend == "" and "neither xgrammar nor llguidance" in why
