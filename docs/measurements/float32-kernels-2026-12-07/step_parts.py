"""One SmolLM2 float32 decode step at 16 and 4 rows and 192 cached columns: the whole step
with MKL's and oneDNN's packed matmuls, on torch ops and on the float32 kernels, and the
step's matmuls alone per packing (fastest of 30 after warm-up, ms). `python step_parts.py`"""

import json
import timeit

import torch

from compassplay.bench.generate import MODELS
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.models import load_model

PROMPT, COLS = 64, 192


def fastest_ms(fn) -> float:
    """The fastest of 30 single calls after one warm-up call (ms)."""
    return 1e3 * min(timeit.repeat(fn, number=1, repeat=31)[1:])


def decoder_at(model, rows: int, pack: str, kern: str) -> StaticDecoder:
    """A float32 decoder packed by `pack` on `kern`, its cache filled to column COLS."""
    prompt = torch.randint(0, 256, (rows, PROMPT), generator=torch.Generator().manual_seed(0))
    dec = StaticDecoder(model, kernels=kern, float32_pack=pack)
    dec.start(prompt, torch.zeros(rows, dtype=torch.long), COLS + 60)
    for _ in range(COLS - PROMPT):
        dec.step(torch.zeros(rows, dtype=torch.long))
    return dec


def main() -> dict:
    torch.set_num_threads(2)
    model, _ = load_model(MODELS["smollm2"], seed=0)
    out: dict = {"threads": torch.get_num_threads()}
    with torch.no_grad():
        for rows in (16, 4):
            tok = torch.zeros(rows, dtype=torch.long)
            for pack in ("mkl", "onednn"):
                for kern in ("torch", "c"):
                    dec = decoder_at(model, rows, pack, kern)

                    def one(dec=dec, tok=tok):
                        dec._t = COLS  # the same column every call
                        dec.step(tok)
                    out[f"rows{rows}_step_{pack}_{kern}_ms"] = round(fastest_ms(one), 2)
                out[f"rows{rows}_matmuls_{pack}_ms"] = round(
                    fastest_ms(lambda dec=dec, rows=rows: dec.decode_matmuls(rows)), 2)
    return out


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
