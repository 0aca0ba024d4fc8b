"""30 distinct SmolLM2-shaped blocks' decode matmuls (q/k/v, o, gate/up, down; random float32
weights) at 1-8 rows: oneDNN's packed sgemm (the float32 decoder before) against the float32
kernels' `small_linear`, each the fastest of 15 alternating passes, in ms.

    python small_rows.py > small_rows.json
"""

import json
import time

import torch

from compassplay.engines.generation import decode_kernels as dk

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def main() -> dict:
    torch.set_num_threads(2)
    kern = dk.load(dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    blocks = [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(30)]
    stream_ms = 30 * sum(a * b for a, b in SHAPES) * 4 / 1e6  # MB: ms at 1 GB/s
    out = {"weights_mb": stream_ms, "ms": {}}
    for m in (1, 2, 4, 6, 8):
        xs = [torch.randn(m, 1, s[1], generator=g) for s in SHAPES]
        packs = [[torch.ops.mkldnn._reorder_linear_weight(w, m) for w in ws] for ws in blocks]

        def onednn(xs=xs, packs=packs):
            for pk in packs:
                for x, p in zip(xs, pk, strict=True):
                    torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")

        def small(xs=xs):
            for ws in blocks:
                for x, w in zip(xs, ws, strict=True):
                    kern.small_linear(x, w, None)

        best = {"onednn": float("inf"), "small_linear": float("inf")}
        for _ in range(15):
            for name, run in (("onednn", onednn), ("small_linear", small)):
                t0 = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - t0)
        out["ms"][m] = {k: round(v * 1e3, 2) for k, v in best.items()}
    return out


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
