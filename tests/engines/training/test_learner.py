from __future__ import annotations

import copy

import pytest
import torch

from compassplay.config import LearnerSection
from compassplay.engines import SamplingParams, make_learner
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.training.advantages import trajectory_advantages
from compassplay.engines.training.logprobs import pack, token_logprobs
from compassplay.engines.training.slot import lr_lambda
from compassplay.records import Trajectory
from tests.engines.adam_steps import assert_same_adam_step
from tests.engines.helpers import assert_reset_replays_first_step
from tests.tiny_models import synthetic_trajectories as on_policy_batch
from tests.tiny_models import tiny_causal_lm


def _objective(model, trajs) -> float:
    """Advantage-weighted summed log-prob: what the policy gradient ascends."""
    adv = trajectory_advantages(trajs)
    b = pack([t.generation for t in trajs])
    with torch.no_grad():
        lp = token_logprobs(model, b["input_ids"], b["attention_mask"], b["targets"])
    seq = (lp * b["mask"]).sum(-1)
    return float(sum(a * s for a, s in zip(adv, seq.tolist(), strict=True)))


def test_on_policy_ratio_is_one(model, tokenizer, learner_cfg):
    eng = HFGenerationEngine(model, tokenizer)
    gens = eng.generate([[1, 2, 3], [9], [40, 41, 42, 43]],
                        SamplingParams(max_new_tokens=8, temperature=0.7, top_p=0.9, seed=0))
    b = pack(gens)
    with torch.no_grad():
        lp = token_logprobs(model, b["input_ids"], b["attention_mask"], b["targets"])
    ratio = torch.exp(lp - b["old_logp"])[b["mask"] > 0]
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-4, rtol=0)
    trajs = [Trajectory(generation=g, reward=float(i), role="solver", task_type="deduction")
             for i, g in enumerate(gens)]
    stats = make_learner(learner_cfg, model).step(trajs)
    assert stats.clip_frac == 0.0 and stats.n_tokens == sum(len(g.completion_ids) for g in gens)


def test_learning_improves_objective_and_versions(model, learner_cfg):
    learner = make_learner(learner_cfg, model)
    before = _objective(model, on_policy_batch(model, n=8))
    for k in range(4):
        stats = learner.step(on_policy_batch(model, n=8))
        assert stats.weight_version == learner.weight_version == k + 1
        assert stats.grad_norm > 0 and stats.lr == pytest.approx(1e-2)
    assert _objective(model, on_policy_batch(model, n=8)) > before + 0.5


def test_micro_batch_does_not_change_update(learner_cfg):
    """Equal loss, gradient norm and update whatever the micro-batch (the update compared as
    `adam_steps.assert_same_adam_step` says: sign steps tightly, near-zero gradients loosely)."""
    start = [p.detach().clone() for p in tiny_causal_lm(seed=0).parameters()]
    results = []
    for mb in (1, 3, 16):
        m = tiny_causal_lm(seed=0)
        trajs = on_policy_batch(m, n=7)
        cfg = learner_cfg.model_copy(update={"micro_batch": mb})
        s = make_learner(cfg, m).step(trajs)
        results.append((s.loss, s.grad_norm, [p.detach().clone() for p in m.parameters()]))
    for loss, gn, params in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-6)
        assert gn == pytest.approx(results[0][1], rel=1e-5)
        counts = [assert_same_adam_step(a, b, p0, learner_cfg.lr, 1e-5)
                  for a, b, p0 in zip(params, results[0][2], start, strict=True)]
        assert sum(c[0] for c in counts) > 0.99 * sum(c[1] for c in counts)


