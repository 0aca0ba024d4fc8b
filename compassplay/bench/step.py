"""`compassplay bench step`: a run's stages beside what the machine allows, in one run.

Runs `--config` (default: the shipped default job) for `--steps` steps on the in-process
executor, recording the work each stage does at its real shapes: every generate call (rows,
padded prompt width, tokens generated), every learner pass (packed batch shape, loss tokens,
how many blocks the backward crosses) and every scorer loss (batch shape, head columns kept,
the blocks its gradient spans). Beside each stage's seconds (the run's `stage_seconds`) it
reports the stage's bound, measured in the same process (`bench.roofline`): FLOPs at a plain
matmul's rate at the stage's shapes, plus one weight stream per decode step for generation,
and `fraction_of_bound` = bound / seconds. Generation's bound is float32's (the weights' own
stream and float32 matmuls); when the engines decode in bfloat16 (`decode_dtype`), the bound of
that work (a bfloat16 copy's stream, bfloat16 matmuls) is `generate_bf16` beside it; when the
learner runs under bfloat16 autocast (`learner.autocast`), `learn_bf16` is its bound with the
blocks at the bfloat16 matmul rate and the float32 head at float32's; when the reference
gradient's passes run under autocast (`scorer.reference_autocast`), `score_bf16` counts them
at the bfloat16 rate. The bounds are measured after the run at the torch intra-op threads
the stages ran with (`threads` in the output). Counted FLOPs: 2 per weight per token for the
blocks, the attention's score and value products, the vocabulary head where logits are taken;
a backward costs twice the forward of the blocks it crosses plus the head's input gradient;
a learner pass that starts from the generators' states (`learner.frozen_states`) counts the
blocks it runs only.
Not counted: norms, rotary, softmax and other element-wise work, the verifiers (stages
validate and grade run Python programs, no matmuls).

`--baseline` runs the engine of 2026-12-02 in the same process afterwards for comparison:
generation on the module's own forward (`decoder="hf"`), one generate call per template, and
the learner's vocabulary head over every position (today's sampler, which draws by inverse
CDF, in both), and reports it beside.

    compassplay bench step --json [--steps 2] [--baseline] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from compassplay.bench import roofline
from compassplay.bench.stdout_guard import stdout_to_stderr
from compassplay.config import load_config
from compassplay.engines.generation import hf as hf_generation
from compassplay.engines.generation.base import generate_grouped
from compassplay.engines.training import learner
from compassplay.engines.training.shared_prefix import shared_prefix_len
from compassplay.rewards import batch as score_batch

GENERATION_STAGES = {"propose": "proposer", "solve": "solver"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench step`."""
    parser.add_argument("--config", default="default", help="shipped name or YAML path")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--baseline", action="store_true",
                        help="also run the 2026-12-02 engine (module forward, full head)")
    parser.add_argument("overrides", nargs="*", help="dotted KEY=VALUE overrides")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


class Ledger:
    """Work records per stage: lists of dicts, appended by the wrappers of `instrumented`."""

    def __init__(self) -> None:
        self.calls: dict[str, list[dict[str, Any]]] = {"generate": [], "learn": [],
                                                       "score": []}
        self.shape: roofline.ModelShape | None = None
        self.model: torch.nn.Module | None = None
        self.decode_dtypes: set[str] = set()  # the generation engines' matmul dtypes
        self.learn_dtypes: set[str] = set()  # the learner's autocast dtypes ("model": none)
        self.threads: set[int] = set()  # torch's intra-op threads at the recorded calls


def _crossed_layers(model: torch.nn.Module, names: set[str] | None) -> int:
    """Blocks a backward crosses: from the lowest block holding a trained parameter up."""
    lowest = None
    for name, p in model.named_parameters():
        trained = p.requires_grad if names is None else name in names
        if trained and ".layers." in name:
            idx = int(name.split(".layers.")[1].split(".")[0])
            lowest = idx if lowest is None else min(lowest, idx)
    layers = len(model.base_model.layers) if hasattr(model.base_model, "layers") else 0
    return 0 if lowest is None else layers - lowest


