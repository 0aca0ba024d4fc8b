"""Constrained decoding of a reply's blocks: the cursor alone, then the HF engine with it."""

from __future__ import annotations

import pytest
import torch

from compassplay.engines.generation.base import SamplingParams, Segment
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.generation.templating import TemplateCursor
from compassplay.engines.training.logprobs import pack, token_logprobs
from compassplay.envs.code.parsing import extract_block

EOS = 258


def _cursor(tokenizer, template):
    return TemplateCursor(template, lambda s: tokenizer.encode(s, add_special_tokens=False),
                          lambda ids: tokenizer.decode(ids), EOS)


def _feed(cursor, tokenizer, text, comp):
    for t in tokenizer.encode(text, add_special_tokens=False):
        assert cursor.forced() is None
        comp.append(t)
        cursor.advance(comp)


def _drain(cursor, comp):
    forced = []
    while cursor.forced() is not None:
        forced.append(cursor.forced())
        comp.append(forced[-1])
        cursor.advance(comp)
    return forced


def test_cursor_forces_the_next_opening_after_each_stop_and_eos_at_the_end(tokenizer):
    c = _cursor(tokenizer, (Segment("```", "\n```input\n", 50), Segment("```", "", 50)))
    comp: list[int] = []
    _feed(c, tokenizer, "x):\n    return x\n```", comp)
    assert tokenizer.decode(_drain(c, comp)) == "\n```input\n" and c.free
    _feed(c, tokenizer, "3\n``", comp)
    assert c.free  # "``" is not the stop yet
    _feed(c, tokenizer, "`", comp)
    assert _drain(c, comp) == [EOS] and c.finished
    assert tokenizer.decode(comp[:-1]) == "x):\n    return x\n```\n```input\n3\n```"


def test_cursor_forces_the_stop_when_a_segment_hits_its_cap(tokenizer):
    c = _cursor(tokenizer, (Segment("```", "!", 3),))
    comp: list[int] = []
    _feed(c, tokenizer, "abc", comp)
    assert tokenizer.decode(_drain(c, comp)[:-1]) == "\n```!" and c.finished


def test_cursor_without_eos_finishes_after_the_last_forced_text(tokenizer):
    c = TemplateCursor((Segment("#", ""),), lambda s: tokenizer.encode(s), tokenizer.decode,
                       None)
    comp: list[int] = []
    _feed(c, tokenizer, "a#", comp)
    assert c.finished and c.forced() is None
    with pytest.raises(ValueError):
        TemplateCursor((), tokenizer.encode, tokenizer.decode, None)
    with pytest.raises(ValueError):
        Segment("")
    with pytest.raises(ValueError):
        SamplingParams(stop=["x"], template=(Segment("```"),))


def test_engine_replies_always_have_the_template_blocks(model, tokenizer):
    """A random tiny model never writes fences by itself; with the template every reply
    parses into a closed program block and a closed input block, and ends with EOS."""
    eng = HFGenerationEngine(model, tokenizer)
    tpl = (Segment("```", "\n```input\n", 12), Segment("```", "", 6))
    prompts = [[72, 105], [1, 2, 3, 4, 5], [200, 201, 202]]
    gens = eng.generate(prompts, SamplingParams(max_new_tokens=200, temperature=1.0, seed=4,
                                                template=tpl))
    free = eng.generate(prompts, SamplingParams(max_new_tokens=30, seed=4))
    assert not any("```" in g.text for g in free)  # the model alone writes no fence
    for g in gens:
        text = "```python\ndef f(" + g.text
        assert extract_block(text, ("python",), "code")[1] == ""
        assert extract_block(text, ("input",), "input")[1] == ""
        assert g.completion_ids[-1] == EOS and g.finish_reason == "stop"
        assert len(g.completion_ids) <= 12 + 6 + 2 * 4 + len(tokenizer.encode("\n```input\n")) + 1
        assert len(g.logprobs) == len(g.completion_ids)
        # every token, forced or sampled, carries its log-probability under the model
        b = pack([g])
        with torch.no_grad():
            lp = token_logprobs(model, b["input_ids"], b["attention_mask"], b["targets"])
        torch.testing.assert_close(torch.tensor(g.logprobs), lp[0][b["mask"][0] > 0],
                                   atol=1e-4, rtol=0)
    again = eng.generate(prompts, SamplingParams(max_new_tokens=200, temperature=1.0, seed=4,
                                                 template=tpl))
    assert [g.completion_ids for g in again] == [g.completion_ids for g in gens]


