from __future__ import annotations

import argparse
import os

import pytest
import torch

from compassplay.bench import generate
from compassplay.config import ConfigError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    generate.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_bench_generate_micro_json():
    out = generate.run(_args("--json", "--batch-size", "2", "--new-tokens", "4",
                             "--prompt-tokens", "3", "--reps", "1"))
    assert out["engine"] == "hf" and out["model"] == "micro"
    assert out["completion_tokens"] == 8 and out["tokens_per_s"] > 0
    assert out["results"][0]["batch_size"] == 2 and out["new_tokens"] == 4


def test_bench_generate_vllm_unavailable(capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ConfigError, match="make setup"):
        generate.run(_args("--engine", "vllm", "--reps", "1"))
    assert generate.main(["--engine", "both", "--json"]) == 2
    assert "vllm" in capsys.readouterr().err


def test_bench_generate_both_engines_same_prompts_side_by_side(monkeypatch):
    """The wiring of `--engine both` (the real vLLM engine's numbers: docs/measurements)."""
    from compassplay.engines.generation.vllm import VLLMGenerationEngine
    from tests.engines.fake_vllm import FakeLLM, fake_sampling_params

    real, seen = generate._engine, {}

    workdirs = []

    def engine(kind, name, device, seed, workdir):
        assert os.path.isdir(workdir)
        workdirs.append(workdir)
        if kind == "hf":
            eng, vocab = real(kind, name, device, seed, workdir)
        else:
            eng, vocab = VLLMGenerationEngine("unused", tokenizer=object(), llm=FakeLLM(
                {"w": torch.ones(2)}), sampling_params_cls=fake_sampling_params,
                device="cpu"), 256
        gen = eng.generate
        eng.generate = lambda prompts, params: seen.setdefault(kind, []).append(
            prompts) or gen(prompts, params)
        return eng, vocab

    monkeypatch.setattr(generate, "_engine", engine)
    out = generate.run(_args("--engine", "both", "--batch-size", "2", "--new-tokens", "4",
                             "--prompt-tokens", "3", "--reps", "1"))
    hf, vllm = out["results"]
    assert len(workdirs) == 2 and not any(os.path.exists(w) for w in workdirs)  # cleaned up
    assert (hf["engine"], hf["device"], vllm["engine"], vllm["device"]) == (
        "hf", "cpu", "vllm", "cpu")
    assert seen["hf"][-1] == seen["vllm"][-1] and vllm["tokens_per_s"] > 0
    assert {tuple(map(tuple, p)) for p in seen["hf"]} == {tuple(map(tuple, p))
                                                          for p in seen["vllm"]}
    assert hf["fraction_of_bound"] > 0 and vllm["fraction_of_bound"] > 0


def test_bench_generate_decoders_agree_and_carry_their_bound():
    """`hf` (static decoder) and `hf-module` on the same prompts: greedy outputs compared, and
    both measured against one bound measured in the same run."""
    out = generate.run(_args("--engine", "hf", "--batch-size", "3", "--new-tokens", "6",
                             "--prompt-tokens", "5", "--reps", "1"))
    alone = out["results"][0]
    assert "greedy_equal_to" not in alone  # nothing to compare with
    b = out["bounds"]["micro"]
    assert 0 < b["prefill_s"] < b["bound_s"] <= b["roofline_s"]
    assert b["weight_stream_s"] > 0 and b["matmul_gflop_per_s"] > 0
    assert alone["fraction_of_bound"] == pytest.approx(b["bound_s"] / alone["seconds"])
    parser = argparse.ArgumentParser()
    generate.add_arguments(parser)
    args = parser.parse_args(["--batch-size", "3", "--new-tokens", "6", "--prompt-tokens", "5",
                              "--reps", "1"])
    results = [generate.bench_one(k, "micro", args) for k in ("hf", "hf-module")]
    generate.with_bound(results, b)
    assert results[1]["greedy_equal_to"] == {"engine": "hf", "sequences": 1.0, "tokens": 1.0}


