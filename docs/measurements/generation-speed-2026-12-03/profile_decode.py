"""Where a decode step goes: torch.profiler self-CPU time per op, grouped, for the HF
engine's two decoders at the bench shapes (SmolLM2-135M, float32, 2 threads), from the end of
the prefill to the call's return (greedy), with the time outside torch ops (the engine's
Python per token and the profiler's own cost per op).

    .venv/bin/python docs/measurements/generation-speed-2026-12-03/profile_decode.py
"""
import json
import sys
import time

import torch
from torch.profiler import profile

from compassplay.config import ModelSection
from compassplay.engines.generation.base import SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.models import load_model

GROUPS = [("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "mkl::_mkl_linear")),
          ("attention", ("scaled_dot_product", "aten::_softmax", "aten::softmax")),
          ("cache write/growth", ("aten::cat", "aten::copy_", "aten::index_put")),
          ("masks/positions", ("aten::arange", "aten::le", "aten::lt", "aten::ge", "aten::gt",
                               "aten::bitwise", "aten::eq", "aten::where", "aten::cumsum",
                               "aten::any", "aten::all", "aten::logical", "aten::masked_fill")),
          ("element-wise", ("aten::mul", "aten::add", "aten::silu", "aten::pow", "aten::mean",
                            "aten::rsqrt", "aten::neg", "aten::_to_copy", "aten::rms_norm",
                            "aten::sub", "aten::div", "aten::sum", "aten::exp")),
          ("sampling", ("aten::argmax", "aten::multinomial", "aten::sort", "aten::topk",
                        "aten::log_softmax", "aten::_log_softmax", "aten::gather"))]


def group_of(name: str) -> str:
    for g, keys in GROUPS:
        if any(k in name for k in keys):
            return g
    return "other ops"


def profile_steps(engine, prompts, new):
    """Profile a greedy generate call from the end of its prefill to its return: the decode
    steps with all the engine's per-token work. Returns (seconds, self-CPU s by group)."""
    engine.generate(prompts, SamplingParams(max_new_tokens=2))  # warm-up (packs weights)
    dec, prof, clock = engine._decoder, profile(), {}
    real_start = dec.start

    def start(*args):
        out = real_start(*args)
        prof.start()
        clock["t0"] = time.perf_counter()
        return out

    dec.start = start
    try:
        engine.generate(prompts, SamplingParams(max_new_tokens=new, temperature=0.0))
        wall = time.perf_counter() - clock["t0"]
        prof.stop()
    finally:
        dec.start = real_start
    by = {}
    for e in prof.key_averages():
        by[group_of(e.key)] = by.get(group_of(e.key), 0.0) + e.self_cpu_time_total / 1e6
    return wall, by


def main():
    model, tok = load_model(ModelSection(source="smollm2-gguf"))
    out = {}
    for rows, width, new in [(4, 512, 24), (16, 64, 24)]:
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, 256, (rows, width), generator=g).tolist()
        for dec in ("hf", "static"):
            eng = HFGenerationEngine(model, tok, eos_token_id=-1, decoder=dec)
            wall, by = profile_steps(eng, prompts, new)
            steps = new - 1  # the last token needs no forward
            per = {k: by.get(k, 0.0) / steps * 1e3 for k in
                   [g for g, _ in GROUPS] + ["other ops"]}
            step_ms = wall / steps * 1e3
            per["outside torch ops (Python)"] = step_ms - sum(per.values())
            out[f"{dec} {rows}x{width}"] = {"step_ms": step_ms, "ms_by_group": per}
            print(f"{dec:>6} {rows}x{width}: {step_ms:.1f} ms/step (profiled) "
                  + ", ".join(f"{k} {v:.1f}" for k, v in per.items()), file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
