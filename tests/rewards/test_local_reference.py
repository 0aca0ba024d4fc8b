"""Local-reference scoring is exact against a per-candidate autograd oracle."""

from __future__ import annotations

import pytest
import torch

from compassplay.rewards.local_reference import group_references, local_scores
from tests.rewards.conftest import oracle, rand_example, tiny_model


@pytest.mark.parametrize("kind,tied", [
    pytest.param("qwen2", True, marks=pytest.mark.slow), ("llama", False),
    pytest.param("gpt2", True, marks=pytest.mark.slow)])
def test_local_scores_match_oracle(kind, tied, gen):
    model = tiny_model(kind, tied)
    refs = [rand_example(gen, 5, 4), rand_example(gen, 3, 6), rand_example(gen, 7, 2)]
    cands = [rand_example(gen, int(p), int(t)) for p, t in
             torch.randint(2, 9, (7, 2), generator=gen).tolist()]
    ref_of = [0, 1, 2, 0, 1, 0, 2]
    got = local_scores(model, cands, refs, ref_of, max_batch_tokens=40)  # several passes
    for i, c in enumerate(cands):
        [want] = oracle(model, [refs[ref_of[i]]], [c])
        assert got[i][0] == pytest.approx(want[0], abs=1e-5)
        assert got[i][1] == pytest.approx(want[1], rel=1e-4, abs=1e-6)
        assert got[i][2] == pytest.approx(want[2], rel=1e-5)


def test_group_references_dedups():
    pairs = [([1, 2], [3]), ([4], [5]), ([1, 2], [3])]
    refs, ref_of = group_references(pairs)
    assert len(refs) == 2 and ref_of == [0, 1, 0]


def test_param_subset_and_errors(gen):
    model = tiny_model("qwen2", True)
    refs, cands = [rand_example(gen, 4, 3)], [rand_example(gen, 3, 3)]
    names = [n for n, _ in model.named_parameters() if "mlp" in n]
    [got] = local_scores(model, cands, refs, [0], params=["*mlp*"])
    [want] = oracle(model, refs, cands, names=set(names))
    assert got[0] == pytest.approx(want[0], abs=1e-5)
    with pytest.raises(ValueError, match="ref_of"):
        local_scores(model, cands, refs, [0, 0])
    with pytest.raises(ValueError, match="outside"):
        local_scores(model, cands, refs, [1])