def test_greedy_agreement_counts_sequences_and_positions():
    assert generate.greedy_agreement([[1, 2, 3], [4, 5]], [[1, 2, 9], [4, 5]]) == {
        "sequences": 0.5, "tokens": 0.8}


def test_roofline_counts_follow_the_model():
    from compassplay.bench import roofline
    from compassplay.config import ModelSection
    from compassplay.models import load_model

    model, _ = load_model(ModelSection(source="tiny"))
    s = roofline.shape_of(model)
    linear = sum(m.weight.numel() for m in model.model.layers.modules()
                 if isinstance(m, torch.nn.Linear))
    assert s.block_params == linear
    assert s.weight_bytes == 4 * sum(p.numel() for p in model.parameters())  # tied once
    one = roofline.transformer_flops(s, 1, 0, 0)
    assert one == 2 * linear
    assert roofline.transformer_flops(s, 2, 10, 1) == 2 * one + 40 * s.layers * s.heads * \
        s.head_dim + 2 * s.vocab * s.hidden
    short = roofline.generation_bounds(s, 2, 8, 4, 1e-3, 1e9)
    long = roofline.generation_bounds(s, 2, 8, 8, 1e-3, 1e9)
    assert long["decode_stream_s"] == pytest.approx(7e-3) and short["decode_stream_s"] == \
        pytest.approx(3e-3)
    assert long["roofline_s"] >= long["bound_s"] > short["bound_s"]
    # an engine that prefilled half the columns (a shared prefix, equal rows once)
    half = roofline.generation_bounds(s, 2, 8, 4, 1e-3, 1e9, prefill_columns=8)
    head = 2 * s.vocab * s.hidden * 2 / 1e9  # the last position's logits of both rows
    assert half["prefill_s"] == pytest.approx((short["prefill_s"] - head) / 2 + head)


def test_bench_generate_bf16_carries_its_own_bound_and_the_distribution_shift():
    args = _args("--engine", "hf-bf16", "--batch-size", "2", "--new-tokens", "5",
                 "--prompt-tokens", "6", "--reps", "1")
    out = generate.run(args)
    r, b = out["results"][0], out["bounds"]["micro"]
    assert r["engine"] == "hf-bf16" and r["completion_tokens"] == 10
    assert b["bf16"]["weight_stream_s"] > 0 and b["bf16"]["matmul_gflop_per_s"] > 0
    assert r["fraction_of_bf16_bound"] == pytest.approx(b["bf16"]["bound_s"] / r["seconds"])
    assert r["fraction_of_bound"] == pytest.approx(b["bound_s"] / r["seconds"])
    shift = r["distribution_vs_float32"]
    assert shift["positions"] == 10 and 0.0 <= shift["top1_agreement"] <= 1.0
    assert shift["kl_mean_nats"] >= 0.0


def test_bench_generate_compares_the_fused_kernels_with_torch_ops_in_one_run():
    """`--engine hf-bf16,hf-bf16-c`: both on the same prompts, the fused engine with its
    greedy agreement and teacher-forced distance to the torch-op engine, and to float32."""
    from compassplay.engines.generation.decode_kernels import load

    if load() is None:
        pytest.skip("no C compiler builds the kernels")
    out = generate.run(_args("--engine", "hf-bf16,hf-bf16-c", "--batch-size", "2",
                             "--new-tokens", "5", "--prompt-tokens", "6", "--reps", "1"))
    ops, fused = out["results"]
    assert (ops["engine"], fused["engine"]) == ("hf-bf16", "hf-bf16-c")
    assert fused["greedy_equal_to"]["engine"] == "hf-bf16"
    assert {"engine": "hf-bf16", **fused["greedy_equal_to_torch_ops"]} == \
        fused["greedy_equal_to"]
    assert "greedy_equal_to_torch_ops" not in ops and "distribution_vs_torch_ops" not in ops
    near = fused["distribution_vs_torch_ops"]
    assert near["positions"] == 10 and near["top1_agreement"] >= 0.9
    assert near["kl_mean_nats"] < 1e-3
    assert fused["fraction_of_bf16_bound"] > 0 and fused["decode_dtype"] == "bfloat16"