def test_gradient_checkpointing_gives_the_same_update(learner_cfg):
    """learner.gradient_checkpointing recomputes block activations in backward: the update
    is the one without it (up to float order), and the model really checkpoints."""
    results = []
    for ckpt in (False, True):
        m = tiny_causal_lm(seed=0)
        trajs = on_policy_batch(m, n=5)
        s = make_learner(learner_cfg.model_copy(update={"gradient_checkpointing": ckpt}),
                         m).step(trajs)
        assert m.is_gradient_checkpointing == ckpt
        results.append((s.loss, s.grad_norm, [p.detach().clone() for p in m.parameters()]))
    (loss0, gn0, p0), (loss1, gn1, p1) = results
    assert loss1 == pytest.approx(loss0, abs=1e-6) and gn1 == pytest.approx(gn0, rel=1e-5)
    start = [p.detach() for p in tiny_causal_lm(seed=0).parameters()]
    counts = [assert_same_adam_step(a, b, s, learner_cfg.lr, 1e-5)
              for a, b, s in zip(p1, p0, start, strict=True)]
    assert sum(c[0] for c in counts) > 0.99 * sum(c[1] for c in counts)


def test_separate_models_update_their_own_role(model, learner_cfg):
    cfg = learner_cfg.model_copy(update={"shared_model": False})
    learner = make_learner(cfg, model)
    prop0 = learner.state_dict_for_sync("proposer")
    sol0 = learner.state_dict_for_sync("solver")
    learner.step(on_policy_batch(model, n=6, roles=("solver",)))
    prop1, sol1 = learner.state_dict_for_sync("proposer"), learner.state_dict_for_sync("solver")
    assert all(torch.equal(prop0[k], prop1[k]) for k in prop0)
    assert any(not torch.equal(sol0[k], sol1[k]) for k in sol0)
    batch = [t.model_copy(update={"reward": float(i)}) for i, t in
             enumerate(on_policy_batch(model, n=6, roles=("proposer", "solver")))]
    stats = learner.step(batch)
    assert set(stats.by_model) == {"proposer", "solver"} and learner.weight_version == 2
    prop2 = learner.state_dict_for_sync("proposer")
    assert any(not torch.equal(prop1[k], prop2[k]) for k in prop1)


def test_kl_to_reference(model, learner_cfg):
    cfg = learner_cfg.model_copy(update={"kl_coef": 0.1})
    with pytest.raises(ValueError, match="reference"):
        make_learner(cfg, model)
    learner = make_learner(cfg, model, ref_model=copy.deepcopy(model))
    assert learner.step(on_policy_batch(model, n=4)).kl == pytest.approx(0.0, abs=1e-7)
    assert learner.step(on_policy_batch(model, n=4)).kl > 0


