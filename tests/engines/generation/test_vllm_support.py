"""`cpu_scheduler_kwargs`: on vLLM's CPU platform chunked prefill is off and one step's token
budget covers the longest prompt (the real engine's run: tests/engines/generation/test_vllm.py)."""

from __future__ import annotations

import json

import pytest

from compassplay.config import ConfigError
from compassplay.engines.generation.vllm_support import CPU_BATCHED_TOKENS, cpu_scheduler_kwargs


def test_budget_covers_the_context_from_the_config_or_the_models_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert cpu_scheduler_kwargs(str(tmp_path), {}, "solver") == {
        "enable_chunked_prefill": False, "max_num_batched_tokens": 8192}
    assert cpu_scheduler_kwargs(str(tmp_path), {"max_model_len": 2048}, "solver") == {
        "enable_chunked_prefill": False, "max_num_batched_tokens": CPU_BATCHED_TOKENS}
    got = cpu_scheduler_kwargs(str(tmp_path), {"max_model_len": 256,
                                               "max_num_batched_tokens": 512}, "solver")
    assert got["max_num_batched_tokens"] == 512


def test_a_model_without_a_context_length_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"proposer\.max_model_len"):
        cpu_scheduler_kwargs(str(tmp_path), {}, "proposer")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        cpu_scheduler_kwargs(str(tmp_path), {}, "proposer")
