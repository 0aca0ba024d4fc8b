"""The reference's hidden states below the lowest scored layer are kept across weight versions
that leave those layers unchanged, and g_ref from them equals the autograd oracle's."""

import logging

import pytest
import torch

from compassplay.rewards import frozen_prefix
from compassplay.rewards.gradient import GradientScorer

from .conftest import oracle, rand_example, tiny_model
from .test_gradient import assert_matches


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(77)


def _top_scorer(kind: str, tied: bool = False):
    model = tiny_model(kind, tied)
    runs = []  # one entry per forward of block 0
    model.model.layers[0].register_forward_hook(lambda *a: runs.append(1))
    return model, runs, GradientScorer(model, ["model.layers.1.*", "model.norm.*"])


def _state_with(model, name: str, delta: float) -> dict[str, torch.Tensor]:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state[name] += delta
    return state


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_states_are_kept_while_only_the_scored_layers_change(kind, gen):
    model, runs, scorer = _top_scorer(kind)
    assert scorer.prefix.k == 1
    ref = [rand_example(gen, 4, 7), rand_example(gen, 3, 12)]
    cands = [rand_example(gen, 2, 5), [rand_example(gen, 3, 4), rand_example(gen, 6, 2)]]
    scorer.set_reference(ref)
    assert_matches(scorer.score(cands), oracle(model, ref, cands, names=set(scorer.params)))
    for version in (1, 2):  # the learner moved the scored top only
        scorer.load_weights(_state_with(model, "model.layers.1.mlp.up_proj.weight", 0.05),
                            version)
        before = len(runs)
        scorer.set_reference(ref)
        assert len(runs) == before  # block 0 did not run for the reference
        assert scorer.prefix.builds == 1
        assert_matches(scorer.score(cands), oracle(model, ref, cands, names=set(scorer.params)))


@pytest.mark.parametrize("how", ["load", "in_place", "other_reference"])
def test_a_changed_prefix_or_reference_computes_the_states_again(how, gen):
    model, _, scorer = _top_scorer("qwen2")
    ref = [rand_example(gen, 4, 7)]
    cands = [rand_example(gen, 2, 5), rand_example(gen, 5, 3)]
    scorer.set_reference(ref)
    if how == "load":
        scorer.load_weights(_state_with(model, "model.layers.0.self_attn.q_proj.weight", 0.1), 1)
    elif how == "in_place":
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1.5)
    else:
        ref = [rand_example(gen, 3, 9)]
    scorer.set_reference(ref)
    assert scorer.prefix.builds == 2
    assert_matches(scorer.score(cands), oracle(model, ref, cands, names=set(scorer.params)))


def test_a_load_that_rewrites_the_prefix_with_equal_values_keeps_the_states(gen):
    model, _, scorer = _top_scorer("llama")
    ref = [rand_example(gen, 4, 7)]
    scorer.set_reference(ref)
    versions = [p._version for p in scorer.prefix.prefix.values()]
    scorer.load_weights({k: v.clone() for k, v in model.state_dict().items()}, 1)
    assert [p._version for p in scorer.prefix.prefix.values()] != versions  # copy_ counted
    scorer.set_reference(ref)
    assert scorer.prefix.builds == 1


@pytest.mark.parametrize("kind,tied,params", [
    ("qwen2", True, "all"),                 # the embeddings are scored
    ("qwen2", True, ["model.embed_tokens.weight", "model.layers.1.*"]),  # the tied head
    ("gpt2", False, ["transformer.h.1.*"]),  # not a transformers decoder with model.layers
])
def test_nothing_is_kept_when_the_prefix_is_not_frozen(kind, tied, params, gen):
    model = tiny_model(kind, tied)
    scorer = GradientScorer(model, params)
    assert not scorer.prefix.enabled
    ref, cands = [rand_example(gen, 4, 7)], [rand_example(gen, 2, 5)]
    scorer.set_reference(ref)
    assert scorer.prefix.builds == 0
    assert_matches(scorer.score(cands), oracle(model, ref, cands, names=set(scorer.params)))


def test_states_that_disagree_with_the_plain_forward_turn_the_cache_off(monkeypatch, gen,
                                                                         caplog):
    real = frozen_prefix.hidden_entering
    monkeypatch.setattr(frozen_prefix, "hidden_entering",
                        lambda model, k, batch: real(model, k, batch) + 0.3)
    model, _, scorer = _top_scorer("qwen2")
    # rows of several lengths: the check runs on the shortest alone, trimmed to its length
    ref = [rand_example(gen, 4, 7), rand_example(gen, 3, 2), rand_example(gen, 6, 5)]
    cands = [rand_example(gen, 2, 5)]
    with caplog.at_level(logging.WARNING):
        scorer.set_reference(ref)
    assert "the plain forward" in caplog.text
    assert not scorer.prefix.enabled
    assert_matches(scorer.score(cands), oracle(model, ref, cands, names=set(scorer.params)))


def test_hidden_entering_stops_at_the_layer_and_equals_the_full_forward(gen):
    model = tiny_model("llama", False)
    from compassplay.rewards.batch import make_batch

    exs = [rand_example(gen, 3, 5), rand_example(gen, 6, 4)]
    batch = make_batch(exs, [0, 1], torch.device("cpu"), 0)
    ran = []
    model.model.layers[1].register_forward_hook(lambda *a: ran.append(1))
    got = frozen_prefix.hidden_entering(model, 1, batch)
    assert not ran
    with torch.no_grad():
        full = model(input_ids=batch.ids, position_ids=batch.position_ids,
                     output_hidden_states=True).hidden_states[1]
    torch.testing.assert_close(got, full)



@pytest.mark.parametrize("numerics", [None, torch.bfloat16])
def test_kept_states_are_held_to_the_rounding_of_their_numerics(numerics, monkeypatch, gen,
                                                               caplog):
    """A pass's kept states that differ from a one-row forward by bfloat16-sized rounding
    (relative 3e-2 here; SmolLM2's shortest reference item in bfloat16 on a 2-core Zen 4:
    losses 1.3367 against 1.3276) keep the cache under `reference_autocast=bfloat16`, and
    g_ref from them points where the whole model's does under the same autocast (cosine,
    the quantity the reward takes); in float32 the same difference is a disagreement."""
    real = frozen_prefix.hidden_entering
    noise = torch.Generator().manual_seed(5)

    def rounded(model, k, batch):
        h = real(model, k, batch)
        return h * (1 + 3e-2 * torch.randn(h.shape, generator=noise))

    monkeypatch.setattr(frozen_prefix, "hidden_entering", rounded)
    model = tiny_model("llama", False)
    ref = [rand_example(gen, 5, 9), rand_example(gen, 3, 2), rand_example(gen, 7, 6)]
    params = ["model.layers.1.*", "model.norm.*"]
    kept = GradientScorer(model, params, reference_autocast=numerics)
    whole = GradientScorer(model, params, reference_autocast=numerics)
    whole.prefix.disable()
    with caplog.at_level(logging.WARNING):
        kept.set_reference(ref)
    whole.set_reference(ref)
    if numerics is None:
        assert "the plain forward" in caplog.text and not kept.prefix.enabled
        return
    assert "the plain forward" not in caplog.text and kept.prefix.enabled
    a = torch.cat([kept.reference.grads[n].flatten() for n in sorted(whole.reference.grads)])
    b = torch.cat([whole.reference.grads[n].flatten() for n in sorted(whole.reference.grads)])
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.995  # the reward's
