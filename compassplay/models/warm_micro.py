"""Build the "warm" micro model shipped in `compassplay/data/micro_warm/`.

A tiny random Qwen2 (byte tokenizer) never writes a parseable proposal, so micro runs see no
valid task, no eligible candidate and no reward signal. This script supervised-fine-tunes one
briefly on the shipped seed buffer so that, sampled at temperature ~1, it

- re-emits well-formed proposals: for deduction/abduction it copies the reference program and
  input shown in the proposer prompt (`proposer.num_references: 1`); for induction it writes
  inputs and a message for the shown program (the seed's own inputs, or the seed input plus a
  few deterministic mutations that the sandbox accepted);
- answers solver prompts for those tasks right about half of the time: every solver prompt is
  trained once on its gold answer and once on the gold answer of a different seed task, so
  solve rates land strictly between 0 and 1 and proposals become eligible.

Every prompt is built exactly as a run builds it (`stages.chat_ids` over the environment's
prompt text; targets are `stages.target_ids`), every training proposal is checked to parse
with `CodeEnvironment.parse_proposal`, and the loss covers completion tokens only. Training is
deterministic: seeded, one torch thread, a fixed batch order.

    python -m compassplay.models.warm_micro OUT_DIR [--steps N] [--seed S]

Executing the seed programs on mutated inputs needs the verifier sandbox (bwrap by default;
`--isolation` passes another `verifiers.isolation` mode).
"""

from __future__ import annotations

import argparse
import ast
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from compassplay.config import TaskSection, TinyModelConfig, VerifierSection
from compassplay.models.loading import load_tiny
from compassplay.records import Task
from compassplay.stages import chat_ids, target_ids
from compassplay.tasks.code import CodeEnvironment, prompts
from compassplay.tasks.code.programs import check_input, normalize_value, values_equal

log = logging.getLogger(__name__)

WARM_MICRO_CONFIG = TinyModelConfig(arch="qwen2", hidden_size=128, num_layers=2, num_heads=4,
                                    num_kv_heads=2, intermediate_size=256, max_positions=2048)
DEFAULT_STEPS = 900
INDUCTION_INPUTS = 4            # inputs written for a buffer program without induction seed
INDUCTION_MESSAGE = "Work out the rule from the examples."
BATCH = {"propose_io": 2, "propose_induction": 4, "solve": 8}
PEAK_LR = 3e-3
WARMUP = 30


@dataclass
class Example:
    kind: str
    prompt: list[int]
    target: list[int]


# ------------------------------------------------------------------ induction inputs
def _mutate(v, k: int):
    """Variant `k` of one argument value (deterministic, type-preserving)."""
    if isinstance(v, bool):
        return not v if k % 2 else v
    if isinstance(v, int):
        return [v + 1, v + 2, 2 * v if v else 3, v - 1 if v != 1 else 5, v + 5, v + 10][k % 6]
    if isinstance(v, float):
        return v + 0.5 * (k + 1)
    if isinstance(v, str):
        if not v:
            return "ab"[: k % 3]
        return [v[::-1], v[1:] or v + v, v + v[0], v[:-1] or "x", v.upper(), v[1:] + v[0]][k % 6]
    if isinstance(v, list | tuple):
        seq = list(v)
        if not seq:
            out = []
        else:
            out = [seq[::-1], seq[1:], seq + seq[:1], seq[:-1], seq[1:] + seq[:1],
                   [_mutate(x, k) for x in seq]][k % 6]
        return type(v)(out) if isinstance(v, tuple) else out
    if isinstance(v, dict):
        items = list(v.items())
        return dict([items[::-1], items[1:], items[:-1]][k % 3]) if items else {"a": 1}
    if isinstance(v, set | frozenset):
        return set(sorted(v, key=repr)[1:]) if v else {1}
    return v


def input_variants(text: str, n: int = 8) -> list[str]:
    """Up to `n` distinct mutated argument lists of the literal argument list `text`."""
    args = ast.literal_eval(f"({text},)")
    seen = {normalize_value(text)}
    out = []
    for k in range(n):
        cand = ", ".join(repr(_mutate(a, k)) for a in args)
        if check_input(cand) or normalize_value(cand) in seen:
            continue
        seen.add(normalize_value(cand))
        out.append(cand)
    return out


