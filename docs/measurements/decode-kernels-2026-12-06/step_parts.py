"""One SmolLM2 decode step at 16 rows and 192 cached columns, bfloat16: the whole step on
torch ops and on the fused kernels, and each fused kernel alone (fastest of 50 after warm-up,
ms). `python step_parts.py`"""

import json
import time

import torch

from compassplay.bench.generate import MODELS
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.models import load_model

ROWS, PROMPT, COLS = 16, 64, 192


def best(fn, reps: int = 50) -> float:
    fn()
    out = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out * 1e3


def main() -> dict:
    model, _ = load_model(MODELS["smollm2"], seed=0)
    ids = torch.randint(0, 256, (ROWS, PROMPT), generator=torch.Generator().manual_seed(0))
    pad = torch.zeros(ROWS, dtype=torch.long)
    out = {}
    with torch.no_grad():
        for kern in ("torch", "c"):
            dec = StaticDecoder(model, dtype=torch.bfloat16, kernels=kern)
            dec.start(ids, pad, COLS + 60)
            tok = torch.zeros(ROWS, dtype=torch.long)
            while dec._t < COLS:
                dec.step(tok)

            def one(dec=dec, tok=tok):
                dec._t = COLS
                dec.step(tok)
            out[f"step_{kern}_ms"] = best(one)
        k, b = dec._fused.kern, dec.blocks[0]
        h, att, act, scratch = dec._fused.buffers(ROWS, dec._v.shape[3])
        x = torch.randn(ROWS, h.shape[-1])
        qkv = dec._linear(h, b.wqkv, b.bqkv)
        gu = dec._linear(h, b.wgu)
        pos = torch.full((ROWS,), COLS, dtype=torch.long)
        bias = dec._bias.view(ROWS, -1)
        heads = (dec.nh, dec.nkv, dec.d)
        n = len(dec.blocks)
        out["add_rms_ms_per_step"] = n * 2 * best(
            lambda: k.add_rms(x, None, b.ln1, h.view(ROWS, -1), dec.eps))
        out["rope_attend_ms_per_step"] = n * best(
            lambda: k.rope_attend(qkv, dec._cos, dec._sin, pos, dec._k[0], dec._v[0], bias,
                                  scratch, att.view(ROWS, -1), heads, COLS, dec.scale))
        out["silu_mul_ms_per_step"] = n * best(lambda: k.silu_mul(gu, act.view(ROWS, -1)))
        out["matmuls_ms_per_step"] = best(lambda: dec.decode_matmuls(ROWS))
    out["threads"] = torch.get_num_threads()
    return out


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
