"""The reward path of one step on real records: sandbox grading, candidates, scorer, rewards."""

from pathlib import Path

import pytest

from compassplay.config import RewardSection, RunConfig, load_config
from compassplay.engines.training.advantages import trajectory_advantages
from compassplay.envs.code import CodeEnvironment
from compassplay.models import load_model
from compassplay.records import Attempt, Generation, Task
from compassplay.rewards.functions import token_jaccard
from compassplay.rewards.oracle import flatten, per_example_grads, reference_grads
from compassplay.rewards.reference_set import load_reference
from compassplay.rewards.shaping import ScoreWindow, gate_levels, shape
from compassplay.step import stages
from compassplay.step.graph import StageCall, WeightsOffer
from compassplay.step.messages import AttemptBatch, GradeBatch, Validated
from compassplay.step.prompting import candidate_examples, reference_examples
from compassplay.step.scoring import merge_shards, merge_soar, merge_utility
from compassplay.step.timing import Timing
from compassplay.verifiers.sandbox.pool import PythonSandbox
from compassplay.workers.builders import make_env
from compassplay.workers.scorer_worker import ScorerWorker

WRONG = "```output\n'surely not the answer'\n```"


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(None, ["task.types=[deduction]"])
    with PythonSandbox(workers=2) as sb:
        env = CodeEnvironment(cfg.task, sb, seed=0)
        model, tok = load_model(cfg.model, seed=0)
        seeds = [t for t in env.buffer.pool("deduction")][:3]
        proposed = [t.model_copy(update={"task_id": f"p{i}", "source": "proposed",
                                         "seed_program": seeds[(i + 1) % 3].program})
                    for i, t in enumerate(seeds)]
        tasks = env.validate(proposed)
        assert all(t.valid for t in tasks)
        # task p0: 2 of 4 attempts right; p1: 4 of 4; p2: 1 of 4
        right = {"p0": 2, "p1": 4, "p2": 1}
        attempts = []
        for t in tasks:
            gold = env.gold_answer_text(t)
            for i in range(4):
                text = gold if i < right[t.task_id] else WRONG
                gen = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], text=text)
                att = env.parse_attempt(t, text, i)
                attempts.append(att.model_copy(update={"generation": gen}))
        bad = Task(task_id="p3", task_type="deduction", invalid_reason="parse:no_code_block")
        ill = Task(task_id="p4", task_type="deduction", program="def f(x): return x",
                   inputs=["1"], invalid_reason="invalid:banned_module")
        verdicts = stages.grade(env, tasks, attempts)
        # the production scoring path: candidates -> shard partials -> merge
        shards, alignment, cands = _scored_shards(tasks, attempts, verdicts,
                                                  ["reward.kind=cosine"], 1)
        yield cfg, env, tasks + [bad, ill], attempts, verdicts, cands, alignment


def _scored_shards(tasks, attempts, verdicts, overrides, num_shards):
    cfg = load_config(None, ["task.types=[deduction]", "reference.max_items=3", *overrides])
    validated = Validated(0, tasks, [], Timing())
    att, grades = AttemptBatch(attempts, Timing()), [GradeBatch(verdicts, Timing())]
    workers = [ScorerWorker(cfg, i, num_shards) for i in range(num_shards)]
    cands = workers[0].candidates(StageCall("candidates", 0), validated, att, grades)
    shards = [w.score(StageCall("score", 0, i, num_shards), WeightsOffer(0, lambda: None),
                      cands) for i, w in enumerate(workers)]
    alignment = merge_shards(shards, cfg.scorer.shard_mode == "param_shard")[1]
    return shards, alignment, cands.cands


def rates_of(tasks, verdicts):
    return GradeBatch.merge([GradeBatch(verdicts, Timing())], tasks).rates


def test_grading_and_eligibility(setup):
    _, _, tasks, attempts, verdicts, cands, alignment = setup
    assert rates_of(tasks, verdicts) == {"p0": 0.5, "p1": 1.0, "p2": 0.25}
    assert [c.task_id for c in cands] == ["p0", "p2"]  # p1 is solved always: ineligible
    assert set(alignment) == {"p0", "p2"}
    for cos, _, norm in alignment.values():
        assert -1.0 <= cos <= 1.0 and norm > 0