def test_cursor_ends_a_segment_early_and_closes_it_on_a_new_line(tokenizer):
    c = _cursor(tokenizer, (Segment("```", "\n```input\n", 50, ends=("\n\n",)),
                            Segment("```", "", 50, ends=("\n",))))
    comp: list[int] = []
    _feed(c, tokenizer, "x):\n    return x\n\n", comp)
    assert tokenizer.decode(_drain(c, comp)) == "```\n```input\n"
    _feed(c, tokenizer, "3\n", comp)
    assert _drain(c, comp)[-1] == EOS and c.finished
    assert tokenizer.decode(comp[:-1]) == "x):\n    return x\n\n```\n```input\n3\n```"


def test_a_free_block_is_never_empty(tokenizer):
    c = _cursor(tokenizer, (Segment("```", "", 5, ends=("\n",)),))
    stop_first = tokenizer.encode("```", add_special_tokens=False)[0]
    nl = tokenizer.encode("\n", add_special_tokens=False)[0]
    assert set(c.banned()) == {stop_first, nl}
    comp: list[int] = []
    _feed(c, tokenizer, "4", comp)
    assert c.banned() == []  # once something is written, the block may close


def test_engine_never_closes_a_block_at_once(model, tokenizer):
    """Even a model that wants nothing but the closing fence first writes something (the
    module's own forward: the hook below edits its logits; the masking is the engine's, the
    same for either decoder)."""
    eng = HFGenerationEngine(model, tokenizer, decoder="hf")
    fence = tokenizer.encode("```", add_special_tokens=False)[0]

    def fence_first(module, args, out):  # the fence's token overwhelmingly likely everywhere
        out.logits[..., fence] = 1e4

    model.register_forward_hook(fence_first)
    gens = eng.generate([[5, 6], [7, 8, 9]], SamplingParams(
        max_new_tokens=20, seed=0, template=(Segment("```", "", 6),)))
    for g in gens:
        assert g.completion_ids[0] != fence
        assert g.completion_ids[1:] == tokenizer.encode("```", add_special_tokens=False) + [EOS]


def test_rows_with_different_templates_share_one_batch(model, tokenizer, monkeypatch):
    """generate_each: each row follows its own template and cap in one sampling loop; the
    base engine's default makes one generate call per distinct SamplingParams instead."""
    from compassplay.engines.generation.base import GenerationEngine

    eng = HFGenerationEngine(model, tokenizer)
    calls = []
    real = eng._generate_rows
    monkeypatch.setattr(eng, "_generate_rows", lambda p, r: calls.append(len(p)) or real(p, r))
    one = (Segment("```", "\n", 5),)
    two = (Segment("```", "\n```input\n", 6), Segment("```", "", 4))
    params = [SamplingParams(max_new_tokens=n, seed=s, template=t)
              for n, s, t in [(30, 1, one), (40, 2, two), (30, 1, one)]]
    prompts = [[5, 6], [7, 8, 9], [10]]
    gens = eng.generate_each(prompts, params)
    assert calls == [3]
    assert [g.text.count("```") for g in gens] == [1, 3, 1]
    assert all(g.finish_reason == "stop" for g in gens)
    assert [g.completion_ids for g in eng.generate_each(prompts, params)] == \
        [g.completion_ids for g in gens]  # seeded by the first row
    free = [SamplingParams(max_new_tokens=n, seed=0) for n in (3, 7)]
    capped = eng.generate_each([[5], [6]], free)
    assert len(capped[0].completion_ids) <= 3 and len(capped[1].completion_ids) <= 7
    assert any(g.finish_reason == "length" for g in capped) or all(
        g.completion_ids[-1] == EOS for g in capped)
    assert calls[-1] == 2

    class Recording(GenerationEngine):
        def __init__(self):
            self.seen = []

        def generate(self, prompts, params):
            self.seen.append((prompts, params.seed))
            return eng.generate(prompts, params)

        def load_weights(self, state, version):
            raise AssertionError

        @property
        def weight_version(self):
            return 0

    rec = Recording()
    out = rec.generate_each(prompts, params)
    assert sorted(len(p) for p, _ in rec.seen) == [1, 2] and len(out) == 3
    assert [p for p, _ in rec.seen][0] == [[5, 6], [10]]
