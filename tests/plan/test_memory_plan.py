"""The GPU memory plan (plan/memory.py): the 7B configs' arithmetic by hand, colocated
roles that do not fit (ConfigError naming the field), ones that do, and the shapes' parameter
counts against transformers models built on the meta device."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from compassplay.config import ConfigError, load_config
from compassplay.plan import memory as mp
from compassplay.plan.shapes import (
    DEEPSEEK_PROVER_7B,
    QWEN25_CODER_7B,
    SMOLLM2_135M,
    TINY_VOCAB,
    shape_of,
)

GiB = 2**30
P7 = 7_615_616_512  # Qwen2.5-Coder-7B
SEVEN_B = ["paper_coding_7b", "baseline_difficulty_7b", "baseline_novelty_7b",
           "ablation_cos_novelty_7b", "baseline_soar_7b"]


def _gib(b: float) -> float:
    return round(b / GiB, 2)


# ------------------------------------------------------------------------------ shapes
def test_qwen_coder_7b_parameters_by_hand():
    h, i, kv, v, layers = 3584, 18944, 4 * 128, 152064, 28
    block = h * h + 2 * h * kv + h * h + (h + 2 * kv) + 3 * h * i + 2 * h
    assert block == 233_057_792
    assert QWEN25_CODER_7B.params() == layers * block + 2 * v * h + h == P7
    assert _gib(P7 * 2) == 14.19  # bf16 weights: 15.23 GB


def _meta_count(shape) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if shape.qkv_bias else \
        (LlamaConfig, LlamaForCausalLM)
    cfg = cfg_cls(vocab_size=shape.vocab, hidden_size=shape.hidden,
                  intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
                  num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                  tie_word_embeddings=shape.tied)
    with torch.device("meta"):
        return sum(p.numel() for p in model_cls(cfg).parameters())


@pytest.mark.parametrize("shape, count", [(QWEN25_CODER_7B, P7),
                                          (DEEPSEEK_PROVER_7B, 6_910_365_696),
                                          (SMOLLM2_135M, 134_515_008)])
def test_shape_counts_match_transformers(shape, count):
    assert shape.params() == count == _meta_count(shape)


def test_smollm2_count_is_the_checkpoint_file_when_cached():
    """134,515,008 is what SmolLM2-135M-Instruct's converted safetensors hold."""
    from compassplay.models.loading import default_cache_dir

    path = default_cache_dir() / "smollm2-135m-instruct" / "model.safetensors"
    if not path.is_file():
        pytest.skip("SmolLM2 not converted on this machine")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        n = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    assert n == SMOLLM2_135M.params()


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def test_tiny_and_local_shapes_match_the_models_they_build():
    from compassplay.models.byte_tokenizer import build_byte_tokenizer
    from compassplay.models.loading import load_tiny

    assert TINY_VOCAB == len(build_byte_tokenizer())
    for name in ("micro", "micro_warm"):
        cfg = load_config(name)
        shape, _ = shape_of(cfg.model)
        if cfg.model.source == "tiny":
            model, _ = load_tiny(cfg.model.tiny, 0)
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path)
        assert shape.params() == sum(p.numel() for p in model.parameters()), name


def test_unknown_models_are_skipped_not_failed():
    cfg = load_config("micro", ["model.source=hub", "model.name_or_path=nobody/unknown-7b",
                                "cluster.learner.num_gpus=1"])
    plan = mp.plan_memory(cfg)
    assert "nobody/unknown-7b" in plan.to_dict()["skipped"]


# ------------------------------------------------------------------------------ 7B configs
@pytest.mark.parametrize("name", SEVEN_B)
def test_every_7b_config_fits_its_stated_gpus(name):
    cfg = load_config(name)
    plan = mp.plan_memory(cfg)
    assert plan.gpus and all(g.need <= g.total for g in plan.gpus)
    assert sorted(len(g.roles) for g in plan.gpus) == [1] * 8  # 8 whole GPUs, none shared
    assert plan.to_dict()["model"]["params"] == P7


