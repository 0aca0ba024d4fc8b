"""learner.share_prefix: the leading tokens every row of a micro-batch shares go through the
model once, and the log-probs, entropies and gradients equal the padded forward's (the plain
path is the oracle); the learner plans its micro-batches by prompt prefix
(`prefix_chunks`) so rows that share one meet."""

from __future__ import annotations

import pytest
import torch

from compassplay.engines import make_learner
from compassplay.engines.generation.prefix_plan import common_prefix
from compassplay.engines.training import shared_prefix
from compassplay.engines.training.logprobs import pack, token_logprobs_entropy
from compassplay.records import Generation, Trajectory
from tests.tiny_models import tiny_causal_lm


def _batch(prompts: list[list[int]], completions: list[list[int]], pad: int = 259):
    gens = [Generation(prompt_ids=p, completion_ids=c, logprobs=[-1.0] * len(c), text="")
            for p, c in zip(prompts, completions, strict=True)]
    return pack(gens, pad_token_id=pad)


def _rows(seed: int, shared: int, tails: list[int], completions: list[int]):
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(0, 256, (shared,), generator=g).tolist()
    prompts = [head + torch.randint(0, 256, (t,), generator=g).tolist() for t in tails]
    comps = [torch.randint(0, 256, (c,), generator=g).tolist() for c in completions]
    return prompts, comps


def _run(model, b, share: bool, autocast=None):
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs_entropy(model, b["input_ids"], b["attention_mask"], b["targets"],
                                     b["mask"], autocast=autocast, share_prefix=share)
    (lp * torch.linspace(-1, 1, lp.shape[1])).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent, grads


def _positions(prompts, lengths, chunks) -> int:
    """Positions the chunks' passes compute (`prefix_chunks`' cost without the overhead)."""
    total = 0
    for chunk in chunks:
        width = max(lengths[i] for i in chunk)
        shared = 0
        if len(chunk) > 1:
            common = min(common_prefix(prompts[chunk[0]], prompts[i]) for i in chunk)
            shared = min(common, min(len(prompts[i]) for i in chunk) - 1, width - 1)
            shared = shared if shared >= shared_prefix.MIN_SHARED else 0
        total += shared + len(chunk) * (width - shared)
    return total


def test_prefix_chunks_keep_the_proposers_task_types_apart():
    """Three task types, four rows each, arriving interleaved: 200 shared tokens within a
    type, 8 (a chat template's opening) across types. Chunks of 4 in arrival order share 8."""
    g = torch.Generator().manual_seed(0)
    opening = torch.randint(0, 256, (8,), generator=g).tolist()
    heads = [opening + torch.randint(0, 256, (192,), generator=g).tolist() for _ in range(3)]
    prompts = [heads[i % 3] + torch.randint(0, 256, (int(torch.randint(100, 160, (1,),
               generator=g)),), generator=g).tolist() for i in range(12)]
    lengths = [len(p) + 40 for p in prompts]
    chunks = shared_prefix.prefix_chunks(prompts, lengths, size=4)
    assert sorted(i for c in chunks for i in c) == list(range(12))
    assert all(len(c) <= 4 for c in chunks)
    assert sorted(sorted(i % 3 for i in c) for c in chunks) == [[0] * 4, [1] * 4, [2] * 4]
    arrival = [list(range(k, k + 4)) for k in range(0, 12, 4)]
    assert _positions(prompts, lengths, chunks) < 0.65 * _positions(prompts, lengths, arrival)


def test_prefix_chunks_keep_one_tasks_samples_together_and_every_row_once():
    """Solver samples left after zero-advantage rows dropped: 3, 2 and 3 of three tasks."""
    g = torch.Generator().manual_seed(1)
    tasks = [torch.randint(0, 256, (100,), generator=g).tolist() for _ in range(3)]
    rows = [0, 1, 2, 0, 2, 1, 0, 2]
    prompts = [tasks[t] for t in rows]
    lengths = [100 + int(torch.randint(5, 30, (1,), generator=g)) for _ in rows]
    chunks = shared_prefix.prefix_chunks(prompts, lengths, size=4)
    assert sorted(i for c in chunks for i in c) == list(range(8))
    assert sorted(sorted(rows[i] for i in c) for c in chunks) == [[0, 0, 0], [1, 1], [2, 2, 2]]
    assert shared_prefix.prefix_chunks([], [], size=4) == []
    assert shared_prefix.prefix_chunks([[1, 2]], [5], size=4) == [[0]]
    # nothing shared: every chunk as full as `size` allows
    lone = [[i] * 20 for i in range(9)]
    assert len(shared_prefix.prefix_chunks(lone, [30] * 9, size=4)) == 3


