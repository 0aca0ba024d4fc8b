"""What the machine allows, measured in the same run as a bench: the time to stream a model's
weights once, a plain matmul's FLOP/s at a stage's shape, and the bounds built from them.

- `stream_seconds`: one read of every weight tensor (a sum over each, tied tensors once),
  the fastest of `reps`: a decode step cannot beat it, since it multiplies by every weight.
- `matmul_rate`: FLOP/s of `x @ w.T` with x [rows, k] and w [n, k] (float32 unless told),
  the fastest of `reps`; at the prefill's rows this is the machine's compute speed.
  Both take the best repetition, not the median: on a shared or throttled machine a median
  taken at a slow moment makes the bound loose (a stage could even exceed it).
- `settled`: the best of a measurement repeated over a few seconds, so that one moment of
  other work on the machine (a run's processes winding down) does not set the bound.
- `torch_threads`: measure at the intra-op threads the measured work ran with (a run's
  workers may leave the process at another count).
- `transformer_flops`: the matmul FLOPs of a Llama-style forward (2 per weight per token for
  the blocks, the attention's 2 x 2 x ctx x heads x head_dim per token and layer, and the
  vocabulary head where logits are needed); a backward costs twice its forward.
- `generation_bound_s`: the issue's bound for one generate call: the prefill's FLOPs at the
  matmul rate, plus one weight stream per decode step; `generation_roofline_s` takes each
  decode step's max(stream, FLOPs at the matmul rate) instead (the same or larger).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelShape:
    """The sizes a FLOP count needs (read from a transformers config by `shape_of`)."""

    layers: int
    hidden: int
    heads: int
    head_dim: int
    block_params: int   # weights of all blocks (matmul weights only)
    vocab: int
    weight_bytes: int   # every parameter once (tied tensors once)


def shape_of(model: torch.nn.Module) -> ModelShape:
    cfg = model.config
    layers = int(getattr(cfg, "num_hidden_layers", None) or cfg.n_layer)
    hidden = int(getattr(cfg, "hidden_size", None) or cfg.n_embd)
    heads = int(getattr(cfg, "num_attention_heads", None) or cfg.n_head)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    emb = model.get_input_embeddings().weight
    seen, total, block = set(), 0, 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
        if p.dim() == 2 and p.data_ptr() != emb.data_ptr() and "lm_head" not in name \
                and "wpe" not in name:
            block += p.numel()
    return ModelShape(layers, hidden, heads, head_dim, block, int(emb.shape[0]), total)


def transformer_flops(s: ModelShape, tokens: int, ctx_sum: float, logit_rows: int) -> float:
    """Forward FLOPs of `tokens` positions whose attention spans sum to `ctx_sum` keys, with
    vocabulary logits at `logit_rows` of them."""
    return 2.0 * s.block_params * tokens + 4.0 * s.layers * s.heads * s.head_dim * ctx_sum \
        + 2.0 * s.vocab * s.hidden * logit_rows


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to n inside the block, restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def settled(measure: Callable[[], float], best: Callable[..., float],
            rounds: int = 3, pause_s: float = 0.5) -> float:
    """`best` (min for seconds, max for rates) of `rounds` calls of `measure`, `pause_s`
    seconds apart."""
    values = []
    for r in range(rounds):
        if r:
            time.sleep(pause_s)
        values.append(measure())
    return best(values)


def stream_seconds(model: torch.nn.Module, reps: int = 10) -> float:
    """Fastest time (s) of `reps` to read every parameter tensor once."""
    seen, tensors = set(), []
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            tensors.append(p.detach())
    times = []
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            for t in tensors:
                t.sum()
            times.append(time.perf_counter() - t0)
    return min(times)


def matmul_rate(rows: int, k: int, n: int, dtype: torch.dtype = torch.float32,
                reps: int = 10, device: str = "cpu") -> float:
    """Best FLOP/s of `reps` calls of x [rows, k] @ w [n, k].T (one untimed warm-up)."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn((rows, k), generator=g, device=device).to(dtype)
    w = torch.randn((n, k), generator=g, device=device).to(dtype)
    torch.nn.functional.linear(x, w)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2.0 * rows * k * n / min(times)


def model_matmul_rate(model: torch.nn.Module, rows: int,
                      dtype: torch.dtype = torch.float32) -> float:
    """`matmul_rate` at `model`'s MLP shape: x [rows, hidden] @ w [intermediate, hidden].T."""
    hidden = int(model.config.hidden_size)
    inter = int(getattr(model.config, "intermediate_size", None) or 4 * hidden)
    return matmul_rate(rows, hidden, inter, dtype=dtype)


def in_dtype(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` itself when its weights are in `dtype`, else a copy holding them in it."""
    same = next(model.parameters()).dtype == dtype
    return model if same else copy.deepcopy(model).to(dtype)


def generation_bounds(s: ModelShape, rows: int, prompt: int, new: int, stream_s: float,
                      rate: float, prefill_columns: int | None = None) -> dict[str, float]:
    """Both bounds (seconds) of one generate call: rows prompts of `prompt` tokens each, `new`
    tokens each (the last one needs no forward). `prefill_columns`: the positions the engine's
    prefill computed when fewer than rows x prompt (equal rows once, a shared prefix once);
    the attention's work is scaled by the same share."""
    share = 1.0 if prefill_columns is None else prefill_columns / (rows * prompt)
    prefill = transformer_flops(s, share * rows * prompt,
                                share * rows * prompt * (prompt + 1) / 2, rows) / rate
    steps = max(new - 1, 0)
    decode_flops = [transformer_flops(s, rows, rows * (prompt + i + 1), rows)
                    for i in range(steps)]
    return {"prefill_s": prefill, "decode_stream_s": steps * stream_s,
            "bound_s": prefill + steps * stream_s,
            "roofline_s": prefill + sum(max(stream_s, f / rate) for f in decode_flops)}
