"""`compassplay bench tasks`: validity and grading throughput of the coding tasks.

Throughput (default mode), all execution through `PythonSandbox`:
* validity: `validate` on the shipped seed set (outputs cleared; every task runs twice, in two
  sandbox runs) and, when a data folder is given, on the CRUXEval items;
* grading: gold attempts through `grade` (abduction runs `f(input)`, induction runs the
  program on the hidden inputs, deduction compares values without running anything).
Numbers are tasks (or attempts) per second over the whole batch call, median of `--reps`.

`--smollm2`: SmolLM2-135M-Instruct (model.source=smollm2-gguf, HF generation on CPU) proposes
`--n` tasks per task type from the shipped seed set (fraction valid), and solves `--n` tasks
per type sampled from the buffer (solve rate, one attempt each).

    python -m compassplay.bench.tasks --json [--data-dir DIR] [--smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from compassplay.config import ModelSection, TaskSection
from compassplay.engines.generation.base import SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code.programs import values_equal
from compassplay.envs.code.solver_rewards import gold_answer
from compassplay.records import Attempt, Task
from compassplay.step.prompting import prompt_ids
from compassplay.verifiers.sandbox.pool import PythonSandbox

TYPES = ("deduction", "abduction", "induction")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench tasks`."""
    parser.add_argument("--data-dir", default=os.environ.get("COMPASSPLAY_DATA_DIR", ""),
                        help="folder with cruxeval.jsonl (default $COMPASSPLAY_DATA_DIR)")
    parser.add_argument("--crux-items", type=int, default=800)
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers")
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--isolation", default="bwrap")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--smollm2", action="store_true",
                        help="measure SmolLM2-135M proposal validity and solve rate")
    parser.add_argument("--n", type=int, default=64, help="--smollm2: proposals/tasks per type")
    parser.add_argument("--batch", type=int, default=16, help="--smollm2: generation batch")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="--smollm2: proposals")
    parser.add_argument("--solver-max-new-tokens", type=int, default=64)
    parser.add_argument("--no-prefill", dest="prefill", action="store_false",
                        help="--smollm2: do not prefill the reply format (default: prefill)")
    parser.add_argument("--seed-file", default="", help="task.seed_file ('simple': the short "
                        "shipped programs)")
    parser.add_argument("--template", action="store_true",
                        help="--smollm2: constrained decoding of the reply blocks (needs prefill)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


def _timed(fn, reps: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _gold_pairs(tasks: list[Task]) -> list[tuple[Task, Attempt]]:
    return [(t, Attempt(task_id=t.task_id, index=0, answer=gold_answer(t))) for t in tasks]


def _throughput(env: CodeEnvironment, tasks: list[Task], reps: int) -> dict[str, Any]:
    """Validity and grading rates for `tasks` (valid tasks whose outputs are recomputed)."""
    fresh = [t.model_copy(update={"valid": False, "outputs": []}) for t in tasks]
    sec, checked = _timed(lambda: env.validate(fresh), reps)
    valid = [t for t in checked if t.valid]
    out: dict[str, Any] = {"tasks": len(tasks), "valid": len(valid),
                           "validate_s": round(sec, 3),
                           "validate_tasks_per_s": round(len(tasks) / sec, 1)}
    for tt in TYPES:
        typed = [t.model_copy(update={"task_type": tt}) for t in valid
                 if (t.task_type == "induction") == (tt == "induction")]
        if not typed:
            continue
        pairs = _gold_pairs(typed)
        sec, verdicts = _timed(lambda p=pairs: env.grade(p), reps)
        out[f"grade_{tt}"] = {"attempts": len(pairs), "seconds": round(sec, 3),
                              "attempts_per_s": round(len(pairs) / sec, 1),
                              "gold_correct": sum(v.correct for v in verdicts)}
    return out


def _crux_tasks(data_dir: str, n: int) -> list[Task]:
    path = Path(data_dir) / "cruxeval.jsonl"
    if not data_dir or not path.exists():
        return []
    with path.open() as fh:
        items = [json.loads(line) for _, line in zip(range(n), fh, strict=False)]
    return [Task(task_id=d["id"], task_type="deduction", program=d["code"], inputs=[d["input"]],
                 outputs=[d["output"]], valid=True) for d in items]


def _make_runner(args: argparse.Namespace):
    return PythonSandbox(workers=args.workers, timeout_s=args.timeout_s, memory_mb=512,
                         max_output_bytes=65536, isolation=args.isolation)


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Validity/grading throughput on the shipped seeds and (optionally) CRUXEval."""
    with _make_runner(args) as sb:
        env = CodeEnvironment(TaskSection(seed_file=args.seed_file), sb, seed=args.seed)
        res: dict[str, Any] = {"workers": args.workers, "reps": args.reps,
                               "seeds": _throughput(env, env.buffer.pool(), args.reps)}
        crux = _crux_tasks(args.data_dir, args.crux_items)
        if crux:
            res["cruxeval"] = _throughput(env, crux, args.reps)
            env.pop_counters()
            checked = env.validate([t.model_copy(update={"valid": False}) for t in crux])
            res["cruxeval"]["invalid_reasons"] = env.pop_counters()
            res["cruxeval"]["gold_matches_dataset"] = sum(
                c.valid and values_equal(c.outputs[0], t.outputs[0])
                for t, c in zip(crux, checked, strict=True))
    return res


def _generate(engine, tok, prompts: list[str], prefix: str, max_new_tokens: int,
              args: argparse.Namespace, seed: int, template: tuple = ()) -> list:
    """Completions (after the prefilled `prefix`) built exactly as the self-play stages do."""
    ids = [prompt_ids(tok, p, prefix) for p in prompts]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=args.temperature,
                            top_p=0.95, seed=seed, template=template)
    out = []
    for i in range(0, len(ids), args.batch):
        out += engine.generate(ids[i:i + args.batch], params)
    return out


def run_smollm2(args: argparse.Namespace) -> dict[str, Any]:
    """Fraction of valid SmolLM2 proposals and its solve rate, per task type."""
    import torch

    from compassplay.models.loading import load_model  # lazy: pulls transformers

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tok = load_model(ModelSection(source="smollm2-gguf"))
    engine = HFGenerationEngine(model, tok)
    res: dict[str, Any] = {"model": "SmolLM2-135M-Instruct", "n": args.n,
                           "max_new_tokens": args.max_new_tokens, "prefill": args.prefill,
                           "template": args.template, "seed_file": args.seed_file,
                           "solver_max_new_tokens": args.solver_max_new_tokens,
                           "temperature": args.temperature}
    with _make_runner(args) as sb:
        env = CodeEnvironment(TaskSection(seed_file=args.seed_file), sb, seed=args.seed)
        for k, tt in enumerate(TYPES):
            rng = random.Random(args.seed + k)
            t0 = time.perf_counter()
            shown = [env.proposer_prompt(tt, rng) for _ in range(args.n)]
            pre = env.response_prefix("proposer", tt) if args.prefill else ""
            tpl = env.response_template("proposer", tt, args.max_new_tokens) \
                if args.template else ()
            cap = sum(s.max_tokens + 8 for s in tpl) if tpl else args.max_new_tokens
            gens = _generate(engine, tok, [p for p, _ in shown], pre, cap, args, args.seed + k,
                             tpl)
            props = [env.parse_proposal(tt, pre + g.text, ids, f"{tt}-{i}")
                     for i, ((_, ids), g) in enumerate(zip(shown, gens, strict=True))]
            checked = env.validate(props)
            tasks = env.buffer.pool(tt)
            tasks = [rng.choice(tasks).model_copy(update={"task_type": tt})
                     for _ in range(args.n)]
            spre = env.response_prefix("solver", tt) if args.prefill else ""
            stpl = env.response_template("solver", tt, args.solver_max_new_tokens) \
                if args.template else ()
            scap = args.solver_max_new_tokens + (8 if stpl else 0)
            sgens = _generate(engine, tok, [env.solver_prompt(t) for t in tasks], spre, scap,
                              args, args.seed + 100 + k, stpl)
            atts = [env.parse_attempt(t, spre + g.text, 0)
                    for t, g in zip(tasks, sgens, strict=True)]
            verdicts = env.grade(list(zip(tasks, atts, strict=True)))
            res[tt] = {"valid_fraction": sum(t.valid for t in checked) / len(checked),
                       "solve_rate": sum(v.correct for v in verdicts) / len(verdicts),
                       "counters": env.pop_counters(),
                       "seconds": round(time.perf_counter() - t0, 1),
                       "example_proposal": gens[0].text[:400]}
    return res


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark selected by `args`; returns a JSON-serializable dict."""
    return run_smollm2(args) if args.smollm2 else run_throughput(args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="compassplay bench tasks", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    res = run(args)
    print(json.dumps(res, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
