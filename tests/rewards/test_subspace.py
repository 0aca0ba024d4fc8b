import pytest
import torch

from compassplay.rewards.gradient import GradientScorer, ProjectionSpec
from compassplay.rewards.subspace import CountSketch, last_blocks_globs, parse_spec

from .conftest import called_with_a_keyword, oracle, rand_example, tiny_model
from .test_gradient import assert_matches


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
def test_globs_match_oracle_on_the_subset(kind, gen):
    model = tiny_model(kind, True)
    globs = last_blocks_globs(model, 1)
    assert all(".1." in g for g in globs)
    ref = [rand_example(gen, 3, 7), rand_example(gen, 2, 11)]
    cands = [rand_example(gen, 2, t) for t in (1, 5, 40)]
    scorer = GradientScorer(model, globs)
    scorer.set_reference(ref)
    names = set(scorer.params)
    assert names and all(".1." in n for n in names)
    assert_matches(scorer.score(cands), oracle(model, ref, cands, names=names))


def test_tied_weight_selected_by_glob(gen):
    model = tiny_model("qwen2", True)
    scorer = GradientScorer(model, ["model.embed_tokens.weight"])  # also the lm_head
    ref, cands = [rand_example(gen, 3, 7)], [rand_example(gen, 2, 9), rand_example(gen, 4, 3)]
    scorer.set_reference(ref)
    assert_matches(scorer.score(cands), oracle(model, ref, cands,
                                               names={"model.embed_tokens.weight"}))


def test_no_match_is_an_error():
    with pytest.raises(ValueError, match="no trainable parameter"):
        GradientScorer(tiny_model("qwen2", True), ["nothing.*"])
    with pytest.raises(TypeError):
        parse_spec(3)


@pytest.mark.parametrize("kind,tied", [("qwen2", True), ("gpt2", False)])
def test_projection_matches_projected_oracle(kind, tied, gen):
    model = tiny_model(kind, tied)
    spec = {"kind": "projection", "dim": 64, "seed": 7}
    scorer = GradientScorer(model, spec)
    ref = [rand_example(gen, 3, 7)]
    cands = [rand_example(gen, 2, t) for t in (1, 6, 33)]
    scorer.set_reference(ref)
    sketch = CountSketch(64, 7)

    def project(name, param, grad):
        return sketch.project(name, param, grad.unsqueeze(0))[0]

    got = scorer.score(cands)
    assert_matches(got, oracle(model, ref, cands, project=project))
    full = oracle(model, ref, cands)
    assert any(abs(g.cosine - f[0]) > 1e-6 for g, f in zip(got, full, strict=True))


def test_projection_is_seeded_and_preserves_norms_roughly():
    p = torch.nn.Parameter(torch.zeros(50, 40))
    a, b = CountSketch(512, 1), CountSketch(512, 1)
    g = torch.randn(3, 50, 40)
    assert torch.equal(a.project("w", p, g), b.project("w", p, g))
    assert not torch.equal(a.project("w", p, g), CountSketch(512, 2).project("w", p, g))
    ratio = a.project("w", p, g).norm(dim=1) / g.reshape(3, -1).norm(dim=1)
    assert torch.all((ratio > 0.8) & (ratio < 1.2))


def test_projection_spec_forms_and_globs(gen):
    model = tiny_model("llama", False)
    globs = last_blocks_globs(model, 1)
    spec = ProjectionSpec(dim=32, seed=0, include=tuple(globs))
    scorer = GradientScorer(model, spec)
    assert all(".1." in n for n in scorer.params)
    ref, cands = [rand_example(gen, 3, 5)], [rand_example(gen, 2, 4)]
    scorer.set_reference(ref)
    sketch = CountSketch(32, 0)
    got = scorer.score(cands)
    want = oracle(model, ref, cands, names=set(scorer.params),
                  project=lambda n, p, g: sketch.project(n, p, g.unsqueeze(0))[0])
    assert_matches(got, want)
    with pytest.raises(ValueError):
        ProjectionSpec(dim=0)


def _blocks(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


@pytest.mark.parametrize("kind", ["qwen2", "llama", "gpt2"])
def test_top_block_scoring_runs_no_graph_below_it(kind, gen):
    """Scoring the last block records no graph and runs no backward through the block below
    it; every selected layer keeps its batched formula; the model's flags are restored."""
    model = tiny_model(kind, False)
    below = []  # per forward of block 0 during scoring: does its output carry grad?
    _blocks(model)[0].register_forward_hook(
        lambda m, a, out: below.append((out[0] if isinstance(out, tuple) else out).requires_grad))
    scorer = GradientScorer(model, last_blocks_globs(model, 1))
    ref = [rand_example(gen, 3, 7)]
    cands = [rand_example(gen, 2, t) for t in (1, 6, 30)]
    scorer.set_reference(ref)
    got = scorer.score(cands)
    assert below and not any(below)
    assert all("loop" not in paths for paths in scorer.layer_paths.values())
    assert all(p.requires_grad for p in model.parameters())
    assert_matches(got, oracle(model, ref, cands, names=set(scorer.params)))


def test_a_declined_lowest_layer_leaves_the_layers_above_it_batched(gen):
    """The lowest selected module is declined (a call outside the hooks' patterns): it is
    computed exactly by the loop, and the layers above it stay reachable and batched."""
    model = tiny_model("qwen2", False)
    block = model.model.layers[1]
    block.input_layernorm = called_with_a_keyword(block.input_layernorm)
    scorer = GradientScorer(model, ["model.layers.1.*"])
    ref, cands = [rand_example(gen, 3, 6)], [rand_example(gen, 2, 5), rand_example(gen, 5, 9)]
    scorer.set_reference(ref)
    got = scorer.score(cands)
    assert_matches(got, oracle(model, ref, cands, names=set(scorer.params)))
    paths = scorer.layer_paths
    assert "loop" in paths["model.layers.1.input_layernorm.inner.weight"]
    assert "loop" not in paths["model.layers.1.self_attn.q_proj"]
    assert "loop" not in paths["model.layers.1.mlp.down_proj"]
