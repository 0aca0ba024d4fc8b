"""bf16 models: the per-sample products run in bf16 (float32 accumulation, float32 results;
CUDA keeps the float32 output via out_dtype, CPU rounds it to bf16) and the scorer's cosines
stay within the plain bf16 autograd loop's own error against a float32 oracle."""

import copy

import pytest
import torch

from compassplay.bench import model_shapes
from compassplay.rewards.gradient import Example, GradientScorer
from compassplay.rewards.oracle import naive_partials
from compassplay.rewards.reductions import bmm32, mm32


def test_products_widen_to_float32():
    x = torch.randn(2, 3, 4, dtype=torch.bfloat16)
    y = torch.randn(2, 4, 5, dtype=torch.bfloat16)
    assert bmm32(x, y).dtype == torch.float32 and mm32(x[0], y[0]).dtype == torch.float32
    assert torch.allclose(bmm32(x, y), torch.bmm(x.float(), y.float()), rtol=2e-2, atol=2e-2)
    assert torch.equal(bmm32(x.float(), y.float()), torch.bmm(x.float(), y.float()))


@pytest.mark.parametrize("path", ["ghost", "materialize"])
def test_bf16_scorer_within_bf16_loop_error(path):
    torch.manual_seed(0)
    low = model_shapes.build("toy", torch.bfloat16, toy=model_shapes.toy_fields(128, 2, 1024))
    f32 = copy.deepcopy(low).float()  # the same (bf16-representable) weights
    gen = torch.Generator().manual_seed(1)

    def ex(p: int, t: int) -> Example:
        ids = torch.randint(0, 1024, (p + t,), generator=gen).tolist()
        return Example(ids[:p], ids[p:])

    ref, cands = [ex(20, 60), ex(30, 40)], [ex(10, 50), ex(40, 90), ex(5, 20), ex(33, 70)]
    exact = GradientScorer(f32, "all")
    exact.set_reference(ref)
    want = [s.cosine for s in exact.score(cands)]
    sc = GradientScorer(low, "all", path=path)
    sc.set_reference(ref)
    got = [s.cosine for s in sc.score(cands)]
    assert all(p == path for ps in sc.layer_paths.values() for p in ps
               if p in ("ghost", "materialize"))
    inner, sq, _ = naive_partials(low, sc.params, sc.reference.grads, cands)
    loop = (inner / (sq.sqrt() * sc.reference.sq ** 0.5)).tolist()
    loop_err = max(abs(a - b) for a, b in zip(loop, want, strict=True))
    err = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert loop_err > 0  # bf16 really is lossy here
    assert err <= 1.5 * loop_err + 1e-5, (err, loop_err)