def test_bench_generate_compares_the_float32_kernels_with_torch_ops_in_one_run():
    """`--engine hf,hf-c`: the float32 decoder on torch ops and on the kernels (the default
    on a CPU without fast bfloat16), on the same prompts: the same greedy completions (the
    two differ only in float32 summation order)."""
    from compassplay.engines.generation.decode_kernels import load

    if load(dtype=torch.float32) is None:
        pytest.skip("no C compiler builds the kernels")
    out = generate.run(_args("--engine", "hf,hf-c", "--batch-size", "2",
                             "--new-tokens", "5", "--prompt-tokens", "6", "--reps", "1"))
    ops, fused = out["results"]
    assert (ops["engine"], fused["engine"]) == ("hf", "hf-c")
    assert fused["decode_dtype"] == ops["decode_dtype"] == "float32"
    assert fused["greedy_equal_to_torch_ops"] == {"sequences": 1.0, "tokens": 1.0}
    assert "greedy_equal_to_torch_ops" not in ops and "fraction_of_bf16_bound" not in fused


def test_bench_generate_names_an_unknown_engine():
    with pytest.raises(SystemExit):
        _args("--engine", "hf,fast")
    assert generate.engine_list("hf,hf-bf16-c") == "hf,hf-bf16-c"
    with pytest.raises(argparse.ArgumentTypeError, match="'hf,fast'"):
        generate.engine_list("hf,fast")


@pytest.mark.parametrize("engine", ["hf", "hf-c", "hf-bf16", "hf-bf16-c"])
def test_static_decoder_engines_carry_their_matmul_floor(engine):
    """The floor is the prefill at the decoder dtype's matmul rate plus one timed pass of the
    decode step's matmuls per step."""
    out = generate.run(_args("--engine", engine, "--batch-size", "3", "--new-tokens", "6",
                             "--prompt-tokens", "5", "--reps", "1"))
    r, b = out["results"][0], out["bounds"]["micro"]
    bf16 = engine.startswith("hf-bf16")
    assert r["decode_dtype"] == ("bfloat16" if bf16 else "float32")
    prefill = (b["bf16"] if bf16 else b)["prefill_s"]
    assert r["decode_matmul_s"] > 0
    assert r["matmul_floor_s"] == pytest.approx(prefill + 5 * r["decode_matmul_s"])
    assert r["fraction_of_matmul_floor"] == pytest.approx(r["matmul_floor_s"] / r["seconds"])
    # > 0 only: the floor's parts are timed apart from the call (the prefill in the bound's
    # own run), so on a busy machine the micro model's 6-token floor can exceed its call
    assert r["fraction_of_matmul_floor"] > 0


def test_module_engine_has_no_matmul_floor():
    out = generate.run(_args("--engine", "hf-module", "--batch-size", "2", "--new-tokens", "3",
                             "--prompt-tokens", "4", "--reps", "1"))
    assert "matmul_floor_s" not in out["results"][0]


def test_decode_matmuls_use_the_packs_a_step_of_those_rows_uses():
    """After `decode_matmuls(rows)` a decode step at that row count packs no weight again:
    the floor times the kernels a step runs."""
    from compassplay.engines.generation.static_decoder import StaticDecoder
    from compassplay.models import load_model

    model, _ = load_model(generate.MODELS["micro"], seed=0)
    dec = StaticDecoder(model)
    with torch.no_grad():
        dec.decode_matmuls(3)
        packed = {rows: {k: id(w) for k, w in p.items()} for rows, p in dec._packed.items()}
        n_weights = 4 * len(dec.blocks) + 1
        if dec.pack is not None:
            assert list(packed) == [3] and len(packed[3]) == n_weights
        ids = torch.randint(0, 100, (3, 4))
        dec.start(ids, torch.zeros(3, dtype=torch.long), 8)
        dec.step(ids[:, 0])
    assert {rows: {k: id(w) for k, w in p.items()} for rows, p in dec._packed.items()} == packed
