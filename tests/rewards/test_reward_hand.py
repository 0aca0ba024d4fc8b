"""The cosine reward on a 4-parameter bigram model, against a hand computation."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from compassplay.rewards.batch import Example
from compassplay.rewards.gradient import GradientScorer
from compassplay.rewards.oracle import flatten, per_example_grads, reference_grads

W0 = [[0.3, -0.2], [1.1, 0.4]]


class Bigram(nn.Module):
    """logits at position t = W[token_t]: 2 x 2 = 4 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Embedding(2, 2)
        with torch.no_grad():
            self.w.weight.copy_(torch.tensor(W0))

    def forward(self, input_ids, position_ids=None, use_cache=None, **_):
        return SimpleNamespace(logits=self.w(input_ids))


def softmax(row):
    e = [math.exp(v) for v in row]
    return [v / sum(e) for v in e]


def hand_grad(pairs):
    """Gradient of mean_t CE(W[prev_t], next_t) w.r.t. W, flattened row-major, by hand."""
    g = [[0.0, 0.0], [0.0, 0.0]]
    for prev, nxt in pairs:
        p = softmax(W0[prev])
        for j in range(2):
            g[prev][j] += (p[j] - (1.0 if j == nxt else 0.0)) / len(pairs)
    return [v for row in g for v in row]


def cos(a, b):
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# candidate A: prompt [0], target [1, 0] -> transitions (0->1), (1->0)
# candidate B: prompt [1], target [1]    -> transition (1->1)
# reference: prompt [0], target [0]      -> transition (0->0)
CANDS = [Example([0], [1, 0]), Example([1], [1])]
REF = [Example([0], [0])]
HAND = [hand_grad([(0, 1), (1, 0)]), hand_grad([(1, 1)])]
HAND_REF = hand_grad([(0, 0)])


def test_naive_cosine_matches_hand_computation():
    model = Bigram()
    params = dict(model.named_parameters())
    ref = flatten(reference_grads(model, params, REF))
    assert ref.tolist() == pytest.approx(HAND_REF, abs=1e-7)
    for g, hand in zip(per_example_grads(model, params, CANDS), HAND, strict=True):
        flat = flatten(g)
        assert flat.tolist() == pytest.approx(hand, abs=1e-7)
        got = float(flat @ ref / (flat.norm() * ref.norm()))
        assert got == pytest.approx(cos(hand, HAND_REF), abs=1e-6)


def test_batched_scorer_matches_hand_computation():
    scorer = GradientScorer(Bigram(), params="all")
    scorer.set_reference(REF)
    scores = scorer.score(CANDS)
    for s, hand in zip(scores, HAND, strict=True):
        assert s.cosine == pytest.approx(cos(hand, HAND_REF), abs=1e-6)
        assert s.inner == pytest.approx(sum(x * y for x, y in zip(hand, HAND_REF, strict=True)),
                                         abs=1e-7)
        assert s.grad_norm == pytest.approx(math.sqrt(sum(x * x for x in hand)), abs=1e-7)
    # candidate B touches only row 1, the reference only row 0: orthogonal, cosine exactly 0
    assert scores[1].cosine == pytest.approx(0.0, abs=1e-12)