def test_paper_7b_arithmetic_by_hand():
    """80 GiB GPUs, bf16 (2 bytes/param), ZeRO-3 over 4 ranks, micro-batches of 2 x 8,192
    tokens with gradient checkpointing, scorer passes of 5,120 tokens."""
    plan = mp.plan_memory(load_config("paper_coding_7b"))
    roles = {r.name: r for r in plan.roles}
    need = {g.roles[0]: g.need for g in plan.gpus}
    ctx = GiB // 2

    # vLLM: 0.85 x 80 = 68 GiB of which 14.19 weights, 2 working, 51.81 KV (56 KiB/token)
    prop = roles["proposer"]
    assert prop.parts["reserved"] == int(0.85 * 80 * GiB)
    assert prop.parts["weights"] == 2 * P7
    kv_per_token = 2 * 28 * 512 * 2
    assert kv_per_token == 57_344
    assert prop.parts["kv_cache"] == int(0.85 * 80 * GiB) - 2 * P7 - 2 * GiB
    assert prop.parts["kv_cache"] // kv_per_token == 970_210  # tokens in flight
    assert _gib(need["proposer"]) == 68.5  # + one CUDA context

    # learner rank: 16 bytes/param (bf16 weights 2 + grads 2, fp32 master 4 + 2 moments 8) / 4
    lr = roles["learner-0"]
    assert lr.parts["weights"] == lr.parts["grads"] == 2 * P7 // 4
    assert lr.parts["optimizer"] == 12 * P7 // 4
    assert _gib(16 * P7 / 4) == 28.37
    assert lr.parts["zero3_live"] == 2 * 10**9 and lr.parts["reduce_bucket"] == 10**9
    per_token = 28 * 3584 * 2 + (12 * 3584 + 4 * 18944 + 4 * 512) * 2 + 152064 * (2 + 12)
    assert per_token == 2_571_264  # block inputs + one block recomputed + the head
    assert lr.parts["activations"] == 2 * 8192 * per_token
    assert _gib(lr.parts["activations"]) == 39.23
    assert need["learner-0"] == 16 * P7 // 4 + 3 * 10**9 + 2 * 8192 * per_token + ctx
    assert _gib(need["learner-0"]) == 70.9

    # scorer (param_shard over 2): bf16 weights + fp32 reference gradient of half the
    # parameters + one 5,120-token pass without checkpointing (8.48 MiB/token)
    sc = roles["scorer-0"]
    no_ckpt = 28 * (12 * 3584 + 4 * 18944 + 4 * 512) * 2 + 152064 * 14
    assert no_ckpt == 8_895_488
    assert sc.parts["reference_grad"] == 4 * (P7 // 2)
    assert sc.parts["activations"] == 5120 * no_ckpt
    assert need["scorer-0"] == 2 * P7 + 4 * (P7 // 2) + 5120 * no_ckpt + 64 * 2**20 + ctx
    assert _gib(need["scorer-0"]) == 71.35


def test_the_7b_config_before_the_fix_does_not_fit():
    """The shipped settings before issue 22: micro-batches of 8 sequences of the model's
    32,768-token context without checkpointing, 8,192-token scorer passes."""
    old = ["proposer.max_model_len=0", "solver.max_model_len=0", "learner.micro_batch=8",
           "learner.gradient_checkpointing=false", "scorer.max_batch_tokens=8192"]
    with pytest.raises(ConfigError, match=r"^learner\.micro_batch: .* need 2203\.41 GiB"):
        mp.plan_memory(load_config("paper_coding_7b", old))
    fixed_learner = old[:2] + ["learner.micro_batch=2", "learner.gradient_checkpointing=true",
                               "proposer.max_model_len=8192"]
    with pytest.raises(ConfigError, match=r"^solver\.max_model_len: .*scorer-0"):
        mp.plan_memory(load_config("paper_coding_7b", fixed_learner))


def test_soar_7b_needs_h200s():
    """SOAR's trained copy: weights + copy + gradients 3 x 14.19, AdamW moments 28.37 and a
    5,120-token pass 42.42 GiB = 113.34 GiB per scorer."""
    cfg = load_config("baseline_soar_7b")
    assert cfg.cluster.gpu_memory_gib == 141
    sc = {r.name: r for r in mp.plan_memory(cfg).roles}["scorer-0"]
    assert sc.parts["soar_optimizer"] == 2 * 2 * P7
    assert _gib(sc.phases["score"]) == 113.34
    with pytest.raises(ConfigError, match=r"need 113\.84 GiB .* has 80\.0 GiB"):
        mp.plan_memory(cfg, gpu_gib=80)


# ------------------------------------------------------------------------------ colocation
SMOL_GPU = ["model.dtype=bfloat16", "proposer.engine=vllm", "solver.engine=vllm",
            "proposer.max_model_len=2048", "solver.max_model_len=2048",
            "proposer.kv_cache_mb=0", "solver.kv_cache_mb=0", "learner.trainable=all",
            "scorer.params=all", "learner.micro_batch=2", "scorer.dtype=bfloat16",
            "pipeline.staleness=0"]


def _one_gpu(util: float, extra: list[str] = ()) -> list[str]:
    """Proposer, solver and learner as fractions of one GPU (0.3 + 0.3 + 0.4)."""
    return SMOL_GPU + [f"proposer.gpu_memory_utilization={util}",
                       f"solver.gpu_memory_utilization={util}",
                       "cluster.proposer.num_gpus=0.3", "cluster.solver.num_gpus=0.3",
                       "cluster.learner.num_gpus=0.4", *extra]


def test_two_engines_at_half_and_a_learner_cannot_share_a_gpu():
    """vLLM's fraction is of the GPU's total memory, checked against the free memory at the
    engine's start: 0.5 + 0.5 leaves nothing for the learner on the same GPU."""
    cfg = load_config("default_vllm", _one_gpu(0.5))
    with pytest.raises(ConfigError) as err:
        mp.plan_memory(cfg)
    msg = str(err.value)
    assert msg.startswith("proposer.gpu_memory_utilization: ")
    assert "(learner, proposer, solver)" in msg and "proposer 40.0 + solver 40.0" in msg
    assert "must add up to at most 1" in msg and "proposer 0.50 + solver 0.50" in msg


def test_engines_that_leave_room_share_the_gpu():
    plan = mp.plan_memory(load_config("default_vllm", _one_gpu(0.25)))
    (gpu,) = plan.gpus
    assert gpu.roles == ["learner", "proposer", "solver"] and gpu.need <= gpu.total
    roles = {r.name: r for r in plan.roles}
    p = SMOLLM2_135M.params()
    # torch backend: bf16 weights + AdamW's 2 bf16 moments; gradients freed after the step
    assert roles["learner"].phases["generate"] == (2 + 2 * 2) * p
    # learn (engines awake: no sleep mode): 20 + 20 GiB + the learner's peak (weights,
    # gradients, moments, 2 x 2,048 tokens of activations) + 3 CUDA contexts
    per_token = 30 * (12 * 576 + 4 * 1536 + 4 * 192) * 2 + 49152 * 14
    assert per_token == 1_517_568
    assert gpu.phase == "learn"
    assert gpu.need == 2 * int(0.25 * 80 * GiB) + 8 * p + 4096 * per_token + 3 * GiB // 2
    assert _gib(gpu.need) == 48.29


def test_an_engine_asks_for_its_whole_fraction_at_start_even_with_kv_cache_mb():
    """vLLM 0.32 checks gpu_memory_utilization x total against the free memory at start even
    when kv_cache_mb sizes the KV cache: 0.9 of the GPU is not free beside the other roles."""
    fixed = ["proposer.kv_cache_mb=256", "solver.kv_cache_mb=256"]
    plan = mp.plan_memory(load_config("default_vllm", _one_gpu(0.5, fixed)))
    roles = {r.name: r for r in plan.roles}
    held = roles["proposer"].phases["generate"]
    assert held == 2 * SMOLLM2_135M.params() + 2 * GiB + 256 * 2**20  # weights, working, KV
    assert roles["proposer"].start_extra == int(0.5 * 80 * GiB) - held
    assert plan.gpus[0].phase == "start"
    with pytest.raises(ConfigError, match=r"^proposer\.gpu_memory_utilization: .* starts"):
        mp.plan_memory(load_config("default_vllm", _one_gpu(0.95, fixed)))


def test_sleeping_engines_free_the_gpu_for_the_learner_only_without_overlap():
    """0.45 + 0.45 of the GPU for the engines: the learner's peak fits only while they sleep
    (sleep mode, pipeline.staleness 0); with staleness 1 rollout overlaps learning."""
    base = _one_gpu(0.45, ["learner.micro_batch=4"])
    with pytest.raises(ConfigError, match=r"the learn phase"):
        mp.plan_memory(load_config("default_vllm", base))
    sleeping = base + ["proposer.enable_sleep_mode=true", "solver.enable_sleep_mode=true"]
    plan = mp.plan_memory(load_config("default_vllm", sleeping))
    roles = {r.name: r for r in plan.roles}
    assert roles["proposer"].phases["learn"] == 0 < roles["proposer"].phases["generate"]
    with pytest.raises(ConfigError, match=r"the learn phase"):
        mp.plan_memory(load_config("default_vllm", sleeping + ["pipeline.staleness=1"]))


def test_ray_may_pair_any_fractional_roles():
    """Half-GPU learner, scorer, proposer and solver: Ray may put any two on one GPU."""
    cfg = load_config("default_vllm", SMOL_GPU + [
        "cluster.learner.num_gpus=0.5", "cluster.scorer.num_gpus=0.5",
        "cluster.proposer.num_gpus=0.5", "cluster.solver.num_gpus=0.5",
        "proposer.gpu_memory_utilization=0.3", "solver.gpu_memory_utilization=0.3"])
    plan = mp.plan_memory(cfg)
    assert sorted(tuple(g.roles) for g in plan.gpus) == sorted(
        [("learner", "scorer-0"), ("learner", "proposer"), ("learner", "solver"),
         ("scorer-0", "proposer"), ("scorer-0", "solver"), ("proposer", "solver")])
    local = mp.plan_memory(cfg, executor="local")  # one process, one GPU for all four
    assert [g.roles for g in local.gpus] == [["learner", "scorer-0", "proposer", "solver"]]


def test_an_engine_without_room_for_one_sequence_names_its_fraction():
    cfg = load_config("paper_coding_7b", ["solver.gpu_memory_utilization=0.2"])
    with pytest.raises(ConfigError, match=r"^solver\.gpu_memory_utilization: .* KV cache"):
        mp.plan_memory(cfg)


def test_colocated_learners_release_their_cache():
    assert not mp.colocated(load_config("paper_coding_7b"))
    assert mp.colocated(load_config("default_vllm", _one_gpu(0.25)))
    assert mp.colocated(load_config("default_vllm", SMOL_GPU + [
        "cluster.learner.num_gpus=1", "solver.enable_sleep_mode=true"]))


# ------------------------------------------------------------------------------ dry run
def test_dry_run_exits_2_naming_the_field(capsys):
    from compassplay.cli import main

    # the shipped seed programs: AZR's seed sets live in $COMPASSPLAY_DATA_DIR
    assert main(["run", "--config", "paper_coding_7b", "--dry-run",
                 "--gpu-memory-gib", "48", "task.seed_file=simple"]) == 2
    err = capsys.readouterr().err
    assert "gpu_memory_utilization" in err or "learner." in err or "scorer." in err
    assert "48.0 GiB" in err


def test_the_core_needs_neither_ray_nor_torch():
    root = Path(mp.__file__).parent
    for path in sorted(root.glob("*.py")):  # plan/: memory, role_memory, shapes, resources
        name = path.name
        tree = ast.parse(path.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in mods if m.split(".")[0] in ("ray", "torch")}, name
    code = ("import sys; from compassplay.config import load_config; "
            "from compassplay.plan.memory import plan_memory; "
            "from compassplay.plan.resources import requests; "
            "plan_memory(load_config('paper_coding_7b')); requests(load_config('paper_coding_7b')); "
            "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(mp.__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