def test_shared_prefix_len_stops_at_the_first_difference_pad_or_needed_position():
    prompts, comps = _rows(0, 20, [0, 3, 5], [4, 2, 6])
    b = _batch(prompts, comps)
    args = (b["input_ids"], b["attention_mask"], b["mask"])
    assert shared_prefix.shared_prefix_len(*args) == 19  # row 0's first target is at 19
    assert shared_prefix.shared_prefix_len(*args, min_len=20) == 0
    prompts[1][7] = (prompts[1][7] + 1) % 256
    b = _batch(prompts, comps)
    assert shared_prefix.shared_prefix_len(b["input_ids"], b["attention_mask"], b["mask"],
                                           min_len=4) == 7
    one = _batch(prompts[:1], comps[:1])
    assert shared_prefix.shared_prefix_len(one["input_ids"], one["attention_mask"],
                                           one["mask"]) == 0


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("tails", [[0, 0, 0, 0], [5, 0, 9, 2]])
def test_log_probs_entropies_and_gradients_equal_the_padded_forward(attn, tails):
    model = tiny_causal_lm(seed=1).train()
    model.config._attn_implementation = attn
    prompts, comps = _rows(1, 24, tails, [6, 3, 11, 1])
    b = _batch(prompts, comps)
    assert shared_prefix.shared_prefix_len(b["input_ids"], b["attention_mask"], b["mask"]) == 23
    seen = []  # positions the first block computes
    model.model.layers[0].register_forward_hook(lambda m, a, o: seen.append(a[0].shape[:2]))
    lp0, ent0, g0 = _run(model, b, share=False)
    plain = list(seen)
    seen.clear()
    lp1, ent1, g1 = _run(model, b, share=True)
    assert [tuple(s) for s in plain] == [(4, b["input_ids"].shape[1])]
    assert [tuple(s) for s in seen] == [(1, 23), (4, b["input_ids"].shape[1] - 23)]
    mask = b["mask"].bool()
    torch.testing.assert_close(lp1[mask], lp0[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent1[mask], ent0[mask], rtol=1e-5, atol=1e-5)
    assert g1.keys() == g0.keys()
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_other_architectures_share_too_and_dropout_turns_it_off(kind):
    from tests.rewards.conftest import tiny_model  # Llama (rotary) and GPT-2 (learned positions)

    model = tiny_model(kind, tied=True).eval()
    prompts, comps = _rows(5, 20, [0, 3, 1], [5, 2, 7])
    prompts = [[t % 61 for t in p] for p in prompts]
    comps = [[t % 61 for t in c] for c in comps]
    b = _batch(prompts, comps, pad=0)
    assert shared_prefix.supports_shared_prefix(model)
    lp0, _, g0 = _run(model, b, share=False)
    lp1, _, g1 = _run(model, b, share=True)
    mask = b["mask"].bool()
    torch.testing.assert_close(lp1[mask], lp0[mask], rtol=1e-5, atol=1e-5)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-6, msg=n)
    # in training mode GPT-2's dropout (p = 0.1) would share the prefix's masks among rows
    assert shared_prefix.supports_shared_prefix(model.train()) == (kind == "llama")


def test_under_autocast_the_shared_forward_stays_within_bfloat16_rounding_of_the_plain():
    model = tiny_causal_lm(seed=2, hidden_size=128).train()
    prompts, comps = _rows(2, 30, [0, 0, 4], [5, 8, 3])
    b = _batch(prompts, comps)
    lp0, _, g0 = _run(model, b, share=False, autocast=torch.bfloat16)
    lp1, _, g1 = _run(model, b, share=True, autocast=torch.bfloat16)
    mask = b["mask"].bool()
    assert (lp1[mask] - lp0[mask]).abs().max() < 0.02
    flat0 = torch.cat([g.flatten() for g in g0.values()])
    flat1 = torch.cat([g1[n].flatten() for n in g0])
    assert torch.nn.functional.cosine_similarity(flat0, flat1, dim=0) > 0.999


def _trajectories(model) -> list[Trajectory]:
    """Two tasks' prompts, three samples each, interleaved (so only grouping brings them
    together)."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (26, 31)]
    out = []
    for i in range(6):
        c = torch.randint(60, 70, (int(torch.randint(2, 7, (1,), generator=g)),),
                          generator=g).tolist()
        gen = Generation(prompt_ids=prompts[i % 2], completion_ids=c, logprobs=[0.0] * len(c),
                         text="")
        out.append(Trajectory(generation=gen, reward=float(i), role="solver",
                              task_type="deduction"))
    b = pack([t.generation for t in out], pad_token_id=259)
    with torch.no_grad():
        lp, _ = token_logprobs_entropy(model, b["input_ids"], b["attention_mask"],
                                       b["targets"], b["mask"])
    return [t.model_copy(update={"generation": t.generation.model_copy(
        update={"logprobs": lp[i][b["mask"][i] > 0].tolist()})}) for i, t in enumerate(out)]


def test_the_learner_update_is_the_same_with_and_without_sharing(learner_cfg, monkeypatch):
    cfg = learner_cfg.model_copy(update={"micro_batch": 3})
    shared_calls = []
    orig = shared_prefix.hidden_after_prefix

    def counted(base, ids, attn, p):
        shared_calls.append((ids.shape[0], p))
        return orig(base, ids, attn, p)

    monkeypatch.setattr("compassplay.engines.training.logprobs.hidden_after_prefix", counted)
    grads = {}
    for share in (False, True):
        model = tiny_causal_lm(seed=4)
        learner = make_learner(cfg.model_copy(update={"share_prefix": share}), model)
        assert learner.share_prefix == share  # one rank: as configured
        slot = learner.slots["policy"]
        step = slot.step

        def record(share=share, model=model, step=step):  # the gradient the optimizer gets
            grads[share] = {n: p.grad.clone() for n, p in model.named_parameters()
                            if p.grad is not None}
            return step()

        slot.step = record
        assert learner.step(_trajectories(model)).grad_norm > 0
    # planned by prompt, each micro-batch holds one task's three samples: two shared passes
    assert sorted(shared_calls) == [(3, 25), (3, 30)]
    assert grads[True].keys() == grads[False].keys()
    for n in grads[False]:
        torch.testing.assert_close(grads[True][n], grads[False][n], rtol=1e-4, atol=1e-6, msg=n)
