"""The stages of one self-play step, as functions over records and an `Environment`.

    propose -> validate -> solve -> grade -> build_candidates -> (scorer partials, merged in
    `step.scoring`) -> assign_rewards -> make_trajectories -> (learner.step) -> summarize

Which worker runs which stage, and which stage feeds which, is defined once in `step.graph`;
both executors run that graph. Randomness is derived from (run seed, step, stage) only, so
both executors draw the same tasks and samples.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from compassplay.config import RewardSection, RunConfig
from compassplay.engines.generation.base import (
    GenerationEngine,
    SamplingParams,
    Segment,
    generate_grouped,
)
from compassplay.engines.training.learner import LearnerStats
from compassplay.envs.interface import Environment
from compassplay.records import (
    Attempt,
    Candidate,
    Generation,
    Score,
    StepStats,
    Task,
    Trajectory,
    Verdict,
)
from compassplay.rewards.functions import (
    closest_index,
    is_eligible,
    proposer_reward,
    token_jaccard,
)
from compassplay.rewards.shaping import Shaped, gate_of
from compassplay.step.prompting import (
    novelty_tokens,
    prefix_of,
    prompt_ids,
    stage_seed,
    target_ids,
    template_of,
)


@dataclass
class ProposalSet:
    """What `propose` returns: parsed proposals and the buffer tasks the solver also attempts."""

    tasks: list[Task]
    seed_tasks: list[Task]


def propose(env: Environment, engine: GenerationEngine, tokenizer, cfg: RunConfig,
            step: int) -> ProposalSet:
    """Sample proposals for every task type (batch_size each; none of a type the environment
    has no seed for, `Environment.can_propose`) and parse them (never raises)."""
    rng = random.Random(stage_seed(cfg.run.seed, step, "propose"))
    prompts, meta = [], []
    for task_type in cfg.task.types:
        if not env.can_propose(task_type):
            continue
        prefix = prefix_of(env, cfg, "proposer", task_type)
        for i in range(cfg.proposer.batch_size):
            text, seed_ids = env.proposer_prompt(task_type, rng)
            prompts.append(prompt_ids(tokenizer, text, prefix))
            meta.append((task_type, prefix, seed_ids, f"s{step}-{task_type}-{i}"))
    seed = stage_seed(cfg.run.seed, step, "gen-p")
    gens = _generate(engine, prompts, [template_of(env, cfg, "proposer", m[0]) for m in meta],
                     cfg.proposer, seed)
    tasks = []
    for gen, (task_type, prefix, seed_ids, task_id) in zip(gens, meta, strict=True):
        task = env.parse_proposal(task_type, prefix + gen.text, seed_ids, task_id)
        if gen.failed:  # the engine rejected the prompt or the request failed
            task = task.model_copy(update={"valid": False,
                                           "invalid_reason": f"generation: {gen.error}"})
        seed = env.seed_of(seed_ids[0]) if seed_ids else None
        shown = [(sid, text) for sid in seed_ids for text in env.reference_texts(task_type, [sid])]
        task = task.model_copy(update={
            "proposal": gen, "seed_program": seed.program if seed else "",
            "seed_texts": [text for _, text in shown]})
        tasks.append(_local_reference_seed(env, tokenizer, cfg, task, shown))
    seed_tasks = env.sample_buffer(cfg.solver.seed_tasks_per_step, rng)
    return ProposalSet(tasks=tasks, seed_tasks=seed_tasks)


def _local_reference_seed(env: Environment, tokenizer, cfg: RunConfig, task: Task,
                          shown: list[tuple[str, str]]) -> Task:
    """`reward.local_reference_seed=closest` (with a local reference and several shown seeds):
    the task's local reference comes from the shown seed novelty compares it with (largest
    token Jaccard on the novelty tokens); else it keeps the environment's (the first seed's)."""
    r = cfg.reward
    if (r.reference != "local" or r.local_reference_seed != "closest" or len(shown) < 2
            or not task.seed_statement or task.invalid_reason):
        return task
    kind = r.novelty_tokenizer
    mine = novelty_tokens(tokenizer, env.novelty_text(task), kind)
    i = closest_index(mine, [novelty_tokens(tokenizer, text, kind) for _, text in shown])
    return task.model_copy(update=env.seed_reference(task.task_type, shown[i][0]) or {})


def _generate(engine: GenerationEngine, prompts: list[list[int]],
              templates: list[tuple[Segment, ...]], section, seed: int) -> list[Generation]:
    """Prompt i under templates[i], results in prompt order (`GenerationEngine.generate_each`:
    the HF engine samples every row in one batch, others make one call per template). The
    seed of a template's rows is derived from `seed` and its first prompt's index (`seed`
    itself when all templates are equal); a one-batch call uses the first row's."""
    first: dict[tuple[Segment, ...], int] = {}
    for i, tpl in enumerate(templates):
        first.setdefault(tpl, i)
    params = [SamplingParams.from_section(
        section, seed=seed if len(first) == 1 else (seed + 7919 * first[tpl]) % (1 << 31),
        template=tpl) for tpl in templates]
    each = getattr(engine, "generate_each", None)  # duck-typed engines: one call per group
    return each(prompts, params) if each else generate_grouped(engine, prompts, params)


