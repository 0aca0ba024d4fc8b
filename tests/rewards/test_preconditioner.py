"""AdamW's metric: M x (the bias-corrected first moment) x lr is the step torch's AdamW takes,
so <g_t, M g> is the first-order drop of that step's candidate part; metric_cosine is the
cosine of the M-scaled vectors."""

import pytest
import torch

from compassplay.rewards.preconditioner import adamw_metric, metric_cosine, metric_inner


def test_the_metric_is_the_denominator_of_torchs_adamw_step():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(40, 7))
    opt = torch.optim.AdamW([w], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for _ in range(3):
        w.grad = torch.randn_like(w) * torch.logspace(-3, 1, 7)  # a wide dynamic range
        before = w.detach().clone()
        opt.step()
    st = opt.state[w]
    m_hat = st["exp_avg"] / (1 - 0.9 ** int(st["step"]))
    want = -1e-2 * m_hat * adamw_metric(st["exp_avg_sq"], int(st["step"]))
    assert torch.allclose(w.detach() - before, want, rtol=1e-3, atol=1e-6)  # float32 weights ~1


def test_step_zero_is_the_plain_metric_and_the_cosine_is_of_the_scaled_vectors():
    v = torch.rand(5, 3)
    assert torch.equal(adamw_metric(v, 0), torch.ones(5, 3))
    a, b = [torch.randn(5, 3), torch.randn(4)], [torch.randn(5, 3), torch.randn(4)]
    m = [torch.rand(5, 3) + 0.1, torch.rand(4) + 0.1]
    sa = torch.cat([(x * y.sqrt()).reshape(-1) for x, y in zip(a, m, strict=True)]).double()
    sb = torch.cat([(x * y.sqrt()).reshape(-1) for x, y in zip(b, m, strict=True)]).double()
    want = float(sa @ sb / (sa.norm() * sb.norm()))
    assert metric_cosine(a, b, m) == pytest.approx(want, rel=1e-6)  # float32 sqrt
    assert metric_inner(a, b, None) == pytest.approx(
        sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b, strict=True)))
    assert metric_cosine(a, b, m) != pytest.approx(metric_cosine(a, b, None), abs=1e-3)
    assert metric_cosine([torch.zeros(2)], [torch.ones(2)], None) == 0.0