def test_lr_schedules():
    f = lr_lambda("cosine", warmup_steps=2, total_steps=6)
    assert [round(f(n), 4) for n in range(7)] == [0.5, 1.0, 1.0, 0.8536, 0.5, 0.1464, 0.0]
    g = lr_lambda("linear", warmup_steps=0, total_steps=4)
    assert [g(n) for n in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    with pytest.raises(ValueError, match="total_steps"):
        lr_lambda("cosine", 0, None)
    cfg = LearnerSection(lr=1.0, schedule="linear", mini_batch_size=0)
    learner = make_learner(cfg, tiny_causal_lm(), total_steps=4)
    m = learner.slots["policy"].module
    lrs = [learner.step(on_policy_batch(m, n=2)).lr for _ in range(3)]
    assert lrs == [1.0, 0.75, 0.5]


def test_zero_advantage_trajectories_skipped_give_the_plain_update(learner_cfg):
    """A group whose rewards are all equal has zero advantages; the learner leaves it out of
    its passes. The update must equal the plain one: autograd of the token-mean PPO loss over
    every trajectory (normalizer = all completion tokens), then the same AdamW step."""
    from compassplay.engines.training.policy_loss import ppo_loss
    from compassplay.engines.training.torch_learner import make_adamw

    model = tiny_causal_lm(seed=3)
    trajs = on_policy_batch(model, n=6, seed=5)
    same = [t.model_copy(update={"reward": 0.7, "task_type": "abduction"}) for t in trajs[:3]]
    batch = trajs[3:] + same  # 3 deduction with varied rewards, 3 abduction all equal
    adv = trajectory_advantages(batch)
    assert [a == 0.0 for a in adv] == [False] * 3 + [True] * 3
    plain = copy.deepcopy(model)
    learner = make_learner(learner_cfg, model, total_steps=1)
    learner.step(batch)
    # the oracle, written out
    b = pack([t.generation for t in batch])
    logp = token_logprobs(plain, b["input_ids"], b["attention_mask"], b["targets"])
    a = torch.tensor(adv)[:, None].expand_as(logp)
    terms = ppo_loss(logp, b["old_logp"], a, b["mask"], learner_cfg.clip_eps,
                     normalizer=float(b["mask"].sum()))
    terms.loss.backward()
    # k_proj biases have a gradient of exactly zero in exact arithmetic (softmax shift
    # invariance): float noise there, which Adam normalizes to +-lr, is not compared
    signal = {n for n, p in plain.named_parameters() if not n.endswith("k_proj.bias")}
    assert len(signal) > 10
    torch.nn.utils.clip_grad_norm_(list(plain.parameters()), learner_cfg.max_grad_norm)
    make_adamw(list(plain.parameters()), learner_cfg.lr).step()
    start = dict(tiny_causal_lm(seed=3).named_parameters())
    counts = [assert_same_adam_step(p.detach(), q.detach(), start[n].detach(), learner_cfg.lr,
                                    1e-5, n)
              for (n, p), q in zip(model.named_parameters(), plain.parameters(), strict=True)
              if n in signal]
    assert sum(c[0] for c in counts) > 0.99 * sum(c[1] for c in counts)
    assert any((p - q).abs().max() > 0 for p, q in
               zip(model.parameters(), tiny_causal_lm(seed=3).parameters(), strict=True))


@pytest.mark.parametrize("shared", [True, False])
def test_torch_reset_in_place_equals_a_fresh_learner(shared):
    """LearnerWorker.restore without a checkpoint (torch backend): the initial weights back in
    place in every slot, fresh AdamW and schedule, version 0: the next step is the first again."""
    cfg = LearnerSection(lr=1e-3, micro_batch=2, schedule="linear", shared_model=shared,
                         mini_batch_size=0)
    model = tiny_causal_lm(seed=2)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    batch = on_policy_batch(tiny_causal_lm(seed=2), n=5, seed=3)
    learner = make_learner(cfg, model, total_steps=4)
    assert_reset_replays_first_step(learner, batch, initial, roles=("solver", "proposer"))


def test_entropy_and_response_length_are_measured(model, learner_cfg):
    """entropy: the mean over completion tokens of -sum_v p log p of the policy before the
    update (nats), computed here independently; response_length_mean: tokens per trajectory."""
    trajs = on_policy_batch(model, n=6)
    b = pack([t.generation for t in trajs])
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        p = torch.softmax(logits[:, :-1].float(), -1)
        ent = -(p * torch.log(p)).sum(-1)
    forwarded = torch.tensor([a != 0.0 for a in trajectory_advantages(trajs)])[:, None]
    mask = b["mask"] * forwarded  # zero-advantage trajectories are not forwarded (no KL)
    want = float((ent * mask).sum() / mask.sum())
    cfg = learner_cfg.model_copy(update={"micro_batch": 2})
    stats = make_learner(cfg, model).step(trajs)
    assert stats.entropy == pytest.approx(want, rel=1e-4)
    assert 0.0 < stats.entropy <= float(torch.log(torch.tensor(float(logits.shape[-1])))) + 1e-4
    lengths = [len(t.generation.completion_ids) for t in trajs]
    assert stats.response_length_mean == pytest.approx(sum(lengths) / len(lengths))
    assert stats.lr == pytest.approx(learner_cfg.lr)


def test_entropy_in_chunks_equals_the_whole():
    from compassplay.engines.training.logprobs import entropy_of

    logp = torch.log_softmax(torch.randn(3, 7, 11, generator=torch.Generator().manual_seed(0)),
                             -1)
    torch.testing.assert_close(entropy_of(logp, rows=4), -(logp.exp() * logp).sum(-1))


def test_mini_batches_partition_the_batch_the_same_way_on_every_rank():
    from compassplay.engines.training.learner import mini_batches

    assert mini_batches(5, 0, seed=3) == [[0, 1, 2, 3, 4]]  # 0: one optimizer step
    assert mini_batches(5, 8, seed=3) == [[0, 1, 2, 3, 4]]
    parts = mini_batches(384, 128, seed=7)
    assert [len(p) for p in parts] == [128, 128, 128]  # AZR's 7B step: 3 optimizer steps
    assert sorted(i for p in parts for i in p) == list(range(384))
    assert parts == mini_batches(384, 128, seed=7) != mini_batches(384, 128, seed=8)
    assert [len(p) for p in mini_batches(10, 4, seed=0)] == [3, 3, 4]


def test_mini_batch_size_takes_one_optimizer_step_per_mini_batch(learner_cfg):
    steps = {}
    for size in (0, 3):
        model = tiny_causal_lm(seed=0)
        trajs = on_policy_batch(model, n=7)
        learner = make_learner(learner_cfg.model_copy(update={"mini_batch_size": size}), model)
        slot = learner.slots[learner.slot_for("solver")]
        calls = []
        real = slot.step
        slot.step = lambda real=real, calls=calls: calls.append(1) or real()
        stats = learner.step(trajs)
        steps[size] = (len(calls), learner.weight_version, stats.n_tokens)
    assert steps[0][:2] == (1, 1) and steps[3][:2] == (3, 1)  # 7 -> 2 + 2 + 3, one version
    assert steps[0][2] == steps[3][2]  # every token trained once either way


def test_supervised_examples_give_the_sft_update(learner_cfg):
    """Trajectories with a fixed advantage of +1 (solver.train_on=selected, SGS's weighted SFT
    with weight 1), on policy: the update equals autograd of the token-mean negative
    log-likelihood followed by the same clipped AdamW step (compared as
    `adam_steps.assert_same_adam_step` says: sign steps tightly, near-zero gradients loosely)."""
    from compassplay.engines.training.torch_learner import make_adamw

    model = tiny_causal_lm(seed=4)
    batch = [t.model_copy(update={"advantage": 1.0}) for t in on_policy_batch(model, n=4, seed=2)]
    plain = copy.deepcopy(model)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    stats = make_learner(learner_cfg, model, total_steps=1).step(batch)
    b = pack([t.generation for t in batch])
    logp = token_logprobs(plain, b["input_ids"], b["attention_mask"], b["targets"])
    (-(logp * b["mask"]).sum() / b["mask"].sum()).backward()
    norm = torch.nn.utils.clip_grad_norm_(list(plain.parameters()), learner_cfg.max_grad_norm)
    assert stats.grad_norm == pytest.approx(float(norm), rel=1e-5) and norm > 1.0  # clipped
    make_adamw(list(plain.parameters()), learner_cfg.lr).step()
    params = dict(model.named_parameters())
    counts = [assert_same_adam_step(params[n].detach(), q.detach(), start[n], learner_cfg.lr,
                                    1e-5, name=n) for n, q in plain.named_parameters()]
    assert sum(c[0] for c in counts) > 0.99 * sum(c[1] for c in counts)


def test_a_step_with_nothing_to_train_on_keeps_the_weights_and_advances_the_version(
        model, learner_cfg):
    learner = make_learner(learner_cfg, model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = learner.step([])
    assert stats.weight_version == learner.weight_version == 1 and stats.n_tokens == 0
    assert stats.lr == pytest.approx(learner_cfg.lr)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
