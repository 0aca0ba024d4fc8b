"""g(x) from several verified solutions: the gradient of the mean of their losses, exact
against the autograd oracle on every scorer path (ghost, materialized, embeddings tied or not,
norm closed forms, vmap, the declined-module loop, projection, parameter shards)."""

from __future__ import annotations

import pytest
import torch

from compassplay.rewards.alignment import Partials, finalize
from compassplay.rewards.batch import (
    Example,
    make_solutions_batch,
    plan_solution_batches,
    solution_sets,
)
from compassplay.rewards.gradient import GradientScorer
from compassplay.rewards.oracle import flatten, per_example_grads, reference_grads

from .conftest import VOCAB, called_with_a_keyword, oracle, rand_example, tiny_model
from .test_gradient import assert_matches


def sol(gen: torch.Generator, prompt: list[int], target: int) -> Example:
    return Example(prompt, torch.randint(0, VOCAB, (target,), generator=gen).tolist())


def prompt(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=gen).tolist()


def mixed(gen: torch.Generator) -> list:
    """Candidates with 1, 2 and 3 solutions of different lengths (one with a repeat), mixed
    with single-solution candidates given as plain Examples."""
    p2, p3, pr = prompt(gen, 6), prompt(gen, 2), prompt(gen, 4)
    rep = sol(gen, pr, 5)
    return [rand_example(gen, 4, 7),
            [sol(gen, p2, 3), sol(gen, p2, 11)],
            [sol(gen, p3, 1), sol(gen, p3, 8), sol(gen, p3, 20)],
            rand_example(gen, 9, 30),
            [rep, rep, sol(gen, pr, 4)],
            [sol(gen, prompt(gen, 3), 6)]]


def want(model, ref, cands, names=None, project=None):
    return oracle(model, ref, cands, names, project)


ARCHS = [("qwen2", True), ("qwen2", False), ("gpt2", True), ("gpt2", False), ("llama", True)]


@pytest.mark.parametrize("kind,tied", ARCHS)
@pytest.mark.parametrize("path", ["auto", "ghost", "materialize"])
def test_several_solutions_match_the_oracle(kind, tied, path, gen):
    model = tiny_model(kind, tied)
    ref = [rand_example(gen, 5, 9), rand_example(gen, 3, 20)]
    cands = mixed(gen)
    scorer = GradientScorer(model, "all", path=path)
    scorer.set_reference(ref)
    got = scorer.score(cands)
    assert_matches(got, want(model, ref, cands))
    # the package's own oracle agrees (mean of the per-solution gradients)
    g_ref = flatten(reference_grads(model, scorer.params, ref))
    for s, g in zip(got, per_example_grads(model, scorer.params, cands), strict=True):
        v = flatten(g)
        assert s.grad_norm == pytest.approx(float(v.norm()), rel=1e-4)
        assert s.inner == pytest.approx(float(v @ g_ref), rel=1e-3, abs=1e-6)
    # not the first solution's score: the others change g(x)
    first = scorer.score([c if isinstance(c, Example) else c[0] for c in cands])
    for i in (1, 2, 4):
        assert abs(first[i].grad_norm - got[i].grad_norm) > 1e-3 * got[i].grad_norm


def test_tiny_chunks_and_one_candidate_per_pass_change_nothing(gen):
    model = tiny_model("qwen2", True)
    ref = [rand_example(gen, 4, 6)]
    cands = mixed(gen)
    base = GradientScorer(model)
    base.set_reference(ref)
    for kw in ({"chunk_bytes": 1, "path": "materialize"}, {"chunk_bytes": 1, "path": "ghost"},
               {"max_batch_tokens": 80, "cpu_pass_tokens": 0}):
        sc = GradientScorer(model, **kw)
        sc.set_reference(ref)
        assert_matches(sc.score(cands), want(model, ref, cands))
        assert sc.oversize == 0


def test_identical_solutions_score_as_one(gen):
    model = tiny_model("llama", False)
    ref = [rand_example(gen, 4, 6)]
    ex = rand_example(gen, 3, 9)
    sc = GradientScorer(model)
    sc.set_reference(ref)
    one, three = sc.score([ex, [ex, ex, ex]])
    assert three.grad_norm == pytest.approx(one.grad_norm, rel=1e-6)
    assert three.cosine == pytest.approx(one.cosine, abs=1e-6)
    sets = solution_sets([[ex, ex, rand_example(gen, 3, 2)]])
    assert sets[0].k == 2 and sets[0].weights == (2 / 3, 1 / 3)
    with pytest.raises(ValueError, match="at least one"):
        solution_sets([[]])


