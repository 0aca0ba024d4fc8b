"""The scorer's own reductions do not depend on the process, and its results depend on the
thread count only through the model's autograd kernels.

`rowsum` (the scorer's sums) is bitwise the same under 1 and 2 torch threads and for any batch
composition. The model's forward/backward is not: on some CPUs (MKL with AVX-512, seen on the
2-core CI machine) torch splits GEMM and reduction work by thread count, so the reference
gradient itself differs in its last bits (relative ~4e-9). Hence: bitwise equal when repeated
at one thread count (the executors give every worker `run.torch_threads`, which is why local and
Ray runs agree exactly), and equal within float32 rounding across thread counts and chunkings.
"""

from __future__ import annotations

import pytest
import torch

from compassplay.bench import model_shapes
from compassplay.bench.roofline import torch_threads as threads
from compassplay.rewards.gradient import Example, GradientScorer
from compassplay.rewards.reductions import rowdot, rowsq, rowsum


@pytest.mark.parametrize("c,m", [(1, 100), (1, 40000), (1, 300001), (2, 40000), (3, 300001),
                                 (5, 4096 * 9)])
def test_rowsum_is_thread_and_batch_independent(c, m):
    x = torch.randn(c, m, generator=torch.Generator().manual_seed(c * m))
    with threads(1):
        one = rowsum(x)
    with threads(2):
        two = rowsum(x)
        rows = torch.cat([rowsum(x[i:i + 1]) for i in range(c)])
    assert torch.equal(one, two) and torch.equal(one, rows)
    assert one.dtype == torch.float64
    exact = x.double().sum(1)
    assert torch.allclose(one, exact, rtol=0, atol=1e-6 * float(x.abs().sum()) / m ** 0.5 + 1e-9)


@pytest.mark.parametrize("c,m", [(1, 100), (1, 300001), (3, 4096 * 9), (16, 40000)])
def test_rowdot_and_rowsq_are_thread_and_batch_independent_and_accurate(c, m):
    """The scorer's fused reductions (no (c, m) product written): same bits under 1 and 2
    threads; `rowsq` also row by row (`rowdot`'s GEMV kernel differs for one row and several,
    within float32 block accuracy); float64 oracle within that accuracy."""
    gen = torch.Generator().manual_seed(c + m)
    x, v = torch.randn(c, m, generator=gen), torch.randn(m, generator=gen)
    with threads(1):
        d1, s1 = rowdot(x, v), rowsq(x)
    with threads(2):
        d2, s2 = rowdot(x, v), rowsq(x)
        rows = [(rowdot(x[i:i + 1], v), rowsq(x[i:i + 1])) for i in range(c)]
    assert torch.equal(d1, d2) and torch.equal(s1, s2)
    scale = 1e-6 * x.double().norm(dim=1) * v.double().norm()
    assert torch.all((d1 - torch.cat([r[0] for r in rows])).abs() <= scale)
    assert torch.equal(s1, torch.cat([r[1] for r in rows]))
    assert d1.dtype == s1.dtype == torch.float64
    xd, vd = x.double(), v.double()
    sq = xd.square().sum(1)
    assert torch.all((d1 - xd @ vd).abs() <= 1e-6 * sq.sqrt() * vd.norm())
    assert torch.allclose(s1, sq, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="rowdot"):
        rowdot(x, v[:-1])


def test_plain_sum_would_differ():
    """Guard that the test above is not vacuous: torch's own single-row sum does depend on the
    thread count at this size (if this ever stops holding, rowsum is merely redundant)."""
    x = torch.randn(1, 1 << 20, generator=torch.Generator().manual_seed(0))
    with threads(1):
        a = x.sum(1)
    with threads(2):
        b = x.sum(1)
    if torch.equal(a, b):
        pytest.skip("this torch build reduces one row identically on 1 and 2 threads")


def _case():
    model = model_shapes.build("toy", toy=model_shapes.toy_fields(128, 2, 1024))
    gen = torch.Generator().manual_seed(1)

    def ex(p: int, t: int) -> Example:
        ids = torch.randint(0, 1024, (p + t,), generator=gen).tolist()
        return Example(ids[:p], ids[p:])

    return model, [ex(20, 60), ex(30, 40)], [ex(10, 50), ex(40, 90), ex(5, 20), ex(33, 70)]


def _partials(model, params, ref, cands, path: str, chunk: int):
    sc = GradientScorer(model, params, path=path, chunk_bytes=chunk)
    sc.set_reference(ref)
    p = sc.partials(cands)
    return sc.reference.sq, p.inner, p.sq, p.proj, [s.cosine for s in sc.score(cands)]


@pytest.mark.parametrize("params", ["all", {"kind": "projection", "dim": 512, "seed": 3}])
def test_scorer_repeats_bitwise_and_agrees_across_threads_and_chunks(params):
    model, ref, cands = _case()
    base = None
    for path in ("ghost", "materialize"):  # ("auto" takes one of the two per layer)
        # chunk_bytes=1: one sample per chunk (single-output reductions); default: all at once
        for chunk in (1, 64 << 20):
            for n in (1, 2):
                with threads(n):
                    a = _partials(model, params, ref, cands, path, chunk)
                    b = _partials(model, params, ref, cands, path, chunk)
                assert a[0] == b[0] and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
                assert (a[3] is None and b[3] is None) or torch.equal(a[3], b[3])
                assert a[4] == b[4], (path, chunk, n)
                if base is None:
                    base = a
                    continue
                # float32 rounding: inner products relative to |g| |g_ref|, norms relative
                scale = (base[2] * base[0]).sqrt()
                assert a[0] == pytest.approx(base[0], rel=1e-6)
                assert torch.all((a[1] - base[1]).abs() <= 1e-5 * scale), (path, chunk, n)
                assert torch.allclose(a[2], base[2], rtol=1e-5, atol=0), (path, chunk, n)
                assert max(abs(x - y) for x, y in zip(a[4], base[4], strict=True)) < 1e-6
