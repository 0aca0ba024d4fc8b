"""`compassplay bench scorer`: batched gradient scorer vs the naive loop vs the training floor.

All three run in one process on the same random-weight causal LM (`--shape`: the 4M-parameter
toy, or SmolLM2-135M / Qwen2.5-1.5B / Qwen2.5-7B shapes, `bench.model_shapes`) in `--dtype` on
`--device`, and the same candidates:

* naive: `oracle.naive_partials`, one forward + `autograd.grad` per candidate (batch of one);
* batched: `GradientScorer.score` (reference set beforehand, not timed);
* floor: one batched forward + `autograd.grad` of the summed candidate losses w.r.t. all
  parameters -- what one training step on the candidates costs, the cost floor of scoring.

Models: `--shape toy` (a tiny Qwen2, `--hidden/--layers/--vocab`, varied lengths) or a real
model's architecture and sizes with random init (`smollm2-135m` for CPUs, `qwen2.5-1.5b` and
`qwen2.5-7b` for GPUs; `--layers` truncates depth for quick runs, the headline is full depth),
with `--candidates` examples of exactly `--prompt-tokens` + `--target-tokens` tokens.

Timings are medians over `--reps` rounds; each round runs the three in rotating order (the
machine may be shared, so rounds alternate); `cpu_s` is the process CPU time of the same calls
(robust to other processes taking cores, unlike wall time). Threads:
`torch.set_num_threads(--threads)`, by default all cores torch sees. Memory (CPU): in the
first, untimed round (the warm-up), under `torch.profiler` (profile_memory), the peak of live
torch tensor bytes allocated during the call (tensors that existed before are not counted; an
op's temporaries freed inside the op count only by their net); naive's on its longest
candidate (it scores one at a time). CPU torch allocations are invisible to tracemalloc, and
RSS deltas mostly measure the allocator's caching, hence the profiler. CUDA: the allocator's
peak. `cost_model` is the per-layer path decision of the scorer's cost model
(`rewards/cost.py`); `--profile` adds one timed scoring call split into forward, input-gradient
backward, and the hooks' work per layer kind with its flops.
With `--dtype bfloat16` the cosines are also compared with a float32 per-candidate oracle at
the same (upcast) weights on `--fp32-check` candidates (`cos_err_vs_fp32`).
`--solutions K`: each candidate has K verified solutions of its prompt (the first as above, the
others of 7/8..1 times its target length), scored as the mean of their losses; the floor is
then one training step on all of their rows.
`--params`: the scored parameters as `scorer.params` spells them ('all', 'last:K' = the last K
blocks and the final norm, comma-separated globs; the naive loop takes the same ones, the floor
all of them). `--metric`: also time the preconditioned cosine (`GradientScorer.set_metric`, a
random AdamW-like metric: `adamw_metric` of exp_avg_sq = 1e-8 exp(2 randn), step 10) in the
same rotation: `metric_s`, `metric_ratio` (metric / plain batched seconds), and its cosine
error against the naive loop in the same metric on `--fp32-check` candidates; with
`--profile` both scorers are profiled in the last round and `metric_hooks_extra_s` is the
hooks' extra seconds under the metric (the forward and backward are the same work), as a share
of the plain scorer's profiled seconds in `metric_hooks_extra_share` (robust to a shared
machine, unlike the wall-clock ratio).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time

import torch

from compassplay.bench import model_shapes
from compassplay.bench.model_shapes import SHAPE_NAMES
from compassplay.bench.peak_memory import peak_alloc_mb, peak_rss, reset_peak_rss, sync
from compassplay.bench.scorer_workload import (
    DTYPES,
    build_shape,
    cand_tokens,
    fixed_examples,
    make_examples,
    resolve_device,
    with_solutions,
)
from compassplay.eval.rank_stats import spearman
from compassplay.rewards.batch import (
    CandidateExamples,
    Example,
    batch_losses,
    make_batch,
    plan_batches,
    scoring_mode,
    solution_sets,
)
from compassplay.rewards.gradient import GradientScorer
from compassplay.rewards.oracle import naive_partials
from compassplay.rewards.preconditioner import adamw_metric
from compassplay.rewards.subspace import last_blocks_globs
from compassplay.workers.builders import scorer_params


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench scorer`."""
    parser.add_argument("--shape", default="toy", choices=SHAPE_NAMES,
                        help="toy: a tiny Qwen2 (--hidden/--layers/--vocab); or a real model's "
                             "shape with random weights (headline numbers: full depth)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                        help="the scored model's dtype (the scorer's `scorer.dtype` knob)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda if present)")
    parser.add_argument("--fp32-check", type=int, default=4,
                        help="dtype != float32: cosine error of the batched scorer against a "
                             "float32 per-candidate oracle on this many candidates (0: skip)")
    parser.add_argument("--max-batch-tokens", type=int, default=16384,
                        help="padded tokens per batched pass (scorer and floor alike)")
    parser.add_argument("--cpu-pass-tokens", type=int, default=1280,
                        help="on a CPU, passes of at most this many tokens (scorer and floor "
                        "alike; 0: --max-batch-tokens only); the JSON's pass_tokens is the "
                        "size used")
    parser.add_argument("--n-candidates", "--candidates", dest="n_candidates", type=int,
                        default=None, help="default 32 (toy) / 16 (real shapes)")
    parser.add_argument("--solutions", type=int, default=1,
                        help="verified solutions per candidate (g(x): their mean loss)")
    parser.add_argument("--seq-len", type=int, default=128,
                        help="toy: prompt+target tokens (max, lengths vary)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="real shapes")
    parser.add_argument("--target-tokens", type=int, default=256, help="real shapes")
    parser.add_argument("--n-ref", type=int, default=None, help="reference examples "
                        "(default 8 toy / 4 real shapes)")
    parser.add_argument("--hidden", type=int, default=256, help="toy")
    parser.add_argument("--layers", type=int, default=None,
                        help="depth (toy default 4; real shapes: truncate for quick runs)")
    parser.add_argument("--vocab", type=int, default=2048, help="toy")
    parser.add_argument("--reps", type=int, default=None, help="timed rounds (5 toy / 2 real)")
    parser.add_argument("--threads", type=int, default=0, help="0: torch default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory", choices=["profiler", "rss", "none"], default=None,
                        help="peak memory: profiler (an untimed warm-up round; default toy), "
                             "rss (peak RSS growth during the timed calls; default real shapes, "
                             "no extra round) or none")
    parser.add_argument("--no-memory", action="store_const", const="none", dest="memory",
                        help="same as --memory none")
    parser.add_argument("--profile", action="store_true",
                        help="time the scorer's work per layer kind (in the last timed round)")
    parser.add_argument("--proj-dims", type=int, nargs="*", default=[1024, 8192])
    parser.add_argument("--last-k", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--no-subspaces", action="store_true")
    parser.add_argument("--params", default="all",
                        help="scored parameters as scorer.params: all, last:K, globs")
    parser.add_argument("--metric", action="store_true",
                        help="also time the preconditioned cosine (random AdamW-like metric)")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


def floor_step(model: torch.nn.Module, cands: list[CandidateExamples],
               max_batch_tokens: int = 1 << 30) -> None:
    """Batched forward+backward passes (at most `max_batch_tokens` padded tokens each, as the
    scorer) computing only the summed gradient of the candidates (each candidate's solutions
    weighted as in its loss)."""
    dev = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    sets = solution_sets(cands)
    rows = [e for c in sets for e in c.examples]
    weights = [w for c in sets for w in c.weights]
    total = None
    with scoring_mode(model):
        for idx in plan_batches(rows, max_batch_tokens):
            loss = batch_losses(model, make_batch([rows[i] for i in idx], idx, dev,
                                                  row_weights=[weights[i] for i in idx])).sum()
            gs = torch.autograd.grad(loss, params)
            total = list(gs) if total is None else [t.add_(g) for t, g in zip(total, gs,
                                                                               strict=True)]


def _setup(args: argparse.Namespace) -> tuple[torch.nn.Module, list[Example], list[Example]]:
    dev = resolve_device(args.device)
    dtype = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(args.seed + 1)
    if args.shape == "toy":
        args.n_candidates = args.n_candidates or 32
        args.layers, args.n_ref = args.layers or 4, args.n_ref or 8
        toy = model_shapes.toy_fields(args.hidden, args.layers, args.vocab)
        model = model_shapes.build("toy", dtype, dev, args.seed, toy=toy)
        cands = make_examples(args.n_candidates, args.seq_len, args.vocab, gen)
        ref = make_examples(args.n_ref, args.seq_len, args.vocab, gen)
        return model, with_solutions(cands, args.solutions, args.vocab, gen), ref
    args.n_candidates, args.n_ref = args.n_candidates or 16, args.n_ref or 4
    model = build_shape(args.shape, args.layers, args.seed, dtype, dev)
    vocab = model.config.vocab_size
    cands = fixed_examples(args.n_candidates, args.prompt_tokens, args.target_tokens, vocab, gen)
    ref = fixed_examples(args.n_ref, args.prompt_tokens, args.target_tokens, vocab, gen)
    return model, with_solutions(cands, args.solutions, vocab, gen), ref


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark; returns the JSON-ready result dict."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, cands, ref = _setup(args)
    dev = next(model.parameters()).device
    reps = args.reps or (5 if args.shape == "toy" else 2)
    spec = scorer_params(args.params, model)
    scorer = GradientScorer(model, spec, max_batch_tokens=args.max_batch_tokens,
                            cpu_pass_tokens=args.cpu_pass_tokens)
    pass_tokens = scorer.pass_tokens
    scorer.set_reference(ref)
    rs = scorer.reference

    def naive() -> list[float]:
        inner, sq, _ = naive_partials(model, scorer.params, rs.grads, cands)
        return (inner / (sq.sqrt() * rs.sq**0.5)).tolist()

    def batched() -> list[float]:
        return [s.cosine for s in scorer.score(cands)]

    fns = {"naive": naive, "batched": batched,
           "floor": lambda: floor_step(model, cands, pass_tokens)}
    msc = None
    if args.metric:
        msc = GradientScorer(model, spec, max_batch_tokens=args.max_batch_tokens,
                             cpu_pass_tokens=args.cpu_pass_tokens)
        msc.set_metric(adamw_like_metric(msc.params, args.seed))
        msc.set_reference(ref)
        fns["metric"] = lambda: [s.cosine for s in msc.score(cands)]
    memory = args.memory or ("profiler" if args.shape == "toy" else "rss")
    if dev.type == "cuda" and memory == "rss":
        memory = "profiler"  # i.e. the CUDA allocator's peak, in the warm-up round
    mem: dict[str, float | None] = {k: None for k in fns}
    if memory == "profiler":
        # The first (untimed) round warms up and measures peak memory. Naive's peak is one
        # candidate's forward+backward (they run one at a time): measured on the longest
        # candidate, since the profiler's memory events make the whole loop very slow.
        longest = max(cands, key=cand_tokens)
        mem = {**{k: peak_alloc_mb(fn, dev) for k, fn in fns.items() if k != "naive"},
               "naive": peak_alloc_mb(lambda: naive_partials(
                   model, scorer.params, rs.grads, [longest]), dev)}
    else:  # warm up on two candidates
        few = cands[:2]
        naive_partials(model, scorer.params, rs.grads, few)
        scorer.score(few)
        floor_step(model, few, pass_tokens)
        if msc is not None:
            msc.score(few)
    times: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    last: dict[str, object] = {}
    profs: dict[str, dict] = {}
    keys = list(fns)
    for r in range(reps):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            profiled = args.profile and k in ("batched", "metric") and r == reps - 1
            sc = msc if k == "metric" else scorer
            sync(dev)
            base = reset_peak_rss() if memory == "rss" else 0
            t0, c0 = time.perf_counter(), time.process_time()
            with sc.profiling() if profiled else contextlib.nullcontext({}) as p:
                last[k] = fns[k]()
            sync(dev)
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
            if memory == "rss":
                mem[k] = max(mem[k] or 0.0, round((peak_rss() - base) / 2**20, 1))
            if p:
                profs[k] = p
    med = {k: statistics.median(v) for k, v in times.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    full = last["batched"]
    err = max(abs(a - b) for a, b in zip(full, last["naive"], strict=True))
    out = {
        "shape": args.shape,
        "layers": sum(1 for _ in _blocks(model)) or args.layers,
        "dtype": args.dtype,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "n_candidates": len(cands),
        "solutions_per_candidate": args.solutions,
        "rows": sum(c.k for c in solution_sets(cands)),
        "seq_len": max(cand_tokens(c) for c in cands),
        "tokens_per_candidate": [min(cand_tokens(c) for c in cands),
                                 max(cand_tokens(c) for c in cands)],
        "mean_tokens": sum(cand_tokens(c) for c in cands) / len(cands),
        "params": model_shapes.param_count(model),
        "threads": torch.get_num_threads(),
        "max_batch_tokens": args.max_batch_tokens, "pass_tokens": pass_tokens,
        "reps": reps,
        "naive_s": round(med["naive"], 4),
        "batched_s": round(med["batched"], 4),
        "floor_s": round(med["floor"], 4),
        "candidates_per_s": round(len(cands) / med["batched"], 2),
        "ratio": round(med["batched"] / med["naive"], 3),
        "floor_ratio": round(med["batched"] / med["floor"], 3),
        "times_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "cpu_s": {k: round(v, 3) for k, v in cmed.items()},
        "cpu_ratio": round(cmed["batched"] / cmed["naive"], 3),
        "cpu_floor_ratio": round(cmed["batched"] / cmed["floor"], 3),
        "max_abs_cos_err": err,
        "peak_mem_batched_mb": mem["batched"],
        "peak_mem_floor_mb": mem["floor"],
        "peak_mem_naive_mb": mem["naive"],
        "mem_ratio": round(mem["batched"] / mem["floor"], 3) if mem["floor"] else None,
        "memory_method": {
            "profiler": "peak live torch allocations during the call (CPU: torch.profiler "
                        "memory events; CUDA: max_memory_allocated; excludes tensors that "
                        "existed before the call)",
            "rss": "peak resident set size during the timed call minus the RSS before it "
                   "(VmHWM after resetting it; max over rounds; includes allocator caching)",
            "none": None}[memory],
        "layer_paths": _path_summary(scorer.layer_paths),
        "cost_model": scorer.cost_report(),
    }
    if msc is not None:
        k = min(max(args.fp32_check, 1), len(cands))
        mref = {n: g * msc.metric[n] for n, g in msc.reference.grads.items()}
        inner, sq, _ = naive_partials(model, msc.params, mref, cands[:k], metric=msc.metric)
        exact = (inner / (sq.sqrt() * msc.reference.sq**0.5)).tolist()
        out.update({
            "params_spec": args.params,
            "scored_params": sum(p.numel() for p in scorer.params.values()),
            "metric_s": round(med["metric"], 4),
            "metric_ratio": round(med["metric"] / med["batched"], 4),
            "metric_cpu_ratio": round(cmed["metric"] / cmed["batched"], 4),
            "metric_cos_err_vs_naive": max(abs(a - b) for a, b in zip(
                last["metric"][:k], exact, strict=True)),
            "metric_layer_paths": _path_summary(msc.layer_paths),
            "peak_mem_metric_mb": mem.get("metric")})
    if args.profile:
        out["profile"] = profs.get("batched", {})
        if msc is not None:  # the same forward and backward: the metric's cost is in the hooks
            out["metric_profile"] = profs.get("metric", {})
            hp = out["profile"]["summary"]["hooks_s"]
            hm = out["metric_profile"]["summary"]["hooks_s"]
            out["metric_hooks_extra_s"] = round(hm - hp, 3)
            out["metric_hooks_extra_share"] = round((hm - hp) / out["profile"]["summary"][
                "total_s"], 4)
    if not args.no_subspaces:
        out["subspaces"] = _subspaces(model, ref, cands, full, args)
    if args.dtype != "float32" and args.fp32_check > 0:
        k = min(args.fp32_check, len(cands))
        del scorer, rs, fns
        out.update(fp32_errors(model, ref, cands[:k], full[:k], last["naive"][:k]))
    return out


def adamw_like_metric(params: dict[str, torch.nn.Parameter],
                      seed: int = 0) -> dict[str, torch.Tensor]:
    """A random metric shaped like AdamW's: `adamw_metric` of exp_avg_sq = 1e-8 exp(2 randn)
    (gradient RMS spread over about two decades per direction) after 10 steps."""
    g = torch.Generator().manual_seed(seed + 7)
    return {n: adamw_metric(1e-8 * torch.exp(2.0 * torch.randn(p.shape, generator=g)), 10)
            .to(p.device) for n, p in params.items()}


def fp32_errors(model: torch.nn.Module, ref: list[Example], cands: list[CandidateExamples],
                batched: list[float], naive_low: list[float]) -> dict:
    """Cosine errors against a float32 per-candidate oracle at the same weights: the model is
    upcast in place (exact), the reference gradient recomputed in float32, and the naive loop
    run on `cands`. Returns the batched scorer's and the low-precision naive loop's errors."""
    gc.collect()  # the scorer's hooks form reference cycles: free its float32 g_ref now
    if model.device.type == "cuda":
        torch.cuda.empty_cache()
    model.float()
    sc = GradientScorer(model, "all", max_batch_tokens=1)  # one example per pass (memory)
    sc.set_reference(ref)
    rs = sc.reference
    inner, sq, _ = naive_partials(model, sc.params, rs.grads, cands)
    exact = (inner / (sq.sqrt() * rs.sq**0.5)).tolist()
    return {"fp32_check_candidates": len(cands),
            "cos_err_vs_fp32": max(abs(a - b) for a, b in zip(batched, exact, strict=True)),
            "naive_cos_err_vs_fp32": max(abs(a - b) for a, b in
                                         zip(naive_low, exact, strict=True))}


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    inner = getattr(model, "model", None)
    return list(getattr(inner, "layers", []))


def _path_summary(paths: dict[str, list[str]]) -> dict[str, list[str]]:
    """Group module names by the path they took."""
    by: dict[str, list[str]] = {}
    for name, ps in sorted(paths.items()):
        for p in ps:
            by.setdefault(p, []).append(name)
    return by


def _subspaces(model: torch.nn.Module, ref: list[Example], cands: list[CandidateExamples],
               full: list[float], args: argparse.Namespace) -> list[dict]:
    specs: list[tuple[str, object]] = [
        (f"last_{k}_blocks", last_blocks_globs(model, k)) for k in args.last_k]
    specs += [(f"projection_{d}", {"kind": "projection", "dim": d, "seed": args.seed})
              for d in args.proj_dims]
    rows = []
    for label, spec in specs:
        sc = GradientScorer(model, spec)
        sc.set_reference(ref)
        t0 = time.perf_counter()
        cos = [s.cosine for s in sc.score(cands)]
        rows.append({"subspace": label, "spearman_vs_full": round(spearman(cos, full), 4),
                     "params": sum(p.numel() for p in sc.params.values()),
                     "score_s": round(time.perf_counter() - t0, 4)})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="compassplay bench scorer", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