def induction_tasks(env: CodeEnvironment, runner) -> list[Task]:
    """One validated induction task per buffer program: a seed induction task keeps its own
    inputs and message; any other program gets its seed input plus the first accepted mutations
    (each mutation is run alone first, so one bad input cannot sink the others)."""
    io = [t for t in env.buffer if t.task_type != "induction"]
    probes = [Task(task_id=f"probe-{i}-{j}", task_type="deduction", program=t.program,
                   inputs=[x]) for i, t in enumerate(io)
              for j, x in enumerate(input_variants(t.inputs[0]))]
    ok = {p.task_id: p.inputs[0] for p in env.validate(probes) if p.valid}
    tasks = []
    for i, t in enumerate(io):
        extra = [ok[p.task_id] for p in probes
                 if p.task_id.startswith(f"probe-{i}-") and p.task_id in ok]
        tasks.append(Task(task_id=f"warm-ind-{t.task_id}", task_type="induction",
                          program=t.program, inputs=[t.inputs[0]] + extra[:INDUCTION_INPUTS - 1],
                          message=INDUCTION_MESSAGE, seed_ids=[t.task_id]))
    for t in env.buffer:
        if t.task_type == "induction":
            tasks.append(t.model_copy(update={"task_id": f"warm-ind-{t.task_id}",
                                              "seed_ids": [t.task_id], "source": "proposed",
                                              "valid": False, "outputs": []}))
    checked = env.validate(tasks)
    bad = [t.task_id for t in checked if not t.valid or len(t.inputs) < 2]
    if bad:
        raise RuntimeError(f"induction tasks failed validation: {bad}")
    return checked


# ------------------------------------------------------------------ SFT pairs
def _fence(tag: str, body: str) -> str:
    return f"```{tag}\n{body.strip()}\n```"


def io_proposal_text(task: Task) -> str:
    return _fence("python", task.program) + "\n" + _fence("input", task.inputs[0])


def induction_proposal_text(task: Task) -> str:
    return "\n".join([_fence("input", x) for x in task.inputs] + [_fence("message", task.message)])


def _check_parses(env: CodeEnvironment, task_type: str, text: str, seed: Task,
                  inputs: list[str]) -> None:
    parsed = env.parse_proposal(task_type, text, [seed.task_id], "check")
    assert not parsed.invalid_reason, (task_type, parsed.invalid_reason, text)
    assert parsed.program.strip() == seed.program.strip(), (task_type, text)
    assert [normalize_value(x) for x in parsed.inputs] == [normalize_value(x) for x in inputs]


def _distractor(task: Task, others: list[Task], env: CodeEnvironment) -> str:
    """The gold answer of the next task in `others` whose answer is wrong for `task`."""
    gold = env.gold_answer_text(task)
    i = next(k for k, t in enumerate(others) if t.task_id == task.task_id)
    for d in range(1, len(others)):
        other = others[(i + d) % len(others)]
        if task.task_type == "deduction" and values_equal(other.outputs[0], task.outputs[0]):
            continue
        text = env.gold_answer_text(other.model_copy(update={"task_type": task.task_type}))
        if text != gold:
            return text
    raise ValueError(f"no distractor for {task.task_id}")


