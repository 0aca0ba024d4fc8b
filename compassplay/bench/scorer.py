"""`compassplay bench scorer`: batched gradient scorer vs the naive loop vs the training floor.

All three run in one process on the same tiny random-weight causal LM and the same candidates:

* naive: `oracle.naive_partials`, one forward + `autograd.grad` per candidate (batch of one);
* batched: `GradientScorer.score` (reference set beforehand, not timed);
* floor: one batched forward + `autograd.grad` of the summed candidate losses w.r.t. all
  parameters -- what one training step on the candidates costs, the cost floor of scoring.

Timings are medians over `--reps` rounds; each round runs the three in rotating order (the
machine may be shared, so rounds alternate). Threads: `torch.set_num_threads(--threads)`, by
default all cores torch sees. Memory: in a separate, untimed run under `torch.profiler`
(profile_memory), the peak of live torch CPU tensor bytes allocated during the call (tensors
that existed before are not counted; an op's temporaries freed inside the op count only by
their net). CPU torch allocations are invisible to tracemalloc, and RSS deltas mostly measure
the allocator's caching, hence the profiler.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from compassplay.rewards.batch import Example, batch_losses, make_batch, scoring_mode
from compassplay.rewards.gradient import GradientScorer
from compassplay.rewards.oracle import naive_partials
from compassplay.rewards.subspace import last_blocks_globs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench scorer`."""
    parser.add_argument("--n-candidates", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128, help="prompt+target tokens (max)")
    parser.add_argument("--n-ref", type=int, default=8, help="reference examples")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="0: torch default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--proj-dims", type=int, nargs="*", default=[1024, 8192])
    parser.add_argument("--last-k", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--no-subspaces", action="store_true")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


def build_model(hidden: int, layers: int, vocab: int, seed: int) -> torch.nn.Module:
    """Qwen2-style tiny LM (GQA, q/k/v biases, RMSNorm, untied head), random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 128), max_position_embeddings=2048,
                      tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).float().eval()


def make_examples(n: int, seq_len: int, vocab: int, gen: torch.Generator) -> list[Example]:
    """n examples of (7/8..1) * seq_len tokens, a quarter of them prompt."""
    out = []
    for _ in range(n):
        total = int(torch.randint(seq_len * 7 // 8, seq_len + 1, (1,), generator=gen))
        p = max(1, total // 4)
        ids = torch.randint(0, vocab, (total,), generator=gen).tolist()
        out.append(Example(ids[:p], ids[p:]))
    return out


def floor_step(model: torch.nn.Module, cands: list[Example]) -> None:
    """One batched forward+backward computing only the summed gradient of the candidates."""
    dev = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    with scoring_mode(model):
        loss = batch_losses(model, make_batch(cands, list(range(len(cands))), dev)).sum()
        torch.autograd.grad(loss, params)


def peak_alloc_mb(fn: Callable[[], object]) -> float:
    """Peak (MiB) of torch CPU tensor bytes allocated and still live during `fn`, from the
    profiler's memory events (per-op net allocations and frees, in time order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()
                    if e.self_cpu_memory_usage)
    cur = best = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return round(best / 2**20, 1)


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(v: list[float]) -> torch.Tensor:
        t = torch.tensor(v, dtype=torch.float64)
        order = t.argsort()
        r = torch.empty_like(t)
        r[order] = torch.arange(len(v), dtype=torch.float64)
        for val in t.unique():
            m = t == val
            r[m] = r[m].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(rx.norm() * ry.norm())
    return float(rx @ ry) / den if den > 0 else 0.0


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark; returns the JSON-ready result dict."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(args.hidden, args.layers, args.vocab, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    cands = make_examples(args.n_candidates, args.seq_len, args.vocab, gen)
    ref = make_examples(args.n_ref, args.seq_len, args.vocab, gen)
    scorer = GradientScorer(model, "all")
    scorer.set_reference(ref)
    rs = scorer.reference

    def naive() -> list[float]:
        inner, sq, _ = naive_partials(model, scorer.params, rs.grads, cands)
        return (inner / (sq.sqrt() * rs.sq**0.5)).tolist()

    def batched() -> list[float]:
        return [s.cosine for s in scorer.score(cands)]

    fns = {"naive": naive, "batched": batched, "floor": lambda: floor_step(model, cands)}
    for fn in fns.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    for r in range(args.reps):
        for k in keys[r % 3:] + keys[: r % 3]:
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    full = batched()
    err = max(abs(a - b) for a, b in zip(full, naive(), strict=True))
    out = {
        "n_candidates": len(cands),
        "seq_len": args.seq_len,
        "mean_tokens": sum(len(c) for c in cands) / len(cands),
        "params": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "reps": args.reps,
        "naive_s": round(med["naive"], 4),
        "batched_s": round(med["batched"], 4),
        "floor_s": round(med["floor"], 4),
        "ratio": round(med["batched"] / med["naive"], 3),
        "floor_ratio": round(med["batched"] / med["floor"], 3),
        "max_abs_cos_err": err,
        "peak_mem_batched_mb": peak_alloc_mb(batched),
        "peak_mem_floor_mb": peak_alloc_mb(fns["floor"]),
        "peak_mem_naive_mb": peak_alloc_mb(naive),
        "memory_method": "peak live torch CPU allocations during the call (torch.profiler "
                         "memory events; excludes tensors that existed before the call)",
        "layer_paths": _path_summary(scorer.layer_paths),
    }
    if not args.no_subspaces:
        out["subspaces"] = _subspaces(model, ref, cands, full, args)
    return out


def _path_summary(paths: dict[str, list[str]]) -> dict[str, list[str]]:
    """Group module names by the path they took."""
    by: dict[str, list[str]] = {}
    for name, ps in sorted(paths.items()):
        for p in ps:
            by.setdefault(p, []).append(name)
    return by


def _subspaces(model: torch.nn.Module, ref: list[Example], cands: list[Example],
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