def test_alignment_matches_the_autograd_oracle(setup):
    cfg, _, _, _, _, cands, alignment = setup
    model, tok = load_model(cfg.model, seed=0)
    params = dict(model.named_parameters())
    ref = flatten(reference_grads(model, params, reference_examples(
        tok, load_reference(max_items=3))))
    grads = per_example_grads(model, params, candidate_examples(cands))
    for c, g in zip(cands, grads, strict=True):
        flat = flatten(g)
        cos, inner, norm = alignment[c.task_id]
        assert cos == pytest.approx(float(flat @ ref / (flat.norm() * ref.norm())), abs=1e-4)
        assert norm == pytest.approx(float(flat.norm()), rel=1e-4)


@pytest.mark.parametrize("kind", ["difficulty", "cosine", "inner", "novelty", "cos_novelty"])
def test_rewards_per_kind(setup, kind):
    _, _, tasks, _, verdicts, cands, alignment = setup
    cfg = RewardSection(kind=kind, eta=0.5)
    scores = {s.task_id: s for s in stages.assign_rewards(cfg, tasks, rates_of(tasks, verdicts), cands,
                                                           alignment)}
    assert scores["p3"].reward == -1.0  # unparseable proposal: format penalty
    assert scores["p4"].reward == -1.0  # parsed but ill-posed: invalid_penalty (AZR's code)
    by_cand = {c.task_id: c for c in cands}
    for tid in ("p0", "p2"):
        cos, inner, _ = alignment[tid]
        c = by_cand[tid]
        nov = 1.0 - token_jaccard(c.novelty_tokens, c.seed_tokens)
        want = {"difficulty": 1.0 - c.solve_rate, "cosine": cos, "inner": 0.5 * inner,
                "novelty": nov, "cos_novelty": cos * nov}[kind]
        assert scores[tid].reward == pytest.approx(want, abs=1e-12)
        assert scores[tid].eligible
    assert scores["p1"].reward == -0.5 and not scores["p1"].eligible  # s = 1: AZR's code


@pytest.mark.parametrize("kind", ["difficulty", "cosine", "soar"])
@pytest.mark.parametrize("outside,invalid", [(0.0, -0.5), (-0.5, -1.0)])
def test_outside_the_band_and_ill_posed_rewards_follow_the_config(setup, kind, outside,
                                                                   invalid):
    _, _, tasks, _, verdicts, cands, alignment = setup
    cfg = RewardSection(kind=kind, ineligible_reward=outside, invalid_penalty=invalid,
                        normalize="all")  # (0, -0.5) cannot be gated_rank's levels
    utility = {c.task_id: 0.125 for c in cands}
    scores = {s.task_id: s for s in stages.assign_rewards(
        cfg, tasks, rates_of(tasks, verdicts), cands, alignment, utility)}
    assert scores["p1"].reward == outside  # valid, solved by all 4 attempts: s = 1
    assert scores["p4"].reward == invalid and scores["p3"].reward == -1.0
    assert {t: scores[t].gate for t in ("p0", "p1", "p3", "p4")} == {
        "p0": "eligible", "p1": "ineligible", "p3": "unparsed", "p4": "invalid"}
    inside = {"difficulty": 0.5, "cosine": alignment["p0"][0], "soar": 0.125}[kind]
    assert scores["p0"].reward == pytest.approx(inside)  # s = 0.5: the kind's own reward


def test_configs_written_before_ineligible_reward_keep_their_rewards():
    old = RewardSection.model_validate({"kind": "difficulty", "azr_compat": True,
                                        "format_penalty": -1.0})
    assert (old.ineligible_reward, old.invalid_penalty) == (-0.5, -0.5)
    old = RewardSection.model_validate({"kind": "cosine", "azr_compat": True})
    assert (old.ineligible_reward, old.invalid_penalty) == (0.0, -0.5)
    assert RewardSection.model_validate({"kind": "difficulty", "azr_compat": False}
                                        ).ineligible_reward == 0.0
    new = RewardSection()
    assert (new.ineligible_reward, new.invalid_penalty, new.format_penalty) == (-0.5, -1.0,
                                                                                -1.0)


def test_the_7b_configs_state_their_rewards_outside_the_band():
    for name in ("paper_coding_7b", "baseline_difficulty_7b"):
        cfg = load_config(name)
        assert cfg.reward.ineligible_reward == -0.5 and cfg.reward.invalid_penalty == -1.0
    assert load_config("baseline_difficulty_7b").reward.kind == "difficulty"
    text = (Path(stages.__file__).parents[1] / "configs" / "baseline_difficulty_7b.yaml"
            ).read_text()
    assert "ineligible_reward: -0.5" in text and "paper" in text