def sft_examples(env: CodeEnvironment, tokenizer, runner) -> list[Example]:
    """Proposer and solver (prompt, completion) pairs over the whole seed buffer."""
    fmt, banned = env.cfg.answer_format, env.banned
    io = [t for t in env.buffer if t.task_type != "induction"]
    ind = induction_tasks(env, runner)
    out: list[Example] = []
    for task_type in ("deduction", "abduction"):
        for seed in io:
            ref = seed.model_copy(update={"task_type": task_type})
            text = io_proposal_text(ref)
            _check_parses(env, task_type, text, seed, seed.inputs)
            prompt = prompts.proposer_io_prompt(task_type, [ref], banned, fmt)
            out.append(Example("propose_io", chat_ids(tokenizer, prompt),
                               target_ids(tokenizer, text)))
    by_id = {t.task_id: t for t in env.buffer}
    for task in ind:
        seed = by_id[task.seed_ids[0]]
        text = induction_proposal_text(task)
        _check_parses(env, "induction", text, seed, task.inputs)
        prompt = prompts.proposer_induction_prompt(seed.program, env.induction_inputs, fmt)
        out.append(Example("propose_induction", chat_ids(tokenizer, prompt),
                           target_ids(tokenizer, text)))
    solve_sets = [[t.model_copy(update={"task_type": tt}) for t in io]
                  for tt in ("deduction", "abduction")] + [ind]
    for tasks in solve_sets:
        for task in tasks:
            prompt = chat_ids(tokenizer, env.solver_prompt(task))
            for answer in (env.gold_answer_text(task), _distractor(task, tasks, env)):
                out.append(Example("solve", prompt, target_ids(tokenizer, answer)))
    return out


# ------------------------------------------------------------------ training
def _batches(examples: list[Example], rng: random.Random) -> list[list[Example]]:
    """One epoch: each kind shuffled and chunked by its batch size, chunks shuffled."""
    chunks = []
    for kind, size in BATCH.items():
        mine = [e for e in examples if e.kind == kind]
        rng.shuffle(mine)
        chunks += [mine[i:i + size] for i in range(0, len(mine), size)]
    rng.shuffle(chunks)
    return chunks


def _collate(batch: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ids, attention mask and labels (-100 outside the completion)."""
    n = max(len(e.prompt) + len(e.target) for e in batch)
    ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), n), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), n), dtype=torch.long)
    for r, e in enumerate(batch):
        seq = e.prompt + e.target
        ids[r, :len(seq)] = torch.tensor(seq)
        labels[r, len(e.prompt):len(seq)] = torch.tensor(e.target)
        mask[r, :len(seq)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _lr(step: int, steps: int) -> float:
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    frac = (step - WARMUP) / max(1, steps - WARMUP)
    return PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(model, examples: list[Example], pad_id: int, steps: int, seed: int,
          log_every: int = 50) -> float:
    """AdamW on completion tokens for `steps` batches; returns the last logged mean loss."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.98),
                            weight_decay=0.0)
    model.train()
    queue: list[list[Example]] = []
    window, last, t0 = [], float("nan"), time.time()
    for step in range(steps):
        if not queue:
            queue = _batches(examples, rng)
        batch = queue.pop()
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps)
        loss = model(**_collate(batch, pad_id)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            last = sum(window) / len(window)
            log.info("step %d/%d loss %.4f (%.0fs)", step + 1, steps, last, time.time() - t0)
            window = []
    model.eval()
    return last


def build_warm_micro(out_dir: Path, steps: int = DEFAULT_STEPS, seed: int = 0,
                     isolation: str = "bwrap") -> Path:
    """Train the warm micro model and save model + tokenizer to `out_dir`; returns it."""
    from compassplay.components import make_sandbox

    out_dir = Path(out_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, tok = load_tiny(WARM_MICRO_CONFIG, seed)
        task_cfg = TaskSection(types=["deduction", "abduction", "induction"])
        with make_sandbox(VerifierSection(workers=2, timeout_s=2.0,
                                          isolation=isolation)).start() as runner:
            env = CodeEnvironment(task_cfg, runner, seed=seed, num_references=1)
            examples = sft_examples(env, tok, runner)
        log.info("%d SFT examples (%d completion tokens)", len(examples),
                 sum(len(e.target) for e in examples))
        torch.manual_seed(seed)
        loss = train(model, examples, tok.pad_token_id, steps, seed)
        log.info("final loss %.4f", loss)
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        tok.save_pretrained(out_dir)
    finally:
        torch.set_num_threads(threads)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--isolation", default="bwrap")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t0 = time.time()
    out = build_warm_micro(args.out_dir, steps=args.steps, seed=args.seed,
                           isolation=args.isolation)
    print(f"saved {out} in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
