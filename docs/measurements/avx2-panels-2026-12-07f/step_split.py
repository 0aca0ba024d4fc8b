"""One SmolLM2 decode step of the static decoder on the fused kernels, split: the whole step,
its matmuls alone (`decode_matmuls`) and the time inside each kernel call, at `rows` rows,
`prompt` prompt columns (random distinct prompts, no padding) and `cols` cached columns
(fastest of 20 steps after one warm-up; kernels timed over 20 steps).

    python step_split.py 12 413 600 bfloat16
    (. proxy/env.sh; XDG_CACHE_HOME=$(mktemp -d) python step_split.py 16 64 160 float32)
"""

import collections
import sys
import time
import timeit

import torch

from compassplay.bench.generate import MODELS
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.models import load_model


def ms(fn) -> float:
    """The fastest of 20 calls after one warm-up (ms)."""
    return 1e3 * min(timeit.repeat(fn, number=1, repeat=21)[1:])


def main(rows: int, prompt: int, cols: int, dtype: torch.dtype) -> None:
    torch.set_num_threads(2)
    model, _ = load_model(MODELS["smollm2"], seed=0)
    ids = torch.randint(0, 20000, (rows, prompt), generator=torch.Generator().manual_seed(0))
    dec = StaticDecoder(model, dtype=dtype, kernels="c")
    with torch.no_grad():
        dec.start(ids, torch.zeros(rows, dtype=torch.long), cols + 40)
        tok = torch.zeros(rows, dtype=torch.long)
        for _ in range(cols - prompt):
            dec.step(tok)
        t = dec._t

        def step() -> None:
            dec._t = t
            dec.step(tok)

        print("step ms", round(ms(step), 2), "matmuls ms",
              round(ms(lambda: dec.decode_matmuls(rows)), 2))
        kern, spent = dec._fused.kern, collections.Counter()
        for name in ("add_rms", "rope_attend", "silu_mul", "small_linear"):
            def timed(*a, f=getattr(kern, name), name=name):
                t0 = time.perf_counter()
                out = f(*a)
                spent[name] += time.perf_counter() - t0
                return out
            setattr(kern, name, timed)
        for _ in range(20):
            step()
    print({k: round(v / 20 * 1e3, 2) for k, v in spent.items()}, "ms per step")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), getattr(torch, sys.argv[4]))