def test_trajectories_carry_rewards(setup):
    _, env, tasks, attempts, verdicts, cands, alignment = setup
    scores = stages.assign_rewards(RewardSection(kind="cosine"), tasks, rates_of(tasks, verdicts), cands,
                                   alignment)
    trajs = stages.make_trajectories(env, tasks, attempts, verdicts, scores)
    solver = [t for t in trajs if t.role == "solver"]
    assert len(solver) == len(attempts)
    assert sum(t.reward for t in solver) == 7.0  # 2 + 4 + 1 correct attempts, binary reward
    assert all(t.role == "solver" for t in trajs)  # these hand-made proposals have no generation
    assert isinstance(attempts[0], Attempt)


def test_gated_rank_trajectories_carry_the_gate_and_the_direction(setup):
    """normalize=gated_rank: each proposer trajectory carries its class level and, when
    eligible, the rank of its cosine; the learner's advantages follow the cosine among them."""
    _, env, tasks, attempts, verdicts, cands, alignment = setup
    gen = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], text="x")
    tasks = [t.model_copy(update={"proposal": gen}) for t in tasks]
    cfg = RewardSection(kind="cosine")
    scores = stages.assign_rewards(cfg, tasks, rates_of(tasks, verdicts), cands, alignment)
    with pytest.raises(ValueError, match="gated_rank"):
        stages.make_trajectories(env, tasks, attempts, verdicts, scores, "gated_rank")
    levels = gate_levels(cfg.format_penalty, cfg.invalid_penalty, cfg.ineligible_reward,
                         cfg.copy_reward)
    shaped = shape(scores, levels, ScoreWindow(8), cfg.rank_weight)
    trajs = {t.task_id: t for t in stages.make_trajectories(
        env, tasks, attempts, verdicts, scores, "gated_rank", shaped=shaped)
        if t.role == "proposer"}
    assert {k: t.gate for k, t in trajs.items()} == {"p0": 0.0, "p1": -0.5, "p2": 0.0,
                                                     "p3": -1.0, "p4": -1.0}
    hi, lo = sorted(("p0", "p2"), key=lambda k: alignment[k][0], reverse=True)
    assert trajs[hi].direction > 0 > trajs[lo].direction
    adv = dict(zip(trajs, trajectory_advantages(list(trajs.values())), strict=True))
    assert adv[hi] > adv[lo] > adv["p1"] > adv["p3"]


@pytest.mark.parametrize("normalize", ["all", "eligible"])
def test_eligible_proposals_are_labelled_for_normalize_eligible(setup, normalize):
    _, env, tasks, attempts, verdicts, cands, alignment = setup
    gen = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], text="x")
    tasks = [t.model_copy(update={"proposal": gen}) for t in tasks]
    scores = stages.assign_rewards(RewardSection(kind="cosine", normalize=normalize), tasks,
                                   rates_of(tasks, verdicts), cands, alignment)
    trajs = stages.make_trajectories(env, tasks, attempts, verdicts, scores, normalize)
    labelled = {t.task_id for t in trajs if t.subgroup}
    assert all(t.role == "proposer" for t in trajs if t.subgroup)
    assert labelled == ({"p0", "p2"} if normalize == "eligible" else set())


def test_buffer_training_leaves_the_estimating_attempts_out(setup):
    """solver.train_on=buffer (AZR's code): the attempts that estimate s(x) are not trained
    on; the buffer tasks' attempts (seed_task_samples each) are."""
    cfg, env, tasks, attempts, verdicts, cands, alignment = setup
    buffer = [t.model_copy(update={"task_id": f"b{i}", "source": "seed"})
              for i, t in enumerate(tasks[:2])]
    run = load_config(None, ["task.types=[deduction]"])
    assert (run.solver.train_on, run.solver.seed_task_samples) == ("buffer", 1)
    ids = {t.task_id for t in buffer}
    assert stages.samples_per_task(run, tasks[:3] + buffer, ids) == [run.solver.n_samples] * 3 \
        + [1, 1]
    old = load_config(None, ["solver.seed_task_samples=0", "solver.n_samples=5"])
    assert stages.samples_per_task(old, buffer, ids) == [5, 5]  # 0 = n_samples
    gen = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], text="x")
    extra = [env.parse_attempt(b, env.gold_answer_text(b), 0).model_copy(
        update={"generation": gen}) for b in buffer]
    extra_verdicts = stages.grade(env, buffer, extra)
    scores = stages.assign_rewards(RewardSection(kind="cosine"), tasks, rates_of(
        tasks, verdicts), cands, alignment)
    everything = stages.make_trajectories(env, tasks + buffer, attempts + extra,
                                          verdicts + extra_verdicts, scores)
    separate = stages.make_trajectories(env, tasks + buffer, attempts + extra,
                                        verdicts + extra_verdicts, scores, train_ids=ids)
    assert len(everything) == len(attempts) + 2  # these proposals carry no generation
    assert [t.task_id for t in separate] == ["b0", "b1"]
    assert all(t.role == "solver" and t.reward == 1.0 for t in separate)