def spec_layers(spec: str | list[str], layers: int) -> int:
    """Blocks a gradient over the parameter spec `spec` crosses: K for "last:K", every block
    for "all" or name globs (an upper bound on the work, so a lower fraction)."""
    if isinstance(spec, str) and spec.startswith("last:"):
        return min(int(spec.split(":", 1)[1]), layers)
    return layers


@contextlib.contextmanager
def instrumented(ledger: Ledger, baseline: bool) -> Iterator[None]:
    """Wrap the engine's generate, the learner's log-probs and the scorer's losses so that
    each call appends its shapes to `ledger` (and, with `baseline`, runs the old paths)."""
    from compassplay.rewards import gradient, per_sample  # lazy: pulls transformers

    loss_users = (score_batch, gradient, per_sample)  # each holds its own name for it

    orig_init = hf_generation.HFGenerationEngine.__init__
    orig_gen = hf_generation.HFGenerationEngine._generate_rows
    orig_lp = learner.token_logprobs_entropy
    orig_loss = score_batch.batch_losses

    def init(self, model, tokenizer, *a, **kw):
        if baseline:
            kw["decoder"] = "hf"
        orig_init(self, model, tokenizer, *a, **kw)
        if baseline:  # one call per template, as before 2026-12-03
            self.generate_each = lambda prompts, params: generate_grouped(self, prompts, params)
        if ledger.shape is None:
            ledger.shape, ledger.model = roofline.shape_of(model), model
        ledger.decode_dtypes.add(self.decode_dtype)

    def generate(self, prompts, params):  # every batch either generate entry samples
        out = orig_gen(self, prompts, params)
        ledger.threads.add(torch.get_num_threads())
        ledger.calls["generate"].append({
            "rows": len(prompts), "width": max(map(len, prompts)),
            "prompt_tokens": sum(map(len, prompts)),
            "prefill_columns": getattr(self._decoder, "prefill_columns", None),
            "steps": max((len(g.completion_ids) for g in out), default=0)})
        return out

    def logprobs(model, input_ids, attention_mask, targets, positions=None, autocast=None,
                 share_prefix=False, states=None, from_layer=0):
        n_loss = int(positions.sum()) if positions is not None else targets.numel()
        share_prefix = share_prefix and not baseline
        if baseline:  # the old path: every layer from the tokens
            states, from_layer = None, 0
        if model.training and any(p.requires_grad for p in model.parameters()):
            ledger.threads.add(torch.get_num_threads())
            shared = shared_prefix_len(input_ids, attention_mask, positions) \
                if share_prefix and positions is not None else 0
            below = from_layer if states is not None else 0  # layers the states skip
            ledger.calls["learn"].append({
                "rows": int(input_ids.shape[0]),
                "width": int(input_ids.shape[1]) - (1 if states is not None else 0),
                "shared": shared, "below": below,
                "head_rows": targets.numel() if baseline or positions is None else n_loss,
                "loss_rows": n_loss, "crossed": _crossed_layers(model, None)})
            ledger.learn_dtypes.add(str(autocast or "model").removeprefix("torch."))
        return orig_lp(model, input_ids, attention_mask, targets,
                       None if baseline else positions, autocast, share_prefix, states,
                       from_layer)

    def losses(model, batch, all_logits=False, inputs_embeds=None):
        out = orig_loss(model, batch, all_logits, inputs_embeds)
        n, width = batch.ids.shape
        if not all_logits and score_batch.packs_head(model):  # the loss positions, packed
            head_rows = int((batch.weights != 0).sum())
        else:
            keep = score_batch._kept_columns(model, batch) if not all_logits else None
            head_rows = int(n * (keep or width))
        ledger.threads.add(torch.get_num_threads())
        ledger.calls["score"].append({"rows": int(n), "width": int(width),
                                      "head_rows": head_rows,
                                      "grad": out.requires_grad, "autocast":
                                      torch.is_autocast_enabled(batch.ids.device.type)})
        return out

    hf_generation.HFGenerationEngine.__init__ = init
    hf_generation.HFGenerationEngine._generate_rows = generate
    learner.token_logprobs_entropy = logprobs
    for mod in loss_users:
        mod.batch_losses = losses
    try:
        yield
    finally:
        hf_generation.HFGenerationEngine.__init__ = orig_init
        hf_generation.HFGenerationEngine._generate_rows = orig_gen
        learner.token_logprobs_entropy = orig_lp
        for mod in loss_users:
            mod.batch_losses = orig_loss


