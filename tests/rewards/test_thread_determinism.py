"""The scorer's result does not depend on the process: same inputs, bitwise same partials under
1 and 2 torch threads (a Ray actor and the driver may run with different thread counts), and a
candidate's partials do not depend on which candidates share its chunk."""

from __future__ import annotations

import contextlib

import pytest
import torch

from compassplay.bench import model_shapes
from compassplay.rewards.gradient import Example, GradientScorer
from compassplay.rewards.reductions import rowsum


@contextlib.contextmanager
def threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


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


@pytest.mark.parametrize("params", ["all", {"kind": "projection", "dim": 512, "seed": 3}])
def test_scorer_bitwise_equal_on_1_and_2_threads(params):
    model, ref, cands = _case()
    out = {}
    for path in ("ghost", "materialize"):  # ("auto" takes one of the two per layer)
        # chunk_bytes=1: one sample per chunk (single-output reductions); default: all at once
        for chunk in (1, 64 << 20):
            got = []
            for n in (1, 2):
                with threads(n):
                    sc = GradientScorer(model, params, path=path, chunk_bytes=chunk)
                    sc.set_reference(ref)
                    p = sc.partials(cands)
                    got.append((sc.reference.sq, p.inner, p.sq, p.proj,
                                [s.cosine for s in sc.score(cands)]))
            (rs1, i1, s1, p1, c1), (rs2, i2, s2, p2, c2) = got
            assert rs1 == rs2 and torch.equal(i1, i2) and torch.equal(s1, s2), (path, chunk)
            assert (p1 is None and p2 is None) or torch.equal(p1, p2)
            assert c1 == c2
            out[(path, chunk)] = got[0]
    # chunking does not change a candidate's partials either
    for path in ("ghost", "materialize"):
        a, b = out[(path, 1)], out[(path, 64 << 20)]
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]), path
