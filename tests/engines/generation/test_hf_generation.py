from __future__ import annotations

import torch

from compassplay.engines.generation.base import SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.generation.sampling import sample_next
from compassplay.engines.training.logprobs import pack, token_logprobs


def test_logprobs_match_teacher_forced_forward(model, tokenizer):
    eng = HFGenerationEngine(model, tokenizer)
    prompts = [[72, 105], [1, 2, 3, 4, 5, 6, 7], [200]]
    gens = eng.generate(prompts, SamplingParams(max_new_tokens=10, temperature=0.7, seed=3))
    assert [g.prompt_ids for g in gens] == prompts
    for g in gens:  # each alone, unpadded: checks the left-padded KV-cache loop
        b = pack([g])
        with torch.no_grad():
            lp = token_logprobs(model, b["input_ids"], b["attention_mask"], b["targets"])
        ref = lp[0][b["mask"][0] > 0]
        assert len(g.logprobs) == len(g.completion_ids) > 0
        torch.testing.assert_close(torch.tensor(g.logprobs), ref, atol=1e-4, rtol=0)


def test_max_new_tokens_gives_length(model, tokenizer):
    eng = HFGenerationEngine(model, tokenizer, eos_token_id=999)
    gens = eng.generate([[5, 6], [7]], SamplingParams(max_new_tokens=4, seed=0))
    assert all(len(g.completion_ids) == 4 and g.finish_reason == "length" for g in gens)


def test_stop_string_truncates(model, tokenizer):
    eng = HFGenerationEngine(model, tokenizer, eos_token_id=999)
    free = eng.generate([[5, 6]], SamplingParams(max_new_tokens=12, seed=1))[0]
    ids = free.completion_ids
    # pick the text of tokens 3..4 as stop string: sampling is seeded so the run repeats
    stop = tokenizer.decode(ids[3:5])
    first = next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k]))
    g = eng.generate([[5, 6]], SamplingParams(max_new_tokens=12, seed=1, stop=[stop]))[0]
    assert g.completion_ids == ids[:first]
    assert g.finish_reason == "stop" and g.text.endswith(stop)
    assert g.logprobs == free.logprobs[:first]


def test_eos_stops(model, tokenizer):
    free = HFGenerationEngine(model, tokenizer, eos_token_id=999).generate(
        [[1, 2]], SamplingParams(max_new_tokens=6, temperature=0.0))[0]
    eos = free.completion_ids[2]
    first = free.completion_ids.index(eos)
    g = HFGenerationEngine(model, tokenizer, eos_token_id=eos).generate(
        [[1, 2]], SamplingParams(max_new_tokens=6, temperature=0.0))[0]
    assert g.finish_reason == "stop" and g.completion_ids == free.completion_ids[:first + 1]


def test_seeded_reproducible_and_version(model, tokenizer):
    eng = HFGenerationEngine(model, tokenizer, weight_version=3)
    p = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.9, seed=11)
    a = eng.generate([[1, 2, 3], [4]], p)
    b = eng.generate([[1, 2, 3], [4]], p)
    c = eng.generate([[1, 2, 3], [4]], SamplingParams(max_new_tokens=6, seed=12))
    assert a == b and a != c
    assert all(g.weight_version == 3 for g in a)


def test_top_p_keeps_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    draws = {int(sample_next(logits, 1.0, 0.7, gen)) for _ in range(200)}
    assert draws == {0, 1}
    assert int(sample_next(logits, 0.0, 1.0, gen)) == 0


def test_draw_follows_the_probabilities_and_never_a_zero():
    from compassplay.engines.generation.sampling import draw

    probs = torch.tensor([[0.5, 0.3, 0.0, 0.2]]).repeat(20000, 1)
    got = draw(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(got, minlength=4).double() / len(got)
    assert freq[2] == 0
    torch.testing.assert_close(freq, probs[0].double(), atol=0.012, rtol=0)
    again = draw(probs, torch.Generator().manual_seed(0))
    assert torch.equal(got, again)  # seeded


def test_top_p_among_candidates_is_the_full_sort_nucleus(monkeypatch):
    from compassplay.engines.generation import sampling as hf_generation

    logits = torch.randn(8, 3000, generator=torch.Generator().manual_seed(1)) * 3
    def nucleus(k):
        monkeypatch.setattr(hf_generation, "TOP_P_CANDIDATES", k)
        gen = torch.Generator().manual_seed(2)
        return [sample_next(logits, 0.8, 0.9, gen) for _ in range(50)]
    few, full = nucleus(64), nucleus(3000)   # 64: the mass falls short, the full sort runs
    many = nucleus(2500)
    assert all(torch.equal(a, b) for a, b in zip(full, many, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(full, few, strict=True))
