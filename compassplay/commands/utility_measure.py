"""Per-candidate measurement of `compassplay experiment utility`: every score and the realized
utility three ways, from one set of weights (a run's checkpoint, or the base model).

The weights and the optimizer. With `--checkpoint` (a run's `checkpoints/step_*` folder, or a
run folder: its latest) every gradient is taken at the checkpoint's weights, and (c) continues
the learner's AdamW from the checkpoint's moment state (`learner/optimizer.pt`) -- the step a
run would take next. Without one, the base model (+ bootstrap) and no (c).

The losses (mean token cross-entropy, nats; `rewards.fixed_set_loss`):
* `heldout`: gold worked solutions of MATH problems outside the reference file and MATH500
  (`--heldout-items`, cut to `--max-target-tokens`): the primary endpoint;
* `ref_b`: the reference file's items `--ref-split`.. up to twice that (the paper's 32 MATH
  problems: items 8-15), which do not define g_ref: the non-circular reference endpoint;
* g_ref (the scores' reference) is the gradient of the first `--ref-split` items (the run's
  own reference: `reference.max_items` 8), `ref_a`. Its drop is reported only to first order
  (-<delta, g_ref_a>): measuring it would be the circular figure of the earlier pools.

The steps (`rewards.utility`), from the same weights for every candidate:
* `sgd`: theta - eta g (eta small: the first-order regime the paper's U = eta <g, g_ref> is
  about);
* `dir`: theta - L g / ||g||, L = `--dir-length`, by default eta x the median ||g|| of the
  pool's first 8 candidates (kept in every row, so a rerun uses the same L): the cosine's own
  question, which direction teaches at equal length;
* `adamw`: the learner's AdamW from the checkpoint's state (what training on the task does);
* `adamw_fresh`: a freshly built AdamW (the earlier pools' utility; about lr sign(g)): a
  labelled extra.
Each has its realized drop on `heldout` and `ref_b` (for the first `--realized` candidates
measured; null after them: each realized drop costs a pass over the endpoint's tokens through
the trainable layers and the vocabulary head) and, for every candidate, the first-order
prediction -<delta, g_t> on those and on `ref_a` (exact inner products with the endpoints'
gradients; the realized rows check it).

The scores: cos (cos(g, g_ref_a), the paper's), inner, precond_cos (the cosine in the AdamW
metric of the checkpoint, `rewards.preconditioner`; = cos without a checkpoint), difficulty
1 - s, novelty, cos x novelty, a seeded random score, and the positive control
heldout_cos (cos(g, g_heldout): the endpoint's own gradient). g(x) is the gradient of the mean
loss over the candidate's verified solutions (all of them, as a run scores it), over the
parameters the learner trains (`learner.trainable`, = `scorer.params` in the shipped configs).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from compassplay.config import ConfigError, RunConfig
from compassplay.eval.reference_build import problem_hash, read_file, select
from compassplay.rewards.batch import Example
from compassplay.rewards.fixed_set_loss import FixedSetLoss
from compassplay.rewards.functions import token_jaccard
from compassplay.rewards.preconditioner import adamw_metric, metric_cosine, metric_inner
from compassplay.rewards.reference_set import load_reference
from compassplay.rewards.utility import (
    adamw_delta,
    direction_delta,
    grad_norm,
    loss_gradient,
    predicted_drop,
    sgd_delta,
    step_drops,
)
from compassplay.rundir.checkpoint import MANIFEST, latest_checkpoint
from compassplay.step.prompting import chat_ids, reference_examples, target_ids
from compassplay.workers.builders import freeze_except

log = logging.getLogger(__name__)

STEPS = ("sgd", "dir", "adamw", "adamw_fresh")
MEASURED = ("heldout", "ref_b")
PREDICTED = ("heldout", "ref_b", "ref_a")


@dataclass
class StartPoint:
    """Where every candidate is measured from: the model (trainable parameters as the learner's),
    the optimizer state of (c) (None: no checkpoint) and where it came from."""

    model: torch.nn.Module
    tok: object
    optimizer_state: dict | None
    source: str
    step: int


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder (`step_*` with COMPLETE), or the latest one of a run folder."""
    p = Path(path)
    if (p / MANIFEST).is_file():
        return p
    found = latest_checkpoint(p) if p.is_dir() else None
    if found is None:
        raise ConfigError(f"--checkpoint: {p} is neither a complete checkpoint folder nor a run "
                          "folder holding one")
    return found


def load_start(cfg: RunConfig, checkpoint: str | None) -> StartPoint:
    """The base policy (+ bootstrap), then the checkpoint's weights and AdamW state if given.
    The trainable parameters are `learner.trainable`'s, in the learner's order; the state must
    hold one moment pair per trainable parameter, of the same shapes."""
    from safetensors.torch import load_file

    from compassplay.warmup.bootstrap import load_policy  # lazy: pulls transformers

    model, tok = load_policy(cfg)
    # float32 on the first GPU when there is one (never run on a GPU: at 7B that is 28 GB of
    # weights plus the trainable part's gradient and two AdamW moments), else the CPU
    model = model.float().to("cuda" if torch.cuda.is_available() else "cpu")
    freeze_except(model, cfg.learner.trainable, "learner.trainable")
    if checkpoint is None:
        return StartPoint(model, tok, None, "base model (+ bootstrap)", 0)
    ck = resolve_checkpoint(checkpoint)
    weights = ck / "model" / "model.safetensors"
    opt_file = ck / "learner" / "optimizer.pt"
    for f in (weights, opt_file):
        if not f.is_file():
            raise ConfigError(f"--checkpoint: {f} is missing (a torch-backend checkpoint holds "
                              "model/model.safetensors and learner/optimizer.pt)")
    state = load_file(str(weights), device=str(next(model.parameters()).device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if not m.endswith("lm_head.weight")]:
        raise ConfigError(f"--checkpoint: {weights} does not match the config's model: "
                          f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    opt = torch.load(opt_file, weights_only=True, map_location=next(model.parameters()).device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    st = opt.get("state", {})
    if len(st) != len(trainable) or any(
            tuple(st[i]["exp_avg_sq"].shape) != tuple(p.shape) for i, p in enumerate(trainable)):
        raise ConfigError(f"--checkpoint: {opt_file} holds {len(st)} moment pairs that do not "
                          f"match the {len(trainable)} parameters of learner.trainable="
                          f"{cfg.learner.trainable!r}: pass the run's config (--base/--set)")
    step = int(float(st[0]["step"])) if st else 0
    log.info("start point: %s (optimizer step %d, lr %.3g)", ck, step,
             opt["param_groups"][0]["lr"])
    return StartPoint(model, tok, opt, str(ck), step)


def adamw_metric_of(state: dict | None, n: int) -> list[torch.Tensor] | None:
    """AdamW's metric M per trainable parameter from an optimizer state (None: none)."""
    if state is None:
        return None
    group = state["param_groups"][0]
    beta2, eps = group["betas"][1], group["eps"]
    return [adamw_metric(state["state"][i]["exp_avg_sq"], int(float(state["state"][i]["step"])),
                         beta2, eps) for i in range(n)]


def ref_split(items: list, split: int) -> tuple[list, list]:
    """(items defining g_ref: the first `split`, the endpoint items: the next `split`)."""
    if len(items) < split + 1:
        raise ConfigError(f"--ref-split {split}: the reference file has {len(items)} items; "
                          "the split needs more than that many")
    return items[:split], items[split:2 * split]


def measure(cfg: RunConfig, pool: list[dict], data: Path, out: Path,
            args: argparse.Namespace, rows_path: Path) -> None:
    """Scores and utilities of every pool candidate not yet in `rows_path` (appended as each is
    measured: a rerun continues)."""
    done = {json.loads(x)["task_id"] for x in rows_path.read_text().splitlines() if x.strip()} \
        if rows_path.is_file() else set()
    todo = [c for c in pool if c["task_id"] not in done]
    if not todo:
        return
    start = load_start(cfg, args.checkpoint)
    model, tok, pad = start.model, start.tok, start.tok.pad_token_id
    items = load_reference(cfg.reference.path)
    items_a, items_b = ref_split(items, args.ref_split)
    ref_a, ref_b = reference_examples(tok, items_a), reference_examples(tok, items_b)
    heldout = heldout_math(tok, data, [it.prompt for it in items], args.heldout_items,
                           args.max_target_tokens, cfg.run.seed)
    losses = {"heldout": FixedSetLoss(model, heldout, pad), "ref_b": FixedSetLoss(model, ref_b, pad)}
    before = {k: fn(model) for k, fn in losses.items()}
    targets = {"heldout": loss_gradient(model, heldout, pad),
               "ref_b": loss_gradient(model, ref_b, pad), "ref_a": loss_gradient(model, ref_a, pad)}
    metric = adamw_metric_of(start.optimizer_state, len(targets["ref_a"]))
    lr = args.lr or cfg.learner.lr
    length = args.dir_length or _dir_length(rows_path, model, pool, pad, args.eta)
    momentum = None
    if start.optimizer_state is not None:  # the step with g = 0: every candidate's offset
        zero = [torch.zeros_like(g) for g in targets["ref_a"]]
        momentum = step_drops(model, adamw_delta(model, zero, start.optimizer_state, lr=lr,
                                                 max_grad_norm=cfg.learner.max_grad_norm),
                              losses, before)
    rng = random.Random(f"{cfg.run.seed}:{len(done)}")
    log.info("measuring %d candidates from %s (held-out %.4f, ref_b %.4f nats/token)",
             len(todo), start.source, before["heldout"], before["ref_b"])
    for i, c in enumerate(todo):
        t = time.time()
        sols = solutions_of(c)
        grad = loss_gradient(model, [Example(c["prompt_ids"], s) for s in sols], pad)
        norm = grad_norm(grad)
        deltas = {"sgd": sgd_delta(grad, args.eta), "dir": direction_delta(grad, length),
                  "adamw_fresh": adamw_delta(model, grad, None, lr=lr,
                                             max_grad_norm=cfg.learner.max_grad_norm)}
        if start.optimizer_state is not None:
            deltas["adamw"] = adamw_delta(model, grad, start.optimizer_state, lr=lr,
                                          max_grad_norm=cfg.learner.max_grad_norm)
        cos = metric_cosine(grad, targets["ref_a"], None)
        pcos = metric_cosine(grad, targets["ref_a"], metric) if metric is not None else cos
        nov = 1.0 - token_jaccard(c.get("novelty_tokens", []), c.get("seed_tokens", []))
        row = {"task_id": c["task_id"], "task_type": c["task_type"], "step": c["step"],
               "pool": c.get("pool") or args.pool_name, "solve_rate": c["solve_rate"],
               "n_solutions": len(sols), "target_tokens": sum(len(s) for s in sols) / len(sols),
               "grad_norm": norm, "score_cos": cos,
               "score_inner": metric_inner(grad, targets["ref_a"], None),
               "score_precond_cos": pcos, "score_difficulty": 1.0 - c["solve_rate"],
               "score_novelty": nov, "score_cos_novelty": cos * nov,
               "score_random": rng.random(),
               "score_heldout_cos": metric_cosine(grad, targets["heldout"], None),
               "eta": args.eta, "dir_length": length, "lr": lr, "start": start.source,
               "start_step": start.step, "before": before, "momentum_drop": momentum}
        measured = args.realized is None or len(done) + i < args.realized
        for kind, delta in deltas.items():
            drops = step_drops(model, delta, losses, before) if measured else {}
            for k in MEASURED:
                row[f"drop_{kind}_{k}"] = drops.get(k)
            for k in PREDICTED:
                row[f"pred_{kind}_{k}"] = predicted_drop(delta, targets[k])
            row[f"step_norm_{kind}"] = grad_norm(delta)
        row["task"], row["prompt_ids"], row["solutions"] = c.get("task"), c["prompt_ids"], sols
        row["solution"] = tok.decode(sols[0], skip_special_tokens=True)
        with rows_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        log.info("[%d/%d] %s %s cos=%+.4f pcos=%+.4f predicted held-out drop sgd=%+.2e "
                 "adamw=%+.2e%s (%.1f s)", i + 1, len(todo), c["task_type"], c["task_id"], cos,
                 pcos, row["pred_sgd_heldout"], row.get("pred_adamw_heldout", math.nan),
                 "" if measured else " (first order only)", time.time() - t)


def heldout_math(tok, data: Path, reference_prompts: list[str], n: int, max_target: int,
                 seed: int):
    """`n` MATH problems (chat prompt -> worked solution cut to `max_target` tokens), none in
    the reference set or MATH500."""
    rows, _ = select(read_file(data), n, seed,
                     exclude={problem_hash(p) for p in reference_prompts})
    return [Example(chat_ids(tok, r["problem"]), target_ids(tok, r["solution"])[:max_target])
            for r in rows]


def solutions_of(c: dict) -> list[list[int]]:
    """A pool row's verified solutions (`Candidate.solutions`: target_ids, then
    more_target_ids; a measured row: its `solutions`)."""
    if c.get("solutions"):
        return [list(s) for s in c["solutions"]]
    return [list(c["target_ids"]), *map(list, c.get("more_target_ids") or [])]


def _dir_length(rows_path: Path, model: torch.nn.Module, pool: list[dict], pad: int,
                eta: float) -> float:
    """The direction step's length: the one already used in `rows_path`, else eta x the median
    gradient norm of the pool's first 8 candidates."""
    if rows_path.is_file():
        for line in rows_path.read_text().splitlines():
            if line.strip():
                return float(json.loads(line)["dir_length"])
    norms = [grad_norm(loss_gradient(model, [Example(c["prompt_ids"], s)
                                             for s in solutions_of(c)], pad))
             for c in pool[:8]]
    return eta * statistics.median(norms)
