"""Dropping finished rows from the static decoder during a generate call: the decoder's `keep`,
and the engine's outputs with it against the same engine without it (`compact = False`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from compassplay.engines.generation.base import SamplingParams, Segment
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.generation.sampling import TokenSampler, draw
from compassplay.engines.generation.static_decoder import StaticDecoder
from tests.engines.generation.test_static_decoder import left_pad, tiny


def _engine(model, tokenizer, compact: bool, **kw) -> tuple[HFGenerationEngine, list[int]]:
    """An engine whose decoder counts its `keep` calls (the list returned)."""
    eng = HFGenerationEngine(model, tokenizer, **kw)
    eng.compact = compact
    kept: list[int] = []
    if isinstance(eng._decoder, StaticDecoder):
        orig = eng._decoder.keep
        eng._decoder.keep = lambda rows: kept.append(len(rows)) or orig(rows)
    return eng, kept


def _prompts() -> list[list[int]]:
    return [[5, 6, 7], [8, 9, 10, 11, 12, 13], [5, 6, 7, 8], [70], [30, 31, 32, 33, 34],
            [90, 91]]


def _caps() -> list[int]:
    return [2, 40, 3, 25, 5, 60]  # rows finish at very different lengths


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_keep_continues_the_kept_rows_as_before(arch):
    model = tiny(arch, seed=1)
    rows = [[5, 6, 7, 8, 9], [12, 13], [40, 41, 42, 43], [50, 51, 52]]
    ids, pad = left_pad(rows)
    full, part = StaticDecoder(model), StaticDecoder(model)
    g = torch.Generator().manual_seed(3)
    sel = torch.tensor([3, 1])
    with torch.no_grad():
        full.start(ids, pad, 12)
        part.start(ids, pad, 12)
        tok = torch.randint(0, 258, (4,), generator=g)
        full.step(tok), part.step(tok)
        part.keep(sel)
        for _ in range(4):
            tok = torch.randint(0, 258, (4,), generator=g)
            torch.testing.assert_close(part.step(tok[sel]), full.step(tok)[sel], atol=2e-5,
                                       rtol=1e-5)


def test_draws_for_some_rows_use_their_own_uniforms():
    probs = torch.softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(0)), -1)
    rows = torch.tensor([4, 1, 5])
    every = draw(probs, torch.Generator().manual_seed(7))
    some = draw(probs[rows], torch.Generator().manual_seed(7), rows=rows, batch=6)
    assert torch.equal(some, every[rows])
    sampler = TokenSampler(6, 50, "cpu")
    logits = probs.log()
    full = sampler.sample(logits, 0.8, 0.9, torch.Generator().manual_seed(2))
    part = sampler.sample(logits[rows], 0.8, 0.9, torch.Generator().manual_seed(2), rows)
    assert torch.equal(part, full[rows])


@pytest.mark.parametrize("dtype", ["model", "bfloat16"])
def test_greedy_rows_finishing_at_different_lengths_keep_their_outputs(tokenizer, dtype):
    """Caps of 2..60 tokens and an end-of-sequence token that some rows draw: every row's
    ids, log-probs and finish reason as without dropping rows (float32: ids equal, log-probs
    to rounding; bfloat16: the same, on this model)."""
    model = tiny("qwen2", seed=3)
    base = SamplingParams(max_new_tokens=60, temperature=0.0)
    params = [dataclasses.replace(base, max_new_tokens=c) for c in _caps()]
    ref_eng, _ = _engine(model, tokenizer, False, decode_dtype=dtype)
    probe = ref_eng.generate_each(_prompts(), params)
    eos = probe[1].completion_ids[7]  # a token row 1 draws: rows stop at different points
    ref_eng, _ = _engine(model, tokenizer, False, decode_dtype=dtype, eos_token_id=eos)
    eng, kept = _engine(model, tokenizer, True, decode_dtype=dtype, eos_token_id=eos)
    ref, got = ref_eng.generate_each(_prompts(), params), eng.generate_each(_prompts(), params)
    assert kept and kept[-1] < len(_prompts())  # rows were dropped
    assert len({len(g.completion_ids) for g in got}) >= 4
    assert any(g.finish_reason == "stop" for g in got)
    for a, b in zip(got, ref, strict=True):
        assert a.completion_ids == b.completion_ids
        assert a.finish_reason == b.finish_reason and a.prompt_ids == b.prompt_ids
        assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_seeded_sampling_with_dropped_rows_is_reproducible(tokenizer):
    model = tiny("llama", seed=2)
    base = SamplingParams(max_new_tokens=60, temperature=1.0, top_p=0.9, seed=5)
    params = [dataclasses.replace(base, max_new_tokens=c) for c in _caps()]
    eng, kept = _engine(model, tokenizer, True)
    a, b = eng.generate_each(_prompts(), params), eng.generate_each(_prompts(), params)
    assert kept and a == b
    c, _ = _engine(model, tokenizer, False)
    # a row's uniforms do not depend on the dropped rows: the same draws as without dropping
    assert [g.completion_ids for g in c.generate_each(_prompts(), params)] == \
        [g.completion_ids for g in a]


def test_templated_generation_with_dropped_rows_stays_valid(tokenizer):
    model = tiny("qwen2", seed=3)
    short = (Segment("```", "\n", 4), Segment("```", "", 3))
    long = (Segment("```", "\n", 30), Segment("```", "", 20))
    base = SamplingParams(max_new_tokens=80, temperature=0.9, seed=1)
    params = [dataclasses.replace(base, template=t) for t in
              (short, long, short, long, short, short)]
    eng, kept = _engine(model, tokenizer, True)
    got = eng.generate_each(_prompts(), params)
    assert kept
    assert all(g.finish_reason == "stop" and g.text.count("```") == 2 for g in got)
    again, _ = _engine(model, tokenizer, True)
    assert again.generate_each(_prompts(), params) == got
    ref, _ = _engine(model, tokenizer, False)  # the same draws; log-probs to rounding
    for a, b in zip(got, ref.generate_each(_prompts(), params), strict=True):
        assert a.completion_ids == b.completion_ids and a.finish_reason == b.finish_reason
        assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5


def test_the_module_decoder_does_not_drop_rows(tokenizer):
    model = tiny("qwen2", seed=3)
    params = [SamplingParams(max_new_tokens=c, temperature=0.0) for c in _caps()]
    hf, _ = _engine(model, tokenizer, True, decoder="hf")
    static, _ = _engine(model, tokenizer, True)
    assert [g.completion_ids for g in hf.generate_each(_prompts(), params)] == \
        [g.completion_ids for g in static.generate_each(_prompts(), params)]