def validate(env: Environment, tasks: list[Task]) -> list[Task]:
    """Well-posedness through the sandbox; unparsed proposals (and those whose generation
    failed) pass through unchanged."""
    parsed = [t for t in tasks if not t.invalid_reason.startswith(("parse:", "generation:"))]
    checked = {t.task_id: t for t in env.validate(parsed)} if parsed else {}
    return [checked.get(t.task_id, t) for t in tasks]


def samples_per_task(cfg: RunConfig, tasks: list[Task], seed_ids: set[str]) -> list[int]:
    """Attempts per task: n_samples for proposed tasks (they estimate s(x)); for buffer tasks
    (`seed_ids`) solver.seed_task_samples (0 = n_samples)."""
    s = cfg.solver
    seed_n = s.seed_task_samples or s.n_samples
    return [seed_n if t.task_id in seed_ids else s.n_samples for t in tasks]


def solve(env: Environment, engine: GenerationEngine, tokenizer, cfg: RunConfig,
          tasks: list[Task], step: int, seed_ids: set[str] | None = None) -> list[Attempt]:
    """Attempts per task (`samples_per_task`; tasks must be valid), in task order then sample
    order. `seed_ids`: which tasks are buffer tasks (None: none are)."""
    counts = samples_per_task(cfg, tasks, seed_ids or set())
    owner = [(i, k) for i, n in enumerate(counts) for k in range(n)]
    prefixes = [prefix_of(env, cfg, "solver", t.task_type) for t in tasks]
    prompts = [prompt_ids(tokenizer, env.solver_prompt(tasks[i]), prefixes[i]) for i, _ in owner]
    if not prompts:
        return []
    templates = [template_of(env, cfg, "solver", tasks[i].task_type) for i, _ in owner]
    gens = _generate(engine, prompts, templates, cfg.solver,
                     stage_seed(cfg.run.seed, step, "gen-s"))
    attempts = []
    for (i, k), gen in zip(owner, gens, strict=True):
        att = env.parse_attempt(tasks[i], prefixes[i] + gen.text, k)
        attempts.append(att.model_copy(update={"generation": gen}))
    return attempts


def grade(env: Environment, tasks: list[Task], attempts: list[Attempt]) -> list[Verdict]:
    """Verdicts in attempt order (one batched sandbox call)."""
    by_id = {t.task_id: t for t in tasks}
    return env.grade([(by_id[a.task_id], a) for a in attempts]) if attempts else []


