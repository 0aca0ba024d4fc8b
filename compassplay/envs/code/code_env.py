"""`CodeEnvironment`: AZR-style coding self-play tasks behind one small API.

Task types (AZR's definitions):
- deduction: the proposer writes a program `f` and an input; the gold output is computed by
  running it; the solver predicts the output.
- abduction: same proposal; the solver is shown the program and output and must give any
  input that produces the output (checked by running `f`).
- induction: a program is sampled from the buffer (any type); the proposer writes
  `task.induction_inputs` inputs and a message for it; outputs come from running the program. The
  first half of the pairs (rounded up) is shown with the message, the rest is hidden and the
  solver's program must reproduce it (representation: see `pairs`).

Counters (`env.counters`, read and cleared by `pop_counters`): `parse:<reason>` for proposals
that could not be parsed, `invalid:<reason>` for tasks rejected by validation,
`attempt:<reason>` for solver completions that could not be parsed.
"""

from __future__ import annotations

import random
from collections import Counter

from compassplay.config import ConfigError, TaskSection
from compassplay.engines.generation.base import Segment
from compassplay.envs.code import code_prompts as prompts
from compassplay.envs.code.code_buffer import Strategy, TaskBuffer
from compassplay.envs.code.copies import copy_and_rename_rates
from compassplay.envs.code.grading import grade_attempts
from compassplay.envs.code.parsing import (
    CODE_TAGS,
    extract_block,
    find_blocks,
    proposal_section,
    solver_answer,
)
from compassplay.envs.code.runner import CodeRunner
from compassplay.envs.code.seeds import load_seeds
from compassplay.envs.code.solver_rewards import (
    ANSWER_KIND,
    gold_answer_text,
    solver_reward,
    verified_solution,
    verified_solutions,
)
from compassplay.envs.code.validity import validate_tasks
from compassplay.envs.interface import Environment
from compassplay.records import Attempt, Score, Task, Verdict
from compassplay.rewards.functions import Tokenize, regex_tokenize

INPUT_TOKENS = 40     # template cap of one ```input block (tokens)
MESSAGE_TOKENS = 48   # template cap of the induction ```message block