def stage_bounds(ledger: Ledger, stream_s: float, rate: float, score_crossed: int,
                 head_rate: float | None = None, autocast_rate: float | None = None
                 ) -> dict[str, float]:
    """Bound seconds per stage from the ledger: "generate" (propose and solve together),
    "learn", "score"; the learner's vocabulary-head FLOPs at `head_rate` where given (an
    autocast learner keeps its head in float32), else at `rate`."""
    s = ledger.shape
    assert s is not None
    per_layer = s.block_params / s.layers

    def work(rows: int, width: int, shared: int) -> tuple[float, float]:
        """(positions, attention query-key pairs) of rows x width, the first `shared`
        positions computed once."""
        own = width - shared
        return (shared + rows * own,
                shared * (shared + 1) / 2 + rows * (own * shared + own * (own + 1) / 2))

    def fwd(rows: int, width: int, head_rows: int, shared: int = 0, below: int = 0) -> float:
        """Forward FLOPs; `below`: leading layers not run (the learner started from the
        generators' states, `learner.frozen_states`)."""
        tokens, pairs = work(rows, width, shared)
        head = 2.0 * s.vocab * s.hidden * head_rows
        full = roofline.transformer_flops(s, tokens, pairs, head_rows)
        return head + (full - head) * (s.layers - below) / s.layers

    def bwd(rows: int, width: int, head_rows: int, crossed: int, shared: int = 0) -> float:
        tokens, pairs = work(rows, width, shared)
        blocks = 2.0 * (2.0 * per_layer * crossed * tokens
                        + 4.0 * crossed * s.heads * s.head_dim * pairs)
        return blocks + 2.0 * s.vocab * s.hidden * head_rows

    gen = sum(roofline.generation_bounds(s, c["rows"], c["width"], c["steps"], stream_s,
                                         rate, c.get("prefill_columns"))["bound_s"]
              for c in ledger.calls["generate"])
    learn = sum(fwd(c["rows"], c["width"], c["head_rows"], c.get("shared", 0),
                    c.get("below", 0))
                + bwd(c["rows"], c["width"], c["head_rows"], c["crossed"], c.get("shared", 0))
                for c in ledger.calls["learn"]) / rate
    if head_rate is not None:  # move the head's forward and backward FLOPs to head_rate
        head = sum(4.0 * s.vocab * s.hidden * c["head_rows"] for c in ledger.calls["learn"])
        learn += head / head_rate - head / rate
    score = sum((fwd(c["rows"], c["width"], c["head_rows"])
                 + (bwd(c["rows"], c["width"], c["head_rows"], score_crossed) if c["grad"]
                    else 0.0))
                / (autocast_rate if autocast_rate and c.get("autocast") else rate)
                for c in ledger.calls["score"])
    return {"generate": gen, "learn": learn, "score": score}


def _one_run(args: argparse.Namespace, baseline: bool) -> dict[str, Any]:
    from compassplay.commands.launch import launch_run  # lazy: pulls transformers

    overrides = [f"pipeline.steps={args.steps}", "logging.progress=false", *args.overrides]
    ledger = Ledger()
    with tempfile.TemporaryDirectory(prefix="compassplay-bench-step-") as tmp:
        cfg = load_config(args.config, [f"run.output_dir={tmp}", *overrides])
        t0 = time.perf_counter()
        with instrumented(ledger, baseline):
            run_dir = launch_run(cfg, executor="local")
        wall = time.perf_counter() - t0
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").open()
                if '"stage_seconds"' in line]
    model = ledger.model
    assert model is not None and ledger.shape is not None
    threads = max(ledger.threads, default=torch.get_num_threads())
    with roofline.torch_threads(threads):  # the bounds at the threads the stages ran with
        out = _with_bounds(cfg, ledger, model, rows, baseline, wall)
    out["threads"] = {"stages": sorted(ledger.threads), "after_run": torch.get_num_threads(),
                      "bounds": threads}
    return out