def build_candidates(env: Environment, tokenizer, cfg: RunConfig, tasks: list[Task],
                     attempts: list[Attempt], verdicts: list[Verdict],
                     rates: dict[str, float]) -> list[Candidate]:
    """Eligible proposed tasks (valid, 0 < s < 1, a verified solution) as scorer inputs, with
    every verified solution `env.verified_solutions` gives (task.verified_solution: all correct
    attempts, the first, or gold): `target_ids` the first, `more_target_ids` the rest;
    `rates` is s(x) per solved task (`GradeBatch.merge`)."""
    out = []
    for task in tasks:
        if task.source != "proposed" or task.task_id not in rates:
            continue
        mine = [i for i, a in enumerate(attempts) if a.task_id == task.task_id]
        solutions = env.verified_solutions(task, [attempts[i] for i in mine],
                                           [verdicts[i] for i in mine])
        if not is_eligible(rates[task.task_id], valid=task.valid,
                           has_solution=bool(solutions)):
            continue
        kind = cfg.reward.novelty_tokenizer
        prefix = prefix_of(env, cfg, "solver", task.task_type)
        if prefix:  # a gold rendering includes the opening
            solutions = [s[len(prefix):] if s.startswith(prefix) else s for s in solutions]
        targets = [target_ids(tokenizer, s) for s in solutions]
        ref: dict = {}
        if cfg.reward.reference == "local" and cfg.reward.needs.gradients:
            local = env.local_reference(task)
            if local is None:  # no seed solution to align with: the task is not scored
                continue
            ref_solution = local[1][len(prefix):] if prefix and local[1].startswith(prefix) \
                else local[1]
            ref = {"ref_prompt_ids": prompt_ids(tokenizer, local[0], prefix),
                   "ref_target_ids": target_ids(tokenizer, ref_solution)}
        out.append(Candidate(**ref,
            task_id=task.task_id, task_type=task.task_type, solve_rate=rates[task.task_id],
            prompt_ids=prompt_ids(tokenizer, env.solver_prompt(task), prefix),
            target_ids=targets[0], more_target_ids=targets[1:],
            **dict(zip(("novelty_tokens", "seed_tokens"),
                       candidate_novelty(env, tokenizer, task, kind), strict=True))))
    return out


def candidate_novelty(env: Environment, tokenizer, task: Task, kind: str) -> tuple[list, list]:
    """(tokens of what the proposer wrote, tokens of the closest shown reference): the
    reference with the largest token Jaccard among all shown (`task.seed_texts`; the
    environment's `novelty_pair` when there are none), so a copy of any of them scores 0."""
    mine = novelty_tokens(tokenizer, env.novelty_text(task), kind)
    texts = task.seed_texts or [env.novelty_pair(task)[1]]
    refs = [novelty_tokens(tokenizer, t, kind) for t in texts]
    return mine, refs[closest_index(mine, refs)]


def assign_rewards(cfg: RewardSection, tasks: list[Task], rates: dict[str, float],
                   cands: list[Candidate], alignment: dict[str, tuple[float, float, float]],
                   utility: dict[str, float] | None = None) -> list[Score]:
    """One Score per proposed task.

    Parse failures get `format_penalty`, parsed but ill-posed tasks `invalid_penalty`;
    well-posed tasks get the reward of `cfg.kind`, `ineligible_reward` outside the band.
    `alignment[task_id] = (cosine, inner, grad_norm)` for scored candidates; `utility` holds
    SOAR's measured utility per task for kind "soar"; `rates` is s(x) per solved task.
    """
    by_cand = {c.task_id: c for c in cands}
    scores = []
    for task in tasks:
        if task.source != "proposed":
            continue
        s = rates.get(task.task_id, 0.0)
        cand = by_cand.get(task.task_id)
        cos, inner, norm = alignment.get(task.task_id, (None, None, None))
        nov = None
        if cand is not None:
            nov = 1.0 - token_jaccard(cand.novelty_tokens, cand.seed_tokens)
        parse_fail = task.invalid_reason.startswith("parse:")
        penalty = cfg.format_penalty if parse_fail else cfg.invalid_penalty
        if cfg.needs.heldout_loss:  # SOAR: the measured gain is the reward
            reward = penalty if not task.valid else (
                (utility or {}).get(task.task_id, 0.0) if cand is not None
                else cfg.ineligible_reward)
        else:
            reward = proposer_reward(
                cfg.kind, solve_rate=s, well_formed=task.valid, eligible=cand is not None,
                cosine=cos, inner=inner, novelty_value=nov, eta=cfg.eta,
                ineligible_reward=cfg.ineligible_reward, penalty=penalty)
        gate = gate_of(parse_fail=parse_fail, valid=task.valid, eligible=cand is not None,
                       kind=cfg.kind, novelty=nov)
        scores.append(Score(task_id=task.task_id, reward=reward, kind=cfg.kind,
                            eligible=cand is not None, solve_rate=s, cosine=cos, inner=inner,
                            grad_norm=norm, novelty=nov, gate=gate))
    return scores


