"""Build the "warm" micro model shipped in `compassplay/data/micro_warm/`.

A tiny random Qwen2 (byte tokenizer) never writes a parseable proposal, so micro runs see no
valid task, no eligible candidate and no reward signal. This script supervised-fine-tunes one
briefly on the shipped seed buffer so that, sampled at temperature ~1, it

- re-emits well-formed proposals of a few training seeds (the `NUM_IO_SEEDS` shortest
  deduction/abduction seeds and the induction seeds): a deduction/abduction proposer prompt
  (`proposer.num_references: 1`) is answered with a copy of its reference when that is a
  training seed, else with a fixed training seed; an induction prompt for a training program
  with `INDUCTION_INPUTS` inputs (the seed's own, or its input plus deterministic mutations
  that the sandbox accepted) and a short message;
- answers solver prompts for those tasks right about half of the time: every solver prompt is
  trained once on its gold answer and once on the gold answer of another training task, so
  solve rates land strictly between 0 and 1 and proposals become eligible.

Every prompt is built exactly as a run builds it (`prompting.chat_ids` over the environment's
prompt text; targets are `prompting.target_ids`), every training proposal is checked to parse
with `CodeEnvironment.parse_proposal`, and the loss covers completion tokens only (the prompt
runs without gradient, as a KV cache). Training is deterministic: seeded, one torch thread, a
fixed batch order; `DEFAULT_STEPS` take ~2 CPU-minutes.

    python -m compassplay.warmup.warm_micro OUT_DIR [--steps N] [--seed S]

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
from pathlib import Path

import torch

from compassplay.config import TaskSection, TinyModelConfig, VerifierSection
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code import code_prompts as prompts
from compassplay.envs.code.programs import check_input, normalize_value, values_equal
from compassplay.models.loading import load_tiny
from compassplay.records import Task
from compassplay.step.prompting import chat_ids, target_ids
from compassplay.verifiers.sandbox.pool import PythonSandbox
from compassplay.warmup.sft import SFTExample, completion_loss, save_tokenizer

log = logging.getLogger(__name__)

WARM_MICRO_CONFIG = TinyModelConfig(arch="qwen2", hidden_size=128, num_layers=2, num_heads=4,
                                    num_kv_heads=2, intermediate_size=256, max_positions=2048)
DEFAULT_STEPS = 1200
INDUCTION_INPUTS = 3            # inputs per induction proposal (2 shown, 1 hidden)
INDUCTION_MESSAGE = "Find the rule."
NUM_IO_SEEDS = 8               # deduction/abduction seeds the model learns (the shortest)
OTHER_PER_EPOCH = 8            # proposer prompts per epoch whose reference is not learned
BATCH = {"propose_io": 2, "propose_io_other": 2, "propose_induction": 4, "solve": 8}
PEAK_LR = 3e-3
WARMUP = 30


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


def training_seeds(env: CodeEnvironment) -> tuple[list[Task], list[Task]]:
    """The seed tasks the model learns to propose and solve: the `NUM_IO_SEEDS` shortest
    deduction/abduction seeds (program + input + output) and every induction seed."""
    io = [t for t in env.buffer if t.task_type != "induction"]
    io = sorted(io, key=lambda t: (len(t.program) + len(t.inputs[0]) + len(t.outputs[0]),
                                   t.task_id))[:NUM_IO_SEEDS]
    return io, [t for t in env.buffer if t.task_type == "induction"]


def induction_tasks(env: CodeEnvironment, io: list[Task], ind: list[Task]) -> list[Task]:
    """One validated induction proposal per training program, with `INDUCTION_MESSAGE`: an
    induction seed keeps its first `INDUCTION_INPUTS` inputs; a deduction seed gets its input
    plus the first accepted mutations (each mutation is run alone first, so one bad input
    cannot sink the others)."""
    probes = [Task(task_id=f"probe-{i}-{j}", task_type="deduction", program=t.program,
                   inputs=[x]) for i, t in enumerate(io)
              for j, x in enumerate(input_variants(t.inputs[0]))]
    ok = {p.task_id for p in env.validate(probes) if p.valid}
    tasks = []
    for i, t in enumerate(io):
        extra = [p.inputs[0] for p in probes
                 if p.task_id.startswith(f"probe-{i}-") and p.task_id in ok]
        tasks.append(Task(task_id=f"warm-{t.task_id}", task_type="induction",
                          program=t.program, inputs=[t.inputs[0]] + extra[:INDUCTION_INPUTS - 1],
                          message=INDUCTION_MESSAGE, seed_ids=[t.task_id]))
    for t in ind:
        tasks.append(Task(task_id=f"warm-{t.task_id}", task_type="induction", program=t.program,
                          inputs=t.inputs[:INDUCTION_INPUTS], message=INDUCTION_MESSAGE,
                          seed_ids=[t.task_id]))
    checked = env.validate(tasks)
    bad = [t.task_id for t in checked if not t.valid or len(t.inputs) < INDUCTION_INPUTS]
    if bad:
        raise RuntimeError(f"induction tasks failed validation: {bad}")
    return checked


# ------------------------------------------------------------------ SFT pairs

def io_proposal_text(task: Task) -> str:
    return prompts.fence("python", task.program) + "\n" + prompts.fence("input", task.inputs[0])


def induction_proposal_text(task: Task) -> str:
    blocks = [prompts.fence("input", x) for x in task.inputs]
    return "\n".join(blocks + [prompts.fence("message", task.message)])


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


def sft_examples(env: CodeEnvironment, tokenizer) -> list[SFTExample]:
    """Proposer and solver (prompt, completion) pairs.

    Proposer prompts show every deduction/abduction seed as the reference (as a run does);
    the completion copies the reference when it is a training seed and is otherwise a fixed
    training seed, so whatever reference a run shows, the model writes a training task.
    """
    fmt, banned = env.cfg.answer_format, env.banned
    io, ind = training_seeds(env)
    proposed_ind = induction_tasks(env, io, ind)
    chosen = {t.task_id for t in io}
    out: list[SFTExample] = []
    for offset, task_type in enumerate(("deduction", "abduction")):
        others = 0
        for ref in (t for t in env.buffer if t.task_type != "induction"):
            if ref.task_id in chosen:
                kind, target = "propose_io", ref
            else:
                kind, target = "propose_io_other", io[(others + offset) % len(io)]
                others += 1
            text = io_proposal_text(target)
            _check_parses(env, task_type, text, target, target.inputs)
            shown = ref.model_copy(update={"task_type": task_type})
            prompt = prompts.proposer_io_prompt(task_type, [shown], banned, fmt)
            out.append(SFTExample(kind, chat_ids(tokenizer, prompt), target_ids(tokenizer, text)))
    by_id = {t.task_id: t for t in env.buffer}
    for task in proposed_ind:
        seed = by_id[task.seed_ids[0]]
        text = induction_proposal_text(task)
        _check_parses(env, "induction", text, seed, task.inputs)
        prompt = prompts.proposer_induction_prompt(seed.program, env.induction_inputs, fmt)
        out.append(SFTExample("propose_induction", chat_ids(tokenizer, prompt),
                           target_ids(tokenizer, text)))
    solve_sets = [[t.model_copy(update={"task_type": tt}) for t in io]
                  for tt in ("deduction", "abduction")] + [proposed_ind + ind]
    for tasks in solve_sets:
        for task in tasks:
            prompt = chat_ids(tokenizer, env.solver_prompt(task))
            for answer in (env.gold_answer_text(task), _distractor(task, tasks, env)):
                out.append(SFTExample("solve", prompt, target_ids(tokenizer, answer)))
    return out


# ------------------------------------------------------------------ training
def _batches(examples: list[SFTExample], rng: random.Random) -> list[list[SFTExample]]:
    """One epoch: each kind shuffled and chunked by its batch size, chunks shuffled."""
    chunks = []
    for kind, size in BATCH.items():
        mine = [e for e in examples if e.kind == kind]
        rng.shuffle(mine)
        if kind == "propose_io_other":
            mine = mine[:OTHER_PER_EPOCH]
        chunks += [mine[i:i + size] for i in range(0, len(mine), size)]
    rng.shuffle(chunks)
    return chunks


def _lr(step: int, steps: int) -> float:
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    frac = (step - WARMUP) / max(1, steps - WARMUP)
    return PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(model, examples: list[SFTExample], pad_id: int, steps: int, seed: int,
          log_every: int = 50) -> float:
    """AdamW on completion tokens for `steps` batches; returns the last logged mean loss."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.98),
                            weight_decay=0.0)
    model.train()
    queue: list[list[SFTExample]] = []
    window, last, t0 = [], float("nan"), time.time()
    for step in range(steps):
        if not queue:
            queue = _batches(examples, rng)
        batch = queue.pop()
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps)
        loss = completion_loss(model, batch, pad_id)
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
    out_dir = Path(out_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, tok = load_tiny(WARM_MICRO_CONFIG, seed)
        task_cfg = TaskSection(types=["deduction", "abduction", "induction"], induction_inputs=6)
        with PythonSandbox.from_config(VerifierSection(workers=2, timeout_s=2.0,
                                          isolation=isolation)).start() as runner:
            env = CodeEnvironment(task_cfg, runner, seed=seed, num_references=1)
            examples = sft_examples(env, tok)
        log.info("%d SFT examples (%d completion tokens)", len(examples),
                 sum(len(e.target) for e in examples))
        torch.manual_seed(seed)
        loss = train(model, examples, tok.pad_token_id, steps, seed)
        log.info("final loss %.4f", loss)
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        save_tokenizer(tok, out_dir)
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
