"""`scorer.reference_autocast`: the reference gradient's passes under bfloat16 autocast stay
close to the float32 autograd oracle's g_ref, the candidates' gradients stay float32, and the
kept prefix states still serve every weight version."""

import pytest
import torch

from compassplay.engines import dtype_choice
from compassplay.rewards.gradient import GradientScorer

from .conftest import loss_of, oracle, rand_example, tiny_model


def _ref_grad(model, ref, names) -> torch.Tensor:
    """The float32 oracle's g_ref over `names`, flattened in `named_parameters` order."""
    params = [p for n, p in model.named_parameters() if n in names]
    loss = torch.stack([loss_of(model, e) for e in ref]).mean()
    return torch.cat([g.reshape(-1).double() for g in torch.autograd.grad(loss, params)])


def _flat(scorer: GradientScorer, model) -> torch.Tensor:
    grads = scorer.reference.grads
    return torch.cat([grads[n].reshape(-1).double() for n, _ in model.named_parameters()
                      if n in grads])


def _setup(params, kind="qwen2", seed=5):
    gen = torch.Generator().manual_seed(seed)
    model = tiny_model(kind, tied=False)
    ref = [rand_example(gen, 6, 40), rand_example(gen, 9, 25), rand_example(gen, 4, 60)]
    cands = [rand_example(gen, 5, 12), rand_example(gen, 7, 30)]
    scorer = GradientScorer(model, params, reference_autocast=torch.bfloat16)
    return model, ref, cands, scorer


@pytest.mark.parametrize("params", ["all", ["model.layers.1.*", "model.norm.*"]])
def test_reference_under_autocast_is_close_to_the_float32_oracle_but_not_equal(params):
    model, ref, cands, scorer = _setup(params)
    scorer.set_reference(ref)
    names = set(scorer.params)
    want, got = _ref_grad(model, ref, names), _flat(scorer, model)
    cos = float(got @ want / (got.norm() * want.norm()))
    assert cos > 0.999, cos
    assert float(got.norm() / want.norm()) == pytest.approx(1.0, abs=0.02)
    assert not torch.equal(got.float(), want.float())  # bfloat16 matmuls did run
    assert all(g.dtype == torch.float32 for g in scorer.reference.grads.values())
    exact = GradientScorer(model, params)
    exact.set_reference(ref)
    assert torch.allclose(_flat(exact, model), want, rtol=1e-4, atol=1e-7)


def test_candidates_stay_float32_against_the_autocast_reference():
    """inner = <g(x) in float32, g_ref as stored>: the candidates' passes are not autocast."""
    model, ref, cands, scorer = _setup("all", kind="llama")
    scorer.set_reference(ref)
    g_ref = _flat(scorer, model)
    names = set(scorer.params)
    params = [p for n, p in model.named_parameters() if n in names]
    for got, cand in zip(scorer.score(cands), cands, strict=True):
        g = torch.cat([x.reshape(-1).double()
                       for x in torch.autograd.grad(loss_of(model, cand), params)])
        assert got.grad_norm == pytest.approx(float(g.norm()), rel=1e-4)
        assert got.inner == pytest.approx(float(g @ g_ref), rel=1e-3, abs=1e-9)
    # and the cosines move from the float32 oracle's by the reference's small error only
    for got, (cos, _, _) in zip(scorer.score(cands), oracle(model, ref, cands, names),
                                strict=True):
        assert abs(got.cosine - cos) < 0.02


def test_kept_prefix_states_serve_the_autocast_reference_across_versions():
    model, ref, cands, scorer = _setup(["model.layers.1.*", "model.norm.*"])
    assert scorer.prefix.enabled
    scorer.set_reference(ref)
    first = _flat(scorer, model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.layers.1.mlp.up_proj.weight"] += 0.05
    scorer.load_weights(state, 1)
    scorer.set_reference(ref)
    assert scorer.prefix.builds == 1 and scorer._prefix_checked
    names = set(scorer.params)
    want, got = _ref_grad(model, ref, names), _flat(scorer, model)
    assert float(got @ want / (got.norm() * want.norm())) > 0.999
    assert not torch.equal(got, first)  # the new weights' g_ref, not the old one


def test_the_setting_is_resolved_with_its_own_name_in_errors():
    model = tiny_model("qwen2", tied=False)
    assert dtype_choice.resolve_autocast("none", model, field="scorer.reference_autocast") \
        is None
    assert dtype_choice.resolve_autocast("bfloat16", model, field="scorer.reference_autocast") \
        is torch.bfloat16
    with pytest.raises(ValueError, match="scorer.reference_autocast"):
        dtype_choice.resolve_autocast("half", model, field="scorer.reference_autocast")
