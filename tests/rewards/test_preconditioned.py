"""The preconditioned cosine cos_M (`GradientScorer.set_metric`) against a plain autograd
oracle: per-candidate gradients (`oracle.per_example_grads`), the reference gradient
(`oracle.reference_grads`) and `preconditioner.metric_cosine` / `metric_inner`."""

import fnmatch
import math

import pytest
import torch

from compassplay.rewards.gradient import GradientScorer, StaleMetricError
from compassplay.rewards.oracle import naive_partials, per_example_grads, reference_grads
from compassplay.rewards.preconditioner import adamw_metric, metric_cosine, metric_inner

from .conftest import loss_of, rand_example, tiny_model


def selected(model, globs=None):
    return {n: p for n, p in model.named_parameters()
            if p.requires_grad and (globs is None or any(fnmatch.fnmatchcase(n, g)
                                                         for g in globs))}


def random_metric(params, seed=0, scale=3.0):
    """exp(randn * scale): a positive metric spanning many orders of magnitude."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.exp(torch.randn(p.shape, generator=g) * scale) for n, p in params.items()}


def metric_oracle(model, params, metric, ref, cands):
    """(cos_M, <g, M g_ref>, sqrt(<g, M g>)) per candidate, by autograd."""
    names = list(params)
    m = None if metric is None else [metric[n] for n in names]
    r = reference_grads(model, params, ref)
    rl = [r[n] for n in names]
    out = []
    for g in per_example_grads(model, params, cands):
        gl = [g[n] for n in names]
        out.append((metric_cosine(gl, rl, m), metric_inner(gl, rl, m),
                    math.sqrt(metric_inner(gl, gl, m))))
    return out


def assert_close(got, want, cos_tol=1e-4):
    assert len(got) == len(want)
    for s, (cos, inner, norm) in zip(got, want, strict=True):
        assert abs(s.cosine - cos) <= cos_tol, (s, cos)
        assert s.grad_norm == pytest.approx(norm, rel=1e-4, abs=1e-7)
        assert s.inner == pytest.approx(inner, rel=1e-3, abs=1e-6 * max(1.0, abs(inner)))


def candidates(gen):
    lens = [(4, 1), (2, 90), (9, 30), (1, 3), (6, 64)]
    cands = [rand_example(gen, p, t) for p, t in lens]
    # candidates with several verified solutions (the mean of their losses)
    cands.append([rand_example(gen, 3, 7), rand_example(gen, 3, 12)])
    cands.append([rand_example(gen, 5, 4), rand_example(gen, 5, 20), rand_example(gen, 5, 2)])
    return cands


ARCHS = [("qwen2", True), ("qwen2", False), ("llama", True), ("gpt2", True), ("gpt2", False)]


@pytest.mark.parametrize("kind,tied", ARCHS)
@pytest.mark.parametrize("path", ["auto", "ghost"])
def test_metric_cosine_matches_oracle_all_params(kind, tied, path, gen):
    model = tiny_model(kind, tied)
    ref = [rand_example(gen, 5, 9), rand_example(gen, 3, 20)]
    cands = candidates(gen)
    scorer = GradientScorer(model, "all", path=path)
    metric = random_metric(scorer.params)
    scorer.set_metric(metric)
    scorer.set_reference(ref)
    got = scorer.score(cands)
    want = metric_oracle(model, scorer.params, metric, ref, cands)
    assert_close(got, want)
    # the metric matters here: the plain cosines are far from these
    plain = metric_oracle(model, scorer.params, None, ref, cands)
    assert max(abs(s.cosine - p[0]) for s, p in zip(got, plain, strict=True)) > 1e-2
    # under a metric no Linear weight takes the ghost path, even when it is forced
    paths = scorer.layer_paths
    assert all("ghost" not in ps for ps in paths.values()), paths
    assert all(d.get("forced_by") == "metric" for d in scorer.cost_report().values())
    if tied:  # the tied embedding/head pair is scored by the hooks, weighted exactly
        emb = "transformer.wte" if kind == "gpt2" else "model.embed_tokens"
        assert "sparse-rows" in paths[emb]
        assert not any("loop" in ps for ps in paths.values())


@pytest.mark.parametrize("globs", [["model.layers.1.*", "model.norm.*"],
                                   ["*.mlp.*", "lm_head.*"], ["*embed_tokens*"]])
def test_metric_cosine_matches_oracle_on_globs(globs, gen):
    model = tiny_model("qwen2", False)
    ref = [rand_example(gen, 4, 11)]
    cands = candidates(gen)
    scorer = GradientScorer(model, globs)
    assert set(scorer.params) == set(selected(model, globs))
    metric = random_metric(scorer.params, seed=3)
    scorer.set_metric(metric)
    scorer.set_reference(ref)
    assert_close(scorer.score(cands), metric_oracle(model, scorer.params, metric, ref, cands))


def test_metric_of_ones_equals_the_plain_scorer(gen):
    model = tiny_model("qwen2", True)
    ref = [rand_example(gen, 5, 9)]
    cands = candidates(gen)
    plain = GradientScorer(model)
    plain.set_reference(ref)
    want = plain.score(cands)
    scorer = GradientScorer(model)
    scorer.set_metric({n: torch.ones_like(p) for n, p in scorer.params.items()})
    scorer.set_reference(ref)
    got = scorer.score(cands)
    assert scorer.reference.sq == pytest.approx(plain.reference.sq, rel=1e-6)
    for a, b in zip(got, want, strict=True):
        assert a.cosine == pytest.approx(b.cosine, abs=1e-5)
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5)
        assert a.inner == pytest.approx(b.inner, rel=1e-5, abs=1e-9)
    # set_metric(None) is the plain scorer again
    scorer.set_metric(None)
    scorer.set_reference(ref)
    for a, b in zip(scorer.score(cands), want, strict=True):
        assert a.cosine == pytest.approx(b.cosine, abs=1e-6)


def test_metric_from_a_real_adamw_state(gen):
    model = tiny_model("llama", True)
    params = selected(model)
    opt = torch.optim.AdamW(list(params.values()), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    for i in range(2):
        model.train()
        loss = loss_of(model, rand_example(gen, 3, 10 + i))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    metric = {}
    for n, p in params.items():
        st = opt.state[p]
        metric[n] = adamw_metric(st["exp_avg_sq"], int(st["step"]), 0.999, 1e-8)
    assert min(float(m.min()) for m in metric.values()) > 0
    assert max(float(m.max()) for m in metric.values()) / \
        min(float(m.min()) for m in metric.values()) > 100  # far from the plain metric
    ref = [rand_example(gen, 5, 9), rand_example(gen, 2, 14)]
    cands = candidates(gen)
    scorer = GradientScorer(model)
    scorer.set_metric(metric)
    scorer.set_reference(ref)
    assert_close(scorer.score(cands), metric_oracle(model, params, metric, ref, cands))


def test_oversize_candidates_and_the_fallback_are_weighted(gen):
    """Candidates over max_batch_tokens go through `naive_partials`, which takes the metric."""
    model = tiny_model("gpt2", True)
    ref = [rand_example(gen, 3, 8)]
    cands = [[rand_example(gen, 4, 30), rand_example(gen, 4, 28)], rand_example(gen, 2, 9)]
    scorer = GradientScorer(model, max_batch_tokens=40)
    metric = random_metric(scorer.params, seed=5)
    scorer.set_metric(metric)
    scorer.set_reference(ref)
    got = scorer.score(cands)
    assert scorer.oversize == 1
    assert_close(got, metric_oracle(model, scorer.params, metric, ref, cands))
    # naive_partials itself: sq = sum M g^2, inner against the reference it is given
    r = reference_grads(model, scorer.params, ref)
    inner, sq, _ = naive_partials(model, scorer.params, r, cands[1:], metric=metric)
    g = next(per_example_grads(model, scorer.params, cands[1:]))
    names = list(scorer.params)
    assert float(sq[0]) == pytest.approx(metric_inner([g[n] for n in names],
                                                      [g[n] for n in names],
                                                      [metric[n] for n in names]), rel=1e-4)
    assert float(inner[0]) == pytest.approx(metric_inner([g[n] for n in names],
                                                         [r[n] for n in names], None),
                                            rel=1e-4)


def test_metric_errors(gen):
    model = tiny_model("qwen2", False)
    scorer = GradientScorer(model)
    ones = {n: torch.ones_like(p) for n, p in scorer.params.items()}
    with pytest.raises(ValueError, match="no tensor"):
        scorer.set_metric({k: v for k, v in list(ones.items())[1:]})
    bad = dict(ones)
    first = next(iter(bad))
    bad[first] = -bad[first]
    with pytest.raises(ValueError, match="positive"):
        scorer.set_metric(bad)
    bad[first] = torch.ones(3)
    with pytest.raises(ValueError, match="shape"):
        scorer.set_metric(bad)
    proj = GradientScorer(model, {"kind": "projection", "dim": 16})
    with pytest.raises(ValueError, match="exact mode"):
        proj.set_metric({n: torch.ones_like(p) for n, p in proj.params.items()})
    # set_metric drops the reference; new weights need a new metric before set_reference
    ref = [rand_example(gen, 3, 5)]
    scorer.set_metric(ones)
    scorer.set_reference(ref)
    scorer.set_metric(ones)
    with pytest.raises(RuntimeError, match="set_reference"):
        scorer.score([rand_example(gen, 2, 3)])
    scorer.load_weights(model.state_dict(), 1)
    with pytest.raises(StaleMetricError):
        scorer.set_reference(ref)
    scorer.set_metric(ones)
    scorer.set_reference(ref)
    assert scorer.reference.metric and scorer.reference.weight_version == 1


def test_precond_cosine_reward_is_the_given_cosine():
    from compassplay.config import GRADIENT_KINDS
    from compassplay.rewards.functions import REWARD_KINDS, proposer_reward

    assert "precond_cosine" in REWARD_KINDS and "precond_cosine" in GRADIENT_KINDS
    assert proposer_reward("precond_cosine", solve_rate=0.5, cosine=0.3) == 0.3
    assert proposer_reward("precond_cosine", solve_rate=1.0, cosine=0.3,
                           ineligible_reward=-0.5) == -0.5
    with pytest.raises(ValueError, match="needs cosine"):
        proposer_reward("precond_cosine", solve_rate=0.5)
