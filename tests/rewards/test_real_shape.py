"""The scorer at SmolLM2-135M's widths (hidden 576, MLP 1536, 9/3 heads, vocab 49,152, tied
embeddings) against a float64 per-candidate oracle. Depth is truncated to 2 blocks to keep the
float64 loop short; the per-layer math is the same in every block."""

import copy

import pytest
import torch

from compassplay.bench.scorer_workload import build_shape
from compassplay.rewards.gradient import Example, GradientScorer


def float64_oracle(model, ref, cands):
    """(cosine, inner, grad_norm) per candidate: one autograd.grad per candidate, all float64."""
    model = copy.deepcopy(model).double().eval()
    params = [p for p in model.parameters() if p.requires_grad]

    def loss(ex: Example) -> torch.Tensor:
        ids = torch.tensor([list(ex.prompt_ids) + list(ex.target_ids)])
        logits = model(input_ids=ids).logits[0].double()
        p, t = len(ex.prompt_ids), torch.tensor(ex.target_ids)
        logp = torch.log_softmax(logits[p - 1: p - 1 + len(t)], dim=-1)
        return -logp[torch.arange(len(t)), t].mean()

    def flat(grads):
        return torch.cat([g.reshape(-1) for g in grads])

    g_ref = flat(torch.autograd.grad(torch.stack([loss(e) for e in ref]).mean(), params))
    out = []
    for c in cands:
        g = flat(torch.autograd.grad(loss(c), params))
        inner, norm = float(g @ g_ref), float(g.norm())
        out.append((inner / (norm * float(g_ref.norm())), inner, norm))
    return out


@pytest.mark.slow
def test_smollm2_shape_matches_float64_oracle():
    torch.manual_seed(0)
    model = build_shape("smollm2-135m", layers=2, seed=0)
    gen = torch.Generator().manual_seed(5)

    def ex(p: int, t: int) -> Example:
        ids = torch.randint(0, 49152, (p + t,), generator=gen).tolist()
        return Example(ids[:p], ids[p:])

    ref = [ex(8, 40), ex(12, 20)]
    cands = [ex(64, 256), ex(16, 48), ex(8, 24)]  # one long micro-batch, one short
    want = float64_oracle(model, ref, cands)
    # auto: the cost model's choices (the 49k head by ghost); forced: every Linear materialized
    for path, head in [("auto", "ghost"), ("materialize", "materialize")]:
        scorer = GradientScorer(model, "all", max_batch_tokens=400, path=path)
        scorer.set_reference(ref)
        got = scorer.score(cands)
        err = max(abs(g.cosine - w[0]) for g, w in zip(got, want, strict=True))
        print(f"\nSmolLM2 widths, 2 blocks, path={path}: max |cos - cos(float64 oracle)| = "
              f"{err:.2e}")
        assert err <= 1e-6, err
        for g, (_, inner, norm) in zip(got, want, strict=True):
            assert g.grad_norm == pytest.approx(norm, rel=1e-5)
            assert g.inner == pytest.approx(inner, rel=1e-4, abs=1e-6 * norm)
        paths = scorer.layer_paths
        assert paths["lm_head"] == [head] and paths["model.embed_tokens"] == ["sparse-rows"]
        assert not any("loop" in p for p in paths.values())
        decision = scorer.cost_report()["lm_head"]
        assert decision["d_out"] == 49152 and decision["path"] == head