class CodeEnvironment(Environment):
    """Prompts, parsing, validation, grading and rewards for the coding task types."""

    def __init__(self, cfg: TaskSection, runner: CodeRunner, seed: int = 0,
                 num_references: int = 2, buffer_strategy: Strategy = "uniform",
                 heldout: int = 0) -> None:
        self.cfg = cfg
        self.runner = runner
        self.rng = random.Random(seed)
        self.num_references = num_references
        self.induction_inputs = cfg.induction_inputs
        self.banned = list(cfg.banned_modules)
        self.counters: Counter = Counter()
        self.buffer = TaskBuffer(capacity=cfg.buffer_size, strategy=buffer_strategy)
        seeds, self.seed_skipped = load_seeds(cfg.seed_file, self.banned)
        self.heldout: list[Task] = []
        if heldout:  # SOAR's held-out problems: the last io seeds, never in the buffer
            io = [t for t in seeds if t.task_type != "induction"]
            if heldout >= len(io):
                raise ConfigError(f"reward.soar_heldout_items={heldout}: cannot hold out "
                                  f"{heldout} of the {len(io)} deduction/abduction seed tasks "
                                  f"of {cfg.seed_file} (lower it, or set reward.soar_heldout "
                                  "to a jsonl of held-out problems)")
            self.heldout = io[-heldout:]
            kept = {t.task_id for t in io[:-heldout]} | {
                t.task_id for t in seeds if t.task_type == "induction"}
            seeds = [t for t in seeds if t.task_id in kept]
        self.buffer.add(seeds)

    # ----------------------------------------------------------------- proposer
    def proposer_prompt(self, task_type: str, rng: random.Random) -> tuple[str, list[str]]:
        """Proposer user message and the ids of the buffer tasks it shows."""
        fmt = self.cfg.answer_format
        if task_type == "induction":
            picked = self.buffer.sample(1, rng)
            if not picked:
                raise ValueError("the task buffer is empty")
            prog = picked[0]
            return (prompts.proposer_induction_prompt(prog.program, self.induction_inputs, fmt),
                    [prog.task_id])
        refs = self.buffer.sample(self.num_references, rng, task_type)
        return (prompts.proposer_io_prompt(task_type, refs, self.banned, fmt),
                [t.task_id for t in refs])

    def parse_proposal(self, task_type: str, text: str, seed_ids: list[str],
                       task_id: str) -> Task:
        """The proposed task (never raises); unparseable -> valid=False, 'parse:<reason>'."""
        task = Task(task_id=task_id, task_type=task_type, seed_ids=list(seed_ids))
        try:
            update, reason = self._parse_proposal(task_type, text, seed_ids)
        except Exception as e:  # noqa: BLE001 - model text must never crash a step
            update, reason = {}, f"internal_{type(e).__name__}"
        if reason:
            self.counters[f"parse:{reason}"] += 1
            return task.model_copy(update={"valid": False, "invalid_reason": f"parse:{reason}"})
        first = self.seed_reference(task_type, seed_ids[0]) if seed_ids else {}
        return task.model_copy(update={**update, **first})

    def seed_reference(self, task_type: str, seed_id: str) -> dict[str, str]:
        """The local reference a proposal gets from shown seed `seed_id` (`seed_statement`,
        `seed_solution`): the seed's solver prompt, posed as the proposal's type when that is
        deduction/abduction (else as stored), and its gold answer, verified by execution when
        it entered the buffer. {} when the seed is unknown. A parsed proposal starts with its
        first seed's; `stages.propose` applies `reward.local_reference_seed`."""
        seed = self.buffer.get(seed_id)
        if seed is None or not seed.outputs:
            return {}
        io = ("deduction", "abduction")
        if task_type in io and seed.task_type in io:
            seed = seed.model_copy(update={"task_type": task_type})
        return {"seed_statement": self.solver_prompt(seed),
                "seed_solution": self.gold_answer_text(seed)}

    def _parse_proposal(self, task_type: str, text: str,
                        seed_ids: list[str]) -> tuple[dict, str]:
        section, reason = proposal_section(text, self.cfg.answer_format)
        if reason:
            return {}, reason
        if task_type == "induction":
            ref = self.buffer.get(seed_ids[0]) if seed_ids else None
            if ref is None:
                return {}, "unknown_program"
            inputs = [b.body.strip() for b in find_blocks(section, ("input",)) if b.body.strip()]
            if not inputs:
                return {}, "no_input_block"
            message, reason = extract_block(section, ("message",), "message",
                                            untagged_ok=False)
            if reason:
                return {}, reason
            return {"program": ref.program, "inputs": inputs, "message": message.strip()}, ""
        if task_type not in ("deduction", "abduction"):
            return {}, "unknown_task_type"
        program, reason = extract_block(section, CODE_TAGS, "code")
        if reason:
            return {}, reason
        inp, reason = extract_block(section, ("input",), "input", untagged_ok=False)
        if reason:
            return {}, reason
        return {"program": program.strip("\n"), "inputs": [inp.strip()]}, ""

    def validate(self, tasks: list[Task]) -> list[Task]:
        """Validated copies (valid, invalid_reason, gold outputs); one run_many per call."""
        return validate_tasks(tasks, self.runner, self.banned, self.counters,
                              strip=self.cfg.strip_prints,
                              all_inputs=self.cfg.induction_all_inputs)

    # ----------------------------------------------------------------- prefixes
    def response_prefix(self, role: str, task_type: str) -> str:
        """The opening of a well-formed reply, to prefill after the chat prompt (small models
        follow the format far more often when it is started for them). '' for think_answer."""
        if self.cfg.answer_format != "fenced":
            return ""
        if role == "proposer":
            return "```input\n" if task_type == "induction" else "```python\ndef f("
        return f"```{ANSWER_KIND[task_type][1]}\n"

    def response_template(self, role: str, task_type: str, max_tokens: int) -> tuple[Segment, ...]:
        """The blocks after `response_prefix` (fenced format only): a program and its input;
        `induction_inputs` inputs and a message; or the solver's one answer block. Each free
        block ends at its closing fence (or early: a program at its first blank line, an input,
        output or message at the end of its line), then the next block is opened. Caps:
        `max_tokens` for a program or an answer, at most `INPUT_TOKENS` for an input and
        `MESSAGE_TOKENS` for a message."""
        if self.cfg.answer_format != "fenced":
            return ()
        close, line, blank = "```", ("\n",), ("\n\n",)
        if role == "solver":  # an output or input is one line; a program ends at a blank line
            return (Segment(close, "", max_tokens, blank if task_type == "induction" else line),)
        inp, msg = min(max_tokens, INPUT_TOKENS), min(max_tokens, MESSAGE_TOKENS)
        if task_type == "induction":
            n = self.induction_inputs
            inputs = [Segment(close, "\n```input\n", inp, line) for _ in range(n - 1)]
            return (*inputs, Segment(close, "\n```message\n", inp, line),
                    Segment(close, "", msg, line))
        return (Segment(close, "\n```input\n", max_tokens, blank),
                Segment(close, "", inp, line))

    # ------------------------------------------------------------------- solver
    def solver_prompt(self, task: Task) -> str:
        """Solver user message for a valid task."""
        return prompts.solver_prompt(task, self.cfg.answer_format)

    def parse_attempt(self, task: Task, text: str, index: int) -> Attempt:
        """The solver's parsed answer (never raises); parse_error holds the reason."""
        kind = ANSWER_KIND.get(task.task_type, ("output", ""))[0]
        try:
            answer, reason = solver_answer(text, kind, self.cfg.answer_format)
        except Exception as e:  # noqa: BLE001
            answer, reason = "", f"internal_{type(e).__name__}"
        if reason:
            self.counters[f"attempt:{reason}"] += 1
            return Attempt(task_id=task.task_id, index=index, answer="", parse_error=reason)
        return Attempt(task_id=task.task_id, index=index, answer=answer.strip("\n"))

    def grade(self, pairs: list[tuple[Task, Attempt]]) -> list[Verdict]:
        """Verdicts for (task, attempt) pairs; all executions in one run_many."""
        return grade_attempts(pairs, self.runner, self.banned)

    def solver_reward(self, attempt: Attempt, verdict: Verdict) -> float:
        """Binary or AZR-style solver reward, by `cfg.solver_reward`."""
        return solver_reward(attempt, verdict, self.cfg.solver_reward)

    def verified_solution(self, task: Task, attempts: list[Attempt],
                          verdicts: list[Verdict]) -> str | None:
        """The first solution text for the gradient reward, by `cfg.verified_solution`."""
        return verified_solution(task, attempts, verdicts, self.cfg.verified_solution,
                                 self.cfg.answer_format)

    def verified_solutions(self, task: Task, attempts: list[Attempt],
                           verdicts: list[Verdict]) -> list[str]:
        """Every solution text for the gradient reward, by `cfg.verified_solution`."""
        return verified_solutions(task, attempts, verdicts, self.cfg.verified_solution,
                                  self.cfg.answer_format)

    def gold_answer_text(self, task: Task) -> str:
        """The gold answer in the solver's answer format."""
        return gold_answer_text(task, self.cfg.answer_format)

    def local_reference(self, task: Task) -> tuple[str, str] | None:
        """(solver prompt of the seed, its gold answer) recorded at proposal time, or None."""
        if not task.seed_statement or not task.seed_solution:
            return None
        return task.seed_statement, task.seed_solution

    def step_metrics(self, tasks: list[Task], rates: dict[str, float], scores: list[Score],
                     tokenize: Tokenize = regex_tokenize) -> dict[str, float]:
        """copy_rate and rename_rate of this step's in-band proposals (valid, 0 < s < 1)
        against the references each was shown (`envs.code.copies`), copies on `tokenize`."""
        band = [t for t in tasks if t.source == "proposed" and t.valid
                and 0.0 < rates.get(t.task_id, 0.0) < 1.0]
        return copy_and_rename_rates([(self.novelty_text(t), t.seed_texts or [t.seed_program])
                                      for t in band], tokenize)

    # ----------------------------------------------------------------- novelty
    def novelty_pair(self, task: Task) -> tuple[str, str]:
        """(what the proposer wrote, the first reference it was shown), as novelty texts."""
        first = task.seed_texts[0] if task.seed_texts else task.seed_program
        return self.novelty_text(task), first

    def novelty_text(self, task: Task) -> str:
        """What the proposer wrote: program and input (deduction/abduction); for induction,
        where the program is given, its inputs and message."""
        inputs = "\n".join(x.strip() for x in task.inputs)
        if task.task_type == "induction":
            return f"{inputs}\n{task.message.strip()}".strip()
        return f"{task.program.strip()}\n{inputs}".strip()

    def reference_texts(self, task_type: str, seed_ids: list[str]) -> list[str]:
        """Every shown reference in the form a `task_type` proposal is compared: program and
        input for deduction/abduction; for induction the buffer task's own inputs and message
        (the proposer writes new ones for its program)."""
        out = []
        for sid in seed_ids:
            seed = self.buffer.get(sid)
            if seed is not None:
                out.append(self.novelty_text(seed.model_copy(update={"task_type": task_type})))
        return out

    # ------------------------------------------------------------------ buffer
    def seed_of(self, task_id: str) -> Task | None:
        return self.buffer.get(task_id)

    def sample_buffer(self, k: int, rng: random.Random) -> list[Task]:
        """k distinct buffer tasks for the solver. With `typed_seed_tasks` (AZR) each is posed
        as one of `task.types` drawn uniformly (deduction/abduction tasks come from the shared
        io pool, so an io seed can be posed as abduction); else as stored."""
        types = [t for t in self.cfg.types if self.buffer.pool(t)]
        if not self.cfg.typed_seed_tasks or not types:
            return self.buffer.sample(k, rng)
        counts = Counter(rng.choice(types) for _ in range(k))
        labels = [t for t in ("deduction", "abduction") for _ in range(counts[t])]
        rng.shuffle(labels)
        out = [t.model_copy(update={"task_type": lab}) for t, lab in zip(
            self.buffer.sample(len(labels), rng, "deduction"), labels, strict=False)]
        return out + (self.buffer.sample(counts["induction"], rng, "induction")
                      if counts["induction"] else [])

    def add_to_buffer(self, tasks: list[Task]) -> int:
        return self.buffer.add(tasks)

    def state_dict(self) -> dict:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])

    def pop_counters(self) -> dict[str, int]:
        """The counters accumulated since the last call, then cleared."""
        out = dict(self.counters)
        self.counters.clear()
        return out
