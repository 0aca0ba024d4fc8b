"""SOAR's held-out problems (reward.soar_heldout) as `HeldOutItem`s: token ids of the prompt
and gold answer (the loss metric) and a grader of greedy completions (the accuracy metric).

Two sources:
- "seeds": the deduction/abduction seed tasks the environment took out of its task buffer
  (`CodeEnvironment.heldout`), posed as deduction problems in the solver's own prompt format;
  a completion is right when its parsed output equals the gold output (`values_equal`).
- a jsonl of {prompt, solution[, answer]} (the reference-set format plus an optional final
  answer): chat prompt -> gold solution; a completion is right when its final answer (last
  \\boxed{...}, else what follows the last "answer is", else the last number) equals `answer`
  (or the solution's own final answer) after whitespace/`$`/trailing-period normalization.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from compassplay.config import ConfigError, RunConfig
from compassplay.envs.code.programs import values_equal
from compassplay.envs.interface import Environment
from compassplay.rewards.batch import Example
from compassplay.rewards.reference_set import SHIPPED_REFERENCE
from compassplay.rewards.soar import HeldOutItem
from compassplay.step.prompting import chat_ids, prefix_of, prompt_ids, target_ids

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)\}")
_ANSWER_IS = re.compile(r"answer is[:\s]*([^\n]+)", re.I)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def final_answer(text: str) -> str:
    """The final answer of a worked solution or completion ('' if none is found)."""
    boxed = _BOXED.findall(text)
    if boxed:
        return _norm(boxed[-1])
    said = _ANSWER_IS.findall(text)
    if said:
        return _norm(said[-1])
    nums = _NUMBER.findall(text)
    return _norm(nums[-1]) if nums else ""


def _norm(s: str) -> str:
    s = s.strip().replace("$", "").replace(" ", "")
    return s.rstrip(".")


def seed_heldout(env: Environment, tokenizer, cfg: RunConfig) -> list[HeldOutItem]:
    """The environment's held-out seed tasks as deduction problems."""
    tasks = getattr(env, "heldout", None)
    if not tasks:
        raise ConfigError("reward.soar_heldout=seeds needs the coding environment with held-out "
                          "seed tasks (reward.kind=soar sets them aside)")
    items = []
    for t in tasks:
        task = t.model_copy(update={"task_type": "deduction"})
        prefix = prefix_of(env, cfg, "solver", "deduction")
        gold = env.gold_answer_text(task)
        if prefix and gold.startswith(prefix):
            gold = gold[len(prefix):]

        def grade(ids: list[int], task=task, prefix=prefix) -> bool:
            text = prefix + tokenizer.decode(ids, skip_special_tokens=True)
            att = env.parse_attempt(task, text, 0)
            return not att.parse_error and values_equal(att.answer, task.outputs[0])

        items.append(HeldOutItem(Example(prompt_ids(tokenizer, env.solver_prompt(task), prefix),
                                         target_ids(tokenizer, gold)), grade))
    env.pop_counters()
    return items


def heldout_rows(path: str, max_items: int) -> list[tuple[str, str, str]]:
    """(prompt, solution, gold answer) of the first `max_items` problems of a {prompt,
    solution[, answer]} jsonl (bare name: compassplay/data); ConfigError naming the file."""
    p = Path(path)
    if not p.is_file() and p.parent == Path(".") and (SHIPPED_REFERENCE.parent / p).is_file():
        p = SHIPPED_REFERENCE.parent / p
    if not p.is_file():
        raise ConfigError(f"reward.soar_heldout: file not found: {p}")
    rows = []
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{p}:{lineno}: not JSON ({exc})") from None
        if not isinstance(obj, dict) or not all(
                isinstance(obj.get(k), str) and obj[k].strip() for k in ("prompt", "solution")):
            raise ConfigError(f"{p}:{lineno}: expected an object with non-empty prompt, solution")
        gold = _norm(str(obj["answer"])) if obj.get("answer") is not None else \
            final_answer(obj["solution"])
        rows.append((obj["prompt"], obj["solution"], gold))
        if len(rows) >= max_items:
            break
    if not rows:
        raise ConfigError(f"{p}: the held-out set is empty")
    return rows


def jsonl_heldout(path: str, tokenizer, max_items: int) -> list[HeldOutItem]:
    """Held-out problems from a {prompt, solution[, answer]} jsonl (see `heldout_rows`)."""
    items = []
    for prompt, solution, gold in heldout_rows(path, max_items):

        def grade(ids: list[int], gold=gold) -> bool:
            return bool(gold) and final_answer(
                tokenizer.decode(ids, skip_special_tokens=True)) == gold

        items.append(HeldOutItem(Example(chat_ids(tokenizer, prompt),
                                         target_ids(tokenizer, solution)), grade))
    return items


def make_heldout(cfg: RunConfig, env: Environment, tokenizer) -> list[HeldOutItem]:
    """The configured held-out set (reward.soar_heldout, soar_heldout_items)."""
    r = cfg.reward
    if r.soar_heldout == "seeds":
        return seed_heldout(env, tokenizer, cfg)
    return jsonl_heldout(r.soar_heldout, tokenizer, r.soar_heldout_items)