class Scale(torch.nn.Module):
    """A parameterized module outside the closed forms: handled by the vmap path."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * self.weight + x


def test_vmap_path_sums_a_candidates_rows(gen):
    model = tiny_model("qwen2", False)
    inner = model.model.layers[1].mlp.act_fn
    model.model.layers[1].mlp.act_fn = torch.nn.Sequential(Scale(24), inner)
    ref = [rand_example(gen, 4, 6)]
    cands = mixed(gen)
    for chunk in (64 << 20, 1):  # whole batch, then one candidate per vmap chunk
        sc = GradientScorer(model, chunk_bytes=chunk)
        sc.set_reference(ref)
        assert_matches(sc.score(cands), want(model, ref, cands))
        assert sc.layer_paths["model.layers.1.mlp.act_fn.0"] == ["vmap"]


def test_declined_module_falls_back_exactly_with_solutions(gen):
    model = tiny_model("qwen2", True)
    layer = model.model.layers[0]
    layer.post_attention_layernorm = called_with_a_keyword(layer.post_attention_layernorm)
    ref, cands = [rand_example(gen, 3, 6)], mixed(gen)
    sc = GradientScorer(model)
    sc.set_reference(ref)
    assert_matches(sc.score(cands), want(model, ref, cands))
    assert "loop" in sc.layer_paths["model.layers.0.post_attention_layernorm.inner.weight"]


@pytest.mark.parametrize("kind,tied", [("qwen2", True), ("gpt2", False)])
def test_projection_matches_the_projected_oracle(kind, tied, gen):
    model = tiny_model(kind, tied)
    ref = [rand_example(gen, 4, 6), rand_example(gen, 2, 9)]
    cands = mixed(gen)
    sc = GradientScorer(model, {"kind": "projection", "dim": 64, "seed": 3})
    sc.set_reference(ref)
    got = sc.score(cands)
    exp = want(model, ref, cands, project=lambda n, p, g: sc.sketch.project(
        n, p, g.unsqueeze(0))[0])
    assert_matches(got, exp)


def test_parameter_shards_merge_to_the_full_score(gen):
    from compassplay.records import Candidate
    from compassplay.step.messages import ScoredShard
    from compassplay.step.scoring import merge_shards
    from compassplay.step.timing import Timing

    model = tiny_model("gpt2", True)
    ref, cands = [rand_example(gen, 4, 6)], mixed(gen)
    recs = [Candidate(task_id=f"c{i}", task_type="deduction", solve_rate=0.5, prompt_ids=[1],
                      target_ids=[1]) for i in range(len(cands))]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    shards = []
    for k in range(2):
        sc = GradientScorer(model, names[k::2])
        sc.set_reference(ref)
        part = sc.partials(cands)
        shards.append(ScoredShard(recs, list(range(len(cands))), part.inner.tolist(),
                                  part.sq.tolist(), float(sc.reference.sq), Timing()))
    _, merged = merge_shards(shards, param_shard=True)
    got = [merged[r.task_id] for r in recs]
    exp = want(model, ref, cands)
    for (cos, inner, norm), (c2, i2, n2) in zip(got, exp, strict=True):
        assert cos == pytest.approx(c2, abs=1e-4)
        assert norm == pytest.approx(n2, rel=1e-4)
        assert inner == pytest.approx(i2, rel=1e-3, abs=1e-6)
    # one shard alone is not the full score (the merge adds the other's partials)
    alone = finalize(Partials(torch.tensor(shards[0].inner, dtype=torch.float64),
                              torch.tensor(shards[0].sq, dtype=torch.float64), None),
                     shards[0].ref_sq, None)
    assert all(abs(a.grad_norm - e[2]) > 1e-4 for a, e in zip(alone, exp, strict=True))


def test_a_candidate_over_the_token_bound_is_scored_by_the_exact_loop(gen):
    model = tiny_model("qwen2", True)
    ref = [rand_example(gen, 4, 6)]
    p = prompt(gen, 5)
    big = [sol(gen, p, 30), sol(gen, p, 25), sol(gen, p, 3)]  # 3 rows x 35 tokens = 105
    cands = [rand_example(gen, 3, 4), big, [sol(gen, p, 2), sol(gen, p, 9)]]
    sc = GradientScorer(model, max_batch_tokens=64, cpu_pass_tokens=0)
    sc.set_reference(ref)
    run, seen = sc.engine.run, []
    sc.engine.run = lambda b, run=run: (seen.append(b), run(b))[1]
    assert_matches(sc.score(cands), want(model, ref, cands))
    assert sc.oversize == 1
    for b in seen:  # every batched pass within the bound, its candidates' rows together
        k = 1 if b.slots is None else b.slots.shape[1]
        assert b.candidates * k * b.ids.shape[1] <= 64
        assert sorted(b.index) in ([0], [2], [0, 2])


def test_plan_keeps_each_candidates_rows_in_one_batch(gen):
    p = prompt(gen, 3)
    sets = solution_sets([rand_example(gen, 3, 5), [sol(gen, p, 4), sol(gen, p, 12)],
                          [sol(gen, p, 2)] * 2 + [sol(gen, p, 7)], rand_example(gen, 2, 20),
                          [sol(gen, p, 6), sol(gen, p, 1), sol(gen, p, 3)]])
    plan = plan_solution_batches(sets, 40)
    assert sorted(i for g in plan for i in g) == list(range(5))
    for g in plan:
        cost = len(g) * max(sets[i].k for i in g) * max(sets[i].width for i in g)
        assert cost <= 40 or len(g) == 1
    batch = make_solutions_batch([sets[i] for i in (1, 2, 0)], [1, 2, 0], torch.device("cpu"))
    assert batch.size == 5 and batch.candidates == 3
    assert batch.slots.tolist() == [[0, 1], [2, 3], [4, -1]]
    # row weights: each candidate's rows sum to one mean loss (2/3 for the repeated solution)
    assert batch.weights.sum(1).tolist() == pytest.approx([0.5, 0.5, 2 / 3, 1 / 3, 1.0])


def test_soar_trains_on_the_mean_of_each_candidates_solutions(gen):
    from compassplay.rewards.soar import backward_mean_loss

    from .conftest import loss_of

    model = tiny_model("qwen2", False)
    a, c = rand_example(gen, 3, 5), rand_example(gen, 4, 2)
    b = Example(a.prompt_ids, [1, 2, 3, 4, 5, 6, 7])
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    want_g = torch.autograd.grad(
        (torch.stack([loss_of(model, a), loss_of(model, b)]).mean() + loss_of(model, c)) / 2,
        params)
    tokens = backward_mean_loss(model, [[a, b, a, b], c], max_batch_tokens=12)
    assert tokens == len(a) + len(b) + len(c)  # repeats merged, not trained twice
    for p, g in zip(params, want_g, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
        p.grad = None
