"""`LeanEnvironment`: self-play theorem proving on a target set (SGS-style, see the paper).

- Targets: a miniF2F-style jsonl (`targets`). Seeds are the targets the solver has proved
  (`buffer.LeanBuffer`, the checkpoint state). The paper's g_ref is the solver's verified
  proof of the seed the proposer conditions on, so the proposer is shown proved targets only:
  before the first proof an iteration has no conjectures (`can_propose` is False) and the
  prover attempts the targets alone. `task.lean.propose_before_proof` shows an unsolved target
  without a proof instead (its conjectures have no local reference).
- Proposal: conditioned on one seed statement (and its proof, `task.lean.include_proof`), the
  proposer writes a conjecture, a theorem statement in a ```lean block; its theorem is
  renamed to a unique `conj_<task id>`. Parse failures: 'parse:<reason>'. The prompt does not
  ask for novelty (`task.lean.forbid_copies`, off: the novelty factor closes the copy
  shortcut).
- Validation: Lean elaborates `<conjecture> := by sorry` (status 'sorry'); anything else is
  invalid with reason 'lean:<status>' (error, timeout, crash, memory, protocol, ...).
- Solving (SGS's iteration): n attempts at each valid conjecture and at every unsolved target
  (`sample_buffer`; `task.lean.targets_per_iteration=N`: a sample of N). An attempt is the
  full theorem with its proof (a bare tactic proof is completed with the statement).
  Conjectures and attempts using a word of `statements.BANNED` (axiom, native_decide, ...)
  are rejected unchecked ('banned_<word>').
- Grading: accepted by Lean and the statement unchanged (`check_statement_preserved`, in the
  pool: status 'statement_changed'). Checks go to the pool `task.lean.check_chunk` at a time,
  with a progress line per chunk (`chunked`).
- Verified solution: the first accepted proof. Local reference: (solver prompt of the seed,
  the seed's proof). Novelty pair: (conjecture, seed) signatures (theorem names dropped).
- `record_results`: a target's first accepted proof joins the buffer; coverage (distinct
  targets ever proved / targets), targets_proved and targets_attempted go to metrics.jsonl.
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from typing import Any

from compassplay.config import RunConfig
from compassplay.envs.interface import Environment
from compassplay.envs.lean import lean_prompts as prompts
from compassplay.envs.lean.chunked import check_in_chunks
from compassplay.envs.lean.lean_buffer import LeanBuffer
from compassplay.envs.lean.statements import (
    alpha_normal,
    banned_word,
    lean_block,
    parse_statement,
    rename,
    signature,
)
from compassplay.envs.lean.targets import load_targets
from compassplay.records import Attempt, Score, Task, Verdict
from compassplay.rewards.functions import Tokenize, regex_tokenize, token_jaccard
from compassplay.verifiers.lean.repl_pool import LeanCheck, LeanPool

log = logging.getLogger(__name__)
COPY_JACCARD = 0.8  # an in-band conjecture this close to its seed (token Jaccard) is a copy
RAN = ("accepted", "error", "sorry")  # statuses of a check that ran (the verdict is Lean's)


def conjecture_name(task_id: str) -> str:
    return "conj_" + re.sub(r"\W", "_", task_id)


class LeanEnvironment(Environment):
    """Prompts, parsing, validation, grading and the seed buffer for Lean proving."""

    def __init__(self, cfg: RunConfig, pool: LeanPool | None) -> None:
        self.cfg = cfg.task.lean
        self.solution_mode = cfg.task.verified_solution  # attempts: every accepted proof
        self.pool = pool
        targets, file_header = load_targets(self.cfg.target_file, self.cfg.split,
                                            self.cfg.max_targets)
        self.header = self.cfg.header or file_header or cfg.verifiers.lean.header
        self.buffer = LeanBuffer(targets)
        self.counters: Counter = Counter()

    # ----------------------------------------------------------------- proposer
    def can_propose(self, task_type: str) -> bool:
        """A proved target to condition on (or, with propose_before_proof, any target)."""
        return bool(self.buffer.proofs) or self.cfg.propose_before_proof

    def proposer_prompt(self, task_type: str, rng: random.Random) -> tuple[str, list[str]]:
        """The message showing one proved target (a uniform draw) and the seed's id."""
        seed = self.buffer.sample_seed(rng)
        if seed is None:
            if not self.cfg.propose_before_proof:
                raise RuntimeError("no proved target to condition on (can_propose is False)")
            seed = self.buffer.sample_unsolved(1, rng)[0]
        proved = seed.task_id in self.buffer.proofs
        proof = self.buffer.proofs.get(seed.task_id) if self.cfg.include_proof else None
        return prompts.proposer_prompt(seed.statement, proof, proved,
                                       self.cfg.forbid_copies), [seed.task_id]

    def response_prefix(self, role: str, task_type: str) -> str:
        return prompts.FENCE

    def parse_proposal(self, task_type: str, text: str, seed_ids: list[str],
                       task_id: str) -> Task:
        seed = self.buffer.targets.get(seed_ids[0]) if seed_ids else None
        task = Task(task_id=task_id, task_type="lean_prove", seed_ids=list(seed_ids),
                    seed_statement=seed.statement if seed else "",
                    seed_solution=self.buffer.proofs.get(seed.task_id, "") if seed else "")
        code, reason = lean_block(text)
        statement = ""
        if not reason:
            statement, reason = parse_statement(code)
        if not reason and banned_word(statement):
            reason = "banned_" + banned_word(statement).lstrip("#").replace(" ", "_")
        if reason:
            self.counters[f"parse:{reason}"] += 1
            return task.model_copy(update={"invalid_reason": f"parse:{reason}"})
        return task.model_copy(update={"statement": rename(statement, conjecture_name(task_id))})

    def validate(self, tasks: list[Task]) -> list[Task]:
        """Lean must elaborate each conjecture with `sorry` (one check_many)."""
        if not tasks:
            return []
        checks = [LeanCheck(t.statement + " := by sorry", header=self.header,
                            timeout_s=self.cfg.validate_timeout_s) for t in tasks]
        out = []
        verdicts = check_in_chunks(self._pool(), checks, self.cfg.check_chunk, "validation")
        for task, v in zip(tasks, verdicts, strict=True):
            ok = v.status == "sorry"
            if not ok:
                self.counters[f"invalid:lean:{v.status}"] += 1
            out.append(task.model_copy(update={
                "valid": ok, "invalid_reason": "" if ok else f"lean:{v.status}"}))
        return out

    # ------------------------------------------------------------------- solver
    def solver_prompt(self, task: Task) -> str:
        return prompts.solver_prompt(task.statement)

    def parse_attempt(self, task: Task, text: str, index: int) -> Attempt:
        code, reason = lean_block(text)
        code = code.strip()
        if not reason and not re.search(r"\b(theorem|lemma)\b", code):
            if not code:
                reason = "empty_block"
            else:
                code = f"{task.statement} := {code}" if code.startswith("by") else \
                    f"{task.statement} := by\n{code}"
        if not reason and banned_word(code):
            reason = "banned_" + banned_word(code).lstrip("#").replace(" ", "_")
        if reason:
            self.counters[f"attempt:{reason}"] += 1
            return Attempt(task_id=task.task_id, index=index, answer="", parse_error=reason)
        return Attempt(task_id=task.task_id, index=index, answer=code)

    def grade(self, pairs: list[tuple[Task, Attempt]]) -> list[Verdict]:
        """Accepted and statement unchanged; one check_many for every parsed attempt."""
        verdicts: list[Verdict | None] = [None] * len(pairs)
        jobs, checks = [], []
        for i, (task, att) in enumerate(pairs):
            if att.parse_error:
                verdicts[i] = Verdict(task_id=task.task_id, index=att.index, correct=False,
                                      status="parse_error", detail=att.parse_error)
            elif not task.valid or not task.statement:
                verdicts[i] = Verdict(task_id=task.task_id, index=att.index, correct=False,
                                      status="invalid_task", detail=task.invalid_reason)
            else:
                jobs.append(i)
                checks.append(LeanCheck(att.answer, header=self.header, target=task.statement,
                                        timeout_s=self.cfg.grade_timeout_s))
        results = check_in_chunks(self._pool(), checks, self.cfg.check_chunk, "grading")
        for i, v in zip(jobs, results, strict=True):
            task, att = pairs[i]
            verdicts[i] = Verdict(task_id=task.task_id, index=att.index, correct=v.accepted,
                                  status="ok" if v.status in RAN else v.status,
                                  detail="; ".join(v.errors)[:300])
        return verdicts

    def solver_reward(self, attempt: Attempt, verdict: Verdict) -> float:
        return 1.0 if verdict.correct else 0.0

    def verified_solution(self, task: Task, attempts: list[Attempt],
                          verdicts: list[Verdict]) -> str | None:
        """The first accepted proof, fenced as the solver answers."""
        for att, ver in zip(attempts, verdicts, strict=True):
            if ver.correct:
                return prompts.fenced(att.answer)
        return None

    def verified_solutions(self, task: Task, attempts: list[Attempt],
                           verdicts: list[Verdict]) -> list[str]:
        """Every accepted proof, fenced, in attempt order (task.verified_solution=attempts;
        repeats kept), else the first one only (attempt; gold: Lean has no gold proof)."""
        proofs = [prompts.fenced(att.answer)
                  for att, ver in zip(attempts, verdicts, strict=True) if ver.correct]
        return proofs if self.solution_mode == "attempts" else proofs[:1]

    def local_reference(self, task: Task) -> tuple[str, str] | None:
        """(solver prompt of the seed, the seed's verified proof, fenced), or None."""
        if not task.seed_statement or not task.seed_solution:
            return None
        return prompts.solver_prompt(task.seed_statement), prompts.fenced(task.seed_solution)

    def novelty_pair(self, task: Task) -> tuple[str, str]:
        return signature(task.statement), signature(task.seed_statement)

    # ------------------------------------------------------------------- buffer
    def seed_of(self, task_id: str) -> Task | None:
        return self.buffer.targets.get(task_id)

    def sample_buffer(self, k: int, rng: random.Random) -> list[Task]:
        """The unsolved targets the prover attempts this iteration: every one, in target-file
        order (task.lean.targets_per_iteration=all, SGS), or a uniform sample of N. `k`
        (solver.seed_tasks_per_step, the coding buffer's setting) is not used."""
        n = self.cfg.targets_per_iteration
        return self.buffer.unsolved() if n == "all" else self.buffer.sample_unsolved(n, rng)

    def add_to_buffer(self, tasks: list[Task]) -> int:
        """Conjectures do not join the buffer: the seeds are proved targets."""
        return 0

    def record_results(self, tasks: list[Task], attempts: list[Attempt],
                       verdicts: list[Verdict]) -> dict[str, float]:
        """Targets' first accepted proofs join the buffer. Returns {'new_proofs', 'coverage'
        (distinct targets ever proved / targets), 'targets_proved' (that count),
        'targets_attempted' (targets the prover attempted this iteration)}."""
        by_id = {t.task_id: t for t in tasks}
        new = 0
        for att, ver in zip(attempts, verdicts, strict=True):
            task = by_id.get(att.task_id)
            if ver.correct and task is not None and task.source == "seed":
                new += self.buffer.record(task.task_id, att.answer)
        attempted = sum(t.source == "seed" for t in tasks)
        log.info("Lean: %d target(s) attempted, %d newly proved; coverage %d/%d = %.4f",
                 attempted, new, len(self.buffer), len(self.buffer.targets),
                 self.buffer.coverage())
        return {"new_proofs": float(new), "coverage": self.buffer.coverage(),
                "targets_proved": float(len(self.buffer)),
                "targets_attempted": float(attempted)}

    def step_metrics(self, tasks: list[Task], rates: dict[str, float], scores: list[Score],
                     tokenize: Tokenize = regex_tokenize) -> dict[str, float]:
        """copy_rate and rename_rate over this step's in-band conjectures (0 < s < 1); copies
        on `tokenize`'s tokens (the run's novelty tokens)."""
        band = [t for t in tasks if t.source == "proposed" and t.valid
                and 0.0 < rates.get(t.task_id, 0.0) < 1.0]
        copies = renames = 0
        for t in band:
            a, b = self.novelty_pair(t)
            copies += token_jaccard(tokenize(a), tokenize(b)) > COPY_JACCARD
            renames += bool(t.seed_statement) and alpha_normal(t.statement) == alpha_normal(
                t.seed_statement)
        n = len(band)
        return {"copy_rate": copies / n if n else 0.0, "rename_rate": renames / n if n else 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])

    def pop_counters(self) -> dict[str, int]:
        out = dict(self.counters)
        self.counters.clear()
        return out

    def _pool(self) -> LeanPool:
        if self.pool is None:
            raise RuntimeError("this LeanEnvironment has no LeanPool (built for prompting only)")
        return self.pool
