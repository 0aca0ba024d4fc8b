from __future__ import annotations

import argparse
import importlib.util

import pytest

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


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm installed")
def test_bench_generate_vllm_unavailable(capsys):
    with pytest.raises(ConfigError, match=r"compassplay\[gpu\]"):
        generate.run(_args("--engine", "vllm", "--reps", "1"))
    assert generate.main(["--engine", "vllm", "--json"]) == 2
    assert "vllm" in capsys.readouterr().err
