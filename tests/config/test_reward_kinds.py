"""One reward-kind table (`config.reward_kinds.REWARD_NEEDS`): every kind of the config has a
row, and the scorer, the memory plan, the dry run and the pure reward functions agree with it."""

from __future__ import annotations

import typing

import pytest

from compassplay.config import GRADIENT_KINDS, REWARD_NEEDS, RewardSection, load_config
from compassplay.plan import role_memory
from compassplay.plan.shapes import SMOLLM2_135M
from compassplay.rewards.functions import REWARD_KINDS, proposer_reward
from compassplay.workers.scorer_worker import ScorerWorker

KINDS = typing.get_args(RewardSection.model_fields["kind"].annotation)


def _cfg(kind: str):
    return load_config("micro", [f"reward.kind={kind}"])


def test_every_config_kind_has_exactly_one_row():
    assert set(KINDS) == set(REWARD_NEEDS)
    assert GRADIENT_KINDS == ("cosine", "inner", "cos_novelty", "precond_cosine")
    for kind in KINDS:
        needs = REWARD_NEEDS[kind]
        assert not (needs.gradients and needs.heldout_loss)
        assert not needs.metric or needs.gradients  # the metric weighs gradients
        assert _cfg(kind).reward.needs == needs


@pytest.mark.parametrize("kind", KINDS)
def test_scorer_runs_the_pass_of_the_table(kind, monkeypatch):
    """`ScorerWorker._score` runs the pass the row names (no model needed to see which)."""
    worker = ScorerWorker.__new__(ScorerWorker)
    worker.cfg = _cfg(kind)
    ran: list[str] = []
    for name, tag in (("_nothing", "none"), ("_alignment", "gradients"),
                      ("_heldout_gains", "heldout_loss")):
        monkeypatch.setattr(worker, name, lambda cands, tag=tag: ran.append(tag))
    worker._score([])
    assert ran == [REWARD_NEEDS[kind].scorer_pass]


@pytest.mark.parametrize("kind", KINDS)
def test_memory_plan_counts_what_the_table_needs(kind):
    needs = REWARD_NEEDS[kind]
    parts = role_memory.scorer_role(_cfg(kind), SMOLLM2_135M, 0).parts
    assert ("soar_copy" in parts) == needs.heldout_loss
    assert ("reference_grad" in parts) == needs.gradients
    assert ("metric" in parts) == needs.metric
    if needs.scorer_pass == "none":
        assert set(parts) == {"weights", "sync_staging"}


@pytest.mark.parametrize("kind", KINDS)
def test_dry_run_checks_the_data_the_table_needs(kind):
    from compassplay.commands.dry_run import dry_run

    cfg = _cfg(kind)
    assert not cfg.logging.reference_loss
    report = dry_run(cfg, "local")
    needs = REWARD_NEEDS[kind]
    assert ("reference_items" in report) == needs.reference_set(cfg.reward.reference)
    assert ("soar_heldout_items" in report) == (needs.heldout_loss
                                                and cfg.reward.soar_heldout != "seeds")


@pytest.mark.parametrize("kind", [k for k in KINDS if not REWARD_NEEDS[k].heldout_loss])
def test_pure_rewards_read_what_the_table_says(kind):
    """`proposer_reward` needs a cosine or inner product exactly for the gradient kinds and
    a novelty value exactly for the novelty kinds (SOAR's gain is measured, not computed)."""
    assert kind in REWARD_KINDS
    full = {"cosine": 0.5, "inner": 0.25, "novelty_value": 0.5}
    assert isinstance(proposer_reward(kind, solve_rate=0.5, **full), float)
    needs = REWARD_NEEDS[kind]
    for name, needed in (("cosine", needs.gradients and kind != "inner"),
                         ("inner", kind == "inner"), ("novelty_value", needs.novelty)):
        args = {k: v for k, v in full.items() if k != name}
        if needed:
            with pytest.raises(ValueError, match=f"needs {name}"):
                proposer_reward(kind, solve_rate=0.5, **args)
        else:
            proposer_reward(kind, solve_rate=0.5, **args)
    assert {k for k in KINDS if not REWARD_NEEDS[k].heldout_loss} == set(REWARD_KINDS)