def test_selected_training_keeps_the_verified_attempts_at_tasks_in_sgss_band(setup):
    """solver.train_on=selected (SGS's code, the Lean default): only verified attempts at
    tasks with 0 < s <= select_max_solve_rate, each a supervised example (advantage +1).
    Here p0 is solved 2 of 4 times, p1 4 of 4, p2 1 of 4."""
    cfg, env, tasks, attempts, verdicts, cands, alignment = setup
    scores = stages.assign_rewards(RewardSection(kind="cosine"), tasks, rates_of(
        tasks, verdicts), cands, alignment)
    for most, expected in ((0.5, [("p0", 0), ("p0", 1), ("p2", 0)]), (0.25, [("p2", 0)]),
                           (1.0, [("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1), ("p1", 2),
                                  ("p1", 3), ("p2", 0)])):
        trajs = stages.make_trajectories(env, tasks, attempts, verdicts, scores,
                                         select_max_solve_rate=most)
        solver = [t for t in trajs if t.role == "solver"]
        chosen = sorted(stages.selected_attempts(attempts, verdicts, most))
        assert [(attempts[i].task_id, attempts[i].index) for i in chosen] == expected
        assert [t.task_id for t in solver] == [task for task, _ in expected]
        assert all(t.advantage == 1.0 and t.reward == 1.0 for t in solver)
        assert all(t.advantage is None for t in trajs if t.role == "proposer")
    lean = RunConfig.model_validate({"task": {"domain": "lean"}})
    assert (lean.solver.train_on, lean.solver.select_max_solve_rate) == ("selected", 0.5)


class _EchoEngine:
    """Answers every prompt with a wrong output block (records how many it was asked)."""

    def __init__(self) -> None:
        self.asked = 0

    def generate(self, prompts, params):
        self.asked += len(prompts)
        return [Generation(prompt_ids=list(p), completion_ids=[2], logprobs=[-1.0], text=WRONG)
                for p in prompts]


def test_solve_attempts_buffer_tasks_seed_task_samples_times(setup):
    _, env, tasks, _, _, _, _ = setup
    cfg = load_config(None, ["task.types=[deduction]", "solver.n_samples=3",
                             "solver.seed_task_samples=1"])
    _, tok = load_model(cfg.model, seed=0)
    engine = _EchoEngine()
    atts = stages.solve(env, engine, tok, cfg, tasks[:3], 0, {tasks[2].task_id})
    assert engine.asked == 7
    assert [(a.task_id, a.index) for a in atts] == [
        ("p0", 0), ("p0", 1), ("p0", 2), ("p1", 0), ("p1", 1), ("p1", 2), ("p2", 0)]


def test_the_7b_config_follows_azrs_training_batch():
    cfg = load_config("paper_coding_7b")
    s = cfg.solver
    assert (s.train_on, s.seed_tasks_per_step, s.seed_task_samples, s.n_samples) == (
        "buffer", 192, 1, 8)
    assert cfg.learner.mini_batch_size == 128 and cfg.task.induction_inputs == 10
    assert cfg.task.seed_file.split(",") == ["azr_7b_coder_seed_io.jsonl",
                                             "azr_7b_coder_code_f_seed_io.jsonl"]
    # Lean follows SGS's loop: n attempts at every target; SGS's selected proofs train
    lean = RunConfig.model_validate({"task": {"domain": "lean"}})
    assert (lean.solver.train_on, lean.solver.seed_task_samples) == ("selected", 0)
    # the CPU configs keep the earlier choices (a handful of buffer tasks per step)
    for name in ("default", "micro", "micro_warm"):
        c = load_config(name)
        assert (c.solver.train_on, c.solver.seed_task_samples, c.task.induction_inputs) == (
            "all", 0, 6)


def _scored(setup, overrides, num_shards=1):
    _, _, tasks, attempts, verdicts, _, _ = setup
    shards, alignment, _ = _scored_shards(tasks, attempts, verdicts, overrides, num_shards)
    return shards, alignment


@pytest.mark.parametrize("overrides,num_shards", [
    (["scorer.mode=naive"], 1),
    (["scorer.shard_mode=replica"], 2),
    (["scorer.shard_mode=param_shard"], 2),
])
def test_scorer_roles_agree_with_the_single_batched_scorer(setup, overrides, num_shards):
    _, _, _, _, _, _, alignment = setup
    _, got = _scored(setup, ["reward.kind=cosine", *overrides], num_shards)
    assert set(got) == set(alignment)
    for tid, (cos, inner, norm) in alignment.items():
        assert got[tid][0] == pytest.approx(cos, abs=1e-5)
        assert got[tid][1] == pytest.approx(inner, rel=1e-4, abs=1e-9)
        assert got[tid][2] == pytest.approx(norm, rel=1e-4)


def test_soar_rewards_are_one_value_per_group(setup):
    _, _, tasks, _, verdicts, cands, _ = setup
    shards, _ = _scored(setup, ["reward.kind=soar", "reward.soar_groups=1",
                                "reward.soar_lr=0.01"])
    utility = shards[0].utility
    assert set(utility) == {c.task_id for c in cands}
    assert len(set(utility.values())) == 1  # one group: every candidate gets the same value
    scores = {s.task_id: s for s in stages.assign_rewards(
        RewardSection(kind="soar"), tasks, rates_of(tasks, verdicts), cands, {}, utility)}
    assert scores["p0"].reward == utility["p0"] != 0.0
    assert scores["p1"].reward == -0.5 and scores["p3"].reward == -1.0
    # SOAR's compute is recorded with the step (merged over shards)
    cost = merge_soar(shards)
    assert cost["soar_groups"] == 1 and cost["soar_seconds"] > 0
    n_tok = sum(len(c.prompt_ids) + len(c.target_ids) for c in cands)
    assert cost["soar_train_tokens"] == load_config(None).reward.soar_inner_steps * n_tok
    assert cost["soar_eval_tokens"] > 0


def test_soar_groups_get_equal_rewards_within_and_held_out_seeds_leave_the_buffer(setup):
    _, _, tasks, _, verdicts, cands, _ = setup
    shards, _ = _scored(setup, ["reward.kind=soar", "reward.soar_group_size=1",
                                "reward.soar_lr=0.05", "reward.soar_inner_steps=2"], 2)
    utility = merge_utility(shards)
    assert set(utility) == {c.task_id for c in cands}  # two groups of one, one per shard
    assert len(set(utility.values())) == 2
    assert merge_soar(shards)["soar_groups"] == 2
    cfg = load_config(None, ["reward.kind=soar", "reward.soar_heldout_items=3"])
    env = make_env(cfg, None)
    held = {t.task_id for t in env.heldout}
    assert len(held) == 3 and not held & {t.task_id for t in env.buffer.pool()}
    assert len(env.buffer.pool()) + 3 == len(make_env(load_config(None), None).buffer.pool())


def test_prefill_is_part_of_the_prompt_not_of_the_target(setup):
    _, env, tasks, _, _, _, _ = setup
    cfg = load_config(None, ["task.types=[deduction]", "solver.prefill=true",
                             "task.verified_solution=gold"])
    _, tok = load_model(cfg.model, seed=0)
    task = tasks[0]
    prefix = env.response_prefix("solver", "deduction")
    assert prefix == "```output\n"
    assert env.response_prefix("proposer", "induction") == "```input\n"
    # the solver writes only what follows the prefilled opening; it still parses
    gold = env.gold_answer_text(task)
    att = env.parse_attempt(task, prefix + gold[len(prefix):], 0)
    assert att.answer and not att.parse_error
    verdicts = stages.grade(env, [task], [att, att.model_copy(update={"index": 1,
                                                                      "answer": "'x'"})])
    cands = stages.build_candidates(env, tok, cfg, [task], [att, att], verdicts,
                                    rates_of([task], verdicts))
    assert len(cands) == 1
    pre_ids = tok.encode(prefix, add_special_tokens=False)
    assert cands[0].prompt_ids[-len(pre_ids):] == pre_ids
    assert tok.decode(cands[0].target_ids[:-1]) == gold[len(prefix):]
