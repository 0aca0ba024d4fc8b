"""Where one decode step of the HF engine's static decoder goes (ms per step, by section).

    PYTHONPATH=. python docs/measurements/decode-profile-2026-12-06/profile_step.py \
        --batch-size 16 --prompt-tokens 64 --new-tokens 128 --dtype bfloat16 --threads 2

Runs the engine's own `generate` (sampling as `bench generate` does: temperature 1, top_p 1,
no stop strings, no template) with wall-clock timers (CPU ops are synchronous):
`decoder.step` split into its parts by a timed copy of the decode path of
`StaticDecoder._forward` (`--split`; without it the step is one section), `sample_next`, and
the rest of the engine's per-token loop (log-probs, host copy, the Python bookkeeping, the next
token tensor) as the time between one `decoder.step` and the next minus the sampling. Each
section is summed per step and the median over all decode steps of `--reps` calls is
reported, and the 10th percentile (the other jobs on this machine slow some steps down by
several times; the low percentile is closest to a quiet machine).
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch
import torch.nn.functional as F

try:  # the sampler's home: engines.generation.sampling (after 2026-12-06), hf before
    from compassplay.engines.generation import sampling
except ImportError:
    sampling = None  # type: ignore[assignment]

from compassplay.bench.generate import MODELS
from compassplay.engines.generation import hf
from compassplay.engines.generation.base import SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.models import load_model

T: collections.Counter = collections.Counter()


class Timer:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        T[self.name] += time.perf_counter() - self.t0


def timed_decode(self, x, pos, mask, t0):
    """StaticDecoder._forward's decode path (seq 1) with a timer around each part."""
    bsz, seq, _ = x.shape
    nh, nkv, d = self.nh, self.nkv, self.d
    with Timer("rope"):
        cos, sin = self._cos[pos][:, None], self._sin[pos][:, None]
    end = t0 + seq
    group = nh // nkv
    nqk = nh + nkv
    for i, b in enumerate(self.blocks):
        with Timer("rms norms"):
            h = self._rms(x, b.ln1)
        with Timer("qkv matmul"):
            qkv = self._linear(h, b.wqkv, b.bqkv).view(bsz, seq, nqk + nkv, d).transpose(1, 2)
        with Timer("rope"):
            qk = self._rope(qkv[:, :nqk].float(), cos, sin).to(self.dtype)
        new = hasattr(self, "_keys")  # the layout since 2026-12-06: keys via _keys, in place
        with Timer("kv cache write"):
            vc = self._v[i]
            if new:
                self._keys(i, t0, end).copy_(qk[:, nh:].transpose(-1, -2))
            else:
                self._k[i][:, :, t0:end] = qk[:, nh:]
            vc[:, :, t0:end] = qkv[:, nqk:]
        with Timer("attention"):
            q = qk[:, :nh].reshape(bsz, nkv, group, d)
            kt = self._keys(i, 0, end) if new else self._k[i][:, :, :end].transpose(-1, -2)
            scores = torch.matmul(q, kt).float().mul_(self.scale)
            att = torch.matmul(torch.softmax(scores.add_(mask), dim=-1).to(self.dtype),
                               vc[:, :, :end])
            att = att.reshape(bsz, nh, seq, d).transpose(1, 2).reshape(bsz, seq, nh * d)
        with Timer("o matmul + residual"):
            o = self._linear(att, b.wo)
            x = x.add_(o) if new else x + o.float()
        with Timer("rms norms"):
            h = self._rms(x, b.ln2)
        with Timer("gate/up matmul"):
            gate, up = self._linear(h, b.wgu).chunk(2, dim=-1)
        with Timer("silu * up"):
            a = F.silu(gate) * up
        with Timer("down matmul + residual"):
            o = self._linear(a, b.wd)
            x = x.add_(o) if new else x + o.float()
    with Timer("final norm + lm_head"):
        h = self._rms(x[:, -1:], self.norm)
        return self._linear(h, self.head)[:, 0].float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--split", action="store_true", help="time the decoder step's parts")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(MODELS["smollm2"], seed=0)
    eng = HFGenerationEngine(model, tok, eos_token_id=-1, decoder="static",
                             decode_dtype=args.dtype)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 256, (args.batch_size, args.prompt_tokens), generator=g).tolist()
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    eng.generate(prompts, params)  # warm-up
    cls = type(eng._decoder)
    # the sampler: TokenSampler.sample since the buffered sampler, sample_next before it
    owner, attr = (sampling.TokenSampler, "sample") if sampling is not None \
        else (hf, "sample_next")
    orig_fwd, orig_step, orig_sample = cls._forward, cls.step, getattr(owner, attr)
    steps: list[dict[str, float]] = []
    last_end: list[float] = []

    def fwd(self, x, pos, mask, t0):
        if x.shape[1] != 1 or not args.split:
            return orig_fwd(self, x, pos, mask, t0)
        return timed_decode(self, x, pos, mask, t0)

    def step(self, tk):
        now = time.perf_counter()
        if last_end:
            T["engine loop outside sampling"] += now - last_end[0] - T["sampling"]
        with Timer("decoder step"):
            out = orig_step(self, tk)
        steps.append(dict(T))
        T.clear()
        last_end[:] = [time.perf_counter()]
        return out

    def sample(*a, **k):
        with Timer("sampling"):
            return orig_sample(*a, **k)

    cls._forward, cls.step = fwd, step
    setattr(owner, attr, sample)
    try:
        walls = []
        for _ in range(args.reps):
            last_end.clear()
            T.clear()
            t1 = time.perf_counter()
            eng.generate(prompts, params)
            walls.append(time.perf_counter() - t1)
    finally:
        cls._forward, cls.step = orig_fwd, orig_step
        setattr(owner, attr, orig_sample)
    steps = [s for s in steps if "engine loop outside sampling" in s]
    names = sorted({k for s in steps for k in s}, key=lambda k: -sum(s.get(k, 0) for s in steps))
    def q(values: list[float], at: float) -> float:
        return sorted(values)[int(at * (len(values) - 1))] * 1e3

    whole = [s["decoder step"] + s.get("sampling", 0.0) + s["engine loop outside sampling"]
             for s in steps]
    print(json.dumps({"args": vars(args), "generate_s": walls, "steps_timed": len(steps),
                      "ms_per_step_p10": {k: q([s.get(k, 0.0) for s in steps], 0.1)
                                          for k in names},
                      "ms_per_step_median": {k: q([s.get(k, 0.0) for s in steps], 0.5)
                                             for k in names},
                      "whole_step_ms_p10": q(whole, 0.1),
                      "whole_step_ms_median": q(whole, 0.5)}, indent=1))


if __name__ == "__main__":
    main()
