"""One SmolLM2 float32 decode step at 16 and 4 rows and 192 cached columns: the whole step
with MKL's and oneDNN's packed matmuls, on torch ops and on the float32 kernels, and the
step's matmuls alone per packing (fastest of 30 after warm-up, ms). `python step_parts.py`"""

import json
import time

import torch

from compassplay.bench.generate import MODELS
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.models import load_model

PROMPT, COLS = 64, 192


def best(fn, reps: int = 30) -> float:
    fn()
    out = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out * 1e3


def main() -> dict:
    torch.set_num_threads(2)
    model, _ = load_model(MODELS["smollm2"], seed=0)
    out: dict = {"threads": torch.get_num_threads()}
    for rows in (16, 4):
        ids = torch.randint(0, 256, (rows, PROMPT), generator=torch.Generator().manual_seed(0))
        pad = torch.zeros(rows, dtype=torch.long)
        with torch.no_grad():
            for pack in ("mkl", "onednn"):
                for kern in ("torch", "c"):
                    dec = StaticDecoder(model, kernels=kern, float32_pack=pack)
                    dec.start(ids, pad, COLS + 60)
                    tok = torch.zeros(rows, dtype=torch.long)
                    while dec._t < COLS:
                        dec.step(tok)

                    def one(dec=dec, tok=tok):
                        dec._t = COLS
                        dec.step(tok)
                    out[f"rows{rows}_step_{pack}_{kern}_ms"] = round(best(one), 2)
                out[f"rows{rows}_matmuls_{pack}_ms"] = round(
                    best(lambda dec=dec, rows=rows: dec.decode_matmuls(rows)), 2)
    return out


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
