"""The states the static decoder keeps for the learner (`capture_layer`) against the module's
own forward of each sequence alone (a pre-hook on block k, no padding, no cache): every prompt
position and every completion token but the last, through shared-prefix prefills, repeated
prompts, dropped rows and both decode-step paths (torch ops, C kernels)."""

from __future__ import annotations

import pytest
import torch

from compassplay.engines.frozen_states import (
    AUTOCAST_RELATIVE_DIFF,
    states_key,
    states_positions,
)
from compassplay.engines.generation.base import SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.generation.static_decoder import StaticDecoder
from tests.engines.generation.test_static_decoder import tiny


def module_states(model: torch.nn.Module, k: int, ids: list[int]) -> torch.Tensor:
    """[len(ids), H]: the module's hidden states entering decoder layer k, one sequence."""
    seen = []
    handle = model.model.layers[k].register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"])
                                             .detach()), with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        handle.remove()
    return seen[0][0]


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 258, (30,), generator=g).tolist()
    tail = [torch.randint(0, 258, (n,), generator=g).tolist() for n in (4, 9, 1)]
    return [shared + tail[0], shared + tail[1], [5, 6, 7], shared + tail[0], shared + tail[2],
            [70, 71]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("kernels", ["torch", "auto"])
def test_captured_states_equal_the_module_forward(arch, kernels, tokenizer):
    model = tiny(arch, seed=2)
    eng = HFGenerationEngine(model, tokenizer, decode_kernels=kernels, capture_layer=1)
    assert eng.capture_layer == 1 and eng.decoder == "static"
    prompts = _prompts()
    params = [SamplingParams(max_new_tokens=n, temperature=1.0, seed=4) for n in
              (3, 17, 9, 30, 2, 12)]  # rows finish apart: the decoder drops some mid-call
    gens = eng.generate_each(prompts, params)
    states = eng.take_states()
    assert eng.take_states() == {}
    assert len(states) == len({states_key(g.prompt_ids, g.completion_ids) for g in gens})
    for g in gens:
        got = states[states_key(g.prompt_ids, g.completion_ids)]
        want = module_states(model, 1, (g.prompt_ids + g.completion_ids)[:-1])
        assert got.shape == (states_positions(g.prompt_ids, g.completion_ids), 64)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kernels", ["torch", "auto"])
def test_a_bfloat16_decoder_keeps_states_within_the_rounding_of_an_autocast_forward(
        kernels, tokenizer):
    """The bfloat16 decoder's residual stream is float32, its matmuls bfloat16: the states it
    keeps are the module's own under bfloat16 autocast up to rounding order (within
    `AUTOCAST_RELATIVE_DIFF` of their scale, the learner's check), while the states of other
    weights are over 20 times that far."""
    model = tiny("llama", seed=2)
    eng = HFGenerationEngine(model, tokenizer, decode_dtype="bfloat16", decode_kernels=kernels,
                             capture_layer=1)
    assert eng.capture_layer == 1 and eng.decode_dtype == "bfloat16"
    gens = eng.generate(_prompts(), SamplingParams(max_new_tokens=12, temperature=1.0, seed=4))
    states = eng.take_states()
    other = tiny("llama", seed=3)  # other weights: the check must tell them apart
    for g in gens:
        got = states[states_key(g.prompt_ids, g.completion_ids)]
        ids = (g.prompt_ids + g.completion_ids)[:-1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = module_states(model, 1, ids).float()
            wrong = module_states(other, 1, ids).float()
        scale = float(want.abs().max())
        assert float((got - want).abs().max()) / scale < AUTOCAST_RELATIVE_DIFF
        assert float((wrong - want).abs().max()) / scale > 20 * AUTOCAST_RELATIVE_DIFF


def test_no_states_where_the_decoder_is_not_static(tokenizer):
    model = tiny("llama")
    eng = HFGenerationEngine(model, tokenizer, decoder="hf", capture_layer=1)
    assert eng.capture_layer is None
    eng.generate([[5, 6, 7]], SamplingParams(max_new_tokens=3, seed=0))
    assert eng.take_states() == {}
    with pytest.raises(ValueError, match="capture_layer 2"):
        StaticDecoder(model).set_capture_layer(2)  # block 2 of 2 does not exist
    with pytest.raises(RuntimeError, match="no states kept"):
        StaticDecoder(model).captured(0, 0, 1)