def _with_bounds(cfg: Any, ledger: Ledger, model: torch.nn.Module,
                 rows: list[dict[str, Any]], baseline: bool, wall: float) -> dict[str, Any]:
    """The run's record (`_one_run`) with the bounds measured now in this process."""
    stream = roofline.settled(lambda: roofline.stream_seconds(model), min)
    rate = roofline.settled(lambda: roofline.model_matmul_rate(model, 2048), max)
    score_crossed = spec_layers(cfg.scorer.params, ledger.shape.layers)
    bounds = stage_bounds(ledger, stream, rate, score_crossed)
    score_autocast = any(c.get("autocast") for c in ledger.calls["score"])
    rate16 = stream16 = None
    if "bfloat16" in ledger.decode_dtypes | ledger.learn_dtypes or score_autocast:
        rate16 = roofline.settled(
            lambda: roofline.model_matmul_rate(model, 2048, torch.bfloat16), max)
    if ledger.decode_dtypes == {"bfloat16"}:  # the bound of the work generation did
        copy16 = roofline.in_dtype(model, torch.bfloat16)
        stream16 = roofline.settled(lambda: roofline.stream_seconds(copy16), min)
        bounds["generate_bf16"] = stage_bounds(ledger, stream16, rate16, 0)["generate"]
    if ledger.learn_dtypes == {"bfloat16"}:  # autocast blocks, float32 head
        bounds["learn_bf16"] = stage_bounds(ledger, stream, rate16, 0, head_rate=rate)["learn"]
    if score_autocast:  # the reference's passes under autocast (scorer.reference_autocast)
        bounds["score_bf16"] = stage_bounds(ledger, stream, rate, score_crossed,
                                            autocast_rate=rate16)["score"]
    stage = {k: sum(r["stage_seconds"].get(k, 0.0) for r in rows) for k in
             ("propose", "solve", "validate", "grade", "score", "learn")}
    gen_s = stage["propose"] + stage["solve"]
    return {
        "baseline": baseline, "steps": len(rows), "wall_s": wall,
        "step_seconds": [r["step_seconds"] for r in rows],
        "step_seconds_median": statistics.median(r["step_seconds"] for r in rows),
        "stage_seconds": stage, "valid": [r["valid"] for r in rows],
        "decode_dtypes": sorted(ledger.decode_dtypes),
        "learn_dtypes": sorted(ledger.learn_dtypes),
        "eligible": [r["eligible"] for r in rows],
        "weight_stream_s": stream, "matmul_gflop_per_s": rate / 1e9,
        **({"matmul_bf16_gflop_per_s": rate16 / 1e9} if rate16 else {}),
        **({"weight_stream_bf16_s": stream16} if stream16 else {}),
        "bound_s": bounds,
        "fraction_of_bound": {"generate": bounds["generate"] / gen_s if gen_s else None,
                              "learn": bounds["learn"] / stage["learn"] if stage["learn"]
                              else None,
                              "score": bounds["score"] / stage["score"] if stage["score"]
                              else None,
                              **({"generate_bf16": bounds["generate_bf16"] / gen_s}
                                 if "generate_bf16" in bounds and gen_s else {}),
                              **({"learn_bf16": bounds["learn_bf16"] / stage["learn"]}
                                 if "learn_bf16" in bounds and stage["learn"] else {}),
                              **({"score_bf16": bounds["score_bf16"] / stage["score"]}
                                 if "score_bf16" in bounds and stage["score"] else {})},
        "work": {k: len(v) for k, v in ledger.calls.items()}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The run (and with --baseline the old engine's run after it) as one JSON object."""
    out = _one_run(args, baseline=False)
    if args.baseline:
        base = _one_run(args, baseline=True)
        out["baseline_run"] = base
        out["speedup"] = {k: base["stage_seconds"][k] / out["stage_seconds"][k]
                          for k in ("propose", "solve", "learn", "score")
                          if out["stage_seconds"][k]}
        out["speedup"]["step"] = base["step_seconds_median"] / out["step_seconds_median"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compassplay bench step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    with stdout_to_stderr() if args.json else contextlib.nullcontext():
        out = run(args)
    print(json.dumps(out, indent=1))
    return 0
