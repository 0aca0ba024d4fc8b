"""The model cache under concurrency: one builder, waiters load, crashes and corruption heal."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from compassplay.models.cache import (
    MANIFEST,
    CacheError,
    entry_lock,
    entry_problem,
    prepare_cached,
)


def _build_tiny(tmp: Path, counter: Path, delay_s: float = 0.3) -> None:
    """Save a tiny random HF model slowly (the window in which the old code raced)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    with counter.open("a") as f:
        f.write(f"{os.getpid()}\n")
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=32, vocab_size=64)
    time.sleep(delay_s)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp, safe_serialization=True)
    time.sleep(delay_s)


def _prepare_and_load(cache: str, counter: str) -> float:
    from transformers import AutoModelForCausalLM

    out = prepare_cached(Path(cache), "tiny", lambda t: _build_tiny(t, Path(counter)))
    model = AutoModelForCausalLM.from_pretrained(out)
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def test_concurrent_first_use_builds_once_and_everyone_loads(tmp_path):
    counter = tmp_path / "builds.txt"
    cache = tmp_path / "cache"
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        sums = pool.starmap(_prepare_and_load, [(str(cache), str(counter))] * 4)
    assert len(counter.read_text().split()) == 1, "exactly one process converts"
    assert len(set(sums)) == 1, "every process loads the same weights"
    assert sorted(p.name for p in cache.iterdir()) == ["tiny", "tiny.lock"], "no stray files"
    assert entry_problem(cache / "tiny") is None


def _build_then_hang(cache: str, counter: str) -> None:
    def build(tmp: Path) -> None:
        _build_tiny(tmp, Path(counter), delay_s=0.0)
        (tmp / "half-written.bin").write_bytes(b"x" * 100)
        time.sleep(600)

    prepare_cached(Path(cache), "tiny", build)


def test_a_crashed_builder_leaves_nothing_that_is_loaded_or_kept(tmp_path):
    cache, counter = tmp_path / "cache", tmp_path / "builds.txt"
    proc = mp.get_context("spawn").Process(target=_build_then_hang,
                                           args=(str(cache), str(counter)))
    proc.start()
    deadline = time.monotonic() + 60
    while not list(cache.glob("tiny.tmp-*/half-written.bin")):
        assert time.monotonic() < deadline and proc.is_alive()
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)  # crash mid-conversion: the kernel drops its lock
    proc.join()
    assert entry_problem(cache / "tiny") == "missing"
    _prepare_and_load(str(cache), str(counter))
    assert len(counter.read_text().split()) == 2
    assert not list(cache.glob("tiny.tmp-*")), "the stray temp dir is removed"


def test_a_corrupt_or_partial_entry_is_rebuilt_not_loaded(tmp_path, caplog):
    cache, counter = tmp_path / "cache", tmp_path / "builds.txt"
    _prepare_and_load(str(cache), str(counter))
    weights = cache / "tiny" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # truncated copy
    assert "model.safetensors has" in entry_problem(cache / "tiny")
    with caplog.at_level(logging.WARNING, logger="compassplay.models.cache"):
        _prepare_and_load(str(cache), str(counter))
    assert "incomplete" in caplog.text
    assert weights.read_bytes() == data
    # same size, different bytes: the sha256 catches it
    weights.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    assert "sha256" in entry_problem(cache / "tiny")
    # an entry from before manifests existed (or a copy that never finished) is rebuilt too
    (cache / "tiny" / MANIFEST).unlink()
    assert "no COMPLETE.json" in entry_problem(cache / "tiny")
    _prepare_and_load(str(cache), str(counter))
    assert len(counter.read_text().split()) == 3
    assert entry_problem(cache / "tiny") is None


def test_a_waiter_says_what_it_waits_for_and_gives_up_with_a_clear_error(tmp_path, caplog):
    cache = tmp_path / "cache"
    with entry_lock(cache, "tiny", timeout_s=5):
        # the lock is per open file description, so a second open in this process contends
        with caplog.at_level(logging.INFO, logger="compassplay.models.cache"):
            with pytest.raises(CacheError, match="waited 1 s for the lock .*tiny.lock"):
                with entry_lock(cache, "tiny", timeout_s=1.0, log_every_s=0.3):
                    pass
    assert "waiting for another process to finish preparing" in caplog.text
