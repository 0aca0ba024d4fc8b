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
    from compassplay.engines.vllm_generation import VLLMGenerationEngine
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
    assert seen["hf"] == seen["vllm"] and vllm["tokens_per_s"] > 0