def make_trajectories(env: Environment, tasks: list[Task], attempts: list[Attempt],
                      verdicts: list[Verdict], scores: list[Score],
                      normalize: str = "all", train_ids: set[str] | None = None,
                      select_max_solve_rate: float | None = None,
                      shaped: dict[str, Shaped] | None = None) -> list[Trajectory]:
    """Proposer trajectories (one per proposal) and solver trajectories (one per attempt at a
    task in `train_ids`; None: every attempt); a generation the engine failed
    (`Generation.failed`: no tokens to train on) gives none. `normalize` (reward.normalize):
    'eligible' labels eligible proposals so their rewards are standardized among themselves
    (`engines.training.advantages`). solver.train_on=buffer passes the buffer tasks' ids: the attempts
    that estimate s(x) are not trained on. solver.train_on=selected passes
    `select_max_solve_rate`: only the verified attempts at tasks with 0 < s <= it, each a
    supervised example (advantage +1; `selected_attempts`). 'gated_rank' takes each
    proposal's gate level and direction from `shaped` (`rewards.shaping.shape`; required)."""
    if normalize == "gated_rank" and shaped is None:
        raise ValueError("reward.normalize=gated_rank needs the shaped proposer rewards")
    by_task = {t.task_id: t for t in tasks}
    out = []
    for sc in scores:
        task = by_task[sc.task_id]
        if task.proposal is not None and not task.proposal.failed:
            sub = "eligible" if normalize == "eligible" and sc.eligible else ""
            gated = shaped[sc.task_id] if shaped is not None and normalize == "gated_rank" else None
            out.append(Trajectory(generation=task.proposal, reward=sc.reward, role="proposer",
                                  task_type=task.task_type, task_id=task.task_id,
                                  subgroup=sub, gate=gated.gate if gated else None,
                                  direction=gated.direction if gated else 0.0))
    chosen = (selected_attempts(attempts, verdicts, select_max_solve_rate)
              if select_max_solve_rate is not None else None)
    for i, (att, ver) in enumerate(zip(attempts, verdicts, strict=True)):
        if train_ids is not None and att.task_id not in train_ids:
            continue
        if chosen is not None and i not in chosen:
            continue
        if att.generation is not None and not att.generation.failed:
            out.append(Trajectory(generation=att.generation, reward=env.solver_reward(att, ver),
                                  role="solver", task_type=by_task[att.task_id].task_type,
                                  task_id=att.task_id,
                                  advantage=1.0 if chosen is not None else None))
    return out


def selected_attempts(attempts: list[Attempt], verdicts: list[Verdict],
                      max_solve_rate: float) -> set[int]:
    """Indices of SGS's prover training data: the verified attempts at each task whose solve
    rate over its attempts here is in (0, max_solve_rate] (SGS's HARD selection)."""
    tally: dict[str, list[int]] = {}
    for att, ver in zip(attempts, verdicts, strict=True):
        n_ok = tally.setdefault(att.task_id, [0, 0])
        n_ok[0] += 1
        n_ok[1] += int(ver.correct)
    band = {t for t, (n, ok) in tally.items() if 0 < ok and ok <= max_solve_rate * n}
    return {i for i, (att, ver) in enumerate(zip(attempts, verdicts, strict=True))
            if ver.correct and att.task_id in band}


def _mean_std(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    m = sum(xs) / len(xs)
    return m, (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5


def summarize(step: int, tasks: list[Task], rates: dict[str, float], attempts: list[Attempt],
              verdicts: list[Verdict], scores: list[Score], stats: LearnerStats,
              cost: dict, domain: dict[str, float] | None = None) -> StepStats:
    """The metrics.jsonl line of one step (`rates`: s(x) per solved task; `cost`: its timing
    and cost fields, `step.timing.step_cost`). `domain`: the environment's metrics
    (`Environment.step_metrics` plus `record_results`: copy_rate and rename_rate, and Lean's
    coverage, targets_proved and targets_attempted); when given, the distinct reward values among eligible candidates are counted
    too."""
    proposed_rates = [rates[t.task_id] for t in tasks if t.task_id in rates]
    rewards = [s.reward for s in scores]
    r_mean, r_std = _mean_std(rewards)
    parse = Counter(t.invalid_reason for t in tasks if t.invalid_reason.startswith("parse:"))
    parse.update(f"attempt:{a.parse_error}" for a in attempts if a.parse_error)
    invalid = Counter(t.invalid_reason for t in tasks
                      if t.invalid_reason and not t.invalid_reason.startswith("parse:"))
    by_type: dict[str, dict[str, float]] = {}
    for tt in sorted({t.task_type for t in tasks}):
        mine = [t for t in tasks if t.task_type == tt]
        by_type[tt] = {"proposals": len(mine), "valid": sum(t.valid for t in mine),
                       "eligible": sum(s.eligible for s in scores
                                       if s.task_id in {t.task_id for t in mine})}
    return StepStats(
        step=step, weight_version=stats.weight_version, proposals=len(tasks),
        proposer_weight_version=_version_of([t.proposal for t in tasks]),
        solver_weight_version=_version_of([a.generation for a in attempts]),
        valid=sum(t.valid for t in tasks), eligible=sum(s.eligible for s in scores),
        solve_rate_mean=_mean_std(proposed_rates)[0], reward_mean=r_mean, reward_std=r_std,
        reward_distinct=len({round(s.reward, 12) for s in scores if s.eligible}),
        loss=stats.loss,
        grad_norm=stats.grad_norm, lr=stats.lr, clip_frac=stats.clip_frac, kl=stats.kl,
        entropy=stats.entropy, response_length_mean=stats.response_length_mean,
        solver_accuracy=(sum(v.correct for v in verdicts) / len(verdicts)) if verdicts else 0.0,
        solve_rates=proposed_rates,
        parse_failures=dict(parse), invalid_reasons=dict(invalid), by_task_type=by_type,
        **cost, **_domain_fields(domain, scores))


def _version_of(gens: list[Generation | None]) -> int | None:
    """The oldest weight version among `gens` (None when there are none)."""
    versions = [g.weight_version for g in gens if g is not None]
    return min(versions) if versions else None


def _domain_fields(domain: dict[str, float] | None, scores: list[Score]) -> dict:
    if not domain:
        return {}
    out: dict = {k: domain.get(k) for k in ("coverage", "copy_rate", "rename_rate")}
    out.update({k: int(domain[k]) for k in ("targets_proved", "targets_attempted")
                if domain.get(k) is not None})
    out["eligible_reward_distinct"] = len({round(s.reward, 12) for s in scores if s.eligible})
    return out


def samples(step: int, tasks: list[Task], scores: list[Score], max_chars: int = 4000
            ) -> list[dict]:
    """Human-readable rows for samples.jsonl: each proposal, its verdict and its reward."""
    by_id = {s.task_id: s for s in scores}
    rows = []
    for t in tasks:
        sc = by_id.get(t.task_id)
        rows.append({"step": step, "task_id": t.task_id, "task_type": t.task_type,
                     "valid": t.valid, "invalid_reason": t.invalid_reason,
                     "solve_rate": sc.solve_rate if sc else None,
                     "reward": sc.reward if sc else None, "cosine": sc.cosine if sc else None,
                     "gate": sc.gate if sc else None,
                     "proposal": t.proposal.text[:max_chars] if t.proposal else ""})
    return rows
